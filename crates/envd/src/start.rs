//! The template's start command: started once when envd starts, as the
//! template's user in its working directory, like any process a client
//! starts (it is listed, tagged `start_cmd`, and its output is kept); then
//! its ready command is run again and again until it exits 0.
//!
//! The node asks `GET /warren/start` (with the access token) until the
//! answer is `ready` or `failed`, so a create returns only once the
//! sandbox is ready (docs/sandboxes.md, "Start and ready commands").
//!
//! The start command gets [`TOKEN_DIGEST_ENV`]: the SHA-256 of the
//! sandbox's access token, so a server it starts can check the token
//! clients send (the code interpreter's `/execute` does) without holding
//! the token itself.

use crate::process::manager::{Manager, Spec};
use serde::{Deserialize, Serialize};
use std::process::Stdio;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// The tag the start command's process carries.
pub const TAG: &str = "start_cmd";

/// The start command's variable holding the hex SHA-256 of the sandbox's
/// access token (absent when it has none).
pub const TOKEN_DIGEST_ENV: &str = "WARREN_ACCESS_TOKEN_SHA256";

/// How often the ready command runs until it succeeds.
const READY_INTERVAL: Duration = Duration::from_millis(50);

/// The longest one ready check may run.
const CHECK_TIMEOUT: Duration = Duration::from_secs(10);

/// How much of a failing command's output an answer quotes.
const TAIL_BYTES: usize = 2048;

/// What the node sends (on envd's stdin) when the template has a start
/// command.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StartCommand {
    /// A shell command line (run with `bash -l -c`).
    pub cmd: String,
    /// A shell command line: ready once it exits 0. Empty: ready once the
    /// start command has started.
    #[serde(default)]
    pub ready_cmd: String,
    /// Who runs both (default `user`).
    #[serde(default)]
    pub user: Option<String>,
    /// Where (default that user's home).
    #[serde(default)]
    pub cwd: Option<String>,
    /// How long the ready command may keep failing before the start counts
    /// as failed.
    pub timeout_secs: u64,
}

/// Where the start is, as `GET /warren/start` answers it
/// (`{"state": "starting" | "ready" | "failed" | "none", ...}`).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
#[serde(tag = "state", rename_all = "lowercase")]
pub enum StartState {
    /// The template has no start command.
    None,
    /// Started; the ready command has not succeeded yet.
    Starting {
        /// What the last ready check said, if one ran.
        #[serde(default, skip_serializing_if = "Option::is_none")]
        last_check: Option<String>,
    },
    /// Ready (the start command's pid).
    Ready { pid: u32 },
    /// It will not become ready; the message says why.
    Failed { message: String },
}

/// Starts `start` and follows it until it is ready or has failed; the
/// receiver always holds where it is. `token` is the sandbox's access token.
pub fn spawn(
    manager: Arc<Manager>,
    start: StartCommand,
    token: Option<&str>,
) -> watch::Receiver<StartState> {
    let (tx, rx) = watch::channel(StartState::Starting { last_check: None });
    let digest = token.map(|t| {
        use sha2::Digest;
        sha2::Sha256::digest(t.as_bytes())
            .iter()
            .map(|b| format!("{b:02x}"))
            .collect::<String>()
    });
    tokio::spawn(async move {
        let end = run(&manager, &start, digest, &tx).await;
        match &end {
            StartState::Failed { message } => {
                tracing::error!(%message, "the start command failed");
                manager.events().record(
                    "error",
                    "envd",
                    "Start command failed",
                    [("error", message.clone())],
                );
            }
            _ => {
                tracing::info!("the start command is ready");
                manager.events().record(
                    "info",
                    "envd",
                    "Start command ready",
                    [("cmd", start.cmd.clone())],
                );
            }
        }
        let _ = tx.send(end);
    });
    rx
}

async fn run(
    manager: &Arc<Manager>,
    start: &StartCommand,
    digest: Option<String>,
    tx: &watch::Sender<StartState>,
) -> StartState {
    let deadline = Instant::now() + Duration::from_secs(start.timeout_secs);
    let spec = Spec {
        cmd: "/bin/bash".into(),
        args: vec!["-l".into(), "-c".into(), start.cmd.clone()],
        user: start.user.clone(),
        cwd: start.cwd.clone(),
        tag: Some(TAG.into()),
        envs: digest
            .map(|d| (TOKEN_DIGEST_ENV.to_string(), d))
            .into_iter()
            .collect(),
        ..Spec::default()
    };
    let proc = match manager.start(spec) {
        // Nobody reads it live: the cursor goes, the output stays (bounded).
        Ok(cursor) => cursor.proc().clone(),
        Err(e) => {
            return StartState::Failed {
                message: format!("the start command could not be started: {e}"),
            }
        }
    };
    if start.ready_cmd.is_empty() {
        return StartState::Ready { pid: proc.pid };
    }
    loop {
        // One that exits with 0 may have left a daemon behind: keep checking.
        // (The state's lock is released before the output is read.)
        let exit = proc.state().exit.clone();
        if let Some(exit) = exit {
            if exit.exit_code != 0 {
                return StartState::Failed {
                    message: format!(
                        "the start command ended ({}) before it was ready; its last output: {}",
                        exit.status,
                        quote(&proc.output_tail(TAIL_BYTES))
                    ),
                };
            }
        }
        let left = deadline.saturating_duration_since(Instant::now());
        let last_check = match check(manager, start, left.min(CHECK_TIMEOUT)).await {
            Ok(()) => return StartState::Ready { pid: proc.pid },
            Err(why) => why,
        };
        if Instant::now() >= deadline {
            return StartState::Failed {
                message: format!(
                    "not ready within {}s: the ready command `{}` never succeeded (last: {}); \
                     the start command's last output: {}",
                    start.timeout_secs,
                    start.ready_cmd,
                    last_check,
                    quote(&proc.output_tail(TAIL_BYTES))
                ),
            };
        }
        let _ = tx.send(StartState::Starting {
            last_check: Some(last_check),
        });
        tokio::time::sleep(READY_INTERVAL).await;
    }
}

/// Runs the ready command once: Ok when it exits 0 within `within`.
async fn check(manager: &Manager, start: &StartCommand, within: Duration) -> Result<(), String> {
    let spec = Spec {
        cmd: "/bin/bash".into(),
        args: vec!["-c".into(), start.ready_cmd.clone()],
        user: start.user.clone(),
        cwd: start.cwd.clone(),
        ..Spec::default()
    };
    let (mut cmd, _) = manager.command(&spec).map_err(|e| e.to_string())?;
    cmd.stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .kill_on_drop(true);
    let child = cmd
        .spawn()
        .map_err(|e| format!("cannot run the ready command: {e}"))?;
    match tokio::time::timeout(within, child.wait_with_output()).await {
        Err(_) => Err(format!("still running after {within:?}")),
        Ok(Err(e)) => Err(format!("waiting for the ready command: {e}")),
        Ok(Ok(out)) if out.status.success() => Ok(()),
        Ok(Ok(out)) => {
            let stderr = String::from_utf8_lossy(&out.stderr);
            let mut why = format!("{}", out.status);
            if !stderr.trim().is_empty() {
                why.push_str(&format!(": {}", stderr.trim()));
            }
            Err(why.chars().take(TAIL_BYTES).collect())
        }
    }
}

/// Output for a one-line message: quoted, or `(none)`.
fn quote(text: &str) -> String {
    let t = text.trim();
    if t.is_empty() {
        "(none)".into()
    } else {
        format!("{t:?}")
    }
}
