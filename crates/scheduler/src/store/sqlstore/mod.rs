//! The store over SQL, one implementation for both backends (sqlx's `Any`
//! driver: the schema uses only BIGINT and TEXT, which it maps on both).
//!
//! # Layout
//! - this file: [`SqlStore`], the write transaction helper [`WriteTx`], row
//!   decoding, and the operations, which delegate to:
//! - `open.rs`: connecting (SQLite file or URL, PostgreSQL URL), pools, migrations.
//! - `nodes.rs`: registration, heartbeats, roster reconciliation, node choice.
//! - `bindings.rs`: place, reassign, record, events, reads, timeouts.
//! - `sweep.rs`: the sweep pass, the change log reads, the census.
//! - `routes.rs`: the route columns `LookupNode` answers with, one
//!   sandbox, a batch, or a page in id order (the scheduler's route view).
//! - `records.rs`: template records, unused-blob notes, team usage;
//!   `builds.rs`: template builds and their logs; `uploads.rs`: COPY
//!   uploads; `volumes.rs`: volumes and their mounts (each with its part
//!   of the sweep and its `SqlStore` methods); `secrets.rs`: team secrets,
//!   sealed under their own key.
//!
//! Writes go through a pool of exactly one connection, so this process's
//! writers queue in FIFO order here instead of inside the database; every
//! write transaction then takes the store-wide write lock (SQLite
//! `BEGIN IMMEDIATE`, PostgreSQL an advisory lock: see `store::backend` for
//! why, and why that keeps revisions in commit order). Reads use a separate
//! pool (`--database-pool-size`) and see the last committed state.

mod bindings;
mod builds;
mod logs;
mod nodes;
mod open;
mod records;
mod routes;
mod secrets;
mod sweep;
mod uploads;
mod volumes;

pub use builds::LINE_COST;

pub use open::{redact as redact_url, OpenError};

use super::backend::{Backend, WRITE_LOCK_KEY};
use super::seal::{self, Sealer};
use super::{sql, types::*};
use crate::error::{Error, Result};
use sqlx::any::AnyRow;
use sqlx::{Any, AnyConnection, AnyPool, Row, Transaction};
use std::collections::BTreeMap;
use std::future::Future;
use std::pin::Pin;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::Arc;
use tokio::sync::Notify;

/// The store. Cheap to clone.
#[derive(Clone)]
pub struct SqlStore {
    backend: Backend,
    /// Exactly one connection: every write transaction.
    writer: AnyPool,
    /// Read-only traffic (lookups, lists, the change log).
    reader: AnyPool,
    /// Notified after each commit that appended to the change log (and, on
    /// PostgreSQL, on every `NOTIFY` from any replica: `store::postgres`).
    changed: Arc<Notify>,
    /// The PostgreSQL URL, for the connections that are not pooled (the
    /// change listener and the sweep lease).
    pg_url: Option<String>,
    /// The newest revision this process has committed to the change log
    /// (0 before its first): a read that must see this process's own
    /// writes compares against it (`crate::route_view`).
    committed: Arc<AtomicU64>,
    /// Seals access tokens and `envVars` before they are stored, and opens
    /// them when they are read (`store::seal`).
    sealer: Arc<Sealer>,
    /// Seals team secrets (`--secrets-key-file`); None: the store keeps
    /// none (`sqlstore/secrets.rs`).
    secrets: Option<Arc<Sealer>>,
    /// Where operations run: `None` (every part of warren) on the caller's
    /// runtime, writes on a task of their own; `Some` only in the
    /// deterministic simulation ([`SqlStore::with_executor`]). Every
    /// public operation, reads included, goes through it when set (a
    /// write by [`SqlStore::detached`], a read by the `<op>`/`<op>_now`
    /// pair): one that awaited the driver directly would land at a
    /// moment of the simulation no seed fixes, and seeds would not replay.
    exec: Option<Executor>,
}

