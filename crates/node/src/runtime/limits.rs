//! Resource limits: cgroups v2 where the machine lets the node use them,
//! rlimits otherwise.
//!
//! **cgroups v2** (when `/sys/fs/cgroup` is a writable unified hierarchy with
//! the `memory` and `pids` controllers): one cgroup per sandbox under
//! `/sys/fs/cgroup/warren-<node-id>/`, with `memory.max`, `pids.max` and
//! `cpu.max`; killing writes `cgroup.kill`. The launched command enters its
//! cgroup *before* it execs (a `sh` wrapper writes `$$` to `cgroup.procs`), so
//! nothing the sandbox forks can start outside it.
//!
//! **rlimits** otherwise, through the `prlimit` command from util-linux, which
//! sets them and execs the command: `RLIMIT_DATA` (memory, per process) and
//! no core dumps. Why a command: `setrlimit` in
//! `pre_exec` needs `unsafe` (the workspace forbids it), and setting limits on
//! a pid after spawning races with the first fork. There is no rlimit for
//! CPU share, and `RLIMIT_NPROC` counts per host uid (all sandboxes share one),
//! so the pids and cpu limits need cgroups; the node logs which it has.

use crate::config::Limits;
use std::ffi::OsString;
use std::path::{Path, PathBuf};

const CGROUP_ROOT: &str = "/sys/fs/cgroup";

/// How this node limits sandboxes; decided once at start.
#[derive(Debug, Clone)]
pub struct LimitPlan {
    limits: Limits,
    /// `/sys/fs/cgroup/warren-<node-id>` when cgroups v2 is usable.
    cgroup_base: Option<PathBuf>,
    /// The `prlimit` program, when installed.
    prlimit: Option<PathBuf>,
}

impl LimitPlan {
    /// Probes the machine and logs what will be enforced.
    pub fn detect(node_id: &str, limits: Limits) -> LimitPlan {
        let cgroup_base = match try_cgroup_base(node_id) {
            Ok(base) => Some(base),
            Err(why) => {
                tracing::info!(%why, "cgroups v2 not usable; falling back to rlimits");
                None
            }
        };
        let prlimit = find_program("prlimit");
        match (&cgroup_base, &prlimit) {
            (Some(base), _) => tracing::info!(
                cgroup = %base.display(),
                memory_bytes = limits.memory_bytes,
                pids = limits.pids,
                cpus = limits.cpus,
                "sandbox limits: cgroups v2"
            ),
            (None, Some(_)) => tracing::warn!(
                memory_bytes = limits.memory_bytes,
                "sandbox limits: rlimits only (memory per process via RLIMIT_DATA); \
                 pids and cpu limits need cgroups v2 and are NOT enforced"
            ),
            (None, None) => tracing::error!(
                "sandbox limits: NONE (no usable cgroups v2 and no prlimit command)"
            ),
        }
        LimitPlan {
            limits,
            cgroup_base,
            prlimit,
        }
    }

    /// A short name of the mechanism, for logs.
    pub fn mechanism(&self) -> &'static str {
        match (&self.cgroup_base, &self.prlimit) {
            (Some(_), _) => "cgroup2",
            (None, Some(_)) => "rlimit",
            (None, None) => "none",
        }
    }

    /// Wraps `cmd` so it runs under the sandbox's limits. Returns the new
    /// command line and the cgroup created for it, if any.
    pub fn wrap(
        &self,
        cgroup_name: &str,
        cmd: Vec<OsString>,
    ) -> std::io::Result<(Vec<OsString>, Option<PathBuf>)> {
        let mut out: Vec<OsString> = Vec::new();
        let mut cgroup = None;
        if let Some(base) = &self.cgroup_base {
            let dir = base.join(cgroup_name);
            make_cgroup(&dir, &self.limits)?;
            out.extend(
                [
                    "/bin/sh",
                    "-c",
                    "echo $$ > \"$1\" && shift && exec \"$@\"",
                    "warren-cgroup-enter",
                ]
                .map(OsString::from),
            );
            out.push(dir.join("cgroup.procs").into_os_string());
            cgroup = Some(dir);
        }
        if let Some(prlimit) = &self.prlimit {
            out.push(prlimit.clone().into_os_string());
            out.push("--core=0".into());
            if cgroup.is_none() {
                out.push(format!("--data={}", self.limits.memory_bytes).into());
            }
            out.push("--".into());
        }
        out.extend(cmd);
        Ok((out, cgroup))
    }
}

