//! Starting a `warren` process and waiting for its announce lines; stopping
//! it with a bounded wait.

use anyhow::Context;
use nix::sys::signal::Signal;
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::io::{AsyncBufReadExt, BufReader};
use tokio::process::{Child, Command};

/// How long a process may take to announce its listeners.
pub const START_TIMEOUT: Duration = Duration::from_secs(60);

/// Set on a child so it stops when its parent dies, even by SIGKILL (which
/// the parent cannot forward): the binary watches its parent when this is set.
pub const EXIT_WITH_PARENT: &str = "WARREN_EXIT_WITH_PARENT";

/// Stdout lines kept per process beyond the announce lines.
const MAX_LINES: usize = 10_000;

/// What to start; see the crate doc.
#[derive(Debug, Clone)]
pub struct Launch {
    /// The binary.
    exe: PathBuf,
    /// Its arguments (the same on every restart).
    args: Vec<String>,
    /// Extra environment.
    envs: Vec<(String, String)>,
    /// Announce lines to wait for (`"gateway http"`, ...).
    wait_for: Vec<String>,
    /// A file its stderr is appended to; `None` inherits ours.
    log: Option<PathBuf>,
    /// Names it in messages.
    label: String,
}

impl Launch {
    /// `exe args...`, stderr inherited, waiting for nothing.
    pub fn new<S: AsRef<str>>(exe: &Path, args: &[S]) -> Launch {
        let args: Vec<String> = args.iter().map(|a| a.as_ref().to_string()).collect();
        Launch {
            label: format!("{} {}", exe.display(), args.join(" ")),
            exe: exe.to_path_buf(),
            args,
            envs: Vec::new(),
            wait_for: Vec::new(),
            log: None,
        }
    }

    /// Names the process in messages (default: its command line).
    pub fn label(mut self, label: &str) -> Self {
        self.label = label.to_string();
        self
    }

    /// Sets `key=value` in its environment.
    pub fn env(mut self, key: &str, value: &str) -> Self {
        self.envs.push((key.to_string(), value.to_string()));
        self
    }

    /// The process stops when this one dies (see [`EXIT_WITH_PARENT`]).
    pub fn exit_with_parent(self) -> Self {
        self.env(EXIT_WITH_PARENT, "1")
    }

    /// Waits for these announce lines before [`Launch::spawn`] returns.
    pub fn wait_for(mut self, what: &[&str]) -> Self {
        self.wait_for = what.iter().map(|w| w.to_string()).collect();
        self
    }

    /// Appends its stderr to `path` (kept across restarts).
    pub fn log_to(mut self, path: &Path) -> Self {
        self.log = Some(path.to_path_buf());
        self
    }

    /// The label.
    pub fn name(&self) -> &str {
        &self.label
    }

    /// Starts the process and waits until it announced every listener it
    /// waits for, within [`START_TIMEOUT`].
    pub async fn spawn(&self) -> anyhow::Result<Proc> {
        let label = &self.label;
        let stderr = match &self.log {
            Some(path) => Stdio::from(
                std::fs::OpenOptions::new()
                    .create(true)
                    .append(true)
                    .open(path)
                    .with_context(|| format!("cannot open {}", path.display()))?,
            ),
            None => Stdio::inherit(),
        };
        let mut cmd = Command::new(&self.exe);
        cmd.args(&self.args)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(stderr)
            .kill_on_drop(true);
        // A session of its own: no part holds the terminal this was started
        // from as its controlling terminal, so nothing a part (or a sandbox
        // under it) runs can type into it or signal it. Ctrl-C there reaches
        // only the process that started the parts, which stops them.
        warren_sys::new_session(cmd.as_std_mut());
        for (k, v) in &self.envs {
            cmd.env(k, v);
        }
        let mut child = cmd
            .spawn()
            .with_context(|| format!("cannot start {label}"))?;
        let stdout = child
            .stdout
            .take()
            .with_context(|| format!("no stdout from {label}"))?;
        let mut reader = BufReader::new(stdout).lines();
        let mut addrs = HashMap::new();
        let lines = Arc::new(Mutex::new(Vec::new()));
        let see_log = match &self.log {
            Some(path) => format!("see {}", path.display()),
            None => "its log is above".to_string(),
        };
        let deadline = tokio::time::Instant::now() + START_TIMEOUT;
        while !self.wait_for.iter().all(|w| addrs.contains_key(w)) {
            let line = match tokio::time::timeout_at(deadline, reader.next_line()).await {
                Err(_) => anyhow::bail!(
                    "{label} did not announce {:?} within {START_TIMEOUT:?}; saw {addrs:?}",
                    self.wait_for
                ),
                Ok(Err(e)) => anyhow::bail!("reading {label}'s output: {e}"),
                Ok(Ok(None)) => {
                    let status = child.wait().await?;
                    anyhow::bail!("{label} exited ({status}) while starting; {see_log}");
                }
                Ok(Ok(Some(line))) => line,
            };
            match warren_core::parse_announce(&line) {
                Some((what, addr)) => {
                    addrs.insert(what.to_string(), addr.to_string());
                }
                None => push(&lines, line),
            }
        }
        // Keep reading (later lines, and so it never blocks on a full pipe).
        let sink = lines.clone();
        tokio::spawn(async move {
            while let Ok(Some(line)) = reader.next_line().await {
                push(&sink, line);
            }
        });
        Ok(Proc {
            child,
            addrs,
            lines,
            label: label.clone(),
        })
    }
}