/// Runs a store operation to its end elsewhere (its own runtime and
/// thread) while the calling thread waits for it. SQLite's driver answers
/// from a thread of its own; the simulation (`crates/sim`,
/// docs/simulation.md) cannot replay when those answers land among its
/// tasks, but it can make every operation take no simulated time at all.
pub type Executor = Arc<dyn Fn(Pin<Box<dyn Future<Output = ()> + Send>>) + Send + Sync>;

/// `fut` run to its end by `exec`; its result.
fn run_on<T: Send + 'static>(
    exec: &Executor,
    fut: impl Future<Output = Result<T>> + Send + 'static,
) -> Result<T> {
    let slot = Arc::new(std::sync::Mutex::new(None));
    let out = slot.clone();
    exec(Box::pin(async move {
        let r = fut.await;
        if let Ok(mut o) = out.lock() {
            *o = Some(r);
        }
    }));
    let taken = slot.lock().ok().and_then(|mut o| o.take());
    taken.unwrap_or_else(|| {
        Err(Error::Internal(
            "the store's executor did not run the operation".into(),
        ))
    })
}

impl SqlStore {
    /// Which database this is.
    pub fn backend(&self) -> Backend {
        self.backend
    }

    /// The PostgreSQL URL, if the store is on PostgreSQL.
    pub fn postgres_url(&self) -> Option<&str> {
        self.pg_url.as_deref()
    }

    /// The same store, every operation of which `exec` runs to its end while
    /// the caller's thread waits ([`Executor`]). For the deterministic
    /// simulation only: a scheduler process never sets one.
    #[doc(hidden)]
    pub fn with_executor(mut self, exec: Executor) -> SqlStore {
        self.exec = Some(exec);
        self
    }

    /// Closes both pools (waits for checked-out connections).
    pub fn close(&self) -> impl Future<Output = ()> + Send + 'static {
        let (writer, reader) = (self.writer.clone(), self.reader.clone());
        async move {
            writer.close().await;
            reader.close().await;
        }
    }

    /// Starts a write transaction: takes the store's write lock and fixes
    /// the store's time.
    async fn write(&self) -> Result<WriteTx> {
        let mut tx = self.writer.begin_with(self.backend.begin_write()).await?;
        let now = match self.backend.lock_and_clock() {
            Some(q) => {
                sqlx::query_scalar::<_, i64>(q)
                    .bind(WRITE_LOCK_KEY)
                    .fetch_one(&mut *tx)
                    .await?
            }
            None => local_clock_ms(),
        };
        Ok(WriteTx {
            tx,
            now,
            sealer: self.sealer.clone(),
            changes: 0,
            last_revision: 0,
            committed: self.committed.clone(),
            notify: self.backend.notify(),
            change_at: None,
        })
    }

    /// The store's clock outside a write transaction.
    async fn clock_ms(&self) -> Result<i64> {
        match self.backend.clock() {
            Some(q) => Ok(sqlx::query_scalar::<_, i64>(q)
                .fetch_one(&self.reader)
                .await?),
            None => Ok(local_clock_ms()),
        }
    }
}

/// The local clock. For SQLite it *is* the store's clock (one process owns
/// the file); PostgreSQL answers the server's time instead, so replicas with
/// skewed clocks agree on leases and deadlines.
fn local_clock_ms() -> i64 {
    warren_core::time::now_ms()
}

/// A write transaction with the store's time fixed at its start, counting the
/// change-log rows it appends.
struct WriteTx {
    tx: Transaction<'static, Any>,
    /// The store's clock when the transaction began (after the write lock
    /// was taken); every comparison and timestamp inside it uses this value.
    now: i64,
    /// The store's [`Sealer`], for the bindings read inside it.
    sealer: Arc<Sealer>,
    /// Change-log rows appended, to wake the watch hubs after commit.
    changes: u32,
    /// The newest revision appended, and the store's record of what this
    /// process committed, which it raises to that at commit.
    last_revision: u64,
    committed: Arc<AtomicU64>,
    /// The backend's statement that wakes other replicas' hubs at commit.
    notify: Option<&'static str>,
    /// When set, the `at_ms` logged with changes instead of `now`: a LOST
    /// change carries the moment the node's lease expired, so subscribers can
    /// measure lease expiry → their reaction.
    change_at: Option<i64>,
}

