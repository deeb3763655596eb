//! Creating sandboxes: `POST /sandboxes`, `POST /v2/sandboxes` and forks.
//!
//! Both follow the create path (ARCHITECTURE.md, "The create path"): scheduler `Place` (binding
//! CREATING, id and generation allocated; the idempotency key maps a retry
//! to the same sandbox) → node create (or fork) → scheduler
//! `RecordAssignment` (RUNNING). When the node step fails the gateway
//! deletes whatever the node may have made and reports a fenced DELETE, so
//! no half-made binding lingers; the scheduler's sweep covers a gateway that
//! dies in between.

use super::{owned, reply};
use crate::auth::Team;
use crate::error::ApiError;
use crate::models::{ForkError, ForkRequest, ForkResult, NewSandbox, Sandbox};
use crate::node_client::{CreateSandbox, NodeError, SandboxInfo};
use crate::resolver::Route;
use crate::state::App;
use http::{HeaderMap, Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use warren_core::body::Body;
use warren_core::headers::IDEMPOTENCY_KEY;
use warren_proto::scheduler::v1::{
    Binding, BindingState, EventType, PlaceRequest, Placement, RecordAssignmentRequest,
    ReportNodeUnreachableRequest, ReportSandboxEventRequest, SandboxEvent,
};

/// How much longer a create may take where the node may first fetch the
/// template's layers from the blob store (and unpack them): a 1 GB layer
/// at a slow 10 MB/s, with room.
pub(super) const LAYER_FETCH_TIME: Duration = Duration::from_secs(300);

/// Longest `Idempotency-Key` accepted.
const MAX_IDEMPOTENCY_KEY: usize = 256;

/// The client's `Idempotency-Key`, validated.
fn idempotency_key(headers: &HeaderMap) -> Result<Option<String>, ApiError> {
    let Some(v) = headers.get(IDEMPOTENCY_KEY) else {
        return Ok(None);
    };
    let bad = |why: &str| {
        ApiError::bad_request("invalid_idempotency_key", format!("Idempotency-Key {why}"))
    };
    let s = v.to_str().map_err(|_| bad("must be visible ASCII"))?.trim();
    if s.is_empty() {
        return Err(bad("is empty"));
    }
    if s.len() > MAX_IDEMPOTENCY_KEY {
        return Err(bad(&format!(
            "is longer than {MAX_IDEMPOTENCY_KEY} characters"
        )));
    }
    Ok(Some(s.to_string()))
}

/// `POST /sandboxes` (v1) and `POST /v2/sandboxes`.
pub(super) async fn create(
    app: &App,
    team: &Team,
    headers: &HeaderMap,
    body: &[u8],
    v2: bool,
) -> Result<Response<Body>, ApiError> {
    let mut new = NewSandbox::parse(body, if v2 { 300 } else { 15 })?;
    // A snapshot by name or id: its record's name, on the node that has it.
    let target = super::snapshots::resolve(app, team, &new.template_id).await?;
    new.template_id = target.template_id;
    let defaults = target.defaults;
    let template_record = match &target.record {
        Some(t) => Some(serde_json::to_value(t).map_err(|e| {
            ApiError::internal(format!("cannot encode template {}'s record: {e}", t.name))
        })?),
        None => None,
    };
    // Without a client key the gateway makes one up, so that its own retry
    // of Place on another scheduler replica cannot place twice.
    let key = idempotency_key(headers)?.unwrap_or_else(|| warren_core::id::random_token(32));
    let mut request = PlaceRequest {
        template_id: new.template_id.clone(),
        resources: defaults
            .as_ref()
            .map(|d| warren_proto::scheduler::v1::Resources {
                cpu_count: d.cpu_count,
                memory_mb: u32::try_from(d.memory_mb).unwrap_or(u32::MAX),
            }),
        team_id: team.0.clone(),
        timeout_secs: new.timeout_secs,
        metadata: new.metadata.clone(),
        idempotency_key: key,
        env_vars: new.env_vars.clone(),
        require_node_id: target.node_id,
        fork_of: String::new(),
        lifecycle: Some(new.lifecycle),
        avoid_node_id: String::new(),
        // Its most specific layer: a node holding it fetches nothing (or
        // the least).
        prefer_layer: match (&app.records, &target.record) {
            (crate::records::Records::Scheduler(_), Some(t)) => {
                t.layers.last().unwrap_or(&t.digest).clone()
            }
            _ => String::new(),
        },
        volume_mounts: super::volumes::place_mounts(&new.volume_mounts),
    };
    // A template with a start command: the node answers once it is ready;
    // from a blob store, once it fetched the layers it lacks.
    let extra = defaults.as_ref().map_or(Duration::ZERO, ready_time)
        + match app.records {
            crate::records::Records::Scheduler(_) => LAYER_FETCH_TIME,
            crate::records::Records::Local(_) => Duration::ZERO,
        };
    // A node that cannot be reached (the connection is refused, or drops
    // before any answer, as when the node is killed) is reported to the
    // scheduler, which places nothing more on it until it heartbeats again,
    // and the create is placed once more, on another node (named to avoid). The first
    // placement is removed first (a fenced DELETE): were the node alive
    // after all, its roster would list a sandbox the scheduler no longer
    // assigns to it, and the node would be told to kill it.
    let mut attempts = 0;
    let (placement, binding, info, traffic) = loop {
        attempts += 1;
        let placement = place(app, request.clone()).await?;
        let binding = placement.binding.clone().unwrap_or_default();
        // Derived from the envd access token: a retry answers the same one.
        let traffic = (!new.allow_public_traffic)
            .then(|| super::network::traffic_token(&binding.access_token));
        if earlier(&placement)? {
            // A retry of a create that already finished: the same sandbox again.
            let envd_version = app.envd_version(&placement.endpoint).await;
            let mut json = sandbox_json(app, &placement, &binding, &new.template_id, envd_version);
            json.traffic_access_token = traffic.clone();
            return reply(StatusCode::CREATED, &json);
        }
        let child = CreateSandbox {
            sandbox_id: placement.sandbox_id.clone(),
            generation: placement.generation,
            template_id: new.template_id.clone(),
            env_vars: new.env_vars.clone().into_iter().collect(),
            metadata: new.metadata.clone().into_iter().collect(),
            access_token: non_empty(&binding.access_token),
            timeout_secs: Some(new.timeout_secs),
            network: new.network.clone(),
            traffic_access_token: traffic.clone(),
            mask_request_host: new.mask_request_host.clone(),
            egress_rules: new.rules.clone(),
            egress_ca: non_empty(&binding.egress_ca),
            auto_pause_filesystem_only: new.auto_pause_filesystem_only,
            template_record: template_record.clone(),
            volumes: super::volumes::node_mounts(&binding),
        };
        let created = app.nodes.create(&placement.endpoint, &child, extra).await;
        match created {
            Err(e @ NodeError::Unreachable { .. }) if attempts == 1 => {
                tracing::warn!(sandbox = %placement.sandbox_id, node = %placement.node_id, error = %e,
                    "cannot reach the node; placing the create on another node");
                report_unreachable(app, &placement.node_id, &e.to_string()).await;
                // Not there again, whatever the scheduler's mark says by
                // now (a heartbeat sent before the node died can clear it).
                request.avoid_node_id = placement.node_id.clone();
                if e.is_connect() {
                    // Nothing was sent, so nothing is on the node.
                    forget(app, &placement).await;
                } else {
                    abandon(app, &placement).await;
                }
            }
            created => {
                let info = finish(app, &placement, created).await?;
                break (placement, binding, info, traffic);
            }
        }
    };
    let mut json = sandbox_json(
        app,
        &placement,
        &binding,
        &new.template_id,
        info.envd_version,
    );
    json.traffic_access_token = traffic;
    reply(StatusCode::CREATED, &json)
}

/// Tells the scheduler this gateway cannot connect to `node_id` (it places
/// nothing more there until the node heartbeats again).
pub(super) async fn report_unreachable(app: &App, node_id: &str, reason: &str) {
    let reported = app
        .scheduler
        .call("ReportNodeUnreachable", |mut c| {
            let req = ReportNodeUnreachableRequest {
                node_id: node_id.to_string(),
                reason: reason.to_string(),
            };
            async move { c.report_node_unreachable(req).await }
        })
        .await;
    if let Err(status) = reported {
        tracing::warn!(node = node_id, code = ?status.code(), "cannot report the node unreachable");
    }
}

/// `POST /sandboxes/{id}/fork`: `count` children on the parent's node.
pub(super) async fn fork(
    app: &App,
    team: &Team,
    headers: &HeaderMap,
    parent_id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let req = ForkRequest::parse(body)?;
    let key = idempotency_key(headers)?;
    let parent = owned(app, team, parent_id).await?;
    match BindingState::try_from(parent.state) {
        Ok(BindingState::Running) => {}
        Ok(BindingState::Lost) => return Err(ApiError::node_down(parent_id)),
        _ => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "sandbox_not_running",
                format!("sandbox {parent_id} is not running, so it cannot be forked"),
            ))
        }
    }
    let mut results = Vec::with_capacity(req.count as usize);
    for i in 0..req.count {
        let key = match &key {
            Some(k) => format!("fork:{parent_id}:{k}:{i}"),
            None => warren_core::id::random_token(32),
        };
        let result = match fork_one(app, team, &parent, req.timeout_secs, key).await {
            Ok(sandbox) => ForkResult {
                sandbox: Some(sandbox),
                error: None,
            },
            Err(e) => ForkResult {
                sandbox: None,
                error: Some(ForkError {
                    code: e.status.as_u16(),
                    error_code: e.error_code,
                    message: e.message,
                }),
            },
        };
        results.push(result);
    }
    reply(StatusCode::CREATED, &results)
}

