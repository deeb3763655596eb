//! Entry points for the fuzz targets (`fuzz/`, docs/simulation.md): the
//! parsers of outside bytes that live in this private module, called as
//! their handlers call them. Not an API: nothing else uses these.

use crate::error::ApiError;

/// A control-plane path as the router reads it: whether it names an endpoint.
pub fn endpoint(path: &str) -> bool {
    super::Endpoint::parse(path).is_some()
}

/// `POST /v2/templates/{id}/builds/{buildID}`: the steps (E2B's
/// `TemplateBuildStartV2`, Dockerfile-derived), one line per step.
pub fn build_steps(body: &[u8]) -> Result<Vec<String>, ApiError> {
    super::builds::plan_lines(body)
}

/// A template name as a build request or tag names it (`name` or `name:tag`).
pub fn template_name(called: &str) -> Result<(), ApiError> {
    match called.split_once(':') {
        Some((name, tag)) => {
            super::snapshots::validate_name(name)?;
            super::builds::validate_tag(tag)
        }
        None => super::snapshots::validate_name(called),
    }
}

/// `POST /sandboxes/{id}/snapshots`: the optional snapshot name.
pub fn snapshot_request(body: &[u8]) -> Result<Option<String>, ApiError> {
    super::snapshots::parse_request(body)
}

/// `GET /v2/sandboxes?startedAfter=`: the timestamp, in Unix milliseconds.
pub fn started_after(v: &str) -> Result<i64, ApiError> {
    super::sandboxes::parse_started_after(v)
}

/// `PUT /_warren/v1/uploads/{hash}?team=&expires=&signature=`: the team a
/// signed upload link was made for, checked with `key` at `now`.
pub fn upload_link(key: &[u8], hash: &str, query: &str, now: u64) -> Result<String, ApiError> {
    super::uploads::check_link(key, hash, query, now)
}

/// A signed upload link's query for `team`'s `hash` until `expires`, as
/// the gateway makes them (so a target can check round trips).
pub fn upload_query(key: &[u8], team: &str, hash: &str, expires: u64) -> Result<String, ApiError> {
    super::uploads::link_query(key, team, hash, expires)
}
