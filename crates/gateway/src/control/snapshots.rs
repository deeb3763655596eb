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
//! Where the records are: files in the shared `--template-dir`, or, with
//! `--blob-store`, the scheduler's store ([`super::catalog`]), where the
//! node hands the snapshot's record back and the gateway writes it.
//!
//! Placement: with a shared store, a sandbox from a snapshot goes to the
//! node that took it (`require_node_id`), the one node sure to have its
//! layer; from a blob store, to any node (it fetches the layer).
//!
//! Bounds: a team keeps at most `--snapshot-team-count` snapshots, and its
//! snapshots' and built templates' layers take at most
//! `--snapshot-team-bytes` of the store (429 naming the flag; a snapshot
//! that takes the team past the bytes is removed again). A deleted (or
//! replaced) snapshot's layers are noted and removed once no record names
//! them and no node's sandbox stacks them (`super::layers`).

use super::catalog::{self, Versioned};
use super::{owned, reply};
use crate::auth::Team;
use crate::error::ApiError;
use crate::node_client::NodeError;
use crate::state::App;
use http::{HeaderValue, Response, StatusCode};
use std::time::Duration;
use warren_core::body::Body;
use warren_core::node_api::CreateSnapshot;
use warren_proto::scheduler::v1::{BindingState, RecordKind};
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