async fn fork_one(
    app: &App,
    team: &Team,
    parent: &Binding,
    timeout_secs: u64,
    key: String,
) -> Result<Sandbox, ApiError> {
    let placement = place(
        app,
        PlaceRequest {
            template_id: parent.template_id.clone(),
            resources: parent.resources,
            team_id: team.0.clone(),
            timeout_secs,
            metadata: parent.metadata.clone(),
            idempotency_key: key,
            // The scheduler copies the parent's environment (reads never
            // carry it) and returns it in the placement.
            env_vars: Default::default(),
            require_node_id: parent.node_id.clone(),
            fork_of: parent.sandbox_id.clone(),
            // The scheduler copies the parent's lifecycle.
            lifecycle: None,
            avoid_node_id: String::new(),
            prefer_layer: String::new(),
            // The scheduler copies the parent's.
            volume_mounts: Vec::new(),
        },
    )
    .await?;
    let binding = placement.binding.clone().unwrap_or_default();
    if earlier(&placement)? {
        let envd_version = app.envd_version(&placement.endpoint).await;
        return Ok(sandbox_json(
            app,
            &placement,
            &binding,
            &parent.template_id,
            envd_version,
        ));
    }
    let child = CreateSandbox {
        sandbox_id: placement.sandbox_id.clone(),
        generation: placement.generation,
        template_id: parent.template_id.clone(),
        env_vars: binding.env_vars.clone().into_iter().collect(),
        metadata: parent.metadata.clone().into_iter().collect(),
        access_token: non_empty(&binding.access_token),
        timeout_secs: Some(timeout_secs),
        // The node gives a fork its parent's egress policy.
        network: None,
        // A fork's ports are public, as E2B's fork request cannot say otherwise.
        traffic_access_token: None,
        mask_request_host: None,
        // The node copies its parent's rules; the child has a CA of its own.
        egress_rules: Default::default(),
        egress_ca: non_empty(&binding.egress_ca),
        // The node copies its parent's.
        auto_pause_filesystem_only: false,
        // The node copies its parent's root and layers.
        template_record: None,
        // And its parent's volumes.
        volumes: Vec::new(),
    };
    // A fork starts its template's start command too.
    let extra = super::templates::resolve(app, &parent.template_id)
        .await
        .ok()
        .flatten()
        .map_or(Duration::ZERO, |t| ready_time(&t.defaults));
    let forked = app
        .nodes
        .fork(
            &placement.endpoint,
            &parent.sandbox_id,
            parent.generation,
            &child,
            extra,
        )
        .await;
    let info = finish(app, &placement, forked).await?;
    Ok(sandbox_json(
        app,
        &placement,
        &binding,
        &parent.template_id,
        info.envd_version,
    ))
}

