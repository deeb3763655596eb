//! E2B's snapshots: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//! `DELETE /templates/{id}` (how the SDK deletes one), and what a create
//! naming a snapshot where a template id goes resolves to.
//!
//! A snapshot is a template record in the template store
//! (`warren_template::store`), made by the sandbox's node: the sandbox's
//! template root plus its writable layer as one more layer. Its record
//! says which team owns it; for every other team it does not exist (404,
//! like an unknown one). Its id is the record's name: `snap-<random>`, or
//! for a named snapshot `snap-<hash of team and name>`
//! ([`warren_template::named_snapshot_key`]), so a team's name finds its
//! own record and nobody else's. E2B's `namespace/` prefix and `:default`
//! tag are accepted and ignored.
//!
//! Placement: a sandbox from a snapshot goes to the node that took it
//! (`require_node_id`), the one node sure to have its layer.
//!
//! Bounds: a team keeps at most `--snapshot-team-count` snapshots, and its
//! snapshots' and built templates' layers take at most
//! `--snapshot-team-bytes` of the store (429 naming the flag; a snapshot
//! that takes the team past the bytes is removed again). A deleted (or
//! replaced) snapshot's layers are noted and removed once no record names
//! them and no node's sandbox stacks them (`super::layers`).

use super::{owned, reply};
use crate::auth::Team;
use crate::error::ApiError;
use crate::node_client::NodeError;
use crate::state::App;
use http::{HeaderValue, Response, StatusCode};
use std::time::Duration;
use warren_core::body::Body;
use warren_core::node_api::CreateSnapshot;
use warren_proto::scheduler::v1::BindingState;
use warren_template::{Store, Template, TemplateError};

/// How long a node may take to copy and pack a sandbox's disk, on top of
/// the control-API timeout.
const SNAPSHOT_TIME: Duration = Duration::from_secs(300);

/// Longest snapshot name accepted.
const MAX_NAME: usize = 128;

/// Most snapshots in one page (E2B's `limit` maximum and default).
const MAX_PAGE: usize = 100;

/// E2B's `SnapshotInfo`.
#[derive(Debug, serde::Serialize)]
struct SnapshotInfo {
    #[serde(rename = "snapshotID")]
    snapshot_id: String,
    names: Vec<String>,
}

impl SnapshotInfo {
    /// A named snapshot is called by its name, as E2B calls it by its
    /// alias; an unnamed one by its record's name.
    fn of(t: &Template) -> SnapshotInfo {
        let id = t
            .snapshot
            .as_ref()
            .and_then(|s| s.name.clone())
            .unwrap_or_else(|| t.name.clone());
        SnapshotInfo {
            snapshot_id: id.clone(),
            names: vec![id],
        }
    }
}

/// The store, or a 503 saying the gateway has none.
pub(super) fn store(app: &App) -> Result<Store, ApiError> {
    if !app.settings.template_dir.is_dir() {
        return Err(ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "no_template_store",
            format!(
                "this gateway has no template store at {} (--template-dir); snapshots live there",
                app.settings.template_dir.display()
            ),
        ));
    }
    Store::open(&app.settings.template_dir).map_err(internal)
}

pub(super) fn internal(e: TemplateError) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "snapshot_not_found",
        format!("snapshot {id:?} not found"),
    )
}

/// Drops E2B's `namespace/` prefix and `:default` tag.
fn bare(id: &str) -> &str {
    let id = id.rsplit('/').next().unwrap_or(id);
    id.strip_suffix(":default").unwrap_or(id)
}

/// Checks a snapshot name: 1 to 128 of `[A-Za-z0-9._-]`, starting with a
/// letter or digit.
pub(super) fn validate_name(name: &str) -> Result<(), ApiError> {
    let ok = !name.is_empty()
        && name.len() <= MAX_NAME
        && name
            .bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b))
        && name.as_bytes()[0].is_ascii_alphanumeric();
    if ok {
        Ok(())
    } else {
        Err(ApiError::bad_request(
            "invalid_snapshot_name",
            format!(
                "snapshot name {name:?} must be 1 to {MAX_NAME} of A-Z, a-z, 0-9, '.', '_', '-', \
                 starting with a letter or digit"
            ),
        ))
    }
}

/// Whether `id` may be a team's name: a snapshot or template name, or a
/// built template's `name:tag`.
pub(super) fn team_name_ok(id: &str) -> bool {
    match id.split_once(':') {
        Some((n, t)) => validate_name(n).is_ok() && super::builds::validate_tag(t).is_ok(),
        None => validate_name(id).is_ok(),
    }
}

