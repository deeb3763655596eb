//! The records' SQL text (template records, unused-blob notes, builds and
//! their logs, uploads), shared by both backends like `sql.rs`. Sums are
//! cast to BIGINT: PostgreSQL's `SUM(BIGINT)` is NUMERIC.
//!
//! Conditional statements are marked **fenced**: the caller acts on the
//! affected-row count.

macro_rules! record_columns {
    () => {
        "name, kind, team_id, digest, layers, defaults, source, images, snapshot, \
         source_sandbox, created_at_ms, updated_at_ms, version"
    };
}

macro_rules! build_columns {
    () => {
        "build_id, team_id, template_name, status, request, plan, owner, lease_expires_at_ms, \
         requested_at_ms, start_deadline_ms, retention_ms, started_at_ms, finished_at_ms, \
         expires_at_ms, reason_message, reason_step, log_bytes, log_next_seq, log_truncated, \
         log_batch"
    };
}

macro_rules! upload_columns {
    () => {
        "team_id, files_hash, blob_digest, size_bytes, created_at_ms, expires_at_ms, version"
    };
}

/// A build a reader may still see at time `$N`: not waiting past its
/// start deadline, not finished past its retention.
macro_rules! build_visible {
    ($now:literal) => {
        concat!(
            "NOT ((status = 'waiting' AND start_deadline_ms <= ",
            $now,
            ") OR (status IN ('ready', 'error') AND expires_at_ms <= ",
            $now,
            "))"
        )
    };
}

// ---- template records ----

pub const RECORD_BY_NAME: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM template_records WHERE name = $1"
);
/// **fenced** Insert-if-absent: 0 rows when the name is taken. `$14` is
/// the name it is public under (NULL: not public).
pub const INSERT_RECORD: &str = concat!(
    "INSERT INTO template_records (",
    record_columns!(),
    ", public_name) VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11, $12, $13, $14) \
     ON CONFLICT (name) DO NOTHING"
);
/// **fenced** Replaces exactly version `$14` of the team `$3` owns; `$15`
/// the name it is public under.
pub const REPLACE_RECORD: &str = "UPDATE template_records SET kind = $2, digest = $4, \
     layers = $5, defaults = $6, source = $7, images = $8, snapshot = $9, source_sandbox = $10, \
     created_at_ms = $11, updated_at_ms = $12, version = $13, public_name = $15 \
     WHERE name = $1 AND team_id = $3 AND version = $14";
pub const RECORDS_WITH_ROOT: &str = "SELECT COUNT(*) FROM template_records WHERE digest = $1";
/// The record (other than `$2`) public under the name `$1`.
pub const PUBLIC_NAME_HOLDER: &str =
    "SELECT name FROM template_records WHERE public_name = $1 AND name <> $2";
/// **fenced** Removes exactly version `$2`.
pub const DELETE_RECORD: &str = "DELETE FROM template_records WHERE name = $1 AND version = $2";
pub const DELETE_RECORD_LAYERS: &str = "DELETE FROM record_layers WHERE record_name = $1";
pub const INSERT_RECORD_LAYER: &str =
    "INSERT INTO record_layers (record_name, position, digest, size_bytes) VALUES ($1, $2, $3, $4)";
/// The list query before its keyset condition; see `sqlstore/records.rs`.
pub const LIST_RECORDS_PREFIX: &str = concat!(
    "SELECT ",
    record_columns!(),
    " FROM template_records WHERE "
);
pub const TEAM_RECORDS_OF_KIND: &str =
    "SELECT COUNT(*) FROM template_records WHERE team_id = $1 AND kind = $2";
/// Each distinct layer of the team's snapshot and built records, once
/// (tags of one build, and snapshots stacked on the team's own, share layers).
pub const TEAM_LAYER_BYTES: &str = "SELECT CAST(COALESCE(SUM(b), 0) AS BIGINT) FROM \
     (SELECT l.digest, MAX(l.size_bytes) AS b FROM record_layers l \
      JOIN template_records r ON r.name = l.record_name \
      WHERE r.team_id = $1 AND r.kind IN ('snapshot', 'built') GROUP BY l.digest) t";

