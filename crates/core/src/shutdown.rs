//! Shutdown signals.
//!
//! Components take `shutdown: impl Future` in their `run` functions (as
//! mini-redis does), so the binary passes [`signal`] and tests pass whatever
//! they like.

/// Resolves on SIGTERM or SIGINT (Ctrl-C).
pub async fn signal() {
    #[cfg(unix)]
    {
        use tokio::signal::unix::{signal, SignalKind};
        let term = signal(SignalKind::terminate());
        let int = signal(SignalKind::interrupt());
        match (term, int) {
            (Ok(mut term), Ok(mut int)) => {
                tokio::select! {
                    _ = term.recv() => tracing::info!("SIGTERM received, shutting down"),
                    _ = int.recv() => tracing::info!("SIGINT received, shutting down"),
                }
            }
            _ => {
                let _ = tokio::signal::ctrl_c().await;
            }
        }
    }
    #[cfg(not(unix))]
    {
        let _ = tokio::signal::ctrl_c().await;
    }
}

/// The first step of a graceful stop, shared by every part: once `signal`
/// resolves, readiness (`/readyz`) turns false at once, and this future
/// resolves `delay` later. The caller stops accepting new work only then, so
/// load balancers that health-check `/readyz` have moved traffic away before
/// the listener closes. Drain follows.
pub async fn readiness_first(
    signal: impl std::future::Future<Output = ()>,
    admin: &crate::admin::Admin,
    delay: std::time::Duration,
) {
    signal.await;
    admin.set_ready(false);
    if !delay.is_zero() {
        tracing::info!(
            ?delay,
            "shutting down: not ready; still serving until the delay passes"
        );
        tokio::time::sleep(delay).await;
    }
    tracing::info!("shutting down: no new connections; draining");
}
