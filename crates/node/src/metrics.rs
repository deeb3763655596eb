//! The node's Prometheus metrics (prefix `warren_node_`), registered into the
//! admin listener's registry. Labels are low-cardinality: never a sandbox id.

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
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

/// Every metric the node exports.
#[derive(Clone, Default)]
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
        m
    }

    pub fn request(&self, outcome: Outcome) {
        self.requests
            .get_or_create(&OutcomeLabel {
                outcome: outcome.label(),
            })
            .inc();
    }
}
