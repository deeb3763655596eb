//! The event stream of one process for one client: `start`, then output
//! from a byte offset (replayed from the log, then live), then `end`, with
//! `keepalive` events whenever the stream has been quiet for an interval.
//!
//! The stream is fed by its own task through a small channel. When the
//! client goes away the channel closes and the task stops; the process is not
//! affected.

use super::exit::Exit;
use super::manager::Cursor;
use super::output::{Chunk, Pipe};
use connectrpc::ConnectError;
use futures_util::Stream;
use std::time::Duration;
use tokio::sync::mpsc;
use tokio::time::{Instant, MissedTickBehavior};
use tokio_stream::wrappers::ReceiverStream;
use warren_envd_proto::process::process_event::{
    data_event, DataEvent, EndEvent, KeepAlive, StartEvent,
};
use warren_envd_proto::process::ProcessEvent;

/// How much output one read takes from the log before sending it.
const READ_BATCH: usize = 1024 * 1024;

/// The events of the process `cursor` is attached to, from its offset on.
pub fn events(
    cursor: Cursor,
    keepalive: Duration,
) -> impl Stream<Item = Result<ProcessEvent, ConnectError>> + Send + 'static {
    let (tx, rx) = mpsc::channel(16);
    tokio::spawn(pump(cursor, keepalive, tx));
    ReceiverStream::new(rx)
}

type Tx = mpsc::Sender<Result<ProcessEvent, ConnectError>>;

async fn pump(attached: Cursor, keepalive: Duration, tx: Tx) {
    let proc = attached.proc().clone();
    // Subscribe before the first read so no change between the two is missed.
    let mut changed = proc.subscribe();
    let start = StartEvent {
        pid: proc.pid,
        ..Default::default()
    };
    if send(&tx, event(start)).await.is_err() {
        return;
    }
    let mut tick = tokio::time::interval_at(Instant::now() + keepalive, keepalive);
    tick.set_missed_tick_behavior(MissedTickBehavior::Delay);
    let mut cursor = attached.start();
    loop {
        let read = {
            let state = proc.state();
            state
                .log
                .read_from(cursor, READ_BATCH)
                .map(|chunks| (chunks, state.log.end(), state.exit.clone()))
        };
        let (chunks, end, exit) = match read {
            Ok(read) => read,
            Err(e) => {
                // A client this far behind lost output; say so rather than
                // silently skip it. It can reconnect from the oldest offset.
                let _ = tx
                    .send(Err(ConnectError::out_of_range(e.to_string())))
                    .await;
                return;
            }
        };
        let sent_any = !chunks.is_empty();
        for chunk in chunks {
            cursor = chunk.offset + chunk.data.len() as u64;
            if send(&tx, event(data(chunk))).await.is_err() {
                return;
            }
            attached.advance(cursor);
        }
        if sent_any {
            tick.reset();
        }
        if cursor < end {
            continue;
        }
        // The exit is recorded only after all output is in the log, so
        // having read up to `end` with an exit present means we are done.
        if let Some(exit) = exit {
            let _ = send(&tx, event(end_event(exit))).await;
            return;
        }
        tokio::select! {
            _ = tx.closed() => return,
            res = changed.changed() => {
                if res.is_err() {
                    return;
                }
            }
            _ = tick.tick() => {
                if send(&tx, event(KeepAlive::default())).await.is_err() {
                    return;
                }
            }
        }
    }
}

async fn send(tx: &Tx, ev: ProcessEvent) -> Result<(), ()> {
    tx.send(Ok(ev)).await.map_err(|_| ())
}

fn event(e: impl Into<Option<warren_envd_proto::process::process_event::Event>>) -> ProcessEvent {
    ProcessEvent {
        event: e.into(),
        ..Default::default()
    }
}

fn data(chunk: Chunk) -> DataEvent {
    let bytes = chunk.data.to_vec();
    DataEvent {
        output: Some(match chunk.pipe {
            Pipe::Stdout => data_event::Output::Stdout(bytes),
            Pipe::Stderr => data_event::Output::Stderr(bytes),
            Pipe::Pty => data_event::Output::Pty(bytes),
        }),
        ..Default::default()
    }
}

fn end_event(exit: Exit) -> EndEvent {
    EndEvent {
        exit_code: exit.exit_code,
        exited: exit.exited,
        status: exit.status,
        error: exit.error,
        ..Default::default()
    }
}
