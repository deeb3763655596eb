//! A whole warren cluster of real processes for integration tests: one
//! scheduler, N nodes, M gateways, all on `127.0.0.1:0`, in one temp dir.
//! Dropping it kills them and every sandbox process they left behind.

use crate::{free_port, temp_dir, Proc};
use std::path::{Path, PathBuf};
use warren_trust::{Identity, Role, TlsArgs};

/// What to start.
#[derive(Clone, Debug)]
pub struct Spec {
    /// How many nodes (`node-1`, `node-2`, ...).
    pub nodes: usize,
    /// How many gateways.
    pub gateways: usize,
    /// `--runtime` for every node.
    pub runtime: String,
    /// `(api key, team)` pairs every gateway accepts.
    pub keys: Vec<(String, String)>,
    /// Extra flags per part.
    pub scheduler_args: Vec<String>,
    pub node_args: Vec<String>,
    pub gateway_args: Vec<String>,
    /// More flags for gateway `i` only (after `gateway_args`); missing entries add none.
    pub per_gateway_args: Vec<Vec<String>>,
    /// List a dead scheduler replica first in every gateway's `--scheduler`,
    /// so each gateway must fail over to the live one.
    pub dead_scheduler_first: bool,
    /// Mutual TLS between the parts (certificates made in the cluster's
    /// dir, as `warren dev` does). Tests that call a node's or the
    /// scheduler's API directly set false (`--insecure-internal`).
    pub tls: bool,
    /// Each part's stderr appended to `<dir>/<name>.log` ([`Cluster::log`])
    /// instead of the test's own stderr.
    pub logs: bool,
    /// The template store nodes and gateways use (`--template-dir`). None:
    /// a private store in the cluster's directory with the machine's
    /// operator templates linked in ([`crate::templates::private_store_all`]),
    /// unless the part arguments name `--template-dir` or `--blob-store`
    /// themselves: what the cluster makes never lands in the machine's.
    pub template_dir: Option<PathBuf>,
}

impl Default for Spec {
    fn default() -> Self {
        Spec {
            nodes: 2,
            gateways: 1,
            runtime: "process".into(),
            keys: vec![("key-team-a".into(), "team-a".into())],
            scheduler_args: vec![],
            node_args: vec![],
            gateway_args: vec![],
            per_gateway_args: vec![],
            dead_scheduler_first: false,
            tls: true,
            logs: false,
            template_dir: None,
        }
    }
}

/// A running cluster; every process is killed when it is dropped.
pub struct Cluster {
    pub scheduler: Proc,
    /// `nodes[i]` is `node-{i+1}`; `None` after [`Cluster::kill_node`].
    pub nodes: Vec<Option<Proc>>,
    pub gateways: Vec<Proc>,
    pub spec: Spec,
    bin: PathBuf,
    dir: tempfile::TempDir,
}

/// The `--template-dir` the cluster's parts get (see [`Spec::template_dir`]),
/// or none when their arguments decide.
fn template_dir(spec: &Spec, dir: &Path) -> Option<PathBuf> {
    let named = |args: &[String]| {
        args.iter()
            .any(|a| a.starts_with("--template-dir") || a.starts_with("--blob-store"))
    };
    if named(&spec.node_args) || named(&spec.gateway_args) {
        return None;
    }
    Some(spec.template_dir.clone().unwrap_or_else(|| {
        let store = dir.join("templates");
        crate::templates::private_store_all(&store);
        store
    }))
}

