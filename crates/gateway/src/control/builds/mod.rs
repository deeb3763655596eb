//! E2B's template build API (the SDK's `Template.build`):
//! `POST /v3/templates` (a build is requested: template and build ids),
//! `POST /v2/templates/{id}/builds/{buildID}` (its steps; the build starts),
//! `GET /templates/{id}/builds/{buildID}/status` (status and logs), and
//! `GET /templates/{id}/files/{hash}` (COPY's upload link; the archive is
//! kept by `uploads`).
//!
//! A build runs **in a sandbox**, never on the gateway host: the steps are
//! tenant input, and a sandbox is the boundary warren already puts around
//! tenant code. The gateway drives it through its own public listener
//! with the team's API key, exactly as the team could: it creates a
//! sandbox from the parent template (`fromTemplate`; or `fromImage`: E2B's
//! default image `e2bdev/base` is warren's `base`, any other image is the
//! operator's template whose build file lists it in `images`, such as
//! `ubuntu-22.04` for `ubuntu:22.04`: no registry is ever pulled from),
//! runs each RUN step with envd as the current USER in the current
//! WORKDIR with the ENVs so far, applies each COPY step's uploaded
//! archive (below), snapshots the sandbox, and records the
//! snapshot's root under the team's template name with the defaults the
//! steps set (USER, WORKDIR, ENV, startCmd, readyCmd, cpuCount,
//! memoryMB); the sandbox is killed either way. So a build needs the
//! `isolated` runtime (snapshots), as snapshots do.
//!
//! COPY: the archive the SDK uploaded (a tar, gzipped or not, of paths
//! relative to its context directory) is written into the build sandbox
//! through envd in chunks of [`COPY_CHUNK`] bytes, into a fresh directory
//! belonging to the step's owner (its `user` argument, else the current
//! USER); `tar` runs **inside the sandbox as that user** to unpack it; as
//! root (in the sandbox) the source's files get the owner and the `mode`
//! argument and go to the destination the way E2B's builder moves them: a
//! file or symlink to the destination path (into it when it ends in `/`),
//! a directory's contents into the destination directory (merged); a
//! relative destination is under the current WORKDIR. Symlinks stay
//! symlinks (the SDK resolves them itself with `resolve_symlinks`). The
//! temporary directory is removed either way. The gateway host never
//! unpacks or reads an archive's paths.
//!
//! Ownership: a built template is its team's, like a named snapshot (the
//! two share a team's names): listed in the team's `GET /templates`,
//! usable by name, deletable with `DELETE /templates/{name}`; for every
//! other team it does not exist (404). Nothing is cached between builds
//! (`force` and `skipCache` change nothing: every step always runs).
//!
//! Bounds (`crate::limits`): a build's `cpuCount` and `memoryMB` at most
//! `--max-sandbox-cpus` and `--max-sandbox-memory-mb` (400 naming the
//! flag), its disk its parent's, at most `--max-sandbox-disk-mb`; a team's
//! built templates at most `--template-team-count` (each tag counts; 429).
//! A build is a record of the scheduler's store ([`ledger`]): any gateway
//! answers its status and log, the gateway that starts it claims it under
//! a lease and runs it, and a build whose gateway dies fails once the
//! lease runs out (it is not taken over: its sandbox and half-run steps
//! were that gateway's). The template records it reads and writes are
//! wherever this gateway keeps records (`super::catalog`: the shared
//! `--template-dir`, or the scheduler's store with `--blob-store`); its
//! COPY archives are blobs (`super::uploads`).
//!
//! # Layout
//! - this file: the handlers (request, start, status, files, tags);
//! - [`plan`]: the steps checked; the template an image stands for;
//! - [`ledger`]: the builds in the scheduler's store, their logs and
//!   leases;
//! - [`history`]: a template's builds and a build's log, as E2B pages
//!   them;
//! - [`job`]: a started build, run in its sandbox.

mod history;
mod job;
mod ledger;
mod plan;

use super::catalog::{self, Versioned};
use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
pub(in crate::control) use history::{listed, logs};
use http::{HeaderMap, Response, StatusCode};
pub(crate) use ledger::Builds;
use ledger::{Asked, Page};
use plan::{parse_plan, resolve_image, Step};
use std::sync::Arc;
use warren_core::body::Body;
use warren_proto::scheduler::v1::RecordKind;
use warren_template::Template;

