//! What a proxied request and its answer look like on the wire: hop-by-hop
//! and spoofed `x-warren-*` headers out, the client's API key out (it is
//! the team's secret for the control plane; nothing in a sandbox may see
//! it), warren's routing headers in.
//!
//! [`Outgoing`] is the client's request rewritten once, without the parts
//! that depend on the route (the node and the generation), so a
//! replay-safe request can be sent a second time to a moved sandbox's new
//! node.
//!
//! This runs for every proxied request, so it avoids work the common
//! request does not need: one scan of the header names decides what must
//! go (usually just the two `E2b-Sandbox-*` headers), names are constants,
//! and the values the client sent for the sandbox and port are reused for
//! the node's headers rather than formatted again.

use crate::error::ApiError;
use crate::resolver::Route;
use crate::target::Target;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::uri::PathAndQuery;
use http::{request, Method, Request, Uri, Version};
use std::net::{IpAddr, SocketAddr};
use warren_core::body::Body;
use warren_core::headers::{
    is_hop_by_hop, API_KEY, E2B_SANDBOX_ID, E2B_SANDBOX_PORT, ENVD_PORT, GENERATION,
    INTERNAL_PREFIX, SANDBOX_ID, SANDBOX_PORT,
};

const X_FORWARDED_FOR: HeaderName = HeaderName::from_static("x-forwarded-for");
const H_E2B_SANDBOX_ID: HeaderName = HeaderName::from_static(E2B_SANDBOX_ID);
const H_E2B_SANDBOX_PORT: HeaderName = HeaderName::from_static(E2B_SANDBOX_PORT);
const H_SANDBOX_ID: HeaderName = HeaderName::from_static(SANDBOX_ID);
const H_SANDBOX_PORT: HeaderName = HeaderName::from_static(SANDBOX_PORT);
const H_GENERATION: HeaderName = HeaderName::from_static(GENERATION);
const H_API_KEY: HeaderName = HeaderName::from_static(API_KEY);

/// The client's request, rewritten for a node but not yet for a route.
#[derive(Debug, Clone)]
pub(super) struct Outgoing {
    method: Method,
    /// Origin form (`/path?query`), as the client sent it.
    uri: Uri,
    /// The client's headers, cleaned, with `Host` and `X-Forwarded-For`.
    headers: HeaderMap,
    /// `X-Warren-Sandbox-Id`.
    sandbox_id: HeaderValue,
    /// `X-Warren-Sandbox-Port`.
    port: HeaderValue,
}

/// Which of the headers that must not be forwarded a request has.
#[derive(Default)]
struct Unwanted {
    hop_by_hop: bool,
    internal: bool,
    e2b_id: bool,
    e2b_port: bool,
    api_key: bool,
}

impl Unwanted {
    fn scan(h: &HeaderMap) -> Unwanted {
        let mut u = Unwanted::default();
        for name in h.keys() {
            if *name == H_E2B_SANDBOX_ID {
                u.e2b_id = true;
            } else if *name == H_E2B_SANDBOX_PORT {
                u.e2b_port = true;
            } else if *name == H_API_KEY {
                u.api_key = true;
            } else if is_hop_by_hop(name) {
                u.hop_by_hop = true;
            } else if name.as_str().starts_with(INTERNAL_PREFIX) {
                u.internal = true;
            }
        }
        u
    }
}

