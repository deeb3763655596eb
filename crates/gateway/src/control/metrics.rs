//! Sandbox metrics: E2B's `GET /sandboxes/{id}/metrics` (query `start`,
//! `end`: Unix seconds, both optional and inclusive) and
//! `GET /sandboxes/metrics?sandbox_ids=a,b` (the newest sample of each).
//! The samples live on the sandbox's node (its sampler's bounded ring); the
//! gateway finds the node through the binding and asks it.

use super::{owned, reply};
use crate::auth::Team;
use crate::error::ApiError;
use crate::node_client::NodeError;
use crate::state::App;
use futures_util::future::join_all;
use http::{Response, StatusCode};
use std::collections::{BTreeMap, HashSet};
use warren_core::body::Body;
use warren_core::id::validate_sandbox_id;
use warren_core::node_api::metrics::{SandboxMetric, Window};
use warren_proto::scheduler::v1::{Binding, BindingState};

/// Most ids `GET /sandboxes/metrics` takes at once (E2B's `maxItems`).
pub(super) const MAX_IDS: usize = 100;

/// `GET /sandboxes/{id}/metrics`: the sandbox's samples, oldest first.
pub(super) async fn one(
    app: &App,
    team: &Team,
    id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let w = window(query)?;
    let b = owned(app, team, id).await?;
    reply(StatusCode::OK, &samples(app, id, &b, &w).await?)
}

/// `GET /sandboxes/metrics?sandbox_ids=a,b`: `{"sandboxes": {id: newest
/// sample}}` for each id that is the team's sandbox and has a sample yet;
/// other ids (unknown, another team's) are left out, as E2B does.
pub(super) async fn many(app: &App, team: &Team, query: &str) -> Result<Response<Body>, ApiError> {
    let ids = sandbox_ids(query)?;
    let latest = Window {
        latest: true,
        ..Window::default()
    };
    let found = join_all(ids.iter().map(|id| async {
        let b = match owned(app, team, id).await {
            Ok(b) => b,
            Err(e) if e.status == StatusCode::NOT_FOUND => return Ok(None),
            Err(e) => return Err(e),
        };
        match samples(app, id, &b, &latest).await {
            Ok(mut v) => Ok(v.pop().map(|m| (id.clone(), m))),
            // Gone or on a lost node meanwhile: no sample to show.
            Err(e) if e.status == StatusCode::NOT_FOUND || e.error_code == "node_down" => Ok(None),
            Err(e) => Err(e),
        }
    }))
    .await;
    let mut sandboxes = BTreeMap::new();
    for f in found {
        if let Some((id, m)) = f? {
            sandboxes.insert(id, m);
        }
    }
    reply(
        StatusCode::OK,
        &serde_json::json!({ "sandboxes": sandboxes }),
    )
}

/// Asks the node hosting `b` for its samples within `w`.
async fn samples(
    app: &App,
    id: &str,
    b: &Binding,
    w: &Window,
) -> Result<Vec<SandboxMetric>, ApiError> {
    match BindingState::try_from(b.state) {
        // A paused sandbox is still on its node, with its samples.
        Ok(BindingState::Running) | Ok(BindingState::Paused) => {}
        // Not on its node yet: nothing sampled.
        Ok(BindingState::Creating) => return Ok(Vec::new()),
        Ok(BindingState::Lost) => return Err(ApiError::node_down(id)),
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    match app.nodes.metrics(&b.endpoint, id, b.generation, w).await {
        Ok(v) => Ok(v),
        Err(NodeError::Status {
            not_hosted: true, ..
        }) => Err(ApiError::sandbox_not_found(id)),
        Err(e) if e.is_connect() => Err(ApiError::upstream_unreachable()),
        Err(e) => Err(ApiError::internal(format!(
            "cannot read the metrics of sandbox {id}: {e}"
        ))),
    }
}

/// `start` and `end` (a 400 naming the bad one).
fn window(query: &str) -> Result<Window, ApiError> {
    let mut pairs = Vec::new();
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k == "start" || k == "end" {
            pairs.push(format!("{k}={v}"));
        }
    }
    Window::parse(&pairs.join("&")).map_err(|m| ApiError::bad_request("invalid_query", m))
}

/// The `sandbox_ids` parameter: comma-separated (or repeated), each a
/// valid id, no repeats, at least one and at most [`MAX_IDS`].
fn sandbox_ids(query: &str) -> Result<Vec<String>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let mut ids = Vec::new();
    let mut seen = HashSet::new();
    let mut given = false;
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        if k != "sandbox_ids" {
            continue;
        }
        given = true;
        for id in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
            validate_sandbox_id(id)
                .map_err(|e| bad(format!("sandbox_ids: invalid sandbox id: {e}")))?;
            if !seen.insert(id.to_string()) {
                return Err(bad(format!("sandbox_ids: {id} is listed twice")));
            }
            ids.push(id.to_string());
        }
    }
    if !given || ids.is_empty() {
        return Err(bad(
            "sandbox_ids is required: a comma-separated list of sandbox ids".into(),
        ));
    }
    if ids.len() > MAX_IDS {
        return Err(bad(format!(
            "sandbox_ids names {} sandboxes; at most {MAX_IDS} at once",
            ids.len()
        )));
    }
    Ok(ids)
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn ids_are_checked_and_bounded() {
        assert_eq!(
            sandbox_ids("sandbox_ids=a1%2Cb2,c3").unwrap(),
            vec!["a1", "b2", "c3"]
        );
        assert!(sandbox_ids("").unwrap_err().message.contains("required"));
        assert!(sandbox_ids("sandbox_ids=a,a")
            .unwrap_err()
            .message
            .contains("twice"));
        assert!(sandbox_ids("sandbox_ids=..%2Fx").is_err());
        let many: Vec<String> = (0..=MAX_IDS).map(|i| format!("s{i}")).collect();
        let e = sandbox_ids(&format!("sandbox_ids={}", many.join(","))).unwrap_err();
        assert!(e.message.contains("at most 100"), "{}", e.message);
    }

    #[test]
    fn windows_name_the_bad_parameter() {
        assert_eq!(window("start=1&end=2").unwrap().end, Some(2));
        assert!(window("start=x").unwrap_err().message.contains("start"));
        assert!(window("start=3&end=2")
            .unwrap_err()
            .message
            .contains("after"));
    }
}
