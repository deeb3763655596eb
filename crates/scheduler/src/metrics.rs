//! The scheduler's Prometheus metrics, registered on the admin registry under
//! the `warren_scheduler` prefix. Labels are low-cardinality only (rpc names,
//! status codes, states), never a sandbox or node id.

use crate::store::{Census, SweepReport};
use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;
use std::time::Duration;

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RpcLabels {
    rpc: &'static str,
    code: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct AnswerLabel {
    answer: &'static str,
}

#[derive(Clone, Debug, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StateLabel {
    state: &'static str,
}

type HistogramFamily = Family<RpcLabels, Histogram, fn() -> Histogram>;

fn rpc_histogram() -> Histogram {
    // 100µs .. ~3.3s: lookups are sub-millisecond, writes wait on fsync.
    Histogram::new(exponential_buckets(0.0001, 2.0, 16))
}

/// Every metric the scheduler keeps.
#[derive(Clone)]
pub struct Metrics {
    rpc_requests: Family<RpcLabels, Counter>,
    rpc_duration: HistogramFamily,
    nodes: Family<StateLabel, Gauge>,
    bindings: Family<StateLabel, Gauge>,
    sweep_runs: Counter,
    sweep_failures: Counter,
    lost_bindings: Counter,
    lost_builds: Counter,
    watch_subscribers: Gauge,
    watch_resyncs: Counter,
    leader: Gauge,
    /// `lookups{answer="view"}` and `{answer="store"}`, resolved once.
    lookups_view: Counter,
    lookups_store: Counter,
    route_view_routes: Gauge,
    route_view_ready: Gauge,
}

impl Metrics {
    /// Creates the metrics and registers them in `registry`.
    pub fn register(registry: &mut Registry) -> Metrics {
        let m = Metrics {
            rpc_requests: Family::default(),
            rpc_duration: Family::new_with_constructor(rpc_histogram as fn() -> Histogram),
            nodes: Family::default(),
            bindings: Family::default(),
            sweep_runs: Counter::default(),
            sweep_failures: Counter::default(),
            lost_bindings: Counter::default(),
            lost_builds: Counter::default(),
            watch_subscribers: Gauge::default(),
            watch_resyncs: Counter::default(),
            leader: Gauge::default(),
            lookups_view: Counter::default(),
            lookups_store: Counter::default(),
            route_view_routes: Gauge::default(),
            route_view_ready: Gauge::default(),
        };
        registry.register(
            "rpc_requests",
            "gRPC requests handled, by rpc and status code",
            m.rpc_requests.clone(),
        );
        registry.register(
            "rpc_duration_seconds",
            "gRPC request latency, by rpc and status code",
            m.rpc_duration.clone(),
        );
        registry.register("nodes", "Registered nodes by lease state", m.nodes.clone());
        registry.register("bindings", "Bindings by state", m.bindings.clone());
        registry.register("sweep_runs", "Sweep passes run", m.sweep_runs.clone());
        registry.register(
            "sweep_failures",
            "Sweep passes that failed (store errors)",
            m.sweep_failures.clone(),
        );
        registry.register(
            "lost_bindings",
            "Bindings marked lost because their node's lease expired",
            m.lost_bindings.clone(),
        );
        registry.register(
            "lost_builds",
            "Template builds failed because their gateway stopped renewing its lease",
            m.lost_builds.clone(),
        );
        registry.register(
            "watch_subscribers",
            "Open WatchBindings streams",
            m.watch_subscribers.clone(),
        );
        registry.register(
            "watch_resyncs",
            "WatchBindings HELLOs with resync_required",
            m.watch_resyncs.clone(),
        );
        registry.register(
            "leader",
            "1 while this replica holds the sweep lease (it runs the sweeps), else 0",
            m.leader.clone(),
        );
        let lookups = Family::<AnswerLabel, Counter>::default();
        let answer = |answer| lookups.get_or_create(&AnswerLabel { answer }).clone();
        let m = Metrics {
            lookups_view: answer("view"),
            lookups_store: answer("store"),
            ..m
        };
        registry.register(
            "lookups",
            "LookupNode answers, by where they came from: answer=\"view\" (memory) \
             or \"store\" (a query: a sandbox the view lacks, a view not yet \
             loaded or behind the caller, a consistent read, --lookup-view false)",
            lookups,
        );
        registry.register(
            "route_view_routes",
            "Routes held in memory by the route view (--lookup-view)",
            m.route_view_routes.clone(),
        );
        registry.register(
            "route_view_ready",
            "1 once the route view has loaded every binding and answers lookups, else 0",
            m.route_view_ready.clone(),
        );
        m
    }

