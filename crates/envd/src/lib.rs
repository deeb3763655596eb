//! `warren envd`: the agent inside each sandbox, speaking E2B's envd API so
//! the unmodified e2b SDK can run commands and move files.
//!
//! It serves, on one Unix socket (or TCP address), HTTP/1.1 and h2c:
//! `GET /health`, `GET`/`POST /files`, and the Connect RPC services
//! `process.Process` and `filesystem.Filesystem` (`connect+proto`,
//! `connect+json`, unary proto/json). What warren adds to E2B's envd:
//! durable output (`ConnectRequest.offset` replays a process's retained
//! output byte-exactly), finished processes that stay reattachable, paths
//! confined to `--root`, and a port relay socket. The contract with the node
//! is docs/internals.md, "envd".
//!
//! # Layout
//! - [`config`]: flags/env ([`Config`]) and their validated form ([`Settings`]).
//! - [`server`]: the HTTP listener, access-token check and routing.
//! - [`files`]: `/files` download and upload (multipart, octet-stream, gzip).
//! - [`process`]: `process.Process` — [`process::manager`] (the process
//!   table), [`process::output`] (the output log), [`process::stream`]
//!   (one client's event stream).
//! - [`filesystem`]: `filesystem.Filesystem`; [`entry`] builds `EntryInfo`.
//! - [`paths`]: client paths → host paths, never leaving the root.
//! - [`relay`]: the port relay socket.
//! - [`rpc_error`]: errors as Connect codes (E2B's HTTP JSON errors are
//!   `warren_core::body::error`).
// Dev-dependencies are for the integration tests under tests/; this crate's
// own unit-test build sees them too.
#![cfg_attr(test, allow(unused_crate_dependencies))]

pub mod config;
pub mod entry;
pub mod files;
pub mod filesystem;
pub mod paths;
pub mod process;
pub mod relay;
pub mod rpc_error;
pub mod server;

pub use config::{ApiAddr, Config, Settings};
pub use server::ApiListener;

use std::future::Future;
use std::path::Path;
use tokio::net::{TcpListener, UnixListener};
use warren_core::config::ConfigError;

/// The envd version the node reports to the SDK as `envdVersion` (what it
/// means: `warren_core::node_api::ENVD_VERSION`).
pub use warren_core::node_api::ENVD_VERSION;

/// Runs `warren envd` until SIGTERM/Ctrl-C.
pub async fn main(config: Config) -> anyhow::Result<()> {
    let settings = Settings::from_config(&config)?;
    let api = bind_api(&config.api_addr()?).await?;
    let relay = match &config.relay_socket {
        Some(path) => Some((bind_unix(path)?, path.clone())),
        None => None,
    };
    warren_core::announce("envd", "http", api.display_addr());
    if let Some((_, path)) = &relay {
        warren_core::announce("envd", "relay", format!("unix:{}", path.display()));
    }
    tracing::info!(
        root = %settings.root.display(),
        home = %settings.home,
        version = ENVD_VERSION,
        token = settings.access_token.is_some(),
        "envd ready"
    );
    let relay_path = relay.as_ref().map(|(_, p)| p.clone());
    run(
        settings,
        api,
        relay.map(|(l, _)| l),
        warren_core::shutdown::signal(),
    )
    .await?;
    if let Some(path) = relay_path {
        let _ = std::fs::remove_file(path);
    }
    Ok(())
}

/// Serves the envd API on `api` (and the relay on `relay`, if given) until
/// `shutdown` resolves — the entry point for in-process tests.
pub async fn run(
    settings: Settings,
    api: ApiListener,
    relay: Option<UnixListener>,
    shutdown: impl Future<Output = ()>,
) -> std::io::Result<()> {
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let relay_task = relay.map(|listener| {
        let mut stopped = stopped.clone();
        tokio::spawn(relay::serve(listener, async move {
            let _ = stopped.wait_for(|s| *s).await;
        }))
    });
    let served = server::serve(settings, api, shutdown).await;
    let _ = stop.send(true);
    if let Some(task) = relay_task {
        let _ = task.await;
    }
    served
}

/// Binds the API listener named by `addr`.
pub async fn bind_api(addr: &ApiAddr) -> anyhow::Result<ApiListener> {
    match addr {
        ApiAddr::Tcp(a) => {
            let l = TcpListener::bind(a.as_str())
                .await
                .map_err(|e| anyhow::anyhow!("cannot listen on {a}: {e}"))?;
            Ok(ApiListener::Tcp(l))
        }
        ApiAddr::Unix(path) => Ok(ApiListener::Unix(bind_unix(path)?, path.clone())),
    }
}

/// Binds a Unix socket at `path`, replacing a stale socket left by an
/// earlier run (but never a file that is not a socket).
pub fn bind_unix(path: &Path) -> anyhow::Result<UnixListener> {
    use std::os::unix::fs::FileTypeExt;
    if let Ok(meta) = std::fs::symlink_metadata(path) {
        if meta.file_type().is_socket() {
            let _ = std::fs::remove_file(path);
        } else {
            return Err(ConfigError::Invalid(format!(
                "{} exists and is not a socket",
                path.display()
            ))
            .into());
        }
    }
    UnixListener::bind(path)
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", path.display()))
}
