//! The node's volume endpoints (docs/internals.md "Control API"): a
//! gateway makes and removes a volume's data on the node that holds it, and
//! forwards E2B's content calls there.
//!
//! - `PUT /_warren/v1/volumes/{id}` (body [`EnsureVolume`]): makes the
//!   volume's data if it is not there (idempotent); answers [`VolumeInfo`].
//! - `DELETE /_warren/v1/volumes/{id}`: removes it (`204`, also when it
//!   was not there).
//! - `GET|PATCH|DELETE /_warren/v1/volumes/{id}/path`, `GET|POST .../dir`,
//!   `GET|PUT .../file`: E2B's `/volumecontent/{id}/...` calls, query and
//!   body as the client sent them, answered in E2B's shapes. A node whose
//!   store does not hold the volume answers `404` with
//!   `X-Warren-Route: not-found` before reading the body.

use serde::{Deserialize, Serialize};

/// `/_warren/v1/volumes`.
pub const VOLUMES: &str = "/_warren/v1/volumes";

/// `/_warren/v1/volumes/{id}`.
pub fn volume_path(id: &str) -> String {
    format!("{VOLUMES}/{id}")
}

/// `PUT /_warren/v1/volumes/{id}` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct EnsureVolume {
    /// Its size limit as the scheduler recorded it (0: none); a node caps
    /// it at its own `--volume-max-bytes`.
    #[serde(default)]
    pub max_bytes: u64,
}

/// What a node says about a volume it holds.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeInfo {
    pub volume_id: String,
    /// The limit the node enforces (0: none).
    #[serde(default)]
    pub max_bytes: u64,
    /// Bytes in use now (of the filesystem holding it, for a local
    /// volume; 0 when the store cannot say cheaply).
    #[serde(default)]
    pub used_bytes: u64,
}

/// A volume a sandbox mounts (in [`super::CreateSandbox::volumes`]).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct VolumeMount {
    /// Where inside the sandbox (checked by [`crate::volume::mount_path`]).
    pub path: String,
    pub volume_id: String,
    /// As [`EnsureVolume::max_bytes`].
    #[serde(default)]
    pub max_bytes: u64,
    /// The volume is in the shared store (else in this node's own).
    #[serde(default)]
    pub shared: bool,
}
