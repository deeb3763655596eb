//! Helpers for warren's integration tests, on top of `warren-harness` (the
//! process harness the binary shares).
//!
//! # Layout
//! - [`Proc`], [`Launch`], [`postgres`]: re-exported from `warren-harness`
//!   (real `warren` processes whose announced listeners are parsed, so every
//!   test can bind `127.0.0.1:0`; a private PostgreSQL server).
//! - [`free_port`]: a loopback port nothing listens on (dead replicas,
//!   closed ports).
//! - [`spawn`]: starts a process and waits for its announce lines.
//! - [`wait_until`]: polls a condition with a deadline instead of sleeping,
//!   failing the test when it never holds.
//! - [`e2b_python`]: the Python interpreter that has the pinned `e2b` SDK;
//!   [`e2b_js_dir`]: where the pinned JavaScript `e2b` SDK is installed.
//! - [`cluster::Cluster`]: scheduler + nodes + gateways as real processes.
//! - [`http::Http`]: a tiny JSON HTTP client with timeouts.
//! - [`sdk`]: one case of an SDK script (Python or JavaScript) against a gateway.
//! - [`templates::TestTemplate`]: a template a test builds, removed after it.
//! - [`cgroups::sandbox_limits`]: an isolated sandbox's limits as the
//!   host's cgroups hold them.
//! - [`host_listener::HostListener`]: a listener on every address of the
//!   host that counts what connects (a sandbox must never).
//! - [`cmdlines_holding`]: every process on the host whose command line
//!   holds some bytes (a secret that must never be there).

pub mod cgroups;
pub mod cluster;
pub mod dev;
pub mod host_listener;
pub mod http;
pub mod sdk;
pub mod templates;

pub use warren_harness::{postgres, Launch, Proc};

use std::path::{Path, PathBuf};
use std::time::Duration;

/// Starts `bin args...` with `envs`, and waits until it has announced every
/// listener in `wait_for` (e.g. `["scheduler grpc", "scheduler admin"]`).
/// Its stderr goes to the test's stderr, so failures show logs.
pub async fn spawn<S: AsRef<str>>(
    bin: &Path,
    args: &[S],
    envs: &[(&str, &str)],
    wait_for: &[&str],
) -> anyhow::Result<Proc> {
    let mut launch = Launch::new(bin, args).wait_for(wait_for);
    for (k, v) in envs {
        launch = launch.env(k, v);
    }
    launch.spawn().await
}

/// A fresh temporary directory, removed when dropped.
pub fn temp_dir() -> tempfile::TempDir {
    tempfile::Builder::new()
        .prefix("warren-test-")
        .tempdir()
        .unwrap_or_else(|e| panic!("cannot create a temp dir: {e}"))
}

/// A loopback port that was free a moment ago (nothing listens on it).
pub fn free_port() -> u16 {
    warren_harness::free_port().unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// Polls `check` every 20 ms until it returns `Some`, or fails the test
/// after `within`.
pub async fn wait_until<T, F, Fut>(what: &str, within: Duration, check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    match warren_harness::poll_until(within, check).await {
        Some(v) => v,
        None => panic!("timed out after {within:?} waiting for {what}"),
    }
}

/// The Python interpreter with the pinned `e2b` SDK: `$WARREN_E2B_PYTHON`, else
/// `<workspace>/.venv/bin/python` (what `scripts/setup-test-env` creates).
pub fn e2b_python() -> PathBuf {
    if let Some(p) = std::env::var_os("WARREN_E2B_PYTHON") {
        return PathBuf::from(p);
    }
    workspace_root().join(".venv/bin/python")
}

/// The directory with the pinned JavaScript `e2b` SDK in its `node_modules`
/// (what `scripts/setup-test-env` installs): `$WARREN_E2B_JS_DIR`, else
/// `<workspace>/tests/js`.
pub fn e2b_js_dir() -> PathBuf {
    if let Some(p) = std::env::var_os("WARREN_E2B_JS_DIR") {
        return PathBuf::from(p);
    }
    workspace_root().join("tests/js")
}

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

/// Every process on this host (`/proc/<pid>/cmdline`, which any account
/// can read) whose command line holds `needle`: `(pid, command line)`.
pub fn cmdlines_holding(needle: &[u8]) -> Vec<(u32, String)> {
    std::fs::read_dir("/proc")
        .into_iter()
        .flatten()
        .flatten()
        .filter_map(|e| {
            let pid: u32 = e.file_name().to_str()?.parse().ok()?;
            let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
            cmdline
                .windows(needle.len().max(1))
                .any(|w| w == needle)
                .then(|| (pid, String::from_utf8_lossy(&cmdline).replace('\0', " ")))
        })
        .collect()
}

/// The real uid of host process `pid` (0 when it is gone).
pub fn host_uid(pid: i32) -> u32 {
    std::fs::read_to_string(format!("/proc/{pid}/status"))
        .unwrap_or_default()
        .lines()
        .find_map(|l| l.strip_prefix("Uid:"))
        .and_then(|v| v.split_whitespace().next()?.parse().ok())
        .unwrap_or(0)
}
