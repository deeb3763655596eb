//! The control plane: the E2B REST API subset the `e2b` SDK uses.
//!
//! Routing is explicit (one `match` on path segments) so unknown paths are
//! a JSON 404 and known paths with the wrong method a JSON 405 with
//! `Allow`. Order of checks: route, API key (401), sandbox id in the path
//! (400, never sent to the scheduler), body (400 naming the field), then
//! the handler.
//!
//! - [`create`]: `POST /sandboxes`, `POST /v2/sandboxes`, `POST /sandboxes/{id}/fork`
//!   (Place → node → RecordAssignment, cleaned up if the node fails).
//! - [`sandboxes`]: get, list (v1, v2), kill, timeout, connect (v1, v2).
//! - [`pause`]: `POST /sandboxes/{id}/pause` and `/resume` (freeze and thaw
//!   on the node, then the fenced PAUSE / RESUME event).
//! - [`metrics`]: `GET /sandboxes/{id}/metrics` and `GET /sandboxes/metrics`
//!   (the samples on the sandbox's node).
//! - [`network`]: `PUT /sandboxes/{id}/network`, the traffic access token.
//! - [`secrets`]: E2B's `/secrets` (the scheduler keeps them; values are
//!   write-only).
//! - [`route`]: `GET /_warren/v1/routes/{id}`, what `warren route` shows.
//! - [`builds`]: E2B's template build API (`POST /v3/templates`, `POST
//!   /v2/templates/{id}/builds/{buildID}`, the build status), each build
//!   run in a sandbox through this gateway and saved as the team's template.
//! - [`uploads`]: COPY's uploads (`GET /templates/{id}/files/{hash}`'s
//!   signed link, `PUT /_warren/v1/uploads/{hash}`), kept as opaque blobs
//!   for the build that copies them into its sandbox.
//! - [`snapshots`]: `POST /sandboxes/{id}/snapshots`, `GET /snapshots`,
//!   `DELETE /templates/{id}` (a snapshot), and what a create naming a
//!   snapshot resolves to.
//! - [`team_store`]: a team's records in the shared template store,
//!   counted against its bounds; replaced or removed with their layers
//!   noted.
//! - [`layers`]: the sweeps that remove noted layers no node's sandbox
//!   stacks (the shared store) and blobs nothing names (the blob store).
//! - [`logs`]: `GET /sandboxes/{id}/logs` and `/v2/...`: a sandbox's log,
//!   from its node while it has one, from the scheduler's store once ended.
//! - [`refresh`]: `POST /sandboxes/{id}/refreshes` (keep-alive).
//! - [`manage`]: `GET`/`PATCH /templates/{id}`, `PATCH /v2/templates/{id}`
//!   (publishing), `GET /v2/templates`, `GET /default-templates`.
//! - [`tags`]: the tag queries under `/templates/{id}/tags`.
//! - [`volumes`]: E2B's persistent volumes (`/volumes`) and their content
//!   API (`/volumecontent/{id}/...`, its bearer token instead of an API
//!   key), served by the node that holds each volume.

mod builds;
mod catalog;
mod create;
pub mod fuzzing;
pub(crate) mod layers;
mod logs;
mod manage;
mod metrics;
pub(crate) mod network;
mod nodes;
pub(crate) mod pause;
mod refresh;
mod route;
mod sandboxes;
mod secrets;
mod snapshots;
mod tags;
mod team_store;
mod templates;
mod uploads;
mod volumes;