impl Cluster {
    /// Starts the scheduler, then the nodes, then the gateways.
    pub async fn start(bin: &Path, spec: Spec) -> anyhow::Result<Cluster> {
        let dir = temp_dir();
        if spec.tls {
            let mut ids = vec![identity(Role::Scheduler, "scheduler")];
            ids.extend((1..=spec.nodes).map(|i| identity(Role::Node, &format!("node-{i}"))));
            ids.extend(
                (1..=spec.gateways).map(|i| identity(Role::Gateway, &format!("gateway-{i}"))),
            );
            warren_trust::issue::local_cluster(&dir.path().join("certs"), &ids)?;
        }
        let scheduler = spawn_scheduler(bin, dir.path(), &spec, "127.0.0.1:0").await?;
        let mut spec = spec;
        if let Some(store) = template_dir(&spec, dir.path()) {
            let flag = ["--template-dir".to_string(), store.display().to_string()];
            spec.node_args.extend(flag.iter().cloned());
            spec.gateway_args.extend(flag.iter().cloned());
            spec.template_dir = Some(store);
        }
        let mut cluster = Cluster {
            scheduler,
            nodes: Vec::new(),
            gateways: Vec::new(),
            spec: spec.clone(),
            bin: bin.to_path_buf(),
            dir,
        };
        for i in 1..=spec.nodes {
            let node = cluster.spawn_node(i).await?;
            cluster.nodes.push(Some(node));
        }
        // A node is ready once it has registered with the scheduler: only
        // then can anything be placed on it.
        for node in cluster.nodes.iter().flatten() {
            let admin = node.addr("node admin");
            crate::wait_until(
                "the node to register with the scheduler",
                std::time::Duration::from_secs(30),
                || {
                    let admin = admin.clone();
                    async move {
                        let a = crate::http::Http::default()
                            .send(http::Method::GET, &admin, "/readyz", &[], None)
                            .await
                            .ok()?;
                        a.status.is_success().then_some(())
                    }
                },
            )
            .await;
        }
        let schedulers = if spec.dead_scheduler_first {
            format!(
                "http://127.0.0.1:{},{}",
                free_port(),
                cluster.scheduler_url()
            )
        } else {
            cluster.scheduler_url()
        };
        for g in 0..spec.gateways {
            let mut args: Vec<String> = [
                "gateway",
                "--listen",
                "127.0.0.1:0",
                "--admin-listen",
                "127.0.0.1:0",
                "--scheduler",
                &schedulers,
            ]
            .iter()
            .map(|s| s.to_string())
            .collect();
            // Keys in a file only this account reads, never on a command
            // line (docs/security.md, "API keys").
            args.push("--api-keys-file".into());
            args.push(cluster.api_keys_file()?.display().to_string());
            args.extend(tls_args(
                dir_of(&cluster),
                &spec,
                Role::Gateway,
                &format!("gateway-{}", g + 1),
            ));
            args.extend(spec.gateway_args.iter().cloned());
            args.extend(spec.per_gateway_args.get(g).into_iter().flatten().cloned());
            let name = format!("gateway-{}", g + 1);
            let log = spec
                .logs
                .then(|| dir_of(&cluster).join(format!("{name}.log")));
            let gw = launch(bin, &args, &["gateway http", "gateway admin"], log).await?;
            cluster.gateways.push(gw);
        }
        Ok(cluster)
    }

    /// Starts `node-{i}` (1-based) on its own data dir; used again to restart it.
    async fn spawn_node(&self, i: usize) -> anyhow::Result<Proc> {
        let id = format!("node-{i}");
        let data = self.dir.path().join(&id).display().to_string();
        let mut args: Vec<String> = [
            "node",
            "--node-id",
            &id,
            "--listen",
            "127.0.0.1:0",
            "--admin-listen",
            "127.0.0.1:0",
            "--scheduler",
            &self.scheduler_url(),
            "--data-dir",
            &data,
            "--runtime",
            &self.spec.runtime,
        ]
        .iter()
        .map(|s| s.to_string())
        .collect();
        args.extend(tls_args(self.dir.path(), &self.spec, Role::Node, &id));
        args.extend(self.spec.node_args.iter().cloned());
        let log = self.spec.logs.then(|| self.log(&id));
        launch(&self.bin, &args, &["node http", "node admin"], log).await
    }

    /// The template store the nodes and gateways use, when the cluster gave
    /// them one (see [`Spec::template_dir`]).
    pub fn template_dir(&self) -> Option<&Path> {
        self.spec.template_dir.as_deref()
    }

    /// Where part `name` (`scheduler`, `node-1`, `gateway-1`, ...) logs
    /// when [`Spec::logs`] is set.
    pub fn log(&self, name: &str) -> PathBuf {
        self.dir.path().join(format!("{name}.log"))
    }

    /// Starts the scheduler again on `listen` (e.g. the address it had before
    /// it was killed) with the same data dir and flags, replacing [`Cluster::scheduler`].
    pub async fn restart_scheduler(&mut self, listen: &str) -> anyhow::Result<()> {
        self.scheduler = spawn_scheduler(&self.bin, self.dir.path(), &self.spec, listen).await?;
        Ok(())
    }

    /// SIGKILLs `node-{i}` and reaps it.
    pub async fn kill_node(&mut self, i: usize) {
        if let Some(mut node) = self.nodes[i - 1].take() {
            node.kill9().await;
        }
    }

    /// Restarts `node-{i}` (same id and data dir).
    pub async fn restart_node(&mut self, i: usize) -> anyhow::Result<()> {
        let node = self.spawn_node(i).await?;
        self.nodes[i - 1] = Some(node);
        Ok(())
    }

    /// `http://host:port` of the scheduler's gRPC listener.
    pub fn scheduler_url(&self) -> String {
        format!("http://{}", self.scheduler.addr("scheduler grpc"))
    }

