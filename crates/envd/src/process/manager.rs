//! The process table: spawning, the per-process output log, stdin, signals,
//! and how long finished processes stay reattachable.
//!
//! Each process runs in its own process group (so a signal reaches what a
//! `bash -c` started, too). Two reader tasks append its stdout and stderr to
//! its [`OutputLog`]; a waiter task records its exit. Every change bumps a
//! `watch` channel that the RPC streams wait on, so streams never hold the
//! process: a client that goes away leaves it running and reattachable.

use super::exit::{exit_of, Exit};
use super::output::{OffsetError, OutputLog, Pipe};
use super::pipe::spawn_reader;
use crate::paths::{Follow, Jail};
use nix::sys::signal::Signal;
use std::collections::{HashMap, VecDeque};
use std::os::unix::process::ExitStatusExt;
use std::process::Stdio;
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::{Arc, Mutex, MutexGuard};
use tokio::io::AsyncWriteExt;
use tokio::process::ChildStdin;
use tokio::sync::{watch, Notify};

/// The node's mark on a sandbox's processes, passed on when envd has it.
const SANDBOX_MARK: &str = "WARREN_SANDBOX";

/// The default `PATH` of sandbox processes.
const DEFAULT_PATH: &str = "/usr/local/sbin:/usr/local/bin:/usr/sbin:/usr/bin:/sbin:/bin";

/// What a caller asked to run.
#[derive(Debug, Clone, Default)]
pub struct Spec {
    /// The program.
    pub cmd: String,
    /// Its arguments.
    pub args: Vec<String>,
    /// Extra environment, over the defaults.
    pub envs: HashMap<String, String>,
    /// Working directory as the client names it; home when `None`.
    pub cwd: Option<String>,
    /// Whether stdin is a pipe the client can write to (else /dev/null).
    pub stdin: bool,
    /// The client's tag for finding the process again.
    pub tag: Option<String>,
    /// `USER`/`LOGNAME` for the process (from the SDK's Basic auth header).
    pub user: Option<String>,
    /// Run on a new terminal of this size instead of pipes.
    pub pty: Option<super::pty::Size>,
}

/// Why a request about a process failed.
#[derive(Debug, thiserror::Error)]
pub enum ProcError {
    /// No process with that pid or tag (or it was forgotten).
    #[error("process {0} not found")]
    NotFound(String),
    /// The program could not be started (missing, not executable, bad cwd...).
    #[error("cannot start {cmd:?}: {source}")]
    Spawn {
        /// The program.
        cmd: String,
        /// Why.
        source: std::io::Error,
    },
    /// The user named does not exist in the sandbox.
    #[error(transparent)]
    User(#[from] crate::users::UnknownUser),
    /// The working directory is not valid.
    #[error(transparent)]
    Path(#[from] crate::paths::PathError),
    /// An env var or argument no program can be given (NUL, too long).
    #[error("{0}")]
    Invalid(String),
    /// The working directory does not exist (or is not a directory).
    #[error("working directory {0:?} does not exist or is not a directory")]
    Cwd(String),
    /// Stdin was not requested at start, or has been closed.
    #[error(
        "stdin of process {0} is not open (start it with stdin enabled, and do not close it first)"
    )]
    StdinClosed(u32),
    /// Writing to stdin failed (the process closed its end).
    #[error("writing to stdin of process {pid}: {source}")]
    StdinWrite {
        /// The process.
        pid: u32,
        /// Why.
        source: std::io::Error,
    },
    /// A PTY request for a process without one, or the terminal failed.
    #[error("{0}")]
    Pty(String),
    /// `kill(2)` failed.
    #[error("signalling process {pid}: {source}")]
    Signal {
        /// The process.
        pid: u32,
        /// Why.
        source: nix::Error,
    },
}

/// What the process has done so far; guarded by [`Proc::state`]'s mutex.
#[derive(Debug)]
pub struct State {
    /// Its output.
    pub log: OutputLog,
    /// Set once it has ended and its output is complete.
    pub exit: Option<Exit>,
    /// Where each attached stream has read up to (by stream id): the
    /// readers hold back new output rather than evict bytes a stream has
    /// not sent yet.
    cursors: HashMap<u64, u64>,
    next_cursor: u64,
}

