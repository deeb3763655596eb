//! What every listener counts, registered once per part into its admin
//! registry (so the names carry the part's prefix, e.g.
//! `warren_gateway_listener_connections{listener="http"}`):
//!
//! - `listener_connections` (gauge): connections open now;
//! - `listener_refused_total{reason}`: connections closed at accept because
//!   a limit was reached (`max_connections`, `max_connections_per_peer`);
//! - `listener_timeouts_total{timeout}`: connections or requests ended by a
//!   timeout (`header_read`, `idle`, `body_progress`).

use prometheus_client::encoding::EncodeLabelSet;
use prometheus_client::metrics::counter::Counter;
use prometheus_client::metrics::family::Family;
use prometheus_client::metrics::gauge::Gauge;
use prometheus_client::registry::Registry;

/// Why a new connection was refused: the `reason` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Refusal {
    /// The listener's `max_connections` were open.
    MaxConnections,
    /// The peer's `max_connections_per_peer` were open.
    MaxConnectionsPerPeer,
}

impl Refusal {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Refusal::MaxConnections => "max_connections",
            Refusal::MaxConnectionsPerPeer => "max_connections_per_peer",
        }
    }
}

/// Which timeout ended a connection or request: the `timeout` label.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Timeout {
    /// No complete request head in time; the connection was closed.
    HeaderRead,
    /// No request for the idle timeout; the connection was closed.
    Idle,
    /// A request body stalled; the request got `408`.
    BodyProgress,
}

impl Timeout {
    /// The label value.
    pub fn as_str(self) -> &'static str {
        match self {
            Timeout::HeaderRead => "header_read",
            Timeout::Idle => "idle",
            Timeout::BodyProgress => "body_progress",
        }
    }
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct ListenerLabels {
    listener: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct RefusedLabels {
    listener: &'static str,
    reason: &'static str,
}

#[derive(Debug, Clone, Hash, PartialEq, Eq, EncodeLabelSet)]
struct TimeoutLabels {
    listener: &'static str,
    timeout: &'static str,
}

/// The listener metric families of one part. `Default` gives unregistered
/// ones (envd has no admin listener to show them).
#[derive(Debug, Clone, Default)]
pub struct Metrics {
    connections: Family<ListenerLabels, Gauge>,
    refused: Family<RefusedLabels, Counter>,
    timeouts: Family<TimeoutLabels, Counter>,
}

impl Metrics {
    /// Registers the families into `registry`.
    pub fn register(registry: &mut Registry) -> Self {
        let m = Metrics::default();
        registry.register(
            "listener_connections",
            "Connections open now, per listener",
            m.connections.clone(),
        );
        registry.register(
            "listener_refused",
            "New connections closed at once because a connection limit was reached",
            m.refused.clone(),
        );
        registry.register(
            "listener_timeouts",
            "Connections (header_read, idle) or requests (body_progress) ended by a timeout",
            m.timeouts.clone(),
        );
        m
    }

    /// The handle one listener counts through; `name` is its `listener`
    /// label (`http`, `admin`, `grpc`, ...).
    pub fn listener(&self, name: &'static str) -> ListenerMetrics {
        ListenerMetrics {
            name,
            families: self.clone(),
        }
    }
}

/// One listener's metrics.
#[derive(Debug, Clone)]
pub struct ListenerMetrics {
    /// The `listener` label, also used in log lines.
    pub name: &'static str,
    families: Metrics,
}

impl ListenerMetrics {
    pub(crate) fn opened(&self) {
        self.families
            .connections
            .get_or_create(&ListenerLabels {
                listener: self.name,
            })
            .inc();
    }

    pub(crate) fn closed(&self) {
        self.families
            .connections
            .get_or_create(&ListenerLabels {
                listener: self.name,
            })
            .dec();
    }

    pub(crate) fn refused(&self, reason: Refusal) {
        self.families
            .refused
            .get_or_create(&RefusedLabels {
                listener: self.name,
                reason: reason.as_str(),
            })
            .inc();
    }

    pub(crate) fn timed_out(&self, timeout: Timeout) {
        self.families
            .timeouts
            .get_or_create(&TimeoutLabels {
                listener: self.name,
                timeout: timeout.as_str(),
            })
            .inc();
    }
}
