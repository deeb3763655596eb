//! The data plane: sandbox traffic proxied to the node that hosts it.
//!
//! Per request: resolve the route (through the [`Resolver`](crate::resolver::Resolver)),
//! rewrite headers (hop-by-hop and every client `x-warren-*` out; warren's
//! own routing headers in), send it over the pooled HTTP/1.1 client, and
//! stream the answer back frame by frame. Bodies are never buffered, so
//! chunked uploads and Connect server streams pass through as they are
//! produced. An `Upgrade` (WebSocket) is forwarded, and after the node's
//! `101` both upgraded connections are spliced.

use crate::error::ApiError;
use crate::resolver::Route;
use crate::response::{Body, BoxError};
use crate::state::App;
use crate::target::Target;
use http::header::{self, HeaderMap, HeaderName, HeaderValue};
use http::{Request, Response, StatusCode, Version};
use http_body_util::BodyExt;
use hyper::body::Incoming;
use hyper_util::rt::TokioIo;
use std::net::SocketAddr;
use warren_core::headers::{
    E2B_SANDBOX_ID, E2B_SANDBOX_PORT, GENERATION, INTERNAL_PREFIX, ROUTE, ROUTE_NOT_FOUND,
    SANDBOX_ID, SANDBOX_PORT,
};

/// Headers that describe one hop, never forwarded (RFC 9110 §7.6.1).
const HOP_BY_HOP: [&str; 8] = [
    "connection",
    "keep-alive",
    "proxy-connection",
    "proxy-authenticate",
    "proxy-authorization",
    "te",
    "trailer",
    "transfer-encoding",
];

/// Proxies one data-plane request; every failure is a JSON error.
pub async fn handle(
    app: &App,
    target: Target,
    peer: SocketAddr,
    req: Request<Incoming>,
) -> Response<Body> {
    match forward(app, &target, peer, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn forward(
    app: &App,
    target: &Target,
    peer: SocketAddr,
    mut req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    let route = app.resolver.resolve(&target.sandbox_id).await?;
    let upgrade = upgrade_protocol(&req);
    // Taken before the request is rebuilt: the pending client-side upgrade
    // lives in the request's extensions.
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let upstream = rewrite(req, &route, target, peer, upgrade)?;

    let mut resp = match app.http.request(upstream).await {
        Ok(r) => r,
        Err(e) => {
            // No HTTP answer at all (refused, reset, connect timeout): the
            // route may be stale (DESIGN invariant 6). Issue 5's cache
            // evicts here; one refetch and a replay-safe retry come with it.
            tracing::debug!(sandbox = %target.sandbox_id, node = %route.node_id,
                endpoint = %route.endpoint, error = %e, connect = e.is_connect(),
                "cannot reach the node");
            app.resolver.evict(&route);
            return Err(ApiError::upstream_unreachable());
        }
    };

    if resp.status() == StatusCode::NOT_FOUND && is_stale_marker(resp.headers()) {
        // The node does not host this sandbox at this generation: the one
        // reliable stale-route signal. Seam for issue 5: evict, one uncached
        // lookup, retry once if the request is replay-safe.
        app.resolver.evict(&route);
        return Err(ApiError::sandbox_not_found(&target.sandbox_id));
    }

    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "bad_upstream",
                "the sandbox switched protocols without being asked to",
            ));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        let sandbox = target.sandbox_id.clone();
        tokio::spawn(async move {
            match tokio::try_join!(client_upgrade, upstream_upgrade) {
                Ok((client, upstream)) => {
                    let mut client = TokioIo::new(client);
                    let mut upstream = TokioIo::new(upstream);
                    if let Err(e) = tokio::io::copy_bidirectional(&mut client, &mut upstream).await
                    {
                        tracing::debug!(sandbox = %sandbox, error = %e, "upgraded connection ended");
                    }
                }
                Err(e) => tracing::debug!(sandbox = %sandbox, error = %e, "upgrade failed"),
            }
        });
        strip_internal(resp.headers_mut());
        return Ok(resp.map(|_| crate::response::empty()));
    }

    strip_hop_by_hop(resp.headers_mut());
    strip_internal(resp.headers_mut());
    Ok(resp.map(|b| b.map_err(|e| -> BoxError { Box::new(e) }).boxed()))
}

