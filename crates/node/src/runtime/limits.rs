//! Resource limits through cgroups: the unified hierarchy (v2) where it is
//! mounted with the needed controllers, the v1 controllers otherwise (a
//! "hybrid" machine: v1 `memory`, `pids`, `cpu`, `freezer` under
//! `/sys/fs/cgroup/<controller>`, cgroup2 only at `/sys/fs/cgroup/unified`).
//!
//! One cgroup per sandbox, `warren-<node-id>-<instance>/<sandbox>-<generation>`
//! (the instance names the node's data dir), in each hierarchy used:
//!
//! | limit | v2 | v1 |
//! |---|---|---|
//! | memory (whole sandbox, swap included) | `memory.max`, `memory.swap.max = 0` | `memory.limit_in_bytes`, `memory.memsw.limit_in_bytes` |
//! | processes and threads | `pids.max` | `pids.max` |
//! | CPU | `cpu.max` | `cpu.cfs_quota_us` / `cpu.cfs_period_us` |
//! | freeze (fork, kill) | `cgroup.freeze` | `freezer.state` |
//! | CPU time (metrics only) | `cpu.stat` | `cpuacct.usage` |
//!
//! The sandbox's first process (the launcher, see [`super::launch`]) writes
//! itself into every `cgroup.procs` before it starts anything, so nothing a
//! sandbox forks is ever outside its cgroups. Killing freezes the cgroup,
//! SIGKILLs every member, thaws, and repeats until it is empty (v2 has
//! `cgroup.kill` for this).
//!
//! rlimits are not limits here: `RLIMIT_DATA` is per process and
//! `RLIMIT_NPROC` per host uid. Without a usable cgroup hierarchy the `isolated`
//! runtime refuses to start (the `process` runtime, which isolates nothing,
//! runs without limits and says so).

use crate::config::Limits;
use serde::{Deserialize, Serialize};
use std::path::{Path, PathBuf};
use std::time::Duration;

pub(crate) const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// Which hierarchy a node uses; decided once at start.
#[derive(Debug, Clone)]
enum Hierarchy {
    /// `<root>/warren-<node>` in the unified hierarchy.
    V2 { base: PathBuf },
    /// `<root>/<controller>/warren-<node>` per v1 controller.
    V1 {
        memory: PathBuf,
        pids: PathBuf,
        cpu: Option<PathBuf>,
        /// CPU time accounting (sandbox metrics, [`super::usage`]); its own
        /// hierarchy or the one `cpu` shares.
        cpuacct: Option<PathBuf>,
        freezer: PathBuf,
    },
}

/// How this node limits sandboxes.
#[derive(Debug, Clone)]
pub struct LimitPlan {
    hierarchy: Option<Hierarchy>,
    /// Why no hierarchy is usable, when none is.
    why_none: Option<String>,
}

/// One sandbox's cgroups, stored in its handle (and `sandbox.json`).
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct Cgroup {
    /// Every directory made for the sandbox (one for v2, one per v1 controller).
    pub dirs: Vec<PathBuf>,
    /// The directory whose `cgroup.procs` lists every member.
    pub members: PathBuf,
    /// `cgroup.freeze` (v2) or `freezer.state` (v1).
    pub freeze_file: PathBuf,
    pub v2: bool,
}

impl LimitPlan {
    /// Probes the machine and logs what will be enforced. `instance` tells
    /// this node from another with the same id on the machine (its data
    /// dir's mark), so neither ever touches the other's cgroups.
    pub fn detect(node_id: &str, instance: &str) -> LimitPlan {
        let base_name = format!("warren-{node_id}-{instance}");
        sweep_dead_nodes();
        let v2 = v2_base(&base_name);
        let hierarchy = match v2 {
            Ok(base) => Ok(Hierarchy::V2 { base }),
            Err(why2) => v1_bases(&base_name).map_err(|why1| format!("v2: {why2}; v1: {why1}")),
        };
        match &hierarchy {
            Ok(h) => {
                tracing::info!(
                    hierarchy = if matches!(h, Hierarchy::V2 { .. }) {
                        "v2"
                    } else {
                        "v1"
                    },
                    "sandbox limits: cgroups"
                );
                let plan = LimitPlan {
                    hierarchy: Some(h.clone()),
                    why_none: None,
                };
                plan.remove_leftovers();
                plan
            }
            Err(why) => LimitPlan {
                hierarchy: None,
                why_none: Some(why.clone()),
            },
        }
    }

