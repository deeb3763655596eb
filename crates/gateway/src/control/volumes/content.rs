//! E2B's volume content API, `/volumecontent/{volumeID}/path|dir|file`
//! (`E2B_VOLUME_API_URL` is this gateway's URL), with the volume's bearer
//! token. Each call is forwarded, query and body as sent, to the node that
//! holds the volume (`/_warren/v1/volumes/{id}/...`), which does the file
//! operation confined to the volume and answers in E2B's shapes; bodies
//! stream through both ways, never held here.
//!
//! Routing follows the data plane's rules (ARCHITECTURE.md invariants
//! "Positive caching only", "Nodes check identity", "Retry only what is
//! safe"): the scheduler checks the token and names the node
//! (`RouteVolume`); a successful answer is cached for
//! `--volume-route-ttl`, keyed by the volume and a hash of the token, so a
//! token never opens another volume and a wrong one is never cached. A
//! node that does not hold the volume answers `404` with the stale-route
//! marker; no answer at all counts the same. Either evicts, asks the
//! scheduler once more and, for a request without a body, tries once
//! more; otherwise the client is told what happened (503 to retry, 502
//! for a node that is gone).

use super::from_scheduler;
use crate::error::ApiError;
use crate::state::App;
use http::{header, HeaderMap, HeaderValue, Method, Request, Response, StatusCode};
use http_body_util::BodyExt;
use std::sync::Arc;
use warren_core::body::Body;
use warren_core::server::Incoming;
use warren_proto::scheduler::v1::{RouteVolumeRequest, VolumeState};

/// Where one volume's content is served, as the scheduler said.
#[derive(Debug, Clone)]
pub struct VolumeRoute {
    pub node_id: String,
    pub endpoint: String,
    pub deleting: bool,
}

/// The routes this gateway trusts for now (see the module doc).
pub struct VolumeRoutes {
    cache: moka::future::Cache<String, Arc<VolumeRoute>>,
}

impl VolumeRoutes {
    pub fn new(ttl: std::time::Duration) -> Self {
        VolumeRoutes {
            cache: moka::future::Cache::builder()
                .max_capacity(100_000)
                .time_to_live(ttl)
                .build(),
        }
    }
}

/// The cache key: the volume and a hash of the token (never the token).
fn key(volume_id: &str, token: &str) -> String {
    use sha2::{Digest, Sha256};
    let h = Sha256::digest(token.as_bytes());
    let hex: String = h.iter().map(|b| format!("{b:02x}")).collect();
    format!("{volume_id}:{hex}")
}

/// Drops every cached route of `volume_id` (it was deleted here).
pub(super) async fn forget_routes(app: &App, volume_id: &str) {
    let prefix = format!("{volume_id}:");
    let _ = app
        .volume_routes
        .cache
        .invalidate_entries_if(move |k, _| k.starts_with(&prefix));
}

/// The bearer token, from `Authorization: Bearer <token>`.
fn bearer(headers: &HeaderMap) -> Result<String, ApiError> {
    let missing = || {
        ApiError::unauthorized(
            "missing volume token: send it as Authorization: Bearer <token> (the token \
             POST /volumes or GET /volumes/{id} answered)",
        )
    };
    let v = headers
        .get(header::AUTHORIZATION)
        .ok_or_else(missing)?
        .to_str()
        .map_err(|_| ApiError::unauthorized("invalid volume token"))?;
    let (scheme, token) = v.trim().split_once(' ').ok_or_else(missing)?;
    if !scheme.eq_ignore_ascii_case("bearer") || token.trim().is_empty() {
        return Err(missing());
    }
    Ok(token.trim().to_string())
}

async fn lookup(
    app: &App,
    id: &str,
    token: &str,
    avoid: Option<&str>,
) -> Result<Arc<VolumeRoute>, ApiError> {
    let r = app
        .scheduler
        .call("RouteVolume", |mut c| {
            let req = RouteVolumeRequest {
                volume_id: id.to_string(),
                token: token.to_string(),
                avoid_node_id: avoid.unwrap_or("").to_string(),
            };
            async move { c.route_volume(req).await }
        })
        .await
        .map_err(|s| from_scheduler(&s, Some(id)))?;
    let v = r.volume.unwrap_or_default();
    let route = Arc::new(VolumeRoute {
        node_id: r.node_id,
        endpoint: r.endpoint,
        deleting: v.state == VolumeState::Deleting as i32,
    });
    app.volume_routes
        .cache
        .insert(key(id, token), route.clone())
        .await;
    Ok(route)
}

async fn resolve(app: &App, id: &str, token: &str) -> Result<Arc<VolumeRoute>, ApiError> {
    if let Some(r) = app.volume_routes.cache.get(&key(id, token)).await {
        return Ok(r);
    }
    lookup(app, id, token, None).await
}

