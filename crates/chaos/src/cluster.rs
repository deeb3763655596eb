//! The cluster under test: two scheduler replicas on one PostgreSQL database,
//! two nodes, two gateways, every one a child process of the `warren` binary
//! on fixed loopback ports (chosen free at start), so a replica restarted
//! after its fault comes back at the same address the others and HAProxy
//! know.

use std::path::Path;
use std::time::Duration;
use warren_harness::{free_port, Exit, Launch, Proc};
use warren_trust::{Identity, Role, TlsArgs};

/// One replica: how to start it, and the running process if any.
pub struct Part {
    /// `scheduler-1`, `node-2`, `gateway-1`, ...
    pub name: String,
    /// How it is started (the same arguments and ports on every restart;
    /// stderr appended to its log).
    launch: Launch,
    /// The running process, if any.
    pub proc: Option<Proc>,
}

impl Part {
    /// Starts (or restarts) the process and waits for its announce lines.
    pub async fn start(&mut self) -> anyhow::Result<()> {
        self.proc = Some(self.launch.spawn().await?);
        Ok(())
    }

    /// Sends `signal` (no wait).
    pub fn signal(&self, signal: nix::sys::signal::Signal) {
        if let Some(p) = &self.proc {
            p.signal(signal);
        }
    }

    /// Waits up to `within` for the process to exit; SIGKILLs it after that.
    /// Returns how long it took and whether it exited on its own.
    pub async fn wait_exit(&mut self, within: Duration) -> (Duration, bool) {
        let Some(mut p) = self.proc.take() else {
            return (Duration::ZERO, true);
        };
        let Exit {
            took, on_its_own, ..
        } = p.wait_exit(within).await;
        (took, on_its_own)
    }

    /// The address announced as `what`, while it runs.
    pub fn addr(&self, what: &str) -> anyhow::Result<String> {
        self.proc
            .as_ref()
            .and_then(|p| p.addrs.get(what).cloned())
            .ok_or_else(|| anyhow::anyhow!("{} announced no {what:?}", self.name))
    }
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
        // Both replicas seal tokens and envVars with one key.
        let store_key = dir.join("store.key");
        warren_harness::write_store_key(&store_key)?;
        let delay = |part: &str| -> Vec<String> {
            match &spec.shutdown_delay {
                Some(d) if supports(exe, part, "--shutdown-delay") => {
                    vec!["--shutdown-delay".into(), d.clone()]
                }
                _ => vec![],
            }
        };
        // Mutual TLS between the parts, as in production (a binary from
        // before internal TLS runs without it).
        let certs = dir.join("certs");
        let secure = supports(exe, "scheduler", "--tls-ca");
        if secure {
            let ids: Vec<Identity> = (1..=2)
                .flat_map(|i| {
                    [
                        (Role::Scheduler, format!("scheduler-{i}")),
                        (Role::Node, format!("node-{i}")),
                        (Role::Gateway, format!("gateway-{i}")),
                    ]
                })
                .map(|(role, name)| Identity::new(role, &name).map_err(anyhow::Error::msg))
                .collect::<anyhow::Result<_>>()?;
            warren_trust::issue::local_cluster(&certs, &ids)?;
        }
        let tls = |role: Role, name: &str| -> Vec<String> {
            match Identity::new(role, name) {
                Ok(id) if secure => TlsArgs::from_dir(&certs, &id).to_args(),
                _ => vec![],
            }
        };
        let mut c = Cluster {
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
                "--store-key-file",
                &store_key.display().to_string(),
                "--lease",
                &spec.lease,
                "--sweep-interval",
                "250ms",
            ]);
            args.extend(delay("scheduler"));
            args.extend(tls(Role::Scheduler, &format!("scheduler-{i}")));
            // Started right away: a port from `free_port` is only free until
            // something else takes it, so the window stays one start long.
            let mut p = part(
                exe,
                &format!("scheduler-{i}"),
                args,
                &["scheduler grpc", "scheduler admin"],
                &logs,
            );
            p.start().await?;
            c.schedulers.push(p);
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
            args.extend(tls(Role::Node, &name));
            let mut p = part(exe, &name, args, &["node http", "node admin"], &logs);
            p.start().await?;
            c.nodes.push(p);
        }
        // The key in a file only this account reads, never on a command line.
        let keys = dir.join("gateway-api-keys");
        warren_core::private::write(&keys, format!("{} {TEAM}\n", spec.api_key).as_bytes())?;
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
                "--api-keys-file",
                &keys.display().to_string(),
                "--connect-timeout",
                "500ms",
            ]);
            args.extend(delay("gateway"));
            args.extend(tls(Role::Gateway, &format!("gateway-{i}")));
            let mut p = part(
                exe,
                &format!("gateway-{i}"),
                args,
                &["gateway http", "gateway admin"],
                &logs,
            );
            p.start().await?;
            c.gateways.push(p);
        }
        Ok(c)
    }

    /// Restarts a part that was stopped (same arguments and ports).
    pub async fn restart(&mut self, component: Component, index: usize) -> anyhow::Result<()> {
        self.part_mut(component, index).start().await
    }

    pub fn part_mut(&mut self, component: Component, index: usize) -> &mut Part {
        match component {
            Component::Scheduler => &mut self.schedulers[index],
            Component::Node => &mut self.nodes[index],
            Component::Gateway => &mut self.gateways[index],
        }
    }

    /// The runtime the nodes reported (`node runtime isolated|process`).
    pub fn node_runtime(&self) -> String {
        self.nodes
            .first()
            .and_then(|n| n.proc.as_ref())
            .map(Proc::lines)
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
            if let Ok(text) = warren_harness::http::get_text(&admin, "/metrics").await {
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

fn part(exe: &Path, name: &str, args: Vec<String>, wait_for: &[&str], logs: &Path) -> Part {
    Part {
        name: name.to_string(),
        launch: Launch::new(exe, &args)
            .label(name)
            .exit_with_parent()
            .wait_for(wait_for)
            .log_to(&logs.join(format!("{name}.log"))),
        proc: None,
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