fn try_cgroup_base(node_id: &str) -> Result<PathBuf, String> {
    let root = Path::new(CGROUP_ROOT);
    let controllers = std::fs::read_to_string(root.join("cgroup.controllers"))
        .map_err(|e| format!("{CGROUP_ROOT} is not a cgroup v2 hierarchy ({e})"))?;
    for needed in ["memory", "pids"] {
        if !controllers.split_whitespace().any(|c| c == needed) {
            return Err(format!("the {needed} controller is not available"));
        }
    }
    let base = root.join(format!("warren-{node_id}"));
    std::fs::create_dir_all(&base).map_err(|e| format!("cannot create {base:?}: {e}"))?;
    let wanted: Vec<&str> = ["memory", "pids", "cpu"]
        .into_iter()
        .filter(|c| controllers.split_whitespace().any(|x| x == *c))
        .collect();
    let line = wanted
        .iter()
        .map(|c| format!("+{c}"))
        .collect::<Vec<_>>()
        .join(" ");
    std::fs::write(base.join("cgroup.subtree_control"), line)
        .map_err(|e| format!("cannot enable controllers under {base:?}: {e}"))?;
    Ok(base)
}

fn make_cgroup(dir: &Path, limits: &Limits) -> std::io::Result<()> {
    std::fs::create_dir_all(dir)?;
    std::fs::write(dir.join("memory.max"), limits.memory_bytes.to_string())?;
    std::fs::write(dir.join("pids.max"), limits.pids.to_string())?;
    if limits.cpus > 0.0 {
        const PERIOD: u64 = 100_000;
        let quota = ((limits.cpus * PERIOD as f64) as u64).max(1000);
        // cpu may be missing from the hierarchy; memory and pids are what matter most.
        if let Err(e) = std::fs::write(dir.join("cpu.max"), format!("{quota} {PERIOD}")) {
            tracing::warn!(error = %e, cgroup = %dir.display(), "cannot set cpu.max");
        }
    }
    Ok(())
}

/// Kills everything in a cgroup (`cgroup.kill`, or SIGKILL per member on
/// kernels before 5.14).
pub fn cgroup_kill(dir: &Path) {
    if std::fs::write(dir.join("cgroup.kill"), "1").is_ok() {
        return;
    }
    if let Ok(procs) = std::fs::read_to_string(dir.join("cgroup.procs")) {
        for pid in procs
            .split_whitespace()
            .filter_map(|p| p.parse::<i32>().ok())
        {
            let _ = nix::sys::signal::kill(
                nix::unistd::Pid::from_raw(pid),
                nix::sys::signal::Signal::SIGKILL,
            );
        }
    }
}

/// Removes an (emptied) cgroup, waiting briefly for its members to exit.
pub fn cgroup_remove(dir: &Path) {
    for _ in 0..50 {
        match std::fs::remove_dir(dir) {
            Ok(()) => return,
            Err(e) if e.kind() == std::io::ErrorKind::NotFound => return,
            Err(_) => std::thread::sleep(std::time::Duration::from_millis(10)),
        }
    }
    tracing::warn!(cgroup = %dir.display(), "cannot remove the sandbox's cgroup");
}

/// The first executable `name` on `PATH` (or in the usual system dirs).
pub fn find_program(name: &str) -> Option<PathBuf> {
    let path = std::env::var_os("PATH").unwrap_or_default();
    std::env::split_paths(&path)
        .chain(["/usr/bin", "/bin", "/usr/sbin", "/sbin"].map(PathBuf::from))
        .map(|d| d.join(name))
        .find(|p| p.is_file())
}