fn push(lines: &Mutex<Vec<String>>, line: String) {
    if let Ok(mut v) = lines.lock() {
        if v.len() < MAX_LINES {
            v.push(line);
        }
    }
}

/// A running process; killed when dropped.
pub struct Proc {
    /// The child; `kill_on_drop` is set.
    pub child: Child,
    /// `"<component> <name>"` → address, from its announce lines.
    pub addrs: HashMap<String, String>,
    /// Every other line it printed on stdout (e.g. `node runtime bwrap`).
    pub lines: Arc<Mutex<Vec<String>>>,
    /// Names it in messages.
    pub label: String,
}

/// How a process ended after [`Proc::wait_exit`] or [`Proc::terminate`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Exit {
    /// How long the wait took.
    pub took: Duration,
    /// It exited by itself within the wait (else it was SIGKILLed).
    pub on_its_own: bool,
    /// Its exit code, when it exited by itself with one.
    pub code: Option<i32>,
}

impl Proc {
    /// The address announced as `what`.
    ///
    /// # Panics
    /// When `what` was not announced: [`Launch::wait_for`] guarantees the
    /// names it waited for, so asking for another is a bug in the caller.
    pub fn addr(&self, what: &str) -> String {
        match self.addrs.get(what) {
            Some(a) => a.clone(),
            None => panic!(
                "{} announced no {what:?}; it did announce {:?}",
                self.label, self.addrs
            ),
        }
    }

    /// The OS process id, while it runs.
    pub fn pid(&self) -> Option<u32> {
        self.child.id()
    }

    /// The lines it printed that were not announce lines.
    pub fn lines(&self) -> Vec<String> {
        self.lines.lock().map(|l| l.clone()).unwrap_or_default()
    }

    /// Sends `signal` (no wait).
    pub fn signal(&self, signal: Signal) {
        if let Some(pid) = self.pid().and_then(|p| i32::try_from(p).ok()) {
            let _ = nix::sys::signal::kill(nix::unistd::Pid::from_raw(pid), signal);
        }
    }

    /// SIGKILL, then reaps it.
    pub async fn kill9(&mut self) {
        let _ = self.child.kill().await;
    }

    /// Waits up to `within` for the process to exit by itself; SIGKILLs it
    /// after that.
    pub async fn wait_exit(&mut self, within: Duration) -> Exit {
        let started = tokio::time::Instant::now();
        match tokio::time::timeout(within, self.child.wait()).await {
            Ok(status) => Exit {
                took: started.elapsed(),
                on_its_own: true,
                code: status.ok().and_then(|s| s.code()),
            },
            Err(_) => {
                let _ = self.child.kill().await;
                Exit {
                    took: started.elapsed(),
                    on_its_own: false,
                    code: None,
                }
            }
        }
    }

    /// SIGTERM, then [`Proc::wait_exit`].
    pub async fn terminate(&mut self, within: Duration) -> Exit {
        self.signal(Signal::SIGTERM);
        self.wait_exit(within).await
    }
}
