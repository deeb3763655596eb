//! The gateway's Prometheus metrics (prefix `warren_gateway_`), registered
//! into the admin listener's registry. Labels are low-cardinality only:
//! never a sandbox id.

use crate::resolver::EvictReason;
use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::sync::{Arc, OnceLock};
use std::time::Duration;
use warren_core::admin::Admin;

/// Which half of the API a request was for.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Plane {
    /// E2B REST API.
    Control = 0,
    /// Sandbox traffic proxied to a node.
    Data = 1,
}

impl EncodeLabelValue for Plane {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            Plane::Control => "control",
            Plane::Data => "data",
        })
    }
}

impl EncodeLabelValue for EvictReason {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(self.as_str())
    }
}

/// What the one uncached lookup after a stale-route signal found: the
/// `outcome` label of `warren_gateway_route_cache_refetches_total`.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum RefetchOutcome {
    /// The scheduler no longer knows the sandbox.
    NotFound,
    /// The same node, address and generation as the stale route.
    SameNode,
    /// Another node, address or generation.
    Moved,
    /// The lookup failed (scheduler unreachable, or the node is down).
    Error,
}

impl RefetchOutcome {
    const ALL: [RefetchOutcome; 4] = [
        RefetchOutcome::NotFound,
        RefetchOutcome::SameNode,
        RefetchOutcome::Moved,
        RefetchOutcome::Error,
    ];
}