// ---- unused blobs ----

/// The note's time is the last note's (the last record's end).
pub const NOTE_BLOB: &str = "INSERT INTO unused_blobs (digest, noted_at_ms) VALUES ($1, $2) \
     ON CONFLICT (digest) DO UPDATE SET noted_at_ms = excluded.noted_at_ms";
pub const DUE_BLOBS: &str = "SELECT digest, noted_at_ms FROM unused_blobs \
     WHERE noted_at_ms <= $1 AND digest > $2 ORDER BY digest LIMIT $3";
pub const BLOB_NOTE: &str = "SELECT noted_at_ms FROM unused_blobs WHERE digest = $1";
/// **fenced** Removes the note made at `$2` unless a record, an upload or
/// a building build names the blob.
pub const REMOVE_BLOB_NOTE: &str = "DELETE FROM unused_blobs WHERE digest = $1 \
     AND noted_at_ms = $2 \
     AND NOT EXISTS (SELECT 1 FROM record_layers WHERE digest = $1) \
     AND NOT EXISTS (SELECT 1 FROM template_records WHERE digest = $1) \
     AND NOT EXISTS (SELECT 1 FROM uploads WHERE blob_digest = $1) \
     AND NOT EXISTS (SELECT 1 FROM build_uploads bu JOIN builds b ON b.build_id = bu.build_id \
       WHERE bu.blob_digest = $1 AND b.status = 'building')";

// ---- builds ----

pub const BUILD_BY_ID: &str = concat!(
    "SELECT ",
    build_columns!(),
    " FROM builds WHERE build_id = $1"
);
/// **fenced** Insert-if-absent.
pub const INSERT_BUILD: &str = concat!(
    "INSERT INTO builds (",
    build_columns!(),
    ") VALUES ($1, $2, $3, 'waiting', $4, '', '', 0, $5, $6, $7, 0, 0, 0, '', '', 0, 0, 0, 0) \
     ON CONFLICT (build_id) DO NOTHING"
);
pub const TEAM_BUILDS_HELD: &str = concat!(
    "SELECT COUNT(*) FROM builds WHERE team_id = $1 AND ",
    build_visible!("$2")
);
pub const ALL_BUILDS_HELD: &str =
    concat!("SELECT COUNT(*) FROM builds WHERE ", build_visible!("$1"));
/// The oldest finished build still readable (of team `$1`; '' for any).
pub const OLDEST_FINISHED_BUILD: &str = "SELECT build_id FROM builds \
     WHERE ($1 = '' OR team_id = $1) AND status IN ('ready', 'error') AND expires_at_ms > $2 \
     ORDER BY finished_at_ms, build_id LIMIT 1";
pub const DELETE_BUILD: &str = "DELETE FROM builds WHERE build_id = $1";
pub const DELETE_BUILD_LOGS: &str = "DELETE FROM build_logs WHERE build_id = $1";
pub const DELETE_BUILD_UPLOADS: &str = "DELETE FROM build_uploads WHERE build_id = $1";
pub const LIST_BUILDS: &str = concat!(
    "SELECT ",
    build_columns!(),
    " FROM builds WHERE team_id = $1 AND ($2 = '' OR template_name = $2) AND ",
    build_visible!("$3"),
    " AND (requested_at_ms < $4 OR (requested_at_ms = $4 AND build_id < $5)) \
     ORDER BY requested_at_ms DESC, build_id DESC LIMIT $6"
);
/// **fenced** WAITING → BUILDING, before its start deadline, for the team
/// and template it was requested for.
pub const CLAIM_BUILD: &str = "UPDATE builds SET status = 'building', owner = $4, \
     lease_expires_at_ms = $5, started_at_ms = $6, plan = $7 \
     WHERE build_id = $1 AND team_id = $2 AND template_name = $3 AND status = 'waiting' \
     AND start_deadline_ms > $6";
pub const INSERT_BUILD_UPLOAD: &str =
    "INSERT INTO build_uploads (build_id, team_id, files_hash, blob_digest) \
     VALUES ($1, $2, $3, $4) ON CONFLICT (build_id, files_hash) DO NOTHING";
