//! Route resolution: sandbox id → (node, endpoint, generation).
//!
//! The data plane asks a [`Resolver`]. With `--route-cache-capacity 0` that
//! is [`UncachedResolver`] (one scheduler `LookupNode` per request);
//! otherwise [`CachedResolver`]: a bounded, positive-only TTL cache with
//! coalesced misses (ARCHITECTURE.md invariant "Positive caching only"),
//! kept honest by the scheduler's `WatchBindings` stream ([`watch`],
//! "Bounded staleness") and by the stale-route signals the proxy feeds back
//! through [`Resolver::evict`] ("Nodes check identity").
//!
//! # Layout
//! - this file: [`Route`], [`ResolveError`], the [`Resolver`] trait, the
//!   [`RouteSource`] a resolver asks ([`LookupNode`] against the scheduler),
//!   and [`UncachedResolver`].
//! - [`cache`]: [`CachedResolver`], a sharded table of fixed-size slots.
//! - `lookup`: [`LookupNode`], the scheduler as a [`RouteSource`], which
//!   batches concurrent misses into `LookupNodes` calls.
//! - [`watch`]: the task that follows `WatchBindings` and evicts.

mod cache;
mod lookup;
pub mod watch;

pub use cache::{CacheSettings, CachedResolver};

use crate::error::ApiError;
use futures_util::future::BoxFuture;
use std::sync::Arc;
use std::time::Duration;
use warren_proto::scheduler::v1::BindingState;
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
    /// Whether a data-plane request may resume it while PAUSED (E2B's
    /// `autoResume`; `control::pause::wake`).
    pub auto_resume: bool,
}

impl Route {
    /// The route to the sandbox of binding `b` in `state`: what a gateway
    /// that just placed, paused, resumed or moved it knows without asking.
    pub fn of_binding(b: &warren_proto::scheduler::v1::Binding, state: BindingState) -> Route {
        Route {
            sandbox_id: b.sandbox_id.clone(),
            node_id: b.node_id.clone(),
            endpoint: b.endpoint.clone(),
            generation: b.generation,
            state,
            team_id: b.team_id.clone(),
            auto_resume: b.lifecycle.is_some_and(|l| l.auto_resume),
        }
    }

    /// Whether `other` sends requests to the same place: same node, same
    /// address, same generation. Anything else is a move.
    pub fn same_place(&self, other: &Route) -> bool {
        self.node_id == other.node_id
            && self.endpoint == other.endpoint
            && self.generation == other.generation
    }
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

/// Why a cached route was dropped: the `reason` label of
/// `warren_gateway_route_cache_evictions_total`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum EvictReason {
    /// Older than `--route-cache-ttl`.
    Ttl,
    /// Pushed out by `--route-cache-capacity`.
    Capacity,
    /// This gateway deleted the sandbox.
    Delete,
    /// The scheduler's `WatchBindings` reported a change (or a resync).
    Watch,
    /// A node proved it wrong (not-found marker or connection failure).
    Stale,
}

impl EvictReason {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            EvictReason::Ttl => "ttl",
            EvictReason::Capacity => "capacity",
            EvictReason::Delete => "delete",
            EvictReason::Watch => "watch",
            EvictReason::Stale => "stale",
        }
    }
}

/// A cached route as `GET /_warren/v1/routes/{id}` shows it.
#[derive(Debug, Clone)]
pub struct CachedView {
    /// The cached route.
    pub route: Arc<Route>,
    /// Time since it was cached.
    pub age: Duration,
    /// Time until it expires (zero when already expired but not yet dropped).
    pub ttl_left: Duration,
}

/// How the resolver is set up, for `warren route`.
#[derive(Debug, Clone, serde::Serialize)]
pub struct ResolverStatus {
    /// False with `--route-cache-capacity 0`.
    pub enabled: bool,
    /// Most entries kept.
    pub capacity: u64,
    /// Longest an entry is served, in milliseconds.
    pub ttl_ms: u64,
    /// `connected`, `disconnected` or `off` (`--route-cache-watch false`).
    pub watch: &'static str,
    /// The last `WatchBindings` revision this gateway has applied.
    pub revision: u64,
}

/// Resolves sandbox routes for the data plane.
pub trait Resolver: Send + Sync + 'static {
    /// The route for `sandbox_id` (the id is already validated).
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>>;

    /// One `LookupNode` that neither reads nor fills the cache, nor joins a
    /// coalesced lookup, answered from the scheduler's store (not its route
    /// view): after a stale-route signal, and for `warren route`.
    fn lookup_uncached<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>>;

    /// `route` is no longer true (a node proved it stale, or this gateway
    /// deleted the sandbox): forget the cached entry unless it is already
    /// newer than `route` (a concurrent request may have refreshed it).
    fn evict<'a>(&'a self, _route: &'a Route, _reason: EvictReason) -> BoxFuture<'a, ()> {
        Box::pin(async {})
    }

    /// A create, fork or refetch just produced `route`: cache it.
    fn learn(&self, _route: Arc<Route>) -> BoxFuture<'_, ()> {
        Box::pin(async {})
    }

    /// What is cached for `sandbox_id`, without touching the entry.
    fn cached<'a>(&'a self, _sandbox_id: &'a str) -> BoxFuture<'a, Option<CachedView>> {
        Box::pin(async { None })
    }

    /// How this resolver is configured and whether its watch is live.
    fn status(&self) -> ResolverStatus;
}

/// Where routes come from on a miss. The scheduler's `LookupNode` in
/// production ([`LookupNode`]); unit tests count calls to their own.
pub trait RouteSource: Send + Sync + 'static {
    /// The scheduler's current route for `sandbox_id`, at least as new as
    /// every watch change this gateway has applied.
    fn lookup<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Result<Route, ResolveError>>;

    /// The same, read from the scheduler's store rather than its route
    /// view: after a node has proved the route this gateway had wrong.
    fn lookup_consistent<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Route, ResolveError>> {
        self.lookup(sandbox_id)
    }
}

pub use lookup::LookupNode;

/// Asks the scheduler every time (`--route-cache-capacity 0`).
pub struct UncachedResolver {
    source: Arc<dyn RouteSource>,
}

impl UncachedResolver {
    /// A resolver that asks `source` for every request.
    pub fn new(source: Arc<dyn RouteSource>) -> Self {
        UncachedResolver { source }
    }
}

impl Resolver for UncachedResolver {
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>> {
        Box::pin(async move { self.source.lookup(sandbox_id).await.map(Arc::new) })
    }

    fn lookup_uncached<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>> {
        Box::pin(async move {
            self.source
                .lookup_consistent(sandbox_id)
                .await
                .map(Arc::new)
        })
    }

    fn status(&self) -> ResolverStatus {
        ResolverStatus {
            enabled: false,
            capacity: 0,
            ttl_ms: 0,
            watch: "off",
            revision: 0,
        }
    }
}
