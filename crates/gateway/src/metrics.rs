//! The gateway's Prometheus metrics (prefix `warren_gateway_`), registered
//! into the admin listener's registry. Labels are low-cardinality only:
//! never a sandbox id.

use prometheus_client::encoding::{EncodeLabelSet, EncodeLabelValue, LabelValueEncoder};
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::histogram::{exponential_buckets, Histogram};
use std::time::Duration;
use warren_core::admin::Admin;

/// Which half of the API a request was for.
#[derive(Debug, Clone, Copy, Hash, PartialEq, Eq)]
pub enum Plane {
    /// E2B REST API.
    Control,
    /// Sandbox traffic proxied to a node.
    Data,
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

/// Handles to every gateway metric.
#[derive(Clone)]
pub struct Metrics {
    requests: Family<RequestLabels, Counter>,
    durations: Family<PlaneLabels, Histogram, fn() -> Histogram>,
    /// `LookupNode` calls made to the scheduler (each one, cached or not).
    pub scheduler_lookups: Counter,
}

impl Metrics {
    /// Creates the metrics and registers them with `admin`.
    pub fn register(admin: &Admin) -> Self {
        let m = Metrics {
            requests: Family::default(),
            durations: Family::new_with_constructor(duration_histogram),
            scheduler_lookups: Counter::default(),
        };
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
                "LookupNode calls made to the scheduler",
                m.scheduler_lookups.clone(),
            );
        }
        m
    }

    /// Records one answered request.
    pub fn observe(&self, plane: Plane, status: u16, elapsed: Duration) {
        self.requests
            .get_or_create(&RequestLabels { plane, status })
            .inc();
        self.durations
            .get_or_create(&PlaneLabels { plane })
            .observe(elapsed.as_secs_f64());
    }
}
