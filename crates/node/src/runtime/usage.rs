//! What a sandbox uses now, read from the host side (blocking but quick:
//! a few small files and one `statvfs`).
//!
//! | figure | cgroup v2 | cgroup v1 | no cgroup (`process` runtime) |
//! |---|---|---|---|
//! | CPU time | `cpu.stat` `usage_usec` | `cpuacct.usage` | `utime + stime` of the sandbox's live processes (`/proc`) |
//! | CPUs | `cpu.max` | `cpu.cfs_quota_us` / `cpu.cfs_period_us` | the host's |
//! | memory used | `memory.current` − `file` | `memory.usage_in_bytes` − `cache` | resident set of its processes |
//! | memory total | `memory.max` | `memory.limit_in_bytes` | the host's `MemTotal` |
//! | page cache | `memory.stat` `file` | `memory.stat` `cache` | 0 |
//! | disk | `statvfs` of the sandbox's disk (`disk/`) | the same | 0 (no disk of its own) |
//!
//! Without a cgroup the CPU time of processes that already exited is lost,
//! and shared pages count once per process: the `process` runtime's figures
//! are an estimate, as the rest of that runtime is.

use super::limits::Cgroup;
use super::{Handle, Paths};
use std::path::Path;

/// One reading.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Usage {
    /// CPU time used so far, nanoseconds (only differences mean anything).
    pub cpu_ns: u64,
    /// CPUs the sandbox may use (fractional).
    pub cpus: f64,
    pub mem_used: u64,
    pub mem_total: u64,
    pub mem_cache: u64,
    pub disk_used: u64,
    pub disk_total: u64,
}

/// Reads what the sandbox `handle` describes uses now.
pub fn read(handle: &Handle, paths: &Paths) -> Usage {
    let mut u = match &handle.cgroup {
        Some(cg) if cg.v2 => v2(cg),
        Some(cg) => v1(cg),
        None => processes(handle),
    };
    if let Some((used, total)) = disk(&paths.disk_mnt) {
        u.disk_used = used;
        u.disk_total = total;
    }
    u
}

fn v2(cg: &Cgroup) -> Usage {
    let dir = &cg.members;
    let cpu_ns = keyed(&dir.join("cpu.stat"), "usage_usec").saturating_mul(1000);
    let cpus = std::fs::read_to_string(dir.join("cpu.max"))
        .ok()
        .and_then(|s| {
            let mut f = s.split_whitespace();
            let quota: f64 = f.next()?.parse().ok()?;
            let period: f64 = f.next()?.parse().ok()?;
            (period > 0.0).then(|| quota / period)
        })
        .unwrap_or_else(host_cpus);
    let current = number(&dir.join("memory.current")).unwrap_or(0);
    let cache = keyed(&dir.join("memory.stat"), "file");
    Usage {
        cpu_ns,
        cpus,
        mem_used: current.saturating_sub(cache),
        mem_total: number(&dir.join("memory.max")).unwrap_or_else(host_memory),
        mem_cache: cache,
        ..Usage::default()
    }
}

fn v1(cg: &Cgroup) -> Usage {
    let memory = controller_dir(cg, "memory");
    let cpu = controller_dir(cg, "cpu");
    let cpu_ns = controller_dir(cg, "cpuacct")
        .and_then(|d| number(&d.join("cpuacct.usage")))
        .unwrap_or(0);
    let cpus = cpu
        .and_then(|d| {
            let quota = std::fs::read_to_string(d.join("cpu.cfs_quota_us")).ok()?;
            let quota: i64 = quota.trim().parse().ok()?;
            let period = number(&d.join("cpu.cfs_period_us"))?;
            (quota > 0 && period > 0).then(|| quota as f64 / period as f64)
        })
        .unwrap_or_else(host_cpus);
    let (usage, limit, cache) = memory.map_or((0, host_memory(), 0), |d| {
        (
            number(&d.join("memory.usage_in_bytes")).unwrap_or(0),
            number(&d.join("memory.limit_in_bytes")).unwrap_or_else(host_memory),
            keyed(&d.join("memory.stat"), "cache"),
        )
    });
    Usage {
        cpu_ns,
        cpus,
        mem_used: usage.saturating_sub(cache),
        // An unlimited v1 cgroup says 2^63 rounded to pages.
        mem_total: limit.min(host_memory()),
        mem_cache: cache,
        ..Usage::default()
    }
}

/// The sandbox's directory in the v1 `controller` hierarchy
/// (`/sys/fs/cgroup/<controller>/...`), if it has one.
fn controller_dir<'a>(cg: &'a Cgroup, controller: &str) -> Option<&'a Path> {
    let root = Path::new(super::limits::CGROUP_ROOT).join(controller);
    cg.dirs
        .iter()
        .find(|d| {
            d.strip_prefix(&root)
                .is_ok_and(|rest| rest.components().count() > 0)
        })
        .map(|d| d.as_path())
}

