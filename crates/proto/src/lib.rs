//! warren's scheduler API, `warren.scheduler.v1`.
//!
//! # Layout
//! - [`scheduler::v1`]: messages, the tonic client (`scheduler_client`) and
//!   server (`scheduler_server`), generated from
//!   `proto/warren/scheduler/v1/scheduler.proto` (and the records' messages,
//!   `records.proto`) at build time.
//! - [`client`]: the scheduler client gateways and nodes share (`--scheduler`
//!   syntax, replica failover, timeouts).
//! - [`records`]: template records (`warren_template::Template`) as the
//!   scheduler stores them, and back.
//! - [`REASON_METADATA`]: the gRPC metadata key that refines a status code
//!   (e.g. `node-down` on `FAILED_PRECONDITION` from `LookupNode`), and
//!   [`BOUND_METADATA`], which names the bound a refused write would pass.

pub mod client;
pub mod records;

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
/// `REASON_METADATA` value: the team is at one of its quotas (or bounds:
/// then [`BOUND_METADATA`] says which).
pub const REASON_QUOTA: &str = "quota";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): the build was claimed
/// already (it started, or finished).
pub const REASON_BUILD_STARTED: &str = "build-started";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): the caller does not
/// hold the build's lease (another owner, the lease ran out, or the
/// build is no longer building): stop running it.
pub const REASON_LEASE_LOST: &str = "lease-lost";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): a build names an
/// upload its team does not have (never made, or expired).
pub const REASON_UPLOAD_MISSING: &str = "upload-missing";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): a sandbox mounts the
/// volume, so it cannot be deleted.
pub const REASON_VOLUME_MOUNTED: &str = "volume-mounted";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): the volume is being
/// deleted, so nothing new mounts it.
pub const REASON_VOLUME_DELETING: &str = "volume-deleting";
/// `REASON_METADATA` value (`FAILED_PRECONDITION`): no live node has a
/// volume store (of the kind needed).
pub const REASON_NO_VOLUME_STORE: &str = "no-volume-store";

/// gRPC metadata key on a `RESOURCE_EXHAUSTED` (`warren-reason: quota`)
/// that names the bound a write would pass (one of the `BOUND_*` values),
/// for the caller to name its own flag.
pub const BOUND_METADATA: &str = "warren-bound";
/// A team's snapshots (`RecordBounds.max_snapshots`).
pub const BOUND_SNAPSHOTS: &str = "snapshots";
/// A team's built templates, each tag one (`RecordBounds.max_templates`).
pub const BOUND_TEMPLATES: &str = "templates";
/// The bytes of a team's layers (`RecordBounds.max_layer_bytes`).
pub const BOUND_LAYER_BYTES: &str = "layer-bytes";
/// A team's builds held (`BuildBounds.max_team_builds`).
pub const BOUND_TEAM_BUILDS: &str = "team-builds";
/// Every team's builds held (`BuildBounds.max_total_builds`).
pub const BOUND_TOTAL_BUILDS: &str = "total-builds";
/// The bytes of a team's uploads (`UploadBounds.max_team_bytes`).
pub const BOUND_TEAM_UPLOAD_BYTES: &str = "team-upload-bytes";
/// The bytes of every team's uploads (`UploadBounds.max_total_bytes`).
pub const BOUND_TOTAL_UPLOAD_BYTES: &str = "total-upload-bytes";
/// A team's volumes (`VolumeBounds.max_count`).
pub const BOUND_TEAM_VOLUMES: &str = "team-volumes";
/// A team's volumes' size limits added up (`VolumeBounds.max_bytes`).
pub const BOUND_TEAM_VOLUME_BYTES: &str = "team-volume-bytes";
