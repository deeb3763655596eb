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
