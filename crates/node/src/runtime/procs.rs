//! Finding and killing a sandbox's processes through `/proc`.
//!
//! A sandbox's processes are recognised by any of the marks it leaves:
//! its pid namespace (isolated: the one complete and unforgeable mark), the
//! session envd leads (`process` runtime), the process tree under envd, or the
//! `WARREN_SANDBOX` environment variable every process inherits unless it
//! scrubs its environment. Killing repeats until a scan finds nothing, so a
//! process forking while we kill does not survive.

use super::Handle;
use nix::sys::signal::{kill, Signal};
use nix::unistd::Pid;
use std::collections::{HashMap, HashSet};
use std::time::Duration;

/// The name of the environment variable that marks a sandbox's processes.
pub const MARK_ENV: &str = "WARREN_SANDBOX";

/// What `/proc/<pid>/stat` tells about one process.
#[derive(Debug, Clone, Copy)]
pub struct Stat {
    pub ppid: i32,
    pub session: i32,
    /// Start time in clock ticks since boot; together with the pid it names
    /// one process even after the pid is reused.
    pub start_time: u64,
}

/// Reads `/proc/<pid>/stat`; `None` when the process is gone.
pub fn stat(pid: i32) -> Option<Stat> {
    let text = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    // The command name (field 2) may contain spaces and parentheses; the
    // fields after the last ')' are fixed.
    let rest = &text[text.rfind(')')? + 2..];
    let f: Vec<&str> = rest.split_whitespace().collect();
    // rest[0] is field 3 (state); field n is f[n - 3].
    Some(Stat {
        ppid: f.get(1)?.parse().ok()?,
        session: f.get(3)?.parse().ok()?,
        start_time: f.get(19)?.parse().ok()?,
    })
}

/// The inode of `/proc/<pid>/ns/pid` (`pid:[4026532281]`).
pub fn pid_ns(pid: i32) -> Option<u64> {
    let link = std::fs::read_link(format!("/proc/{pid}/ns/pid")).ok()?;
    let s = link.to_str()?;
    s.strip_prefix("pid:[")?.strip_suffix(']')?.parse().ok()
}

/// The direct children of `pid` (from `/proc/<pid>/task/<pid>/children`).
pub fn children(pid: i32) -> Vec<i32> {
    std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
        .map(|s| {
            s.split_whitespace()
                .filter_map(|p| p.parse().ok())
                .collect()
        })
        .unwrap_or_default()
}

/// True when `pid` is still the process the handle recorded.
fn is_same_process(pid: i32, start_time: u64) -> bool {
    stat(pid).is_some_and(|s| s.start_time == start_time)
}

fn all_pids() -> Vec<i32> {
    let Ok(dir) = std::fs::read_dir("/proc") else {
        return Vec::new();
    };
    dir.filter_map(|e| e.ok()?.file_name().to_str()?.parse().ok())
        .collect()
}

fn has_mark(pid: i32, mark: &[u8]) -> bool {
    std::fs::read(format!("/proc/{pid}/environ"))
        .map(|env| env.split(|b| *b == 0).any(|kv| kv == mark))
        .unwrap_or(false)
}

/// Every live process that belongs to the sandbox `handle` describes.
pub fn members(handle: &Handle, mark_value: &str) -> Vec<i32> {
    let me = std::process::id() as i32;
    // Guards: a handle must never name the node's own pid namespace or
    // session, or a kill would take the node (and every sandbox) with it.
    let my_ns = pid_ns(me);
    let my_session = stat(me).map(|s| s.session);
    let ns = handle.pid_ns.filter(|n| Some(*n) != my_ns);
    let session = handle.session && Some(handle.pid) != my_session;
    let mark = format!("{MARK_ENV}={mark_value}").into_bytes();
    let root_alive = is_same_process(handle.pid, handle.start_time);
    // A namespace inode identifies the sandbox only while that namespace
    // lives: the kernel reuses a freed inode number at once, often for the
    // very next sandbox's namespace. So match by namespace only while the
    // root still has a child inside it (then it cannot have been freed);
    // once it is gone, the kernel has already killed everything in it.
    let ns = ns.filter(|ns| {
        root_alive
            && children(handle.pid)
                .into_iter()
                .any(|c| pid_ns(c) == Some(*ns))
    });
    let mut stats: HashMap<i32, Stat> = HashMap::new();
    for pid in all_pids() {
        if pid != me {
            if let Some(s) = stat(pid) {
                stats.insert(pid, s);
            }
        }
    }
    let mut found: HashSet<i32> = HashSet::new();
    for (&pid, s) in &stats {
        let by_root = root_alive && pid == handle.pid;
        let by_ns = ns.is_some() && pid_ns(pid) == ns;
        let by_session = root_alive && session && s.session == handle.pid;
        if by_root || by_ns || by_session || has_mark(pid, &mark) {
            found.insert(pid);
        }
    }
    // Descendants of anything found (a child that left the session and
    // scrubbed its environment is still somebody's child for a while).
    loop {
        let before = found.len();
        for (&pid, s) in &stats {
            if found.contains(&s.ppid) {
                found.insert(pid);
            }
        }
        if found.len() == before {
            break;
        }
    }
    found.into_iter().collect()
}