use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
pub(crate) use builds::Builds;
use bytes::Bytes;
use http::{header, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::{BodyExt, Limited};
use std::sync::Arc;
pub use uploads::UploadSettings;
pub(crate) use uploads::Uploads;
pub use volumes::content::VolumeRoutes;
pub use volumes::{VolumeArgs, VolumeSettings};
use warren_core::body::{json, status as no_content, Body};
use warren_core::id::validate_sandbox_id;
use warren_core::server::Incoming;
use warren_proto::scheduler::v1::{Binding, GetAccessTokenRequest, GetSandboxRequest};

/// One control-plane endpoint, with the sandbox id from its path.
#[derive(Debug, Clone, PartialEq, Eq)]
enum Endpoint {
    Health,
    /// `/sandboxes` (v1) or `/v2/sandboxes`.
    Sandboxes {
        v2: bool,
    },
    Sandbox(String),
    Timeout(String),
    Connect {
        id: String,
        v2: bool,
    },
    Fork(String),
    Pause(String),
    Resume(String),
    /// `/sandboxes/{id}/network`: E2B's egress rules update.
    Network(String),
    /// `/_warren/v1/routes/{id}`: the route cache's view against the scheduler's.
    Route(String),
    /// `/nodes`: E2B's admin node list, for operators (`--admin-team`).
    Nodes,
    /// `/templates`: the template store's templates.
    Templates,
    /// `/_warren/v1/templates`: operator records imported (`warren template
    /// push --gateway`; `--admin-team` keys only).
    ImportTemplates,
    /// `/sandboxes/{id}/metrics`.
    Metrics(String),
    /// `/sandboxes/metrics?sandbox_ids=...`.
    SandboxesMetrics,
    /// `/sandboxes/{id}/snapshots`: take a snapshot.
    Snapshot(String),
    /// `/snapshots`: the team's snapshots.
    Snapshots,
    /// `/templates/{id}`: delete (a snapshot; the id percent-encoded).
    Template(String),
    /// `/templates/aliases/{alias}`: whether the team can use that name.
    TemplateAlias(String),
    /// `/v3/templates`: request a template build.
    TemplateBuilds,
    /// `/v2/templates/{id}/builds/{buildID}`: start it with its steps.
    TemplateBuild(String, String),
    /// `/templates/{id}/builds/{buildID}/status`.
    TemplateBuildStatus(String, String),
    /// `/templates/{id}/files/{hash}`: COPY's upload link.
    TemplateFiles(String, String),
    /// `/templates/tags`: assign (POST) or remove (DELETE) tags.
    TemplateTags,
    /// `/_warren/v1/uploads/{hash}`: a COPY archive (the signed link is
    /// its credential, not an API key).
    Upload(String),
    /// `/sandboxes/{id}/refreshes`: keep a sandbox alive.
    Refresh(String),
    /// `/sandboxes/{id}/logs` (v1) or `/v2/sandboxes/{id}/logs`.
    SandboxLogs {
        id: String,
        v2: bool,
    },
    /// `/v2/templates`: the templates, paged.
    TemplatesV2,
    /// `/default-templates`: the operator's templates.
    DefaultTemplates,
    /// `/v2/templates/{id}`: publish or unpublish (PATCH).
    TemplateV2(String),
    /// `/templates/{id}/builds/{buildID}/logs`.
    TemplateBuildLogs(String, String),
    /// `/templates/{id}/tags`.
    TemplateTagList(String),
    /// `/templates/{id}/tags/count`.
    TemplateTagCount(String),
    /// `/templates/{id}/tags/exists?tag=`.
    TemplateTagExists(String),
    /// `/templates/{id}/tags/groups`.
    TemplateTagGroups(String),
    /// `/templates/{id}/tags/{tag}/assignments`.
    TemplateTagAssignments(String, String),
    /// `/volumes`: the team's volumes.
    Volumes,
    /// `/volumes/{id}`.
    Volume(String),
    /// `/volumecontent/{id}/{path|dir|file}`: the volume's bearer token is
    /// its credential.
    VolumeContent(String, String),
    /// `/secrets` and `/secrets/{id}` (`secrets.rs`).
    Secrets,
    Secret(String),
}

impl Endpoint {
    fn parse(path: &str) -> Option<Endpoint> {
        let segs: Vec<&str> = path.trim_matches('/').split('/').collect();
        let id = |s: &str| s.to_string();
        Some(match segs.as_slice() {
            ["health"] => Endpoint::Health,
            ["sandboxes"] => Endpoint::Sandboxes { v2: false },
            ["v2", "sandboxes"] => Endpoint::Sandboxes { v2: true },
            // Before `/sandboxes/{id}`: "metrics" is no sandbox id.
            ["sandboxes", "metrics"] => Endpoint::SandboxesMetrics,
            ["sandboxes", s] => Endpoint::Sandbox(id(s)),
            ["sandboxes", s, "metrics"] => Endpoint::Metrics(id(s)),
            ["sandboxes", s, "timeout"] => Endpoint::Timeout(id(s)),
            ["sandboxes", s, "connect"] => Endpoint::Connect {
                id: id(s),
                v2: false,
            },
            ["v2", "sandboxes", s, "connect"] => Endpoint::Connect {
                id: id(s),
                v2: true,
            },
            ["sandboxes", s, "fork"] => Endpoint::Fork(id(s)),
            ["sandboxes", s, "pause"] => Endpoint::Pause(id(s)),
            ["sandboxes", s, "resume"] => Endpoint::Resume(id(s)),
            ["sandboxes", s, "network"] => Endpoint::Network(id(s)),
            ["sandboxes", s, "refreshes"] => Endpoint::Refresh(id(s)),
            ["sandboxes", s, "logs"] => Endpoint::SandboxLogs {
                id: id(s),
                v2: false,
            },
            ["v2", "sandboxes", s, "logs"] => Endpoint::SandboxLogs {
                id: id(s),
                v2: true,
            },
            ["v2", "templates"] => Endpoint::TemplatesV2,
            ["default-templates"] => Endpoint::DefaultTemplates,
            ["v2", "templates", t] => Endpoint::TemplateV2(id(t)),
            ["templates", t, "builds", b, "logs"] => Endpoint::TemplateBuildLogs(id(t), id(b)),
            // Before `/templates/{id}/tags`: "aliases" is no template id.
            ["templates", "aliases", a] => Endpoint::TemplateAlias(id(a)),
            ["templates", t, "tags"] => Endpoint::TemplateTagList(id(t)),
            ["templates", t, "tags", "count"] => Endpoint::TemplateTagCount(id(t)),
            ["templates", t, "tags", "exists"] => Endpoint::TemplateTagExists(id(t)),
            ["templates", t, "tags", "groups"] => Endpoint::TemplateTagGroups(id(t)),
            ["templates", t, "tags", g, "assignments"] => {
                Endpoint::TemplateTagAssignments(id(t), id(g))
            }
            ["_warren", "v1", "routes", s] => Endpoint::Route(id(s)),
            ["_warren", "v1", "uploads", h] => Endpoint::Upload(id(h)),
            ["_warren", "v1", "templates"] => Endpoint::ImportTemplates,
            ["nodes"] => Endpoint::Nodes,
            ["templates"] => Endpoint::Templates,
            ["sandboxes", s, "snapshots"] => Endpoint::Snapshot(id(s)),
            ["snapshots"] => Endpoint::Snapshots,
            // Before `/templates/{id}`: "tags" is no template id.
            ["templates", "tags"] => Endpoint::TemplateTags,
            ["templates", t] => Endpoint::Template(id(t)),
            ["v3", "templates"] => Endpoint::TemplateBuilds,
            ["v2", "templates", t, "builds", b] => Endpoint::TemplateBuild(id(t), id(b)),
            ["templates", t, "builds", b, "status"] => Endpoint::TemplateBuildStatus(id(t), id(b)),
            ["templates", t, "files", h] => Endpoint::TemplateFiles(id(t), id(h)),
            ["volumes"] => Endpoint::Volumes,
            ["volumes", v] => Endpoint::Volume(id(v)),
            ["volumecontent", v, op @ ("path" | "dir" | "file")] => {
                Endpoint::VolumeContent(id(v), id(op))
            }
            ["secrets"] => Endpoint::Secrets,
            ["secrets", s] => Endpoint::Secret(id(s)),
            _ => return None,
        })
    }

    fn methods(&self) -> &'static [Method] {
        match self {
            Endpoint::Health => &[Method::GET, Method::HEAD],
            Endpoint::Sandboxes { .. } | Endpoint::Secrets => &[Method::GET, Method::POST],
            Endpoint::Secret(_) => &[Method::GET, Method::POST, Method::DELETE],
            Endpoint::Sandbox(_) => &[Method::GET, Method::DELETE],
            Endpoint::Route(_)
            | Endpoint::Nodes
            | Endpoint::Templates
            | Endpoint::Metrics(_)
            | Endpoint::SandboxesMetrics
            | Endpoint::Snapshots
            | Endpoint::TemplateAlias(_)
            | Endpoint::TemplateBuildStatus(..)
            | Endpoint::TemplateFiles(..)
            | Endpoint::SandboxLogs { .. }
            | Endpoint::TemplatesV2
            | Endpoint::DefaultTemplates
            | Endpoint::TemplateBuildLogs(..)
            | Endpoint::TemplateTagList(_)
            | Endpoint::TemplateTagCount(_)
            | Endpoint::TemplateTagExists(_)
            | Endpoint::TemplateTagGroups(_)
            | Endpoint::TemplateTagAssignments(..) => &[Method::GET],
            Endpoint::Template(_) => &[Method::GET, Method::PATCH, Method::DELETE],
            Endpoint::TemplateV2(_) => &[Method::PATCH],
            Endpoint::TemplateTags => &[Method::POST, Method::DELETE],
            Endpoint::Network(_) | Endpoint::Upload(_) => &[Method::PUT],
            Endpoint::Volumes => &[Method::GET, Method::POST],
            Endpoint::Volume(_) => &[Method::GET, Method::DELETE],
            Endpoint::VolumeContent(_, op) => match op.as_str() {
                "path" => &[Method::GET, Method::PATCH, Method::DELETE],
                "dir" => &[Method::GET, Method::POST],
                _ => &[Method::GET, Method::PUT],
            },
            _ => &[Method::POST],
        }
    }

    fn sandbox_id(&self) -> Option<&str> {
        match self {
            Endpoint::Health
            | Endpoint::Sandboxes { .. }
            | Endpoint::Nodes
            | Endpoint::Templates
            | Endpoint::ImportTemplates
            | Endpoint::SandboxesMetrics
            | Endpoint::Snapshots
            | Endpoint::Template(_)
            | Endpoint::TemplateAlias(_)
            | Endpoint::TemplateBuilds
            | Endpoint::TemplateTags
            | Endpoint::TemplateBuild(..)
            | Endpoint::TemplateBuildStatus(..)
            | Endpoint::TemplateFiles(..)
            | Endpoint::Upload(_)
            | Endpoint::TemplatesV2
            | Endpoint::DefaultTemplates
            | Endpoint::TemplateV2(_)
            | Endpoint::TemplateBuildLogs(..)
            | Endpoint::TemplateTagList(_)
            | Endpoint::TemplateTagCount(_)
            | Endpoint::TemplateTagExists(_)
            | Endpoint::TemplateTagGroups(_)
            | Endpoint::TemplateTagAssignments(..)
            | Endpoint::Volumes
            | Endpoint::Volume(_)
            | Endpoint::VolumeContent(..)
            | Endpoint::Secrets
            | Endpoint::Secret(_) => None,
            Endpoint::Sandbox(id)
            | Endpoint::Timeout(id)
            | Endpoint::Connect { id, .. }
            | Endpoint::Fork(id)
            | Endpoint::Pause(id)
            | Endpoint::Resume(id)
            | Endpoint::Route(id)
            | Endpoint::Network(id)
            | Endpoint::Snapshot(id)
            | Endpoint::Metrics(id)
            | Endpoint::Refresh(id)
            | Endpoint::SandboxLogs { id, .. } => Some(id),
        }
    }
}

