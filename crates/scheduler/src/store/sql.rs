//! The SQL text every backend shares: `$N` placeholders (SQLite and
//! PostgreSQL both bind them by number), standard types, `RETURNING` and
//! `ON CONFLICT`, which both speak. Queries that take "now" take it as a
//! parameter from the backend's clock function.
//!
//! Fenced statements are marked **fenced**: they name
//! `(sandbox_id, node_id, generation)` and the caller acts on the affected-row count.

macro_rules! binding_columns {
    () => {
        "sandbox_id, node_id, endpoint, generation, state, team_id, template_id, \
         started_at_ms, end_at_ms, metadata, env_vars, access_token, cpu_count, memory_mb, \
         assigned_at_ms, updated_at_ms, auto_pause, auto_resume, egress_ca"
    };
}

macro_rules! route_columns {
    () => {
        "sandbox_id, node_id, endpoint, generation, state, team_id, auto_resume"
    };
}

// ---- counters and the change log ----

/// Bumps a counter (`generation` or `revision`) and returns the new value.
/// Writers run one at a time (the write lock, `backend.rs`), so revisions
/// become visible in commit order and tailing `revision > cursor` is safe.
pub const NEXT_COUNTER: &str =
    "UPDATE counters SET value = value + 1 WHERE name = $1 RETURNING value";
pub const COUNTER: &str = "SELECT value FROM counters WHERE name = $1";
pub const INSERT_CHANGE: &str = "INSERT INTO changes \
     (revision, kind, sandbox_id, node_id, generation, state, at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7)";
pub const CHANGE_BOUNDS: &str = "SELECT (SELECT MIN(revision) FROM changes), \
     (SELECT value FROM counters WHERE name = 'revision')";
pub const CHANGES_AFTER: &str =
    "SELECT revision, kind, sandbox_id, node_id, generation, state, at_ms \
     FROM changes WHERE revision > $1 ORDER BY revision LIMIT $2";
pub const PRUNE_CHANGES: &str = "DELETE FROM changes WHERE revision <= $1";

// ---- nodes ----

pub const NODE_INCARNATION: &str = "SELECT incarnation, endpoint FROM nodes WHERE node_id = $1";
/// A registration replaces everything but the first registration time of the
/// same incarnation.
pub const UPSERT_NODE: &str = "INSERT INTO nodes \
     (node_id, endpoint, capacity, incarnation, lease_expires_at_ms, registered_at_ms, state, roster, roster_at_ms, cached_layers, volume_store, volume_max_bytes) \
     VALUES ($1, $2, $3, $4, $5, $6, 'up', $7, $6, $8, $9, $10) \
     ON CONFLICT (node_id) DO UPDATE SET \
       endpoint = excluded.endpoint, capacity = excluded.capacity, \
       registered_at_ms = CASE WHEN nodes.incarnation = excluded.incarnation \
         THEN nodes.registered_at_ms ELSE excluded.registered_at_ms END, \
       incarnation = excluded.incarnation, \
       lease_expires_at_ms = excluded.lease_expires_at_ms, state = 'up', \
       roster = excluded.roster, roster_at_ms = excluded.roster_at_ms, \
       cached_layers = excluded.cached_layers, unreachable_since_ms = NULL, \
       volume_store = excluded.volume_store, volume_max_bytes = excluded.volume_max_bytes";
/// Fenced on the incarnation: a heartbeat from a replaced process renews nothing.
/// A heartbeat also ends an "unreachable" report: the node is alive again.
/// `$6` NULL keeps the cached layers reported before.
pub const RENEW_NODE: &str = "UPDATE nodes SET lease_expires_at_ms = $3, state = 'up', \
     roster = $4, roster_at_ms = $5, unreachable_since_ms = NULL, \
     cached_layers = COALESCE($6, cached_layers) \
     WHERE node_id = $1 AND incarnation = $2";
/// A gateway could not connect to the node; kept until its next heartbeat.
pub const MARK_NODE_UNREACHABLE: &str = "UPDATE nodes SET unreachable_since_ms = $2 \
     WHERE node_id = $1 AND unreachable_since_ms IS NULL";
pub const NODE_BINDINGS: &str =
    "SELECT sandbox_id, generation, state, endpoint, missing_since_ms, auto_pause, updated_at_ms \
     FROM bindings WHERE node_id = $1";
pub const NODE_FOR_PLACEMENT: &str =
    "SELECT n.node_id, n.endpoint, n.capacity, n.lease_expires_at_ms, n.sandboxes, \
     n.volume_store FROM nodes n WHERE n.node_id = $1";