impl State {
    /// The offset of the slowest attached stream (`u64::MAX` when none).
    pub fn slowest(&self) -> u64 {
        self.cursors.values().min().copied().unwrap_or(u64::MAX)
    }

    /// Whether `len` more bytes fit within the bound without evicting
    /// output that an attached stream has not sent yet. A chunk larger than
    /// the whole bound fits once every stream has caught up (it is then
    /// kept whole until they have sent it).
    pub fn fits(&self, len: usize) -> bool {
        let slowest = self.slowest();
        slowest >= self.log.end() || self.log.end() + len as u64 - slowest <= self.log.max() as u64
    }
}

/// One process started through envd.
#[derive(Debug)]
pub struct Proc {
    /// Its pid (also its process group id).
    pub pid: u32,
    /// The client's tag.
    pub tag: Option<String>,
    /// Start order, so the newest process wins a tag lookup.
    seq: u64,
    /// What was started, for List.
    pub spec: Spec,
    /// Output and exit, read by streams.
    state: Mutex<State>,
    /// Bumped whenever `state` changes; streams wait on it.
    changed: watch::Sender<()>,
    /// Signalled when a stream moved its cursor; readers held back wait on it.
    pub(super) space: Notify,
    /// Set the moment the process exits (before its output is complete).
    exited: AtomicBool,
    /// Set when envd itself sent a signal (so a SIGKILL from elsewhere, the
    /// out-of-memory killer, can be told apart).
    signalled: AtomicBool,
    /// The write end of its stdin while open.
    stdin: tokio::sync::Mutex<Option<ChildStdin>>,
    /// Its terminal, for a PTY process: input goes there, `Update` resizes it.
    pty: Option<super::pty::Master>,
    /// Turns true the moment the process has been reaped.
    reaped: watch::Receiver<bool>,
}

impl Proc {
    /// Locks its state (poisoning is ignored: the state stays consistent
    /// because every update is a single push or assignment).
    pub fn state(&self) -> MutexGuard<'_, State> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// A receiver that wakes when output arrives or the process ends.
    pub fn subscribe(&self) -> watch::Receiver<()> {
        self.changed.subscribe()
    }

    /// The last `max` bytes or so of its retained output (stdout and
    /// stderr as they came), as text.
    pub fn output_tail(&self, max: usize) -> String {
        let state = self.state();
        let from = state
            .log
            .end()
            .saturating_sub(max as u64)
            .max(state.log.start());
        let chunks = state.log.read_from(from, max).unwrap_or_default();
        let bytes: Vec<u8> = chunks.iter().flat_map(|c| c.data.iter().copied()).collect();
        String::from_utf8_lossy(&bytes).into_owned()
    }

    /// Whether it is still running.
    pub fn running(&self) -> bool {
        !self.exited.load(Ordering::Acquire)
    }

    /// Registers a stream that reads from offset `from` (the end of the
    /// output so far when `None`: live output only), so output it has not
    /// sent yet is held back instead of evicted.
    pub fn attach(self: &Arc<Self>, from: Option<u64>) -> Result<Cursor, OffsetError> {
        let mut state = self.state();
        let from = match from {
            Some(offset) => {
                state.log.check(offset)?;
                offset
            }
            None => state.log.end(),
        };
        let id = state.next_cursor;
        state.next_cursor += 1;
        state.cursors.insert(id, from);
        Ok(Cursor {
            proc: self.clone(),
            id,
            from,
        })
    }

    /// Writes `data` to its stdin (its terminal, for a PTY process).
    pub async fn write_stdin(&self, data: &[u8]) -> Result<(), ProcError> {
        if let Some(pty) = &self.pty {
            return pty
                .write_all(data)
                .await
                .map_err(|source| ProcError::StdinWrite {
                    pid: self.pid,
                    source,
                });
        }
        let mut guard = self.stdin.lock().await;
        let stdin = guard.as_mut().ok_or(ProcError::StdinClosed(self.pid))?;
        let res = async {
            stdin.write_all(data).await?;
            stdin.flush().await
        }
        .await;
        res.map_err(|source| ProcError::StdinWrite {
            pid: self.pid,
            source,
        })
    }

