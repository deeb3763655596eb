//! The data plane (docs/internals.md "Data plane"): check the sandbox's
//! identity *before* touching the request body, then stream the request to
//! the sandbox's envd — its API socket for port 49983, its relay for any
//! other port — and stream the answer back.
//!
//! **Invariant:** a request reaches a sandbox only when this node hosts that
//! sandbox id at exactly the generation the gateway named; otherwise the
//! answer is 404 with `X-Warren-Route: not-found`, and the body is never read.
//!
//! One upstream HTTP/1.1 connection per request, over a fresh Unix-socket
//! connection: nothing to pool across sandboxes, and a relayed connection is
//! bound to one port anyway. Bodies are never buffered, so Connect server
//! streams and large uploads flow as they come. WebSocket (and any HTTP/1.1
//! `Upgrade`) is forwarded: envd's `101` goes back to the client and the two
//! upgraded connections are spliced.

use crate::envd::{self, RelayError};
use crate::http::{not_found_marker, Shared};
use crate::metrics::Outcome;
use crate::sandbox::network::Denied;
use http::header::{self, HeaderMap, HeaderValue};
use http::{Request, Response, StatusCode, Uri, Version};
use http_body_util::BodyExt;
use hyper_util::rt::TokioIo;
use warren_core::body::{error, Body};
use warren_core::headers as wh;
use warren_core::network::TRAFFIC_ACCESS_TOKEN_HEADER as TRAFFIC_TOKEN;
use warren_core::server::Incoming;

