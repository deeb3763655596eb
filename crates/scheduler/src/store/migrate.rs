//! Schema migrations, embedded from `crates/scheduler/migrations/` and applied
//! at start, each in its own write transaction, recorded in `schema_migrations`.
//! The SQL files are the same for every backend.
//!
//! Hand-rolled rather than `sqlx::migrate!` so that the crate needs no sqlx
//! macros, and so that migrating takes the store's write lock: several
//! replicas starting at once on one PostgreSQL database (or two processes on
//! one SQLite file) migrate exactly once.

use super::backend::{Backend, WRITE_LOCK_KEY};
use sqlx::{AnyPool, Executor as _, Row};

/// `(version, sql)`, in order. Never edit one that has shipped; add a new one.
pub(super) const MIGRATIONS: &[(i64, &str)] = &[
    (1, include_str!("../../migrations/0001_init.sql")),
    (2, include_str!("../../migrations/0002_missing_since.sql")),
    (
        3,
        include_str!("../../migrations/0003_trust_and_quotas.sql"),
    ),
    (
        4,
        include_str!("../../migrations/0004_node_sandbox_counts.sql"),
    ),
    (5, include_str!("../../migrations/0005_lifecycle.sql")),
    (6, include_str!("../../migrations/0006_records.sql")),
    (7, include_str!("../../migrations/0007_cached_layers.sql")),
    (8, include_str!("../../migrations/0008_volumes.sql")),
];

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       BIGINT PRIMARY KEY,
    applied_at_ms BIGINT NOT NULL
)";

/// Applies what is missing. Fails if the database was written by a newer
/// scheduler (it carries a version this build does not know).
pub(super) async fn run(pool: &AnyPool, backend: Backend, now_ms: i64) -> Result<(), MigrateError> {
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    // The common case (a replica starting on a migrated database) takes no
    // lock. An error here means the table is not there yet.
    let newest: Option<Option<i64>> =
        sqlx::query_scalar("SELECT MAX(version) FROM schema_migrations")
            .fetch_one(pool)
            .await
            .ok();
    let mut table_exists = newest.is_some();
    if let Some(Some(newest)) = newest {
        if newest > known {
            return Err(MigrateError::TooNew { newest, known });
        }
        if newest == known {
            return Ok(());
        }
    }
    for (version, sql) in MIGRATIONS {
        let mut tx = pool.begin_with(backend.begin_write()).await?;
        if let Some(lock) = backend.lock_and_clock() {
            sqlx::query(lock)
                .bind(WRITE_LOCK_KEY)
                .execute(&mut *tx)
                .await?;
        }
        if !table_exists {
            // Inside the lock: two replicas creating it at once would collide
            // in PostgreSQL's catalog.
            (&mut *tx).execute(CREATE_TABLE).await?;
            table_exists = true;
        }
        let applied: Vec<i64> = sqlx::query("SELECT version FROM schema_migrations")
            .fetch_all(&mut *tx)
            .await?
            .iter()
            .map(|r| r.try_get::<i64, _>(0))
            .collect::<Result<_, _>>()?;
        if let Some(&newest) = applied.iter().max() {
            if newest > known {
                return Err(MigrateError::TooNew { newest, known });
            }
        }
        if applied.contains(version) {
            tx.commit().await?;
            continue;
        }
        // Executor::execute rather than sqlx::raw_sql: the latter's future is
        // not provably Send (rustc and sqlx's higher-ranked bounds). Without
        // arguments both backends run every statement of the string.
        (&mut *tx).execute(*sql).await?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)")
            .bind(version)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(
            version,
            backend = backend.name(),
            "applied schema migration"
        );
    }
    Ok(())
}

/// A migration could not be applied.
#[derive(Debug, thiserror::Error)]
pub enum MigrateError {
    #[error("database schema version {newest} is newer than this scheduler knows ({known}); upgrade warren")]
    TooNew { newest: i64, known: i64 },
    #[error(transparent)]
    Sql(#[from] sqlx::Error),
}
