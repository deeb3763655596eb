-- warren scheduler schema, version 1.
--
-- Written once for every backend: only BIGINT and TEXT columns, no
-- AUTOINCREMENT/SERIAL (revisions and generations come from `counters`, which
-- also makes revisions commit-ordered on PostgreSQL, where sequence values
-- become visible out of order), upserts via ON CONFLICT, which SQLite and
-- PostgreSQL both speak. Timestamps are milliseconds since the Unix epoch from
-- the store's clock.

-- Monotonic counters, bumped with UPDATE ... RETURNING inside the writing
-- transaction: `generation` (every (re)assignment, global, never reused) and
-- `revision` (every row of `changes`).
CREATE TABLE counters (
    name  TEXT PRIMARY KEY,
    value BIGINT NOT NULL
);
INSERT INTO counters (name, value) VALUES ('generation', 0);
INSERT INTO counters (name, value) VALUES ('revision', 0);

CREATE TABLE nodes (
    node_id             TEXT PRIMARY KEY,
    endpoint            TEXT NOT NULL,
    capacity            BIGINT NOT NULL,
    incarnation         BIGINT NOT NULL,
    -- The liveness lease; a node is UP while this is in the future.
    lease_expires_at_ms BIGINT NOT NULL,
    registered_at_ms    BIGINT NOT NULL,
    -- 'up' or 'down': what the sweep last concluded (bindings were marked lost
    -- when it went down). Placement looks at the lease, not at this.
    state               TEXT NOT NULL,
    -- The roster of the last RegisterNode/Heartbeat, JSON [{"sandbox_id", "generation"}]:
    -- the sweep resolves stuck CREATING bindings with it.
    roster              TEXT NOT NULL,
    roster_at_ms        BIGINT NOT NULL
);

CREATE TABLE bindings (
    sandbox_id      TEXT PRIMARY KEY,
    node_id         TEXT NOT NULL,
    endpoint        TEXT NOT NULL,
    generation      BIGINT NOT NULL,
    -- 'creating' | 'running' | 'paused' | 'lost' | 'expiring'
    state           TEXT NOT NULL,
    team_id         TEXT NOT NULL,
    template_id     TEXT NOT NULL,
    started_at_ms   BIGINT NOT NULL,
    end_at_ms       BIGINT NOT NULL,
    metadata        TEXT NOT NULL,
    env_vars        TEXT NOT NULL,
    access_token    TEXT NOT NULL,
    cpu_count       BIGINT NOT NULL,
    memory_mb       BIGINT NOT NULL,
    -- When the current generation was assigned (Place/Reassign): the clock of
    -- the stuck-create sweep.
    assigned_at_ms  BIGINT NOT NULL,
    updated_at_ms   BIGINT NOT NULL,
    -- NULL when the Place had no key; NULLs never collide in a UNIQUE index
    -- on either backend.
    idempotency_key TEXT
);
CREATE UNIQUE INDEX bindings_idempotency ON bindings (team_id, idempotency_key);
CREATE INDEX bindings_node ON bindings (node_id);
CREATE INDEX bindings_state_end ON bindings (state, end_at_ms);

-- Every binding change, written in the same transaction as the change itself.
-- WatchBindings replays from here; the sweep prunes beyond --watch-retention.
CREATE TABLE changes (
    revision   BIGINT PRIMARY KEY,
    -- 'assigned' | 'moved' | 'removed' | 'lost' | 'state'
    kind       TEXT NOT NULL,
    sandbox_id TEXT NOT NULL,
    node_id    TEXT NOT NULL,
    generation BIGINT NOT NULL,
    -- The binding's state after the change; '' when removed.
    state      TEXT NOT NULL,
    at_ms      BIGINT NOT NULL
);