/// The least loaded node (by share of capacity used) whose lease is valid at
/// `$1`, other than `$2`; within the least loaded quarter, one whose cache
/// holds layer `$3` first (`$3` is a LIKE pattern, `%<digest>%`, or `%`
/// for none: a digest holds no `%` or `_`); with a volume store `$4`
/// (`shared`), or any (`''`).
/// Reads the nodes' kept counts (`nodes.sandboxes`), so its cost does not
/// grow with the number of sandboxes.
pub const LEAST_LOADED_NODE: &str =
    "SELECT n.node_id, n.endpoint, n.capacity, n.lease_expires_at_ms, n.sandboxes \
     FROM nodes n \
     WHERE n.lease_expires_at_ms > $1 AND n.node_id <> $2 AND n.unreachable_since_ms IS NULL \
     AND n.sandboxes < n.capacity AND ($4 = '' OR n.volume_store = $4) \
     ORDER BY (n.sandboxes * 4) / n.capacity, \
       CASE WHEN n.cached_layers LIKE $3 THEN 0 ELSE 1 END, \
       (n.sandboxes * 1000000) / n.capacity, n.sandboxes, n.node_id \
     LIMIT 1";
/// Keeps `nodes.sandboxes` in step: `$2` is +1 for a binding added to node
/// `$1`, -1 for one removed from it; in the transaction that does it.
pub const COUNT_NODE_SANDBOXES: &str =
    "UPDATE nodes SET sandboxes = sandboxes + $2 WHERE node_id = $1";
pub const LIST_NODES: &str = "SELECT n.node_id, n.endpoint, n.capacity, n.incarnation, \
     n.lease_expires_at_ms, n.registered_at_ms, \
     n.sandboxes, n.unreachable_since_ms, n.cached_layers \
     FROM nodes n ORDER BY n.node_id";
pub const NODE_ROSTER: &str = "SELECT roster, roster_at_ms FROM nodes WHERE node_id = $1";

// ---- bindings ----

pub const BINDING_BY_ID: &str = concat!(
    "SELECT ",
    binding_columns!(),
    " FROM bindings WHERE sandbox_id = $1"
);
/// What `LookupNode` answers with, and nothing else: the hot read of
/// every gateway's cache misses (no metadata, environment or token to
/// fetch and decode).
pub const ROUTE_BY_ID: &str = concat!(
    "SELECT ",
    route_columns!(),
    " FROM bindings WHERE sandbox_id = $1"
);
/// The routes of bindings in id order after `$1`, `$2` at most: the route
/// view's load at start.
pub const ROUTES_AFTER: &str = concat!(
    "SELECT ",
    route_columns!(),
    " FROM bindings WHERE sandbox_id > $1 ORDER BY sandbox_id LIMIT $2"
);
/// The routes of `n` sandboxes, `$1` to `$n` (at least one).
pub fn routes_by_ids(n: usize) -> String {
    let mut q = concat!(
        "SELECT ",
        route_columns!(),
        " FROM bindings WHERE sandbox_id IN ("
    )
    .to_string();
    for i in 1..=n.max(1) {
        if i > 1 {
            q.push_str(", ");
        }
        q.push_str(&format!("${i}"));
    }
    q.push(')');
    q
}
pub const BINDING_BY_KEY: &str = concat!(
    "SELECT ",
    binding_columns!(),
    " FROM bindings WHERE team_id = $1 AND idempotency_key = $2"
);
pub const SANDBOX_ID_TAKEN: &str = "SELECT COUNT(*) FROM bindings WHERE sandbox_id = $1";
pub const INSERT_BINDING: &str = concat!(
    "INSERT INTO bindings (",
    binding_columns!(),
    ", idempotency_key) VALUES \
     ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14, $15, $16, $17, $18, $19, $20)"
);
/// The list query before its optional filters; see `sqlstore/bindings.rs`.
pub const LIST_BINDINGS_PREFIX: &str =
    concat!("SELECT ", binding_columns!(), " FROM bindings WHERE ");
/// **fenced** Moves a binding to a new node and generation.
pub const REASSIGN: &str = "UPDATE bindings SET node_id = $4, endpoint = $5, generation = $6, \
     state = 'creating', assigned_at_ms = $7, updated_at_ms = $7, missing_since_ms = NULL \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3";
/// **fenced** State change from exactly state `$5`.
pub const SET_STATE: &str = "UPDATE bindings SET state = $4, updated_at_ms = $6 \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3 AND state = $5";
/// **fenced** An auto-pause sandbox's node froze it at its end: EXPIRING
/// to PAUSED, only for a binding created with `auto_pause`.
pub const PAUSE_AT_END: &str = "UPDATE bindings SET state = 'paused', updated_at_ms = $4 \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3 \
     AND state = 'expiring' AND auto_pause = 1";
/// **fenced** Follows a node's new endpoint.
pub const SET_ENDPOINT: &str = "UPDATE bindings SET endpoint = $4, updated_at_ms = $5 \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3";
/// **fenced** When the node's roster started lacking the binding (NULL: it lists it).
pub const SET_MISSING_SINCE: &str = "UPDATE bindings SET missing_since_ms = $4 \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3";
/// **fenced** Removes a binding.
pub const DELETE_BINDING: &str =
    "DELETE FROM bindings WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3";
