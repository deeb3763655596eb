//! The public listener: HTTP/1.1 and h2c on one port (hyper-util's auto
//! builder, with upgrades for WebSocket), each request sent to the control
//! or data plane, and graceful draining at shutdown.

use crate::metrics::Plane;
use crate::response::Body;
use crate::state::App;
use crate::{control, proxy, target};
use http::{Request, Response};
use hyper::body::Incoming;
use hyper_util::rt::{TokioExecutor, TokioIo, TokioTimer};
use hyper_util::server::conn::auto;
use hyper_util::server::graceful::GracefulShutdown;
use std::convert::Infallible;
use std::future::Future;
use std::net::SocketAddr;
use std::sync::Arc;
use std::time::Duration;
use tokio::net::TcpListener;

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

/// Accepts connections until `shutdown` resolves, then stops accepting and
/// lets in-flight requests finish for up to `drain`.
pub async fn serve(
    app: Arc<App>,
    listener: TcpListener,
    shutdown: impl Future<Output = ()>,
    drain: Duration,
) {
    let mut builder = auto::Builder::new(TokioExecutor::new());
    // A timer lets hyper bound how long a client may take to send headers.
    builder.http1().timer(TokioTimer::new());
    builder.http2().timer(TokioTimer::new());
    let graceful = GracefulShutdown::new();
    tokio::pin!(shutdown);
    loop {
        let (stream, peer) = tokio::select! {
            _ = &mut shutdown => break,
            accepted = listener.accept() => match accepted {
                Ok(s) => s,
                Err(e) => {
                    // Usually EMFILE: back off instead of spinning.
                    tracing::warn!(error = %e, "accept failed");
                    tokio::time::sleep(Duration::from_millis(50)).await;
                    continue;
                }
            },
        };
        let _ = stream.set_nodelay(true);
        let app = app.clone();
        let svc = hyper::service::service_fn(move |req| {
            let app = app.clone();
            async move { Ok::<_, Infallible>(handle(app, peer, req).await) }
        });
        let conn = builder.serve_connection_with_upgrades(TokioIo::new(stream), svc);
        let conn = graceful.watch(conn.into_owned());
        tokio::spawn(async move {
            if let Err(e) = conn.await {
                tracing::debug!(%peer, error = %e, "connection ended with an error");
            }
        });
    }
    drop(listener);
    let open = graceful.count();
    tracing::info!(
        connections = open,
        ?drain,
        "stopped accepting; draining in-flight requests"
    );
    tokio::select! {
        _ = graceful.shutdown() => tracing::info!("drained"),
        _ = tokio::time::sleep(drain) => {
            tracing::warn!(?drain, "drain timeout reached; closing the remaining connections");
        }
    }
}