impl WriteTx {
    fn conn(&mut self) -> &mut AnyConnection {
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
            .bind(self.change_at.unwrap_or(self.now))
            .execute(self.conn())
            .await?;
        self.changes += 1;
        self.last_revision = revision;
        Ok(revision)
    }

    /// Keeps node `node_id`'s binding count in step with a binding added
    /// (`delta` 1) or removed (-1) in this transaction.
    async fn count_sandboxes(&mut self, node_id: &str, delta: i64) -> Result<()> {
        sqlx::query(sql::COUNT_NODE_SANDBOXES)
            .bind(node_id)
            .bind(delta)
            .execute(self.conn())
            .await?;
        Ok(())
    }

    /// **fenced** Removes a binding and logs REMOVED; false when the fence missed.
    async fn delete_fenced(&mut self, sandbox_id: &str, node_id: &str, gen: u64) -> Result<bool> {
        let done = sqlx::query(delete_binding())
            .bind(sandbox_id)
            .bind(node_id)
            .bind(to_i64(gen))
            .execute(self.conn())
            .await?
            .rows_affected()
            == 1;
        if done {
            self.count_sandboxes(node_id, -1).await?;
            self.emit(ChangeKind::Removed, sandbox_id, node_id, gen, None)
                .await?;
            // Gone for good, however it went (a kill, its node's report,
            // a sweep): so is what a filesystem-only pause left of it.
            records::drop_paused(self, sandbox_id).await?;
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
        let sealer = self.sealer.clone();
        row.as_ref()
            .map(|r| binding_from_row(r, &sealer))
            .transpose()
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

    /// Commits, then wakes the watch hub if the change log grew. On
    /// PostgreSQL the `NOTIFY` rides in the transaction, so other replicas
    /// hear of exactly the commits that happened.
    async fn commit(mut self, changed: &Notify) -> Result<()> {
        let grew = self.changes > 0;
        if let Some(notify) = self.notify.filter(|_| grew) {
            sqlx::query(notify).execute(self.conn()).await?;
        }
        self.tx.commit().await?;
        if grew {
            self.committed
                .fetch_max(self.last_revision, Ordering::AcqRel);
            changed.notify_one();
        }
        Ok(())
    }
}

/// The statement that removes a binding: fenced, unless the simulation's
/// `mutations` switch unfenced it.
fn delete_binding() -> &'static str {
    #[cfg(feature = "mutations")]
    if crate::mutations::removals_unfenced() {
        return sql::DELETE_BINDING_UNFENCED;
    }
    sql::DELETE_BINDING
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

/// The stored (sealed) text of a binding's `envVars`.
fn sealed_env(sealer: &Sealer, sandbox_id: &str, env: &BTreeMap<String, String>) -> String {
    sealer.seal(sandbox_id, seal::ENV_VARS, &map_json(env))
}

/// The stored (sealed) text of a binding's access token.
fn sealed_token(sealer: &Sealer, sandbox_id: &str, token: &str) -> String {
    sealer.seal(sandbox_id, seal::ACCESS_TOKEN, token)
}

fn binding_from_row(r: &AnyRow, sealer: &Sealer) -> Result<BindingRow> {
    let sandbox_id: String = r.try_get("sandbox_id")?;
    let open = |column: &'static str| -> Result<String> {
        let stored: String = r.try_get(column)?;
        sealer
            .open(&sandbox_id, column, &stored)
            .map_err(|e| Error::Corrupt(e.to_string()))
    };
    let env_vars = json_map(&open(seal::ENV_VARS)?, "env_vars")?;
    let access_token = open(seal::ACCESS_TOKEN)?;
    let egress_ca = open(seal::EGRESS_CA)?;
    Ok(BindingRow {
        sandbox_id: sandbox_id.clone(),
        node_id: r.try_get("node_id")?,
        endpoint: r.try_get("endpoint")?,
        generation: to_u64(r.try_get("generation")?, "generation")?,
        state: parse_state(r.try_get("state")?)?,
        team_id: r.try_get("team_id")?,
        template_id: r.try_get("template_id")?,
        started_at_ms: r.try_get("started_at_ms")?,
        end_at_ms: r.try_get("end_at_ms")?,
        metadata: json_map(r.try_get("metadata")?, "metadata")?,
        env_vars,
        access_token,
        egress_ca,
        cpu_count: to_u32(r.try_get("cpu_count")?, "cpu_count")?,
        memory_mb: to_u32(r.try_get("memory_mb")?, "memory_mb")?,
        assigned_at_ms: r.try_get("assigned_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        lifecycle: Lifecycle {
            auto_pause: r.try_get::<i64, _>("auto_pause")? != 0,
            auto_resume: r.try_get::<i64, _>("auto_resume")? != 0,
        },
    })
}

/// The scheduler's storage operations, each one transaction. Cheap to share
/// behind an `Arc` and safe to call concurrently.
///
/// Every write runs to completion on its own task ([`SqlStore::detached`]):
/// an RPC whose caller goes away (a gateway killed mid-request) is dropped
/// by tonic, and a transaction dropped half-way would go back to the pool
/// still open, failing the next writes on that connection.
impl SqlStore {
    /// Runs `op` on its own task, so dropping the caller cannot cut a
    /// transaction short.
    async fn detached<T, F, Fut>(&self, op: F) -> Result<T>
    where
        F: FnOnce(SqlStore) -> Fut,
        Fut: Future<Output = Result<T>> + Send + 'static,
        T: Send + 'static,
    {
        if let Some(exec) = &self.exec {
            return run_on(exec, op(self.clone()));
        }
        match tokio::spawn(op(self.clone())).await {
            Ok(r) => r,
            Err(e) => Err(Error::Internal(format!("store task ended early: {e}"))),
        }
    }

