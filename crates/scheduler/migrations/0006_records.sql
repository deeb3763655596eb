-- warren scheduler schema, version 6: the records that lived on one
-- machine's disk (the template store's `templates/*.json` and `unused/`)
-- or in one gateway's memory (template builds, their logs, COPY uploads).
-- Gateways read and write them through the scheduler's API; every change
-- is one conditional statement under the write lock (see
-- `store/sqlstore/records.rs`, `builds.rs`, `uploads.rs`).

-- Every record and upload version comes from this counter, so a version
-- is never issued twice: a record deleted and made again never matches
-- the version a writer read before.
INSERT INTO counters (name, value) VALUES ('record_version', 0);

-- Template records: operator templates (`base`), teams' snapshots
-- (`snap-...`) and built templates (one per tag), filesystem-paused
-- sandboxes' own records (`paused-<id>`).
CREATE TABLE template_records (
    name          TEXT PRIMARY KEY,
    -- 'operator' | 'snapshot' | 'built' | 'paused'
    kind          TEXT NOT NULL,
    -- The owning team; '' for operator and paused records.
    team_id       TEXT NOT NULL,
    -- `sha256-<hex>` of the root filesystem.
    digest        TEXT NOT NULL,
    -- JSON [{"digest", "size_bytes"}], bottom first; `record_layers`
    -- holds the same, one row each, for the queries.
    layers        TEXT NOT NULL,
    -- JSON: user, workdir, env, start and ready commands, resources.
    defaults      TEXT NOT NULL,
    source        TEXT NOT NULL,
    -- JSON ["ubuntu:22.04", ...]
    images        TEXT NOT NULL,
    -- JSON {name, source_sandbox, node_id, paused}; '' for operator records.
    snapshot      TEXT NOT NULL,
    -- The snapshot's source sandbox ('' for none), for listing by it.
    source_sandbox TEXT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    updated_at_ms BIGINT NOT NULL,
    version       BIGINT NOT NULL
);
CREATE INDEX template_records_team ON template_records (team_id, kind);
CREATE INDEX template_records_created ON template_records (created_at_ms, name);
CREATE INDEX template_records_digest ON template_records (digest);

-- Each record's layers, written and removed with the record: which
-- records name a blob, and what a team's layers weigh.
CREATE TABLE record_layers (
    record_name TEXT NOT NULL,
    position    BIGINT NOT NULL,
    digest      TEXT NOT NULL,
    size_bytes  BIGINT NOT NULL,
    PRIMARY KEY (record_name, position)
);
CREATE INDEX record_layers_digest ON record_layers (digest);

-- Blobs that lost their last record (a deleted or replaced record's
-- layers, an expired upload's archive), each at the time of its last note.
CREATE TABLE unused_blobs (
    digest      TEXT PRIMARY KEY,
    noted_at_ms BIGINT NOT NULL
);
CREATE INDEX unused_blobs_noted ON unused_blobs (noted_at_ms);

-- Template builds (E2B's build API), readable through any gateway.
CREATE TABLE builds (
    build_id            TEXT PRIMARY KEY,
    team_id             TEXT NOT NULL,
    template_name       TEXT NOT NULL,
    -- 'waiting' | 'building' | 'ready' | 'error'
    status              TEXT NOT NULL,
    -- JSON objects: what was requested; the steps ('' until claimed).
    request             TEXT NOT NULL,
    plan                TEXT NOT NULL,
    -- The gateway running it and until when ('' and 0 until claimed).
    owner               TEXT NOT NULL,
    lease_expires_at_ms BIGINT NOT NULL,
    requested_at_ms     BIGINT NOT NULL,
    -- A waiting build is gone at this time (its request's start TTL).
    start_deadline_ms   BIGINT NOT NULL,
    -- How long it stays readable once finished.
    retention_ms        BIGINT NOT NULL,
    started_at_ms       BIGINT NOT NULL,
    finished_at_ms      BIGINT NOT NULL,
    -- finished_at_ms + retention_ms; 0 until finished.
    expires_at_ms       BIGINT NOT NULL,
    reason_message      TEXT NOT NULL,
    reason_step         TEXT NOT NULL,
    -- What its kept log lines cost (text + a fixed cost per line).
    log_bytes           BIGINT NOT NULL,
    log_next_seq        BIGINT NOT NULL,
    -- 1 once lines were dropped (and the log said so).
    log_truncated       BIGINT NOT NULL,
    -- The owner's last append batch: a batch sent again (its answer was
    -- lost) is not appended twice.
    log_batch           BIGINT NOT NULL
);
CREATE INDEX builds_team ON builds (team_id, requested_at_ms);
CREATE INDEX builds_status ON builds (status);

CREATE TABLE build_logs (
    build_id TEXT NOT NULL,
    seq      BIGINT NOT NULL,
    at_ms    BIGINT NOT NULL,
    level    TEXT NOT NULL,
    message  TEXT NOT NULL,
    PRIMARY KEY (build_id, seq)
);

-- The uploads a claimed build reads, with their archives' blobs: a blob
-- a building build names is never removed, even once its upload expired.
CREATE TABLE build_uploads (
    build_id    TEXT NOT NULL,
    team_id     TEXT NOT NULL,
    files_hash  TEXT NOT NULL,
    blob_digest TEXT NOT NULL,
    PRIMARY KEY (build_id, files_hash)
);
CREATE INDEX build_uploads_blob ON build_uploads (blob_digest);

-- COPY's uploaded archives: a team's files hash -> the archive's blob.
CREATE TABLE uploads (
    team_id       TEXT NOT NULL,
    files_hash    TEXT NOT NULL,
    blob_digest   TEXT NOT NULL,
    size_bytes    BIGINT NOT NULL,
    created_at_ms BIGINT NOT NULL,
    expires_at_ms BIGINT NOT NULL,
    version       BIGINT NOT NULL,
    PRIMARY KEY (team_id, files_hash)
);
CREATE INDEX uploads_expiry ON uploads (expires_at_ms);
CREATE INDEX uploads_blob ON uploads (blob_digest);
