//! The embedded SQLite backend.
//!
//! # Layout
//! - this file: opening (WAL, busy timeout, migrations), the write
//!   transaction helper [`WriteTx`], row decoding, and the [`Store`] impl,
//!   which delegates to:
//! - `nodes.rs`: registration, heartbeats, roster reconciliation, node choice.
//! - `bindings.rs`: place, reassign, record, events, reads, timeouts.
//! - `sweep.rs`: the sweep pass, the change log reads, the census.
//!
//! Writes go through a pool of exactly one connection, so in-process writers
//! queue in FIFO order instead of spinning in SQLite's busy handler; reads use
//! a separate pool and see the last committed state (WAL). Every write
//! transaction starts with `BEGIN IMMEDIATE`, so a read inside it can never be
//! invalidated by another writer (e.g. a second process on the same file).

mod bindings;
mod nodes;
mod sweep;

use super::{migrate, sql, types::*, Store};
use crate::error::{Error, Result};
use sqlx::sqlite::{
    SqliteConnectOptions, SqliteJournalMode, SqlitePool, SqlitePoolOptions, SqliteRow,
    SqliteSynchronous,
};
use sqlx::{Row, Sqlite, SqliteConnection, Transaction};
use std::collections::BTreeMap;
use std::future::Future;
use std::path::PathBuf;
use std::str::FromStr;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::Notify;

/// How long a statement waits for another process's write lock.
const BUSY_TIMEOUT: Duration = Duration::from_secs(5);
/// Reader connections; lookups are the hot path.
const READERS: u32 = 4;

/// The SQLite store. Cheap to clone.
#[derive(Clone)]
pub struct SqliteStore {
    /// Exactly one connection: every write transaction.
    writer: SqlitePool,
    /// Read-only traffic (lookups, lists, the change log).
    reader: SqlitePool,
    /// Notified after each commit that appended to the change log.
    changed: Arc<Notify>,
}