    /// Types `data` on its terminal; only a PTY process has one.
    pub async fn write_pty(&self, data: &[u8]) -> Result<(), ProcError> {
        if self.pty.is_none() {
            return Err(ProcError::Pty(format!(
                "process {} was not started with a PTY; send its input as stdin",
                self.pid
            )));
        }
        self.write_stdin(data).await
    }

    /// Resizes its terminal; only a PTY process has one.
    pub fn resize(&self, size: super::pty::Size) -> Result<(), ProcError> {
        let pty = self.pty.as_ref().ok_or_else(|| {
            ProcError::Pty(format!(
                "process {} was not started with a PTY, so it has no size to change",
                self.pid
            ))
        })?;
        pty.resize(size)
            .map_err(|e| ProcError::Pty(format!("resizing the PTY of process {}: {e}", self.pid)))
    }

    /// Waits until the process has been reaped, at most `limit`; whether it was.
    pub async fn wait_reaped(&self, limit: std::time::Duration) -> bool {
        let mut reaped = self.reaped.clone();
        tokio::time::timeout(limit, reaped.wait_for(|r| *r))
            .await
            .is_ok_and(|r| r.is_ok())
    }

    /// Closes its stdin (EOF for the process). Closing twice is fine.
    pub async fn close_stdin(&self) -> Result<(), ProcError> {
        if self.pty.is_some() {
            return Err(ProcError::Pty(format!(
                "process {} reads a PTY, which has no end of input to close; send ^D (0x04) as input instead",
                self.pid
            )));
        }
        let mut guard = self.stdin.lock().await;
        match guard.take() {
            Some(mut stdin) => {
                let _ = stdin.shutdown().await;
                Ok(())
            }
            None if self.spec.stdin => Ok(()),
            None => Err(ProcError::StdinClosed(self.pid)),
        }
    }

    /// Sends `signal` to its whole process group, so what a `bash -c`
    /// started goes too, and to the process itself in case it left the
    /// group. A group that is already empty is not an error: the process
    /// ended a moment ago and nothing is left to signal.
    pub fn signal(&self, signal: Signal) -> Result<(), ProcError> {
        self.signalled.store(true, Ordering::Release);
        let pid = nix::unistd::Pid::from_raw(self.pid as i32);
        let group = nix::sys::signal::killpg(pid, signal);
        if self.running() {
            let _ = nix::sys::signal::kill(pid, signal);
        }
        match group {
            Ok(()) | Err(nix::Error::ESRCH) => Ok(()),
            Err(source) => Err(ProcError::Signal {
                pid: self.pid,
                source,
            }),
        }
    }

    pub(super) fn notify(&self) {
        self.changed.send_modify(|_| ());
    }
}

/// Refuses, with a message naming it, what `execve` would refuse for one
/// variable or argument (a NUL, or more than the kernel's
/// `MAX_ARG_STRLEN`); what is too large only all together is the
/// kernel's `E2BIG` at spawn, reported as the same kind of error.
fn check_spec(spec: &Spec) -> Result<(), ProcError> {
    for (name, value) in &spec.envs {
        warren_core::env::check_shape(name, value).map_err(ProcError::Invalid)?;
    }
    for (i, arg) in std::iter::once(&spec.cmd).chain(&spec.args).enumerate() {
        let what = if i == 0 {
            "cmd".to_string()
        } else {
            format!("args[{}]", i - 1)
        };
        if arg.contains('\0') {
            return Err(ProcError::Invalid(format!("{what} contains NUL")));
        }
        if arg.len() > warren_core::env::MAX_VAR_BYTES {
            return Err(ProcError::Invalid(format!(
                "{what} is too long: {} bytes, the limit is {} bytes (the kernel's \
                 largest single argument)",
                arg.len(),
                warren_core::env::MAX_VAR_BYTES
            )));
        }
    }
    Ok(())
}

/// An attached stream's read position; dropping it detaches the stream.
#[derive(Debug)]
pub struct Cursor {
    proc: Arc<Proc>,
    id: u64,
    from: u64,
}

impl Cursor {
    /// The process.
    pub fn proc(&self) -> &Arc<Proc> {
        &self.proc
    }

    /// The offset the stream started from.
    pub fn start(&self) -> u64 {
        self.from
    }

