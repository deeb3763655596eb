//! The public listener: HTTP/1.1 and h2c on one port (hyper-util's auto
//! builder, with upgrades for WebSocket), each request sent to the control
//! or data plane, and graceful draining at shutdown.

use crate::metrics::Plane;
use crate::state::App;
use crate::{control, proxy, target};
use http::{Request, Response};
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use tokio::net::TcpListener;
use warren_core::body::Body;
use warren_core::server::{Incoming, Limits, ListenerMetrics, Workers};

/// Answers one request on either plane and records its metrics.
async fn handle(app: Arc<App>, peer: SocketAddr, req: Request<Incoming>) -> Response<Body> {
    let start = tokio::time::Instant::now();
    let (plane, resp) = match target::classify(&req, &app.settings.domain) {
        None => (Plane::Control, control::handle(&app, req).await),
        Some(Err(e)) => (Plane::Data, e.into_response()),
        Some(Ok(t)) => (Plane::Data, proxy::handle(&app, t, peer, req).await),
    };
    app.metrics
        .observe(plane, resp.status().as_u16(), start.elapsed());
    resp
}

/// Accepts connections under `limits`, each served by one of `workers`,
/// until `shutdown` resolves, then
/// stops accepting and lets in-flight requests finish for up to
/// `limits.drain`.
pub async fn serve(
    app: Arc<App>,
    workers: &Workers,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    limits: Limits,
    metrics: ListenerMetrics,
) {
    let handler = move |peer, req| handle(app.clone(), peer, req);
    warren_core::server::serve_on(workers, listener, handler, shutdown, limits, metrics).await;
}
