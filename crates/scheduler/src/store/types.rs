//! The values the store reads and writes, independent of any backend.

use std::collections::BTreeMap;
use std::time::Duration;

/// A binding's lifecycle state, stored as lowercase text.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash)]
pub enum State {
    /// Placed; the node has not confirmed the create yet.
    Creating,
    /// The node confirmed it; routable.
    Running,
    /// Paused on its node; still routed there.
    Paused,
    /// Its node's lease expired; requests answer "node down".
    Lost,
    /// Past `end_at`; waiting for its node to kill it.
    Expiring,
}

impl State {
    /// Every state, for gauges.
    pub const ALL: [State; 5] = [
        State::Creating,
        State::Running,
        State::Paused,
        State::Lost,
        State::Expiring,
    ];

    /// The stored (and metric label) spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            State::Creating => "creating",
            State::Running => "running",
            State::Paused => "paused",
            State::Lost => "lost",
            State::Expiring => "expiring",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<State> {
        State::ALL.into_iter().find(|st| st.as_str() == s)
    }
}

/// What a `changes` row says happened (see `ChangeKind` in the .proto).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum ChangeKind {
    /// Became routable (RUNNING) at (node, generation).
    Assigned,
    /// Reassigned to a new node/generation.
    Moved,
    /// Gone.
    Removed,
    /// Its node lost its lease.
    Lost,
    /// Any other state change.
    State,
}

impl ChangeKind {
    /// The stored spelling.
    pub fn as_str(self) -> &'static str {
        match self {
            ChangeKind::Assigned => "assigned",
            ChangeKind::Moved => "moved",
            ChangeKind::Removed => "removed",
            ChangeKind::Lost => "lost",
            ChangeKind::State => "state",
        }
    }

    /// Parses the stored spelling.
    pub fn parse(s: &str) -> Option<ChangeKind> {
        [
            ChangeKind::Assigned,
            ChangeKind::Moved,
            ChangeKind::Removed,
            ChangeKind::Lost,
            ChangeKind::State,
        ]
        .into_iter()
        .find(|k| k.as_str() == s)
    }
}

/// A sandbox a node reports hosting, at a generation.
#[derive(
    Debug, Clone, PartialEq, Eq, Hash, PartialOrd, Ord, serde::Serialize, serde::Deserialize,
)]
pub struct SandboxRef {
    /// The sandbox.
    pub sandbox_id: String,
    /// The generation the node created it at.
    pub generation: u64,
}

/// What happens to a sandbox at its end and to a paused one on traffic
/// (E2B's autoPause / autoResume); the default kills at the end and resumes
/// only explicitly.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Lifecycle {
    /// Paused instead of killed at its end.
    pub auto_pause: bool,
    /// Resumed by a data-plane request while paused.
    pub auto_resume: bool,
}

/// Where a sandbox is: the columns of a binding a route needs.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct RouteRow {
    pub sandbox_id: String,
    pub node_id: String,
    pub endpoint: String,
    pub generation: u64,
    pub state: State,
    pub team_id: String,
    /// `Lifecycle::auto_resume`, for the gateway's data plane.
    pub auto_resume: bool,
}

/// One binding row.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct BindingRow {
    pub sandbox_id: String,
    pub node_id: String,
    pub endpoint: String,
    pub generation: u64,
    pub state: State,
    pub team_id: String,
    pub template_id: String,
    pub started_at_ms: i64,
    pub end_at_ms: i64,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub access_token: String,
    /// The sandbox's egress CA, PEM (`warren_trust::sandbox_ca`; empty for
    /// a binding placed before there were any).
    pub egress_ca: String,
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// When the current generation was assigned.
    pub assigned_at_ms: i64,
    pub updated_at_ms: i64,
    pub lifecycle: Lifecycle,
}

/// One node, as `ListNodes` shows it.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct NodeRow {
    pub node_id: String,
    pub endpoint: String,
    pub capacity: u32,
    pub incarnation: u64,
    /// Whether the lease is still valid by the store's clock.
    pub up: bool,
    /// Bindings currently naming this node.
    pub sandboxes: u32,
    pub lease_expires_at_ms: i64,
    pub registered_at_ms: i64,
    /// When a gateway reported it unreachable (since its last heartbeat).
    pub unreachable_since_ms: Option<i64>,
    /// The layers its cache holds, as its last heartbeat said.
    pub cached_layers: Vec<String>,
}

/// One row of the change log.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Change {
    pub revision: u64,
    pub kind: ChangeKind,
    pub sandbox_id: String,
    pub node_id: String,
    pub generation: u64,
    /// The state after the change; `None` when removed.
    pub state: Option<State>,
    pub at_ms: i64,
}