impl Outgoing {
    /// Rewrites the client's request head for `target`; `upgrade` is the
    /// `Upgrade` protocol to ask the node for (WebSocket).
    pub(super) fn new(
        parts: request::Parts,
        target: &Target,
        peer: SocketAddr,
        upgrade: Option<HeaderValue>,
    ) -> Result<Self, ApiError> {
        let request::Parts {
            method,
            uri,
            mut headers,
            ..
        } = parts;
        let h = &mut headers;
        // HTTP/2 clients name the host in `:authority` rather than `Host`;
        // the node speaks HTTP/1.1 and servers inside the sandbox may care.
        if !h.contains_key(header::HOST) {
            if let Some(host) = uri
                .authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            {
                h.insert(header::HOST, host);
            }
        }
        let uri = origin_form(uri);

        let unwanted = Unwanted::scan(h);
        if unwanted.hop_by_hop {
            warren_core::headers::strip_hop_by_hop(h);
        }
        if unwanted.internal {
            warren_core::headers::strip_internal(h);
        }
        let sent_id = if unwanted.e2b_id {
            h.remove(H_E2B_SANDBOX_ID)
        } else {
            None
        };
        let sent_port = if unwanted.e2b_port {
            h.remove(H_E2B_SANDBOX_PORT)
        } else {
            None
        };
        // A client that sends its API key on sandbox traffic (an SDK with
        // the key in its default headers) must not hand it to the code in
        // the sandbox: the data plane needs none, and that key creates and
        // kills every sandbox of the team.
        if unwanted.api_key {
            h.remove(H_API_KEY);
        }
        if let Some(protocol) = upgrade {
            h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            h.insert(header::UPGRADE, protocol);
        }
        append_forwarded_for(h, peer);

        // The client's own values when they are exactly what was validated
        // (no surrounding spaces); otherwise made from the target.
        let sandbox_id = match sent_id {
            Some(v) if v.as_bytes() == target.sandbox_id.as_bytes() => v,
            _ => HeaderValue::from_str(&target.sandbox_id)
                .map_err(|_| ApiError::internal("unencodable sandbox id"))?,
        };
        let port = match sent_port {
            Some(v) if is_decimal(v.as_bytes(), target.port) => v,
            _ if target.port == ENVD_PORT => HeaderValue::from_static("49983"),
            _ => HeaderValue::from(target.port),
        };
        Ok(Outgoing {
            method,
            uri,
            headers,
            sandbox_id,
            port,
        })
    }

    /// The request for the node `route` names.
    pub(super) fn into_request(self, route: &Route, body: Body) -> Request<Body> {
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = self.uri;
        *req.version_mut() = Version::HTTP_11;
        let mut headers = self.headers;
        headers.insert(H_SANDBOX_ID, self.sandbox_id);
        headers.insert(H_SANDBOX_PORT, self.port);
        headers.insert(H_GENERATION, HeaderValue::from(route.generation));
        *req.headers_mut() = headers;
        req
    }
}

/// `uri` as a request to a node names it: path and query only.
fn origin_form(uri: Uri) -> Uri {
    if uri.scheme().is_none() && uri.authority().is_none() {
        return uri;
    }
    let path = uri
        .path_and_query()
        .cloned()
        .unwrap_or_else(|| PathAndQuery::from_static("/"));
    Uri::from(path)
}

/// Whether `bytes` is `port` written plainly in decimal.
fn is_decimal(bytes: &[u8], port: u16) -> bool {
    let mut n: u32 = 0;
    if bytes.is_empty() || bytes.len() > 5 || bytes[0] == b'0' {
        return false;
    }
    for &b in bytes {
        if !b.is_ascii_digit() {
            return false;
        }
        n = n * 10 + u32::from(b - b'0');
    }
    n == u32::from(port)
}

fn append_forwarded_for(h: &mut HeaderMap, peer: SocketAddr) {
    let value = match h.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => HeaderValue::from_str(&format!("{prev}, {}", peer.ip())).ok(),
        None => ip_value(peer.ip()),
    };
    if let Some(v) = value {
        h.insert(X_FORWARDED_FOR, v);
    }
}

/// An address as a header value, without `fmt` for IPv4.
fn ip_value(ip: IpAddr) -> Option<HeaderValue> {
    let IpAddr::V4(v4) = ip else {
        return HeaderValue::from_str(&ip.to_string()).ok();
    };
    let mut buf = [0u8; 15];
    let mut n = 0;
    for (i, octet) in v4.octets().into_iter().enumerate() {
        if i > 0 {
            buf[n] = b'.';
            n += 1;
        }
        if octet >= 100 {
            buf[n] = b'0' + octet / 100;
            n += 1;
        }
        if octet >= 10 {
            buf[n] = b'0' + octet / 10 % 10;
            n += 1;
        }
        buf[n] = b'0' + octet % 10;
        n += 1;
    }
    HeaderValue::from_bytes(&buf[..n]).ok()
}