/// Most log entries one status answer carries (E2B's `limit` maximum).
const MAX_PAGE: u32 = 100;
/// What a built template's record says it came from (how it is told from
/// a snapshot, which is also a team's template record).
pub(crate) const BUILT_SOURCE: &str = "api build";

/// Whether a record is a template built through this API.
pub(crate) fn is_built(t: &Template) -> bool {
    t.source.starts_with(BUILT_SOURCE)
}

pub(super) fn bad(m: impl Into<String>) -> ApiError {
    ApiError::bad_request("invalid_build", m)
}

fn decode(raw: &str) -> Result<String, ApiError> {
    percent_encoding::percent_decode_str(raw)
        .decode_utf8()
        .map(|s| s.into_owned())
        .map_err(|_| bad("the path is not UTF-8"))
}

/// E2B's `TemplateRequestResponseV3`.
#[derive(Debug, serde::Serialize)]
struct Requested {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    public: bool,
    aliases: Vec<String>,
    names: Vec<String>,
    tags: Vec<String>,
}

/// `POST /v3/templates` (E2B's `TemplateBuildRequestV3`): checks the name
/// and resources and makes a waiting build. The template id is the name.
pub(super) async fn request(
    app: &App,
    team: &Team,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let v: serde_json::Value =
        serde_json::from_slice(body).map_err(|e| bad(format!("invalid JSON body: {e}")))?;
    let obj = v
        .as_object()
        .ok_or_else(|| bad("the body must be a JSON object"))?;
    let raw = match (obj.get("name"), obj.get("alias")) {
        (Some(serde_json::Value::String(n)), _) | (None, Some(serde_json::Value::String(n))) => {
            n.clone()
        }
        _ => return Err(bad("field \"name\" (a string) is required")),
    };
    let (name, tag) = match raw.split_once(':') {
        Some((n, t)) => (n.to_string(), Some(t.to_string())),
        None => (raw.clone(), None),
    };
    super::snapshots::validate_name(&name)?;
    let mut tags: Vec<String> = match obj.get("tags") {
        None | Some(serde_json::Value::Null) => Vec::new(),
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|t| {
                t.as_str()
                    .map(str::to_string)
                    .ok_or_else(|| bad("field \"tags\" must be an array of strings"))
            })
            .collect::<Result<_, _>>()?,
        Some(_) => return Err(bad("field \"tags\" must be an array of strings")),
    };
    tags.extend(tag);
    for t in &tags {
        validate_tag(t)?;
    }
    if tags.is_empty() {
        tags.push(DEFAULT_TAG.to_string());
    }
    tags.dedup();
    // What a tenant asks for is bounded by what the operator allows.
    let number = |k: &str, default: u64| match obj.get(k) {
        None | Some(serde_json::Value::Null) => Ok(default),
        Some(n) => n
            .as_u64()
            .ok_or_else(|| bad(format!("field {k:?} must be a whole number"))),
    };
    let caps = app.settings.limits.sandbox;
    let cpu_count = caps.cpus(number("cpuCount", 2)?).map_err(bad)?;
    let memory_mb = caps.memory_mb(number("memoryMB", 512)?).map_err(bad)?;
    super::snapshots::records_ready(app)?;
    if matches!(catalog::get(app, &name).await?, Some((t, _)) if t.snapshot.is_none()) {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "template_name_taken",
            format!("{name:?} is the name of an operator's template; choose another name"),
        ));
    }
    let new_names: Vec<String> = tags.iter().map(|t| tagged(&name, t)).collect();
    room_for_templates(app, team, &new_names).await?;
    let build_id = new_build_id();
    app.builds
        .request(
            &build_id,
            &team.0,
            &Asked {
                name: name.clone(),
                tags: tags.clone(),
                cpu_count,
                memory_mb,
            },
        )
        .await?;
    tracing::info!(template = %name, build = %build_id, team = %team.0, "template build requested");
    reply(
        StatusCode::ACCEPTED,
        &Requested {
            template_id: name.clone(),
            build_id,
            public: false,
            aliases: vec![name.clone()],
            names: vec![name],
            tags,
        },
    )
}

/// The tag of a template's name without one (`name` is `name:default`).
pub(crate) const DEFAULT_TAG: &str = "default";

/// A build id: a random UUID (the SDK parses some as UUIDs).
fn new_build_id() -> String {
    use sha2::Digest;
    let h = sha2::Sha256::digest(warren_core::id::random_token(32).as_bytes());
    let x: String = h.iter().take(16).map(|b| format!("{b:02x}")).collect();
    format!(
        "{}-{}-4{}-a{}-{}",
        &x[..8],
        &x[8..12],
        &x[13..16],
        &x[17..20],
        &x[20..32]
    )
}