/// The shared store, or why this gateway has none to give: a 503 when
/// `--template-dir` is missing, a 501 when its records are the
/// scheduler's (`--blob-store`), where nothing a request does needs it
/// (only the shared store's layer sweep asks, and finds none).
pub(super) fn store(app: &App) -> Result<Store, ApiError> {
    if let crate::records::Records::Scheduler(blobs) = &app.records {
        return Err(ApiError::new(
            StatusCode::NOT_IMPLEMENTED,
            "needs_shared_template_store",
            format!(
                "this gateway keeps its records in the scheduler and its layers in the blob \
                 store {blobs} (--blob-store); this needs a shared --template-dir"
            ),
        ));
    }
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

/// Where the records are: the shared store (checked as [`store`] does),
/// or the scheduler.
pub(super) fn records_ready(app: &App) -> Result<(), ApiError> {
    match &app.records {
        crate::records::Records::Scheduler(_) => Ok(()),
        crate::records::Records::Local(_) => store(app).map(|_| ()),
    }
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

/// `team`'s snapshot called `id` (its name or its record's name), if any,
/// with the version read. Another team's snapshot is `None`, exactly like
/// an unknown one.
pub(super) async fn find(app: &App, team: &Team, id: &str) -> Result<Option<Versioned>, ApiError> {
    let id = bare(id);
    let mine = |t: &Template| t.snapshot.as_ref().is_some_and(|s| s.team == team.0);
    if team_name_ok(id) {
        if let Some((t, v)) =
            catalog::get(app, &warren_template::named_snapshot_key(&team.0, id)).await?
        {
            if mine(&t) {
                return Ok(Some((t, v)));
            }
        }
    }
    Ok(catalog::get(app, id).await?.filter(|(t, _)| mine(t)))
}

/// What a create's `templateID` resolves to.
pub(super) struct Target {
    /// The template record's name, as the node and the binding get it.
    pub template_id: String,
    /// Its defaults; `None` when the gateway has no store to check (the
    /// node decides).
    pub defaults: Option<warren_template::spec::Defaults>,
    /// The node the sandbox must go to (a snapshot's, when the nodes share
    /// a template store: the one node sure to have its layer), or empty.
    pub node_id: String,
    /// The record, for the node (which has none of its own when its layers
    /// come from a blob store).
    pub record: Option<Template>,
}

/// Resolves a create's `templateID`: the team's snapshot by name or id,
/// else a template ([`super::templates::resolve`]). Another team's snapshot
/// is not found.
pub(super) async fn resolve(app: &App, team: &Team, template_id: &str) -> Result<Target, ApiError> {
    let shared = matches!(app.records, crate::records::Records::Local(_));
    if records_ready(app).is_ok() {
        if let Some((t, _)) = find(app, team, template_id).await? {
            // A team's template gets at most what the operator allows now
            // (placement counts these; the node caps what it applies).
            let mut defaults = t.defaults.clone();
            app.settings.limits.sandbox.bound(&mut defaults);
            // From a blob store any node can fetch its layers.
            let node_id = match (&t.snapshot, shared) {
                (Some(s), true) => s.node_id.clone(),
                _ => String::new(),
            };
            return Ok(Target {
                node_id,
                template_id: t.name.clone(),
                defaults: Some(defaults),
                record: Some(t),
            });
        }
        match catalog::get(app, template_id).await? {
            // Someone else's (by its record's name).
            Some((t, _)) if t.snapshot.is_some() => {
                return Err(super::templates::not_found(template_id))
            }
            Some(_) => {}
            // Another team's template, published under this name.
            None => {
                if let Some((t, _)) = super::manage::find_public(app, template_id).await? {
                    let mut defaults = t.defaults.clone();
                    app.settings.limits.sandbox.bound(&mut defaults);
                    let node_id = match (&t.snapshot, shared) {
                        (Some(s), true) => s.node_id.clone(),
                        _ => String::new(),
                    };
                    return Ok(Target {
                        node_id,
                        template_id: t.name.clone(),
                        defaults: Some(defaults),
                        record: Some(t),
                    });
                }
            }
        }
    }
    let record = super::templates::resolve(app, template_id).await?;
    Ok(Target {
        template_id: template_id.to_string(),
        defaults: record.as_ref().map(|t| t.defaults.clone()),
        node_id: String::new(),
        record,
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
    records_ready(app)?;
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
            if matches!(catalog::get(app, n).await?, Some((t, _)) if t.snapshot.is_none()) {
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
    let shared = catalog::local(app);
    if let Some(store) = &shared {
        super::team_store::room_for_snapshot(store, limits, &team.0, &key)?;
    }
    let replaced = catalog::get(app, &key).await?;
    let req = CreateSnapshot {
        generation: binding.generation,
        snapshot_id: key.clone(),
        team_id: team.0.clone(),
        name: name.clone(),
    };
    let answer = app
        .nodes
        .snapshot(&binding.endpoint, sandbox_id, &req, SNAPSHOT_TIME)
        .await
        .map_err(|e| node_failed(sandbox_id, &e))?;
    let Some(store) = shared else {
        // The node keeps no records: it handed this one back. Written
        // under the team's bounds, replacing exactly what was read.
        let made: Template = answer
            .record
            .ok_or_else(|| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "snapshot_failed",
                    format!(
                        "node {} made snapshot {key} but sent no record: its layers must come \
                         from the blob store too (--blob-store)",
                        binding.node_id
                    ),
                )
            })
            .and_then(|v| {
                serde_json::from_value(v).map_err(|e| {
                    ApiError::new(
                        StatusCode::BAD_GATEWAY,
                        "snapshot_failed",
                        format!(
                            "node {} sent an unreadable snapshot record: {e}",
                            binding.node_id
                        ),
                    )
                })
            })?;
        if made.name != key || made.snapshot.as_ref().is_none_or(|s| s.team != team.0) {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "snapshot_failed",
                format!(
                    "node {} answered snapshot {key} with a record of {:?}",
                    binding.node_id, made.name
                ),
            ));
        }
        catalog::put(app, &made, false, replaced.map_or(0, |(_, v)| v)).await?;
        return reply(StatusCode::CREATED, &SnapshotInfo::of(&made));
    };
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
    if let Some((old, _)) = replaced {
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
pub(super) fn parse_request(body: &[u8]) -> Result<Option<String>, ApiError> {
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
pub(super) async fn list(app: &App, team: &Team, query: &str) -> Result<Response<Body>, ApiError> {
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
    let mut mine: Vec<Template> = match records_ready(app) {
        Ok(()) => catalog::list(app, Some(&team.0), &[RecordKind::Snapshot]).await?,
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
pub(super) async fn delete(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
    let id = percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map_err(|_| {
            ApiError::bad_request("invalid_template_id", "the template id is not UTF-8")
        })?;
    records_ready(app)?;
    // A built template by its name: every tag of it (another team's
    // public one: 403).
    if let Some(done) = super::manage::delete(app, team, &id).await? {
        return Ok(done);
    }
    let Some((t, version)) = find(app, team, &id).await? else {
        if matches!(catalog::get(app, bare(&id)).await?, Some((t, _)) if t.snapshot.is_none()) {
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
    let removed = match catalog::local(app) {
        Some(store) => super::team_store::remove(&store, &t)?,
        None => catalog::remove(app, &t.name, version).await?,
    };
    if !removed {
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
pub(super) async fn alias(app: &App, team: &Team, raw: &str) -> Result<Response<Body>, ApiError> {
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
    records_ready(app)?;
    if let Some((t, _)) = find(app, team, name).await? {
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
    match catalog::get(app, name).await? {
        Some((t, _)) if t.snapshot.is_none() => reply(
            StatusCode::OK,
            &AliasInfo {
                template_id: t.name,
                public: true,
            },
        ),
        // Another team's template, published under this name.
        None if super::manage::find_public(app, name).await?.is_some() => reply(
            StatusCode::OK,
            &AliasInfo {
                template_id: name.to_string(),
                public: true,
            },
        ),
        _ => Err(not_found(&alias)),
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
