//! The values of the records (template records, unused-blob notes,
//! template builds and their logs, COPY uploads), backend-free; the SQL
//! behind them is in `sqlstore/records.rs`, `builds.rs` and `uploads.rs`.

use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;

/// What a template record is, stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum RecordKind {
    /// The operator's (`warren template build|import`): no team, public.
    Operator,
    /// A team's snapshot (`snap-...`).
    Snapshot,
    /// A team's template built through the build API (one per tag).
    Built,
    /// A filesystem-paused sandbox's own record (`paused-<id>`): no team.
    Paused,
}

impl RecordKind {
    pub const ALL: [RecordKind; 4] = [
        RecordKind::Operator,
        RecordKind::Snapshot,
        RecordKind::Built,
        RecordKind::Paused,
    ];

    pub fn as_str(self) -> &'static str {
        match self {
            RecordKind::Operator => "operator",
            RecordKind::Snapshot => "snapshot",
            RecordKind::Built => "built",
            RecordKind::Paused => "paused",
        }
    }

    pub fn parse(s: &str) -> Option<RecordKind> {
        RecordKind::ALL.into_iter().find(|k| k.as_str() == s)
    }

    /// Whether a team owns records of this kind (and they count against
    /// its bounds).
    pub fn is_teams(self) -> bool {
        matches!(self, RecordKind::Snapshot | RecordKind::Built)
    }
}

/// One layer a record stacks on its root, with the size of its blob.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct Layer {
    pub digest: String,
    pub size_bytes: u64,
}

/// What a sandbox of the template starts with (the template crate's
/// `Defaults`, field for field).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct Defaults {
    pub user: String,
    pub workdir: String,
    pub env: BTreeMap<String, String>,
    pub start_cmd: String,
    pub ready_cmd: String,
    pub ready_timeout_secs: u64,
    pub cpu_count: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// What makes a record a snapshot (a team's, a built template, or a
/// paused sandbox's).
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotMeta {
    /// The name the team gave it ('' for none).
    pub name: String,
    pub source_sandbox: String,
    pub node_id: String,
    /// Set on a paused sandbox's own record only.
    pub paused: Option<PausedMeta>,
    /// Published by its team under `name` (at most one record per name).
    #[serde(default)]
    pub public: bool,
}

/// What a filesystem-only pause recorded to boot the sandbox again.
#[derive(Debug, Clone, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct PausedMeta {
    pub generation: u64,
    /// The node's settings for the sandbox, JSON text (opaque here).
    pub settings_json: String,
    /// The layers (of the record's) the pauses of this sandbox made.
    pub own_layers: Vec<String>,
}

/// One template record.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct TemplateRecord {
    pub name: String,
    pub kind: RecordKind,
    /// '' for operator and paused records.
    pub team_id: String,
    pub digest: String,
    pub layers: Vec<Layer>,
    pub defaults: Defaults,
    pub source: String,
    pub images: Vec<String>,
    pub snapshot: Option<SnapshotMeta>,
    pub created_at_ms: i64,
    /// Set by the store.
    pub updated_at_ms: i64,
    /// Set by the store at every write; never issued twice.
    pub version: u64,
}

/// One record to write: insert-if-absent (`expected_version` 0) or
/// replace exactly the version read.
#[derive(Debug, Clone)]
pub struct RecordPut {
    pub record: TemplateRecord,
    pub expected_version: u64,
}

/// One record to delete, at exactly the version read.
#[derive(Debug, Clone)]
pub struct RecordRef {
    pub name: String,
    pub expected_version: u64,
}

/// A team's bounds on its records, checked on the state after a write
/// (0: no bound). A write past one is refused only when it grows what the
/// bound counts, so replacing a record (or tagging a build again) is never
/// refused for a team already at a bound.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct RecordBounds {
    pub max_snapshots: u64,
    pub max_templates: u64,
    pub max_layer_bytes: u64,
}

/// The order of a record listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum RecordOrder {
    #[default]
    ByName,
    /// Newest `created_at` first, then by name.
    CreatedDesc,
}

/// Where a record listing continues.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RecordCursor {
    pub name: String,
    pub created_at_ms: i64,
}

/// `ListTemplateRecords`, validated.
#[derive(Debug, Clone, Default)]
pub struct RecordFilter {
    /// Only this team's records.
    pub team_id: Option<String>,
    /// Empty: every kind.
    pub kinds: Vec<RecordKind>,
    pub source_sandbox: Option<String>,
    pub order: RecordOrder,
    pub after: Option<RecordCursor>,
    pub limit: u32,
    /// Only public records (of every team).
    pub public_only: bool,
}

/// What a team keeps, as the bounds count it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct TeamUsage {
    pub snapshots: u64,
    pub templates: u64,
    /// Each distinct layer of its snapshot and built records, once.
    pub layer_bytes: u64,
    /// Builds held (waiting, building, finished and still readable).
    pub builds: u64,
    pub build_log_bytes: u64,
    pub uploads: u64,
    pub upload_bytes: u64,
}

