//! Template management in E2B's shapes: `GET /templates/{id}` (the
//! template with its builds, paged), `PATCH /templates/{id}` and `PATCH
//! /v2/templates/{id}` (`public`: the CLI's `template publish` and
//! `unpublish`), `GET /v2/templates` (paged) and `GET /default-templates`
//! (the operator's).
//!
//! What a template is here: the operator's (`warren template build`;
//! public to every team, `isDefault`), or a team's, one record per tag of
//! a name (`builds::tagged`), or its named snapshot. A team publishes its
//! template under its name: every record of that name (each tag) is then
//! marked public (`Snapshot::public`), and every team lists it and creates
//! sandboxes from it by that name; only its own team changes or deletes it
//! (any other is refused, `403`). At most one team's template is public
//! under a name: the scheduler's store fences that with a unique index
//! (two teams publishing one name at once: one wins, the other is a
//! `409`), the shared store's files by a check before the write. A build or
//! tag of a public template stays public.

use super::catalog::{self, Versioned};
use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{HeaderValue, Response, StatusCode};
use warren_core::body::Body;
use warren_proto::scheduler::v1::RecordKind;
use warren_template::Template;

/// Most templates or builds one page carries (E2B's `limit` maximum and
/// default).
const MAX_PAGE: usize = 100;

fn decode(raw: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| ApiError::bad_request("invalid_template_id", "the template id is not UTF-8"))
}

/// A template id as the SDK and CLI send it: E2B's `namespace/` prefix
/// dropped, and the tag (`name:tag`) split off.
fn name_of(id: &str) -> &str {
    let id = id.rsplit('/').next().unwrap_or(id);
    id.split(':').next().unwrap_or(id)
}

/// Whether a team record is one of template `name`'s: a tag of it, or the
/// named snapshot itself.
fn of_template(t: &Template, name: &str) -> bool {
    t.snapshot
        .as_ref()
        .and_then(|s| s.name.as_deref())
        .is_some_and(|n| {
            n == name
                || n.strip_prefix(name)
                    .is_some_and(|rest| rest.starts_with(':'))
        })
}

/// `team`'s records of template `name` (each tag; or its named snapshot),
/// with their versions, the default tag first.
pub(super) async fn team_records(
    app: &App,
    team: &str,
    name: &str,
) -> Result<Vec<Versioned>, ApiError> {
    let mut mine: Vec<Versioned> = catalog::list_versioned(
        app,
        Some(team),
        &[RecordKind::Built, RecordKind::Snapshot],
        false,
    )
    .await?
    .into_iter()
    .filter(|(t, _)| t.snapshot.as_ref().is_some_and(|s| s.team == team) && of_template(t, name))
    .collect();
    mine.sort_by_key(|(t, _)| {
        let called = t.snapshot.as_ref().and_then(|s| s.name.clone());
        (called.as_deref() != Some(name), called)
    });
    Ok(mine)
}

/// Another team's (or any team's) records public under template `name`.
async fn public_records(app: &App, name: &str) -> Result<Vec<Versioned>, ApiError> {
    Ok(catalog::list_public(app)
        .await?
        .into_iter()
        .filter(|(t, _)| of_template(t, name))
        .collect())
}

/// The record a public template `id` (`name` or `name:tag`) stands for,
/// any team's: what a create or build of another team resolves it to.
pub(super) async fn find_public(app: &App, id: &str) -> Result<Option<Versioned>, ApiError> {
    let called = id.rsplit('/').next().unwrap_or(id);
    let called = called.strip_suffix(":default").unwrap_or(called);
    Ok(catalog::list_public(app)
        .await?
        .into_iter()
        .find(|(t, _)| t.snapshot.as_ref().and_then(|s| s.name.as_deref()) == Some(called)))
}

/// Whether `team`'s template `name` is public (a new build or tag of it
/// is too).
pub(super) async fn is_public(app: &App, team: &str, name: &str) -> Result<bool, ApiError> {
    Ok(team_records(app, team, name)
        .await?
        .iter()
        .any(|(t, _)| t.snapshot.as_ref().is_some_and(|s| s.public)))
}

