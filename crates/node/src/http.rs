//! The node's one HTTP listener (HTTP/1.1 and h2c): a request carrying
//! `X-Warren-Sandbox-Id` is data plane ([`crate::proxy`]); anything under
//! `/_warren/v1/` without it is the control API ([`crate::control`]).

use crate::metrics::Metrics;
use crate::sandbox::Registry;
use http::{HeaderValue, Request, Response, StatusCode};
use std::future::Future;
use std::sync::Arc;
use warren_core::body::{error, Body};
use warren_core::server::{Incoming, Limits, ListenerMetrics};

/// What every request handler shares.
pub struct Shared {
    pub registry: Arc<Registry>,
    pub metrics: Metrics,
    /// This process's incarnation, as registered with the scheduler.
    pub incarnation: u64,
    /// Wakes the scheduler link for a heartbeat now (`POST /_warren/v1/heartbeat`).
    pub check_in: Arc<tokio::sync::Notify>,
    /// Every sandbox's metrics samples (`GET /_warren/v1/sandboxes/{id}/metrics`).
    pub samples: Arc<crate::samples::Samples>,
}

/// The stale-route answer: 404, `X-Warren-Route: not-found`, JSON.
pub fn not_found_marker(message: impl std::fmt::Display) -> Response<Body> {
    let mut r = error(StatusCode::NOT_FOUND, message);
    r.headers_mut().insert(
        warren_core::headers::ROUTE,
        HeaderValue::from_static(warren_core::headers::ROUTE_NOT_FOUND),
    );
    r
}

/// Answers one request: the data plane ([`crate::proxy`]) or the control
/// API ([`crate::control`]).
pub async fn route(shared: Arc<Shared>, req: Request<Incoming>) -> Response<Body> {
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

/// Serves `listener` under `limits` until `shutdown` resolves, then lets
/// in-flight connections finish for up to `limits.drain` before returning.
pub async fn serve(
    listener: warren_trust::Listener,
    shared: Arc<Shared>,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) {
    let handler = move |_peer, req| route(shared.clone(), req);
    warren_core::server::serve(listener, handler, shutdown, limits, metrics).await;
}
