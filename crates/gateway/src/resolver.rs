//! Route resolution: sandbox id → (node, endpoint, generation).
//!
//! The data plane asks a [`Resolver`]; today that is [`UncachedResolver`],
//! which calls the scheduler's `LookupNode` for every request. The route
//! cache (positive-only, TTL, coalesced misses, watch-driven eviction) slots
//! in behind the same trait: [`Resolver::evict`] is called when a node
//! proves a route stale, and [`Resolver::learn`] when a create or fork
//! produced a fresh assignment.

use crate::error::ApiError;
use crate::metrics::Metrics;
use crate::scheduler::Scheduler;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use warren_proto::scheduler::v1::{BindingState, LookupNodeRequest};
use warren_proto::{REASON_METADATA, REASON_NODE_DOWN};

/// Where a sandbox lives, as far as this gateway knows.
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Route {
    /// The sandbox.
    pub sandbox_id: String,
    /// The node hosting it.
    pub node_id: String,
    /// `host:port` of the node's HTTP listener.
    pub endpoint: String,
    /// The binding generation the node must be hosting.
    pub generation: u64,
    /// Binding state when looked up.
    pub state: BindingState,
    /// Owning team.
    pub team_id: String,
}

/// Why a route could not be resolved.
#[derive(Debug, Clone, thiserror::Error)]
#[error("resolving sandbox {sandbox_id}: {status}")]
pub struct ResolveError {
    /// The sandbox asked for.
    pub sandbox_id: String,
    /// The scheduler's answer.
    pub status: tonic::Status,
}

impl ResolveError {
    /// The scheduler does not know the sandbox (never cached).
    pub fn is_not_found(&self) -> bool {
        self.status.code() == tonic::Code::NotFound
    }

    /// The sandbox's node lost its lease.
    pub fn is_node_down(&self) -> bool {
        self.status.code() == tonic::Code::FailedPrecondition
            && self
                .status
                .metadata()
                .get(REASON_METADATA)
                .is_some_and(|v| v.as_bytes() == REASON_NODE_DOWN.as_bytes())
    }
}

impl From<ResolveError> for ApiError {
    fn from(e: ResolveError) -> Self {
        ApiError::from_scheduler(&e.status, Some(&e.sandbox_id))
    }
}

/// Resolves sandbox routes for the data plane.
pub trait Resolver: Send + Sync + 'static {
    /// The route for `sandbox_id` (the id is already validated).
    fn resolve<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Result<Route, ResolveError>>;

    /// `route` proved stale (the node answered `X-Warren-Route: not-found`
    /// or could not be reached): forget it.
    fn evict(&self, _route: &Route) {}

    /// A create or fork just produced `route`.
    fn learn(&self, _route: &Route) {}
}

/// Asks the scheduler every time.
pub struct UncachedResolver {
    scheduler: Arc<Scheduler>,
    metrics: Metrics,
}

impl UncachedResolver {
    /// A resolver over `scheduler`, counting lookups in `metrics`.
    pub fn new(scheduler: Arc<Scheduler>, metrics: Metrics) -> Self {
        UncachedResolver { scheduler, metrics }
    }
}

impl Resolver for UncachedResolver {
    fn resolve<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(async move {
            self.metrics.scheduler_lookups.inc();
            let route = self
                .scheduler
                .call("LookupNode", |mut c| async move {
                    c.lookup_node(LookupNodeRequest {
                        sandbox_id: sandbox_id.to_string(),
                    })
                    .await
                })
                .await
                .map_err(|status| ResolveError {
                    sandbox_id: sandbox_id.to_string(),
                    status,
                })?;
            Ok(Route {
                sandbox_id: route.sandbox_id,
                node_id: route.node_id,
                endpoint: route.endpoint,
                generation: route.generation,
                state: BindingState::try_from(route.state).unwrap_or(BindingState::Unspecified),
                team_id: route.team_id,
            })
        })
    }
}