/// The build steps of a `TemplateBuildStartV2` body as the build handler
/// reads them, described one line per step (for the fuzz targets).
pub(crate) fn plan_lines(body: &[u8]) -> Result<Vec<String>, ApiError> {
    let plan = plan::parse_plan(body)?;
    Ok(plan.steps.iter().map(plan::Step::describe).collect())
}

/// Checks a tag: 1 to 64 of `A-Z a-z 0-9 . _ -`, starting with a letter
/// or digit (so no `:`; `name:tag` is how a name carries one).
pub(crate) fn validate_tag(t: &str) -> Result<(), ApiError> {
    let ok = !t.is_empty()
        && t.len() <= 64
        && t.as_bytes()[0].is_ascii_alphanumeric()
        && t.bytes()
            .all(|b| b.is_ascii_alphanumeric() || b"._-".contains(&b));
    if ok {
        Ok(())
    } else {
        Err(bad(format!(
            "tag {t:?} must be 1 to 64 of A-Z, a-z, 0-9, '.', '_', '-', starting with a letter \
             or digit"
        )))
    }
}

/// The name a team's template is found by with `tag`: `name`, or
/// `name:tag`.
pub(crate) fn tagged(name: &str, tag: &str) -> String {
    if tag == DEFAULT_TAG {
        name.to_string()
    } else {
        format!("{name}:{tag}")
    }
}

/// `POST /v2/templates/{id}/builds/{buildID}`: checks the steps, claims
/// the build for this gateway and starts it; 202.
pub(super) async fn start(
    app: &Arc<App>,
    team: &Team,
    headers: &HeaderMap,
    template_raw: &str,
    build_id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let template_id = decode(template_raw)?;
    let mut plan = parse_plan(body)?;
    super::snapshots::records_ready(app)?;
    if let Some(image) = &plan.image {
        let operators = catalog::list(app, None, &[RecordKind::Operator]).await?;
        plan.from = resolve_image(&operators, image)?;
    }
    // The parent, as this team may use it: its defaults are where the
    // steps start.
    let parent = match super::snapshots::find(app, team, &plan.from).await? {
        Some((t, _)) => t,
        None => match catalog::get(app, &plan.from).await? {
            Some((t, _)) if t.snapshot.is_none() => t,
            // Another team's public template.
            _ => match super::manage::find_public(app, &plan.from).await? {
                Some((t, _)) => t,
                None => {
                    return Err(bad(format!(
                        "template {:?} (fromTemplate) not found",
                        plan.from
                    )))
                }
            },
        },
    };
    let self_url = app.self_url.get().cloned().ok_or_else(|| {
        ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "not_ready",
            "the gateway is still starting",
        )
    })?;
    let key = headers
        .get(warren_client::headers::API_KEY)
        .and_then(|v| v.to_str().ok())
        .map(|k| k.trim().to_string())
        .unwrap_or_default();
    // Every COPY's upload is named in the claim: an unknown hash is this
    // request's 400, and an archive that expires mid-build stays readable.
    let mut hashes: Vec<String> = Vec::new();
    for step in &plan.steps {
        if let Step::Copy { hash, .. } = step {
            super::uploads::validate_hash(hash)?;
            if !hashes.contains(hash) {
                hashes.push(hash.clone());
            }
        }
    }
    // What the build runs, for whoever reads the build's record.
    let plan_json = serde_json::json!({
        "from": plan.from,
        "steps": plan.steps.iter().map(Step::describe).collect::<Vec<_>>(),
    })
    .to_string();
    let (asked, uploads) = app
        .builds
        .claim(build_id, &team.0, &template_id, plan_json, hashes)
        .await?;
    let job = job::Job {
        app: app.clone(),
        log: app.builds.running(build_id),
        build_id: build_id.to_string(),
        team: team.0.clone(),
        name: asked.name,
        tags: asked.tags,
        self_url,
        key,
        parent,
        cpu_count: asked.cpu_count,
        memory_mb: asked.memory_mb,
        caps: app.settings.limits.sandbox,
        plan,
        uploads,
        files: Default::default(),
    };
    tracing::info!(template = %job.name, build = %build_id, team = %team.0, "template build started");
    tokio::spawn(job.run());
    Ok(warren_core::body::status(StatusCode::ACCEPTED))
}