/// Answers one control-plane request.
pub async fn handle(app: &Arc<App>, req: Request<Incoming>) -> Response<Body> {
    match dispatch(app, req).await {
        Ok(r) => r,
        Err(e) => e.into_response(),
    }
}

async fn dispatch(app: &Arc<App>, req: Request<Incoming>) -> Result<Response<Body>, ApiError> {
    let path = req.uri().path().to_string();
    let method = req.method().clone();
    let Some(endpoint) = Endpoint::parse(&path) else {
        return Err(ApiError::new(
            StatusCode::NOT_FOUND,
            "not_found",
            format!("no such endpoint: {method} {path}"),
        ));
    };
    let allowed = endpoint.methods();
    if !allowed.contains(&method) {
        let list = allowed
            .iter()
            .map(Method::as_str)
            .collect::<Vec<_>>()
            .join(", ");
        let mut r = ApiError::new(
            StatusCode::METHOD_NOT_ALLOWED,
            "method_not_allowed",
            format!("{method} is not allowed on {path}; use {list}"),
        )
        .into_response();
        if let Ok(v) = HeaderValue::from_str(&list) {
            r.headers_mut().insert(header::ALLOW, v);
        }
        return Ok(r);
    }
    if endpoint == Endpoint::Health {
        return Ok(no_content(StatusCode::NO_CONTENT));
    }
    if let Endpoint::Upload(hash) = &endpoint {
        // Before the API key check: the SDK sends none; the signed link
        // is the credential.
        let (parts, body) = req.into_parts();
        let query = parts.uri.query().unwrap_or("");
        app.uploads.put(hash, query, &parts.headers, body).await?;
        return Ok(no_content(StatusCode::OK));
    }
    if let Endpoint::VolumeContent(id, op) = &endpoint {
        // Before the API key check and the body read: the volume's token
        // is the credential, and the body streams to the node.
        return volumes::content::handle(app, id, op, req).await;
    }
    let team = app.settings.api_keys.authenticate(req.headers())?;
    if let Some(id) = endpoint.sandbox_id() {
        validate_sandbox_id(id).map_err(|e| {
            ApiError::bad_request("invalid_sandbox_id", format!("invalid sandbox id: {e}"))
        })?;
    }
    let (parts, body) = req.into_parts();
    let body = read_body(body, app.settings.max_body).await?;
    let query = parts.uri.query().unwrap_or("");
    match (endpoint, parts.method) {
        (Endpoint::Sandboxes { v2 }, Method::POST) => {
            create::create(app, &team, &parts.headers, &body, v2).await
        }
        (Endpoint::Sandboxes { v2: false }, _) => sandboxes::list_v1(app, &team, query).await,
        (Endpoint::Sandboxes { v2: true }, _) => sandboxes::list_v2(app, &team, query).await,
        (Endpoint::Sandbox(id), Method::DELETE) => sandboxes::kill(app, &team, &id).await,
        (Endpoint::Sandbox(id), _) => sandboxes::get(app, &team, &id).await,
        (Endpoint::Timeout(id), _) => sandboxes::set_timeout(app, &team, &id, &body).await,
        (Endpoint::Connect { id, v2 }, _) => sandboxes::connect(app, &team, &id, &body, v2).await,
        (Endpoint::Route(id), _) => route::show(app, &team, &id).await,
        (Endpoint::Nodes, _) => nodes::list(app, &team).await,
        (Endpoint::Templates, _) => templates::list(app, &team).await,
        (Endpoint::ImportTemplates, _) => templates::import(app, &team, &body).await,
        (Endpoint::TemplateBuilds, _) => builds::request(app, &team, &body).await,
        (Endpoint::TemplateBuild(t, b), _) => {
            builds::start(app, &team, &parts.headers, &t, &b, &body).await
        }
        (Endpoint::TemplateBuildStatus(t, b), _) => builds::status(app, &team, &t, &b, query).await,
        (Endpoint::TemplateFiles(t, h), _) => {
            builds::files(app, &team, &parts.headers, &t, &h).await
        }
        (Endpoint::TemplateTags, Method::DELETE) => builds::remove_tags(app, &team, &body).await,
        (Endpoint::TemplateTags, _) => builds::assign_tags(app, &team, &body).await,
        (Endpoint::Fork(id), _) => create::fork(app, &team, &parts.headers, &id, &body).await,
        (Endpoint::Pause(id), _) => pause::pause(app, &team, &id, &body).await,
        (Endpoint::Resume(id), _) => pause::resume_endpoint(app, &team, &id, &body).await,
        (Endpoint::Metrics(id), _) => metrics::one(app, &team, &id, query).await,
        (Endpoint::SandboxesMetrics, _) => metrics::many(app, &team, query).await,
        (Endpoint::Snapshot(id), _) => snapshots::create(app, &team, &id, &body).await,
        (Endpoint::Snapshots, _) => snapshots::list(app, &team, query).await,
        (Endpoint::Template(id), Method::GET) => manage::get(app, &team, &id, query).await,
        (Endpoint::Template(id), Method::PATCH) => {
            manage::update(app, &team, &id, &body, false).await
        }
        (Endpoint::Template(id), _) => snapshots::delete(app, &team, &id).await,
        (Endpoint::TemplateV2(id), _) => manage::update(app, &team, &id, &body, true).await,
        (Endpoint::TemplatesV2, _) => manage::list_v2(app, &team, query).await,
        (Endpoint::DefaultTemplates, _) => manage::defaults(app).await,
        (Endpoint::TemplateBuildLogs(t, b), _) => builds::logs(app, &team, &t, &b, query).await,
        (Endpoint::TemplateTagList(t), _) => tags::list(app, &team, &t).await,
        (Endpoint::TemplateTagCount(t), _) => tags::count(app, &team, &t).await,
        (Endpoint::TemplateTagExists(t), _) => tags::exists(app, &team, &t, query).await,
        (Endpoint::TemplateTagGroups(t), _) => tags::groups(app, &team, &t, query).await,
        (Endpoint::TemplateTagAssignments(t, g), _) => {
            tags::assignments(app, &team, &t, &g, query).await
        }
        (Endpoint::Refresh(id), _) => refresh::refresh(app, &team, &id, &body).await,
        (Endpoint::SandboxLogs { id, v2: false }, _) => logs::v1(app, &team, &id, query).await,
        (Endpoint::SandboxLogs { id, v2: true }, _) => logs::v2(app, &team, &id, query).await,
        (Endpoint::TemplateAlias(alias), _) => snapshots::alias(app, &team, &alias).await,
        (Endpoint::Network(id), _) => network::update(app, &team, &id, &body).await,
        (Endpoint::Volumes, Method::POST) => volumes::create(app, &team, &body).await,
        (Endpoint::Volumes, _) => volumes::list(app, &team).await,
        (Endpoint::Volume(id), Method::DELETE) => volumes::delete(app, &team, &id).await,
        (Endpoint::Volume(id), _) => volumes::get(app, &team, &id).await,
        (Endpoint::Secrets, m) => secrets::collection(app, &team, &m, query, &body).await,
        (Endpoint::Secret(id), m) => secrets::one(app, &team, &m, &id, &body).await,
        (Endpoint::Health | Endpoint::Upload(_) | Endpoint::VolumeContent(..), _) => {
            Ok(no_content(StatusCode::NO_CONTENT))
        }
    }
}