/// The store could not be opened.
#[derive(Debug, thiserror::Error)]
pub enum OpenError {
    #[error("cannot create the data directory {path}: {source}")]
    CreateDir {
        path: String,
        source: std::io::Error,
    },
    #[error("bad sqlite URL {url:?}: {source}")]
    Url { url: String, source: sqlx::Error },
    #[error("cannot open the store: {0}")]
    Open(#[from] sqlx::Error),
    #[error("cannot migrate the store: {0}")]
    Migrate(#[from] migrate::MigrateError),
}

impl SqliteStore {
    /// Opens (creating if missing) the database file at `path`.
    pub async fn open_file(path: PathBuf) -> Result<SqliteStore, OpenError> {
        if let Some(dir) = path.parent().filter(|d| !d.as_os_str().is_empty()) {
            std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        Self::open_with(SqliteConnectOptions::new().filename(&path)).await
    }

    /// Opens a `sqlite://...` URL.
    pub async fn open_url(url: String) -> Result<SqliteStore, OpenError> {
        let opts = SqliteConnectOptions::from_str(&url).map_err(|source| OpenError::Url {
            url: url.clone(),
            source,
        })?;
        if let Some(dir) = opts
            .get_filename()
            .parent()
            .filter(|d| !d.as_os_str().is_empty())
        {
            std::fs::create_dir_all(dir).map_err(|source| OpenError::CreateDir {
                path: dir.display().to_string(),
                source,
            })?;
        }
        Self::open_with(opts).await
    }

    async fn open_with(opts: SqliteConnectOptions) -> Result<SqliteStore, OpenError> {
        let opts = opts
            .create_if_missing(true)
            .journal_mode(SqliteJournalMode::Wal)
            // NORMAL is durable across process crashes in WAL mode; only an OS
            // crash can lose the last transactions.
            .synchronous(SqliteSynchronous::Normal)
            .busy_timeout(BUSY_TIMEOUT);
        let writer = SqlitePoolOptions::new()
            .max_connections(1)
            .min_connections(1)
            .connect_with(opts.clone())
            .await?;
        migrate::run(&writer, clock_ms()).await?;
        let reader = SqlitePoolOptions::new()
            .max_connections(READERS)
            .connect_with(opts)
            .await?;
        Ok(SqliteStore {
            writer,
            reader,
            changed: Arc::new(Notify::new()),
        })
    }

    /// Closes both pools (waits for checked-out connections).
    pub fn close(&self) -> impl Future<Output = ()> + Send + 'static {
        let (writer, reader) = (self.writer.clone(), self.reader.clone());
        async move {
            writer.close().await;
            reader.close().await;
        }
    }

    /// Starts a write transaction.
    async fn write(&self) -> Result<WriteTx> {
        let tx = self.writer.begin_with("BEGIN IMMEDIATE").await?;
        Ok(WriteTx {
            tx,
            now: clock_ms(),
            changes: 0,
        })
    }
}

/// The store's clock. For SQLite, the local clock *is* the store's clock (one
/// process owns the file); a PostgreSQL backend reads `now()` from the server
/// instead, so replicas with skewed clocks agree on leases.
fn clock_ms() -> i64 {
    warren_core::time::now_ms()
}

/// A write transaction with the store's time fixed at its start, counting the
/// change-log rows it appends.
struct WriteTx {
    tx: Transaction<'static, Sqlite>,
    /// The store's clock when the transaction began; every comparison and
    /// timestamp inside it uses this one value.
    now: i64,
    /// Change-log rows appended, to notify the watch hub after commit.
    changes: u32,
}

impl WriteTx {
    fn conn(&mut self) -> &mut SqliteConnection {
        &mut self.tx
    }

    async fn next_counter(&mut self, name: &str) -> Result<u64> {
        let v: i64 = sqlx::query_scalar(sql::NEXT_COUNTER)
            .bind(name)
            .fetch_one(self.conn())
            .await?;
        to_u64(v, "counter")
    }

    /// Issues a generation, never used before by any binding.
    async fn next_generation(&mut self) -> Result<u64> {
        self.next_counter("generation").await
    }

    /// Appends to the change log in this transaction.
    async fn emit(
        &mut self,
        kind: ChangeKind,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
        state: Option<State>,
    ) -> Result<u64> {
        let revision = self.next_counter("revision").await?;
        sqlx::query(sql::INSERT_CHANGE)
            .bind(to_i64(revision))
            .bind(kind.as_str())
            .bind(sandbox_id)
            .bind(node_id)
            .bind(to_i64(generation))
            .bind(state.map(State::as_str).unwrap_or(""))
            .bind(self.now)
            .execute(self.conn())
            .await?;
        self.changes += 1;
        Ok(revision)
    }

    /// **fenced** Removes a binding and logs REMOVED; false when the fence missed.
    async fn delete_fenced(&mut self, sandbox_id: &str, node_id: &str, gen: u64) -> Result<bool> {
        let done = sqlx::query(sql::DELETE_BINDING)
            .bind(sandbox_id)
            .bind(node_id)
            .bind(to_i64(gen))
            .execute(self.conn())
            .await?
            .rows_affected()
            == 1;
        if done {
            self.emit(ChangeKind::Removed, sandbox_id, node_id, gen, None)
                .await?;
        }
        Ok(done)
    }

    /// **fenced** `from` → `to` and logs `kind`; false when the fence missed.
    async fn set_state_fenced(
        &mut self,
        r: (&str, &str, u64),
        from: State,
        to: State,
        kind: ChangeKind,
    ) -> Result<bool> {
        let (sandbox_id, node_id, gen) = r;
        let done = sqlx::query(sql::SET_STATE)
            .bind(sandbox_id)
            .bind(node_id)
            .bind(to_i64(gen))
            .bind(to.as_str())
            .bind(from.as_str())
            .bind(self.now)
            .execute(self.conn())
            .await?
            .rows_affected()
            == 1;
        if done {
            self.emit(kind, sandbox_id, node_id, gen, Some(to)).await?;
        }
        Ok(done)
    }

    async fn binding(&mut self, sandbox_id: &str) -> Result<Option<BindingRow>> {
        let row = sqlx::query(sql::BINDING_BY_ID)
            .bind(sandbox_id)
            .fetch_optional(self.conn())
            .await?;
        row.as_ref().map(binding_from_row).transpose()
    }

    /// Why a write fenced on `(sandbox_id, node_id, generation)` found nothing
    /// to change, as the error the caller should see.
    async fn explain_miss(&mut self, sandbox_id: &str, node_id: &str, gen: u64) -> Result<Error> {
        let issued: i64 = sqlx::query_scalar(sql::COUNTER)
            .bind("generation")
            .fetch_one(self.conn())
            .await?;
        if to_i64(gen) > issued {
            return Ok(Error::invalid(format!(
                "generation {gen} was never issued (the highest is {issued})"
            )));
        }
        Ok(match self.binding(sandbox_id).await? {
            None => Error::NotFound(format!("sandbox {sandbox_id} not found")),
            Some(b) => Error::precondition(format!(
                "sandbox {sandbox_id} is at generation {} on node {}, not generation {gen} on node {node_id}",
                b.generation, b.node_id
            )),
        })
    }

    /// Commits, then wakes the watch hub if the change log grew.
    async fn commit(self, changed: &Notify) -> Result<()> {
        let grew = self.changes > 0;
        self.tx.commit().await?;
        if grew {
            changed.notify_one();
        }
        Ok(())
    }
}

/// Store integers are i64; ours are u64 well below 2^63.
fn to_i64(v: u64) -> i64 {
    i64::try_from(v).unwrap_or(i64::MAX)
}

fn to_u64(v: i64, what: &str) -> Result<u64> {
    u64::try_from(v).map_err(|_| Error::Corrupt(format!("negative {what}: {v}")))
}

fn to_u32(v: i64, what: &str) -> Result<u32> {
    u32::try_from(v).map_err(|_| Error::Corrupt(format!("{what} out of range: {v}")))
}

fn parse_state(s: &str) -> Result<State> {
    State::parse(s).ok_or_else(|| Error::Corrupt(format!("unknown binding state {s:?}")))
}

fn json_map(s: &str, what: &str) -> Result<BTreeMap<String, String>> {
    serde_json::from_str(s).map_err(|e| Error::Corrupt(format!("{what}: {e}")))
}

fn map_json(m: &BTreeMap<String, String>) -> String {
    serde_json::to_string(m).unwrap_or_else(|_| "{}".into())
}

fn binding_from_row(r: &SqliteRow) -> Result<BindingRow> {
    Ok(BindingRow {
        sandbox_id: r.try_get("sandbox_id")?,
        node_id: r.try_get("node_id")?,
        endpoint: r.try_get("endpoint")?,
        generation: to_u64(r.try_get("generation")?, "generation")?,
        state: parse_state(r.try_get("state")?)?,
        team_id: r.try_get("team_id")?,
        template_id: r.try_get("template_id")?,
        started_at_ms: r.try_get("started_at_ms")?,
        end_at_ms: r.try_get("end_at_ms")?,
        metadata: json_map(r.try_get("metadata")?, "metadata")?,
        env_vars: json_map(r.try_get("env_vars")?, "env_vars")?,
        access_token: r.try_get("access_token")?,
        cpu_count: to_u32(r.try_get("cpu_count")?, "cpu_count")?,
        memory_mb: to_u32(r.try_get("memory_mb")?, "memory_mb")?,
        assigned_at_ms: r.try_get("assigned_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
    })
}

impl Store for SqliteStore {
    async fn register_node(&self, reg: NodeRegistration, lease: Duration) -> Result<Reconciled> {
        nodes::register(self, reg, lease).await
    }

    async fn heartbeat(
        &self,
        node_id: &str,
        incarnation: u64,
        roster: &[SandboxRef],
        lease: Duration,
    ) -> Result<Reconciled> {
        nodes::heartbeat(self, node_id, incarnation, roster, lease).await
    }

    async fn place(&self, spec: PlaceSpec) -> Result<Placed> {
        bindings::place(self, spec).await
    }

    async fn reassign(&self, sandbox_id: &str, node_id: Option<&str>) -> Result<BindingRow> {
        bindings::reassign(self, sandbox_id, node_id).await
    }

    async fn record_assignment(
        &self,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
    ) -> Result<BindingRow> {
        bindings::record_assignment(self, sandbox_id, node_id, generation).await
    }

    async fn apply_event(&self, node_id: &str, event: &NodeEvent) -> Result<EventOutcome> {
        bindings::apply_event(self, node_id, event).await
    }

    async fn issued_generation(&self) -> Result<u64> {
        sweep::issued_generation(self).await
    }

    async fn require_node(&self, node_id: &str) -> Result<()> {
        nodes::require(self, node_id).await
    }

    async fn get(&self, sandbox_id: &str) -> Result<Option<BindingRow>> {
        let row = sqlx::query(sql::BINDING_BY_ID)
            .bind(sandbox_id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(binding_from_row).transpose()
    }

    async fn list(&self, filter: &ListFilter) -> Result<(Vec<BindingRow>, Option<String>)> {
        bindings::list(self, filter).await
    }

    async fn list_nodes(&self) -> Result<Vec<NodeRow>> {
        nodes::list(self).await
    }

    async fn set_end_at(&self, sandbox_id: &str, end_at_ms: i64) -> Result<BindingRow> {
        bindings::set_end_at(self, sandbox_id, end_at_ms).await
    }

    async fn change_bounds(&self) -> Result<ChangeBounds> {
        sweep::change_bounds(self).await
    }

    async fn changes_after(&self, after: u64, limit: u32) -> Result<Vec<Change>> {
        sweep::changes_after(self, after, limit).await
    }

    async fn sweep(&self, settings: &SweepSettings) -> Result<SweepReport> {
        sweep::run(self, settings).await
    }

    async fn census(&self) -> Result<Census> {
        sweep::census(self).await
    }

    fn change_signal(&self) -> Arc<Notify> {
        self.changed.clone()
    }
}