    /// A short name of the mechanism, for logs and `/nodes`.
    pub fn mechanism(&self) -> &'static str {
        match &self.hierarchy {
            Some(Hierarchy::V2 { .. }) => "cgroup2",
            Some(Hierarchy::V1 { .. }) => "cgroup1",
            None => "none",
        }
    }

    /// Why there are no limits (None when cgroups are in use).
    pub fn unavailable(&self) -> Option<&str> {
        self.why_none.as_deref()
    }

    /// Makes the sandbox's cgroups with its limits. `None` when this node
    /// has no cgroups (the `process` runtime only).
    pub fn create(&self, name: &str, limits: &Limits) -> std::io::Result<Option<Cgroup>> {
        let Some(h) = &self.hierarchy else {
            return Ok(None);
        };
        let cg = match h {
            Hierarchy::V2 { base } => {
                if !base.exists() {
                    // Swept by another node while this one had no sandbox.
                    let name = base
                        .file_name()
                        .and_then(|n| n.to_str())
                        .unwrap_or("warren");
                    v2_base(name).map_err(std::io::Error::other)?;
                }
                let dir = base.join(name);
                make_dir(&dir)?;
                let cg = Cgroup {
                    dirs: vec![dir.clone()],
                    members: dir.clone(),
                    freeze_file: dir.join("cgroup.freeze"),
                    v2: true,
                };
                let undo = |e: std::io::Error| {
                    cg.remove();
                    e
                };
                std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())
                    .map_err(undo)?;
                let _ = std::fs::write(dir.join("memory.swap.max"), "0");
                std::fs::write(dir.join("pids.max"), limits.pids.to_string()).map_err(undo)?;
                if limits.cpus > 0.0 {
                    let (quota, period) = cpu_quota(limits.cpus);
                    std::fs::write(dir.join("cpu.max"), format!("{quota} {period}"))
                        .map_err(undo)?;
                }
                cg
            }
            Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            } => {
                let mem = memory.join(name);
                let pid = pids.join(name);
                let frz = freezer.join(name);
                let mut dirs = vec![mem.clone(), pid.clone(), frz.clone()];
                if let Some(c) = cpu {
                    dirs.push(c.join(name));
                }
                // When cpu and cpuacct share a hierarchy this names the same
                // directory again: making, joining and removing it twice is harmless.
                if let Some(c) = cpuacct {
                    dirs.push(c.join(name));
                }
                let cg = Cgroup {
                    dirs: dirs.clone(),
                    members: pid.clone(),
                    freeze_file: frz.join("freezer.state"),
                    v2: false,
                };
                let made = (|| -> std::io::Result<()> {
                    for d in &dirs {
                        // The base too: another node may have swept it empty.
                        std::fs::create_dir_all(d)?;
                    }
                    let bytes = limits.memory_bytes.to_string();
                    std::fs::write(mem.join("memory.limit_in_bytes"), &bytes)?;
                    // Swap accounting may be off; then there is no memsw file.
                    let memsw = mem.join("memory.memsw.limit_in_bytes");
                    if memsw.exists() {
                        std::fs::write(memsw, &bytes)?;
                    }
                    std::fs::write(pid.join("pids.max"), limits.pids.to_string())?;
                    if let (Some(c), true) = (cpu, limits.cpus > 0.0) {
                        let (quota, period) = cpu_quota(limits.cpus);
                        let d = c.join(name);
                        std::fs::write(d.join("cpu.cfs_period_us"), period.to_string())?;
                        std::fs::write(d.join("cpu.cfs_quota_us"), quota.to_string())?;
                    }
                    Ok(())
                })();
                if let Err(e) = made {
                    cg.remove();
                    return Err(e);
                }
                cg
            }
        };
        Ok(Some(cg))
    }

    /// Removes this node's (emptied) cgroups at shutdown.
    pub fn remove_all(&self) {
        self.remove_leftovers();
        for base in self.bases() {
            let _ = std::fs::remove_dir(base);
        }
    }

    fn bases(&self) -> Vec<&PathBuf> {
        match &self.hierarchy {
            Some(Hierarchy::V2 { base }) => vec![base],
            Some(Hierarchy::V1 {
                memory,
                pids,
                cpu,
                cpuacct,
                freezer,
            }) => [
                Some(memory),
                Some(pids),
                cpu.as_ref(),
                cpuacct.as_ref(),
                Some(freezer),
            ]
            .into_iter()
            .flatten()
            .collect(),
            None => Vec::new(),
        }
    }

    /// Removes empty sandbox cgroups a previous node process left behind.
    fn remove_leftovers(&self) {
        for base in self.bases() {
            if let Ok(dir) = std::fs::read_dir(base) {
                for e in dir.flatten() {
                    if e.file_type().is_ok_and(|t| t.is_dir()) {
                        let _ = std::fs::remove_dir(e.path());
                    }
                }
            }
        }
    }
}

