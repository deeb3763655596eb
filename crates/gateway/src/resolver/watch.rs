//! Following the scheduler's `WatchBindings` stream to keep the route cache
//! honest across gateways (ARCHITECTURE.md invariant "Bounded staleness").
//!
//! One task per gateway. It subscribes from the last revision it applied
//! (0 the first time: "from now"), so a reconnect replays what it missed.
//! Each change evicts the cached route it makes wrong (`reason="watch"`):
//! REMOVED, MOVED and LOST always (unless the cache already holds a newer
//! generation), ASSIGNED and STATE when their generation, node or state
//! differs from the cached one (a sandbox paused in place by its node at
//! its end is no longer routed to as running). A HELLO with `resync_required` (the scheduler no longer has
//! the changes since our revision) flushes the whole cache, and so does the
//! first HELLO of the process: anything cached before the watch was live
//! was never covered by it.
//!
//! When the stream breaks the gateway keeps serving cached routes within
//! their TTL (the bound on staleness while blind), and reconnects with
//! `warren_core::backoff` (capped exponential, jittered), moving to the next configured
//! scheduler replica each time.

use super::{CachedResolver, EvictReason, Route};
use std::sync::Arc;
use std::time::Duration;
use tokio::task::JoinHandle;
use warren_core::backoff::Backoff;
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1::{BindingChange, BindingState, ChangeKind, WatchBindingsRequest};

/// First pause before reconnecting.
const BACKOFF_FIRST: Duration = Duration::from_millis(100);

/// Starts the watch task; abort the handle to stop it.
pub fn spawn(cache: CachedResolver, scheduler: Arc<Scheduler>) -> JoinHandle<()> {
    tokio::spawn(run(cache, scheduler))
}

async fn run(cache: CachedResolver, scheduler: Arc<Scheduler>) {
    let metrics = cache.metrics.clone();
    // The last revision applied; 0 until the first HELLO.
    let mut revision = 0u64;
    let mut attempt = 0usize;
    let mut backoff = Backoff::new(BACKOFF_FIRST, warren_core::backoff::MAX);
    loop {
        let (url, mut client) = scheduler.replica(attempt);
        match client
            .watch_bindings(WatchBindingsRequest {
                from_revision: revision,
            })
            .await
        {
            Ok(stream) => {
                let mut stream = stream.into_inner();
                loop {
                    match stream.message().await {
                        Ok(Some(change)) => {
                            if change.kind == ChangeKind::Hello as i32 {
                                // Connected: the next break starts backing off afresh.
                                backoff.reset();
                                metrics.watch_connected.set(1);
                                tracing::info!(
                                    scheduler = url,
                                    head = change.revision,
                                    resync = change.resync_required,
                                    "route cache watch connected"
                                );
                            }
                            revision = apply(&cache, &change, revision).await;
                            metrics
                                .watch_revision
                                .set(i64::try_from(revision).unwrap_or(i64::MAX));
                        }
                        Ok(None) => {
                            tracing::info!(scheduler = url, "scheduler ended the watch stream");
                            break;
                        }
                        Err(status) => {
                            tracing::warn!(scheduler = url, code = ?status.code(),
                                message = status.message(), "route cache watch broke");
                            break;
                        }
                    }
                }
            }
            Err(status) => {
                tracing::warn!(scheduler = url, code = ?status.code(), message = status.message(),
                    "cannot open the route cache watch; serving within TTL meanwhile");
            }
        }
        metrics.watch_connected.set(0);
        attempt = attempt.wrapping_add(1);
        tokio::time::sleep(backoff.next_pause()).await;
    }
}

/// Applies one change and returns the revision to resume from.
pub(crate) async fn apply(cache: &CachedResolver, change: &BindingChange, revision: u64) -> u64 {
    let kind = ChangeKind::try_from(change.kind).unwrap_or(ChangeKind::Unspecified);
    if kind == ChangeKind::Hello {
        if change.resync_required || revision == 0 {
            cache.flush(EvictReason::Watch).await;
            // The scheduler replays from its head after a resync.
            return change.revision;
        }
        return revision;
    }
    let generation = change.generation;
    let node = change.node_id.as_str();
    if kind == ChangeKind::Lost && change.at_ms > 0 {
        let waited_ms = warren_core::time::now_ms()
            .saturating_sub(change.at_ms)
            .max(0);
        cache
            .metrics
            .node_loss_eviction
            .observe(waited_ms as f64 / 1000.0);
    }
    let removed = cache
        .remove_if(
            &change.sandbox_id,
            EvictReason::Watch,
            |cached: &Route, _| {
                match kind {
                    ChangeKind::Removed | ChangeKind::Lost => cached.generation <= generation,
                    // A state change in place matters too: a sandbox
                    // paused (by its node at its end, or through another
                    // gateway) must not be proxied to as running, nor a
                    // resumed one answered as paused.
                    ChangeKind::Moved | ChangeKind::Assigned | ChangeKind::State => {
                        cached.generation != generation
                            || (!node.is_empty() && cached.node_id != node)
                            || (change.state != BindingState::Unspecified as i32
                                && change.state != cached.state as i32)
                    }
                    // Unknown kinds from a newer scheduler: drop the entry to be safe.
                    ChangeKind::Unspecified | ChangeKind::Hello => true,
                }
            },
        )
        .await;
    if removed {
        tracing::debug!(sandbox = %change.sandbox_id, ?kind, generation, "route evicted by the watch");
    }
    revision.max(change.revision)
}
