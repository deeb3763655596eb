//! The cluster under test: two scheduler replicas on one PostgreSQL database,
//! two nodes, two gateways, every one a child process of the `warren` binary
//! on fixed loopback ports (chosen free at start), so a replica restarted
//! after its fault comes back at the same address the others and HAProxy
//! know.

use anyhow::Context;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// Set on children so they stop when this process dies, even by SIGKILL
/// (the binary's `EXIT_WITH_PARENT`; `warren dev` uses it the same way).
const EXIT_WITH_PARENT: &str = "WARREN_EXIT_WITH_PARENT";

/// How long a part may take to announce its listeners.
const START_TIMEOUT: Duration = Duration::from_secs(60);

/// One replica: how to start it, and the running process if any.
pub struct Part {
    /// `scheduler-1`, `node-2`, `gateway-1`, ...
    pub name: String,
    /// Arguments to the `warren` binary (the same on every restart).
    args: Vec<String>,
    /// Announce lines to wait for (`"gateway http"`, ...).
    wait_for: Vec<&'static str>,
    /// Where its stderr goes (appended across restarts).
    log: PathBuf,
    pub child: Option<Child>,
    /// `"<component> <name>"` → address, from its announce lines.
    pub addrs: HashMap<String, String>,
    /// Other lines it printed on stdout (e.g. `node runtime bwrap`).
    pub lines: Arc<Mutex<Vec<String>>>,
}

impl Part {
    /// Starts (or restarts) the process and waits for its announce lines.
    pub async fn start(&mut self, exe: &Path) -> anyhow::Result<()> {
        let log = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(&self.log)
            .with_context(|| format!("cannot open {}", self.log.display()))?;
        let mut child = Command::new(exe)
            .args(&self.args)
            .env(EXIT_WITH_PARENT, "1")
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::from(log))
            .kill_on_drop(true)
            .spawn()
            .with_context(|| format!("cannot start {}", self.name))?;
        let stdout = child
            .stdout
            .take()
            .with_context(|| format!("no stdout from {}", self.name))?;
        let mut lines = BufReader::new(stdout).lines();
        let mut addrs = HashMap::new();
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while !self.wait_for.iter().all(|w| addrs.contains_key(*w)) {
            let line = match tokio::time::timeout_at(deadline, lines.next_line()).await {
                Err(_) => anyhow::bail!("{} did not come up within {START_TIMEOUT:?}", self.name),
                Ok(Err(e)) => anyhow::bail!("reading {}'s output: {e}", self.name),
                Ok(Ok(None)) => {
                    let status = child.wait().await?;
                    anyhow::bail!(
                        "{} exited ({status}) while starting; see {}",
                        self.name,
                        self.log.display()
                    );
                }
                Ok(Ok(Some(line))) => line,
            };
            match warren_core::parse_announce(&line) {
                Some((what, addr)) => {
                    addrs.insert(what.to_string(), addr.to_string());
                }
                None => push(&self.lines, line),
            }
        }
        let sink = self.lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = lines.next_line().await {
                push(&sink, line);
            }
        });
        self.addrs = addrs;
        self.child = Some(child);
        Ok(())
    }

    /// Sends `signal` (no wait).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(pid) = self.child.as_ref().and_then(Child::id) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid as i32), signal);
        }
    }

    /// Waits up to `within` for the process to exit; SIGKILLs it after that.
    /// Returns how long it took and whether it exited on its own.
    pub async fn wait_exit(&mut self, within: Duration) -> (Duration, bool) {
        let started = tokio::time::Instant::now();
        let Some(child) = self.child.as_mut() else {
            return (Duration::ZERO, true);
        };
        let on_its_own = tokio::time::timeout(within, child.wait()).await.is_ok();
        if !on_its_own {
            let _ = child.kill().await;
        }
        self.child = None;
        (started.elapsed(), on_its_own)
    }

    /// The address announced as `what`.
    pub fn addr(&self, what: &str) -> anyhow::Result<String> {
        self.addrs
            .get(what)
            .cloned()
            .with_context(|| format!("{} announced no {what:?}", self.name))
    }
}

fn push(lines: &Arc<Mutex<Vec<String>>>, line: String) {
    if let Ok(mut v) = lines.lock() {
        if v.len() < 1000 {
            v.push(line);
        }
    }
}

/// A free loopback port (bound and released; the part binds it right after).
pub fn free_port() -> anyhow::Result<u16> {
    Ok(std::net::TcpListener::bind("127.0.0.1:0")?
        .local_addr()?
        .port())
}

/// Settings the cluster is started with.
#[derive(Debug, Clone)]
pub struct ClusterSpec {
    pub database_url: String,
    pub runtime: String,
    pub api_key: String,
    /// Node lease (how soon a dead node's sandboxes answer node-down).
    pub lease: String,
    /// Passed as `--shutdown-delay` to every part that has the flag.
    pub shutdown_delay: Option<String>,
}

/// The running parts, in start order.
pub struct Cluster {
    exe: PathBuf,
    pub schedulers: Vec<Part>,
    pub nodes: Vec<Part>,
    pub gateways: Vec<Part>,
}

/// The team every chaos API key belongs to.
pub const TEAM: &str = "chaos";

