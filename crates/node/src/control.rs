//! The control API for gateways (docs/internals.md "Control API"): JSON
//! create, fork, pause, resume, snapshot, network update, delete, list under `/_warren/v1/sandboxes`,
//! a sandbox's metrics (`GET .../{id}/metrics`, [`crate::samples`]), `POST /_warren/v1/heartbeat` (heartbeat now: a sandbox's end changed), and volumes under `/_warren/v1/volumes` ([`crate::volumes::http`]).

use crate::http::{not_found_marker, Shared};
use crate::sandbox::state::{CreateSandbox, ForkSandbox};
use crate::sandbox::NodeError;
use http::{Method, Request, Response, StatusCode};
use warren_core::body::{error, json, Body};
use warren_core::server::Incoming;

pub use warren_core::node_api::PREFIX;

/// Control request bodies are small JSON documents; anything bigger is a mistake.
const MAX_BODY: usize = 1 << 20;

pub async fn handle(shared: &Shared, req: Request<Incoming>) -> Response<Body> {
    let path = req.uri().path().to_string();
    if path == warren_core::node_api::HEARTBEAT {
        if req.method() != Method::POST {
            return error(
                StatusCode::METHOD_NOT_ALLOWED,
                format!("use POST on {path}"),
            );
        }
        shared.check_in.notify_one();
        return warren_core::body::status(StatusCode::NO_CONTENT);
    }
    if path.starts_with(warren_core::node_api::volumes::VOLUMES) {
        return crate::volumes::http::handle(shared.registry.volumes(), req).await;
    }
    let rest = path
        .strip_prefix(warren_core::node_api::SANDBOXES)
        .unwrap_or("\u{0}");
    let parts: Vec<&str> = rest.split('/').filter(|s| !s.is_empty()).collect();
    let method = req.method().clone();
    match (method, rest.is_empty() || rest == "/", parts.as_slice()) {
        (Method::GET, true, _) => list(shared),
        (Method::POST, true, _) => match read_json::<CreateSandbox>(req).await {
            Ok(body) => {
                let made = shared.registry.create(body).await;
                // What it fetched, the scheduler learns now, not at the next
                // interval: the next create of that template prefers this node.
                if matches!(made, Ok((true, _))) && shared.registry.fetches_layers() {
                    shared.check_in.notify_one();
                }
                created(made)
            }
            Err(r) => r,
        },
        (Method::POST, false, [id, "fork"]) => {
            let id = id.to_string();
            match read_json::<ForkSandbox>(req).await {
                Ok(body) => created(shared.registry.fork(&id, body.generation, body.child).await),
                Err(r) => r,
            }
        }
        (Method::POST, false, [id, "snapshot"]) => {
            match read_json::<warren_core::node_api::CreateSnapshot>(req).await {
                Ok(body) => match shared.registry.snapshot(id, body).await {
                    Ok(made) => json(StatusCode::CREATED, &made),
                    Err(e) => node_error(e),
                },
                Err(r) => r,
            }
        }
        (Method::POST, false, [id, action @ ("pause" | "resume")]) => {
            let generation = match query_generation(req.uri().query()) {
                Ok(Some(g)) => g,
                Ok(None) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        format!("{action} needs ?generation="),
                    )
                }
                Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
            };
            let id = id.to_string();
            let pausing = *action == "pause";
            let (filesystem_only, cold_boot) = if pausing {
                match read_optional_json::<warren_core::node_api::PauseSandbox>(req).await {
                    Ok(body) => (body.memory == Some(false), true),
                    Err(r) => return r,
                }
            } else {
                match read_optional_json::<warren_core::node_api::ResumeSandbox>(req).await {
                    Ok(body) => (false, body.cold_boot != Some(false)),
                    Err(r) => return r,
                }
            };
            let done = if filesystem_only {
                shared.registry.halt(&id, generation).await
            } else {
                shared
                    .registry
                    .set_paused(&id, generation, pausing, cold_boot)
                    .await
            };
            match done {
                Ok(info) => json(StatusCode::OK, &info),
                Err(e) => node_error(e),
            }
        }
        (Method::GET, false, [id, "metrics"]) => {
            shared
                .samples
                .answer(&shared.registry, id, req.uri().query().unwrap_or(""))
        }
        (Method::PUT, false, [id, "network"]) => {
            let generation = match query_generation(req.uri().query()) {
                Ok(Some(g)) => g,
                Ok(None) => {
                    return error(
                        StatusCode::BAD_REQUEST,
                        "a network update needs ?generation=",
                    )
                }
                Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
            };
            let id = id.to_string();
            match read_json::<warren_core::network::NetworkPolicy>(req).await {
                Ok(policy) => match shared
                    .registry
                    .update_network(&id, generation, policy)
                    .await
                {
                    Ok(info) => json(StatusCode::OK, &info),
                    Err(e) => node_error(e),
                },
                Err(r) => r,
            }
        }
        (Method::DELETE, false, [id]) => {
            let generation = match query_generation(req.uri().query()) {
                Ok(g) => g,
                Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
            };
            match shared
                .registry
                .delete(id, generation, "deleted by the API")
                .await
            {
                Ok(_) => warren_core::body::status(StatusCode::NO_CONTENT),
                Err(e) => node_error(e),
            }
        }
        (Method::GET, false, [id]) => {
            let generation = match query_generation(req.uri().query()) {
                Ok(g) => g,
                Err(msg) => return error(StatusCode::BAD_REQUEST, msg),
            };
            let found = shared
                .registry
                .list()
                .into_iter()
                .find(|i| i.sandbox_id == *id && generation.is_none_or(|g| g == i.generation));
            match found {
                Some(info) => json(StatusCode::OK, &info),
                None => not_found_marker(format!(
                    "sandbox {id} (generation {}) is not on node {}",
                    generation.map_or("any".to_string(), |g| g.to_string()),
                    shared.registry.node_id()
                )),
            }
        }
        (m, _, _) => error(
            StatusCode::NOT_FOUND,
            format!("no control endpoint {m} {path}"),
        ),
    }
}

