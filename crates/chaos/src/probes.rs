//! The four probes, each run in a loop per entry point until told to stop.
//!
//! - `list`: `GET /sandboxes` on a fresh connection, one attempt; ok when the
//!   JSON lists a known sandbox.
//! - `command`: a command through a pooled client, one attempt, no resume,
//!   reading a counter a background loop bumps inside a sandbox; ok when the
//!   answer comes from that sandbox (its id file, and under the isolated runtime its
//!   hostname, which is its id) and the counter has not gone backwards.
//! - `workflow`: create (with an `Idempotency-Key`, retried by the client) →
//!   command → delete; its outcome is always known in the end (see
//!   [`crate::reconcile`]).
//! - `stream`: one long-running numbered command through the resumable
//!   client; ok when the assembled output is exactly the sequence.

use crate::record::{Finished, Recorder};
use std::collections::HashMap;
use std::sync::{Arc, RwLock};
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use warren_client::{Client, ClientError, Command, NewSandbox, Sandbox};

/// What every loop shares.
#[derive(Clone)]
pub struct Ctx {
    pub rec: Arc<Recorder>,
    /// Turns true when the loops must stop.
    pub stop: watch::Receiver<bool>,
    pub interval: Duration,
    /// Most probes one loop runs.
    pub max_probes: u64,
    /// Per-probe timeout (beyond it the probe failed).
    pub timeout: Duration,
    /// The nodes run the isolated runtime: a sandbox's hostname is its id.
    pub bwrap: bool,
    /// This run's id (metadata on every sandbox it creates).
    pub run: String,
}

/// A sandbox command probes read.
#[derive(Debug, Clone)]
pub struct Target {
    /// The node it was placed on.
    pub node: String,
    pub sandbox: Sandbox,
    /// Its node was killed: clear refusals are correct answers.
    pub lost: bool,
}

/// The command probes' targets, by node (replaced when a node comes back).
pub type Targets = Arc<RwLock<HashMap<String, Target>>>;

/// Where the background counter and the id file live (the sandbox's home:
/// its own under both runtimes).
pub const COUNTER_SETUP: &str = "echo \"$WARREN_CHAOS_ID\" > $HOME/.chaos-id; i=0; \
     while true; do i=$((i+1)); echo $i > $HOME/.chaos-counter.tmp; \
     mv $HOME/.chaos-counter.tmp $HOME/.chaos-counter; sleep 0.1; done";

const READ_COUNTER: &str =
    "cat /proc/sys/kernel/hostname; cat $HOME/.chaos-id; cat $HOME/.chaos-counter";

/// Runs `probe` every `ctx.interval` until stopped or `max_probes` ran.
async fn every<F, Fut>(ctx: &Ctx, mut probe: F)
where
    F: FnMut(u64) -> Fut,
    Fut: std::future::Future<Output = ()>,
{
    let mut stop = ctx.stop.clone();
    let mut next = Instant::now();
    for n in 0..ctx.max_probes {
        if *stop.borrow() {
            return;
        }
        probe(n).await;
        next += ctx.interval;
        let now = Instant::now();
        if next < now {
            next = now;
        }
        tokio::select! {
            _ = tokio::time::sleep_until(next) => {}
            _ = stop.changed() => return,
        }
    }
}

/// `list` probes through `entry` (`name` is `l4`/`l7`).
pub async fn list_loop(ctx: Ctx, name: String, client: Client, anchor: String) {
    every(&ctx, |_| async {
        let t = ctx.rec.now_ms();
        let started = Instant::now();
        let result = tokio::time::timeout(ctx.timeout, client.list()).await;
        let f = match result {
            Err(_) => Finished::failed("timeout", format!("no answer within {:?}", ctx.timeout)),
            Ok(Err(e)) => Finished::failed(e.kind(), e.to_string()),
            Ok(Ok(list)) if list.iter().any(|s| s.sandbox_id == anchor) => {
                Finished::ok(format!("{} sandboxes", list.len()))
            }
            Ok(Ok(list)) => Finished::failed(
                "anchor_missing",
                format!("{anchor} not among {} sandboxes", list.len()),
            ),
        };
        ctx.rec.push("list", &name, "", t, started.elapsed(), f);
    })
    .await
}

