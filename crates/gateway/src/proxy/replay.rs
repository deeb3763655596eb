//! Which requests may be sent twice (ARCHITECTURE.md invariant "Retry only
//! what is safe"), and keeping
//! their bodies so they can be.
//!
//! A request is replay-safe when its method is GET, HEAD, DELETE or OPTIONS
//! or it carries an `Idempotency-Key`; it asks for no `Upgrade`; it is not a
//! streaming RPC (`application/connect+*`, `application/grpc*`); and its
//! body is empty or small enough (a `Content-Length` up to
//! `--retry-max-body`) to be read up front. Such a body is buffered before
//! the first attempt; every other body streams through untouched and the
//! request is never retried.

use crate::error::ApiError;
use bytes::Bytes;
use http::header::{self, HeaderMap, HeaderName};
use http::{request, Method, StatusCode};
use http_body::Body as _;
use http_body_util::{BodyExt, Limited};
use warren_core::headers::IDEMPOTENCY_KEY;
use warren_core::server::Incoming;

const H_IDEMPOTENCY_KEY: HeaderName = HeaderName::from_static(IDEMPOTENCY_KEY);

/// A request body, ready to send.
pub(super) enum Prepared {
    /// Read in full: the request may be replayed with these bytes.
    Replayable(Bytes),
    /// Streamed as it arrives: the request is sent at most once.
    Streaming(Incoming),
}

/// Whether the request head allows a replay (the body is checked apart).
pub(super) fn replay_safe(method: &Method, headers: &HeaderMap, upgrade: bool) -> bool {
    !upgrade
        && safe_parts(
            method.as_str(),
            headers.contains_key(H_IDEMPOTENCY_KEY),
            headers.get(header::CONTENT_TYPE).map(|v| v.as_bytes()),
        )
}

/// [`replay_safe`] from the parts of a head that decide it (the proxy's
/// fast path has no `HeaderMap`): the method, whether an
/// `Idempotency-Key` was sent, and the `Content-Type`.
pub(super) fn safe_parts(method: &str, idempotency_key: bool, content_type: Option<&[u8]>) -> bool {
    if content_type.is_some_and(is_streaming_rpc) {
        return false;
    }
    matches!(method, "GET" | "HEAD" | "DELETE" | "OPTIONS") || idempotency_key
}

/// Connect streaming and gRPC: a replay would repeat a stream's effects.
fn is_streaming_rpc(content_type: &[u8]) -> bool {
    let Ok(ct) = std::str::from_utf8(content_type) else {
        return false;
    };
    let ct = ct.trim_start().to_ascii_lowercase();
    ct.starts_with("application/connect+") || ct.starts_with("application/grpc")
}

/// Buffers the body of a replay-safe request when it is small and of known
/// length; anything else streams.
pub(super) async fn prepare(
    parts: &request::Parts,
    body: Incoming,
    upgrade: bool,
    max: u64,
) -> Result<Prepared, ApiError> {
    if !replay_safe(&parts.method, &parts.headers, upgrade) {
        return Ok(Prepared::Streaming(body));
    }
    if body.is_end_stream() {
        return Ok(Prepared::Replayable(Bytes::new()));
    }
    match body.size_hint().exact() {
        Some(len) if len <= max => {}
        _ => return Ok(Prepared::Streaming(body)),
    }
    let limit = usize::try_from(max).unwrap_or(usize::MAX);
    match Limited::new(body, limit).collect().await {
        Ok(collected) => Ok(Prepared::Replayable(collected.to_bytes())),
        Err(e) => Err(ApiError::new(
            StatusCode::BAD_REQUEST,
            "invalid_body",
            format!("cannot read the request body: {e}"),
        )),
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use http::HeaderValue;

    fn headers(pairs: &[(&'static str, &'static str)]) -> HeaderMap {
        let mut h = HeaderMap::new();
        for (k, v) in pairs {
            h.insert(*k, HeaderValue::from_static(v));
        }
        h
    }

    #[test]
    fn replay_safety() {
        let none = headers(&[]);
        assert!(replay_safe(&Method::GET, &none, false));
        assert!(replay_safe(&Method::DELETE, &none, false));
        assert!(replay_safe(&Method::OPTIONS, &none, false));
        assert!(!replay_safe(&Method::POST, &none, false));
        assert!(!replay_safe(&Method::PUT, &none, false));
        // An idempotency key makes a POST safe to repeat...
        let keyed = headers(&[("idempotency-key", "k1")]);
        assert!(replay_safe(&Method::POST, &keyed, false));
        // ...but never a WebSocket or a streaming RPC.
        assert!(!replay_safe(&Method::GET, &none, true));
        let connect = headers(&[
            ("content-type", "application/connect+json"),
            ("idempotency-key", "k1"),
        ]);
        assert!(!replay_safe(&Method::POST, &connect, false));
        let grpc = headers(&[("content-type", "application/grpc+proto")]);
        assert!(!replay_safe(&Method::GET, &grpc, false));
        // Unary Connect with a key is an ordinary idempotent POST.
        let unary = headers(&[
            ("content-type", "application/json"),
            ("idempotency-key", "k"),
        ]);
        assert!(replay_safe(&Method::POST, &unary, false));
    }
}
