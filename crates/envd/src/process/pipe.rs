//! Reading a process's stdout or stderr into its output log.
//!
//! Two rules shape the loop:
//!
//! - **Backpressure.** Output an attached stream has not sent yet is never
//!   evicted to make room: the reader waits (and the process blocks on its
//!   pipe, as it would writing to a slow terminal). A stream that makes no
//!   progress for [`STALL_LIMIT`] loses that protection for the chunk at
//!   hand, so one stuck client cannot freeze a process forever; it learns
//!   what it lost from an `out_of_range` error.
//! - **Draining after exit.** What the process wrote before it exited is
//!   still in the pipe and must all reach the log before the end event. But
//!   a background child can keep the pipe open (and even keep writing)
//!   forever, so after the exit a reader stops at the first read that stays
//!   empty for [`DRAIN_QUIET`], or after [`DRAIN_MAX_BYTES`].

use super::manager::Proc;
use super::output::Pipe;
use bytes::BytesMut;
use std::sync::Arc;
use std::time::Duration;
use tokio::io::{AsyncRead, AsyncReadExt};
use tokio::sync::watch;
use tokio::time::Instant;

/// Bytes read from a pipe at once.
const READ_CHUNK: usize = 32 * 1024;

/// How long a reader holds output back for a stream that does not move.
pub const STALL_LIMIT: Duration = Duration::from_secs(10);

/// After the exit, a read that brings nothing for this long ends the output.
pub const DRAIN_QUIET: Duration = Duration::from_millis(250);

/// After the exit, at most this much more is read (more than any pipe buffer
/// holds; the rest can only come from a child still running in the background).
pub const DRAIN_MAX_BYTES: usize = 4 * 1024 * 1024;

/// Reads `pipe` into `proc`'s log until EOF (or the drain rules stop it).
pub fn spawn_reader(
    proc: Arc<Proc>,
    mut pipe: impl AsyncRead + Unpin + Send + 'static,
    which: Pipe,
    mut exited: watch::Receiver<bool>,
) -> tokio::task::JoinHandle<()> {
    tokio::spawn(async move {
        let mut buf = BytesMut::with_capacity(READ_CHUNK);
        let mut after_exit = 0usize;
        // False if the waiter went away without a word (runtime shutdown):
        // then just read to EOF.
        let mut watching = true;
        loop {
            buf.reserve(READ_CHUNK);
            let read = if *exited.borrow() {
                if after_exit >= DRAIN_MAX_BYTES {
                    break;
                }
                match tokio::time::timeout(DRAIN_QUIET, pipe.read_buf(&mut buf)).await {
                    Ok(r) => r,
                    Err(_) => break,
                }
            } else {
                tokio::select! {
                    // `read_buf` is cancel safe: nothing is lost when the
                    // exit wins the race; the next turn reads it.
                    r = pipe.read_buf(&mut buf) => r,
                    changed = exited.changed(), if watching => {
                        watching = changed.is_ok();
                        continue;
                    }
                }
            };
            match read {
                Ok(0) | Err(_) => break,
                Ok(n) => {
                    if *exited.borrow() {
                        after_exit += n;
                    }
                    let data = buf.split().freeze();
                    push(&proc, which, data).await;
                }
            }
        }
    })
}

/// Appends `data`, first waiting (up to [`STALL_LIMIT`] without progress)
/// until it fits without evicting what an attached stream still needs.
async fn push(proc: &Proc, which: Pipe, data: bytes::Bytes) {
    let mut deadline = Instant::now() + STALL_LIMIT;
    loop {
        let notified = proc.space.notified();
        tokio::pin!(notified);
        // Register before checking, so a cursor moving in between still wakes us.
        notified.as_mut().enable();
        {
            let mut state = proc.state();
            if state.fits(data.len()) {
                let keep = state.slowest();
                state.log.push_keeping(which, data, keep);
                break;
            }
            if Instant::now() >= deadline {
                // Stalled stream: it loses the oldest bytes, not the process its pace.
                state.log.push(which, data);
                break;
            }
        }
        if tokio::time::timeout_at(deadline, notified).await.is_ok() {
            // Progress: a stream moved, so the stall clock restarts.
            deadline = Instant::now() + STALL_LIMIT;
        }
    }
    proc.notify();
}
