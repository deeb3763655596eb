//! The node's one HTTP listener (HTTP/1.1 and h2c): a request carrying
//! `X-Warren-Sandbox-Id` is data plane ([`crate::proxy`]); anything under
//! `/_warren/v1/` without it is the control API ([`crate::control`]).

use crate::metrics::Metrics;
use crate::sandbox::Registry;
use bytes::Bytes;
use http::{HeaderValue, Request, Response, StatusCode};
use http_body_util::{combinators::BoxBody, BodyExt, Full};
use hyper::body::Incoming;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

/// Every response body the node sends: streamed from envd or a small JSON.
pub type Body = BoxBody<Bytes, hyper::Error>;

/// What every request handler shares.
pub struct Shared {
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    /// This process's incarnation, as registered with the scheduler.
    pub incarnation: u64,
}

/// A complete body.
pub fn full(bytes: impl Into<Bytes>) -> Body {
    Full::new(bytes.into())
        .map_err(|never| match never {})
        .boxed()
}

/// A JSON error `{"code": <status>, "message": ...}`.
pub fn error(status: StatusCode, message: impl Into<String>) -> Response<Body> {
    let body = serde_json::json!({"code": status.as_u16(), "message": message.into()});
    json(status, &body)
}

/// A JSON response.
pub fn json<T: serde::Serialize>(status: StatusCode, value: &T) -> Response<Body> {
    let bytes = serde_json::to_vec(value).unwrap_or_else(|_| b"{}".to_vec());
    let mut r = Response::new(full(bytes));
    *r.status_mut() = status;
    r.headers_mut().insert(
        http::header::CONTENT_TYPE,
        HeaderValue::from_static("application/json"),
    );
    r
}

/// The stale-route answer: 404, `X-Warren-Route: not-found`, JSON.
pub fn not_found_marker(message: impl Into<String>) -> Response<Body> {
    let mut r = error(StatusCode::NOT_FOUND, message);
    r.headers_mut().insert(
        warren_core::headers::ROUTE,
        HeaderValue::from_static(warren_core::headers::ROUTE_NOT_FOUND),
    );
    r
}

async fn route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
    if req.headers().contains_key(warren_core::headers::SANDBOX_ID) {
        return crate::proxy::handle(&shared, req).await;
    }
    if req.uri().path().starts_with(crate::control::PREFIX) {
        return crate::control::handle(&shared, req).await;
    }
    error(
        StatusCode::BAD_REQUEST,
        "data-plane requests need X-Warren-Sandbox-Id, X-Warren-Sandbox-Port and \
         X-Warren-Generation; the control API lives under /_warren/v1/",
    )
}

/// Serves `listener` until `shutdown` resolves, then lets in-flight
/// connections finish for up to `drain` before returning.
pub async fn serve(
    listener: TcpListener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let handler = move |_peer, req| route(shared.clone(), req);
    warren_core::server::serve(listener, handler, shutdown, drain).await;
}