/// `team`'s snapshot called `id` (its name or its record's name), if any.
/// Another team's snapshot is `None`, exactly like an unknown one.
pub(super) fn find(store: &Store, team: &Team, id: &str) -> Result<Option<Template>, ApiError> {
    let id = bare(id);
    let mine = |t: &Template| t.snapshot.as_ref().is_some_and(|s| s.team == team.0);
    if team_name_ok(id) {
        match store.get(&warren_template::named_snapshot_key(&team.0, id)) {
            Ok(t) if mine(&t) => return Ok(Some(t)),
            Ok(_) | Err(TemplateError::NotFound(_)) => {}
            Err(e) => return Err(internal(e)),
        }
    }
    match store.get(id) {
        Ok(t) if mine(&t) => Ok(Some(t)),
        Ok(_) | Err(TemplateError::NotFound(_)) => Ok(None),
        Err(e) => Err(internal(e)),
    }
}

/// What a create's `templateID` resolves to.
pub(super) struct Target {
    /// The template record's name, as the node and the binding get it.
    pub template_id: String,
    /// Its defaults; `None` when the gateway has no store to check (the
    /// node decides).
    pub defaults: Option<warren_template::spec::Defaults>,
    /// The node the sandbox must go to (a snapshot's), or empty.
    pub node_id: String,
}

/// Resolves a create's `templateID`: the team's snapshot by name or id,
/// else a template ([`super::templates::resolve`]). Another team's snapshot
/// is not found.
pub(super) fn resolve(app: &App, team: &Team, template_id: &str) -> Result<Target, ApiError> {
    if let Ok(store) = store(app) {
        if let Some(t) = find(&store, team, template_id)? {
            // A team's template gets at most what the operator allows now
            // (placement counts these; the node caps what it applies).
            let mut defaults = t.defaults;
            app.settings.limits.sandbox.bound(&mut defaults);
            return Ok(Target {
                node_id: t
                    .snapshot
                    .as_ref()
                    .map(|s| s.node_id.clone())
                    .unwrap_or_default(),
                template_id: t.name,
                defaults: Some(defaults),
            });
        }
        if matches!(store.get(template_id), Ok(t) if t.snapshot.is_some()) {
            // Someone else's.
            return Err(super::templates::not_found(template_id));
        }
    }
    Ok(Target {
        template_id: template_id.to_string(),
        defaults: super::templates::resolve(app, template_id)?,
        node_id: String::new(),
    })
}

/// `POST /sandboxes/{id}/snapshots`: the sandbox's node makes the layer and
/// records the snapshot; 201 with E2B's `SnapshotInfo`.
pub(super) async fn create(
    app: &App,
    team: &Team,
    sandbox_id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let name = parse_request(body)?;
    let store = store(app)?;
    let binding = owned(app, team, sandbox_id).await?;
    match BindingState::try_from(binding.state) {
        Ok(BindingState::Running | BindingState::Paused) => {}
        Ok(BindingState::Lost) => return Err(ApiError::node_down(sandbox_id)),
        _ => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "sandbox_not_running",
                format!("sandbox {sandbox_id} is not running, so it cannot be snapshotted"),
            ))
        }
    }
    let key = match &name {
        Some(n) => {
            // A name that is a template's would make creates by that name
            // ambiguous.
            if matches!(store.get(n), Ok(t) if t.snapshot.is_none()) {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "snapshot_name_taken",
                    format!("{n:?} is a template's name; choose another snapshot name"),
                ));
            }
            warren_template::named_snapshot_key(&team.0, n)
        }
        None => format!("snap-{}", warren_core::id::random_token(24)),
    };
    // The team's share of the store every team shares (a named snapshot
    // replaces its record, which does not count).
    let limits = app.settings.limits.store;
    super::team_store::room_for_snapshot(&store, limits, &team.0, &key)?;
    let replaced = store.get(&key).ok();
    let req = CreateSnapshot {
        generation: binding.generation,
        snapshot_id: key.clone(),
        team_id: team.0.clone(),
        name: name.clone(),
    };
    app.nodes
        .snapshot(&binding.endpoint, sandbox_id, &req, SNAPSHOT_TIME)
        .await
        .map_err(|e| node_failed(sandbox_id, &e))?;
    let made = store.get(&key).map_err(|e| {
        ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "snapshot_not_shared",
            format!(
                "node {} made snapshot {key} but this gateway cannot read it from {} ({e}); \
                     nodes and gateways must share the template store",
                binding.node_id,
                app.settings.template_dir.display()
            ),
        )
    })?;
    // The layers only a replaced record named are nobody's now.
    if let Some(old) = replaced {
        let gone: Vec<String> = old
            .layers
            .into_iter()
            .filter(|l| !made.layers.contains(l))
            .collect();
        super::team_store::note(&store, &gone);
    }
    if let Err(e) = super::team_store::within_bytes(&store, limits, &team.0) {
        // Past the team's bytes: not kept.
        super::team_store::remove(&store, &made)?;
        return Err(e);
    }
    reply(StatusCode::CREATED, &SnapshotInfo::of(&made))
}