    /// `host:port` of gateway `i` (0-based).
    pub fn gateway(&self, i: usize) -> String {
        self.gateways[i].addr("gateway http")
    }

    /// `host:port` of `node-{i}`'s data plane / control API.
    pub fn node(&self, i: usize) -> String {
        match &self.nodes[i - 1] {
            Some(n) => n.addr("node http"),
            None => panic!("node-{i} is not running"),
        }
    }

    /// The cluster's temp dir.
    pub fn dir(&self) -> &Path {
        self.dir.path()
    }

    /// `<dir>/gateway-api-keys` (mode 0600) with the spec's keys, one
    /// `KEY TEAM` a line: what every gateway reads its keys from.
    fn api_keys_file(&self) -> anyhow::Result<PathBuf> {
        let path = self.dir.path().join("gateway-api-keys");
        let text: String = self
            .spec
            .keys
            .iter()
            .map(|(key, team)| format!("{key} {team}\n"))
            .collect();
        warren_core::private::write(&path, text.as_bytes())?;
        Ok(path)
    }
}

impl Drop for Cluster {
    /// `process`-runtime sandboxes outlive their node by design (a restarted
    /// node adopts them), so the cluster reaps what it started: every process
    /// whose command line names its temp dir, and everything in its session.
    fn drop(&mut self) {
        let dir = self.dir.path().display().to_string();
        let procs: Vec<(i32, String, i32)> = std::fs::read_dir("/proc")
            .into_iter()
            .flatten()
            .flatten()
            .filter_map(|e| {
                let pid: i32 = e.file_name().to_str()?.parse().ok()?;
                let cmdline = std::fs::read(e.path().join("cmdline")).ok()?;
                let stat = std::fs::read_to_string(e.path().join("stat")).ok()?;
                // The session id is the 4th field after the `(comm)` one.
                let sid = stat
                    .rsplit_once(')')?
                    .1
                    .split_whitespace()
                    .nth(3)?
                    .parse()
                    .ok()?;
                Some((pid, String::from_utf8_lossy(&cmdline).into_owned(), sid))
            })
            .collect();
        let ours: Vec<i32> = procs
            .iter()
            .filter(|(_, cmd, _)| cmd.contains(&dir))
            .map(|(pid, _, _)| *pid)
            .collect();
        let doomed: Vec<String> = procs
            .iter()
            .filter(|(pid, _, sid)| ours.contains(pid) || ours.contains(sid))
            .map(|(pid, _, _)| pid.to_string())
            .collect();
        if !doomed.is_empty() {
            let _ = std::process::Command::new("kill")
                .arg("-9")
                .args(&doomed)
                .status();
        }
    }
}

/// The scheduler on `listen`, its store in `<dir>/scheduler`.
async fn spawn_scheduler(
    bin: &Path,
    dir: &Path,
    spec: &Spec,
    listen: &str,
) -> anyhow::Result<Proc> {
    let sched_dir = dir.join("scheduler").display().to_string();
    let mut args: Vec<String> = [
        "scheduler",
        "--listen",
        listen,
        "--admin-listen",
        "127.0.0.1:0",
        "--data-dir",
        &sched_dir,
    ]
    .iter()
    .map(|s| s.to_string())
    .collect();
    args.extend(tls_args(dir, spec, Role::Scheduler, "scheduler"));
    args.extend(spec.scheduler_args.iter().cloned());
    let log = spec.logs.then(|| dir.join("scheduler.log"));
    launch(bin, &args, &["scheduler grpc", "scheduler admin"], log).await
}

/// `bin args`, announcing `wait_for`, its stderr appended to `log` or
/// the test's own.
async fn launch(
    bin: &Path,
    args: &[String],
    wait_for: &[&str],
    log: Option<PathBuf>,
) -> anyhow::Result<Proc> {
    let mut launch = crate::Launch::new(bin, args).wait_for(wait_for);
    if let Some(log) = log {
        launch = launch.log_to(&log);
    }
    launch.spawn().await
}

fn dir_of(cluster: &Cluster) -> &Path {
    cluster.dir.path()
}

fn identity(role: Role, name: &str) -> Identity {
    Identity::new(role, name).unwrap_or_else(|e| panic!("{role} {name}: {e}"))
}

/// The TLS flags of part `name`: its certificate in `<dir>/certs`, or
/// `--insecure-internal`.
fn tls_args(dir: &Path, spec: &Spec, role: Role, name: &str) -> Vec<String> {
    if spec.tls {
        TlsArgs::from_dir(&dir.join("certs"), &identity(role, name)).to_args()
    } else {
        vec!["--insecure-internal".into()]
    }
}
