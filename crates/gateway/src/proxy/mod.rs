//! The data plane: sandbox traffic proxied to the node that hosts it.
//!
//! Per request: resolve the route (through the
//! [`Resolver`](crate::resolver::Resolver), normally a cache hit), rewrite
//! the head ([`headers`]), send it over this worker thread's node
//! connection pool, and stream the answer back frame by frame. Bodies are
//! not buffered, except
//! the small body of a replay-safe request ([`replay`]), so chunked uploads
//! and Connect streams pass through as they are produced. An `Upgrade`
//! (WebSocket) is forwarded, and after the node's `101` both upgraded
//! connections are spliced.
//!
//! # Stale routes
//! (ARCHITECTURE.md invariants "Nodes check identity", "Heal, don't wait"
//! and "Retry only what is safe".)
//! A node answering `404` with `X-Warren-Route: not-found`, or no HTTP
//! answer at all (refused, reset, connect timeout), means the route was
//! wrong. The gateway then evicts it (`reason="stale"`), makes ONE uncached
//! `LookupNode`, and:
//!
//! | lookup says | answer |
//! |---|---|
//! | not found | 502 `sandbox_not_found`, "The sandbox was not found" (E2B's answer for a killed or expired sandbox) |
//! | node down (lease lost) | 502 `node_down` |
//! | scheduler unreachable | 503 `routing_unavailable` |
//! | same node and generation, after a failed connection | 502 `upstream_unreachable` |
//! | same node and generation, after the marker | 502 `sandbox_not_found` (gone there; EXPIRING ends this way), or 503 `sandbox_not_ready` while CREATING |
//! | moved (node, address or generation) | retry once if replay-safe; else 503 `sandbox_moved` + `Retry-After` |
//!
//! A `404` without the marker is the sandbox's own answer: passed through,
//! never retried. A sandbox the scheduler does not know is "not found" on
//! the data plane too (before any node is asked): every such answer is
//! E2B's `502`, so the SDKs see a gone sandbox the same way whichever
//! step noticed.
//!
//! # Paused sandboxes
//! A route in state PAUSED is resumed first (`control::pause::wake`: one
//! resume however many requests wait), then proxied; a private sandbox's
//! port only for a request with its traffic access token
//! (`control::network::admit_before_wake`). Only a sandbox created with
//! auto-resume is: any other answers 502 "paused" and stays paused.

pub(crate) mod fast;
mod headers;
mod replay;

use crate::error::ApiError;
use crate::metrics::RefetchOutcome;
use crate::node_client::PooledBody;
use crate::resolver::{EvictReason, Route};
use crate::server::Abort;
use crate::state::App;
use crate::target::Target;
use headers::Outgoing;
use http::{Request, Response, StatusCode};
use http_body_util::BodyExt;
use hyper::upgrade::OnUpgrade;
use replay::Prepared;
use std::net::SocketAddr;
use warren_core::body::{boxed, full, Body};
use warren_core::server::Incoming;
use warren_proto::scheduler::v1::BindingState;

/// Proxies one data-plane request; every failure is a JSON error.
pub async fn handle(
    app: &App,
    target: Target,
    peer: &crate::server::Peer,
    req: Request<Incoming>,
) -> Response<Body> {
    // An HTTP/1.x response cut off upstream ends its connection with a
    // reset (see `crate::server`); HTTP/2 resets just the stream itself.
    let abort = (req.version() <= http::Version::HTTP_11).then(|| peer.abort.clone());
    match forward(app, &target, peer.addr, req, abort).await {
        Ok(r) => r,
        Err(e) => e.on_data_plane(&target.sandbox_id).into_response(),
    }
}

/// How a node took one attempt.
enum Attempt {
    /// An HTTP answer that is the sandbox's (or the node's, about the sandbox).
    Answered(Response<PooledBody>),
    /// The route was wrong.
    Stale(Signal),
}

/// Which stale-route signal the node gave.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Signal {
    /// No HTTP answer: refused, reset, or connect timeout.
    Unreachable,
    /// `404` + `X-Warren-Route: not-found`.
    NotHosted,
}

async fn forward(
    app: &App,
    target: &Target,
    peer: SocketAddr,
    mut req: Request<Incoming>,
    abort: Option<Abort>,
) -> Result<Response<Body>, ApiError> {
    let id = target.sandbox_id.as_str();
    let mut route = app.resolver.resolve(id).await?;
    if route.state == BindingState::Paused {
        // Without auto-resume (fixed at create) nothing wakes it: no token to check.
        if route.auto_resume {
            crate::control::network::admit_before_wake(app, &route, target.port, req.headers())
                .await?;
        }
        route = crate::control::pause::wake(app, &route).await?;
    }
    let upgrade = warren_core::upgrade::protocol(&req);
    // Taken before the request is taken apart: the pending client-side
    // upgrade lives in the request's extensions.
    let client_upgrade = upgrade.is_some().then(|| hyper::upgrade::on(&mut req));
    let (parts, body) = req.into_parts();
    let prepared =
        replay::prepare(&parts, body, upgrade.is_some(), app.settings.retry_max_body).await?;
    let outgoing = Outgoing::new(parts, target, peer, upgrade)?;

    // A replay needs the head and body again; only replay-safe requests
    // pay for keeping them.
    let (body, replay) = match prepared {
        Prepared::Replayable(bytes) => (full(bytes.clone()), Some((outgoing.clone(), bytes))),
        Prepared::Streaming(body) => (boxed(body), None),
    };
    let signal = match send(app, outgoing.into_request(&route, body), &route).await? {
        Attempt::Answered(resp) => return finish(resp, client_upgrade, id, abort),
        Attempt::Stale(signal) => signal,
    };

    let fresh = refetch(app, id, &route, signal).await?;
    let Some((outgoing, bytes)) = replay else {
        return Err(ApiError::sandbox_moved(id));
    };
    app.metrics.cache_retries.inc();
    match send(app, outgoing.into_request(&fresh, full(bytes)), &fresh).await? {
        Attempt::Answered(resp) => finish(resp, client_upgrade, id, abort),
        Attempt::Stale(signal) => Err(wrong_twice(app, &fresh, signal, id).await),
    }
}

