//! The body type every gateway response uses, and small builders for JSON
//! and empty responses.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Empty, Full};

/// Boxed error for bodies: upstream hyper errors, or none at all.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;
/// A response body: buffered JSON, or a streamed upstream body.
pub type Body = BoxBody<Bytes, BoxError>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed()
}

/// `status` with `value` serialized as JSON.
pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    // Serializing our own plain structs cannot fail; fall back to a fixed body
    // rather than panic if it ever did.
    let bytes = serde_json::to_vec(value)
        .unwrap_or_else(|_| br#"{"code":500,"message":"response encoding failed"}"#.to_vec());
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// `status` with no body.
pub fn no_content(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = status;
    r
}
