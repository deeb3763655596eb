//! `GET /_warren/v1/routes/{id}`: how this gateway routes a sandbox now,
//! for `warren route`. Not part of the E2B API.
//!
//! It shows the cached route (node, endpoint, generation, age, TTL left)
//! beside what the scheduler says now (`GetSandbox`, which neither reads
//! nor fills the cache), and whether they agree. Team-scoped like
//! everything else: another team's sandbox looks exactly like an unknown
//! one (both sides `null`).

use super::reply;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use serde_json::{json, Value};
use warren_core::body::Body;
use warren_proto::scheduler::v1::{Binding, BindingState, GetSandboxRequest};

pub(super) async fn show(app: &App, team: &Team, id: &str) -> Result<Response<Body>, ApiError> {
    let cached = app
        .resolver
        .cached(id)
        .await
        .filter(|c| c.route.team_id == team.0);
    let binding = match app
        .scheduler
        .call("GetSandbox", |mut c| async move {
            c.get_sandbox(GetSandboxRequest {
                sandbox_id: id.to_string(),
            })
            .await
        })
        .await
    {
        Ok(b) if b.team_id == team.0 => Some(b),
        Ok(_) => None,
        Err(s) if s.code() == tonic::Code::NotFound => None,
        Err(s) => return Err(ApiError::from_scheduler(&s, Some(id))),
    };
    let agree = match (&cached, &binding) {
        // Nothing cached cannot be wrong: the next request looks it up.
        (None, _) => true,
        (Some(_), None) => false,
        (Some(c), Some(b)) => {
            c.route.node_id == b.node_id
                && c.route.endpoint == b.endpoint
                && c.route.generation == b.generation
                && b.state != BindingState::Lost as i32
        }
    };
    let cached_json = cached.map(|c| {
        json!({
            "node_id": c.route.node_id,
            "endpoint": c.route.endpoint,
            "generation": c.route.generation,
            "age_ms": millis(c.age),
            "ttl_left_ms": millis(c.ttl_left),
        })
    });
    reply(
        StatusCode::OK,
        &json!({
            "sandbox_id": id,
            "cached": cached_json,
            "scheduler": binding.as_ref().map(scheduler_json),
            "agree": agree,
            "cache": app.resolver.status(),
        }),
    )
}

fn scheduler_json(b: &Binding) -> Value {
    json!({
        "node_id": b.node_id,
        "endpoint": b.endpoint,
        "generation": b.generation,
        "state": state_name(b.state),
    })
}

fn state_name(state: i32) -> &'static str {
    match BindingState::try_from(state) {
        Ok(BindingState::Creating) => "creating",
        Ok(BindingState::Running) => "running",
        Ok(BindingState::Paused) => "paused",
        Ok(BindingState::Lost) => "lost",
        Ok(BindingState::Expiring) => "expiring",
        _ => "unknown",
    }
}

fn millis(d: std::time::Duration) -> u64 {
    u64::try_from(d.as_millis()).unwrap_or(u64::MAX)
}
