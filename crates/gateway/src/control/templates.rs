//! `GET /templates` (E2B's `Template` list) and the create-time template
//! check, over the template store the nodes read (`--template-dir`).

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use warren_core::body::Body;

/// `GET /templates`: the operator's templates (public), the ones the team
/// built through the API (its own), and other teams' public ones
/// (`super::manage::visible`).
pub async fn list(app: &App, team: &Team) -> Result<Response<Body>, ApiError> {
    reply(StatusCode::OK, &super::manage::visible(app, team).await?)
}

/// The record of the template a create names; `None` when there is none
/// to check (the node decides: `base` may come from a node's process
/// runtime without one). An unknown template is a 404.
pub async fn resolve(
    app: &App,
    template_id: &str,
) -> Result<Option<warren_template::Template>, ApiError> {
    if let crate::records::Records::Local(dir) = &app.records {
        if !dir.is_dir() {
            return Ok(None);
        }
    }
    match super::catalog::get(app, template_id).await? {
        Some((t, _)) => Ok(Some(t)),
        None if template_id == "base" => Ok(None),
        None => Err(not_found(template_id)),
    }
}

/// Most records one import takes.
const MAX_IMPORT: usize = 1000;

/// `POST /_warren/v1/templates` (`warren template push --gateway`): the
/// operator's templates (a JSON array of `warren_template::Template`
/// records, as `--template-dir` keeps them) into the scheduler's records,
/// each replacing the record of its name. Their blobs must be in the blob
/// store already (the command pushes them first). `--admin-team` keys
/// only; answers `{"imported": n}`.
pub async fn import(app: &App, team: &Team, body: &[u8]) -> Result<Response<Body>, ApiError> {
    if !app.settings.admin_teams.contains(&team.0) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "importing templates needs an operator key (a key of a team named by the gateway's \
             --admin-team)",
        ));
    }
    let crate::records::Records::Scheduler(blobs) = &app.records else {
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "records_are_local",
            format!(
                "this gateway reads its records from {} (--template-dir), where the templates \
                 are already; imports are for gateways with --blob-store",
                app.settings.template_dir.display()
            ),
        ));
    };
    let bad = |m: String| ApiError::bad_request("invalid_templates", m);
    let records: Vec<warren_template::Template> = serde_json::from_slice(body).map_err(|e| {
        bad(format!(
            "the body must be a JSON array of template records: {e}"
        ))
    })?;
    if records.len() > MAX_IMPORT {
        return Err(bad(format!(
            "{} records, more than the {MAX_IMPORT} one import takes",
            records.len()
        )));
    }
    // All checked before any is written.
    for t in &records {
        warren_template::validate_name(&t.name).map_err(|e| bad(e.to_string()))?;
        if t.snapshot.is_some() {
            return Err(bad(format!(
                "{}: a team's snapshot or paused sandbox, not an operator's template; only \
                 those are imported",
                t.name
            )));
        }
        t.defaults
            .validate()
            .map_err(|e| bad(format!("{}: {e}", t.name)))?;
        for d in std::iter::once(&t.digest).chain(&t.layers) {
            let digest: warren_blob::Digest = d
                .parse()
                .map_err(|e| bad(format!("{}: {d:?}: {e}", t.name)))?;
            let there = blobs.size(&digest).await.map_err(|e| {
                ApiError::new(
                    StatusCode::SERVICE_UNAVAILABLE,
                    "blob_store_unavailable",
                    format!("cannot check {}'s blob {d} in the blob store: {e}", t.name),
                )
            })?;
            if there.is_none() {
                return Err(bad(format!(
                    "{}: blob {d} is not in the blob store {blobs}; push the store's blobs \
                     first (warren template push --to)",
                    t.name
                )));
            }
        }
    }
    for t in &records {
        let version = super::catalog::get(app, &t.name)
            .await?
            .map_or(0, |(_, v)| v);
        super::catalog::put(app, t, false, version).await?;
        tracing::info!(template = %t.name, digest = %t.digest, team = %team.0, "operator template imported");
    }
    reply(
        StatusCode::OK,
        &serde_json::json!({ "imported": records.len() }),
    )
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