/// How much longer than a plain create the node may take for a sandbox
/// of a template with a start command: it answers once that is ready
/// (bounded by the template's `ready_timeout_secs`), plus envd's slack.
pub(super) fn ready_time(d: &warren_template::spec::Defaults) -> Duration {
    if d.start_cmd.is_empty() {
        Duration::ZERO
    } else {
        Duration::from_secs(d.ready_timeout_secs + 5)
    }
}

/// For a placement that an earlier request with the same idempotency key
/// made: true when that sandbox is running (answer with it), an error when
/// it is in a state a create cannot answer with. False means carry on with
/// the node step (a new placement, or one still CREATING, which the node
/// answers idempotently).
fn earlier(placement: &Placement) -> Result<bool, ApiError> {
    if !placement.existing {
        return Ok(false);
    }
    let id = &placement.sandbox_id;
    match BindingState::try_from(placement.state) {
        Ok(BindingState::Running) => Ok(true),
        Ok(BindingState::Creating) => Ok(false),
        Ok(BindingState::Lost) => Err(ApiError::node_down(id)),
        _ => Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "sandbox {id}, created earlier with this Idempotency-Key, is no longer running"
            ),
        )),
    }
}

async fn place(app: &App, req: PlaceRequest) -> Result<Placement, ApiError> {
    let volumes = !req.volume_mounts.is_empty();
    app.scheduler
        .call("Place", |mut c| {
            let req = req.clone();
            async move { c.place(req).await }
        })
        .await
        .map_err(|s| {
            // A create that mounts volumes: the scheduler's words say
            // which volume and why (its node is down, it is being deleted).
            if volumes && s.code() != tonic::Code::ResourceExhausted {
                super::volumes::from_scheduler(&s, None)
            } else {
                ApiError::from_scheduler(&s, None)
            }
        })
}

