//! The node control API (docs/internals.md "Control API"): the JSON the
//! gateway sends and the node answers, defined once so both sides compile
//! against the same types.
//!
//! Unknown fields are ignored on both sides, so a part upgraded before the
//! other keeps working as long as new fields are optional (`#[serde(default)]`).

pub mod metrics;
pub mod volumes;

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// Where the control API lives on the node's listener.
pub const PREFIX: &str = "/_warren/v1/";
/// `POST` creates here; `GET` lists.
pub const SANDBOXES: &str = "/_warren/v1/sandboxes";

/// `POST` (no body) asks the node to heartbeat now rather than at its next
/// interval: a gateway that shortened a sandbox's end (`SetTimeout`) sends
/// it, so the node learns the new end (`next_end_in_ms`) before it passes.
/// `204`; the heartbeat itself runs in the background.
pub const HEARTBEAT: &str = "/_warren/v1/heartbeat";

/// `DELETE`/`GET` one sandbox: `/_warren/v1/sandboxes/{id}`.
pub fn sandbox_path(id: &str) -> String {
    format!("{SANDBOXES}/{id}")
}

/// `POST` a fork of `parent`: `/_warren/v1/sandboxes/{parent}/fork`.
pub fn fork_path(parent: &str) -> String {
    format!("{SANDBOXES}/{parent}/fork")
}

/// `PUT` replaces a running sandbox's egress policy (body: a
/// [`crate::network::NetworkPolicy`]):
/// `/_warren/v1/sandboxes/{id}/network?generation=g`. `204`; `501` when the
/// node's runtime has no network isolation to change.
pub fn network_path(id: &str, generation: u64) -> String {
    format!("{SANDBOXES}/{id}/network?generation={generation}")
}

/// `POST` freezes (`pause`) or thaws (`resume`) a sandbox in place:
/// `/_warren/v1/sandboxes/{id}/{action}?generation=g`.
pub fn freeze_path(id: &str, action: &str, generation: u64) -> String {
    format!("{SANDBOXES}/{id}/{action}?generation={generation}")
}

/// `POST` a snapshot of a sandbox (body [`CreateSnapshot`], answer
/// [`SnapshotMade`]): `/_warren/v1/sandboxes/{id}/snapshot`.
pub fn snapshot_path(id: &str) -> String {
    format!("{SANDBOXES}/{id}/snapshot")
}

/// `POST /_warren/v1/sandboxes/{id}/snapshot` body: make a template of the
/// sandbox's filesystem and record it as `snapshot_id` in the node's
/// template store (replacing a record of that name).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CreateSnapshot {
    /// The sandbox's generation, as the caller believes it is hosted.
    pub generation: u64,
    /// The template record's name (a valid template name).
    pub snapshot_id: String,
    /// The team that owns it.
    pub team_id: String,
    /// The name the team gave it, if any.
    #[serde(default)]
    pub name: Option<String>,
}

/// The answer to [`CreateSnapshot`].
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SnapshotMade {
    pub snapshot_id: String,
    /// The new layer's digest (`sha256-<hex>`).
    #[serde(default)]
    pub layer: String,
    /// How many layers the snapshot stacks on its template's root.
    #[serde(default)]
    pub layers: usize,
    #[serde(default)]
    pub node_id: String,
    /// The snapshot's record (a `warren_template::Template` as JSON), for
    /// the gateway to keep: set by a node whose layers go to a blob store,
    /// which keeps no records; absent from one that wrote the record into
    /// its shared `--template-dir`.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub record: Option<serde_json::Value>,
}

/// The envd API version nodes report for their sandboxes (`envd_version` in
/// [`SandboxInfo`], the SDK's `envdVersion`).
///
/// The e2b SDK (2.63) gates features on it (`e2b/envd/versions.py`):
/// 0.1.4 recursive watching, 0.3.0 `stdin` on Start, 0.4.0 default user (no
/// `username` sent), 0.5.2 CloseStdin, 0.5.7 `application/octet-stream`
/// (and gzip) uploads, 0.6.2 file metadata (`user.e2b.*` xattrs set by
/// `X-Metadata-*` upload headers), 0.6.3 `include_entry` in watch events,
/// 0.6.4 `allow_network_mounts` on watches — all of which warren envd
/// implements. Raise it only with the feature a newer version gates.
pub const ENVD_VERSION: &str = "0.6.4";

