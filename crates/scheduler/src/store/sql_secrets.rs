//! The secrets' queries (`sqlstore/secrets.rs`); `$N` placeholders as in
//! `sql.rs`. Every query names the team: a team reaches only its own.

macro_rules! secret_columns {
    () => {
        "secret_id, team_id, name, version, metadata, created_at_ms, updated_at_ms"
    };
}

pub const SECRET_BY_ID: &str = concat!(
    "SELECT ",
    secret_columns!(),
    " FROM secrets WHERE team_id = $1 AND secret_id = $2"
);
pub const SECRET_BY_NAME: &str = concat!(
    "SELECT ",
    secret_columns!(),
    " FROM secrets WHERE team_id = $1 AND name = $2"
);
pub const SECRET_ID_BY_NAME: &str =
    "SELECT secret_id FROM secrets WHERE team_id = $1 AND name = $2";
/// The only query that reads a value: for `resolve_secrets`.
pub const SECRET_VALUE_BY_NAME: &str =
    "SELECT secret_id, value FROM secrets WHERE team_id = $1 AND name = $2";
pub const TEAM_SECRETS: &str = "SELECT COUNT(*) FROM secrets WHERE team_id = $1";
pub const INSERT_SECRET: &str = "INSERT INTO secrets \
     (secret_id, team_id, name, version, value, metadata, created_at_ms, updated_at_ms) \
     VALUES ($1, $2, $3, $4, $5, $6, $7, $8)";
pub const UPDATE_SECRET: &str = "UPDATE secrets SET version = $1, value = $2, metadata = $3, \
     updated_at_ms = $4 WHERE secret_id = $5 AND team_id = $6";
/// A page by name after `$2` (`''` for the first), `$3` rows.
pub const LIST_SECRETS: &str = concat!(
    "SELECT ",
    secret_columns!(),
    " FROM secrets WHERE team_id = $1 AND name > $2 ORDER BY name LIMIT $3"
);
pub const DELETE_SECRET_BY_ID: &str = "DELETE FROM secrets WHERE team_id = $1 AND secret_id = $2";
pub const DELETE_SECRET_BY_NAME: &str = "DELETE FROM secrets WHERE team_id = $1 AND name = $2";
/// Secrets not sealed under the current secrets key (`$1` its pattern).
pub const UNSEALED_SECRETS: &str =
    "SELECT secret_id, team_id, value FROM secrets WHERE value NOT LIKE $1 LIMIT $2";
/// Unless it changed since read.
pub const RESEAL_SECRET: &str = "UPDATE secrets SET value = $1 WHERE secret_id = $2 AND value = $3";