/// The `Upgrade` protocol of an HTTP/1.1 upgrade request (`Connection: upgrade`).
fn upgrade_protocol<B>(req: &Request<B>) -> Option<HeaderValue> {
    if req.version() != Version::HTTP_11 {
        return None;
    }
    let asks = req
        .headers()
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .any(|t| t.trim().eq_ignore_ascii_case("upgrade"));
    asks.then(|| req.headers().get(header::UPGRADE).cloned())
        .flatten()
}

fn is_stale_marker(headers: &HeaderMap) -> bool {
    headers.get(ROUTE).is_some_and(|v| {
        v.as_bytes()
            .eq_ignore_ascii_case(ROUTE_NOT_FOUND.as_bytes())
    })
}

/// The request as the node should see it.
fn rewrite(
    req: Request<Incoming>,
    route: &Route,
    target: &Target,
    peer: SocketAddr,
    upgrade: Option<HeaderValue>,
) -> Result<Request<Body>, ApiError> {
    let (mut parts, body) = req.into_parts();
    // HTTP/2 clients name the host in `:authority` rather than `Host`; the
    // node speaks HTTP/1.1 and servers inside the sandbox may care.
    let host = parts.headers.get(header::HOST).cloned().or_else(|| {
        parts
            .uri
            .authority()
            .and_then(|a| HeaderValue::from_str(a.as_str()).ok())
    });
    let path = parts
        .uri
        .path_and_query()
        .map(|p| p.as_str())
        .unwrap_or("/");
    parts.uri = format!("http://{}{}", route.endpoint, path)
        .parse()
        .map_err(|e| {
            ApiError::internal(format!(
                "node endpoint {:?} is not usable: {e}",
                route.endpoint
            ))
        })?;
    let h = &mut parts.headers;
    strip_hop_by_hop(h);
    strip_internal(h);
    h.remove(E2B_SANDBOX_ID);
    h.remove(E2B_SANDBOX_PORT);
    if let Some(protocol) = upgrade {
        h.insert(header::CONNECTION, HeaderValue::from_static("upgrade"));
        h.insert(header::UPGRADE, protocol);
    }
    if let Some(host) = host {
        h.insert(header::HOST, host);
    }
    h.insert(
        HeaderName::from_static(SANDBOX_ID),
        header_value(&target.sandbox_id)?,
    );
    h.insert(
        HeaderName::from_static(SANDBOX_PORT),
        HeaderValue::from(target.port),
    );
    h.insert(
        HeaderName::from_static(GENERATION),
        HeaderValue::from(route.generation),
    );
    append_forwarded_for(h, peer);
    parts.version = Version::HTTP_11;
    Ok(Request::from_parts(
        parts,
        body.map_err(|e| -> BoxError { Box::new(e) }).boxed(),
    ))
}

fn header_value(s: &str) -> Result<HeaderValue, ApiError> {
    HeaderValue::from_str(s).map_err(|_| ApiError::internal("unencodable header value"))
}

fn append_forwarded_for(h: &mut HeaderMap, peer: SocketAddr) {
    let ip = peer.ip().to_string();
    let value = match h.get("x-forwarded-for").and_then(|v| v.to_str().ok()) {
        Some(prev) => format!("{prev}, {ip}"),
        None => ip,
    };
    if let Ok(v) = HeaderValue::from_str(&value) {
        h.insert("x-forwarded-for", v);
    }
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
fn strip_hop_by_hop(h: &mut HeaderMap) {
    let named: Vec<HeaderName> = h
        .get_all(header::CONNECTION)
        .iter()
        .filter_map(|v| v.to_str().ok())
        .flat_map(|v| v.split(','))
        .filter_map(|t| HeaderName::from_bytes(t.trim().as_bytes()).ok())
        .collect();
    for name in named {
        h.remove(name);
    }
    for name in HOP_BY_HOP {
        h.remove(name);
    }
    h.remove(header::UPGRADE);
}

/// Removes every `x-warren-*` header, so a client cannot spoof warren's own.
fn strip_internal(h: &mut HeaderMap) {
    let internal: Vec<HeaderName> = h
        .keys()
        .filter(|k| k.as_str().starts_with(INTERNAL_PREFIX))
        .cloned()
        .collect();
    for name in internal {
        h.remove(name);
    }
}

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
}