/// A blob no record names any more, noted for removal.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UnusedBlob {
    pub digest: String,
    pub noted_at_ms: i64,
}

/// What `remove_unused_blob` did.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BlobRemoval {
    /// The note is gone and nothing names the blob: delete it now.
    Removed,
    /// A record, an upload or a building build names it; the note stays.
    Named,
    /// Noted again since the time given: not due yet.
    NotedAgain,
    /// No such note.
    Gone,
}

/// A template build's state, stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BuildStatus {
    Waiting,
    Building,
    Ready,
    Error,
}

impl BuildStatus {
    pub fn as_str(self) -> &'static str {
        match self {
            BuildStatus::Waiting => "waiting",
            BuildStatus::Building => "building",
            BuildStatus::Ready => "ready",
            BuildStatus::Error => "error",
        }
    }

    pub fn parse(s: &str) -> Option<BuildStatus> {
        [
            BuildStatus::Waiting,
            BuildStatus::Building,
            BuildStatus::Ready,
            BuildStatus::Error,
        ]
        .into_iter()
        .find(|b| b.as_str() == s)
    }
}

/// One build.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BuildRow {
    pub build_id: String,
    pub team_id: String,
    pub template_name: String,
    pub status: BuildStatus,
    pub request_json: String,
    pub plan_json: String,
    pub owner: String,
    pub lease_expires_at_ms: i64,
    pub requested_at_ms: i64,
    pub start_deadline_ms: i64,
    pub retention_ms: i64,
    pub started_at_ms: i64,
    pub finished_at_ms: i64,
    pub expires_at_ms: i64,
    pub reason_message: String,
    pub reason_step: String,
    pub log_bytes: u64,
    pub log_next_seq: u64,
    pub log_truncated: bool,
    /// The owner's last append batch.
    pub log_batch: u64,
}

/// `CreateBuild`, validated.
#[derive(Debug, Clone)]
pub struct NewBuild {
    pub build_id: String,
    pub team_id: String,
    pub template_name: String,
    pub request_json: String,
    pub start_ttl_ms: i64,
    pub retention_ms: i64,
    /// 0: no bound.
    pub max_team_builds: u64,
    pub max_total_builds: u64,
}

/// `ClaimBuild`, validated.
#[derive(Debug, Clone)]
pub struct BuildClaim {
    pub build_id: String,
    pub team_id: String,
    pub template_name: String,
    pub owner: String,
    pub lease_ms: i64,
    pub plan_json: String,
    pub upload_hashes: Vec<String>,
}

/// One log line.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct LogLine {
    /// Its place in the build's log (set by the store).
    pub seq: u64,
    pub at_ms: i64,
    pub level: String,
    pub message: String,
}

/// The bounds one append keeps (0: no bound), and how the log's notices
/// name them (the gateway's flags).
#[derive(Debug, Clone, Default)]
pub struct LogBounds {
    pub max_build_bytes: u64,
    pub max_team_bytes: u64,
    pub build_bound_name: String,
    pub team_bound_name: String,
}

/// What one append did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Appended {
    /// The batch was appended before (its answer was lost): nothing now.
    pub repeated: bool,
    pub kept: u32,
    pub dropped: u32,
    pub truncated: bool,
    pub log_bytes: u64,
}

/// One COPY upload.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct UploadRow {
    pub team_id: String,
    pub files_hash: String,
    pub blob_digest: String,
    pub size_bytes: u64,
    pub created_at_ms: i64,
    pub expires_at_ms: i64,
    pub version: u64,
}

/// `PutUpload`, validated.
#[derive(Debug, Clone)]
pub struct NewUpload {
    pub team_id: String,
    pub files_hash: String,
    pub blob_digest: String,
    pub size_bytes: u64,
    pub ttl_ms: i64,
    pub expected_version: u64,
    /// 0: no bound.
    pub max_team_bytes: u64,
    pub max_total_bytes: u64,
}

/// One line of a sandbox's log (E2B's `SandboxLogEntry`), as kept once
/// the sandbox ended.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct SandboxLogLine {
    pub at_ms: i64,
    /// debug, info, warn or error.
    pub level: String,
    /// `envd`, `process`, `node`, ...
    pub logger: String,
    pub message: String,
    pub fields: BTreeMap<String, String>,
}

/// An ended sandbox's log, as its DELETE report carries it, with how long
/// and within what the store keeps it.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct EndedLog {
    /// Oldest first.
    pub lines: Vec<SandboxLogLine>,
    /// Kept this long after the end.
    pub retention_ms: i64,
    /// What a team's kept logs may cost in all (0: no bound); the oldest
    /// ended sandboxes' logs go first.
    pub team_max_bytes: u64,
}
