//! `GET /templates` (E2B's `Template` list) and the create-time template
//! check, over the template store the nodes read (`--template-dir`).

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use warren_core::body::Body;

/// E2B's `Template`, with the fields warren has.
#[derive(Debug, serde::Serialize)]
struct Template {
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
}

fn store(app: &App) -> Option<warren_template::Store> {
    app.settings
        .template_dir
        .is_dir()
        .then(|| warren_template::Store::open(&app.settings.template_dir).ok())
        .flatten()
}

/// `GET /templates`: the operator's templates (public) and the ones the
/// team built through the API (its own).
pub fn list(app: &App, team: &Team) -> Result<Response<Body>, ApiError> {
    let templates = match store(app) {
        Some(s) => s.list().map_err(|e| {
            ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
        })?,
        None => Vec::new(),
    };
    // Snapshots are their teams' own, listed by `GET /snapshots`.
    let out: Vec<Template> = templates
        .into_iter()
        .filter_map(|t| match &t.snapshot {
            None => Some((t.name.clone(), true, t)),
            Some(s) if s.team == team.0 && super::builds::is_built(&t) => {
                Some((s.name.clone().unwrap_or_else(|| t.name.clone()), false, t))
            }
            Some(_) => None,
        })
        .map(|(name, public, t)| {
            let at = warren_core::time::rfc3339_ms(t.created_at_ms as i64);
            Template {
                template_id: name.clone(),
                build_id: t.digest.clone(),
                cpu_count: t.defaults.cpu_count,
                memory_mb: t.defaults.memory_mb,
                disk_size_mb: t.defaults.disk_mb,
                public,
                aliases: vec![name.clone()],
                names: vec![name],
                created_at: at.clone(),
                updated_at: at,
                created_by: None,
                last_spawned_at: None,
                spawn_count: 0,
                build_count: 1,
                envd_version: warren_core::node_api::ENVD_VERSION,
                build_status: "ready",
            }
        })
        .collect();
    reply(StatusCode::OK, &out)
}

/// The defaults of the template a create names; `None` when the gateway
/// has no store to check (the node decides). An unknown template is a 404.
pub fn resolve(
    app: &App,
    template_id: &str,
) -> Result<Option<warren_template::spec::Defaults>, ApiError> {
    let Some(store) = store(app) else {
        return Ok(None);
    };
    match store.get(template_id) {
        Ok(t) => Ok(Some(t.defaults)),
        // `base` may come from the nodes' process runtime without a store entry.
        Err(_) if template_id == "base" => Ok(None),
        Err(warren_template::TemplateError::NotFound(_)) => Err(not_found(template_id)),
        Err(e) => Err(ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "internal",
            e.to_string(),
        )),
    }
}

/// 404 for a template (or snapshot) a create names that does not exist for
/// the caller.
pub(super) fn not_found(template_id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "template_not_found",
        format!("template {template_id:?} not found (see GET /templates and GET /snapshots)"),
    )
}