/// **fenced** The owner's writes: building, its owner, its lease live at `$3`.
/// Renews the lease to `$4`.
pub const RENEW_BUILD_LEASE: &str = "UPDATE builds SET lease_expires_at_ms = $4 \
     WHERE build_id = $1 AND owner = $2 AND status = 'building' AND lease_expires_at_ms > $3";
/// **fenced** BUILDING → READY/ERROR (`$4`) by its owner under a live lease.
pub const FINISH_BUILD: &str = "UPDATE builds SET status = $4, finished_at_ms = $3, \
     expires_at_ms = $3 + retention_ms, reason_message = $5, reason_step = $6 \
     WHERE build_id = $1 AND owner = $2 AND status = 'building' AND lease_expires_at_ms > $3";
/// **fenced** The owner's fence for an append, and its batch number
/// `$4`: only a batch after the last one is appended.
pub const BUILD_APPEND: &str = "UPDATE builds SET log_batch = $4 \
     WHERE build_id = $1 AND owner = $2 AND status = 'building' AND lease_expires_at_ms > $3 \
     AND log_batch < $4";
pub const SET_BUILD_LOG: &str = "UPDATE builds SET log_bytes = $2, log_next_seq = $3, \
     log_truncated = $4 WHERE build_id = $1";
pub const TEAM_LOG_BYTES: &str =
    "SELECT CAST(COALESCE(SUM(log_bytes), 0) AS BIGINT) FROM builds WHERE team_id = $1";
/// The team's oldest finished build that still keeps log lines.
pub const LOG_VICTIM: &str = "SELECT build_id, log_bytes, log_next_seq FROM builds \
     WHERE team_id = $1 AND status IN ('ready', 'error') AND log_bytes > 0 \
     ORDER BY finished_at_ms, build_id LIMIT 1";
pub const INSERT_LOG_LINE: &str =
    "INSERT INTO build_logs (build_id, seq, at_ms, level, message) VALUES ($1, $2, $3, $4, $5)";
pub const READ_LOG: &str = "SELECT seq, at_ms, level, message FROM build_logs \
     WHERE build_id = $1 AND seq >= $2 ORDER BY seq LIMIT $3";

// ---- uploads ----

pub const UPLOAD_BY_KEY: &str = concat!(
    "SELECT ",
    upload_columns!(),
    " FROM uploads WHERE team_id = $1 AND files_hash = $2"
);
/// **fenced** Insert-if-absent.
pub const INSERT_UPLOAD: &str = concat!(
    "INSERT INTO uploads (",
    upload_columns!(),
    ") VALUES ($1, $2, $3, $4, $5, $6, $7) ON CONFLICT (team_id, files_hash) DO NOTHING"
);
/// **fenced** Replaces exactly version `$8`; with `$9` = 1 only when it
/// expired at `$10` (an insert-if-absent over an expired upload).
pub const REPLACE_UPLOAD: &str = "UPDATE uploads SET blob_digest = $3, size_bytes = $4, \
     created_at_ms = $5, expires_at_ms = $6, version = $7 \
     WHERE team_id = $1 AND files_hash = $2 AND version = $8 \
     AND ($9 = 0 OR expires_at_ms <= $10)";
/// **fenced** Removes exactly version `$3`.
pub const DELETE_UPLOAD: &str =
    "DELETE FROM uploads WHERE team_id = $1 AND files_hash = $2 AND version = $3";
/// Bytes of the team's uploads but the one at `$2`.
pub const TEAM_UPLOAD_BYTES: &str = "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) \
     FROM uploads WHERE team_id = $1 AND files_hash <> $2";
/// Bytes of every upload but the one at `($1, $2)`.
pub const OTHER_UPLOAD_BYTES: &str = "SELECT CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) \
     FROM uploads WHERE NOT (team_id = $1 AND files_hash = $2)";
pub const TEAM_UPLOADS: &str = "SELECT COUNT(*), CAST(COALESCE(SUM(size_bytes), 0) AS BIGINT) \
     FROM uploads WHERE team_id = $1";
