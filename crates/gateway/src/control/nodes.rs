//! `GET /nodes`: the nodes the scheduler knows, in the shape of E2B's admin
//! node list, for operators (`warren node ls`). Only keys of a team named by
//! `--admin-team` may see them: node endpoints are infrastructure, not tenant
//! data.

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use serde_json::json;
use warren_core::body::Body;
use warren_proto::scheduler::v1::{ListNodesRequest, NodeState};

pub(super) async fn list(app: &App, team: &Team) -> Result<Response<Body>, ApiError> {
    if !app.settings.admin_teams.contains(&team.0) {
        return Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            "listing nodes needs an operator key (a key of a team named by the gateway's --admin-team)",
        ));
    }
    let nodes = app
        .scheduler
        .call("ListNodes", |mut c| async move {
            c.list_nodes(ListNodesRequest {}).await
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, None))?
        .nodes;
    let body: Vec<_> = nodes
        .iter()
        .map(|n| {
            let status = match NodeState::try_from(n.state) {
                Ok(NodeState::Up) => "ready",
                Ok(NodeState::Down) => "unhealthy",
                _ => "unknown",
            };
            json!({
                "nodeID": n.node_id,
                "status": status,
                "endpoint": n.endpoint,
                "sandboxCount": n.sandboxes,
                "capacity": n.capacity,
                "incarnation": n.incarnation.to_string(),
                "leaseExpiresAt": warren_core::time::rfc3339_ms(n.lease_expires_at_ms),
                "cachedLayers": n.cached_layers,
            })
        })
        .collect();
    reply(StatusCode::OK, &body)
}