/// Removes the empty `warren-*` cgroups of nodes that died without
/// cleaning up (SIGKILL): sandbox cgroups with no process that are over a
/// minute old (a live node's fresh one may not have its first process
/// yet), then bases left empty — a live node makes its base again at its
/// next create.
fn sweep_dead_nodes() {
    let old = |p: &Path| {
        std::fs::metadata(p)
            .and_then(|m| m.modified())
            .is_ok_and(|t| t.elapsed().is_ok_and(|age| age > Duration::from_secs(60)))
    };
    let root = Path::new(CGROUP_ROOT);
    let mut tops = vec![root.to_path_buf()];
    tops.extend(["memory", "pids", "cpu", "cpuacct", "freezer"].map(|c| root.join(c)));
    for top in tops {
        let Ok(dir) = std::fs::read_dir(&top) else {
            continue;
        };
        for e in dir.flatten() {
            let is_ours = e
                .file_name()
                .to_str()
                .is_some_and(|n| n.starts_with("warren-"));
            if !(is_ours && e.file_type().is_ok_and(|t| t.is_dir())) {
                continue;
            }
            if let Ok(children) = std::fs::read_dir(e.path()) {
                for c in children.flatten() {
                    if c.file_type().is_ok_and(|t| t.is_dir()) && old(&c.path()) {
                        // Fails (EBUSY) for a cgroup that has processes.
                        let _ = std::fs::remove_dir(c.path());
                    }
                }
            }
            let _ = std::fs::remove_dir(e.path());
        }
    }
}

fn cpu_quota(cpus: f64) -> (u64, u64) {
    const PERIOD: u64 = 100_000;
    (((cpus * PERIOD as f64) as u64).max(1000), PERIOD)
}

fn make_dir(dir: &Path) -> std::io::Result<()> {
    match std::fs::create_dir(dir) {
        Err(e) if e.kind() == std::io::ErrorKind::AlreadyExists => Ok(()),
        r => r,
    }
}

fn v2_base(name: &str) -> Result<PathBuf, String> {
    let root = Path::new(CGROUP_ROOT);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
        .map_err(|_| format!("{CGROUP_ROOT} is not a cgroup v2 hierarchy"))?;
    let has = |c: &str| controllers.split_whitespace().any(|x| x == c);
    for needed in ["memory", "pids"] {
        if !has(needed) {
            return Err(format!("the {needed} controller is not available"));
        }
    }
    let base = root.join(name);
    make_dir(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
    let wanted: Vec<String> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| has(c))
        .map(|c| format!("+{c}"))
        .collect();
    std::fs::write(base.join("cgroup.subtree_control"), wanted.join(" "))
        .map_err(|e| format!("cannot enable controllers under {}: {e}", base.display()))?;
    Ok(base)
}

