//! Helpers for warren's integration tests.
//!
//! # Layout
//! - [`Proc`]: a real `warren` child process whose announced listeners
//!   (`"<component> <name> listening on <addr>"` lines on stdout) are parsed,
//!   so every test can bind `127.0.0.1:0`. Killed when dropped.
//! - [`wait_until`]: polls a condition with a deadline instead of sleeping.
//! - [`free_port`]: a loopback port nothing listens on (dead replicas, closed ports).
//! - [`e2b_python`]: the Python interpreter that has the pinned `e2b` SDK.
//! - [`cluster::Cluster`]: scheduler + nodes + gateways as real processes.
//! - [`http::Http`]: a tiny JSON HTTP client with timeouts.
//! - [`postgres::PgServer`]: a private PostgreSQL server on a free loopback port.

pub mod cluster;
pub mod http;
pub mod postgres;

use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a process may take to announce its listeners.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// A running `warren` process.
pub struct Proc {
    /// The child; `kill_on_drop` is set.
    pub child: Child,
    /// `"<component> <name>"` → address, from its announce lines.
    pub addrs: HashMap<String, String>,
    /// Everything it printed on stdout after the announce lines (shared with a reader task).
    pub stdout: Arc<Mutex<Vec<String>>>,
    /// A label used in failure messages.
    pub label: String,
}

impl Proc {
    /// Starts `bin args...` with `envs`, and waits until it has announced every
    /// listener in `wait_for` (e.g. `["scheduler grpc", "scheduler admin"]`).
    /// Its stderr goes to the test's stderr, prefixed by nothing, so failures show logs.
    pub async fn spawn(
        bin: &Path,
        args: &[&str],
        envs: &[(&str, &str)],
        wait_for: &[&str],
    ) -> anyhow::Result<Proc> {
        let label = format!("{} {}", bin.display(), args.join(" "));
        let mut cmd = Command::new(bin);
        cmd.args(args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::inherit())
            .kill_on_drop(true);
        for (k, v) in envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .map_err(|e| anyhow::anyhow!("cannot start {label}: {e}"))?;
        let stdout = child
            .stdout
            .take()
            .ok_or_else(|| anyhow::anyhow!("no stdout for {label}"))?;
        let mut lines = BufReader::new(stdout).lines();
        let mut addrs = HashMap::new();
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while !wait_for.iter().all(|w| addrs.contains_key(*w)) {
            let line = tokio::time::timeout_at(deadline, lines.next_line())
                .await
                .map_err(|_| {
                    anyhow::anyhow!("{label} did not announce {wait_for:?} in time; saw {addrs:?}")
                })??;
            let Some(line) = line else {
                let status = child.wait().await?;
                anyhow::bail!(
                    "{label} exited ({status}) before announcing {wait_for:?}; saw {addrs:?}"
                );
            };
            if let Some((what, addr)) = warren_core::parse_announce(&line) {
                addrs.insert(what.to_string(), addr.to_string());
            }
        }
        let collected = Arc::new(Mutex::new(Vec::new()));
        let sink = collected.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                if let Ok(mut v) = sink.lock() {
                    v.push(line);
                }
            }
        });
        Ok(Proc {
            child,
            addrs,
            stdout: collected,
            label,
        })
    }

    /// The address announced as `what` (e.g. `"gateway http"`).
    pub fn addr(&self, what: &str) -> String {
        match self.addrs.get(what) {
            Some(a) => a.clone(),
            None => panic!(
                "{} announced no {what:?}; it did announce {:?}",
                self.label, self.addrs
            ),
        }
    }

    /// The OS process id.
    pub fn pid(&self) -> i32 {
        self.child.id().map(|p| p as i32).unwrap_or(0)
    }

    /// Sends a signal (e.g. `libc::SIGKILL` = 9, `SIGTERM` = 15, `SIGSTOP` = 19).
    pub fn signal(&self, sig: i32) {
        let pid = self.pid();
        if pid > 0 {
            let _ = std::process::Command::new("kill")
                .arg(format!("-{sig}"))
                .arg(pid.to_string())
                .status();
        }
    }

    /// SIGKILL, then reaps the process.
    pub async fn kill9(&mut self) {
        self.signal(9);
        let _ = self.child.wait().await;
    }

    /// SIGTERM and waits up to `within` for the exit; returns the exit code.
    pub async fn terminate(&mut self, within: Duration) -> Option<i32> {
        self.signal(15);
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(Ok(status)) => status.code(),
            _ => None,
        }
    }
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
    std::net::TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .unwrap_or_else(|e| panic!("no free port: {e}"))
}

/// Polls `check` every 20 ms until it returns `Some`, or fails after `within`.
pub async fn wait_until<T, F, Fut>(what: &str, within: Duration, mut check: F) -> T
where
    F: FnMut() -> Fut,
    Fut: std::future::Future<Output = Option<T>>,
{
    let deadline = tokio::time::Instant::now() + within;
    loop {
        if let Some(v) = check().await {
            return v;
        }
        if tokio::time::Instant::now() >= deadline {
            panic!("timed out after {within:?} waiting for {what}");
        }
        tokio::time::sleep(Duration::from_millis(20)).await;
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

/// The workspace root (two levels above this crate).
pub fn workspace_root() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR"))
        .ancestors()
        .nth(2)
        .map(Path::to_path_buf)
        .unwrap_or_else(|| PathBuf::from("."))
}

#[cfg(test)]
mod tests {
    #[test]
    fn private_postgres_starts_and_takes_connections() {
        let pg = super::postgres::PgServer::start().expect("postgres starts");
        let url = pg.create_database("probe").expect("createdb");
        assert!(url.ends_with("/probe"));
        let out = std::process::Command::new("psql")
            .args([url.as_str(), "-tAc", "select 40 + 2"])
            .output()
            .expect("psql runs");
        assert_eq!(String::from_utf8_lossy(&out.stdout).trim(), "42");
    }
}
