//! `WatchBindings`: the change log as a stream.
//!
//! One **hub** task tails the `changes` table — woken by writers through the
//! store's change signal (this process's commits, and on PostgreSQL every
//! replica's, via NOTIFY), with a slow poll as a backstop — and broadcasts each
//! new row to every subscriber, so N subscribers cost one query per change
//! batch, not N.
//!
//! A **subscriber** first subscribes to the broadcast, then reads the log's
//! bounds, sends HELLO (with `resync_required` when its `from_revision` is
//! older than what is retained, or newer than the head: another store's
//! history), replays `revision > from` from the table, and then forwards live
//! rows, skipping what the replay already sent. Subscribing before reading
//! closes the gap between the two: any row the hub broadcasts after the
//! subscription is in the receiver, any row before it is in the table.
//!
//! **Invariant:** a subscriber never silently misses a change. When it falls
//! behind the broadcast buffer it re-reads the gap from the table; if the gap
//! has been pruned, it gets a HELLO with `resync_required` instead.

use crate::metrics::Metrics;
use crate::route_view::RouteView;
use crate::service::convert;
use crate::store::{Change, ChangeBounds, SqlStore};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{broadcast, mpsc, watch};
use tokio_stream::wrappers::ReceiverStream;
use tonic::Status;
use warren_proto::scheduler::v1::{BindingChange, ChangeKind as PbKind};

/// Live rows buffered per subscriber before it counts as lagging.
const BROADCAST_CAPACITY: usize = 4096;
/// Rows per table read (hub tail and subscriber replay).
const READ_BATCH: u32 = 512;
/// Messages queued per stream towards tonic.
const STREAM_BUFFER: usize = 256;
/// The hub re-reads the table at least this often. Other replicas' commits
/// wake it through the store's change signal too (PostgreSQL LISTEN/NOTIFY,
/// `store::postgres`); this poll only bounds how late a lost notification
/// (or a second process on one SQLite file) can make it.
const POLL_BACKSTOP: Duration = Duration::from_secs(1);
/// Pause after a store error before the hub tries again.
const RETRY_PAUSE: Duration = Duration::from_millis(200);

/// The broadcast side of the change log. Cheap to clone.
#[derive(Clone)]
pub struct Hub {
    /// New change rows, in revision order.
    tx: broadcast::Sender<Arc<Change>>,
}

impl Hub {
    /// Reads the head of the log, then starts the tail task from there; it
    /// stops when `shutdown` flips to true. Call before serving: a
    /// subscriber must never see a head older than the hub's starting point.
    ///
    /// It keeps `view` ([`RouteView`]) exact: each batch of new rows is
    /// applied to the view before it is broadcast. The view's load starts
    /// here too, beside the tail, from the same head.
    pub async fn start(
        store: Arc<SqlStore>,
        view: Arc<RouteView>,
        shutdown: watch::Receiver<bool>,
    ) -> crate::error::Result<(Hub, tokio::task::JoinHandle<()>)> {
        let head = store.change_bounds().await?.head;
        view.start_at(head);
        let (tx, _) = broadcast::channel(BROADCAST_CAPACITY);
        let hub = Hub { tx: tx.clone() };
        let load = {
            let (store, view, stop) = (store.clone(), view.clone(), shutdown.clone());
            tokio::spawn(async move { view.load(&store, stop).await })
        };
        let task = tokio::spawn(async move {
            tail(store, view, tx, head, shutdown).await;
            load.abort();
        });
        Ok((hub, task))
    }

