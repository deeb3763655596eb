//! E2B's network API: `PUT /sandboxes/{id}/network` (replace a running
//! sandbox's egress policy and `rules`), the traffic access token a sandbox created
//! with `allowPublicTraffic: false` is reached with, and the network
//! `GET /sandboxes/{id}` and connect report.
//!
//! The node keeps each sandbox's network settings and enforces them: its
//! egress table, the token (as a digest) its data plane checks on every
//! request to a port other than envd's, and the Host mask. The gateway
//! validates, routes and reports.

use super::owned;
use crate::auth::Team;
use crate::error::ApiError;
use crate::models::NetworkUpdate;
use crate::node_client::NodeError;
use crate::state::App;
use hmac::{Hmac, Mac};
use http::{Response, StatusCode};
use sha2::Sha256;
use warren_core::body::{status as no_content, Body};
use warren_core::node_api::NetworkInfo;
use warren_proto::scheduler::v1::{Binding, BindingState};

/// The traffic access token of the sandbox whose envd access token is
/// `access_token`: HMAC-SHA256 under it, so a retried create (and a
/// connect) answers the same token without the scheduler keeping a second
/// secret, and the traffic token, which users hand to whoever may reach
/// the sandbox's ports, reveals nothing of the envd token.
pub(crate) fn traffic_token(access_token: &str) -> String {
    match Hmac::<Sha256>::new_from_slice(access_token.as_bytes()) {
        Ok(mut mac) => {
            mac.update(b"warren traffic access token v1");
            mac.finalize()
                .into_bytes()
                .iter()
                .map(|b| format!("{b:02x}"))
                .collect()
        }
        // HMAC takes a key of any length; never reached.
        Err(_) => warren_core::id::random_token(64),
    }
}

/// Before a data-plane request wakes a paused sandbox (`pause::wake`):
/// a private sandbox's port other than envd's is woken only for a request
/// carrying its traffic access token, as E2B resumes only traffic it would
/// let through. (A running sandbox's node checks the token itself; a
/// frozen one's cannot forward, so the gateway checks here.) `403` else.
pub(crate) async fn admit_before_wake(
    app: &App,
    route: &crate::resolver::Route,
    port: u16,
    headers: &http::HeaderMap,
) -> Result<(), ApiError> {
    if port == warren_core::headers::ENVD_PORT {
        return Ok(());
    }
    let b = Binding {
        sandbox_id: route.sandbox_id.clone(),
        endpoint: route.endpoint.clone(),
        generation: route.generation,
        ..Default::default()
    };
    // The node cannot say: it cannot be woken there either; the resume's
    // own error says why.
    let Some(info) = current(app, &b).await else {
        return Ok(());
    };
    if info.allow_public_traffic {
        return Ok(());
    }
    let team = Team(route.team_id.clone());
    let want = traffic_token(&super::access_token(app, &team, &route.sandbox_id).await?);
    let got = headers
        .get(warren_core::network::TRAFFIC_ACCESS_TOKEN_HEADER)
        .map(http::HeaderValue::as_bytes)
        .unwrap_or_default();
    if crate::auth::constant_time_eq(want.as_bytes(), got) {
        Ok(())
    } else {
        Err(ApiError::new(
            StatusCode::FORBIDDEN,
            "forbidden",
            format!(
                "sandbox {} does not allow public traffic: the {} header is missing or not this sandbox's",
                route.sandbox_id,
                warren_core::network::TRAFFIC_ACCESS_TOKEN_HEADER
            ),
        ))
    }
}

/// `PUT /sandboxes/{id}/network`: 204 once the node enforces the new rules.
pub(super) async fn update(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let update = NetworkUpdate::parse(body)?;
    let b = owned(app, team, id).await?;
    match BindingState::try_from(b.state) {
        // A frozen sandbox's rules change as well: they apply when it thaws.
        Ok(BindingState::Running) | Ok(BindingState::Paused) => {}
        Ok(BindingState::Creating) => return Err(ApiError::sandbox_not_ready(id)),
        Ok(BindingState::Lost) => return Err(ApiError::node_down(id)),
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    let update = warren_core::node_api::NetworkUpdate {
        policy: update.policy,
        rules: update.rules,
    };
    app.nodes
        .update_network(&b.endpoint, id, b.generation, &update)
        .await
        .map_err(|e| node_failed(id, e))?;
    Ok(no_content(StatusCode::NO_CONTENT))
}

fn node_failed(id: &str, e: NodeError) -> ApiError {
    match e {
        NodeError::Status {
            not_hosted: true, ..
        } => ApiError::sandbox_not_found(id),
        NodeError::Status {
            status, message, ..
        } if status.is_client_error() || status == StatusCode::NOT_IMPLEMENTED => {
            let code = if status == StatusCode::NOT_IMPLEMENTED {
                "not_implemented"
            } else {
                "invalid_network"
            };
            ApiError::new(status, code, message)
        }
        e => ApiError::new(
            StatusCode::BAD_GATEWAY,
            "network_update_failed",
            format!("cannot update the network of sandbox {id}: {e}"),
        ),
    }
}

/// The network of `b` now, from its node; None when the node cannot say
/// (an older node, or one that cannot be reached: the answer goes without).
pub(super) async fn current(app: &App, b: &Binding) -> Option<NetworkInfo> {
    if b.endpoint.is_empty() {
        return None;
    }
    match app
        .nodes
        .get(&b.endpoint, &b.sandbox_id, b.generation)
        .await
    {
        Ok(info) => info.network,
        Err(e) => {
            tracing::debug!(sandbox = %b.sandbox_id, error = %e, "cannot read the sandbox's network from its node");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    #[test]
    fn the_traffic_token_is_stable_and_not_the_access_token() {
        let a = super::traffic_token("abc");
        assert_eq!(a, super::traffic_token("abc"));
        assert_ne!(a, super::traffic_token("abd"));
        assert_eq!(a.len(), 64);
        assert!(!a.contains("abc"));
    }
}