    /// A `LookupNode` answered from the route view (`true`) or the store.
    pub fn lookup_answered(&self, from_view: bool) {
        if from_view {
            self.lookups_view.inc();
        } else {
            self.lookups_store.inc();
        }
    }

    /// The route view gained (1) or lost (-1) a route.
    pub fn route_view_routes(&self, delta: i64) {
        self.route_view_routes.inc_by(delta);
    }

    /// The route view finished loading.
    pub fn route_view_ready(&self, ready: bool) {
        self.route_view_ready.set(i64::from(ready));
    }

    /// Whether this replica holds the sweep lease now.
    pub fn leader(&self, leads: bool) {
        self.leader.set(i64::from(leads));
    }

    /// Records one finished RPC.
    pub fn rpc(&self, rpc: &'static str, code: tonic::Code, took: Duration) {
        let labels = RpcLabels {
            rpc,
            code: code_name(code),
        };
        self.rpc_requests.get_or_create(&labels).inc();
        self.rpc_duration
            .get_or_create(&labels)
            .observe(took.as_secs_f64());
    }

    /// Records a sweep pass that completed.
    pub fn sweep_done(&self, report: &SweepReport) {
        self.sweep_runs.inc();
        self.lost_bindings.inc_by(report.bindings_lost);
        self.lost_builds.inc_by(report.builds_lost);
    }

    /// Records a sweep pass that failed.
    pub fn sweep_failed(&self) {
        self.sweep_runs.inc();
        self.sweep_failures.inc();
    }

    /// Refreshes the state gauges.
    pub fn census(&self, c: &Census) {
        let set = |f: &Family<StateLabel, Gauge>, state: &'static str, n: u64| {
            f.get_or_create(&StateLabel { state })
                .set(i64::try_from(n).unwrap_or(i64::MAX));
        };
        set(&self.nodes, "up", c.nodes_up);
        set(&self.nodes, "down", c.nodes_down);
        for (state, n) in &c.bindings {
            set(&self.bindings, state.as_str(), *n);
        }
    }

    /// A watch stream opened (+1) or closed (-1).
    pub fn watch_subscribers(&self, delta: i64) {
        self.watch_subscribers.inc_by(delta);
    }

    /// A watch subscriber was told to resync.
    pub fn watch_resync(&self) {
        self.watch_resyncs.inc();
    }
}

/// The canonical gRPC spelling, as other gRPC metrics use it.
fn code_name(code: tonic::Code) -> &'static str {
    use tonic::Code::*;
    match code {
        Ok => "OK",
        Cancelled => "CANCELLED",
        Unknown => "UNKNOWN",
        InvalidArgument => "INVALID_ARGUMENT",
        DeadlineExceeded => "DEADLINE_EXCEEDED",
        NotFound => "NOT_FOUND",
        AlreadyExists => "ALREADY_EXISTS",
        PermissionDenied => "PERMISSION_DENIED",
        ResourceExhausted => "RESOURCE_EXHAUSTED",
        FailedPrecondition => "FAILED_PRECONDITION",
        Aborted => "ABORTED",
        OutOfRange => "OUT_OF_RANGE",
        Unimplemented => "UNIMPLEMENTED",
        Internal => "INTERNAL",
        Unavailable => "UNAVAILABLE",
        DataLoss => "DATA_LOSS",
        Unauthenticated => "UNAUTHENTICATED",
    }
}