    /// The stream has sent everything before `offset`.
    pub fn advance(&self, offset: u64) {
        {
            let mut state = self.proc.state();
            if let Some(c) = state.cursors.get_mut(&self.id) {
                *c = offset;
            }
            let keep = state.slowest();
            state.log.trim(keep);
        }
        self.proc.space.notify_waiters();
    }
}

impl Drop for Cursor {
    fn drop(&mut self) {
        {
            let mut state = self.proc.state();
            state.cursors.remove(&self.id);
            let keep = state.slowest();
            state.log.trim(keep);
        }
        self.proc.space.notify_waiters();
    }
}

/// Every process envd started, running or recently finished.
#[derive(Debug)]
pub struct Manager {
    jail: Jail,
    /// The sandbox's environment (its create's `envVars`), under every
    /// process's own.
    base_env: std::collections::BTreeMap<String, String>,
    max_output_bytes: usize,
    keep_finished: usize,
    table: Mutex<Table>,
    seq: AtomicU64,
    /// envd's own log: process starts and ends (`crate::events`).
    events: Arc<crate::events::EventLog>,
}

#[derive(Debug, Default)]
struct Table {
    procs: HashMap<u32, Arc<Proc>>,
    /// Finished pids, oldest first; beyond `keep_finished` they are forgotten.
    finished: VecDeque<u32>,
}

impl Manager {
    /// An empty table.
    pub fn new(
        jail: Jail,
        base_env: std::collections::BTreeMap<String, String>,
        max_output_bytes: usize,
        keep_finished: usize,
    ) -> Arc<Manager> {
        Arc::new(Manager {
            jail,
            base_env,
            max_output_bytes,
            keep_finished,
            table: Mutex::new(Table::default()),
            seq: AtomicU64::new(0),
            events: Arc::new(crate::events::EventLog::new()),
        })
    }

    /// envd's own log, which this table writes process starts and ends to.
    pub fn events(&self) -> &Arc<crate::events::EventLog> {
        &self.events
    }

    fn table(&self) -> MutexGuard<'_, Table> {
        self.table.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// The command for `spec` as it runs in the sandbox: its user, working
    /// directory (checked), environment; stdio and process group are the
    /// caller's to set. Also the identity it runs as.
    pub fn command(
        &self,
        spec: &Spec,
    ) -> Result<(tokio::process::Command, Option<crate::users::Identity>), ProcError> {
        check_spec(spec)?;
        let identity = self.jail.users().lookup(spec.user.as_deref())?;
        // The template's working directory for its user; otherwise a
        // user's own home, as on a login.
        let default_cwd = self
            .jail
            .users()
            .default_cwd(spec.user.as_deref())
            .or(identity.as_ref().map(|i| i.home.as_str()))
            .unwrap_or("");
        let cwd = self.jail.resolve_for(
            spec.cwd.as_deref().unwrap_or(default_cwd),
            Follow::All,
            identity.as_ref(),
        )?;
        if !cwd.host.is_dir() {
            return Err(ProcError::Cwd(cwd.client));
        }
        let home = match &identity {
            Some(i) => std::path::PathBuf::from(&i.home),
            None => self.jail.home_host(),
        };
        let mut cmd = tokio::process::Command::new(&spec.cmd);
        if let Some(id) = &identity {
            // std drops supplementary groups too (setgroups) when envd is root.
            cmd.uid(id.uid).gid(id.gid);
        }
        cmd.args(&spec.args)
            .env_clear()
            .envs(self.environment(spec, &home))
            .current_dir(&cwd.host);
        Ok((cmd, identity))
    }