/// `POST /_warren/v1/sandboxes` body.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct CreateSandbox {
    pub sandbox_id: String,
    pub generation: u64,
    #[serde(default)]
    pub template_id: String,
    #[serde(default)]
    pub env_vars: BTreeMap<String, String>,
    #[serde(default)]
    pub metadata: BTreeMap<String, String>,
    /// envd's access token; kept in memory only, never written to disk.
    #[serde(default)]
    pub access_token: Option<String>,
    #[serde(default)]
    pub timeout_secs: Option<u64>,
    /// Egress policy; absent: open internet (E2B's default).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::NetworkPolicy>,
    /// E2B's traffic access token (`allowPublicTraffic: false`): requests
    /// to the sandbox's ports other than envd's must carry it in
    /// `e2b-traffic-access-token`. Kept in memory; only its SHA-256 is
    /// written to disk.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub traffic_access_token: Option<String>,
    /// E2B's `maskRequestHost`: the Host header requests to the sandbox's
    /// ports (other than envd's) arrive with, `${PORT}` replaced.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    /// E2B's `autoPauseMemory: false` with `autoPause`: at its end the node
    /// pauses it filesystem-only (see [`PauseSandbox`]) instead of
    /// freezing it. A fork copies its parent's.
    #[serde(default, skip_serializing_if = "std::ops::Not::not")]
    pub auto_pause_filesystem_only: bool,
    /// The template's record as the gateway resolved it (a
    /// `warren_template::Template` as JSON: root digest, layers, defaults).
    /// A node whose layers come from a blob store has no records of its
    /// own and needs it; one reading a shared `--template-dir` uses it
    /// when given, else reads the record named `template_id` there.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub template_record: Option<serde_json::Value>,
    /// The volumes it mounts (E2B's `volumeMounts`), bind-mounted
    /// read-write at their paths. A fork mounts its parent's (this is then
    /// empty); a boot after a filesystem-only pause mounts what its create
    /// did.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub volumes: Vec<volumes::VolumeMount>,
}

/// What a node records with a filesystem-paused sandbox's layer
/// (`warren_template::Paused::settings`) for a gateway to boot it again on
/// another node: its create's settings that the scheduler does not keep.
/// Never a secret (the access token and environment stay with the
/// scheduler; the traffic access token is derived from the access token).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PausedSettings {
    /// Its egress policy at the pause.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<crate::network::NetworkPolicy>,
    /// Its ports need the traffic access token (`allowPublicTraffic: false`).
    #[serde(default)]
    pub private_ports: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
    #[serde(default)]
    pub auto_pause_filesystem_only: bool,
}

/// `POST /_warren/v1/sandboxes/{id}/pause?generation=g` body (`{}` and an
/// absent body pause with memory kept).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct PauseSandbox {
    /// False: a filesystem-only pause — every process is killed and the
    /// sandbox's files kept; a resume boots it again from them (isolated
    /// runtime; `501` elsewhere). Absent or true: frozen in place.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub memory: Option<bool>,
}

/// `POST /_warren/v1/sandboxes/{id}/resume?generation=g` body (`{}` and an
/// absent body resume either kind of pause).
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct ResumeSandbox {
    /// False: a sandbox paused filesystem-only is not booted again (a
    /// data-plane request's auto-resume, which E2B does not do for such a
    /// pause): `409` with [`NOT_RESUMABLE`] in the message, still paused.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub cold_boot: Option<bool>,
}

/// What a node's `409` says when a resume with `cold_boot: false` found
/// the sandbox paused filesystem-only.
pub const NOT_RESUMABLE: &str = "is paused filesystem-only";

/// What a sandbox's network looks like now (no secrets): E2B's
/// `SandboxDetail.network` and `allowInternetAccess`.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct NetworkInfo {
    #[serde(flatten)]
    pub policy: crate::network::NetworkPolicy,
    /// False when requests to its ports need the traffic access token.
    pub allow_public_traffic: bool,
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub mask_request_host: Option<String>,
}

/// `POST /_warren/v1/sandboxes/{id}/fork` body.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ForkSandbox {
    /// The parent's generation, as the caller believes it is hosted.
    pub generation: u64,
    pub child: CreateSandbox,
}

/// A hosted sandbox as the control API reports it.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxInfo {
    pub sandbox_id: String,
    pub generation: u64,
    #[serde(default)]
    pub template_id: String,
    #[serde(default)]
    pub node_id: String,
    #[serde(default)]
    pub started_at_ms: i64,
    #[serde(default)]
    pub envd_version: String,
    /// Its network now (absent from nodes that predate it).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub network: Option<NetworkInfo>,
    /// The template store's layers it stacks (`sha256-<hex>`, bottom
    /// first; in the list only): how a gateway learns that a layer no
    /// record names is still in use before it removes it.
    #[serde(default, skip_serializing_if = "Vec::is_empty")]
    pub layers: Vec<String>,
    /// A filesystem-only pause's record of the sandbox (a
    /// `warren_template::Template` named `paused-<id>`, as JSON), in the
    /// pause's answer from a node whose layers go to a blob store, which
    /// keeps no records: the gateway writes it into the scheduler's store.
    /// Absent from every other answer, and from a node that wrote it into
    /// its shared `--template-dir` (or could not pack the layer).
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub paused_record: Option<serde_json::Value>,
}

/// `GET /_warren/v1/sandboxes`: what the node hosts now.
#[derive(Debug, Clone, Default, Serialize, Deserialize, PartialEq, Eq)]
pub struct SandboxList {
    #[serde(default)]
    pub sandboxes: Vec<SandboxInfo>,
}

/// Every error answer: E2B's `{"code", "message"}`.
#[derive(Debug, Clone, Serialize, Deserialize, PartialEq, Eq)]
pub struct ErrorBody {
    #[serde(default)]
    pub code: u16,
    pub message: String,
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_create_from_a_newer_gateway_still_parses() {
        let body = r#"{"sandbox_id":"abc","generation":3,"from_the_future":1}"#;
        let req: CreateSandbox = serde_json::from_str(body).expect("parses");
        assert_eq!((req.sandbox_id.as_str(), req.generation), ("abc", 3));
        assert_eq!(fork_path("abc"), "/_warren/v1/sandboxes/abc/fork");
    }
}
