//! The store: the scheduler's one source of truth.
//!
//! [`Store`] is the operations the service and the sweep need, each one a
//! transaction. There is one implementation, [`SqlStore`], on two backends:
//! SQLite (embedded, one scheduler process) and PostgreSQL (any number of
//! replicas). They share the schema (`migrations/`), the SQL text (`sql.rs`,
//! `$N` placeholders, which both accept) and the Rust around it (sqlx's
//! `Any` driver); what differs is in [`backend`] (write lock, clock,
//! `NOTIFY`) and [`postgres`] (the change listener and the sweep lease).
//!
//! # Layout
//! - `types.rs`: the values read and written, backend-free.
//! - `sql.rs`: every shared query. `migrate.rs`: the schema, applied at start.
//! - [`backend`]: the per-backend statements, and the arguments for the write
//!   lock and for revisions becoming visible in commit order.
//! - `sqlstore/`: [`SqlStore`]: opening, nodes, bindings, sweeps.
//! - [`postgres`]: `LISTEN` for other replicas' changes; the advisory-lock
//!   lease that picks the one replica that sweeps.
//!
//! **Invariant (fenced writes):** every write that removes or changes an
//! existing binding is one conditional statement naming
//! `(sandbox_id, node_id, generation)`; its affected-row count decides, and the
//! matching `changes` row is written in the same transaction.
//!
//! **Invariant (one clock):** lease and deadline comparisons use the store's
//! clock (SQLite: the local clock; PostgreSQL: the server's
//! `clock_timestamp()`), never a replica's or a caller's.

pub mod backend;
mod migrate;
pub mod postgres;
mod sql;
mod sqlstore;
pub mod types;

pub use backend::Backend;
pub use sqlstore::{redact_url, OpenError, SqlStore};
pub use types::*;

use crate::error::Result;
use std::future::Future;
use std::sync::Arc;
use tokio::sync::Notify;

/// The scheduler's storage operations. Implementations are cheap to share
/// behind an `Arc` and safe to call concurrently.
pub trait Store: Send + Sync + 'static {
    /// Registers (or re-registers) a node and reconciles its roster: with a new
    /// incarnation, its bindings missing from the roster are removed (fenced);
    /// LOST bindings in the roster come back RUNNING.
    fn register_node(
        &self,
        reg: NodeRegistration,
        timing: NodeTiming,
    ) -> impl Future<Output = Result<Reconciled>> + Send;

    /// Renews a node's lease (fenced on its incarnation) and reconciles its
    /// roster; a RUNNING/PAUSED binding the roster has lacked for
    /// `timing.roster_grace` is removed (fenced).
    fn heartbeat(
        &self,
        node_id: &str,
        incarnation: u64,
        roster: &[SandboxRef],
        timing: NodeTiming,
    ) -> impl Future<Output = Result<Reconciled>> + Send;

    /// Places a new sandbox (or returns the one its idempotency key names).
    fn place(&self, spec: PlaceSpec) -> impl Future<Output = Result<Placed>> + Send;

    /// Moves a sandbox to a (new) node: new generation, CREATING, emits MOVED.
    fn reassign(
        &self,
        sandbox_id: &str,
        node_id: Option<&str>,
    ) -> impl Future<Output = Result<BindingRow>> + Send;

    /// CREATING → RUNNING at exactly `(node_id, generation)`; idempotent.
    fn record_assignment(
        &self,
        sandbox_id: &str,
        node_id: &str,
        generation: u64,
    ) -> impl Future<Output = Result<BindingRow>> + Send;

    /// Applies one node-reported event, fenced on `(node_id, generation)`.
    fn apply_event(
        &self,
        node_id: &str,
        event: &NodeEvent,
    ) -> impl Future<Output = Result<EventOutcome>> + Send;

    /// The highest generation ever issued: anything above it is from the future.
    fn issued_generation(&self) -> impl Future<Output = Result<u64>> + Send;

    /// Fails with `FailedPrecondition` unless the node is registered.
    fn require_node(&self, node_id: &str) -> impl Future<Output = Result<()>> + Send;

    /// One binding, if it exists.
    fn get(&self, sandbox_id: &str) -> impl Future<Output = Result<Option<BindingRow>>> + Send;

    /// A page of bindings matching `filter`, and the id to continue after.
    fn list(
        &self,
        filter: &ListFilter,
    ) -> impl Future<Output = Result<(Vec<BindingRow>, Option<String>)>> + Send;

    /// Every node with its sandbox count and lease-derived state.
    fn list_nodes(&self) -> impl Future<Output = Result<Vec<NodeRow>>> + Send;

    /// Sets a sandbox's end; an end in the past makes it EXPIRING.
    fn set_end_at(
        &self,
        sandbox_id: &str,
        end_at_ms: i64,
    ) -> impl Future<Output = Result<BindingRow>> + Send;

    /// The oldest retained and the newest revision in the change log.
    fn change_bounds(&self) -> impl Future<Output = Result<ChangeBounds>> + Send;

    /// Up to `limit` changes with a revision above `after`, oldest first.
    fn changes_after(
        &self,
        after: u64,
        limit: u32,
    ) -> impl Future<Output = Result<Vec<Change>>> + Send;

    /// One pass of every sweep (see `crate::sweep`).
    fn sweep(&self, settings: &SweepSettings) -> impl Future<Output = Result<SweepReport>> + Send;

    /// Counts for the state gauges.
    fn census(&self) -> impl Future<Output = Result<Census>> + Send;

    /// Notified after every commit that wrote to the change log, so the watch
    /// hub tails the log only when there is something new.
    fn change_signal(&self) -> Arc<Notify>;
}