/// `GET /templates/{id}/builds/{buildID}/status?logsOffset=&limit=&level=`.
pub(super) async fn status(
    app: &App,
    team: &Team,
    template_raw: &str,
    build_id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let template_id = decode(template_raw)?;
    let (mut offset, mut limit, mut level) = (0u64, MAX_PAGE, None::<String>);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        let q = |m: String| ApiError::bad_request("invalid_query", m);
        match k.as_ref() {
            "logsOffset" => {
                offset = v
                    .parse()
                    .map_err(|_| q(format!("logsOffset {v:?} is not a whole number")))?
            }
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| *n <= MAX_PAGE)
                    .ok_or_else(|| q(format!("limit must be between 0 and {MAX_PAGE}")))?
            }
            "level" => match v.as_ref() {
                "debug" | "info" | "warn" | "error" => level = Some(v.into_owned()),
                _ => return Err(q(format!("level {v:?} is not debug, info, warn or error"))),
            },
            _ => {}
        }
    }
    let page = Page {
        offset,
        limit,
        level,
    };
    app.builds
        .status(build_id, &team.0, &template_id, &page)
        .await
}

/// `GET /templates/{id}/files/{hash}`: whether the team's archive of
/// those files is here, and where to upload it (201).
pub(super) async fn files(
    app: &App,
    team: &Team,
    headers: &HeaderMap,
    template_raw: &str,
    hash: &str,
) -> Result<Response<Body>, ApiError> {
    // The archive is the team's, whatever template it is first used for
    // (E2B keeps them per team too); the id is only checked.
    super::snapshots::validate_name(decode(template_raw)?.split(':').next().unwrap_or_default())?;
    let link = app.uploads.link(team, hash, headers).await?;
    reply(StatusCode::CREATED, &link)
}

/// E2B's `AssignedTemplateTags`.
#[derive(Debug, serde::Serialize)]
struct Assigned {
    tags: Vec<String>,
    #[serde(rename = "buildID")]
    build_id: String,
}

/// The build id a built record names (empty for any other record).
pub(in crate::control) fn build_of(t: &Template) -> String {
    t.source
        .strip_prefix(BUILT_SOURCE)
        .and_then(|r| r.split_whitespace().next())
        .unwrap_or_default()
        .to_string()
}

fn string_list(
    obj: &serde_json::Map<String, serde_json::Value>,
    k: &str,
) -> Result<Vec<String>, ApiError> {
    let list: Vec<String> = match obj.get(k) {
        Some(serde_json::Value::Array(a)) => a
            .iter()
            .map(|t| t.as_str().map(str::to_string))
            .collect::<Option<_>>()
            .ok_or_else(|| bad(format!("field {k:?} must be an array of strings")))?,
        _ => {
            return Err(bad(format!(
                "field {k:?} (an array of strings) is required"
            )))
        }
    };
    if list.is_empty() || list.len() > 64 {
        return Err(bad(format!("field {k:?} must name 1 to 64 tags")));
    }
    for t in &list {
        validate_tag(t)?;
    }
    Ok(list)
}

fn object(body: &[u8]) -> Result<serde_json::Map<String, serde_json::Value>, ApiError> {
    match serde_json::from_slice(body) {
        Ok(serde_json::Value::Object(o)) => Ok(o),
        Ok(_) => Err(bad("the body must be a JSON object")),
        Err(e) => Err(bad(format!("invalid JSON body: {e}"))),
    }
}

/// The team's built template `called` (`name` or `name:tag`) as read,
/// or 404.
async fn built(app: &App, team: &Team, called: &str) -> Result<Versioned, ApiError> {
    match super::snapshots::find(app, team, called).await? {
        Some((t, v)) if is_built(&t) => Ok((t, v)),
        _ => Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "template_not_found",
            format!("template {called:?} not found"),
        )),
    }
}