/// The retained window of the change log.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct ChangeBounds {
    /// Lowest retained revision; `None` when the log is empty.
    pub oldest: Option<u64>,
    /// Highest revision ever written (0 before the first change).
    pub head: u64,
}

/// `RegisterNode`, validated.
#[derive(Debug, Clone)]
pub struct NodeRegistration {
    pub node_id: String,
    pub endpoint: String,
    pub capacity: u32,
    pub incarnation: u64,
    pub roster: Vec<SandboxRef>,
    /// The layers its cache holds (see `nodes.cached_layers`).
    pub cached_layers: Vec<String>,
    /// The roster's sandboxes that are paused on the node.
    pub paused: Vec<SandboxRef>,
    /// Whether `paused` lists every paused one (the rest run).
    pub lists_paused: bool,
    /// Its volume store: '' none, `local` or `shared`.
    pub volume_store: String,
    /// The size limit of each new volume in that store (0: none).
    pub volume_max_bytes: u64,
}

/// How registrations and heartbeats judge a node, from the configuration.
#[derive(Debug, Clone, Copy)]
pub struct NodeTiming {
    /// A registration or heartbeat renews the node's lease for this long.
    pub lease: Duration,
    /// A RUNNING or PAUSED binding that the node's roster (same incarnation)
    /// has lacked for this long is removed: its sandbox died on the node and
    /// the DELETE report never came. Long enough that a roster taken just
    /// before a create finished cannot trigger it.
    pub roster_grace: Duration,
}

/// What a node must do after a register or heartbeat.
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Reconciled {
    /// Hosted but not assigned to it at that generation: kill.
    pub orphans: Vec<SandboxRef>,
    /// Assigned to it but past `end_at`: kill, then report DELETE.
    pub expired: Vec<SandboxRef>,
    /// Assigned to it, past `end_at` and `auto_pause`: freeze, then report
    /// PAUSE (or kill when it cannot).
    pub to_pause: Vec<SandboxRef>,
    /// How long until the next of its running sandboxes ends, if any.
    pub next_end_in: Option<Duration>,
}

/// `Place`, validated and with defaults applied.
#[derive(Debug, Clone, Default)]
pub struct PlaceSpec {
    pub team_id: String,
    pub template_id: String,
    pub cpu_count: u32,
    pub memory_mb: u32,
    /// Lifetime from now; `end_at = now + timeout`.
    pub timeout: Duration,
    pub metadata: BTreeMap<String, String>,
    pub env_vars: BTreeMap<String, String>,
    pub idempotency_key: Option<String>,
    pub require_node_id: Option<String>,
    /// Never this node (a create the gateway could not deliver there).
    pub avoid_node_id: Option<String>,
    /// Prefer a node whose cache holds this layer (see `LEAST_LOADED_NODE`).
    pub prefer_layer: Option<String>,
    /// A fork: copy this sandbox's environment and lifecycle (it must be
    /// the team's).
    pub fork_of: Option<String>,
    pub lifecycle: Lifecycle,
    /// The team's quotas, checked in the same transaction as the insert.
    pub quota: Quota,
    /// Volumes to mount (see `PlaceRequest.volume_mounts`); a fork's are
    /// its parent's.
    pub volume_mounts: Vec<super::MountRequest>,
}

/// A team's limits on new sandboxes; 0 means no limit.
#[derive(Debug, Clone, Copy, Default, PartialEq)]
pub struct Quota {
    /// Most sandboxes (not paused) at once.
    pub max_sandboxes: u32,
    /// Most creates per minute (a token bucket holding one minute's worth).
    pub creates_per_minute: u32,
}

/// The outcome of `Place`.
#[derive(Debug, Clone)]
pub struct Placed {
    pub binding: BindingRow,
    /// The idempotency key matched an earlier placement.
    pub existing: bool,
    /// The volumes it mounts.
    pub mounts: Vec<super::MountRow>,
}

/// A node-reported lifecycle event.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventType {
    Create,
    Delete,
    Pause,
    Resume,
    Fork,
}

/// One event of `ReportSandboxEvent`, validated.
#[derive(Debug, Clone)]
pub struct NodeEvent {
    pub sandbox_id: String,
    pub generation: u64,
    pub kind: EventType,
    /// A PAUSE's paused record of the sandbox (a node's filesystem-only
    /// auto-pause with a blob store), written when the PAUSE applies.
    pub paused_record: Option<super::records::TemplateRecord>,
    /// A DELETE's log of the sandbox, kept when the DELETE applies.
    pub logs: Option<super::records::EndedLog>,
}

/// The result of one event.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct EventOutcome {
    /// The fence matched (the change is, or already was, in effect).
    pub applied: bool,
    /// Why not, or what happened.
    pub reason: String,
}