/// The optional `name` of E2B's `SandboxSnapshotRequest`. `memory` (a full
/// snapshot, E2B's default) is accepted either way: warren's snapshots
/// keep the filesystem only, and sandboxes made from one start fresh.
fn parse_request(body: &[u8]) -> Result<Option<String>, ApiError> {
    if body.iter().all(u8::is_ascii_whitespace) {
        return Ok(None);
    }
    let v: serde_json::Value = serde_json::from_slice(body)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("invalid JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| ApiError::bad_request("invalid_body", "the body must be a JSON object"))?;
    if let Some(m) = obj.get("memory") {
        if !m.is_boolean() && !m.is_null() {
            return Err(ApiError::bad_request(
                "invalid_body",
                "field \"memory\" must be a boolean",
            ));
        }
    }
    match obj.get("name") {
        None | Some(serde_json::Value::Null) => Ok(None),
        Some(serde_json::Value::String(n)) => {
            validate_name(n)?;
            Ok(Some(n.clone()))
        }
        Some(_) => Err(ApiError::bad_request(
            "invalid_body",
            "field \"name\" must be a string",
        )),
    }
}

fn node_failed(sandbox_id: &str, e: &NodeError) -> ApiError {
    match e {
        NodeError::Status {
            not_hosted: true, ..
        } => ApiError::sandbox_not_found(sandbox_id),
        NodeError::Status {
            status, message, ..
        } if status.is_client_error() => ApiError::new(*status, "snapshot_failed", message.clone()),
        NodeError::Unreachable { .. } | NodeError::Timeout { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "snapshot_failed",
            format!("failed to snapshot sandbox {sandbox_id}: {e}"),
        ),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "snapshot_failed",
            format!("failed to snapshot sandbox {sandbox_id}: {e}"),
        ),
    }
}