fn v1_bases(name: &str) -> Result<Hierarchy, String> {
    let root = Path::new(CGROUP_ROOT);
    let controller = |c: &str, probe: &str| -> Result<PathBuf, String> {
        let dir = root.join(c);
        if !dir.join(probe).exists() {
            return Err(format!("no v1 {c} controller at {}", dir.display()));
        }
        let base = dir.join(name);
        make_dir(&base).map_err(|e| format!("cannot create {}: {e}", base.display()))?;
        Ok(base)
    };
    Ok(Hierarchy::V1 {
        memory: controller("memory", "memory.limit_in_bytes")?,
        pids: controller("pids", "cgroup.procs")?,
        cpu: controller("cpu", "cpu.cfs_quota_us").ok(),
        cpuacct: controller("cpuacct", "cpuacct.usage").ok(),
        freezer: controller("freezer", "cgroup.procs")?,
    })
}

impl Cgroup {
    /// The `cgroup.procs` files a process writes itself into to join.
    pub fn procs_files(&self) -> Vec<PathBuf> {
        self.dirs.iter().map(|d| d.join("cgroup.procs")).collect()
    }

    /// Every process in the sandbox.
    pub fn members(&self) -> Vec<i32> {
        std::fs::read_to_string(self.members.join("cgroup.procs"))
            .map(|s| {
                s.split_whitespace()
                    .filter_map(|p| p.parse().ok())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Freezes every process (waits until the kernel says frozen, ≤ 5 s).
    pub fn freeze(&self) -> std::io::Result<()> {
        let (set, done) = if self.v2 {
            ("1", "frozen 1")
        } else {
            ("FROZEN", "FROZEN")
        };
        std::fs::write(&self.freeze_file, set)?;
        let deadline = std::time::Instant::now() + Duration::from_secs(5);
        loop {
            let state = if self.v2 {
                std::fs::read_to_string(self.members.join("cgroup.events")).unwrap_or_default()
            } else {
                std::fs::read_to_string(&self.freeze_file).unwrap_or_default()
            };
            if state.lines().any(|l| l.trim() == done) {
                return Ok(());
            }
            if std::time::Instant::now() > deadline {
                let _ = self.thaw();
                return Err(std::io::Error::other(
                    "the sandbox did not freeze within 5s",
                ));
            }
            std::thread::sleep(Duration::from_millis(2));
        }
    }

    pub fn thaw(&self) -> std::io::Result<()> {
        std::fs::write(&self.freeze_file, if self.v2 { "0" } else { "THAWED" })
    }

    /// Kills every member; true when the cgroup is empty afterwards. Blocking.
    pub fn kill(&self) -> bool {
        if self.v2 && std::fs::write(self.members.join("cgroup.kill"), "1").is_ok() {
            return self.wait_empty();
        }
        for _ in 0..50 {
            let frozen = self.freeze().is_ok();
            let pids = self.members();
            for &pid in &pids {
                let _ = nix::sys::signal::kill(
                    nix::unistd::Pid::from_raw(pid),
                    nix::sys::signal::Signal::SIGKILL,
                );
            }
            if frozen {
                let _ = self.thaw();
            }
            if pids.is_empty() || self.wait_empty() {
                return true;
            }
        }
        false
    }

    fn wait_empty(&self) -> bool {
        for _ in 0..100 {
            if self.members().is_empty() {
                return true;
            }
            std::thread::sleep(Duration::from_millis(5));
        }
        false
    }

    /// Removes the (emptied) cgroups, waiting briefly for members to exit.
    pub fn remove(&self) {
        for dir in &self.dirs {
            let mut removed = false;
            for _ in 0..50 {
                match std::fs::remove_dir(dir) {
                    Ok(()) => removed = true,
                    Err(e) if e.kind() == std::io::ErrorKind::NotFound => removed = true,
                    Err(_) => std::thread::sleep(Duration::from_millis(10)),
                }
                if removed {
                    break;
                }
            }
            if !removed {
                tracing::warn!(cgroup = %dir.display(), "cannot remove the sandbox's cgroup");
            }
        }
    }
}

/// The first executable `name` on `PATH` (or in the usual system dirs).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
