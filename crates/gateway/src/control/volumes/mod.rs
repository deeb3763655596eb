//! E2B's persistent volumes (docs/sandboxes.md, "Volumes"): the REST API
//! (`POST /volumes`, `GET /volumes`, `GET` and `DELETE /volumes/{id}`,
//! here) and the content API (`/volumecontent/{id}/path|dir|file`,
//! [`content`]), which every call reaches through the node that holds the
//! volume: this gateway never reads a volume's data itself.
//!
//! Records live in the scheduler's store (`volumes.proto`): a volume's
//! name is unique in its team, its token is sealed there, and a volume a
//! sandbox mounts (running or paused) cannot be deleted. A new volume's
//! data is made on its node before the answer; a delete removes the data
//! on its node, then the record (`BeginDeleteVolume` first, so no sandbox
//! mounts it meanwhile).
//!
//! Another team's volume is "not found", exactly like an unknown one.

pub(super) mod content;

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use std::time::Duration;
use warren_core::body::{status as no_content, Body};
use warren_core::config::{parse_duration, ConfigError};
use warren_proto::scheduler::v1::{
    BeginDeleteVolumeRequest, CreateVolumeRequest, FinishDeleteVolumeRequest, GetVolumeRequest,
    ListVolumesRequest, RouteVolumeRequest, Volume, VolumeBounds, VolumeState,
};

/// The volume flags (flattened into the gateway's `Config`).
#[derive(Debug, Clone, clap::Args)]
pub struct VolumeArgs {
    /// Most volumes one team may hold (past it: 429 naming this flag).
    #[arg(long, env = "WARREN_GATEWAY_VOLUME_TEAM_COUNT", default_value_t = 100)]
    pub volume_team_count: u32,

    /// Most bytes one team's volumes may hold together: each volume counts
    /// with its size limit (its node's --volume-max-bytes, reserved when
    /// it is made; a shared store's volumes have none), so the bound holds
    /// whatever is written. Past it: 429 naming this flag.
    #[arg(long, env = "WARREN_GATEWAY_VOLUME_TEAM_BYTES", default_value_t = 1 << 40)]
    pub volume_team_bytes: u64,

    /// How long this gateway trusts a volume token and the node it named
    /// without asking the scheduler again: a deleted volume's token may
    /// pass here for this long (its node then answers that the volume is
    /// gone).
    #[arg(long, env = "WARREN_GATEWAY_VOLUME_ROUTE_TTL", default_value = "10s", value_parser = parse_duration)]
    pub volume_route_ttl: Duration,
}

/// [`VolumeArgs`], checked.
#[derive(Debug, Clone, Copy)]
pub struct VolumeSettings {
    pub team_count: u32,
    pub team_bytes: u64,
    pub route_ttl: Duration,
}

impl VolumeArgs {
    pub fn validate(&self) -> Result<VolumeSettings, ConfigError> {
        if self.volume_team_count == 0 {
            return Err(ConfigError::Invalid(
                "--volume-team-count must be at least 1".into(),
            ));
        }
        if self.volume_route_ttl > Duration::from_secs(3600) {
            return Err(ConfigError::Invalid(
                "--volume-route-ttl must be at most 1h".into(),
            ));
        }
        Ok(VolumeSettings {
            team_count: self.volume_team_count,
            team_bytes: self.volume_team_bytes,
            route_ttl: self.volume_route_ttl,
        })
    }
}

/// E2B's `Volume` (listings).
#[derive(serde::Serialize)]
struct VolumeJson {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
}

/// E2B's `VolumeAndToken` (create, get). `domain` is absent: the content
/// API is this gateway's own URL (`E2B_VOLUME_API_URL`).
#[derive(serde::Serialize)]
struct VolumeAndToken {
    #[serde(rename = "volumeID")]
    volume_id: String,
    name: String,
    token: String,
}

pub(super) fn not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "volume_not_found",
        format!("volume {id} not found"),
    )
}

/// The volumes a binding mounts, as its node's create takes them.
pub(super) fn node_mounts(
    b: &warren_proto::scheduler::v1::Binding,
) -> Vec<warren_core::node_api::volumes::VolumeMount> {
    b.volume_mounts
        .iter()
        .map(|m| warren_core::node_api::volumes::VolumeMount {
            path: m.path.clone(),
            volume_id: m.volume_id.clone(),
            max_bytes: m.max_bytes,
            shared: m.node_id.is_empty(),
        })
        .collect()
}