    /// Registers (or re-registers) a node and reconciles its roster: with a new
    /// incarnation, its bindings missing from the roster are removed (fenced);
    /// LOST bindings in the roster come back RUNNING.
    pub async fn register_node(
        &self,
        reg: NodeRegistration,
        timing: NodeTiming,
    ) -> Result<Reconciled> {
        self.detached(|s| async move { nodes::register(&s, reg, timing).await })
            .await
    }

    /// Renews a node's lease (fenced on its incarnation) and reconciles its
    /// roster; a RUNNING/PAUSED binding the roster has lacked for
    /// `timing.roster_grace` is removed (fenced).
    pub async fn heartbeat(
        &self,
        node_id: &str,
        incarnation: u64,
        roster: &[SandboxRef],
        timing: NodeTiming,
    ) -> Result<Reconciled> {
        self.heartbeat_with_layers(node_id, incarnation, (roster, None), None, timing)
            .await
    }

    /// [`SqlStore::heartbeat`], replacing the layers the node's cache holds
    /// when `cached_layers` is given; `roster` is what the node hosts and,
    /// of it, what is paused there (`None`: a node that does not say).
    pub async fn heartbeat_with_layers(
        &self,
        node_id: &str,
        incarnation: u64,
        roster: (&[SandboxRef], Option<&[SandboxRef]>),
        cached_layers: Option<Vec<String>>,
        timing: NodeTiming,
    ) -> Result<Reconciled> {
        let (node_id, hosted, paused) = (
            node_id.to_string(),
            roster.0.to_vec(),
            roster.1.map(<[SandboxRef]>::to_vec),
        );
        self.detached(|s| async move {
            nodes::heartbeat(
                &s,
                &node_id,
                incarnation,
                (&hosted, paused.as_deref()),
                cached_layers.as_deref(),
                timing,
            )
            .await
        })
        .await
    }

    /// Places a new sandbox (or returns the one its idempotency key names).
    pub async fn place(&self, spec: PlaceSpec) -> Result<Placed> {
        self.detached(|s| async move { bindings::place(&s, spec).await })
            .await
    }

    /// Moves a sandbox to a (new) node: new generation, CREATING, emits MOVED.
    pub async fn reassign(&self, sandbox_id: &str, node_id: Option<&str>) -> Result<BindingRow> {
        let (id, node) = (sandbox_id.to_string(), node_id.map(str::to_string));
        self.detached(|s| async move { bindings::reassign(&s, &id, node.as_deref()).await })
            .await
    }

