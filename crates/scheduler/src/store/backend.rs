//! Everything that differs between SQLite and PostgreSQL, in one place. The
//! schema and the queries (`sql.rs`) are shared; these few statements are not.
//!
//! **Why every write transaction takes one lock.** SQLite's `BEGIN IMMEDIATE`
//! takes the database's write lock, so write transactions run one at a time
//! and a read inside one is never invalidated. PostgreSQL runs transactions
//! concurrently (READ COMMITTED), so each write transaction first takes one
//! transaction-scoped advisory lock ([`WRITE_LOCK_KEY`]): the same
//! one-writer-at-a-time rule, across every replica. That keeps the store's
//! read-then-write steps correct without per-query reasoning (a `Place`
//! checks capacity and the idempotency key, then inserts; a reconcile reads a
//! node's bindings, then changes some) and rules out deadlocks between
//! writers locking rows in different orders. Reads (`LookupNode`, lists, the
//! change log) take no lock and scale with replicas and the read pool.
//!
//! **Why revisions become visible in commit order.** Revisions come from the
//! `counters` row, bumped inside the writing transaction while it holds the
//! write lock. Transaction B can only take the lock, and so its revision,
//! after transaction A released it; PostgreSQL releases a transaction's locks
//! after its commit became visible to new snapshots. So if a reader sees
//! revision N committed, every revision below N is committed and visible too,
//! and a rolled-back transaction gives its revision back (the counter update
//! rolls back with it; a sequence would leave a hole). Tailing the change log
//! with `revision > cursor` therefore never skips a row, on either backend.

/// Which database the store runs on.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Backend {
    /// Embedded, one scheduler process per file.
    Sqlite,
    /// Shared by any number of scheduler replicas.
    Postgres,
}

/// PostgreSQL advisory lock every write transaction holds (see the module
/// docs). Advisory locks are scoped to one database, so two warren
/// deployments on two databases of one server do not contend. In
/// `pg_locks`: `locktype = 'advisory'`, `classid = 2002874994`, `objid =
/// 1701707777` (this key's halves), `objsubid = 1`.
pub const WRITE_LOCK_KEY: i64 = 0x7761_7272_656e_0001; // "warren" + 1
/// PostgreSQL advisory lock held, for its whole session, by the replica that
/// runs the sweeps (see `store::postgres::AdvisoryLease`); in `pg_locks`,
/// `objid = 1701707778`.
pub const SWEEP_LOCK_KEY: i64 = 0x7761_7272_656e_0002; // "warren" + 2
/// The channel writers `NOTIFY` and every replica `LISTEN`s on.
pub const CHANGES_CHANNEL: &str = "warren_changes";

/// Milliseconds since the Unix epoch by the server's clock.
/// `clock_timestamp()` rather than `now()`: `now()` is the transaction's start,
/// which for a writer that waited for the write lock can be earlier than the
/// time a previous writer already recorded.
macro_rules! pg_clock {
    () => {
        "(EXTRACT(EPOCH FROM clock_timestamp()) * 1000)::BIGINT"
    };
}

impl Backend {
    /// For logs and errors.
    pub fn name(self) -> &'static str {
        match self {
            Backend::Sqlite => "SQLite",
            Backend::Postgres => "PostgreSQL",
        }
    }

    /// Opens a write transaction.
    pub(crate) fn begin_write(self) -> &'static str {
        match self {
            // Take the write lock now, not at the first write, so reads in the
            // transaction see what the write will act on.
            Backend::Sqlite => "BEGIN IMMEDIATE",
            Backend::Postgres => "BEGIN",
        }
    }

    /// Run first in every write transaction, with [`WRITE_LOCK_KEY`] bound
    /// as `$1`: waits for the write lock, then answers the store's time.
    /// The CTE makes the order explicit: the clock is read once the lock is
    /// held. `None`: the transaction already holds the lock and the local
    /// clock is the store's clock.
    pub(crate) fn lock_and_clock(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::Postgres => Some(concat!(
                "WITH l AS MATERIALIZED (SELECT pg_advisory_xact_lock($1)) SELECT ",
                pg_clock!(),
                " FROM l"
            )),
        }
    }

    /// The store's time, outside a write transaction; `None`: the local clock.
    pub(crate) fn clock(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::Postgres => Some(concat!("SELECT ", pg_clock!())),
        }
    }

    /// Run before committing a transaction that appended to the change log,
    /// so other replicas' watch hubs wake up. PostgreSQL delivers it only if,
    /// and when, the transaction commits.
    pub(crate) fn notify(self) -> Option<&'static str> {
        match self {
            Backend::Sqlite => None,
            Backend::Postgres => Some("NOTIFY warren_changes"),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writers_notify_the_channel_replicas_listen_on() {
        assert!(Backend::Postgres
            .notify()
            .is_some_and(|s| s.ends_with(CHANGES_CHANNEL)));
        assert!(Backend::Sqlite.notify().is_none());
    }
}
