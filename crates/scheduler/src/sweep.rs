//! The sweep: one task, every `--sweep-interval`, on the replica that holds
//! the [`LeaderLease`]:
//! - nodes whose lease expired → DOWN, their bindings → LOST (fenced, LOST events);
//! - bindings past `end_at` → EXPIRING (the node kills them when its heartbeat
//!   returns them in `expired`, then reports DELETE); LOST ones past `end_at`
//!   are removed, since no node is there to report it;
//! - PAUSED bindings older than `--paused-retention` (when set) → EXPIRING
//!   with auto-pause cleared, so their node deletes them;
//! - CREATING bindings older than `--creating-timeout` → RUNNING if the node's
//!   last roster has them, else removed;
//! - template builds never claimed past their start TTL, and finished ones
//!   past their retention, deleted with their logs; building ones whose
//!   gateway stopped renewing their lease failed (`warren_scheduler_lost_builds`);
//! - COPY uploads past their TTL deleted, their archives' blobs noted as
//!   unused (the TTLs are those the gateways named when they made each);
//! - the change log pruned to `--watch-retention` rows;
//! - the state gauges refreshed (on every replica, leading or not).
//!
//! The sweep never contacts nodes; they learn what to kill from heartbeats.
//! `warren_scheduler_leader` is 1 on the replica that sweeps.

use crate::metrics::Metrics;
use crate::store::{SqlStore, SweepSettings};
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;

/// Who may run the sweep. With several scheduler replicas on one store only
/// one should (PostgreSQL: `store::postgres::AdvisoryLease`, an advisory
/// lock held on a session); on SQLite there is one replica, so
/// [`SoleReplica`] always leads.
pub trait LeaderLease: Send + Sync + 'static {
    /// Whether this replica leads now (acquiring or renewing as needed).
    fn lead(&self) -> impl Future<Output = bool> + Send;
}

/// The lease on a store that only one scheduler process uses.
#[derive(Debug, Clone, Copy, Default)]
pub struct SoleReplica;

impl LeaderLease for SoleReplica {
    async fn lead(&self) -> bool {
        true
    }
}

/// Timing of the sweep.
#[derive(Debug, Clone, Copy)]
pub struct SweepTiming {
    /// Time between passes.
    pub interval: Duration,
    /// Node lease; nodes are not taken down until one lease after start.
    pub lease: Duration,
    /// What the store's sweep pass works with.
    pub settings: SweepSettings,
}

/// Runs sweeps until `shutdown` flips to true.
pub async fn run<L: LeaderLease>(
    store: Arc<SqlStore>,
    leader: L,
    timing: SweepTiming,
    metrics: Metrics,
    mut shutdown: watch::Receiver<bool>,
) {
    let started = Instant::now();
    let mut ticker = tokio::time::interval(timing.interval);
    ticker.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut leading = false;
    loop {
        tokio::select! {
            _ = ticker.tick() => {}
            r = shutdown.changed() => if r.is_err() || *shutdown.borrow() { break },
        }
        let leads = leader.lead().await;
        if leads != leading {
            leading = leads;
            metrics.leader(leads);
            if leads {
                tracing::info!("this replica holds the sweep lease; sweeping");
            } else {
                tracing::warn!("this replica no longer holds the sweep lease; not sweeping");
            }
        }
        if leads {
            // Nodes could not heartbeat while this scheduler was down; give
            // them one lease to find it before declaring them dead.
            let settings = SweepSettings {
                expire_nodes: started.elapsed() >= timing.lease,
                ..timing.settings
            };
            match store.sweep(&settings).await {
                Ok(report) => {
                    metrics.sweep_done(&report);
                    if !report.is_quiet() {
                        tracing::info!(?report, "sweep");
                    }
                }
                Err(e) => {
                    metrics.sweep_failed();
                    tracing::warn!(error = %e, "sweep failed");
                }
            }
        }
        match store.census().await {
            Ok(c) => metrics.census(&c),
            Err(e) => tracing::warn!(error = %e, "cannot count nodes and bindings"),
        }
    }
    // A stopping replica no longer sweeps (its lease session closes with it).
    metrics.leader(false);
}
