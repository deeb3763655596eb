//! Plain HTTP responses: the body type every route returns, and E2B's JSON
//! error shape `{"code": <http status>, "message": "..."}`.

use bytes::Bytes;
use http::{header, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full};

/// Errors a response body can fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// The body of every envd response: full, streamed file, or Connect stream.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// A body with `bytes`.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// A response with no body.
pub fn status(code: StatusCode) -> Response<Body> {
    let mut res = Response::new(empty());
    *res.status_mut() = code;
    res
}

/// A JSON response.
pub fn json(code: StatusCode, value: &serde_json::Value) -> Response<Body> {
    let mut res = Response::new(full(value.to_string()));
    *res.status_mut() = code;
    res.headers_mut().insert(
        header::CONTENT_TYPE,
        header::HeaderValue::from_static("application/json"),
    );
    res
}

/// E2B's JSON error.
pub fn error(code: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    json(
        code,
        &serde_json::json!({ "code": code.as_u16(), "message": message.to_string() }),
    )
}