/// What `id` names for `team`: its own template, the operator's, or
/// another team's public one.
enum Found {
    Own(Vec<Versioned>),
    Operator(Box<Template>),
    Public(Vec<Versioned>),
}

async fn find(app: &App, team: &Team, id: &str) -> Result<Found, ApiError> {
    super::snapshots::records_ready(app)?;
    let name = name_of(id);
    if !super::snapshots::team_name_ok(name) {
        return Err(not_found(id));
    }
    let own = team_records(app, &team.0, name).await?;
    if !own.is_empty() {
        return Ok(Found::Own(own));
    }
    if let Some((t, _)) = catalog::get(app, name).await? {
        if t.snapshot.is_none() {
            return Ok(Found::Operator(Box::new(t)));
        }
    }
    let public = public_records(app, name).await?;
    if !public.is_empty() {
        return Ok(Found::Public(public));
    }
    Err(not_found(id))
}

fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "template_not_found",
        format!("template {id:?} not found (see GET /templates)"),
    )
}

/// E2B's `Template`, as every listing and `GET /templates/{id}` show one.
#[derive(Debug, serde::Serialize)]
pub(super) struct Described {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    #[serde(rename = "cpuCount")]
    cpu_count: u32,
    #[serde(rename = "memoryMB")]
    memory_mb: u64,
    #[serde(rename = "diskSizeMB")]
    disk_size_mb: u64,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    #[serde(rename = "createdAt")]
    created_at: String,
    #[serde(rename = "updatedAt")]
    updated_at: String,
    #[serde(rename = "createdBy")]
    created_by: Option<()>,
    #[serde(rename = "lastSpawnedAt")]
    last_spawned_at: Option<String>,
    #[serde(rename = "spawnCount")]
    spawn_count: u64,
    #[serde(rename = "buildCount")]
    build_count: u32,
    #[serde(rename = "envdVersion")]
    envd_version: &'static str,
    #[serde(rename = "buildStatus")]
    build_status: &'static str,
    #[serde(rename = "isDefault")]
    is_default: bool,
}

/// `t` as E2B's `Template` called `name`: the operator's are public and
/// default, a team's public when published.
pub(super) fn describe(name: &str, t: &Template) -> Described {
    let at = warren_core::time::rfc3339_ms(t.created_at_ms as i64);
    let operator = t.snapshot.is_none();
    let build = super::builds::build_of(t);
    Described {
        template_id: name.to_string(),
        build_id: if build.is_empty() {
            t.digest.clone()
        } else {
            build
        },
        cpu_count: t.defaults.cpu_count,
        memory_mb: t.defaults.memory_mb,
        disk_size_mb: t.defaults.disk_mb,
        public: operator || t.snapshot.as_ref().is_some_and(|s| s.public),
        aliases: vec![name.to_string()],
        names: vec![name.to_string()],
        created_at: at.clone(),
        updated_at: at,
        created_by: None,
        last_spawned_at: None,
        spawn_count: 0,
        build_count: 1,
        envd_version: warren_core::node_api::ENVD_VERSION,
        build_status: "ready",
        is_default: operator,
    }
}

/// Every template `team` sees, by name: the operator's, its own (each tag
/// under its `name:tag`), and other teams' public ones.
pub(super) async fn visible(app: &App, team: &Team) -> Result<Vec<Described>, ApiError> {
    let mut out: Vec<Described> = catalog::list(app, None, &[RecordKind::Operator])
        .await?
        .iter()
        .map(|t| describe(&t.name, t))
        .collect();
    if super::snapshots::records_ready(app).is_ok() {
        for t in catalog::list(app, Some(&team.0), &[RecordKind::Built]).await? {
            if let Some(s) = t.snapshot.as_ref().filter(|s| s.team == team.0) {
                if super::builds::is_built(&t) {
                    out.push(describe(
                        &s.name.clone().unwrap_or_else(|| t.name.clone()),
                        &t,
                    ));
                }
            }
        }
        for (t, _) in catalog::list_public(app).await? {
            if let Some(s) = t.snapshot.as_ref().filter(|s| s.team != team.0) {
                if let Some(name) = &s.name {
                    out.push(describe(name, &t));
                }
            }
        }
    }
    out.sort_by(|a, b| a.template_id.cmp(&b.template_id));
    Ok(out)
}

