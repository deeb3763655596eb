//! Runtimes: how a sandbox's envd is started and how every process of a
//! sandbox is killed.
//!
//! Both runtimes share one on-disk layout per sandbox (see [`Paths`]) and one
//! way of killing ([`procs::kill_all`], plus the sandbox's cgroup when there is
//! one); they differ in how envd is launched:
//! - [`bwrap::Bwrap`]: own pid, mount, network, ipc, uts (and cgroup)
//!   namespaces; the host's system dirs read-only; envd runs as an
//!   unprivileged uid without capabilities.
//! - [`process::Process`]: a directory and a session; no isolation at all.
//!
//! Launching must happen on a long-lived thread (an async task, never
//! `spawn_blocking`): bwrap's `--die-with-parent` is tied to the *thread*
//! that forked it, and blocking-pool threads exit when idle.

pub mod bwrap;
pub mod limits;
pub mod process;
pub mod procs;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use std::path::{Path, PathBuf};

/// The runtime's name, as printed at start and listed by the control API.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum RuntimeKind {
    Bwrap,
    Process,
}

impl RuntimeKind {
    pub fn as_str(self) -> &'static str {
        match self {
            RuntimeKind::Bwrap => "bwrap",
            RuntimeKind::Process => "process",
        }
    }
}

/// Why a sandbox could not be started or stopped.
#[derive(Debug, thiserror::Error)]
pub enum RuntimeError {
    #[error("cannot prepare the sandbox's files: {0}")]
    Files(#[source] std::io::Error),
    #[error("cannot start {what}: {source}")]
    Spawn {
        what: String,
        #[source]
        source: std::io::Error,
    },
    #[error("processes {0:?} of the sandbox survived SIGKILL")]
    Survivors(Vec<i32>),
}

/// Where one sandbox's things live, under `<data>/sandboxes/<id>/`.
#[derive(Debug, Clone)]
pub struct Paths {
    /// `<data>/sandboxes/<id>`.
    pub dir: PathBuf,
    /// `fs/`: the sandbox's own files; envd's `--root` under `process`.
    pub fs: PathBuf,
    /// `fs/home/user`: `/home/user` inside the sandbox.
    pub home: PathBuf,
    /// `fs/tmp`: `/tmp` inside the sandbox.
    pub tmp: PathBuf,
    /// `run/`: envd's sockets (`/run/warren` inside bwrap).
    pub run: PathBuf,
    /// `run/envd.sock`: the envd API.
    pub envd_sock: PathBuf,
    /// `run/relay.sock`: envd's port relay.
    pub relay_sock: PathBuf,
    /// `sandbox.json`: what the node knows, so a restarted node finds it.
    pub state: PathBuf,
}

impl Paths {
    pub fn new(sandboxes_dir: &Path, sandbox_id: &str) -> Paths {
        let dir = sandboxes_dir.join(sandbox_id);
        let fs = dir.join("fs");
        let run = dir.join("run");
        Paths {
            home: fs.join("home").join("user"),
            tmp: fs.join("tmp"),
            envd_sock: run.join("envd.sock"),
            relay_sock: run.join("relay.sock"),
            state: dir.join("sandbox.json"),
            fs,
            run,
            dir,
        }
    }
}

/// Everything a runtime needs to start one sandbox's envd.
#[derive(Debug)]
pub struct LaunchSpec<'a> {
    pub sandbox_id: &'a str,
    pub generation: u64,
    pub paths: &'a Paths,
    /// The sandbox's environment (user-supplied `env_vars`).
    pub env_vars: &'a BTreeMap<String, String>,
    /// Goes to envd as `WARREN_ENVD_ACCESS_TOKEN` in its environment, never argv.
    pub access_token: Option<&'a str>,
    pub envd_bin: &'a Path,
    pub max_output_bytes: u64,
    /// The value of [`procs::MARK_ENV`] every process of the sandbox inherits
    /// (see [`mark`]).
    pub mark: &'a str,
}