/// SIGKILLs every process of the sandbox until none is left (bounded: a
/// process stuck in uninterruptible sleep is reported, not waited for).
/// Blocking; call it from `spawn_blocking`.
pub fn kill_all(handle: &Handle, mark_value: &str) -> Result<(), Vec<i32>> {
    let mut last = Vec::new();
    for round in 0..100 {
        let pids = members(handle, mark_value);
        if pids.is_empty() {
            return Ok(());
        }
        // Stop them all before killing any, as the freezer does for a
        // sandbox with cgroups: otherwise envd could see a command die of
        // the kill and answer its stream with an end event (exit -1) in the
        // moment before its own SIGKILL lands, where a client must see the
        // stream cut, as when an E2B sandbox's VM goes away.
        // A stop is delivered asynchronously (each thread stops on its way
        // back to user space; on a loaded VM a thread can run on for
        // milliseconds), so wait until every thread of every one of them is
        // stopped or gone before the first SIGKILL.
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        }
        // (Bounded: a process in uninterruptible sleep never stops.)
        wait_stopped(
            &pids,
            Duration::from_millis(if round == 0 { 500 } else { 5 }),
        );
        for &pid in &pids {
            let _ = kill(Pid::from_raw(pid), Signal::SIGKILL);
        }
        last = pids;
        std::thread::sleep(Duration::from_millis(if round < 10 { 5 } else { 50 }));
    }
    Err(last)
}

/// Waits, up to `within`, until every thread of each of `pids` is stopped
/// (`T`/`t`) or gone (`Z`/`X`, or no longer in /proc).
fn wait_stopped(pids: &[i32], within: Duration) {
    let deadline = std::time::Instant::now() + within;
    let settled = |pid: i32| {
        let Ok(tasks) = std::fs::read_dir(format!("/proc/{pid}/task")) else {
            return true;
        };
        tasks.flatten().all(|t| {
            let Ok(text) = std::fs::read_to_string(t.path().join("stat")) else {
                return true;
            };
            let state = text
                .rfind(')')
                .and_then(|i| text[i + 1..].split_whitespace().next())
                .unwrap_or("");
            matches!(state, "T" | "t" | "Z" | "X")
        })
    };
    while !pids.iter().all(|&pid| settled(pid)) {
        if std::time::Instant::now() > deadline {
            return;
        }
        std::thread::sleep(Duration::from_millis(1));
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_stopped_process_is_waited_for_until_it_is_stopped() {
        let mut child = std::process::Command::new("sleep")
            .arg("30")
            .spawn()
            .unwrap();
        let pid = child.id() as i32;
        let _ = kill(Pid::from_raw(pid), Signal::SIGSTOP);
        wait_stopped(&[pid], Duration::from_secs(5));
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        let state = stat[stat.rfind(')').unwrap() + 1..]
            .split_whitespace()
            .next();
        assert_eq!(state, Some("T"), "{stat}");
        let _ = child.kill();
        let _ = child.wait();
    }

    #[test]
    fn reads_own_stat() {
        let me = std::process::id() as i32;
        let s = stat(me).expect("own stat");
        assert!(s.start_time > 0);
        assert!(pid_ns(me).is_some());
        assert!(is_same_process(me, s.start_time));
        assert!(!is_same_process(me, s.start_time + 1));
    }
}