/// Whether `team` may keep built templates called `names` as well
/// (`--template-team-count`; each tag counts; a name it has already is
/// replaced, not added): counted in the shared store's records, or asked
/// of the scheduler's (whose writes check again, in the transaction).
async fn room_for_templates(app: &App, team: &Team, names: &[String]) -> Result<(), ApiError> {
    let limit = app.settings.limits.store.template_count;
    if let Some(store) = catalog::local(app) {
        return super::team_store::room_for_templates(
            &store,
            app.settings.limits.store,
            &team.0,
            names,
        );
    }
    let mut new = 0;
    for called in names {
        let key = warren_template::named_snapshot_key(&team.0, called);
        if catalog::get(app, &key).await?.is_none() {
            new += 1;
        }
    }
    if new == 0 {
        return Ok(());
    }
    let req = warren_proto::scheduler::v1::GetTeamUsageRequest {
        team_id: team.0.clone(),
    };
    let usage = app
        .scheduler
        .call("GetTeamUsage", |mut c| {
            let req = req.clone();
            async move { c.get_team_usage(req).await }
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, None))?;
    if usage.templates as usize + new > limit {
        return Err(ApiError::over_limit(
            "too_many_templates",
            format!(
                "team {} keeps {} templates (each tag counts), its limit \
                 (--template-team-count) is {limit}; delete some first",
                team.0, usage.templates
            ),
        ));
    }
    Ok(())
}

/// Records the team's built template `t`: new (`expected` 0) or in place
/// of the one read at `expected`. A replaced record's layers are noted.
pub(super) async fn put_built(app: &App, t: &Template, expected: u64) -> Result<(), ApiError> {
    match catalog::local(app) {
        Some(store) => super::team_store::put(&store, t),
        None => catalog::put(app, t, true, expected).await,
    }
}

/// Removes the team's record `t` as read at `version`; its layers are
/// noted. False when it was gone.
pub(super) async fn remove_record(app: &App, t: &Template, version: u64) -> Result<bool, ApiError> {
    match catalog::local(app) {
        Some(store) => super::team_store::remove(&store, t),
        None => catalog::remove(app, &t.name, version).await,
    }
}

/// `POST /templates/tags` (`Template.assign_tags`): `{target: "name:tag",
/// tags}`: the target's build gets the tags too (each a record of its own,
/// moved from any build that had it); 201. Of two requests giving one tag
/// at once, one wins and the other is a 409 (`record_changed`).
pub(super) async fn assign_tags(
    app: &App,
    team: &Team,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let obj = object(body)?;
    let target = match obj.get("target") {
        Some(serde_json::Value::String(t)) => t.clone(),
        _ => return Err(bad("field \"target\" (a string, name:tag) is required")),
    };
    let tags = string_list(&obj, "tags")?;
    let name = target.split(':').next().unwrap_or_default().to_string();
    if !super::snapshots::team_name_ok(&target) {
        return Err(bad(format!(
            "target {target:?} is not a template name (name or name:tag)"
        )));
    }
    super::snapshots::records_ready(app)?;
    let (mut t, _) = built(app, team, &target).await?;
    let names: Vec<String> = tags.iter().map(|tag| tagged(&name, tag)).collect();
    room_for_templates(app, team, &names).await?;
    for called in names {
        t.name = warren_template::named_snapshot_key(&team.0, &called);
        let expected = catalog::get(app, &t.name).await?.map_or(0, |(_, v)| v);
        if let Some(s) = t.snapshot.as_mut() {
            s.name = Some(called);
        }
        // The record is the tag's assignment: made now (tag queries show
        // when it was assigned).
        t.created_at_ms = warren_core::time::now_ms() as u64;
        put_built(app, &t, expected).await?;
    }
    reply(
        StatusCode::CREATED,
        &Assigned {
            tags,
            build_id: build_of(&t),
        },
    )
}

/// `DELETE /templates/tags` (`Template.remove_tags`): `{name, tags}`: the
/// tags leave the team's template `name`; 404 if one is not there. Of two
/// requests removing one tag at once, one wins; the other is a 404 or a
/// 409.
pub(super) async fn remove_tags(
    app: &App,
    team: &Team,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let obj = object(body)?;
    let name = match obj.get("name") {
        Some(serde_json::Value::String(n)) => n.split(':').next().unwrap_or_default().to_string(),
        _ => return Err(bad("field \"name\" (a string) is required")),
    };
    super::snapshots::validate_name(&name)?;
    let tags = string_list(&obj, "tags")?;
    super::snapshots::records_ready(app)?;
    let mut found = Vec::new();
    for tag in &tags {
        found.push(built(app, team, &tagged(&name, tag)).await?);
    }
    for (t, v) in found {
        if !remove_record(app, &t, v).await? {
            return Err(ApiError::new(
                StatusCode::NOT_FOUND,
                "template_not_found",
                format!(
                    "template {:?} not found (removed at the same time)",
                    t.snapshot.and_then(|s| s.name).unwrap_or(t.name)
                ),
            ));
        }
    }
    Ok(warren_core::body::status(StatusCode::NO_CONTENT))
}
