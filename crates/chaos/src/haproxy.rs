//! Stock HAProxy in front of the gateways, started from the repository's
//! configs (`deploy/haproxy/warren-l4.cfg`, `warren-l7.cfg`) exactly as a
//! user runs them: the addresses go in through their environment variables.

use anyhow::Context;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::Duration;
use tokio::process::{Child, Command};

/// The L4 (TCP) config, as shipped.
pub const L4_CONFIG: &str = include_str!("../../../deploy/haproxy/warren-l4.cfg");
/// The L7 (HTTP) config, as shipped.
pub const L7_CONFIG: &str = include_str!("../../../deploy/haproxy/warren-l7.cfg");

/// Which balancer mode.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Mode {
    L4,
    L7,
}

impl Mode {
    /// `l4` / `l7`: the entry-point name in reports.
    pub fn name(self) -> &'static str {
        match self {
            Mode::L4 => "l4",
            Mode::L7 => "l7",
        }
    }
}

/// A running HAProxy.
pub struct Balancer {
    pub mode: Mode,
    /// `127.0.0.1:port` clients connect to.
    pub addr: String,
    child: Child,
}

/// A gateway as HAProxy sees it: its HTTP `host:port` and its admin port.
pub struct Backend {
    pub http: String,
    pub admin_port: u16,
}

impl Balancer {
    /// Writes the config into `dir` and starts `haproxy -db -f` on it with
    /// `WARREN_LB_LISTEN`, `WARREN_GW{1,2}` and `WARREN_GW{1,2}_ADMIN_PORT`.
    pub async fn start(mode: Mode, backends: &[Backend], dir: &Path) -> anyhow::Result<Balancer> {
        anyhow::ensure!(backends.len() == 2, "the shipped configs name two gateways");
        let exe = haproxy()?;
        let cfg = dir.join(format!("warren-{}.cfg", mode.name()));
        std::fs::write(
            &cfg,
            match mode {
                Mode::L4 => L4_CONFIG,
                Mode::L7 => L7_CONFIG,
            },
        )?;
        let port = warren_harness::free_port()?;
        let addr = format!("127.0.0.1:{port}");
        std::fs::create_dir_all(dir.join("logs"))?;
        let log = std::fs::File::create(
            dir.join("logs")
                .join(format!("haproxy-{}.log", mode.name())),
        )?;
        let mut cmd = Command::new(&exe);
        cmd.arg("-db")
            .arg("-f")
            .arg(&cfg)
            .env("WARREN_LB_LISTEN", &addr)
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::from(log))
            .kill_on_drop(true);
        for (i, b) in backends.iter().enumerate() {
            cmd.env(format!("WARREN_GW{}", i + 1), &b.http);
            cmd.env(
                format!("WARREN_GW{}_ADMIN_PORT", i + 1),
                b.admin_port.to_string(),
            );
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {}", exe.display()))?;
        let deadline = tokio::time::Instant::now() + Duration::from_secs(10);
        loop {
            if tokio::net::TcpStream::connect(&addr).await.is_ok() {
                break;
            }
            if let Ok(Some(status)) = child.try_wait() {
                anyhow::bail!(
                    "haproxy ({}) exited ({status}); see logs/haproxy-{}.log",
                    mode.name(),
                    mode.name()
                );
            }
            anyhow::ensure!(
                tokio::time::Instant::now() < deadline,
                "haproxy ({}) did not listen on {addr} within 10s",
                mode.name()
            );
            tokio::time::sleep(Duration::from_millis(50)).await;
        }
        Ok(Balancer { mode, addr, child })
    }

    /// Stops it (SIGTERM: HAProxy's hard stop).
    pub async fn stop(mut self) {
        if let Some(pid) = self.child.id() {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid as i32),
                nix::sys::signal::Signal::SIGTERM,
            );
        }
        if tokio::time::timeout(Duration::from_secs(5), self.child.wait())
            .await
            .is_err()
        {
            let _ = self.child.kill().await;
        }
    }
}

/// The `haproxy` binary: on `PATH`, or Debian's `/usr/sbin/haproxy`.
fn haproxy() -> anyhow::Result<PathBuf> {
    let candidates = std::env::var_os("PATH")
        .map(|p| std::env::split_paths(&p).collect::<Vec<_>>())
        .unwrap_or_default()
        .into_iter()
        .chain([PathBuf::from("/usr/sbin")])
        .map(|d| d.join("haproxy"));
    for c in candidates {
        if c.is_file() {
            return Ok(c);
        }
    }
    anyhow::bail!("haproxy is not installed (Debian: apt-get install haproxy)")
}