/// Reads a control-plane body, bounded by `--max-body`.
async fn read_body(body: Incoming, max: usize) -> Result<Bytes, ApiError> {
    match Limited::new(body, max).collect().await {
        Ok(c) => Ok(c.to_bytes()),
        Err(e) if e.is::<http_body_util::LengthLimitError>() => Err(ApiError::new(
            StatusCode::PAYLOAD_TOO_LARGE,
            "body_too_large",
            format!("request body is larger than {max} bytes"),
        )),
        Err(e) => Err(ApiError::bad_request(
            "invalid_body",
            format!("cannot read the request body: {e}"),
        )),
    }
}

/// The binding of `id` if it belongs to `team`; another team's sandbox is
/// "not found", exactly like an unknown one.
async fn owned(app: &App, team: &Team, id: &str) -> Result<Binding, ApiError> {
    let binding = app
        .scheduler
        .call("GetSandbox", |mut c| async move {
            c.get_sandbox(GetSandboxRequest {
                sandbox_id: id.to_string(),
            })
            .await
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    if binding.team_id != team.0 {
        return Err(ApiError::sandbox_not_found(id));
    }
    Ok(binding)
}

/// The envd access token of `team`'s sandbox `id` (empty when it has none).
/// Bindings read from the scheduler never carry it; this is the one call
/// that does, for the sandbox's own team.
async fn access_token(app: &App, team: &Team, id: &str) -> Result<String, ApiError> {
    let token = app
        .scheduler
        .call("GetAccessToken", |mut c| async move {
            c.get_access_token(GetAccessTokenRequest {
                sandbox_id: id.to_string(),
                team_id: team.0.clone(),
            })
            .await
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    Ok(token.access_token)
}

/// `status` with `value` as JSON (re-exported for the handlers).
fn reply<T: serde::Serialize>(status: StatusCode, value: &T) -> Result<Response<Body>, ApiError> {
    Ok(json(status, value))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn routes() {
        assert_eq!(
            Endpoint::parse("/sandboxes"),
            Some(Endpoint::Sandboxes { v2: false })
        );
        assert_eq!(
            Endpoint::parse("/v2/sandboxes/"),
            Some(Endpoint::Sandboxes { v2: true })
        );
        assert_eq!(
            Endpoint::parse("/v2/sandboxes/abc/connect"),
            Some(Endpoint::Connect {
                id: "abc".into(),
                v2: true
            })
        );
        assert_eq!(
            Endpoint::parse("/sandboxes/abc/fork"),
            Some(Endpoint::Fork("abc".into()))
        );
        assert_eq!(
            Endpoint::parse("/_warren/v1/routes/abc"),
            Some(Endpoint::Route("abc".into()))
        );
        assert_eq!(Endpoint::parse("/templates"), Some(Endpoint::Templates));
        assert_eq!(
            Endpoint::parse("/templates/aliases/base"),
            Some(Endpoint::TemplateAlias("base".into()))
        );
        assert_eq!(
            Endpoint::parse("/sandboxes/metrics"),
            Some(Endpoint::SandboxesMetrics)
        );
        assert_eq!(
            Endpoint::parse("/sandboxes/abc/metrics"),
            Some(Endpoint::Metrics("abc".into()))
        );
        assert_eq!(Endpoint::parse("/templates/x/y"), None);
        assert_eq!(
            Endpoint::parse("/sandboxes/abc/snapshots"),
            Some(Endpoint::Snapshot("abc".into()))
        );
        assert_eq!(Endpoint::parse("/snapshots"), Some(Endpoint::Snapshots));
        assert_eq!(
            Endpoint::parse("/templates/team%2Fs%3Adefault"),
            Some(Endpoint::Template("team%2Fs%3Adefault".into()))
        );
        assert_eq!(Endpoint::parse("/sandboxes/a/b/c"), None);
        assert_eq!(
            Endpoint::parse("/templates/tags"),
            Some(Endpoint::TemplateTags)
        );
        assert_eq!(
            Endpoint::parse("/v2/templates/t/builds/b"),
            Some(Endpoint::TemplateBuild("t".into(), "b".into()))
        );
        assert_eq!(
            Endpoint::parse("/templates/t/builds/b/status"),
            Some(Endpoint::TemplateBuildStatus("t".into(), "b".into()))
        );
        assert_eq!(
            Endpoint::parse("/_warren/v1/uploads/ab"),
            Some(Endpoint::Upload("ab".into()))
        );
        assert_eq!(
            Endpoint::parse("/v3/templates"),
            Some(Endpoint::TemplateBuilds)
        );
        assert_eq!(Endpoint::parse("/volumes"), Some(Endpoint::Volumes));
        assert_eq!(
            Endpoint::parse("/volumecontent/v1/file"),
            Some(Endpoint::VolumeContent("v1".into(), "file".into()))
        );
        assert_eq!(Endpoint::parse("/volumecontent/v1/other"), None);
    }
}
