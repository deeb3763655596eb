//! Schema migrations, embedded from `crates/scheduler/migrations/` and applied
//! at start, each in its own transaction, recorded in `schema_migrations`.
//!
//! Hand-rolled rather than `sqlx::migrate!` so that the crate needs no sqlx
//! macros, and the SQL files stay portable across backends.

use sqlx::{Executor as _, Row};

/// `(version, sql)`, in order. Never edit one that has shipped; add a new one.
pub(super) const MIGRATIONS: &[(i64, &str)] =
    &[(1, include_str!("../../migrations/0001_init.sql"))];

const CREATE_TABLE: &str = "CREATE TABLE IF NOT EXISTS schema_migrations (
    version       BIGINT PRIMARY KEY,
    applied_at_ms BIGINT NOT NULL
)";

/// Applies what is missing. Fails if the database was written by a newer
/// scheduler (it carries a version this build does not know).
pub(super) async fn run(pool: &sqlx::SqlitePool, now_ms: i64) -> Result<(), MigrateError> {
    sqlx::query(CREATE_TABLE).execute(pool).await?;
    let applied: Vec<i64> = sqlx::query("SELECT version FROM schema_migrations ORDER BY version")
        .fetch_all(pool)
        .await?
        .iter()
        .map(|r| r.try_get::<i64, _>(0))
        .collect::<Result<_, _>>()?;
    let known = MIGRATIONS.last().map(|m| m.0).unwrap_or(0);
    if let Some(&newest) = applied.iter().max() {
        if newest > known {
            return Err(MigrateError::TooNew { newest, known });
        }
    }
    for (version, sql) in MIGRATIONS {
        if applied.contains(version) {
            continue;
        }
        // IMMEDIATE: two schedulers starting on one file must not both migrate.
        let mut tx = pool.begin_with("BEGIN IMMEDIATE").await?;
        let again: Option<i64> =
            sqlx::query_scalar("SELECT version FROM schema_migrations WHERE version = $1")
                .bind(version)
                .fetch_optional(&mut *tx)
                .await?;
        if again.is_some() {
            continue;
        }
        // Executor::execute rather than sqlx::raw_sql: the latter's future is
        // not provably Send (rustc and sqlx's higher-ranked bounds); SQLite
        // runs every statement of an argument-less query string either way.
        (&mut *tx).execute(*sql).await?;
        sqlx::query("INSERT INTO schema_migrations (version, applied_at_ms) VALUES ($1, $2)")
            .bind(version)
            .bind(now_ms)
            .execute(&mut *tx)
            .await?;
        tx.commit().await?;
        tracing::info!(version, "applied schema migration");
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