/// Headers that describe one hop's connection, never forwarded (RFC 9110 §7.6.1).
pub async fn handle(shared: &Shared, mut req: Request<Incoming>) -> Response<Body> {
    let (id, port, generation) = match identity(req.headers()) {
        Ok(v) => v,
        Err(msg) => {
            shared.metrics.request(Outcome::BadRequest);
            discard_later(req.into_body());
            return error(StatusCode::BAD_REQUEST, msg);
        }
    };
    let Some(sandbox) = shared.registry.get(&id, generation) else {
        shared.metrics.request(Outcome::NotFoundMarker);
        discard_later(req.into_body());
        return not_found_marker(format!(
            "sandbox {id} (generation {generation}) is not on node {}",
            shared.registry.node_id()
        ));
    };
    // A sandbox created with `allowPublicTraffic: false`: its own ports
    // (never envd's, which has its own access token) need the traffic
    // access token, as E2B's proxy asks for it.
    if port != wh::ENVD_PORT {
        let token = req.headers().get(TRAFFIC_TOKEN).map(HeaderValue::as_bytes);
        if let Err(why) = sandbox.access.admit(token) {
            shared.metrics.request(Outcome::Forbidden);
            discard_later(req.into_body());
            let what = match why {
                Denied::Missing => "is missing",
                Denied::Wrong => "is not this sandbox's",
            };
            return error(
                StatusCode::FORBIDDEN,
                format!(
                    "sandbox {id} does not allow public traffic: the {TRAFFIC_TOKEN} header {what}"
                ),
            );
        }
    }
    // Frozen (paused): nothing in it can answer. Registered before the
    // check, so a freeze from here on wakes it (see the answer below).
    let frozen = sandbox.frozen.notified();
    tokio::pin!(frozen);
    frozen.as_mut().enable();
    if sandbox.is_paused() {
        shared.metrics.request(Outcome::UpstreamError);
        discard_later(req.into_body());
        return paused(&id);
    }
    let stream = if port == wh::ENVD_PORT {
        envd::connect_api(&sandbox.paths.envd_sock)
            .await
            .map_err(RelayError::Io)
    } else {
        envd::connect_relay(&sandbox.paths.relay_sock, port).await
    };
    let stream = match stream {
        Ok(s) => s,
        Err(RelayError::PortClosed { .. }) => {
            shared.metrics.request(Outcome::PortClosed);
            discard_later(req.into_body());
            return error(
                StatusCode::BAD_GATEWAY,
                format!("port {port} is not open in sandbox {id}"),
            );
        }
        Err(e) => {
            shared.metrics.request(Outcome::UpstreamError);
            discard_later(req.into_body());
            tracing::warn!(sandbox_id = %id, port, error = %e, "cannot reach envd");
            return error(
                StatusCode::BAD_GATEWAY,
                format!("cannot reach envd of sandbox {id}: {e}"),
            );
        }
    };

    let upgrade = warren_core::upgrade::protocol(&req).is_some();
    // Must be taken from the request before it is consumed below.
    let client_side = upgrade.then(|| hyper::upgrade::on(&mut req));
    let (mut parts, body) = req.into_parts();
    prepare_request_head(&mut parts, upgrade);
    // The token is for this hop only; the sandbox's server never sees it.
    parts.headers.remove(TRAFFIC_TOKEN);
    if let (Some(mask), false) = (&sandbox.access.mask_request_host, port == wh::ENVD_PORT) {
        // Checked at create to be a host; `${PORT}` is the port asked for.
        if let Ok(v) = HeaderValue::from_str(&warren_core::network::masked_host(mask, port)) {
            parts.headers.insert(header::HOST, v);
        }
    }

    let (mut sender, conn) = match hyper::client::conn::http1::Builder::new()
        // Header names as E2B's (Go) proxy writes them (`Host`, `Accept`):
        // a server in the sandbox that looks at their case sees what it
        // would see on E2B.
        .title_case_headers(true)
        .handshake(TokioIo::new(stream))
        .await
    {
        Ok(pair) => pair,
        Err(e) => {
            shared.metrics.request(Outcome::UpstreamError);
            return error(
                StatusCode::BAD_GATEWAY,
                format!("HTTP handshake with sandbox {id} failed: {e}"),
            );
        }
    };
    tokio::spawn(async move {
        if let Err(e) = conn.with_upgrades().await {
            tracing::debug!(error = %e, "upstream connection ended with an error");
        }
    });
    // A pause that freezes the sandbox before it answers (its timeout
    // pausing it, or a pause through the API) ends the wait: E2B's pause
    // drops what is in flight too. (An answer already streaming stalls
    // until a resume.)
    let answer = tokio::select! {
        r = sender.send_request(Request::from_parts(parts, body)) => r,
        () = &mut frozen => {
            shared.metrics.request(Outcome::UpstreamError);
            return paused(&id);
        }
    };
    let mut resp = match answer {
        Ok(r) => r,
        Err(e) => {
            shared.metrics.request(Outcome::UpstreamError);
            return error(
                StatusCode::BAD_GATEWAY,
                format!("sandbox {id} port {port} failed to answer: {e}"),
            );
        }
    };
    shared.metrics.request(Outcome::Forwarded);

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        if let Some(client_side) = client_side {
            let upstream_side = hyper::upgrade::on(&mut resp);
            warren_core::upgrade::splice(client_side, upstream_side, id.to_string());
            wh::strip_internal(resp.headers_mut());
            return resp.map(|_| warren_core::body::empty());
        }
    }
    // Everything here came from inside the sandbox: `X-Warren-*` (the
    // stale-route marker above all) is the node's alone to send.
    strip_hop_by_hop(resp.headers_mut(), true);
    resp.map(warren_core::body::boxed)
}

/// 502 for a frozen (paused) sandbox, the gateway's "paused" answer in
/// E2B's shape: the SDKs read a 502 as "not running".
fn paused(id: &str) -> Response<Body> {
    error(
        StatusCode::BAD_GATEWAY,
        format!(
            "The sandbox is paused: sandbox {id} was paused while the request waited; \
             resume it (POST /sandboxes/{id}/resume, or Sandbox.connect in the SDK)"
        ),
    )
}

/// How much of an unwanted request body is read and thrown away after an
/// early answer, and for how long.
const DISCARD_LIMIT: usize = 64 << 20;
const DISCARD_TIME: std::time::Duration = std::time::Duration::from_secs(2);

/// After an early answer (the body was never looked at), keeps reading and
/// discarding the body for a while instead of closing at once: a client
/// still sending would otherwise get a reset that can swallow the answer —
/// and that answer (often the stale-route marker) is the one the gateway
/// must see. HTTP/2 needs none of this, but it does no harm there.
fn discard_later(body: Incoming) {
    tokio::spawn(async move {
        let mut body = body;
        let mut seen = 0usize;
        let drain = async {
            while let Some(frame) = body.frame().await {
                match frame {
                    Ok(f) => {
                        seen += f.data_ref().map_or(0, |d| d.len());
                        if seen > DISCARD_LIMIT {
                            break;
                        }
                    }
                    Err(_) => break,
                }
            }
        };
        let _ = tokio::time::timeout(DISCARD_TIME, drain).await;
    });
}