/// `GET /snapshots?sandboxID=&name=&limit=&nextToken=`: the team's
/// snapshots, newest first; `X-Next-Token` names the next page.
pub(super) fn list(app: &App, team: &Team, query: &str) -> Result<Response<Body>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let (mut sandbox, mut name, mut token) = (None, None, None);
    let mut limit = MAX_PAGE;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "sandboxID" => sandbox = Some(v.into_owned()),
            "name" => name = Some(bare(&v).to_string()),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| bad(format!("limit must be between 1 and {MAX_PAGE}")))?
            }
            "nextToken" => {
                token = Some(
                    parse_token(&v)
                        .ok_or_else(|| bad(format!("nextToken {v:?} is not one this API gave")))?,
                )
            }
            _ => {}
        }
    }
    let mut mine: Vec<Template> = match store(app) {
        Ok(s) => s.list().map_err(internal)?,
        Err(_) => Vec::new(),
    }
    .into_iter()
    // Templates the team built are listed by `GET /templates`.
    .filter(|t| !super::builds::is_built(t))
    .filter(|t| {
        t.snapshot.as_ref().is_some_and(|s| {
            s.team == team.0
                && sandbox.as_ref().is_none_or(|id| &s.source_sandbox == id)
                && name
                    .as_ref()
                    .is_none_or(|n| s.name.as_ref() == Some(n) || &t.name == n)
        })
    })
    .collect();
    // Newest first; the record name breaks ties, so pages never overlap.
    mine.sort_by(|a, b| (b.created_at_ms, &a.name).cmp(&(a.created_at_ms, &b.name)));
    // The first one after the token in that order.
    let start = match &token {
        Some((at, key)) => mine
            .iter()
            .position(|t| t.created_at_ms < *at || (t.created_at_ms == *at && &t.name > key))
            .unwrap_or(mine.len()),
        None => 0,
    };
    let page: Vec<&Template> = mine.iter().skip(start).take(limit).collect();
    let more = start + page.len() < mine.len();
    let out: Vec<SnapshotInfo> = page.iter().map(|t| SnapshotInfo::of(t)).collect();
    let mut r = warren_core::body::json(StatusCode::OK, &out);
    if let (true, Some(last)) = (more, page.last()) {
        if let Ok(v) = HeaderValue::from_str(&format!("{}.{}", last.created_at_ms, last.name)) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

/// A `nextToken`: `<created_at_ms>.<record name>` of the last one listed.
fn parse_token(t: &str) -> Option<(u64, String)> {
    let (at, key) = t.split_once('.')?;
    Some((at.parse().ok()?, key.to_string()))
}

/// `DELETE /templates/{id}`: deletes the team's snapshot `id` (its record;
/// sandboxes running from it keep their files, and its layers are removed
/// once nothing stacks them: `super::layers`). Templates themselves are
/// the operator's (`warren template`), not the API's.
pub(super) fn delete(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
    let id = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            ApiError::bad_request("invalid_template_id", "the template id is not UTF-8")
        })?;
    let store = store(app)?;
    let Some(t) = find(&store, team, &id)? else {
        if matches!(store.get(bare(&id)), Ok(t) if t.snapshot.is_none()) {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "template_not_deletable",
                format!(
                    "template {id:?} is managed by the operator (warren template); \
                     only snapshots are deleted through the API"
                ),
            ));
        }
        return Err(not_found(&id));
    };
    if !super::team_store::remove(&store, &t)? {
        return Err(not_found(&id));
    }
    tracing::info!(snapshot = %t.name, team = %team.0, "snapshot deleted");
    Ok(warren_core::body::status(StatusCode::NO_CONTENT))
}

/// E2B's `TemplateAliasResponse`.
#[derive(Debug, serde::Serialize)]
struct AliasInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    public: bool,
}

/// `GET /templates/aliases/{alias}` (the SDK's `Template.exists` and
/// `alias_exists`): 200 for an operator's template (public to every team)
/// or the team's own named snapshot, else 404, as for any name the team
/// cannot use.
pub(super) fn alias(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
    let alias = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| ApiError::bad_request("invalid_alias", "the alias is not UTF-8"))?;
    let name = bare(&alias);
    if !team_name_ok(name) {
        return Err(ApiError::bad_request(
            "invalid_alias",
            format!(
                "alias {alias:?} is not a template name: 1 to {MAX_NAME} of A-Z a-z 0-9 . _ -, \
                 starting with a letter or digit"
            ),
        ));
    }
    let store = store(app)?;
    if let Some(t) = find(&store, team, name)? {
        let info = SnapshotInfo::of(&t);
        let template_id = info.snapshot_id;
        return reply(
            StatusCode::OK,
            &AliasInfo {
                template_id,
                public: false,
            },
        );
    }
    match store.get(name) {
        Ok(t) if t.snapshot.is_none() => reply(
            StatusCode::OK,
            &AliasInfo {
                template_id: t.name,
                public: true,
            },
        ),
        Ok(_) | Err(TemplateError::NotFound(_)) => Err(not_found(&alias)),
        Err(e) => Err(internal(e)),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_lose_namespace_and_default_tag() {
        assert_eq!(bare("team/snap-x:default"), "snap-x");
        assert_eq!(bare("snap-x"), "snap-x");
        assert_eq!(bare("snap-x:v2"), "snap-x:v2");
    }

    #[test]
    fn names() {
        assert!(validate_name("snap-test_ab12").is_ok());
        for bad in ["", "-x", "a/b", "a:b", &"x".repeat(129)] {
            assert!(validate_name(bad).is_err(), "{bad}");
        }
        assert_eq!(parse_request(b"").unwrap(), None);
        assert_eq!(
            parse_request(br#"{"name":"n1","memory":true}"#).unwrap(),
            Some("n1".into())
        );
        assert!(parse_request(br#"{"name":5}"#).is_err());
        assert!(parse_request(br#"{"name":"../x"}"#).is_err());
    }

    #[test]
    fn tokens() {
        assert_eq!(parse_token("12.snap-a"), Some((12, "snap-a".into())));
        assert_eq!(parse_token("x.snap-a"), None);
    }
}
