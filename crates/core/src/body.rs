//! The response body every warren HTTP server sends (gateway, node, envd),
//! the small builders around it, and reading a bounded request body.
//!
//! One body type for all: buffered JSON, an empty answer, or a stream
//! proxied from upstream or produced by a Connect handler. It is `Send` but
//! not `Sync`, because Connect's streaming bodies are not.

use bytes::Bytes;
use http::{header, HeaderValue, Response, StatusCode};
use http_body_util::combinators::UnsyncBoxBody;
use http_body_util::{BodyExt, Empty, Full, LengthLimitError, Limited};

/// Errors a body can fail with.
pub type BoxError = Box<dyn std::error::Error + Send + Sync>;

/// Every response body warren sends.
pub type Body = UnsyncBoxBody<Bytes, BoxError>;

/// A body of these bytes.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed_unsync()
}

/// An empty body.
pub fn empty() -> Body {
    Empty::new().map_err(|never| match never {}).boxed_unsync()
}

/// Any body (an upstream's, a Connect handler's) as a [`Body`].
pub fn boxed<B>(body: B) -> Body
where
    B: http_body::Body<Data = Bytes> + Send + 'static,
    B::Error: Into<BoxError>,
{
    body.map_err(Into::into).boxed_unsync()
}

/// `status` with no body.
pub fn status(status: StatusCode) -> Response<Body> {
    let mut r = Response::new(empty());
    *r.status_mut() = status;
    r
}

/// `status` with `value` serialized as JSON.
pub fn json<T: serde::Serialize + ?Sized>(status: StatusCode, value: &T) -> Response<Body> {
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

/// E2B's JSON error, `{"code": <status>, "message": "..."}`.
pub fn error(status: StatusCode, message: impl std::fmt::Display) -> Response<Body> {
    json(
        status,
        &serde_json::json!({ "code": status.as_u16(), "message": message.to_string() }),
    )
}

/// A request body that could not be read whole.
#[derive(Debug, thiserror::Error)]
pub enum ReadError {
    /// Larger than the limit: the client's fault, `413`.
    #[error("request body is larger than {0} bytes")]
    TooLarge(usize),
    /// The connection failed while reading.
    #[error("cannot read the request body: {0}")]
    Failed(BoxError),
}

impl ReadError {
    /// The status to answer with.
    pub fn status(&self) -> StatusCode {
        match self {
            ReadError::TooLarge(_) => StatusCode::PAYLOAD_TOO_LARGE,
            ReadError::Failed(_) => StatusCode::BAD_REQUEST,
        }
    }
}

/// Reads all of `body`, refusing more than `max` bytes.
pub async fn read_limited<B>(body: B, max: usize) -> Result<Bytes, ReadError>
where
    B: http_body::Body<Data = Bytes>,
    B::Error: Into<BoxError>,
{
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<LengthLimitError>() => Err(ReadError::TooLarge(max)),
        Err(e) => Err(ReadError::Failed(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[tokio::test]
    async fn bodies_over_the_limit_are_refused_as_too_large() {
        let ok = read_limited(Full::new(Bytes::from_static(b"abc")), 3).await;
        assert_eq!(ok.ok().as_deref(), Some(&b"abc"[..]));
        let err = read_limited(Full::new(Bytes::from_static(b"abcd")), 3)
            .await
            .expect_err("too large");
        assert_eq!(err.status(), StatusCode::PAYLOAD_TOO_LARGE);
    }
}