fn list(shared: &Shared) -> Response<Body> {
    json(
        StatusCode::OK,
        &serde_json::json!({
            "node_id": shared.registry.node_id(),
            "incarnation": shared.incarnation,
            "runtime": shared.registry.runtime_name(),
            "sandboxes": shared.registry.list(),
        }),
    )
}

fn created(
    result: Result<(bool, crate::sandbox::state::SandboxInfo), NodeError>,
) -> Response<Body> {
    match result {
        Ok((true, info)) => json(StatusCode::CREATED, &info),
        Ok((false, info)) => json(StatusCode::OK, &info),
        Err(e) => node_error(e),
    }
}

/// Maps a registry error onto its status (docs/internals.md "Control API").
fn node_error(e: NodeError) -> Response<Body> {
    let status = match &e {
        NodeError::BadRequest(_) => StatusCode::BAD_REQUEST,
        NodeError::NotHosted { .. } => return not_found_marker(e.to_string()),
        NodeError::Conflict { .. } | NodeError::Paused(_) | NodeError::NotResumable(_) => {
            StatusCode::CONFLICT
        }
        NodeError::Unsupported(_) => StatusCode::NOT_IMPLEMENTED,
        NodeError::Full { .. } | NodeError::StoreUnavailable(_) => StatusCode::SERVICE_UNAVAILABLE,
        NodeError::Internal(_) => StatusCode::INTERNAL_SERVER_ERROR,
    };
    if status.is_server_error() {
        tracing::error!(error = %e, "control request failed");
    }
    error(status, e.to_string())
}

fn query_generation(query: Option<&str>) -> Result<Option<u64>, String> {
    let Some(q) = query else { return Ok(None) };
    for pair in q.split('&') {
        if let Some(v) = pair.strip_prefix("generation=") {
            return match v.parse::<u64>() {
                Ok(g) if g > 0 => Ok(Some(g)),
                _ => Err(format!("generation {v:?} is not a positive integer")),
            };
        }
    }
    Ok(None)
}

/// [`read_json`], an empty body being `T::default()`.
async fn read_optional_json<T: serde::de::DeserializeOwned + Default>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let bytes = warren_core::body::read_limited(req.into_body(), MAX_BODY)
        .await
        .map_err(|e| error(e.status(), e))?;
    if bytes.iter().all(u8::is_ascii_whitespace) {
        return Ok(T::default());
    }
    serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

async fn read_json<T: serde::de::DeserializeOwned>(
    req: Request<Incoming>,
) -> Result<T, Response<Body>> {
    let bytes = warren_core::body::read_limited(req.into_body(), MAX_BODY)
        .await
        .map_err(|e| error(e.status(), e))?;
    serde_json::from_slice(&bytes)
        .map_err(|e| error(StatusCode::BAD_REQUEST, format!("invalid JSON body: {e}")))
}

#[cfg(test)]
mod tests {
    #[test]
    fn generation_query() {
        assert_eq!(super::query_generation(None), Ok(None));
        assert_eq!(super::query_generation(Some("generation=3")), Ok(Some(3)));
        assert!(super::query_generation(Some("generation=0")).is_err());
        assert!(super::query_generation(Some("generation=x")).is_err());
    }
}