/// `ListSandboxes`, validated.
#[derive(Debug, Clone, Default)]
pub struct ListFilter {
    pub team_id: Option<String>,
    pub node_id: Option<String>,
    /// Empty: every state.
    pub states: Vec<State>,
    /// Every pair must match.
    pub metadata: BTreeMap<String, String>,
    /// Continue after this sandbox (in `order`).
    pub after: Option<ListCursor>,
    pub limit: u32,
    pub order: ListOrder,
}

/// The order of a listing.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub enum ListOrder {
    /// By sandbox id.
    #[default]
    ById,
    /// Newest `started_at` first, ties by sandbox id descending.
    StartedDesc,
    /// Oldest `started_at` first, ties by sandbox id.
    StartedAsc,
}

/// Where a listing continues: the last sandbox of the previous page (its
/// `started_at` matters for the time orders).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct ListCursor {
    pub sandbox_id: String,
    pub started_at_ms: i64,
}

/// Bounds the sweep works with.
#[derive(Debug, Clone, Copy)]
pub struct SweepSettings {
    /// Whether to take nodes down whose lease expired. Off for one lease
    /// period after the scheduler starts: while it was down nobody could
    /// heartbeat, and that says nothing about the nodes.
    pub expire_nodes: bool,
    /// A CREATING binding older than this is resolved from its node's roster.
    pub creating_timeout: Duration,
    /// How many change rows to keep.
    pub watch_retention: u64,
    /// A binding PAUSED for longer than this goes EXPIRING (its node deletes
    /// it); None keeps paused bindings until deleted.
    pub paused_retention: Option<std::time::Duration>,
}

/// What one sweep pass did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct SweepReport {
    pub nodes_down: u64,
    pub bindings_lost: u64,
    pub bindings_expired: u64,
    /// Paused bindings past `--paused-retention`, gone EXPIRING.
    pub paused_retired: u64,
    pub creates_confirmed: u64,
    pub bindings_removed: u64,
    pub changes_pruned: u64,
    /// Builds past their start TTL (never started) or their retention.
    pub builds_expired: u64,
    /// Building builds whose gateway's lease ran out: failed.
    pub builds_lost: u64,
    /// Uploads past their expiry (their archives' blobs noted).
    pub uploads_expired: u64,
    /// Ended sandboxes whose kept logs passed their retention.
    pub logs_expired: u64,
}

impl SweepReport {
    /// Whether anything changed.
    pub fn is_quiet(&self) -> bool {
        *self == SweepReport::default()
    }
}

/// One batch of [`crate::store::SqlStore::reseal`].
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Resealed {
    /// The bindings the batch read to seal again (a row changed since it
    /// was read is left as its writer wrote it).
    pub looked_at: usize,
    /// The last of them by id: where the next batch starts.
    pub last: String,
}

/// Counts for the state gauges.
#[derive(Debug, Clone, Default)]
pub struct Census {
    pub nodes_up: u64,
    pub nodes_down: u64,
    pub bindings: Vec<(State, u64)>,
}

/// A team secret as reads return it: never its value.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct SecretRow {
    /// `sec_...`.
    pub secret_id: String,
    pub team_id: String,
    /// Lower-cased, unique within the team.
    pub name: String,
    /// The current version: 1 at create, one more at every update.
    pub version: u64,
    pub metadata: BTreeMap<String, String>,
    pub created_at_ms: i64,
    pub updated_at_ms: i64,
}

/// How a request names a secret: by id (`sec_...`) or by name (the
/// `sec_` prefix is reserved for ids, so the two never collide).
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SecretKey {
    Id(String),
    Name(String),
}

impl SecretKey {
    /// `sec_...` is an id; anything else a name, lower-cased.
    pub fn parse(s: &str) -> SecretKey {
        if s.starts_with("sec_") {
            SecretKey::Id(s.to_string())
        } else {
            SecretKey::Name(s.to_ascii_lowercase())
        }
    }

    pub fn as_str(&self) -> &str {
        match self {
            SecretKey::Id(s) | SecretKey::Name(s) => s,
        }
    }

    /// The row query for this key (`$1` team, `$2` the key).
    pub(crate) fn select(&self) -> &'static str {
        match self {
            SecretKey::Id(_) => super::sql_secrets::SECRET_BY_ID,
            SecretKey::Name(_) => super::sql_secrets::SECRET_BY_NAME,
        }
    }

    /// The delete for this key (`$1` team, `$2` the key).
    pub(crate) fn delete(&self) -> &'static str {
        match self {
            SecretKey::Id(_) => super::sql_secrets::DELETE_SECRET_BY_ID,
            SecretKey::Name(_) => super::sql_secrets::DELETE_SECRET_BY_NAME,
        }
    }
}
