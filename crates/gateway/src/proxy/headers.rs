//! What a proxied request and its answer look like on the wire: hop-by-hop
//! and spoofed `x-warren-*` headers out, the client's API key out (it is
//! the team's secret for the control plane; nothing in a sandbox may see
//! it), warren's routing headers in.
//!
//! [`Outgoing`] is the client's request rewritten once, without the parts
//! that depend on the route (the node's address and the generation), so a
//! replay-safe request can be sent a second time to a moved sandbox's new
//! node.

use crate::error::ApiError;
use crate::resolver::Route;
use crate::target::Target;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{request, Method, Request, Version};
use std::net::SocketAddr;
use warren_core::body::Body;
use warren_core::headers::{
    API_KEY, E2B_SANDBOX_ID, E2B_SANDBOX_PORT, GENERATION, SANDBOX_ID, SANDBOX_PORT,
};

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
/// Names are constants, not strings: this runs twice per proxied request,
/// and parsing a name from a `&str` showed up in profiles.
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
    /// Path and query, as the client sent them.
    path: String,
    headers: HeaderMap,
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
        // HTTP/2 clients name the host in `:authority` rather than `Host`;
        // the node speaks HTTP/1.1 and servers inside the sandbox may care.
        let host = headers.get(header::HOST).cloned().or_else(|| {
            uri.authority()
                .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
        });
        let path = uri
            .path_and_query()
            .map(|p| p.as_str())
            .unwrap_or("/")
            .to_string();
        let h = &mut headers;
        strip_hop_by_hop(h);
        strip_internal(h);
        h.remove(H_E2B_SANDBOX_ID);
        h.remove(H_E2B_SANDBOX_PORT);
        // A client that sends its API key on sandbox traffic (an SDK with
        // the key in its default headers) must not hand it to the code in
        // the sandbox: the data plane needs none, and that key creates and
        // kills every sandbox of the team.
        h.remove(H_API_KEY);
        if let Some(protocol) = upgrade {
            h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
            h.insert(header::UPGRADE, protocol);
        }
        if let Some(host) = host {
            h.insert(header::HOST, host);
        }
        h.insert(
            H_SANDBOX_ID,
            HeaderValue::from_str(&target.sandbox_id)
                .map_err(|_| ApiError::internal("unencodable sandbox id"))?,
        );
        h.insert(H_SANDBOX_PORT, HeaderValue::from(target.port));
        append_forwarded_for(h, peer);
        Ok(Outgoing {
            method,
            path,
            headers,
        })
    }

    /// The request for the node `route` names.
    pub(super) fn into_request(
        self,
        scheme: &str,
        route: &Route,
        body: Body,
    ) -> Result<Request<Body>, ApiError> {
        let uri = http::Uri::builder()
            .scheme(scheme)
            .authority(route.endpoint.as_str())
            .path_and_query(self.path.as_str())
            .build()
            .map_err(|e| {
                ApiError::internal(format!(
                    "node endpoint {:?} is not usable: {e}",
                    route.endpoint
                ))
            })?;
        let mut req = Request::new(body);
        *req.method_mut() = self.method;
        *req.uri_mut() = uri;
        *req.version_mut() = Version::HTTP_11;
        *req.headers_mut() = self.headers;
        req.headers_mut()
            .insert(H_GENERATION, HeaderValue::from(route.generation));
        Ok(req)
    }
}

fn append_forwarded_for(h: &mut HeaderMap, peer: SocketAddr) {
    let ip = peer.ip().to_string();
    let value = match h.get(&X_FORWARDED_FOR).and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {ip}"),
        None => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert(X_FORWARDED_FOR, v);
    }
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

    #[test]
    fn a_route_fills_in_node_and_generation() {
        let req = Request::builder()
            .method(Method::POST)
            .uri("/files?path=/a")
            .header("host", "49983-abc.localhost")
            .header("x-warren-generation", "999")
            .header("e2b-sandbox-id", "abc")
            .header("x-api-key", "e2b_0123456789abcdef0123456789abcdef01234567")
            .header("x-access-token", "envd-token")
            .body(())
            .unwrap();
        let target = Target {
            sandbox_id: "abc".into(),
            port: 49983,
        };
        let out = Outgoing::new(
            req.into_parts().0,
            &target,
            "10.0.0.1:5".parse().unwrap(),
            None,
        )
        .unwrap();
        let route = Route {
            sandbox_id: "abc".into(),
            node_id: "n".into(),
            endpoint: "127.0.0.1:9".into(),
            generation: 7,
            state: warren_proto::scheduler::v1::BindingState::Running,
            team_id: "t".into(),
        };
        let sent = out
            .into_request("http", &route, warren_core::body::empty())
            .unwrap();
        assert_eq!(sent.uri(), "http://127.0.0.1:9/files?path=/a");
        assert_eq!(sent.method(), Method::POST);
        let h = sent.headers();
        assert_eq!(h[GENERATION], "7");
        assert_eq!(h[SANDBOX_ID], "abc");
        assert_eq!(h[SANDBOX_PORT], "49983");
        assert_eq!(h["host"], "49983-abc.localhost");
        assert_eq!(h["x-forwarded-for"], "10.0.0.1");
        assert!(h.get("e2b-sandbox-id").is_none());
        assert!(
            h.get("x-api-key").is_none(),
            "the API key never leaves the gateway"
        );
        assert_eq!(h["x-access-token"], "envd-token");
    }
}
