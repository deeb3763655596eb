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
//! - [`drain`]: reading what is left of a body after an early answer.
//! - [`files`]: `/files` download and upload (multipart, octet-stream, gzip).
//! - [`process`]: `process.Process` — [`process::manager`] (the process
//!   table), [`process::output`] (the output log), [`process::stream`]
//!   (one client's event stream).
//! - [`filesystem`]: `filesystem.Filesystem`; [`entry`] builds `EntryInfo`,
//!   [`metadata`] keeps `user.e2b.*` file metadata, [`watch`] watches
//!   directories.
//! - [`paths`]: client paths → host paths, never leaving the root.
//! - [`relay`]: the port relay socket.
//! - [`identity`]: the sandbox's hostname, given with its settings.
//! - [`start`]: the template's start command and its readiness
//!   (`GET /warren/start`).
//! - [`events`]: envd's own log (its start, processes started and ended),
//!   which the node reads for the sandbox's logs (`GET /warren/logs`).
//! - [`trust`]: the sandbox's egress CA installed in its trust store.
//! - [`rpc_error`]: errors as Connect codes (E2B's HTTP JSON errors are
//!   `warren_core::body::error`).
// Dev-dependencies are for the integration tests under tests/; this crate's
// own unit-test build sees them too.
#![cfg_attr(test, allow(unused_crate_dependencies))]

pub mod config;
pub mod drain;
pub mod entry;
pub mod events;
pub mod files;
pub mod filesystem;
pub mod identity;
pub mod metadata;
pub mod paths;
pub mod process;
pub mod relay;
pub mod rpc_error;
pub mod server;
pub mod start;
pub mod trust;
pub mod users;
pub mod watch;

pub use config::{ApiAddr, Config, Settings};
pub use server::ApiListener;

use std::future::Future;
use std::path::Path;
use tokio::net::{TcpListener, UnixListener};
use warren_core::config::ConfigError;

/// The envd version the node reports to the SDK as `envdVersion` (what it
/// means: `warren_core::node_api::ENVD_VERSION`).
pub use warren_core::node_api::ENVD_VERSION;

/// The listening sockets the node passed down (API, relay), taken once at
/// start, before any thread exists (the `LISTEN_FDS` variables are removed).
pub struct Inherited {
    api: std::os::unix::net::UnixListener,
    relay: std::os::unix::net::UnixListener,
}

/// Takes the inherited listeners when `LISTEN_FDS` names two; call it
/// before the async runtime starts. Each is marked close-on-exec, so no
/// process envd starts can accept on them.
pub fn take_inherited() -> Result<Option<Inherited>, String> {
    if std::env::var_os("LISTEN_FDS").is_none() {
        return Ok(None);
    }
    let mut fds = listenfd::ListenFd::from_env();
    let mut take = |i: usize| -> Result<std::os::unix::net::UnixListener, String> {
        let l = fds
            .take_unix_listener(i)
            .map_err(|e| format!("inherited socket {i}: {e}"))?
            .ok_or_else(|| format!("no inherited socket {i}"))?;
        use nix::fcntl::{fcntl, FcntlArg, FdFlag};
        fcntl(&l, FcntlArg::F_SETFD(FdFlag::FD_CLOEXEC))
            .map_err(|e| format!("inherited socket {i}: {e}"))?;
        l.set_nonblocking(true)
            .map_err(|e| format!("inherited socket {i}: {e}"))?;
        Ok(l)
    };
    let inherited = Inherited {
        api: take(0)?,
        relay: take(1)?,
    };
    close_other_descriptors(&[
        std::os::fd::AsRawFd::as_raw_fd(&inherited.api),
        std::os::fd::AsRawFd::as_raw_fd(&inherited.relay),
    ]);
    Ok(Some(inherited))
}

/// Closes every descriptor above stderr except `keep`: whatever else the
/// launch chain left open must not reach the processes envd starts.
fn close_other_descriptors(keep: &[i32]) {
    let fds: Vec<i32> = std::fs::read_dir("/proc/self/fd")
        .map(|d| {
            d.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
                .collect()
        })
        .unwrap_or_default();
    for fd in fds {
        if fd > 2 && !keep.contains(&fd) {
            // The read_dir handle itself is already closed here; a failure
            // means the descriptor was gone.
            let _ = nix::unistd::close(fd);
        }
    }
}

/// Reads the `--settings-on-stdin` document, then points stdin at
/// `/dev/null` (so no process envd starts inherits the pipe).
fn read_stdin_settings() -> anyhow::Result<config::StdinSettings> {
    use std::io::Read;
    let mut raw = Vec::new();
    std::io::stdin()
        .take(64 << 20)
        .read_to_end(&mut raw)
        .map_err(|e| anyhow::anyhow!("cannot read settings from stdin: {e}"))?;
    let doc: config::StdinSettings = serde_json::from_slice(&raw)
        .map_err(|e| ConfigError::Invalid(format!("settings on stdin: {e}")))?;
    let null = std::fs::File::open("/dev/null")?;
    nix::unistd::dup2_stdin(&null)?;
    Ok(doc)
}

/// Runs `warren envd` until SIGTERM/Ctrl-C.
pub async fn main(config: Config, inherited: Option<Inherited>) -> anyhow::Result<()> {
    let mut stdin = if config.settings_on_stdin {
        Some(tokio::task::block_in_place(read_stdin_settings)?)
    } else {
        None
    };
    let ca_bundle = stdin.as_mut().and_then(|s| s.ca_bundle.take());
    let hostname = stdin.as_mut().and_then(|s| s.hostname.take());
    let mut settings = Settings::from_config(&config, stdin)?;
    if let Some(name) = hostname {
        // Before anything runs: every process sees the sandbox's name.
        identity::apply(&settings.root, &name)
            .map_err(|e| anyhow::anyhow!("cannot name the sandbox: {e}"))?;
    }
    if let Some(pem) = ca_bundle {
        // Before anything runs: every process starts trusting it.
        match trust::install(&settings.root, &pem, &mut settings.env_vars) {
            Ok(()) => tracing::info!(file = trust::CA_FILE, "installed the sandbox's egress CA"),
            Err(e) => {
                tracing::warn!(error = %e, "cannot install the sandbox's egress CA; hosts its egress rules name will fail TLS verification")
            }
        }
    }
    let (api, relay) = if config.inherited_sockets {
        let Some(i) = inherited else {
            return Err(ConfigError::Invalid(
                "--inherited-sockets: no sockets were passed (LISTEN_FDS is not set)".into(),
            )
            .into());
        };
        let relay = UnixListener::from_std(i.relay)?;
        (
            ApiListener::Inherited(UnixListener::from_std(i.api)?),
            Some((relay, None)),
        )
    } else {
        let api = bind_api(&config.api_addr()?).await?;
        let relay = match &config.relay_socket {
            Some(path) => Some((bind_unix(path)?, Some(path.clone()))),
            None => None,
        };
        (api, relay)
    };
    warren_core::announce("envd", "http", api.display_addr());
    if let Some((_, Some(path))) = &relay {
        warren_core::announce("envd", "relay", format!("unix:{}", path.display()));
    }
    tracing::info!(
        root = %settings.root.display(),
        home = %settings.home,
        version = ENVD_VERSION,
        token = settings.access_token.is_some(),
        "envd ready"
    );
    let relay_path = relay.as_ref().and_then(|(_, p)| p.clone());
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
    let max_connections = settings.listener.max_connections;
    let relay_task = relay.map(|listener| {
        let mut stopped = stopped.clone();
        tokio::spawn(relay::serve(listener, max_connections, async move {
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