/// `command` probes through `entry` at the target on `node`.
pub async fn command_loop(ctx: Ctx, name: String, client: Client, targets: Targets, node: String) {
    // The highest counter seen per sandbox (probes of one loop run one at a time).
    let last: std::sync::Mutex<HashMap<String, u64>> = Default::default();
    every(&ctx, |_| {
        let target = targets.read().ok().and_then(|t| t.get(&node).cloned());
        let (ctx, client, name, node, last) = (&ctx, &client, &name, &node, &last);
        async move {
            let Some(target) = target else { return };
            let t = ctx.rec.now_ms();
            let started = Instant::now();
            let id = target.sandbox.sandbox_id.clone();
            let result = tokio::time::timeout(
                ctx.timeout,
                client.run_to_end(&target.sandbox, Command::shell(READ_COUNTER)),
            )
            .await;
            let f = match result {
                Err(_) => Finished::failed("timeout", format!("{id}: no answer")),
                Ok(Err(e)) if target.lost && is_clear_refusal(&e) => {
                    Finished::refused(e.kind(), format!("{id}: {e}"))
                }
                Ok(Err(e)) => Finished::failed(e.kind(), format!("{id}: {e}")),
                Ok(Ok(out)) => {
                    let text = String::from_utf8_lossy(&out.stdout).into_owned();
                    let lines: Vec<&str> = text.lines().collect();
                    let counter = lines.get(2).and_then(|c| c.trim().parse::<u64>().ok());
                    let mut last = last.lock().unwrap_or_else(|p| p.into_inner());
                    let prev = last.get(&id).copied().unwrap_or(0);
                    if lines.get(1).map(|l| l.trim()) != Some(id.as_str())
                        || (ctx.bwrap && lines.first().map(|l| l.trim()) != Some(id.as_str()))
                    {
                        Finished::failed("identity", format!("asked {id}, answered {text:?}"))
                    } else if let Some(c) = counter.filter(|c| *c >= prev) {
                        last.insert(id.clone(), c);
                        Finished::ok(format!("{id} counter={c}"))
                    } else {
                        Finished::failed(
                            "progress",
                            format!("{id}: counter {counter:?} after {prev}"),
                        )
                    }
                }
            };
            ctx.rec.push("command", name, node, t, started.elapsed(), f);
        }
    })
    .await
}

/// A refusal that tells the truth about a sandbox that is gone: its node
/// is down or unreachable, or it no longer exists.
fn is_clear_refusal(e: &ClientError) -> bool {
    matches!(e, ClientError::NodeDown { .. })
        || matches!(
            e.kind().as_str(),
            "node_down"
                | "upstream_unreachable"
                | "not_found"
                | "sandbox_not_found"
                | "stream_sandbox_not_found"
        )
}

/// A workflow whose outcome is settled at the end (see [`crate::reconcile`]).
#[derive(Debug, Clone)]
pub struct Pending {
    /// The record to update.
    pub index: usize,
    pub key: String,
}

/// `workflow` probes through `entry`: create → command → delete.
pub async fn workflow_loop(
    ctx: Ctx,
    name: String,
    client: Client,
    pending: Arc<std::sync::Mutex<Vec<Pending>>>,
) {
    every(&ctx, |n| {
        let (ctx, client, name, pending) = (&ctx, &client, &name, &pending);
        async move {
            let key = format!("{}-{name}-wf{n}", ctx.run);
            let t = ctx.rec.now_ms();
            let started = Instant::now();
            let (f, unsettled) = workflow(ctx, client, &key).await;
            let index = ctx.rec.push("workflow", name, "", t, started.elapsed(), f);
            if unsettled {
                if let Ok(mut p) = pending.lock() {
                    p.push(Pending { index, key });
                }
            }
        }
    })
    .await
}

