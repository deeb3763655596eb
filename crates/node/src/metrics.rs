//! The node's Prometheus metrics (prefix `warren_node_`), registered into the
//! admin listener's registry. Labels are low-cardinality: never a sandbox id.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use prometheus_client::registry::Registry;

/// How a data-plane request ended.
#[derive(Debug, Clone, Copy)]
pub enum Outcome {
    /// Handed to envd (API or relay); its own status went back.
    Forwarded,
    /// Not hosted at that generation: 404 + `X-Warren-Route: not-found`.
    NotFoundMarker,
    /// Missing or malformed `X-Warren-*` headers.
    BadRequest,
    /// Nothing listens on the port inside the sandbox.
    PortClosed,
    /// The sandbox's ports need its traffic access token, and the request
    /// had none or another (403).
    Forbidden,
    /// envd's socket could not be reached or the exchange failed.
    UpstreamError,
}

impl Outcome {
    fn label(self) -> &'static str {
        match self {
            Outcome::Forwarded => "forwarded",
            Outcome::NotFoundMarker => "not_found_marker",
            Outcome::BadRequest => "bad_request",
            Outcome::PortClosed => "port_closed",
            Outcome::Forbidden => "forbidden",
            Outcome::UpstreamError => "upstream_error",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct OutcomeLabel {
    outcome: &'static str,
}

/// An egress proxy event (`warren_egress::Event`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
pub struct EgressLabel {
    pub event: &'static str,
}

/// The egress proxy's events, counted: made before the proxy (which
/// reports into it) and registered with the rest.
pub type EgressEvents = Family<EgressLabel, Counter>;

/// The observer the egress proxy reports into `events` through.
pub fn egress_observer(events: EgressEvents) -> warren_egress::Observer {
    std::sync::Arc::new(move |e: warren_egress::Event| {
        events
            .get_or_create(&EgressLabel { event: e.label() })
            .inc();
    })
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct StepLabel {
    step: &'static str,
    /// `launch` (a sandbox started for the create) or `pool` (taken from
    /// a warm pool).
    source: &'static str,
}

/// A warm pool's template (one an operator named: `--warm-pool`).
#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolLabel {
    template: String,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct PoolTakeLabel {
    template: String,
    /// taken | empty (none ready) | ineligible (the create mounts volumes).
    outcome: &'static str,
}

/// 50 µs to ~26 s: a step of a start is a system call or two (cgroups) or a
/// template's start command.
fn step_histogram() -> Histogram {
    Histogram::new(exponential_buckets(0.00005, 2.0, 20))
}

/// Every metric the node exports.
#[derive(Clone)]
pub struct Metrics {
    /// Sandboxes hosted now.
    pub sandboxes: Gauge,
    /// Sandboxes created (forks included; adopted ones are not).
    pub creates: Counter,
    /// Creates that failed (envd did not start, files could not be made).
    pub create_failures: Counter,
    /// Sandboxes deleted (by the API, orphan/expiry kills, or envd exiting).
    pub deletes: Counter,
    requests: Family<OutcomeLabel, Counter>,
    /// Failed scheduler RPCs (register, heartbeat, events).
    pub scheduler_errors: Counter,
    /// Wall time of each step of a sandbox's start (successful ones), and
    /// of the whole (`step="total"`).
    create_steps: Family<StepLabel, Histogram, fn() -> Histogram>,
    /// Sandboxes ready in each warm pool.
    pool_ready: Family<PoolLabel, Gauge>,
    /// Creates of a pooled template, by whether they took a pooled sandbox.
    pool_takes: Family<PoolTakeLabel, Counter>,
}

impl Default for Metrics {
    fn default() -> Metrics {
        Metrics {
            sandboxes: Gauge::default(),
            creates: Counter::default(),
            create_failures: Counter::default(),
            deletes: Counter::default(),
            requests: Family::default(),
            scheduler_errors: Counter::default(),
            create_steps: Family::new_with_constructor(step_histogram),
            pool_ready: Family::default(),
            pool_takes: Family::default(),
        }
    }
}

impl Metrics {
    /// Creates the metrics and registers them (names get the registry's
    /// prefix), `egress` among them.
    pub fn register(registry: &mut Registry, egress: EgressEvents) -> Metrics {
        let m = Metrics::default();
        registry.register(
            "egress_proxy_events",
            "Egress proxy connections (intercepted, spliced) and requests (forwarded, refused)",
            egress,
        );
        registry.register("sandboxes", "Sandboxes hosted now", m.sandboxes.clone());
        registry.register("creates", "Sandboxes created", m.creates.clone());
        registry.register(
            "create_failures",
            "Sandbox creates that failed",
            m.create_failures.clone(),
        );
        registry.register("deletes", "Sandboxes deleted", m.deletes.clone());
        registry.register(
            "data_plane_requests",
            "Data-plane requests by outcome",
            m.requests.clone(),
        );
        registry.register(
            "scheduler_errors",
            "Failed scheduler RPCs",
            m.scheduler_errors.clone(),
        );
        registry.register(
            "create_step_seconds",
            "Wall time of each step of a sandbox's start (step=total: the whole start)",
            m.create_steps.clone(),
        );
        registry.register(
            "warm_pool_ready",
            "Sandboxes ready in each warm pool (--warm-pool)",
            m.pool_ready.clone(),
        );
        registry.register(
            "warm_pool_takes",
            "Creates of a warm pool's template, by outcome (taken, empty, ineligible)",
            m.pool_takes.clone(),
        );
        m
    }

    /// How many sandboxes `template`'s warm pool holds now.
    pub fn pool_ready(&self, template: &str, ready: usize) {
        self.pool_ready
            .get_or_create(&PoolLabel {
                template: template.to_string(),
            })
            .set(ready as i64);
    }

    /// A create of `template` (a pooled one) took a pooled sandbox or not.
    pub fn pool_take(&self, template: &str, outcome: &'static str) {
        self.pool_takes
            .get_or_create(&PoolTakeLabel {
                template: template.to_string(),
                outcome,
            })
            .inc();
    }

    /// Records a start's steps (see `runtime::Steps`); `pooled`: the
    /// sandbox came from a warm pool.
    pub fn create_steps(&self, steps: &[(&'static str, std::time::Duration)], pooled: bool) {
        let source = if pooled { "pool" } else { "launch" };
        for (step, took) in steps {
            self.create_steps
                .get_or_create(&StepLabel { step, source })
                .observe(took.as_secs_f64());
        }
    }

    pub fn request(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }
}