pub(super) use warren_core::headers::{strip_hop_by_hop, strip_internal};

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn strips_spoofed_and_hop_headers() {
        let mut h = HeaderMap::new();
        h.insert("x-warren-generation", HeaderValue::from_static("999"));
        h.insert("X-Warren-Anything", HeaderValue::from_static("x"));
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-custom"),
        );
        h.insert("x-custom", HeaderValue::from_static("1"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-access-token", HeaderValue::from_static("t"));
        strip_hop_by_hop(&mut h);
        strip_internal(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-access-token"]);
    }

    fn rewrite(req: Request<()>, target: &Target, generation: u64) -> Request<Body> {
        let route = Route {
            sandbox_id: target.sandbox_id.clone(),
            node_id: "n".into(),
            endpoint: "127.0.0.1:9".into(),
            generation,
            state: warren_proto::scheduler::v1::BindingState::Running,
            team_id: "t".into(),
            auto_resume: false,
        };
        Outgoing::new(
            req.into_parts().0,
            target,
            "10.0.0.1:5".parse().unwrap(),
            None,
        )
        .unwrap()
        .into_request(&route, warren_core::body::empty())
    }

    #[test]
    fn a_route_fills_in_node_and_generation() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("http://49983-abc.localhost/files?path=/a")
            .header("host", "49983-abc.localhost")
            .header("x-warren-generation", "999")
            .header("x-warren-sandbox-id", "other")
            .header("e2b-sandbox-id", "abc")
            .header("e2b-sandbox-port", "49983")
            .header("x-api-key", "e2b_0123456789abcdef0123456789abcdef01234567")
            .header("x-access-token", "envd-token")
            .header("transfer-encoding", "chunked")
            .body(())
            .unwrap();
        let target = Target {
            sandbox_id: "abc".into(),
            port: 49983,
        };
        let sent = rewrite(req, &target, 7);
        assert_eq!(sent.uri(), "/files?path=/a", "origin form towards the node");
        assert_eq!(sent.method(), Method::POST);
        let h = sent.headers();
        assert_eq!(h[GENERATION], "7");
        assert_eq!(h[SANDBOX_ID], "abc");
        assert_eq!(h[SANDBOX_PORT], "49983");
        assert_eq!(h["host"], "49983-abc.localhost");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        assert!(h.get("e2b-sandbox-id").is_none());
        assert!(h.get("e2b-sandbox-port").is_none());
        assert!(h.get("transfer-encoding").is_none());
        assert!(
            h.get("x-api-key").is_none(),
            "the API key never leaves the gateway"
        );
        assert_eq!(
            h.get_all(SANDBOX_ID).iter().count(),
            1,
            "no spoofed second id"
        );
        assert_eq!(h["x-access-token"], "envd-token");
    }

    #[test]
    fn target_values_are_canonical_whatever_the_client_wrote() {
        // Padded or zero-led values were accepted as this target; the node
        // gets the plain form.
        let req = Request::builder()
            .uri("/x")
            .header("e2b-sandbox-id", " abc ")
            .header("e2b-sandbox-port", "08080")
            .header("x-forwarded-for", "192.0.2.1")
            .body(())
            .unwrap();
        let target = Target {
            sandbox_id: "abc".into(),
            port: 8080,
        };
        let sent = rewrite(req, &target, 1);
        let h = sent.headers();
        assert_eq!(h[SANDBOX_ID], "abc");
        assert_eq!(h[SANDBOX_PORT], "8080");
        assert_eq!(h["x-forwarded-for"], "192.0.2.1, 10.0.0.1");
        assert!(h.get("host").is_none(), "no host to pass on");
    }

    #[test]
    fn addresses_format_as_std_does() {
        for ip in [
            "0.0.0.0",
            "10.0.0.1",
            "127.0.0.1",
            "192.168.100.255",
            "255.255.255.255",
            "1.20.3.40",
            "::1",
            "2001:db8::7",
        ] {
            let ip: IpAddr = ip.parse().unwrap();
            assert_eq!(ip_value(ip).unwrap(), ip.to_string().as_str());
        }
        assert!(is_decimal(b"49983", 49983));
        assert!(!is_decimal(b"049983", 49983));
        assert!(!is_decimal(b"4998", 49983));
        assert!(!is_decimal(b"", 0));
    }
}