/// [`DELETE_BINDING`] without its fence: the `mutations` feature's
/// broken variant (crate::mutations), never used otherwise.
#[cfg(feature = "mutations")]
pub const DELETE_BINDING_UNFENCED: &str =
    "DELETE FROM bindings WHERE sandbox_id = $1 AND $2 = $2 AND $3 = $3";
/// **fenced** New end time and (maybe) state.
pub const SET_END_AT: &str = "UPDATE bindings SET end_at_ms = $4, state = $5, updated_at_ms = $6 \
     WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3";

// ---- team quotas ----

/// A team's sandboxes that count against --quota-sandboxes: all of them,
/// paused ones too (a paused sandbox keeps its node slot and its memory or
/// disk there, so they would otherwise let one team take every slot).
pub const TEAM_SANDBOXES: &str = "SELECT COUNT(*) FROM bindings WHERE team_id = $1";
pub const TEAM_BUDGET: &str = "SELECT tokens, at_ms FROM team_create_budget WHERE team_id = $1";
pub const UPSERT_TEAM_BUDGET: &str = "INSERT INTO team_create_budget (team_id, tokens, at_ms) \
     VALUES ($1, $2, $3) ON CONFLICT (team_id) DO UPDATE SET tokens = excluded.tokens, at_ms = excluded.at_ms";

// ---- sweeps ----

pub const NODES_PAST_LEASE: &str =
    "SELECT node_id, lease_expires_at_ms FROM nodes WHERE state = 'up' AND lease_expires_at_ms <= $1";
/// Conditional on the lease still being expired: a heartbeat that renewed it
/// in the meantime wins.
pub const MARK_NODE_DOWN: &str = "UPDATE nodes SET state = 'down' \
     WHERE node_id = $1 AND state = 'up' AND lease_expires_at_ms <= $2";
/// A paused sandbox never expires (kept until deleted; resuming gives it a
/// new end time).
pub const BINDINGS_PAST_END: &str = "SELECT sandbox_id, node_id, generation, state FROM bindings \
     WHERE end_at_ms <= $1 AND state IN ('creating', 'running', 'lost') \
     ORDER BY end_at_ms LIMIT $2";
/// One node's running bindings past `end_at` (the heartbeat expires them
/// at once, so the node kills them in the same round trip).
pub const NODE_BINDINGS_PAST_END: &str = "SELECT sandbox_id, generation FROM bindings \
     WHERE node_id = $1 AND end_at_ms <= $2 AND state = 'running'";
/// The earliest end of one node's running bindings.
pub const NODE_NEXT_END: &str =
    "SELECT MIN(end_at_ms) FROM bindings WHERE node_id = $1 AND state = 'running'";
/// Bindings paused (by their last state change) at or before `$1`.
pub const PAUSED_SINCE: &str = "SELECT sandbox_id, node_id, generation FROM bindings \
     WHERE state = 'paused' AND updated_at_ms <= $1 ORDER BY updated_at_ms LIMIT $2";
/// **fenced** A paused binding past the retention: EXPIRING with
/// `auto_pause` cleared, so its node deletes it rather than pausing it again.
pub const RETIRE_PAUSED: &str = "UPDATE bindings SET state = 'expiring', auto_pause = 0, \
     updated_at_ms = $4 WHERE sandbox_id = $1 AND node_id = $2 AND generation = $3 \
     AND state = 'paused'";
pub const STUCK_CREATES: &str =
    "SELECT sandbox_id, node_id, generation, assigned_at_ms FROM bindings \
     WHERE state = 'creating' AND assigned_at_ms <= $1 ORDER BY assigned_at_ms LIMIT $2";
pub const BINDING_CENSUS: &str = "SELECT state, COUNT(*) FROM bindings GROUP BY state";
pub const NODE_CENSUS: &str = "SELECT \
     COALESCE(SUM(CASE WHEN lease_expires_at_ms > $1 THEN 1 ELSE 0 END), 0), COUNT(*) FROM nodes";

// ---- sealing (store/seal.rs) ----

/// Bindings with a token, `envVars` or egress CA not sealed under the
/// current key (`$1` is `sealed:v1:<key id>:%`), `$3` at most, in id
/// order after `$2`: a pass walks the table once, each batch starting
/// where the last stopped (by the primary key). Without the cursor every
/// batch scanned from the start past the rows already sealed, so a pass
/// over n rows read ~n²/(2 × batch) of them: minutes at a million.
pub const UNSEALED_BATCH: &str = "SELECT sandbox_id, access_token, env_vars, egress_ca \
     FROM bindings WHERE sandbox_id > $2 \
     AND (access_token NOT LIKE $1 OR env_vars NOT LIKE $1 OR egress_ca NOT LIKE $1) \
     ORDER BY sandbox_id LIMIT $3";
/// Stores a binding's values sealed again, unless they changed since read.
pub const RESEAL: &str = "UPDATE bindings SET access_token = $1, env_vars = $2, egress_ca = $3 \
     WHERE sandbox_id = $4 AND access_token = $5 AND env_vars = $6 AND egress_ca = $7";