/// The three `X-Warren-*` headers, checked.
fn identity(h: &HeaderMap) -> Result<(String, u16, u64), String> {
    let get = |name: &str| -> Result<&str, String> {
        h.get(name)
            .ok_or_else(|| format!("missing header {name}"))?
            .to_str()
            .map_err(|_| format!("header {name} is not visible ASCII"))
    };
    let id = get(wh::SANDBOX_ID)?;
    warren_core::id::validate_sandbox_id(id).map_err(|e| format!("{}: {e}", wh::SANDBOX_ID))?;
    let port = get(wh::SANDBOX_PORT)?;
    let port = port
        .parse::<u16>()
        .ok()
        .filter(|p| *p > 0)
        .ok_or_else(|| format!("{}: {port:?} is not a port (1-65535)", wh::SANDBOX_PORT))?;
    let generation = get(wh::GENERATION)?;
    let generation = generation
        .parse::<u64>()
        .ok()
        .filter(|g| *g > 0)
        .ok_or_else(|| {
            format!(
                "{}: {generation:?} is not a positive integer",
                wh::GENERATION
            )
        })?;
    Ok((id.to_string(), port, generation))
}

/// Turns whatever arrived (HTTP/1.1 or h2) into an HTTP/1.1 request head for envd.
fn prepare_request_head(parts: &mut http::request::Parts, upgrade: bool) {
    let saved_upgrade = parts.headers.get(header::UPGRADE).cloned();
    strip_hop_by_hop(&mut parts.headers, true);
    if upgrade {
        if let Some(u) = saved_upgrade {
            parts.headers.insert(header::UPGRADE, u);
            parts
                .headers
                .insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        }
    }
    if !parts.headers.contains_key(header::HOST) {
        let host = parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
            .unwrap_or_else(|| HeaderValue::from_static("localhost"));
        parts.headers.insert(header::HOST, host);
    }
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = path
        .parse::<Uri>()
        .unwrap_or_else(|_| Uri::from_static("/"));
    parts.version = Version::HTTP_11;
}

/// Removes hop-by-hop headers (and those `Connection` names), plus every
/// `x-warren-*` header when `internal` is set.
fn strip_hop_by_hop(headers: &mut HeaderMap, internal: bool) {
    wh::strip_hop_by_hop(headers);
    if internal {
        wh::strip_internal(headers);
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use http::header::HeaderName;

    fn headers(pairs: &[(&str, &str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(
                HeaderName::from_bytes(k.as_bytes()).unwrap(),
                HeaderValue::from_str(v).unwrap(),
            );
        }
        h
    }

    #[test]
    fn identity_headers_are_checked() {
        let ok = headers(&[
            (wh::SANDBOX_ID, "abc"),
            (wh::SANDBOX_PORT, "49983"),
            (wh::GENERATION, "2"),
        ]);
        assert_eq!(identity(&ok).unwrap(), ("abc".to_string(), 49983, 2));
        for bad in [
            [
                (wh::SANDBOX_ID, "ABC"),
                (wh::SANDBOX_PORT, "1"),
                (wh::GENERATION, "1"),
            ],
            [
                (wh::SANDBOX_ID, "abc"),
                (wh::SANDBOX_PORT, "0"),
                (wh::GENERATION, "1"),
            ],
            [
                (wh::SANDBOX_ID, "abc"),
                (wh::SANDBOX_PORT, "70000"),
                (wh::GENERATION, "1"),
            ],
            [
                (wh::SANDBOX_ID, "abc"),
                (wh::SANDBOX_PORT, "1"),
                (wh::GENERATION, "0"),
            ],
            [
                (wh::SANDBOX_ID, "abc"),
                (wh::SANDBOX_PORT, "1"),
                ("x-other", "1"),
            ],
        ] {
            assert!(identity(&headers(&bad)).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn internal_and_hop_by_hop_headers_are_removed() {
        let mut h = headers(&[
            (wh::SANDBOX_ID, "abc"),
            ("x-warren-anything", "1"),
            ("connection", "keep-alive, x-custom"),
            ("x-custom", "1"),
            ("te", "trailers"),
            ("x-access-token", "t"),
        ]);
        strip_hop_by_hop(&mut h, true);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, vec!["x-access-token"]);
    }
}
