//! What only PostgreSQL does: hearing other replicas' changes, and choosing
//! the one replica that sweeps.
//!
//! - [`follow_changes`]: a `LISTEN warren_changes` connection. Every write
//!   transaction that appends to the change log also `NOTIFY`s (delivered at
//!   commit, only if it commits), so each replica's watch hub wakes within
//!   milliseconds of a change made through any replica and tails the
//!   `changes` table from its cursor. The notification carries nothing: the
//!   table is the truth, so a lost or coalesced notification loses nothing.
//!   After the listening connection is lost and re-established, the hub is
//!   woken once more to re-tail whatever committed in between.
//! - [`AdvisoryLease`]: the sweep lease, a session-level
//!   `pg_try_advisory_lock` held on a dedicated connection. PostgreSQL
//!   releases it the moment that session ends, so when the leading replica
//!   dies (its connection closes) another one takes it on its next sweep
//!   tick. A leader that cannot reach its session stops sweeping at once.
//!
//! The lease is about efficiency, not safety: every sweep step is a fenced,
//! conditional write under the store's write lock, so two replicas sweeping
//! in the brief moment a partition may allow would still agree.

use super::backend::{CHANGES_CHANNEL, SWEEP_LOCK_KEY};
use crate::sweep::{LeaderLease, SoleReplica};
use sqlx::postgres::{PgConnectOptions, PgConnection, PgListener};
use sqlx::{ConnectOptions as _, Connection as _};
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{watch, Mutex, Notify};

/// Pause before reconnecting a listener that failed.
const LISTEN_RETRY: Duration = Duration::from_millis(500);
/// How long connecting or checking the lease session may take before the
/// replica gives the lease up (and stops sweeping).
const LEASE_IO_TIMEOUT: Duration = Duration::from_secs(2);
/// TCP keepalive on the lease session, so that the server notices a leader
/// whose host vanished (no FIN) within ~8 s and frees the lease; a leader
/// that merely exited closes its socket and frees it at once.
const KEEPALIVE: [(&str, &str); 3] = [
    ("tcp_keepalives_idle", "5"),
    ("tcp_keepalives_interval", "1"),
    ("tcp_keepalives_count", "3"),
];

/// Wakes `changed` on every `NOTIFY warren_changes`, until `shutdown` flips.
pub async fn follow_changes(
    url: String,
    changed: Arc<Notify>,
    mut shutdown: watch::Receiver<bool>,
) {
    loop {
        let mut listener = tokio::select! {
            r = listen(&url) => match r {
                Ok(l) => l,
                Err(e) => {
                    tracing::warn!(error = %e, "cannot LISTEN for other replicas' changes; retrying");
                    tokio::select! {
                        _ = tokio::time::sleep(LISTEN_RETRY) => continue,
                        _ = shutdown.changed() => return,
                    }
                }
            },
            _ = shutdown.changed() => return,
        };
        // Whatever committed while nobody listened is in the table.
        changed.notify_one();
        loop {
            let next = tokio::select! {
                r = listener.try_recv() => r,
                _ = shutdown.changed() => return,
            };
            match next {
                Ok(Some(_)) => changed.notify_one(),
                // Lost and already re-established (and re-LISTENed) by sqlx:
                // re-tail to cover the gap.
                Ok(None) => {
                    tracing::warn!("change listener reconnected; re-reading the change log");
                    changed.notify_one();
                }
                Err(e) => {
                    tracing::warn!(error = %e, "change listener failed; reconnecting");
                    break;
                }
            }
        }
    }
}

async fn listen(url: &str) -> Result<PgListener, sqlx::Error> {
    let mut listener = PgListener::connect(url).await?;
    listener.listen(CHANGES_CHANNEL).await?;
    Ok(listener)
}

/// The sweep lease on PostgreSQL (see the module docs).
pub struct AdvisoryLease {
    options: PgConnectOptions,
    /// The dedicated session, and whether it holds the lock.
    session: Mutex<Option<(PgConnection, bool)>>,
}

impl AdvisoryLease {
    /// A lease on the database at `url`; nothing connects until [`LeaderLease::lead`].
    pub fn new(url: &str) -> Result<AdvisoryLease, sqlx::Error> {
        let options = PgConnectOptions::from_str(url)?
            .options(KEEPALIVE)
            .application_name("warren-scheduler-sweep-lease");
        Ok(AdvisoryLease {
            options,
            session: Mutex::new(None),
        })
    }

    async fn try_lead(&self) -> Result<bool, sqlx::Error> {
        let mut slot = self.session.lock().await;
        if slot.is_none() {
            let conn = within(self.options.connect()).await?;
            *slot = Some((conn, false));
        }
        let Some((conn, held)) = slot.as_mut() else {
            return Ok(false);
        };
        let outcome = if *held {
            // Still ours as long as the session is alive.
            within(conn.ping()).await.map(|()| true)
        } else {
            within(
                sqlx::query_scalar::<_, bool>("SELECT pg_try_advisory_lock($1)")
                    .bind(SWEEP_LOCK_KEY)
                    .fetch_one(&mut *conn),
            )
            .await
        };
        match outcome {
            Ok(now_held) => {
                *held = now_held;
                Ok(now_held)
            }
            Err(e) => {
                // Drop the session: if it still exists server-side, closing
                // it frees the lock for another replica.
                if let Some((conn, _)) = slot.take() {
                    tokio::spawn(async move {
                        let _ = tokio::time::timeout(LEASE_IO_TIMEOUT, conn.close()).await;
                    });
                }
                Err(e)
            }
        }
    }
}

async fn within<T>(
    f: impl std::future::Future<Output = Result<T, sqlx::Error>>,
) -> Result<T, sqlx::Error> {
    tokio::time::timeout(LEASE_IO_TIMEOUT, f)
        .await
        .unwrap_or_else(|_| {
            Err(sqlx::Error::Io(std::io::Error::new(
                std::io::ErrorKind::TimedOut,
                format!("no answer from PostgreSQL within {LEASE_IO_TIMEOUT:?}"),
            )))
        })
}

impl LeaderLease for AdvisoryLease {
    async fn lead(&self) -> bool {
        match self.try_lead().await {
            Ok(held) => held,
            Err(e) => {
                tracing::warn!(error = %e, "sweep lease session failed; not sweeping");
                false
            }
        }
    }
}

/// The lease a store's backend calls for.
pub enum ReplicaLease {
    /// SQLite: this process is the only one.
    Sole(SoleReplica),
    /// PostgreSQL: whoever holds the advisory lock.
    Advisory(Box<AdvisoryLease>),
}

impl LeaderLease for ReplicaLease {
    async fn lead(&self) -> bool {
        match self {
            ReplicaLease::Sole(l) => l.lead().await,
            ReplicaLease::Advisory(l) => l.lead().await,
        }
    }
}
