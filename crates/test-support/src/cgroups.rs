//! What the host's cgroups say an isolated sandbox may use: its node made
//! `warren-<node-id>-<instance>/<sandbox>-<generation>` in each hierarchy
//! (cgroup v2's unified one, or v1's `memory` and `cpu`).

use std::path::{Path, PathBuf};

/// The cgroup root every hierarchy is under.
const ROOT: &str = "/sys/fs/cgroup";

/// A sandbox's limits as its cgroups hold them.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct SandboxLimits {
    /// `memory.max` (v2) or `memory.limit_in_bytes` (v1).
    pub memory_bytes: u64,
    /// CPUs the quota allows (`cpu.max`, or `cpu.cfs_quota_us` over
    /// `cpu.cfs_period_us`); `None` when unlimited.
    pub cpus: Option<f64>,
}

/// The directory `<base>/warren-*/<sandbox_id>-*` under `base`, if any.
fn find(base: &Path, sandbox_id: &str) -> Option<PathBuf> {
    let prefix = format!("{sandbox_id}-");
    std::fs::read_dir(base)
        .ok()?
        .flatten()
        .filter(|e| e.file_name().to_string_lossy().starts_with("warren-"))
        .flat_map(|node| {
            std::fs::read_dir(node.path())
                .into_iter()
                .flatten()
                .flatten()
        })
        .find(|e| e.file_name().to_string_lossy().starts_with(&prefix))
        .map(|e| e.path())
}

fn read(path: &Path) -> Option<String> {
    std::fs::read_to_string(path)
        .ok()
        .map(|s| s.trim().to_string())
}

/// The limits of `sandbox_id`'s cgroups, if this host has them.
pub fn sandbox_limits(sandbox_id: &str) -> Option<SandboxLimits> {
    let root = Path::new(ROOT);
    // v2: one directory with both files.
    if let Some(dir) = find(root, sandbox_id).filter(|d| d.join("memory.max").exists()) {
        let memory_bytes = read(&dir.join("memory.max"))?.parse().ok()?;
        let cpu = read(&dir.join("cpu.max"))?;
        let mut parts = cpu.split_whitespace();
        let cpus = match (parts.next(), parts.next()) {
            (Some("max"), _) | (None, _) => None,
            (Some(q), Some(p)) => Some(q.parse::<f64>().ok()? / p.parse::<f64>().ok()?),
            _ => None,
        };
        return Some(SandboxLimits { memory_bytes, cpus });
    }
    // v1: a directory per controller.
    let mem = find(&root.join("memory"), sandbox_id)?;
    let memory_bytes = read(&mem.join("memory.limit_in_bytes"))?.parse().ok()?;
    let cpus = find(&root.join("cpu"), sandbox_id).and_then(|cpu| {
        let quota: i64 = read(&cpu.join("cpu.cfs_quota_us"))?.parse().ok()?;
        let period: f64 = read(&cpu.join("cpu.cfs_period_us"))?.parse().ok()?;
        (quota > 0).then(|| quota as f64 / period)
    });
    Some(SandboxLimits { memory_bytes, cpus })
}
