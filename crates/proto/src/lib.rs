//! warren's scheduler API, `warren.scheduler.v1`.
//!
//! # Layout
//! - [`scheduler::v1`]: messages, the tonic client (`scheduler_client`) and
//!   server (`scheduler_server`), generated from
//!   `proto/warren/scheduler/v1/scheduler.proto` at build time.
//! - [`client`]: the scheduler client gateways and nodes share (`--scheduler`
//!   syntax, replica failover, timeouts).
//! - [`REASON_METADATA`]: the gRPC metadata key that refines a status code
//!   (e.g. `node-down` on `FAILED_PRECONDITION` from `LookupNode`).

pub mod client;

pub mod scheduler {
    pub mod v1 {
        #![allow(clippy::all, missing_docs, rust_2018_idioms)]
        tonic::include_proto!("warren.scheduler.v1");
    }
}

/// gRPC metadata key whose value says why a call failed, where the status code
/// alone is ambiguous.
pub const REASON_METADATA: &str = "warren-reason";
/// `REASON_METADATA` value: the sandbox's node lost its lease.
pub const REASON_NODE_DOWN: &str = "node-down";
/// `REASON_METADATA` value: no live node has capacity.
pub const REASON_NO_CAPACITY: &str = "no-capacity";
/// `REASON_METADATA` value: the team is at one of its quotas.
pub const REASON_QUOTA: &str = "quota";