/// Answers `/volumecontent/{id}/{op}` (`op`: `path`, `dir` or `file`).
pub(in crate::control) async fn handle(
    app: &App,
    id: &str,
    op: &str,
    req: Request<Incoming>,
) -> Result<Response<Body>, ApiError> {
    super::check_id(id)?;
    let token = bearer(req.headers())?;
    let mut route = resolve(app, id, &token).await?;
    if route.deleting {
        return Err(super::not_found(id));
    }
    let (parts, body) = req.into_parts();
    // Only requests without a body are sent twice.
    let replayable = matches!(parts.method, Method::GET | Method::HEAD | Method::DELETE);
    let path = format!(
        "{}/{op}{}",
        warren_core::node_api::volumes::volume_path(id),
        parts
            .uri
            .query()
            .map(|q| format!("?{q}"))
            .unwrap_or_default()
    );
    let build = |body: Body| -> Result<Request<Body>, ApiError> {
        let mut b = Request::builder().method(parts.method.clone()).uri(&path);
        for h in [header::CONTENT_TYPE, header::CONTENT_LENGTH] {
            if let Some(v) = parts.headers.get(&h) {
                b = b.header(&h, v);
            }
        }
        b.body(body)
            .map_err(|e| ApiError::bad_request("bad_request", format!("bad request: {e}")))
    };
    let mut body = Some(warren_core::body::boxed(body));
    for attempt in 0..2 {
        let send_body = match body.take() {
            Some(b) => b,
            None => warren_core::body::empty(),
        };
        let sent = app
            .http
            .here()
            .request(&route.endpoint, build(send_body)?)
            .await;
        let stale = match sent {
            Ok(resp)
                if resp.status() == StatusCode::NOT_FOUND
                    && warren_core::headers::is_not_hosted(resp.headers()) =>
            {
                "the node does not hold it"
            }
            Ok(resp) => return Ok(answer(resp)),
            Err(e) if e.is_body() => {
                return Err(ApiError::bad_request(
                    "invalid_body",
                    format!("cannot read the request body: {e}"),
                ))
            }
            Err(e) => {
                tracing::debug!(volume = id, node = %route.node_id, error = %e, "cannot reach the volume's node");
                "its node cannot be reached"
            }
        };
        app.volume_routes.cache.invalidate(&key(id, &token)).await;
        if attempt == 1 || !replayable {
            let mut e = ApiError::new(
                StatusCode::SERVICE_UNAVAILABLE,
                "volume_unavailable",
                format!(
                    "volume {id} did not answer on node {} ({stale}); try again",
                    route.node_id
                ),
            );
            e.retry_after = Some(crate::error::RETRY_AFTER_SECS);
            return Err(e);
        }
        // A shared volume may be served by another node; a local one only
        // by its own (the scheduler says whether it is down).
        let avoid = (stale == "its node cannot be reached").then_some(route.node_id.as_str());
        let fresh = lookup(app, id, &token, avoid).await?;
        if fresh.deleting {
            return Err(super::not_found(id));
        }
        route = fresh;
    }
    Err(ApiError::internal("volume routing gave up"))
}

/// The node's answer as the client gets it: status, body and the content
/// headers; nothing of warren's own.
fn answer(resp: Response<crate::node_client::PooledBody>) -> Response<Body> {
    let (parts, body) = resp.into_parts();
    let mut out = Response::new(warren_core::body::boxed(
        body.map_err(|e| -> warren_core::body::BoxError { e.into() }),
    ));
    *out.status_mut() = parts.status;
    for h in [header::CONTENT_TYPE, header::CONTENT_LENGTH] {
        if let Some(v) = parts.headers.get(&h) {
            out.headers_mut().insert(h, v.clone());
        }
    }
    out.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    out
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn bearer_tokens() {
        let mut h = HeaderMap::new();
        assert_eq!(bearer(&h).unwrap_err().status, StatusCode::UNAUTHORIZED);
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("Bearer vt_abc"),
        );
        assert_eq!(bearer(&h).unwrap(), "vt_abc");
        h.insert(
            header::AUTHORIZATION,
            HeaderValue::from_static("bearer  vt_abc "),
        );
        assert_eq!(bearer(&h).unwrap(), "vt_abc");
        h.insert(header::AUTHORIZATION, HeaderValue::from_static("Basic xyz"));
        assert!(bearer(&h).is_err());
        // Another token of the same volume is another cache entry.
        assert_ne!(key("v", "a"), key("v", "b"));
        assert!(!key("v", "secret").contains("secret"));
    }
}