/// After the node step: record the assignment, or clean up.
async fn finish(
    app: &App,
    placement: &Placement,
    node_result: Result<SandboxInfo, NodeError>,
) -> Result<SandboxInfo, ApiError> {
    let id = placement.sandbox_id.as_str();
    let info = match node_result {
        Ok(info) => info,
        Err(e) => {
            tracing::warn!(sandbox = id, node = %placement.node_id, error = %e, "node create failed; abandoning the placement");
            abandon(app, placement).await;
            return Err(create_failed(&e));
        }
    };
    app.note_envd_version(&placement.endpoint, &info.envd_version)
        .await;
    let recorded = app
        .scheduler
        .call("RecordAssignment", |mut c| async move {
            c.record_assignment(RecordAssignmentRequest {
                sandbox_id: id.to_string(),
                node_id: placement.node_id.clone(),
                generation: placement.generation,
            })
            .await
        })
        .await;
    let recorded = match recorded {
        Ok(binding) => binding,
        Err(status) => {
            tracing::warn!(sandbox = id, code = ?status.code(), message = status.message(),
                "RecordAssignment failed; abandoning the placement");
            // Unreachable scheduler: leave the sandbox for the sweep (the
            // node's roster decides). A refusal means the binding moved on:
            // undo ours.
            if !matches!(
                status.code(),
                tonic::Code::Unavailable | tonic::Code::Unknown
            ) {
                abandon(app, placement).await;
            }
            return Err(ApiError::from_scheduler(&status, Some(id)));
        }
    };
    // The route is known now: the new sandbox's first data-plane request
    // through this gateway is a cache hit.
    app.resolver
        .learn(Arc::new(Route::of_binding(
            &recorded,
            BindingState::Running,
        )))
        .await;
    Ok(info)
}

/// Deletes what the node may have made and reports a fenced DELETE, both
/// best effort (the sweep and the node's roster reconcile the rest).
async fn abandon(app: &App, placement: &Placement) {
    let id = placement.sandbox_id.as_str();
    if let Err(e) = app
        .nodes
        .delete(&placement.endpoint, id, placement.generation)
        .await
    {
        tracing::debug!(sandbox = id, error = %e, "cleanup delete on the node failed");
    }
    forget(app, placement).await;
}

/// Removes the placement's binding (a fenced DELETE), best effort.
async fn forget(app: &App, placement: &Placement) {
    let id = placement.sandbox_id.as_str();
    let reported = app
        .scheduler
        .call("ReportSandboxEvent", |mut c| async move {
            c.report_sandbox_event(ReportSandboxEventRequest {
                node_id: placement.node_id.clone(),
                events: vec![SandboxEvent {
                    sandbox_id: id.to_string(),
                    generation: placement.generation,
                    r#type: EventType::Delete as i32,
                    paused_record: None,
                    logs: Vec::new(),
                }],
            })
            .await
        })
        .await;
    if let Err(status) = reported {
        tracing::warn!(sandbox = id, code = ?status.code(), "cannot report the abandoned create; the sweep will clean it up");
    }
}

fn create_failed(e: &NodeError) -> ApiError {
    match e {
        NodeError::Status {
            status, message, ..
        } if status.is_client_error() => {
            ApiError::new(*status, "sandbox_create_failed", message.clone())
        }
        NodeError::Unreachable { .. } | NodeError::Timeout { .. } => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "sandbox_create_failed",
            format!("failed to create the sandbox: {e}"),
        ),
        // The node cannot get the template's layers (its message names
        // the blob store).
        NodeError::Status {
            status: StatusCode::SERVICE_UNAVAILABLE,
            message,
            ..
        } => ApiError::new(
            StatusCode::SERVICE_UNAVAILABLE,
            "sandbox_create_failed",
            format!("failed to create the sandbox: {message}"),
        ),
        _ => ApiError::new(
            StatusCode::INTERNAL_SERVER_ERROR,
            "sandbox_create_failed",
            format!("failed to create the sandbox: {e}"),
        ),
    }
}

fn non_empty(s: &str) -> Option<String> {
    (!s.is_empty()).then(|| s.to_string())
}

fn sandbox_json(
    app: &App,
    placement: &Placement,
    binding: &Binding,
    template_id: &str,
    envd_version: String,
) -> Sandbox {
    Sandbox {
        template_id: if binding.template_id.is_empty() {
            template_id.to_string()
        } else {
            binding.template_id.clone()
        },
        sandbox_id: placement.sandbox_id.clone(),
        client_id: placement.node_id.clone(),
        envd_version,
        envd_access_token: non_empty(&binding.access_token),
        traffic_access_token: None,
        domain: app.settings.advertised_domain.clone(),
    }
}