/// `GET /v2/templates?teamID=&nextToken=&limit=`: [`visible`] in pages by
/// name; `X-Next-Token` names the next page. A `teamID` other than the
/// key's team is a 403 (a key sees its own team's).
pub(super) async fn list_v2(
    app: &App,
    team: &Team,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let (mut after, mut limit) = (None::<String>, MAX_PAGE);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "teamID" if !v.is_empty() && v != team.0.as_str() => {
                return Err(ApiError::new(
                    StatusCode::FORBIDDEN,
                    "forbidden",
                    format!("this API key is team {}'s, not {v:?}'s", team.0),
                ))
            }
            "nextToken" => after = Some(v.into_owned()),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| bad(format!("limit must be between 1 and {MAX_PAGE}")))?
            }
            _ => {}
        }
    }
    let all = visible(app, team).await?;
    let start = match &after {
        Some(a) => all.partition_point(|t| t.template_id.as_str() <= a.as_str()),
        None => 0,
    };
    let page: Vec<&Described> = all.iter().skip(start).take(limit).collect();
    let more = start + page.len() < all.len();
    let next = page.last().map(|t| t.template_id.clone());
    let mut r = warren_core::body::json(StatusCode::OK, &page);
    if let (true, Some(next)) = (more, next) {
        if let Ok(v) = HeaderValue::from_str(&next) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

/// `GET /default-templates`: the operator's templates.
pub(super) async fn defaults(app: &App) -> Result<Response<Body>, ApiError> {
    let out: Vec<Described> = catalog::list(app, None, &[RecordKind::Operator])
        .await?
        .iter()
        .map(|t| describe(&t.name, t))
        .collect();
    reply(StatusCode::OK, &out)
}

/// E2B's `TemplateWithBuilds`.
#[derive(Debug, serde::Serialize)]
struct WithBuilds {
    #[serde(flatten)]
    template: Described,
    builds: Vec<serde_json::Value>,
}

/// `GET /templates/{id}?nextToken=&limit=`: the template `team` sees by
/// that name, with a page of its builds (newest first; `X-Next-Token`).
pub(super) async fn get(
    app: &App,
    team: &Team,
    raw: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let id = decode(raw)?;
    let (mut token, mut limit) = (String::new(), MAX_PAGE as u32);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "nextToken" => token = v.into_owned(),
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE as u32).contains(n))
                    .ok_or_else(|| {
                        ApiError::bad_request(
                            "invalid_query",
                            format!("limit must be between 1 and {MAX_PAGE}"),
                        )
                    })?
            }
            _ => {}
        }
    }
    let name = name_of(&id).to_string();
    let (template, owner) = match find(app, team, &id).await? {
        Found::Operator(t) => (describe(&name, &t), None),
        Found::Own(records) | Found::Public(records) => {
            let (t, _) = &records[0];
            let owner = t.snapshot.as_ref().map(|s| s.team.clone());
            (describe(&name, t), owner)
        }
    };
    let (builds, next) = match owner {
        Some(owner) => super::builds::listed(app, &owner, &name, &token, limit).await?,
        None => (Vec::new(), String::new()),
    };
    let mut r = warren_core::body::json(StatusCode::OK, &WithBuilds { template, builds });
    if !next.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&next) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