fn processes(handle: &Handle) -> Usage {
    let tick_ns = 1_000_000_000 / clock_ticks();
    let page = page_size();
    let (mut cpu_ns, mut rss) = (0u64, 0u64);
    for pid in super::procs::members(handle, &handle.mark) {
        if let Some(t) = cpu_ticks(pid) {
            cpu_ns = cpu_ns.saturating_add(t.saturating_mul(tick_ns));
        }
        let statm = std::fs::read_to_string(format!("/proc/{pid}/statm")).unwrap_or_default();
        if let Some(pages) = statm
            .split_whitespace()
            .nth(1)
            .and_then(|p| p.parse::<u64>().ok())
        {
            rss = rss.saturating_add(pages.saturating_mul(page));
        }
    }
    Usage {
        cpu_ns,
        cpus: host_cpus(),
        mem_used: rss,
        mem_total: host_memory(),
        ..Usage::default()
    }
}

/// `utime + stime` of `pid` in clock ticks (fields 14 and 15 of `stat`).
fn cpu_ticks(pid: i32) -> Option<u64> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    let utime: u64 = f.get(11)?.parse().ok()?;
    let stime: u64 = f.get(12)?.parse().ok()?;
    Some(utime + stime)
}

/// `(used, total)` bytes of the filesystem mounted at `at`, when one is
/// (the sandbox's own disk; never the filesystem beneath an empty dir).
fn disk(at: &Path) -> Option<(u64, u64)> {
    if !super::disk::is_mounted(at) {
        return None;
    }
    let s = nix::sys::statvfs::statvfs(at).ok()?;
    let frsize = s.fragment_size() as u64;
    let total = (s.blocks() as u64).saturating_mul(frsize);
    let free = (s.blocks_free() as u64).saturating_mul(frsize);
    Some((total.saturating_sub(free), total))
}

fn number(path: &Path) -> Option<u64> {
    std::fs::read_to_string(path).ok()?.trim().parse().ok()
}

/// The value of `key` in a `key value` per line file (`memory.stat`, `cpu.stat`); 0 if absent.
fn keyed(path: &Path, key: &str) -> u64 {
    std::fs::read_to_string(path)
        .ok()
        .and_then(|s| {
            s.lines().find_map(|l| {
                let (k, v) = l.split_once(' ')?;
                (k == key).then(|| v.trim().parse().ok()).flatten()
            })
        })
        .unwrap_or(0)
}

/// The host's CPUs (what an unlimited sandbox may use).
pub fn host_cpus() -> f64 {
    std::thread::available_parallelism().map_or(1.0, |n| n.get() as f64)
}

/// The host's `MemTotal`, bytes.
fn host_memory() -> u64 {
    std::fs::read_to_string("/proc/meminfo")
        .ok()
        .and_then(|s| {
            s.lines()
                .find_map(|l| l.strip_prefix("MemTotal:"))
                .and_then(|v| v.trim().trim_end_matches("kB").trim().parse::<u64>().ok())
        })
        .map_or(0, |kb| kb * 1024)
}

fn clock_ticks() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::CLK_TCK)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(100, |t| t as u64)
}

fn page_size() -> u64 {
    nix::unistd::sysconf(nix::unistd::SysconfVar::PAGE_SIZE)
        .ok()
        .flatten()
        .filter(|t| *t > 0)
        .map_or(4096, |t| t as u64)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn keyed_files() {
        let dir = std::env::temp_dir().join(format!("warren-usage-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let f = dir.join("memory.stat");
        std::fs::write(&f, "cache 4096\nrss 8192\ntotal_cache 4096\n").unwrap();
        assert_eq!(keyed(&f, "cache"), 4096);
        assert_eq!(keyed(&f, "rss"), 8192);
        assert_eq!(keyed(&f, "swap"), 0);
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn v1_controller_dirs_are_found_by_hierarchy() {
        let cg = Cgroup {
            dirs: vec![
                "/sys/fs/cgroup/memory/warren-n/s-1".into(),
                "/sys/fs/cgroup/cpu/warren-n/s-1".into(),
                "/sys/fs/cgroup/cpuacct/warren-n/s-1".into(),
            ],
            members: "/sys/fs/cgroup/pids/warren-n/s-1".into(),
            freeze_file: "/sys/fs/cgroup/freezer/warren-n/s-1/freezer.state".into(),
            v2: false,
        };
        assert_eq!(
            controller_dir(&cg, "cpu"),
            Some(Path::new("/sys/fs/cgroup/cpu/warren-n/s-1"))
        );
        assert_eq!(
            controller_dir(&cg, "cpuacct"),
            Some(Path::new("/sys/fs/cgroup/cpuacct/warren-n/s-1"))
        );
        assert_eq!(controller_dir(&cg, "blkio"), None);
    }

    #[test]
    fn this_process_has_cpu_ticks() {
        assert!(cpu_ticks(std::process::id() as i32).is_some());
        assert!(host_memory() > 0);
    }
}
