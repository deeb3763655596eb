//! The store: the scheduler's one source of truth.
//!
//! [`SqlStore`] is the operations the service and the sweep need, each one a
//! transaction, on two backends:
//! SQLite (embedded, one scheduler process) and PostgreSQL (any number of
//! replicas). They share the schema (`migrations/`), the SQL text (`sql.rs`,
//! `$N` placeholders, which both accept) and the Rust around it (sqlx's
//! `Any` driver); what differs is in [`backend`] (write lock, clock,
//! `NOTIFY`) and [`postgres`] (the change listener and the sweep lease).
//!
//! # Layout
//! - `types.rs`: the values read and written, backend-free; `records.rs`:
//!   the same for the records (template records, unused-blob notes,
//!   builds and their logs, uploads); `volumes.rs`: for volumes and
//!   their mounts.
//! - `sql.rs`: every shared query; `sql_records.rs`: the records' queries;
//!   `sql_secrets.rs`: team secrets' (E2B's `/secrets`).
//!   `migrate.rs`: the schema, applied at start.
//! - [`backend`]: the per-backend statements, and the arguments for the write
//!   lock and for revisions becoming visible in commit order.
//! - `sqlstore/`: [`SqlStore`]: opening, nodes, bindings, sweeps, records.
//! - [`postgres`]: `LISTEN` for other replicas' changes; the advisory-lock
//!   lease that picks the one replica that sweeps.
//!
//! **Invariant (fenced writes):** every write that removes or changes an
//! existing binding is one conditional statement naming
//! `(sandbox_id, node_id, generation)`; its affected-row count decides, and the
//! matching `changes` row is written in the same transaction.
//!
//! **Invariant (fenced records):** every write that changes or removes a
//! record (template record, build, upload, note) is one conditional
//! statement (an expected version, insert-if-absent, a build's owner and
//! live lease) whose affected-row count decides, under the write lock; a
//! loser gets ABORTED, ALREADY_EXISTS or FAILED_PRECONDITION and nothing of
//! its transaction stays.
//!
//! **Invariant (one clock):** lease and deadline comparisons use the store's
//! clock (SQLite: the local clock; PostgreSQL: the server's
//! `clock_timestamp()`), never a replica's or a caller's.

pub mod backend;
mod migrate;
pub mod postgres;
pub mod records;
pub mod seal;
mod sql;
mod sql_records;
mod sql_secrets;
mod sqlstore;
pub mod types;
pub mod volumes;

pub use backend::Backend;
pub use records::*;
pub use sqlstore::{redact_url, Executor, OpenError, SqlStore, LINE_COST};
pub use types::*;
pub use volumes::{MountRequest, MountRow, VolumeBounds, VolumeRouteRow, VolumeRow, VolumeState};