    /// Starts a process; its output is recorded from the first byte, and
    /// the returned cursor (at offset 0) holds it for the starting client.
    pub fn start(self: &Arc<Self>, spec: Spec) -> Result<Cursor, ProcError> {
        let (mut cmd, identity) = self.command(&spec)?;
        let pty = match spec.pty {
            Some(size) => Some(self.attach_pty(&mut cmd, size, identity.as_ref())?),
            None => {
                cmd.stdin(if spec.stdin {
                    Stdio::piped()
                } else {
                    Stdio::null()
                })
                .stdout(Stdio::piped())
                .stderr(Stdio::piped())
                // Its own group, so signals reach what it spawns too.
                .process_group(0);
                None
            }
        };
        let spawned = cmd.spawn();
        // Closes our copies of the terminal's slave side: the master reads
        // EIO (the end) only once no slave descriptor is left open.
        drop(cmd);
        let mut child = spawned.map_err(|source| ProcError::Spawn {
            cmd: spec.cmd.clone(),
            source,
        })?;
        let pid = child.id().ok_or_else(|| ProcError::Spawn {
            cmd: spec.cmd.clone(),
            source: std::io::Error::other("process exited before its pid was known"),
        })?;
        let mut fields = vec![
            ("pid", pid.to_string()),
            (
                "cmd",
                std::iter::once(spec.cmd.as_str())
                    .chain(spec.args.iter().map(String::as_str))
                    .collect::<Vec<_>>()
                    .join(" "),
            ),
            (
                "user",
                identity
                    .as_ref()
                    .map(|i| i.name.clone())
                    .or_else(|| spec.user.clone())
                    .unwrap_or_default(),
            ),
        ];
        if let Some(tag) = &spec.tag {
            fields.push(("tag", tag.clone()));
        }
        if spec.pty.is_some() {
            fields.push(("pty", "true".into()));
        }
        self.events
            .record("info", "process", "Process started", fields);
        let (changed, _) = watch::channel(());
        let (exited_tx, exited_rx) = watch::channel(false);
        let proc = Arc::new(Proc {
            pid,
            tag: spec.tag.clone(),
            seq: self.seq.fetch_add(1, Ordering::Relaxed),
            spec,
            state: Mutex::new(State {
                log: OutputLog::new(self.max_output_bytes),
                exit: None,
                cursors: HashMap::new(),
                next_cursor: 0,
            }),
            changed,
            space: Notify::new(),
            exited: AtomicBool::new(false),
            signalled: AtomicBool::new(false),
            stdin: tokio::sync::Mutex::new(child.stdin.take()),
            pty: pty.clone(),
            reaped: exited_rx.clone(),
        });
        self.table().procs.insert(pid, proc.clone());
        // Attached before the readers start, so not a byte can be evicted
        // before the starting client has it.
        let cursor = Cursor {
            proc: proc.clone(),
            id: 0,
            from: 0,
        };
        {
            let mut state = proc.state();
            state.cursors.insert(0, 0);
            state.next_cursor = 1;
        }

        let out = match &pty {
            Some(master) => Some(spawn_reader(
                proc.clone(),
                master.reader(),
                Pipe::Pty,
                exited_rx.clone(),
            )),
            None => child
                .stdout
                .take()
                .map(|s| spawn_reader(proc.clone(), s, Pipe::Stdout, exited_rx.clone())),
        };
        let err = child
            .stderr
            .take()
            .map(|s| spawn_reader(proc.clone(), s, Pipe::Stderr, exited_rx));
        let manager = self.clone();
        let p = proc.clone();
        tokio::spawn(async move {
            let exit = match child.wait().await {
                Ok(status) => {
                    let mut exit = exit_of(status);
                    if status.signal() == Some(libc::SIGKILL)
                        && !p.signalled.load(Ordering::Acquire)
                    {
                        exit.error = Some(
                            "killed by SIGKILL, which envd did not send: most likely the \
                             sandbox reached its memory limit and the kernel's out-of-memory \
                             killer chose this process"
                                .to_string(),
                        );
                    }
                    exit
                }
                Err(e) => Exit {
                    exit_code: -1,
                    exited: false,
                    status: "unknown".to_string(),
                    error: Some(format!("waiting for the process: {e}")),
                },
            };
            p.exited.store(true, Ordering::Release);
            let _ = exited_tx.send(true);
            p.stdin.lock().await.take();
            // The readers finish what the process wrote (see `pipe`); only
            // then is the output complete and the end event due.
            for reader in [out, err].into_iter().flatten() {
                let _ = reader.await;
            }
            let level = match (&exit.error, exit.exit_code) {
                (Some(_), _) => "error",
                (None, 0) => "info",
                _ => "warn",
            };
            let mut fields = vec![
                ("pid", p.pid.to_string()),
                ("status", exit.status.clone()),
                ("exit_code", exit.exit_code.to_string()),
            ];
            if let Some(e) = &exit.error {
                fields.push(("error", e.clone()));
            }
            manager
                .events
                .record(level, "process", "Process exited", fields);
            p.state().exit = Some(exit);
            p.notify();
            manager.finished(p.pid);
        });
        Ok(cursor)
    }