impl EncodeLabelValue for RefetchOutcome {
    fn encode(&self, encoder: &mut LabelValueEncoder<'_>) -> Result<(), std::fmt::Error> {
        use std::fmt::Write;
        encoder.write_str(match self {
            RefetchOutcome::NotFound => "not_found",
            RefetchOutcome::SameNode => "same_node",
            RefetchOutcome::Moved => "moved",
            RefetchOutcome::Error => "error",
        })
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ReasonLabels {
    reason: EvictReason,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabels {
    outcome: RefetchOutcome,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RequestLabels {
    plane: Plane,
    status: u16,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PlaneLabels {
    plane: Plane,
}

fn duration_histogram() -> Histogram {
    // 0.5 ms .. ~16 s.
    Histogram::new(exponential_buckets(0.0005, 2.0, 16))
}

/// Statuses with a counter handle kept ready (every valid HTTP status).
const STATUSES: usize = 600;

/// Handles to every gateway metric.
#[derive(Clone)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    /// `requests` by `(plane, status)`, looked up once each: counting a
    /// request is then one atomic add, with no label hashing or lock.
    request_counters: Arc<[OnceLock<Counter>]>,
    durations: Family<PlaneLabels, Histogram, fn() -> Histogram>,
    /// `durations` of each plane (control, data), resolved up front.
    plane_durations: [Histogram; 2],
    /// Routes asked of the scheduler: a `LookupNode`, or one id of a
    /// `LookupNodes` batch.
    pub scheduler_lookups: Counter,
    /// `LookupNode` and `LookupNodes` calls made to the scheduler.
    pub scheduler_lookup_calls: Counter,
    /// Data-plane routes served from the cache.
    pub cache_hits: Counter,
    /// Data-plane routes not in the cache (or expired there).
    pub cache_misses: Counter,
    /// Misses that waited for another request's lookup instead of making one.
    pub cache_coalesced: Counter,
    /// Requests replayed once on a moved sandbox's new route.
    pub cache_retries: Counter,
    /// Data-plane requests answered by the proxy's HTTP/1.1 fast path.
    pub fast_path_requests: Counter,
    /// Connections the fast path handed to hyper (with the request it did
    /// not take).
    pub fast_path_handovers: Counter,
    /// 1 while the `WatchBindings` stream is open, else 0.
    pub watch_connected: Gauge,
    /// The last `WatchBindings` revision applied.
    pub watch_revision: Gauge,
    evictions: Family<ReasonLabels, Counter>,
    refetches: Family<OutcomeLabels, Counter>,
    /// Seconds from a node's lease expiry (the LOST change's `at_ms`) to this
    /// gateway applying the LOST change from its watch.
    pub node_loss_eviction: Histogram,
    /// Blobs nothing names any more that this gateway's sweep removed from
    /// the blob store (`control::layers::sweep_blobs`).
    pub blobs_removed: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them with `admin`.
    pub fn register(admin: &Admin) -> Self {
        let durations: Family<PlaneLabels, Histogram, fn() -> Histogram> =
            Family::new_with_constructor(duration_histogram);
        let plane_durations = [Plane::Control, Plane::Data]
            .map(|plane| durations.get_or_create(&PlaneLabels { plane }).clone());
        let m = Metrics {
            requests: Family::default(),
            request_counters: (0..2 * STATUSES).map(|_| OnceLock::new()).collect(),
            durations,
            plane_durations,
            scheduler_lookups: Counter::default(),
            scheduler_lookup_calls: Counter::default(),
            cache_hits: Counter::default(),
            cache_misses: Counter::default(),
            cache_coalesced: Counter::default(),
            cache_retries: Counter::default(),
            fast_path_requests: Counter::default(),
            fast_path_handovers: Counter::default(),
            watch_connected: Gauge::default(),
            watch_revision: Gauge::default(),
            evictions: Family::default(),
            refetches: Family::default(),
            // 10 ms .. ~80 s: lease expiry → sweep → watch → gateway.
            node_loss_eviction: Histogram::new(exponential_buckets(0.01, 2.0, 14)),
            blobs_removed: Counter::default(),
        };
        // Every label value exists from the start, so a dashboard's rate()
        // sees 0 rather than no series.
        for reason in [
            EvictReason::Ttl,
            EvictReason::Capacity,
            EvictReason::Delete,
            EvictReason::Watch,
            EvictReason::Stale,
        ] {
            let _ = m.evictions.get_or_create(&ReasonLabels { reason });
        }
        for outcome in RefetchOutcome::ALL {
            let _ = m.refetches.get_or_create(&OutcomeLabels { outcome });
        }
        if let Ok(mut reg) = admin.registry.write() {
            reg.register(
                "requests",
                "Requests answered, by plane (control, data) and HTTP status",
                m.requests.clone(),
            );
            reg.register(
                "request_duration_seconds",
                "Time from request to response headers, by plane",
                m.durations.clone(),
            );
            reg.register(
                "scheduler_lookups",
                "Routes asked of the scheduler (a LookupNode, or one id of a LookupNodes batch)",
                m.scheduler_lookups.clone(),
            );
            reg.register(
                "scheduler_lookup_calls",
                "LookupNode and LookupNodes calls made to the scheduler (concurrent misses share one)",
                m.scheduler_lookup_calls.clone(),
            );
            reg.register(
                "route_cache_hits",
                "Data-plane requests whose route came from the cache",
                m.cache_hits.clone(),
            );
            reg.register(
                "route_cache_misses",
                "Data-plane requests whose route was not cached (or had expired)",
                m.cache_misses.clone(),
            );
            reg.register(
                "route_cache_evictions",
                "Routes dropped from the cache, by reason (ttl, capacity, delete, watch, stale)",
                m.evictions.clone(),
            );
            reg.register(
                "route_cache_refetches",
                "Uncached lookups after a stale-route signal, by outcome \
                 (not_found, same_node, moved, error)",
                m.refetches.clone(),
            );
            reg.register(
                "node_loss_eviction_seconds",
                "Seconds from a node's lease expiry to this gateway learning its sandboxes are lost",
                m.node_loss_eviction.clone(),
            );
            reg.register(
                "route_cache_coalesced",
                "Cache misses that waited for another request's lookup",
                m.cache_coalesced.clone(),
            );
            reg.register(
                "route_cache_retries",
                "Replay-safe requests retried once on a moved sandbox's new route",
                m.cache_retries.clone(),
            );
            reg.register(
                "proxy_fast_path_requests",
                "Data-plane requests answered by the HTTP/1.1 fast path (--proxy-fast-path)",
                m.fast_path_requests.clone(),
            );
            reg.register(
                "proxy_fast_path_handovers",
                "Connections the fast path handed to hyper's path, with the first request it did not take",
                m.fast_path_handovers.clone(),
            );
            reg.register(
                "route_cache_watch_connected",
                "1 while the WatchBindings stream to the scheduler is open",
                m.watch_connected.clone(),
            );
            reg.register(
                "blobs_removed",
                "Blobs nothing names any more that this gateway removed from the blob store",
                m.blobs_removed.clone(),
            );
            reg.register(
                "route_cache_watch_revision",
                "The last WatchBindings revision this gateway applied",
                m.watch_revision.clone(),
            );
        }
        m
    }

    /// Counts `n` routes dropped from the cache for `reason`.
    pub fn evicted(&self, reason: EvictReason, n: u64) {
        self.evictions
            .get_or_create(&ReasonLabels { reason })
            .inc_by(n);
    }

    /// Routes dropped so far for `reason`.
    pub fn evictions(&self, reason: EvictReason) -> u64 {
        self.evictions.get_or_create(&ReasonLabels { reason }).get()
    }

    /// Counts one refetch after a stale-route signal.
    pub fn refetched(&self, outcome: RefetchOutcome) {
        self.refetches
            .get_or_create(&OutcomeLabels { outcome })
            .inc();
    }

    /// Records one answered request.
    pub fn observe(&self, plane: Plane, status: u16, elapsed: Duration) {
        let index = plane as usize * STATUSES + usize::from(status);
        match self.request_counters.get(index) {
            Some(slot) if usize::from(status) < STATUSES => slot
                .get_or_init(|| {
                    self.requests
                        .get_or_create(&RequestLabels { plane, status })
                        .clone()
                })
                .inc(),
            _ => self
                .requests
                .get_or_create(&RequestLabels { plane, status })
                .inc(),
        };
        self.plane_durations[plane as usize].observe(elapsed.as_secs_f64());
    }
}