/// After `route` proved stale: evicts it, asks the scheduler once, and
/// returns where the sandbox moved to (learned into the cache), or the
/// error to answer when it did not move or is gone.
async fn refetch(
    app: &App,
    id: &str,
    route: &Route,
    signal: Signal,
) -> Result<std::sync::Arc<Route>, ApiError> {
    app.resolver.evict(route, EvictReason::Stale).await;
    let fresh = match app.resolver.lookup_uncached(id).await {
        Ok(fresh) => fresh,
        Err(e) => {
            app.metrics.refetched(if e.is_not_found() {
                RefetchOutcome::NotFound
            } else {
                RefetchOutcome::Error
            });
            return Err(e.into());
        }
    };
    if fresh.same_place(route) {
        app.metrics.refetched(RefetchOutcome::SameNode);
        tracing::debug!(sandbox = id, node = %route.node_id, ?signal, "route refetched unchanged");
        return Err(match signal {
            Signal::Unreachable => ApiError::upstream_unreachable(),
            Signal::NotHosted if fresh.state == BindingState::Creating => {
                ApiError::sandbox_not_ready(id)
            }
            // The scheduler still names a node that says it does not host
            // the sandbox: it is gone there (killed, or expired and killed),
            // and the node's DELETE report or next heartbeat removes the
            // binding.
            Signal::NotHosted => ApiError::sandbox_gone(id),
        });
    }
    app.metrics.refetched(RefetchOutcome::Moved);
    tracing::debug!(sandbox = id, from = %route.node_id, to = %fresh.node_id,
        generation = fresh.generation, "sandbox moved");
    app.resolver.learn(fresh.clone()).await;
    Ok(fresh)
}

/// The answer when the retry on a moved sandbox's new node was wrong too:
/// no second retry ("Retry only what is safe").
async fn wrong_twice(app: &App, fresh: &Route, signal: Signal, id: &str) -> ApiError {
    app.resolver.evict(fresh, EvictReason::Stale).await;
    match signal {
        Signal::Unreachable => ApiError::upstream_unreachable(),
        Signal::NotHosted => ApiError::sandbox_moved(id),
    }
}

/// Sends one attempt and classifies the node's answer.
async fn send(app: &App, req: Request<Body>, route: &Route) -> Result<Attempt, ApiError> {
    match app.http.here().request(&route.endpoint, req).await {
        Ok(resp)
            if resp.status() == StatusCode::NOT_FOUND
                && warren_core::headers::is_not_hosted(resp.headers()) =>
        {
            Ok(Attempt::Stale(Signal::NotHosted))
        }
        Ok(resp) => Ok(Attempt::Answered(resp)),
        Err(e) if e.is_body() => Err(ApiError::bad_request(
            "invalid_body",
            format!("cannot read the request body: {e}"),
        )),
        Err(e) => {
            tracing::debug!(sandbox = %route.sandbox_id, node = %route.node_id,
                endpoint = %route.endpoint, error = %e, connect = e.is_connect(),
                "cannot reach the node");
            Ok(Attempt::Stale(Signal::Unreachable))
        }
    }
}

/// The node's answer as the client gets it; a `101` splices both sides. A
/// body that fails mid-way sets `abort` (the client's connection ends with
/// a reset), in the one box the body gets anyway.
fn finish(
    mut resp: Response<PooledBody>,
    client_upgrade: Option<OnUpgrade>,
    id: &str,
    abort: Option<Abort>,
) -> Result<Response<Body>, ApiError> {
    if resp.status() == StatusCode::SWITCHING_PROTOCOLS {
        let Some(client_upgrade) = client_upgrade else {
            return Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "bad_upstream",
                "the sandbox switched protocols without being asked to",
            ));
        };
        let upstream_upgrade = hyper::upgrade::on(&mut resp);
        warren_core::upgrade::splice(client_upgrade, upstream_upgrade, id.to_string());
        headers::strip_internal(resp.headers_mut());
        return Ok(resp.map(|_| warren_core::body::empty()));
    }
    headers::strip_hop_by_hop(resp.headers_mut());
    headers::strip_internal(resp.headers_mut());
    Ok(resp.map(|body| match abort {
        Some(abort) => body
            .map_err(move |e| {
                abort.set();
                e.into()
            })
            .boxed_unsync(),
        None => boxed(body),
    }))
}