/// The [`procs::MARK_ENV`] value for a sandbox at a generation on the node
/// whose data dir is `data_dir`: unique on the host even when two nodes (or
/// two test clusters) host the same sandbox id, so one node's kill never
/// touches another's processes.
pub fn mark(sandbox_id: &str, generation: u64, data_dir: &Path) -> String {
    // FNV-1a: stable across builds, unlike std's hasher, so a restarted
    // (even upgraded) node recognises its own marks.
    let mut h: u64 = 0xcbf2_9ce4_8422_2325;
    for b in data_dir.as_os_str().as_encoded_bytes() {
        h ^= u64::from(*b);
        h = h.wrapping_mul(0x0000_0100_0000_01b3);
    }
    format!("{sandbox_id}.{generation}@{h:016x}")
}

/// How to find a running sandbox's processes again, also after a node
/// restart (it is stored in `sandbox.json`).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct Handle {
    pub runtime: RuntimeKind,
    /// The process the node started (bwrap, or envd itself).
    pub pid: i32,
    /// Its start time (clock ticks since boot), to tell it from a reused pid.
    pub start_time: u64,
    /// The sandbox's pid namespace inode (bwrap), once known.
    pub pid_ns: Option<u64>,
    /// True when `pid` leads its own session (`process` runtime).
    pub session: bool,
    /// The sandbox's cgroup directory, when cgroups v2 is in use.
    pub cgroup: Option<PathBuf>,
    /// The sandbox's [`procs::MARK_ENV`] value.
    pub mark: String,
}

/// A started sandbox: its handle and, when this process started it, the child
/// to reap.
pub struct Launched {
    pub handle: Handle,
    pub child: Option<tokio::process::Child>,
}

/// The part of starting envd both runtimes share: the sandbox's mark, its
/// environment, the access token (environment, never argv), stdio, the spawn,
/// and the handle for the started process. The caller has set the program,
/// argv, working dir and base environment.
fn spawn_envd(
    mut command: tokio::process::Command,
    spec: &LaunchSpec<'_>,
    kind: RuntimeKind,
    what: String,
    cgroup: Option<PathBuf>,
) -> Result<Launched, RuntimeError> {
    command
        .env(procs::MARK_ENV, spec.mark)
        .envs(spec.env_vars)
        .envs(log_settings())
        .stdin(std::process::Stdio::null())
        .stdout(std::process::Stdio::null())
        .stderr(std::process::Stdio::inherit());
    if let Some(token) = spec.access_token {
        command.env("WARREN_ENVD_ACCESS_TOKEN", token);
    }
    let child = command
        .spawn()
        .map_err(|source| RuntimeError::Spawn { what, source })?;
    let pid = child.id().map(|p| p as i32).unwrap_or(0);
    let start_time = procs::stat(pid).map(|s| s.start_time).unwrap_or(0);
    Ok(Launched {
        handle: Handle {
            runtime: kind,
            pid,
            start_time,
            pid_ns: None,
            session: false,
            cgroup,
            mark: spec.mark.to_string(),
        },
        child: Some(child),
    })
}

/// What both runtimes do.
pub trait Runtime: Send + Sync + 'static {
    fn kind(&self) -> RuntimeKind;
    /// Starts the sandbox's envd. The sandbox's files exist already.
    /// Must be called from an async task (see the module doc).
    fn launch(&self, spec: &LaunchSpec<'_>) -> Result<Launched, RuntimeError>;
    /// The host uid/gid that must own the sandbox's files and socket dir
    /// (None: the node's own).
    fn file_owner(&self) -> Option<(u32, u32)> {
        None
    }
    /// Fills in what can only be learned once envd is up (bwrap: the pid
    /// namespace). Blocking but quick.
    fn settle(&self, handle: &mut Handle) {
        let _ = handle;
    }
}

/// Kills every process of a sandbox (blocking; run it in `spawn_blocking`)
/// and removes its cgroup.
pub fn kill(handle: &Handle) -> Result<(), RuntimeError> {
    if let Some(cg) = &handle.cgroup {
        limits::cgroup_kill(cg);
    }
    let result = procs::kill_all(handle, &handle.mark);
    if let Some(cg) = &handle.cgroup {
        limits::cgroup_remove(cg);
    }
    result.map_err(RuntimeError::Survivors)
}

/// The node's own log settings, passed on so envd logs like the node does.
fn log_settings() -> Vec<(String, String)> {
    ["WARREN_LOG", "WARREN_LOG_FORMAT"]
        .iter()
        .filter_map(|k| Some((k.to_string(), std::env::var(k).ok()?)))
        .collect()
}

/// The `PATH` processes in a sandbox get.
pub const SANDBOX_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";