impl Cluster {
    /// Starts two schedulers, two nodes and two gateways under `dir`.
    pub async fn start(exe: &Path, dir: &Path, spec: &ClusterSpec) -> anyhow::Result<Cluster> {
        let logs = dir.join("logs");
        std::fs::create_dir_all(&logs)?;
        let delay = |part: &str| -> Vec<String> {
            match &spec.shutdown_delay {
                Some(d) if supports(exe, part, "--shutdown-delay") => {
                    vec!["--shutdown-delay".into(), d.clone()]
                }
                _ => vec![],
            }
        };
        let mut c = Cluster {
            exe: exe.to_path_buf(),
            schedulers: Vec::new(),
            nodes: Vec::new(),
            gateways: Vec::new(),
        };
        let mut sched_urls = Vec::new();
        for i in 1..=2 {
            let (port, admin) = (free_port()?, free_port()?);
            sched_urls.push(format!("http://127.0.0.1:{port}"));
            let mut args = strings(&[
                "scheduler",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--database-url",
                &spec.database_url,
                "--lease",
                &spec.lease,
                "--sweep-interval",
                "250ms",
            ]);
            args.extend(delay("scheduler"));
            c.schedulers.push(part(
                &format!("scheduler-{i}"),
                args,
                &["scheduler grpc", "scheduler admin"],
                &logs,
            ));
        }
        let schedulers = sched_urls.join(",");
        for i in 1..=2 {
            let name = format!("node-{i}");
            let (port, admin) = (free_port()?, free_port()?);
            let mut args = strings(&[
                "node",
                "--node-id",
                &name,
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--scheduler",
                &schedulers,
                "--data-dir",
                &dir.join(&name).display().to_string(),
                "--runtime",
                &spec.runtime,
            ]);
            args.extend(delay("node"));
            c.nodes
                .push(part(&name, args, &["node http", "node admin"], &logs));
        }
        for i in 1..=2 {
            let (port, admin) = (free_port()?, free_port()?);
            let mut args = strings(&[
                "gateway",
                "--listen",
                &format!("127.0.0.1:{port}"),
                "--admin-listen",
                &format!("127.0.0.1:{admin}"),
                "--scheduler",
                &schedulers,
                "--api-key",
                &format!("{}:{TEAM}", spec.api_key),
                "--connect-timeout",
                "500ms",
            ]);
            args.extend(delay("gateway"));
            c.gateways.push(part(
                &format!("gateway-{i}"),
                args,
                &["gateway http", "gateway admin"],
                &logs,
            ));
        }
        for p in c
            .schedulers
            .iter_mut()
            .chain(c.nodes.iter_mut())
            .chain(c.gateways.iter_mut())
        {
            p.start(exe).await?;
        }
        Ok(c)
    }

    /// Restarts a part that was stopped (same arguments and ports).
    pub async fn restart(&mut self, component: Component, index: usize) -> anyhow::Result<()> {
        let exe = self.exe.clone();
        self.part_mut(component, index).start(&exe).await
    }

    pub fn part_mut(&mut self, component: Component, index: usize) -> &mut Part {
        match component {
            Component::Scheduler => &mut self.schedulers[index],
            Component::Node => &mut self.nodes[index],
            Component::Gateway => &mut self.gateways[index],
        }
    }

    /// The runtime the nodes reported (`node runtime bwrap|process`).
    pub fn node_runtime(&self) -> String {
        self.nodes
            .first()
            .and_then(|n| n.lines.lock().ok().map(|l| l.clone()))
            .into_iter()
            .flatten()
            .find_map(|l| l.strip_prefix("node runtime ").map(str::to_string))
            .unwrap_or_else(|| "unknown".into())
    }

    /// Which scheduler replica holds the sweep lease (from its
    /// `warren_scheduler_leader` gauge), if any says so.
    pub async fn leader(&self) -> Option<usize> {
        for (i, s) in self.schedulers.iter().enumerate() {
            let Ok(admin) = s.addr("scheduler admin") else {
                continue;
            };
            if let Ok(text) = crate::http::get_text(&admin, "/metrics").await {
                let leads = text
                    .lines()
                    .filter(|l| l.starts_with("warren_scheduler_leader"))
                    .any(|l| l.trim_end().ends_with(" 1"));
                if leads {
                    return Some(i);
                }
            }
        }
        None
    }

    /// Stops everything: gateways, then nodes, then schedulers (SIGTERM,
    /// bounded wait, SIGKILL).
    pub async fn stop(&mut self) {
        for group in [&mut self.gateways, &mut self.nodes, &mut self.schedulers] {
            for p in group.iter() {
                p.signal(nix::sys::signal::Signal::SIGTERM);
            }
            for p in group.iter_mut() {
                p.wait_exit(Duration::from_secs(10)).await;
            }
        }
    }
}

/// A kind of replica the experiment can take down.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Component {
    Gateway,
    Scheduler,
    Node,
}

impl std::fmt::Display for Component {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Component::Gateway => "gateway",
            Component::Scheduler => "scheduler",
            Component::Node => "node",
        })
    }
}

fn part(name: &str, args: Vec<String>, wait_for: &[&'static str], logs: &Path) -> Part {
    Part {
        name: name.to_string(),
        args,
        wait_for: wait_for.to_vec(),
        log: logs.join(format!("{name}.log")),
        child: None,
        addrs: HashMap::new(),
        lines: Arc::new(Mutex::new(Vec::new())),
    }
}

fn strings(s: &[&str]) -> Vec<String> {
    s.iter().map(|s| s.to_string()).collect()
}

/// Whether `warren <part> --help` mentions `flag` (flags other engineers add
/// over time, such as `--shutdown-delay`, are used when present).
fn supports(exe: &Path, part: &str, flag: &str) -> bool {
    std::process::Command::new(exe)
        .args([part, "--help"])
        .output()
        .map(|o| String::from_utf8_lossy(&o.stdout).contains(flag))
        .unwrap_or(false)
}