    /// A stream for one `WatchBindings` call.
    pub fn subscribe(
        &self,
        store: Arc<SqlStore>,
        from_revision: u64,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> ReceiverStream<Result<BindingChange, Status>> {
        let live = self.tx.subscribe();
        let (out, stream) = mpsc::channel(STREAM_BUFFER);
        tokio::spawn(async move {
            metrics.watch_subscribers(1);
            let mut sub = Subscriber {
                store,
                live,
                out,
                shutdown,
                metrics: metrics.clone(),
            };
            if let Err(Ended::Store(status)) = sub.run(from_revision).await {
                let _ = sub.out.try_send(Err(status));
            }
            metrics.watch_subscribers(-1);
        });
        ReceiverStream::new(stream)
    }
}

async fn tail(
    store: Arc<SqlStore>,
    view: Arc<RouteView>,
    tx: broadcast::Sender<Arc<Change>>,
    mut cursor: u64,
    mut shutdown: watch::Receiver<bool>,
) {
    let signal = store.change_signal();
    loop {
        if *shutdown.borrow() {
            return;
        }
        let pause = match forward_new(&store, &view, &tx, &mut cursor).await {
            Ok(()) => POLL_BACKSTOP,
            Err(e) => {
                tracing::warn!(error = %e, "watch hub cannot read the change log");
                RETRY_PAUSE
            }
        };
        tokio::select! {
            _ = signal.notified() => {}
            _ = tokio::time::sleep(pause) => {}
            r = shutdown.changed() => if r.is_err() { return },
        }
    }
}

/// Applies the rows after `cursor` to the view, then broadcasts them. A
/// batch the view could not apply is neither broadcast nor passed: the
/// next round reads it again.
async fn forward_new(
    store: &SqlStore,
    view: &RouteView,
    tx: &broadcast::Sender<Arc<Change>>,
    cursor: &mut u64,
) -> crate::error::Result<()> {
    loop {
        let batch: Vec<Arc<Change>> = store
            .changes_after(*cursor, READ_BATCH)
            .await?
            .into_iter()
            .map(Arc::new)
            .collect();
        let full = batch.len() == READ_BATCH as usize;
        view.follow(store, &batch).await?;
        for change in batch {
            *cursor = change.revision;
            // No receivers is fine: nobody is watching.
            let _ = tx.send(change);
        }
        if !full {
            return Ok(());
        }
    }
}

/// Whether a subscriber that has seen everything up to `seen` cannot be
/// brought up to date from the table.
fn needs_resync(seen: u64, b: ChangeBounds) -> bool {
    if seen > b.head {
        return true;
    }
    match b.oldest {
        Some(oldest) => seen.saturating_add(1) < oldest,
        None => seen < b.head,
    }
}

/// Why a subscriber stopped.
enum Ended {
    /// The client went away or the scheduler is shutting down.
    Gone,
    /// The store failed; the client gets this status and should reconnect.
    Store(Status),
}

impl From<crate::error::Error> for Ended {
    fn from(e: crate::error::Error) -> Self {
        Ended::Store(e.into())
    }
}

struct Subscriber {
    store: Arc<SqlStore>,
    /// Live rows from the hub.
    live: broadcast::Receiver<Arc<Change>>,
    /// Towards tonic; closed when the client goes away.
    out: mpsc::Sender<Result<BindingChange, Status>>,
    /// Flips to true at shutdown: end the stream so the server can drain.
    shutdown: watch::Receiver<bool>,
    metrics: Metrics,
}

impl Subscriber {
    async fn run(&mut self, from: u64) -> Result<(), Ended> {
        let bounds = self.store.change_bounds().await?;
        let resync = from != 0 && needs_resync(from, bounds);
        self.hello(bounds.head, resync).await?;
        let mut cursor = if from == 0 || resync {
            bounds.head
        } else {
            from
        };
        self.replay(&mut cursor).await?;
        loop {
            let next = tokio::select! {
                r = self.live.recv() => r,
                _ = self.shutdown.changed() => return self.closing(),
            };
            match next {
                Ok(change) if change.revision > cursor => {
                    cursor = change.revision;
                    self.send(convert::change(&change)).await?;
                }
                Ok(_) => {}
                Err(broadcast::error::RecvError::Lagged(missed)) => {
                    tracing::debug!(
                        missed,
                        "watch subscriber lagged; reading the gap from the log"
                    );
                    let bounds = self.store.change_bounds().await?;
                    if needs_resync(cursor, bounds) {
                        self.hello(bounds.head, true).await?;
                        cursor = bounds.head;
                    }
                    self.replay(&mut cursor).await?;
                }
                Err(broadcast::error::RecvError::Closed) => return self.closing(),
            }
        }
    }

    /// Sends every retained change above `cursor`, advancing it.
    async fn replay(&mut self, cursor: &mut u64) -> Result<(), Ended> {
        loop {
            let batch = self.store.changes_after(*cursor, READ_BATCH).await?;
            let full = batch.len() == READ_BATCH as usize;
            for change in &batch {
                *cursor = change.revision;
                self.send(convert::change(change)).await?;
            }
            if !full {
                return Ok(());
            }
        }
    }

    async fn hello(&mut self, head: u64, resync_required: bool) -> Result<(), Ended> {
        if resync_required {
            self.metrics.watch_resync();
        }
        self.send(BindingChange {
            revision: head,
            kind: PbKind::Hello as i32,
            resync_required,
            at_ms: warren_core::time::now_ms(),
            ..Default::default()
        })
        .await
    }

    async fn send(&mut self, msg: BindingChange) -> Result<(), Ended> {
        tokio::select! {
            r = self.out.send(Ok(msg)) => r.map_err(|_| Ended::Gone),
            _ = self.shutdown.changed() => self.closing(),
        }
    }

    /// Tells the client to reconnect elsewhere, and ends.
    fn closing(&mut self) -> Result<(), Ended> {
        let _ = self
            .out
            .try_send(Err(Status::unavailable("scheduler is shutting down")));
        Err(Ended::Gone)
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn resync_rules() {
        let b = |oldest, head| ChangeBounds { oldest, head };
        assert!(!needs_resync(5, b(Some(6), 10)), "6..10 all retained");
        assert!(needs_resync(4, b(Some(6), 10)), "5 was pruned");
        assert!(!needs_resync(10, b(Some(6), 10)), "up to date");
        assert!(needs_resync(11, b(Some(6), 10)), "from another history");
        assert!(!needs_resync(0, b(None, 0)));
        assert!(needs_resync(3, b(None, 5)), "everything pruned");
    }
}