pub const TEAM_BUILD_USAGE: &str = concat!(
    "SELECT COUNT(*), CAST(COALESCE(SUM(log_bytes), 0) AS BIGINT) FROM builds \
     WHERE team_id = $1 AND ",
    build_visible!("$2")
);

// ---- sweeps ----

pub const WAITING_PAST_DEADLINE: &str = "SELECT build_id FROM builds \
     WHERE status = 'waiting' AND start_deadline_ms <= $1 ORDER BY start_deadline_ms LIMIT $2";
/// **fenced**
pub const DELETE_WAITING_PAST_DEADLINE: &str = "DELETE FROM builds \
     WHERE build_id = $1 AND status = 'waiting' AND start_deadline_ms <= $2";
pub const FINISHED_PAST_RETENTION: &str = "SELECT build_id FROM builds \
     WHERE status IN ('ready', 'error') AND expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2";
/// **fenced**
pub const DELETE_FINISHED_PAST_RETENTION: &str = "DELETE FROM builds \
     WHERE build_id = $1 AND status IN ('ready', 'error') AND expires_at_ms <= $2";
pub const LEASES_PAST: &str = "SELECT build_id, owner, lease_expires_at_ms, log_next_seq \
     FROM builds WHERE status = 'building' AND lease_expires_at_ms <= $1 \
     ORDER BY lease_expires_at_ms LIMIT $2";
/// **fenced** A build whose owner stopped renewing its lease: ERROR.
pub const FAIL_LOST_BUILD: &str = "UPDATE builds SET status = 'error', finished_at_ms = $2, \
     expires_at_ms = $2 + retention_ms, reason_message = $3, reason_step = '', \
     log_next_seq = log_next_seq + 1 \
     WHERE build_id = $1 AND status = 'building' AND lease_expires_at_ms <= $2";
pub const UPLOADS_PAST_EXPIRY: &str = "SELECT team_id, files_hash, blob_digest FROM uploads \
     WHERE expires_at_ms <= $1 ORDER BY expires_at_ms LIMIT $2";
/// **fenced**
pub const DELETE_EXPIRED_UPLOAD: &str =
    "DELETE FROM uploads WHERE team_id = $1 AND files_hash = $2 AND expires_at_ms <= $3";

// ---- ended sandboxes' logs ----

pub const DELETE_SANDBOX_LOG: &str = "DELETE FROM sandbox_logs WHERE sandbox_id = $1";
pub const INSERT_SANDBOX_LOG_LINE: &str = "INSERT INTO sandbox_logs (sandbox_id, seq, \
     team_id, at_ms, level, logger, message, fields, bytes, ended_at_ms, expires_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8, $9, $10, $11)";
pub const TEAM_SANDBOX_LOG_BYTES: &str =
    "SELECT CAST(COALESCE(SUM(bytes), 0) AS BIGINT) FROM sandbox_logs WHERE team_id = $1";
/// The team's oldest ended sandbox with kept lines, but `$2`.
pub const OLDEST_SANDBOX_LOG: &str = "SELECT sandbox_id FROM sandbox_logs \
     WHERE team_id = $1 AND sandbox_id <> $2 ORDER BY ended_at_ms, sandbox_id LIMIT 1";
pub const DROP_OLDEST_SANDBOX_LOG_LINE: &str = "DELETE FROM sandbox_logs WHERE sandbox_id = $1 \
     AND seq = (SELECT MIN(seq) FROM sandbox_logs WHERE sandbox_id = $1)";
pub const READ_SANDBOX_LOG: &str = "SELECT at_ms, level, logger, message, fields \
     FROM sandbox_logs WHERE sandbox_id = $1 AND team_id = $2 AND expires_at_ms > $3 \
     ORDER BY seq";
pub const SANDBOX_LOGS_PAST_RETENTION: &str = "SELECT DISTINCT sandbox_id FROM sandbox_logs \
     WHERE expires_at_ms <= $1";
pub const DELETE_SANDBOX_LOGS_PAST_RETENTION: &str =
    "DELETE FROM sandbox_logs WHERE expires_at_ms <= $1";