    /// Gives the process a new terminal of `size` as stdin, stdout, stderr
    /// and controlling terminal; returns the master side.
    fn attach_pty(
        &self,
        cmd: &mut tokio::process::Command,
        size: super::pty::Size,
        identity: Option<&crate::users::Identity>,
    ) -> Result<super::pty::Master, ProcError> {
        let failed = |e: std::io::Error| ProcError::Pty(format!("cannot open a PTY: {e}"));
        let (master, slave) = super::pty::open(size).map_err(failed)?;
        if let Some(id) = identity {
            // The terminal belongs to its user, as login gives it: programs
            // that reopen it (by /proc/self/fd/0 or its /dev/pts name) may.
            rustix::fs::fchown(
                &slave,
                Some(rustix::fs::Uid::from_raw(id.uid)),
                Some(rustix::fs::Gid::from_raw(id.gid)),
            )
            .map_err(|e| failed(e.into()))?;
        }
        let out = slave.try_clone().map_err(failed)?;
        let err = slave.try_clone().map_err(failed)?;
        cmd.stdin(Stdio::from(slave))
            .stdout(Stdio::from(out))
            .stderr(Stdio::from(err));
        warren_sys::controlling_terminal_from_stdin(cmd.as_std_mut());
        Ok(master)
    }

    /// Sandbox processes get a small default environment, then envd's own
    /// (minus its `WARREN_ENVD_*` settings; the node puts the sandbox's env
    /// vars there), then HOME and USER of the sandbox user, then what the
    /// request asked for.
    fn environment(&self, spec: &Spec, home: &std::path::Path) -> HashMap<String, String> {
        let mut env: HashMap<String, String> = [
            ("PATH", DEFAULT_PATH),
            ("SHELL", "/bin/bash"),
            ("LANG", "C.UTF-8"),
        ]
        .into_iter()
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .collect();
        // The mark the `process` runtime finds a sandbox's processes by.
        if let Ok(mark) = std::env::var(SANDBOX_MARK) {
            env.insert(SANDBOX_MARK.to_string(), mark);
        }
        env.extend(self.base_env.clone());
        let user = spec
            .user
            .clone()
            .unwrap_or_else(|| self.jail.users().default_name().to_string());
        env.insert("HOME".to_string(), home.to_string_lossy().into_owned());
        env.insert("USER".to_string(), user.clone());
        env.insert("LOGNAME".to_string(), user);
        env.extend(spec.envs.clone());
        env
    }

    fn finished(&self, pid: u32) {
        let mut table = self.table();
        table.finished.push_back(pid);
        while table.finished.len() > self.keep_finished {
            let Some(old) = table.finished.pop_front() else {
                break;
            };
            // The pid may have been reused by a newer, running process.
            if table.procs.get(&old).is_some_and(|p| !p.running()) {
                table.procs.remove(&old);
            }
        }
    }

    /// The process with this pid, running or recently finished.
    pub fn by_pid(&self, pid: u32) -> Result<Arc<Proc>, ProcError> {
        self.table()
            .procs
            .get(&pid)
            .cloned()
            .ok_or_else(|| ProcError::NotFound(format!("with pid {pid}")))
    }

    /// The newest process with this tag, preferring running ones.
    pub fn by_tag(&self, tag: &str) -> Result<Arc<Proc>, ProcError> {
        self.table()
            .procs
            .values()
            .filter(|p| p.tag.as_deref() == Some(tag))
            .max_by_key(|p| (p.running(), p.seq))
            .cloned()
            .ok_or_else(|| ProcError::NotFound(format!("with tag {tag:?}")))
    }

    /// The running processes, oldest first.
    pub fn running(&self) -> Vec<Arc<Proc>> {
        let mut procs: Vec<_> = self
            .table()
            .procs
            .values()
            .filter(|p| p.running())
            .cloned()
            .collect();
        procs.sort_by_key(|p| p.seq);
        procs
    }

    /// SIGKILLs every running process group (envd is going away; nothing it
    /// started should outlive it).
    pub fn kill_all(&self) {
        for p in self.running() {
            let _ = p.signal(Signal::SIGKILL);
        }
    }
}