/// `PATCH /templates/{id}` (v1: `200`, no body) and `PATCH
/// /v2/templates/{id}` (`{"names": [...]}`): `{"public": bool}` publishes
/// or unpublishes the team's template `id` (every tag of it). Another
/// team's template, or the operator's, is a `403`; an unknown one `404`;
/// a name another team's template is public under already, `409`.
pub(super) async fn update(
    app: &App,
    team: &Team,
    raw: &str,
    body: &[u8],
    v2: bool,
) -> Result<Response<Body>, ApiError> {
    let id = decode(raw)?;
    let obj = crate::models::object(body, false)?;
    let public = match obj.get("public") {
        None | Some(serde_json::Value::Null) => None,
        Some(serde_json::Value::Bool(b)) => Some(*b),
        Some(v) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                format!("field \"public\" must be true or false, not {v}"),
            ))
        }
    };
    let name = name_of(&id).to_string();
    let records = match find(app, team, &id).await? {
        Found::Own(records) => records,
        Found::Operator(_) => {
            return Err(ApiError::new(
                StatusCode::FORBIDDEN,
                "template_not_yours",
                format!(
                    "template {name:?} is the operator's (warren template): public to every \
                     team, and changed by the operator only"
                ),
            ))
        }
        Found::Public(_) => return Err(not_yours(&name)),
    };
    if let Some(public) = public {
        if public {
            let taken = public_records(app, &name)
                .await?
                .into_iter()
                .any(|(t, _)| t.snapshot.as_ref().is_some_and(|s| s.team != team.0));
            if taken {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "template_name_taken",
                    format!(
                        "another team's template is public as {name:?} already; one name is \
                         public once (rename yours to publish it)"
                    ),
                ));
            }
        }
        let puts: Vec<(Template, bool, u64)> = records
            .into_iter()
            .filter(|(t, _)| t.snapshot.as_ref().is_some_and(|s| s.public != public))
            .map(|(mut t, v)| {
                if let Some(s) = t.snapshot.as_mut() {
                    s.public = public;
                }
                let built = super::builds::is_built(&t);
                (t, built, v)
            })
            .collect();
        if !puts.is_empty() {
            catalog::put_all(app, &puts).await?;
        }
        tracing::info!(template = %name, team = %team.0, public, "template visibility changed");
    }
    if v2 {
        reply(StatusCode::OK, &serde_json::json!({ "names": [name] }))
    } else {
        Ok(warren_core::body::status(StatusCode::OK))
    }
}

/// `403` for another team's public template.
pub(super) fn not_yours(name: &str) -> ApiError {
    ApiError::new(
        StatusCode::FORBIDDEN,
        "template_not_yours",
        format!(
            "template {name:?} is another team's, public to every team to use; only its team \
             changes or deletes it"
        ),
    )
}

/// `DELETE /templates/{id}` of a team's built template by its name (no
/// tag): every tag of it goes. `None` when `id` is not one (the caller
/// goes on to snapshots); another team's public template is a `403`.
pub(super) async fn delete(
    app: &App,
    team: &Team,
    id: &str,
) -> Result<Option<Response<Body>>, ApiError> {
    let bare = id.rsplit('/').next().unwrap_or(id);
    let bare = bare.strip_suffix(":default").unwrap_or(bare);
    if bare.contains(':') || !super::snapshots::team_name_ok(bare) {
        return Ok(None);
    }
    super::snapshots::records_ready(app)?;
    let built: Vec<Versioned> = team_records(app, &team.0, bare)
        .await?
        .into_iter()
        .filter(|(t, _)| super::builds::is_built(t))
        .collect();
    if built.is_empty() {
        let public = public_records(app, bare).await?;
        if public
            .iter()
            .any(|(t, _)| t.snapshot.as_ref().is_some_and(|s| s.team != team.0))
        {
            return Err(not_yours(bare));
        }
        return Ok(None);
    }
    for (t, v) in &built {
        super::builds::remove_record(app, t, *v).await?;
    }
    tracing::info!(template = %bare, team = %team.0, tags = built.len(), "template deleted");
    Ok(Some(warren_core::body::status(StatusCode::NO_CONTENT)))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ids_and_tags() {
        assert_eq!(name_of("team/app:v2"), "app");
        assert_eq!(name_of("app"), "app");
        let t = |name: &str| Template {
            name: "snap-x".into(),
            digest: String::new(),
            defaults: Default::default(),
            created_at_ms: 0,
            source: String::new(),
            layers: Vec::new(),
            snapshot: Some(warren_template::Snapshot {
                team: "t".into(),
                name: Some(name.into()),
                source_sandbox: String::new(),
                node_id: String::new(),
                paused: None,
                public: false,
            }),
            images: Vec::new(),
        };
        assert!(of_template(&t("app"), "app"));
        assert!(of_template(&t("app:v2"), "app"));
        assert!(!of_template(&t("apple"), "app"));
        assert!(!of_template(&t("app2:v1"), "app"));
    }
}