    /// CREATING → RUNNING at exactly `(node_id, generation)`; idempotent.
    pub async fn record_assignment(
        &self,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
    ) -> Result<BindingRow> {
        let (id, node) = (sandbox_id.to_string(), node_id.to_string());
        self.detached(
            |s| async move { bindings::record_assignment(&s, &id, &node, generation).await },
        )
        .await
    }

    /// Applies one node-reported event, fenced on `(node_id, generation)`.
    pub async fn apply_event(&self, node_id: &str, event: &NodeEvent) -> Result<EventOutcome> {
        let (node, event) = (node_id.to_string(), event.clone());
        self.detached(|s| async move { bindings::apply_event(&s, &node, &event).await })
            .await
    }

    /// The highest generation ever issued: anything above it is from the future.
    pub async fn issued_generation(&self) -> Result<u64> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { sweep::issued_generation(&s).await });
        }
        sweep::issued_generation(self).await
    }

    /// Fails with `FailedPrecondition` unless the node is registered.
    pub async fn require_node(&self, node_id: &str) -> Result<()> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), node_id.to_string());
            return run_on(exec, async move { nodes::require(&s, &id).await });
        }
        nodes::require(self, node_id).await
    }

    /// Seals again, under the key that seals now, up to `batch` bindings'
    /// tokens, `envVars` and egress CAs stored under another key or before sealing
    /// existed (one write transaction), of those whose id sorts after
    /// `after` ("" for the first batch). Returns how many it looked at and
    /// the last one's id, the next batch's `after`; `None` when none is
    /// left. Safe beside other replicas doing the same: a row is rewritten
    /// only if it still holds what was read.
    pub async fn reseal(&self, after: &str, batch: u32) -> Result<Option<Resealed>> {
        let rows = sqlx::query(sql::UNSEALED_BATCH)
            .bind(self.sealer.current_pattern())
            .bind(after)
            .bind(i64::from(batch))
            .fetch_all(&self.reader)
            .await?;
        let Some(last) = rows.last() else {
            return Ok(None);
        };
        let last: String = last.try_get("sandbox_id")?;
        let mut tx = self.write().await?;
        let mut sealed = 0;
        for r in &rows {
            let id: String = r.try_get("sandbox_id")?;
            let (token, env, ca): (String, String, String) = (
                r.try_get("access_token")?,
                r.try_get("env_vars")?,
                r.try_get("egress_ca")?,
            );
            let open = |column, stored: &str| {
                self.sealer
                    .open(&id, column, stored)
                    .map_err(|e| Error::Corrupt(e.to_string()))
            };
            let new_token = sealed_token(&self.sealer, &id, &open(seal::ACCESS_TOKEN, &token)?);
            let new_env = self
                .sealer
                .seal(&id, seal::ENV_VARS, &open(seal::ENV_VARS, &env)?);
            let new_ca = self
                .sealer
                .seal(&id, seal::EGRESS_CA, &open(seal::EGRESS_CA, &ca)?);
            sealed += sqlx::query(sql::RESEAL)
                .bind(&new_token)
                .bind(&new_env)
                .bind(&new_ca)
                .bind(&id)
                .bind(&token)
                .bind(&env)
                .bind(&ca)
                .execute(tx.conn())
                .await?
                .rows_affected() as usize;
        }
        tx.commit(&self.changed).await?;
        tracing::debug!(sealed, looked_at = rows.len(), "store: sealed again");
        Ok(Some(Resealed {
            looked_at: rows.len(),
            last,
        }))
    }

    /// The id of the key the store seals with now.
    pub fn sealing_key_id(&self) -> &str {
        self.sealer.current_id()
    }

    /// One binding, if it exists.
    pub async fn get(&self, sandbox_id: &str) -> Result<Option<BindingRow>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), sandbox_id.to_string());
            return run_on(exec, async move { s.get_now(&id).await });
        }
        self.get_now(sandbox_id).await
    }

    async fn get_now(&self, sandbox_id: &str) -> Result<Option<BindingRow>> {
        let row = sqlx::query(sql::BINDING_BY_ID)
            .bind(sandbox_id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref()
            .map(|r| binding_from_row(r, &self.sealer))
            .transpose()
    }

    /// A page of bindings matching `filter`, and where the next one starts.
    pub async fn list(&self, filter: &ListFilter) -> Result<(Vec<BindingRow>, Option<ListCursor>)> {
        if let Some(exec) = &self.exec {
            let (s, f) = (self.clone(), filter.clone());
            return run_on(exec, async move { bindings::list(&s, &f).await });
        }
        bindings::list(self, filter).await
    }

    /// Every node with its sandbox count and lease-derived state.
    /// Marks a node unreachable until its next heartbeat: nothing is placed
    /// on it meanwhile. False when it is unknown or already marked.
    pub async fn mark_unreachable(&self, node_id: &str) -> Result<bool> {
        let id = node_id.to_string();
        self.detached(|s| async move { nodes::mark_unreachable(&s, &id).await })
            .await
    }

    pub async fn list_nodes(&self) -> Result<Vec<NodeRow>> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { nodes::list(&s).await });
        }
        nodes::list(self).await
    }

    /// Sets a sandbox's end; an end in the past makes it EXPIRING.
    pub async fn set_end_at(&self, sandbox_id: &str, end_at_ms: i64) -> Result<BindingRow> {
        let id = sandbox_id.to_string();
        self.detached(|s| async move { bindings::set_end_at(&s, &id, end_at_ms).await })
            .await
    }

    /// The oldest retained and the newest revision in the change log.
    pub async fn change_bounds(&self) -> Result<ChangeBounds> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { sweep::change_bounds(&s).await });
        }
        sweep::change_bounds(self).await
    }

    /// Up to `limit` changes with a revision above `after`, oldest first.
    pub async fn changes_after(&self, after: u64, limit: u32) -> Result<Vec<Change>> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(
                exec,
                async move { sweep::changes_after(&s, after, limit).await },
            );
        }
        sweep::changes_after(self, after, limit).await
    }

    /// One pass of every sweep (see `crate::sweep`).
    pub async fn sweep(&self, settings: &SweepSettings) -> Result<SweepReport> {
        if let Some(exec) = &self.exec {
            let (s, settings) = (self.clone(), *settings);
            return run_on(exec, async move { sweep::run(&s, &settings).await });
        }
        sweep::run(self, settings).await
    }

    /// Counts for the state gauges.
    pub async fn census(&self) -> Result<Census> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { sweep::census(&s).await });
        }
        sweep::census(self).await
    }

    /// Notified after every commit that wrote to the change log, so the watch
    /// hub tails the log only when there is something new.
    pub fn change_signal(&self) -> Arc<Notify> {
        self.changed.clone()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The reseal's batch query finds its start by the primary key, on
    /// SQLite where the planner's choice is fixed by the schema: a scan
    /// from the table's first row per batch is what made a pass over a
    /// million bindings quadratic.
    #[tokio::test]
    async fn the_reseal_batch_starts_at_its_cursor_by_the_primary_key() {
        let dir = tempfile::tempdir().unwrap();
        let store = SqlStore::open_sqlite_file(
            dir.path().join("scheduler.db"),
            1,
            Arc::new(Sealer::ephemeral()),
        )
        .await
        .unwrap();
        let plan: Vec<String> = sqlx::query(&format!("EXPLAIN QUERY PLAN {}", sql::UNSEALED_BATCH))
            .bind("sealed:v1:x:%")
            .bind("sbx")
            .bind(100_i64)
            .fetch_all(&store.reader)
            .await
            .unwrap()
            .iter()
            .map(|r| r.try_get::<String, _>(3).unwrap())
            .collect();
        assert_eq!(
            plan,
            ["SEARCH bindings USING INDEX sqlite_autoindex_bindings_1 (sandbox_id>?)"],
            "{plan:?}"
        );
        store.close().await;
    }
}