/// A create's `volumeMounts`, as `Place` takes them.
pub(super) fn place_mounts(
    m: &[crate::models::VolumeMountJson],
) -> Vec<warren_proto::scheduler::v1::VolumeMountRequest> {
    m.iter()
        .map(|m| warren_proto::scheduler::v1::VolumeMountRequest {
            name: m.name.clone(),
            path: m.path.clone(),
        })
        .collect()
}

/// A volume id from a path, checked (400 naming it).
pub(super) fn check_id(id: &str) -> Result<(), ApiError> {
    warren_core::volume::validate_id(id)
        .map_err(|e| ApiError::bad_request("invalid_volume_id", format!("invalid volume id: {e}")))
}

/// A scheduler error about volume `id`: its own words (the sandbox-worded
/// mapping does not fit), bounds naming this gateway's flags.
pub(super) fn from_scheduler(s: &tonic::Status, id: Option<&str>) -> ApiError {
    use tonic::Code;
    let reason = s
        .metadata()
        .get(warren_proto::REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    let bound = s
        .metadata()
        .get(warren_proto::BOUND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match (s.code(), reason) {
        (Code::NotFound, _) => match id {
            Some(id) => not_found(id),
            None => ApiError::new(StatusCode::NOT_FOUND, "not_found", s.message()),
        },
        (Code::AlreadyExists, _) => ApiError::new(StatusCode::CONFLICT, "conflict", s.message()),
        (Code::ResourceExhausted, _) => {
            let (code, flag) = match bound {
                warren_proto::BOUND_TEAM_VOLUME_BYTES => {
                    ("too_many_volume_bytes", "--volume-team-bytes")
                }
                _ => ("too_many_volumes", "--volume-team-count"),
            };
            ApiError::over_limit(code, format!("{} ({flag})", s.message()))
        }
        (Code::FailedPrecondition, warren_proto::REASON_VOLUME_MOUNTED) => {
            ApiError::new(StatusCode::CONFLICT, "volume_in_use", s.message())
        }
        (Code::FailedPrecondition, warren_proto::REASON_NODE_DOWN)
        | (Code::FailedPrecondition, warren_proto::REASON_NO_VOLUME_STORE) => {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "volume_unavailable",
                s.message(),
            );
            e.retry_after = Some(crate::error::RETRY_AFTER_SECS);
            e
        }
        (Code::FailedPrecondition, _) => {
            ApiError::new(StatusCode::CONFLICT, "conflict", s.message())
        }
        (Code::InvalidArgument, _) => ApiError::bad_request("bad_request", s.message()),
        (Code::Unauthenticated, _) => ApiError::unauthorized(s.message()),
        _ => ApiError::from_scheduler(s, None),
    }
}

/// `POST /volumes`: a new volume of the team, its data made on its node.
pub(super) async fn create(
    app: &App,
    team: &Team,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let obj = crate::models::object(body, false)?;
    let name = match obj.get("name") {
        Some(serde_json::Value::String(s)) => s.clone(),
        Some(_) => {
            return Err(ApiError::bad_request(
                "invalid_body",
                "field \"name\" must be a string",
            ))
        }
        None => {
            return Err(ApiError::bad_request(
                "invalid_body",
                "missing required field \"name\"",
            ))
        }
    };
    warren_core::volume::validate_name(&name)
        .map_err(|e| ApiError::bad_request("invalid_body", format!("field \"name\": {e}")))?;
    let bounds = VolumeBounds {
        max_count: app.settings.volumes.team_count,
        max_bytes: app.settings.volumes.team_bytes,
    };
    let v = app
        .scheduler
        .call("CreateVolume", |mut c| {
            let req = CreateVolumeRequest {
                team_id: team.0.clone(),
                name: name.clone(),
                bounds: Some(bounds),
            };
            async move { c.create_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, None))?;
    // Its data, made now on the node that holds it: a create that cannot
    // make it leaves no record behind.
    let made = async {
        let endpoint = serving_node(app, &v).await?;
        app.nodes
            .ensure_volume(&endpoint, &v.volume_id, v.max_bytes)
            .await
            .map_err(|e| {
                ApiError::new(
                    StatusCode::BAD_GATEWAY,
                    "volume_create_failed",
                    format!("cannot make volume {}'s data on its node: {e}", v.name),
                )
            })
    }
    .await;
    if let Err(e) = made {
        tracing::warn!(volume = %v.volume_id, error = %e.message, "volume create failed; removing its record");
        forget(app, team, &v.volume_id).await;
        return Err(e);
    }
    reply(
        StatusCode::CREATED,
        &VolumeAndToken {
            volume_id: v.volume_id,
            name: v.name,
            token: v.token,
        },
    )
}

/// The address of the node that serves `v`'s content now.
async fn serving_node(app: &App, v: &Volume) -> Result<String, ApiError> {
    let route = app
        .scheduler
        .call("RouteVolume", |mut c| {
            let req = RouteVolumeRequest {
                volume_id: v.volume_id.clone(),
                token: v.token.clone(),
                avoid_node_id: String::new(),
            };
            async move { c.route_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, Some(&v.volume_id)))?;
    Ok(route.endpoint)
}

/// Removes a volume's record (a create that failed half-way), best effort.
async fn forget(app: &App, team: &Team, id: &str) {
    let begun = app
        .scheduler
        .call("BeginDeleteVolume", |mut c| {
            let req = BeginDeleteVolumeRequest {
                volume_id: id.to_string(),
                team_id: team.0.clone(),
            };
            async move { c.begin_delete_volume(req).await }
        })
        .await;
    let done = match begun {
        Ok(_) => app
            .scheduler
            .call("FinishDeleteVolume", |mut c| {
                let req = FinishDeleteVolumeRequest {
                    volume_id: id.to_string(),
                    team_id: team.0.clone(),
                };
                async move { c.finish_delete_volume(req).await }
            })
            .await
            .map(|_| ()),
        Err(s) => Err(s),
    };
    if let Err(s) = done {
        tracing::warn!(volume = id, code = ?s.code(), message = s.message(), "cannot remove the volume's record");
    }
}

/// `GET /volumes`: the team's volumes, by name.
pub(super) async fn list(app: &App, team: &Team) -> Result<Response<Body>, ApiError> {
    let r = app
        .scheduler
        .call("ListVolumes", |mut c| {
            let req = ListVolumesRequest {
                team_id: team.0.clone(),
            };
            async move { c.list_volumes(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, None))?;
    let out: Vec<VolumeJson> = r
        .volumes
        .into_iter()
        .filter(|v| v.state != VolumeState::Deleting as i32)
        .map(|v| VolumeJson {
            volume_id: v.volume_id,
            name: v.name,
        })
        .collect();
    reply(StatusCode::OK, &out)
}

async fn get_volume(app: &App, team: &Team, id: &str) -> Result<Volume, ApiError> {
    check_id(id)?;
    app.scheduler
        .call("GetVolume", |mut c| {
            let req = GetVolumeRequest {
                volume_id: id.to_string(),
                team_id: team.0.clone(),
                with_token: true,
            };
            async move { c.get_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, Some(id)))
}

/// `GET /volumes/{id}`: the volume and its token.
pub(super) async fn get(app: &App, team: &Team, id: &str) -> Result<Response<Body>, ApiError> {
    let v = get_volume(app, team, id).await?;
    if v.state == VolumeState::Deleting as i32 {
        return Err(not_found(id));
    }
    reply(
        StatusCode::OK,
        &VolumeAndToken {
            volume_id: v.volume_id,
            name: v.name,
            token: v.token,
        },
    )
}

/// `DELETE /volumes/{id}`: 204 once its data and record are gone; 409
/// while a sandbox mounts it; 503 while its node is down (it stays, and a
/// later delete finishes it).
pub(super) async fn delete(app: &App, team: &Team, id: &str) -> Result<Response<Body>, ApiError> {
    let v = get_volume(app, team, id).await?;
    // Its node first: while that is down nothing changes (503 naming it).
    let endpoint = serving_node(app, &v).await?;
    app.scheduler
        .call("BeginDeleteVolume", |mut c| {
            let req = BeginDeleteVolumeRequest {
                volume_id: id.to_string(),
                team_id: team.0.clone(),
            };
            async move { c.begin_delete_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, Some(id)))?;
    app.nodes.remove_volume(&endpoint, id).await.map_err(|e| {
        let mut err = ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "volume_unavailable",
            format!(
                "volume {} is being deleted, but its node cannot remove its data now ({e}); \
                     delete it again later",
                v.name
            ),
        );
        err.retry_after = Some(crate::error::RETRY_AFTER_SECS);
        err
    })?;
    app.scheduler
        .call("FinishDeleteVolume", |mut c| {
            let req = FinishDeleteVolumeRequest {
                volume_id: id.to_string(),
                team_id: team.0.clone(),
            };
            async move { c.finish_delete_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, Some(id)))?;
    content::forget_routes(app, id).await;
    Ok(no_content(StatusCode::NO_CONTENT))
}