/// One workflow; the flag says its outcome needs settling at the end (a
/// create or delete whose answer was lost).
async fn workflow(ctx: &Ctx, client: &Client, key: &str) -> (Finished, bool) {
    let mut new = NewSandbox::base(120);
    new.metadata.insert("chaos_run".into(), ctx.run.clone());
    new.metadata.insert("chaos_key".into(), key.to_string());
    let created = match tokio::time::timeout(ctx.timeout * 2, client.create(&new, key)).await {
        Err(_) => {
            return (
                Finished::failed("create:timeout", format!("key {key}")),
                true,
            )
        }
        Ok(Err(e)) => {
            let unsettled = e.outcome_unknown();
            return (
                Finished::failed(format!("create:{}", e.kind()), format!("key {key}: {e}")),
                unsettled,
            );
        }
        Ok(Ok(c)) => c,
    };
    let id = created.sandbox.sandbox_id.clone();
    let word = format!("workflow {key}");
    let ran = tokio::time::timeout(
        ctx.timeout,
        client.run_to_end(&created.sandbox, Command::shell(format!("echo '{word}'"))),
    )
    .await;
    let ran = match ran {
        Err(_) => Err("command:timeout".to_string()),
        Ok(Err(e)) => Err(format!("command:{}", e.kind())),
        Ok(Ok(out)) if String::from_utf8_lossy(&out.stdout).trim() == word => Ok(()),
        Ok(Ok(out)) => Err(format!(
            "command:wrong_output {:?}",
            String::from_utf8_lossy(&out.all)
        )),
    };
    let killed = tokio::time::timeout(ctx.timeout * 2, client.kill(&id)).await;
    let detail = format!(
        "key {key} sandbox {id} create_attempts {}",
        created.attempts
    );
    match (ran, killed) {
        (Ok(()), Ok(Ok(_))) => (Finished::ok(detail), false),
        (Err(e), Ok(Ok(_))) => (Finished::failed(e, format!("{detail}; deleted")), false),
        (ran, Ok(Err(e))) => {
            let why = match ran {
                Ok(()) => format!("delete:{}", e.kind()),
                Err(r) => format!("{r}; delete:{}", e.kind()),
            };
            (Finished::failed(why, format!("{detail}: {e}")), true)
        }
        (ran, Err(_)) => {
            let why = match ran {
                Ok(()) => "delete:timeout".to_string(),
                Err(r) => format!("{r}; delete:timeout"),
            };
            (Finished::failed(why, detail), true)
        }
    }
}

/// One long `stream` through the resumable client: `lines` numbered lines,
/// 20 a second.
pub async fn stream_once(ctx: Ctx, name: String, client: Client, sandbox: Sandbox, lines: u32) {
    let t = ctx.rec.now_ms();
    let started = Instant::now();
    let script =
        format!("i=0; while [ $i -lt {lines} ]; do i=$((i+1)); echo \"line $i\"; sleep 0.05; done");
    let expected: String = (1..=lines).map(|i| format!("line {i}\n")).collect();
    // Far more than the stream needs; only a wedged run reaches it.
    let bound = Duration::from_millis(u64::from(lines) * 50) * 3 + Duration::from_secs(60);
    let result = tokio::time::timeout(bound, async {
        let mut s = client.run(&sandbox, Command::shell(script)).await?;
        let mut resumed_at = Vec::new();
        let mut out = Vec::new();
        let mut exit = None;
        while let Some(ev) = s.next().await? {
            match ev {
                warren_client::StreamEvent::Stdout(b) | warren_client::StreamEvent::Stderr(b) => {
                    out.extend(b)
                }
                warren_client::StreamEvent::Resumed { entry, offset } => {
                    resumed_at.push(format!("{}ms@{offset}via{entry}", ctx.rec.now_ms()))
                }
                warren_client::StreamEvent::End(e) => exit = Some(e),
                warren_client::StreamEvent::Started { .. } => {}
            }
        }
        Ok::<_, ClientError>((out, exit, resumed_at))
    })
    .await;
    let f = match result {
        Err(_) => Finished::failed("timeout", format!("no end within {bound:?}")),
        Ok(Err(e)) => Finished::failed(e.kind(), e.to_string()),
        Ok(Ok((out, exit, resumed))) => {
            let detail = format!(
                "lines {lines} bytes {} resumes {} [{}]",
                out.len(),
                resumed.len(),
                resumed.join(" ")
            );
            if out == expected.as_bytes() && exit.as_ref().map(|e| e.exit_code) == Some(0) {
                Finished::ok(detail)
            } else {
                Finished::failed(
                    "incomplete",
                    format!(
                        "{detail}; got {} of {} bytes, exit {exit:?}",
                        out.len(),
                        expected.len()
                    ),
                )
            }
        }
    };
    ctx.rec.push("stream", &name, "", t, started.elapsed(), f);
}
