//! Headers warren puts on the wire between its parts.
//!
//! The gateway strips every client-sent header starting with `x-warren-`
//! before it adds its own, so a client cannot spoof them.

/// Gateway → node: which sandbox the request is for.
pub const SANDBOX_ID: &str = "x-warren-sandbox-id";
/// Gateway → node: which port inside the sandbox.
pub const SANDBOX_PORT: &str = "x-warren-sandbox-port";
/// Gateway → node: the binding generation the gateway routed by.
pub const GENERATION: &str = "x-warren-generation";
/// Node → gateway: `not-found` when the node does not host that sandbox at
/// that generation (the one reliable stale-route signal).
pub const ROUTE: &str = "x-warren-route";
/// Value of [`ROUTE`] for a stale route.
pub const ROUTE_NOT_FOUND: &str = "not-found";
/// Prefix of every warren-internal header.
pub const INTERNAL_PREFIX: &str = "x-warren-";

/// E2B SDK → gateway: sandbox id when `E2B_SANDBOX_URL` is used.
pub const E2B_SANDBOX_ID: &str = "e2b-sandbox-id";
/// E2B SDK → gateway: sandbox port when `E2B_SANDBOX_URL` is used.
pub const E2B_SANDBOX_PORT: &str = "e2b-sandbox-port";
/// envd's access token header.
pub const ACCESS_TOKEN: &str = "x-access-token";
/// Control-plane API key header.
pub const API_KEY: &str = "x-api-key";
/// Idempotency key header for creates.
pub const IDEMPOTENCY_KEY: &str = "idempotency-key";

/// The port envd serves its API on, as in E2B.
pub const ENVD_PORT: u16 = 49983;

use http::header::{self, HeaderMap, HeaderName};

/// Whether an answer is a node's "I do not host that sandbox at that
/// generation" ([`ROUTE`]: [`ROUTE_NOT_FOUND`], any case): the stale-route
/// signal, on the data plane and the control API alike.
pub fn is_not_hosted(h: &HeaderMap) -> bool {
    h.get(ROUTE).is_some_and(|v| {
        v.as_bytes()
            .eq_ignore_ascii_case(ROUTE_NOT_FOUND.as_bytes())
    })
}

/// Hop-by-hop headers (RFC 9110 §7.6.1 and the usual legacy ones): they
/// describe one connection and are never forwarded.
const HOP_BY_HOP: [HeaderName; 9] = [
    header::CONNECTION,
    HeaderName::from_static("keep-alive"),
    HeaderName::from_static("proxy-connection"),
    header::PROXY_AUTHENTICATE,
    header::PROXY_AUTHORIZATION,
    header::TE,
    header::TRAILER,
    header::TRANSFER_ENCODING,
    header::UPGRADE,
];

/// Whether `name` is a hop-by-hop header (besides those a `Connection`
/// header names).
pub fn is_hop_by_hop(name: &HeaderName) -> bool {
    HOP_BY_HOP.contains(name)
}

/// [`is_hop_by_hop`] for a name as it came on the wire, in any case (the
/// gateway's fast path, which parses heads without `HeaderName`s).
pub fn is_hop_by_hop_str(name: &str) -> bool {
    HOP_BY_HOP
        .iter()
        .any(|h| h.as_str().eq_ignore_ascii_case(name))
}

/// Removes hop-by-hop headers, including those the `Connection` header names.
/// A proxy that passes an upgrade on re-adds `Upgrade`/`Connection` itself.
pub fn strip_hop_by_hop(h: &mut HeaderMap) {
    // Proxies run this on every request and answer, and usually there is
    // nothing to remove: one scan of the names, and no hashing, decides.
    if !h.keys().any(is_hop_by_hop) {
        return;
    }
    if h.contains_key(header::CONNECTION) {
        // Only then is the list parsed (HTTP/1.1 clients rarely send it).
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
    }
    for name in HOP_BY_HOP {
        h.remove(name);
    }
}

/// Removes every `x-warren-*` header, so a client cannot spoof warren's own.
pub fn strip_internal(h: &mut HeaderMap) {
    // The common case (no such header) costs one scan and no allocation.
    if !h.keys().any(|k| k.as_str().starts_with(INTERNAL_PREFIX)) {
        return;
    }
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
mod tests {
    use super::*;
    use http::HeaderValue;

    #[test]
    fn strips_hop_by_hop_named_and_internal_headers() {
        let mut h = HeaderMap::new();
        h.insert(
            "connection",
            HeaderValue::from_static("keep-alive, x-custom"),
        );
        h.insert("x-custom", HeaderValue::from_static("1"));
        h.insert("upgrade", HeaderValue::from_static("websocket"));
        h.insert("te", HeaderValue::from_static("trailers"));
        h.insert("x-warren-generation", HeaderValue::from_static("9"));
        h.insert("x-access-token", HeaderValue::from_static("t"));
        strip_hop_by_hop(&mut h);
        strip_internal(&mut h);
        let left: Vec<&str> = h.keys().map(|k| k.as_str()).collect();
        assert_eq!(left, ["x-access-token"]);
    }
}
