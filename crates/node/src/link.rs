//! The node's link to the scheduler: RegisterNode with a fresh incarnation,
//! Heartbeat with the roster every interval (killing what the scheduler
//! answers as `orphans` or `expired`, freezing what it answers as
//! `to_pause` (auto-pause at the end), and heartbeating early when the
//! scheduler says a sandbox ends sooner, so a timeout is enforced when it
//! ends), and ReportSandboxEvent for creates, forks and deletes after the
//! fact.
//!
//! The scheduler being unreachable never stops the node from serving the
//! sandboxes it has: every call fails over between the configured replicas
//! (`warren_proto::client`), rounds are retried with `warren_core::backoff`,
//! and the link re-registers when a heartbeat says the
//! scheduler does not know this node (or this incarnation) any more.

use crate::metrics::Metrics;
use crate::sandbox::{Event, EventKind, NodeError, Registry};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::{mpsc, watch};
use tonic::Code;
use warren_core::admin::Admin;
use warren_core::backoff::{self, Backoff};
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1 as pb;

/// First pause after a failed register, heartbeat or event report.
const FIRST_BACKOFF: Duration = Duration::from_millis(200);
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);
/// How often one batch of events is retried before it is logged and dropped.
const EVENT_ATTEMPTS: u32 = 8;

/// How much after a sandbox's end the node asks about it: the store's
/// clock and ours run apart by the request's latency, so the heartbeat
/// lands just after the end rather than just before it.
const END_SLACK: Duration = Duration::from_millis(20);

/// The pause before the next heartbeat: the usual interval, or less when a
/// sandbox ends sooner (its kill is then due; see `HeartbeatResponse`).
fn next_wait(interval: Duration, next_end_in_ms: u64) -> Duration {
    match next_end_in_ms {
        0 => interval,
        ms => interval.min(Duration::from_millis(ms) + END_SLACK),
    }
}

/// What the link needs to know about this node.
#[derive(Debug, Clone)]
pub struct NodeIdentity {
    pub node_id: String,
    /// host:port gateways dial.
    pub endpoint: String,
    pub capacity: u32,
    pub incarnation: u64,
}

/// See the module doc.
pub struct Link {
    me: NodeIdentity,
    /// The scheduler replicas, shared by the heartbeat loop and the event
    /// reporter (failover as `warren_proto::client` says).
    scheduler: Scheduler,
    registry: Arc<Registry>,
    metrics: Metrics,
    admin: Admin,
    heartbeat_override: Option<Duration>,
    /// Notified when a gateway asks for a heartbeat now (a sandbox's end
    /// changed; `warren_core::node_api::HEARTBEAT`).
    check_in: Arc<tokio::sync::Notify>,
}

impl Link {
    /// One ReportSandboxEvent call (the scheduler client fails over
    /// between replicas); the scheduler's per-event answers.
    async fn report(
        &self,
        req: &pb::ReportSandboxEventRequest,
    ) -> Result<pb::ReportSandboxEventResponse, tonic::Status> {
        self.scheduler
            .call("ReportSandboxEvent", |mut c| {
                let req = req.clone();
                async move { c.report_sandbox_event(req).await }
            })
            .await
    }

    pub fn new(
        me: NodeIdentity,
        scheduler: Scheduler,
        registry: Arc<Registry>,
        metrics: Metrics,
        admin: Admin,
        heartbeat_override: Option<Duration>,
        check_in: Arc<tokio::sync::Notify>,
    ) -> Arc<Link> {
        Arc::new(Link {
            me,
            scheduler,
            registry,
            metrics,
            admin,
            heartbeat_override,
            check_in,
        })
    }

    fn roster(&self) -> Vec<pb::SandboxRef> {
        self.registry
            .roster()
            .into_iter()
            .map(|(sandbox_id, generation)| pb::SandboxRef {
                sandbox_id,
                generation,
            })
            .collect()
    }

    // The roster is read for each attempt: a call that fails over to
    // another replica after a timeout must not carry the roster of seconds
    // ago (it would lack what was created meanwhile).

    async fn register(&self) -> Result<pb::RegisterNodeResponse, tonic::Status> {
        self.scheduler
            .call("RegisterNode", |mut c| {
                let req = pb::RegisterNodeRequest {
                    node_id: self.me.node_id.clone(),
                    endpoint: self.me.endpoint.clone(),
                    capacity: self.me.capacity,
                    incarnation: self.me.incarnation,
                    roster: self.roster(),
                    cached_layers: self.registry.cached_layers(),
                    volume_store: self
                        .registry
                        .volumes()
                        .map_or_else(String::new, |v| v.kind().to_string()),
                    volume_max_bytes: self.registry.volumes().map_or(0, |v| v.max_bytes()),
                    paused: self.paused(),
                    lists_paused: true,
                };
                async move { c.register_node(req).await }
            })
            .await
    }

    async fn heartbeat(&self) -> Result<pb::HeartbeatResponse, tonic::Status> {
        self.scheduler
            .call("Heartbeat", |mut c| {
                let req = pb::HeartbeatRequest {
                    node_id: self.me.node_id.clone(),
                    incarnation: self.me.incarnation,
                    roster: self.roster(),
                    cached_layers: self.registry.cached_layers(),
                    paused: self.paused(),
                    lists_paused: true,
                };
                async move { c.heartbeat(req).await }
            })
            .await
    }

    /// The roster's sandboxes that are paused here (frozen or
    /// filesystem-only), so a binding that went LOST while its node was
    /// cut off comes back PAUSED, not RUNNING.
    fn paused(&self) -> Vec<pb::SandboxRef> {
        self.registry
            .hosted()
            .into_iter()
            .filter(|s| s.is_paused())
            .map(|s| pb::SandboxRef {
                sandbox_id: s.info.sandbox_id.clone(),
                generation: s.info.generation,
            })
            .collect()
    }

    /// Kills sandboxes the scheduler says must go, each in its own task so a
    /// slow kill does not delay the next heartbeat.
    fn kill(&self, refs: Vec<pb::SandboxRef>, reason: &'static str) {
        for r in refs {
            let registry = self.registry.clone();
            tokio::spawn(async move {
                match registry
                    .delete(&r.sandbox_id, Some(r.generation), reason)
                    .await
                {
                    Ok(_) => {}
                    Err(e) => {
                        tracing::debug!(sandbox_id = %r.sandbox_id, error = %e, reason, "nothing to kill")
                    }
                }
            });
        }
    }

    /// Freezes the auto-pause sandboxes the scheduler says reached their
    /// end and reports each PAUSE (EXPIRING -> PAUSED), each in its own
    /// task. One that cannot be frozen (the `process` runtime, a freezer
    /// error) must not run on past its end: it is killed, as without
    /// auto-pause, and the reason logged. A PAUSE the scheduler does not
    /// apply (the sandbox went, or a duplicate answer raced a resume) is
    /// undone: the node keeps what the scheduler has. A lost report is
    /// repaired by the next heartbeat, which answers the sandbox again.
    fn pause_at_end(self: &Arc<Self>, refs: Vec<pb::SandboxRef>) {
        for r in refs {
            let link = self.clone();
            tokio::spawn(async move {
                let (id, gen) = (r.sandbox_id.as_str(), r.generation);
                let paused_record = match link.registry.pause_at_end(id, gen).await {
                    Ok(info) => info.paused_record.and_then(|v| paused_record(id, v)),
                    Err(NodeError::NotHosted { .. } | NodeError::Conflict { .. }) => {
                        tracing::debug!(sandbox_id = %id, "nothing to pause at its end");
                        return;
                    }
                    Err(e) => {
                        tracing::warn!(sandbox_id = %id, generation = gen, error = %e,
                            "cannot pause the sandbox at its end (auto-pause); killing it instead");
                        if let Err(e) = link
                            .registry
                            .delete(id, Some(gen), "expired (auto-pause failed)")
                            .await
                        {
                            tracing::debug!(sandbox_id = %id, error = %e, "nothing to kill");
                        }
                        return;
                    }
                };
                // A filesystem-only pause on a blob store: no gateway is
                // here to keep its record, so the report carries it and
                // the scheduler writes it with the PAUSE (fenced alike).
                let with_record = paused_record.is_some();
                let req = pb::ReportSandboxEventRequest {
                    node_id: link.me.node_id.clone(),
                    events: vec![pb::SandboxEvent {
                        sandbox_id: id.to_string(),
                        generation: gen,
                        r#type: pb::EventType::Pause as i32,
                        paused_record,
                        logs: Vec::new(),
                    }],
                };
                let result = match link.report(&req).await {
                    // A record the scheduler refuses must not keep the
                    // pause from being reported (it would stay EXPIRING,
                    // answered again at every heartbeat): again without.
                    Err(s) if with_record && s.code() == Code::InvalidArgument => {
                        tracing::warn!(sandbox_id = %id, status = %s,
                            "the scheduler refused the paused record; the sandbox can resume on this node only");
                        let mut req = req.clone();
                        for e in &mut req.events {
                            e.paused_record = None;
                        }
                        link.report(&req).await
                    }
                    r => r,
                };
                match result {
                    Ok(resp) => match resp.results.iter().find(|r| !r.applied) {
                        None => {
                            tracing::info!(sandbox_id = %id, generation = gen, "sandbox paused at its end (auto-pause)")
                        }
                        Some(miss) => {
                            tracing::info!(sandbox_id = %id, generation = gen, reason = %miss.reason,
                                "the scheduler did not take the pause at the end; thawing");
                            let _ = link.registry.set_paused(id, gen, false, true).await;
                        }
                    },
                    Err(s) => {
                        // Frozen but still EXPIRING: the next heartbeat
                        // answers it again and this runs once more.
                        link.metrics.scheduler_errors.inc();
                        tracing::warn!(sandbox_id = %id, status = %s, "cannot report the pause at the end; retried on the next heartbeat");
                    }
                }
            });
        }
    }

    /// Registers, then heartbeats until `shutdown` turns true.
    pub async fn run_heartbeats(self: Arc<Self>, mut shutdown: watch::Receiver<bool>) {
        let mut backoff = Backoff::new(FIRST_BACKOFF, backoff::MAX);
        let mut registered = false;
        let mut interval = self.heartbeat_override.unwrap_or(DEFAULT_HEARTBEAT);
        loop {
            if *shutdown.borrow() {
                return;
            }
            let wait = if registered {
                match self.heartbeat().await {
                    Ok(resp) => {
                        backoff.reset();
                        self.kill(resp.orphans, crate::sandbox::ORPHAN);
                        self.kill(resp.expired, "expired (scheduler)");
                        self.pause_at_end(resp.to_pause);
                        next_wait(interval, resp.next_end_in_ms)
                    }
                    Err(s) if matches!(s.code(), Code::FailedPrecondition | Code::NotFound) => {
                        tracing::warn!(status = %s, "the scheduler does not know this node (or incarnation); registering again");
                        registered = false;
                        Duration::ZERO
                    }
                    Err(s) => {
                        self.metrics.scheduler_errors.inc();
                        tracing::warn!(status = %s, retry_in = ?backoff.peek(), "heartbeat failed; still serving hosted sandboxes");
                        backoff.next_pause().min(interval)
                    }
                }
            } else {
                match self.register().await {
                    Ok(resp) => {
                        registered = true;
                        backoff.reset();
                        interval = self.heartbeat_override.unwrap_or_else(|| {
                            match resp.heartbeat_interval_ms {
                                0 => DEFAULT_HEARTBEAT,
                                ms => Duration::from_millis(ms),
                            }
                        });
                        tracing::info!(
                            node_id = %self.me.node_id,
                            incarnation = self.me.incarnation,
                            lease_ms = resp.lease_ms,
                            heartbeat = ?interval,
                            orphans = resp.orphans.len(),
                            "registered with the scheduler"
                        );
                        self.kill(resp.orphans, crate::sandbox::ORPHAN);
                        self.admin.set_ready(true);
                        interval
                    }
                    Err(s) => {
                        self.metrics.scheduler_errors.inc();
                        tracing::warn!(status = %s, retry_in = ?backoff.peek(), "cannot register with the scheduler");
                        backoff.next_pause()
                    }
                }
            };
            tokio::select! {
                _ = tokio::time::sleep(wait) => {}
                // A gateway changed a sandbox's end: heartbeat now.
                _ = self.check_in.notified(), if registered => {}
                _ = shutdown.changed() => return,
            }
        }
    }

    /// Sends lifecycle events as they come, in batches, retrying each batch
    /// with backoff before giving up on it (the heartbeat's roster repairs
    /// what a lost event leaves behind).
    pub async fn run_events(self: Arc<Self>, mut events: mpsc::UnboundedReceiver<Event>) {
        while let Some(first) = events.recv().await {
            let mut batch = vec![first];
            while batch.len() < 100 {
                match events.try_recv() {
                    Ok(e) => batch.push(e),
                    Err(_) => break,
                }
            }
            let req = pb::ReportSandboxEventRequest {
                node_id: self.me.node_id.clone(),
                events: batch
                    .iter()
                    .map(|e| pb::SandboxEvent {
                        sandbox_id: e.sandbox_id.clone(),
                        generation: e.generation,
                        r#type: match e.kind {
                            EventKind::Create => pb::EventType::Create,
                            EventKind::Fork => pb::EventType::Fork,
                            EventKind::Delete => pb::EventType::Delete,
                        } as i32,
                        paused_record: None,
                        logs: e
                            .logs
                            .iter()
                            .map(|l| pb::SandboxLogEntry {
                                at_ms: l.at_ms,
                                level: l.level.clone(),
                                logger: l.logger.clone(),
                                message: l.message.clone(),
                                fields: l.fields.clone().into_iter().collect(),
                            })
                            .collect(),
                    })
                    .collect(),
            };
            let mut backoff = Backoff::new(FIRST_BACKOFF, backoff::MAX);
            for attempt in 1..=EVENT_ATTEMPTS {
                let result = self.report(&req).await;
                match result {
                    Ok(resp) => {
                        for r in resp.results.iter().filter(|r| !r.applied) {
                            tracing::debug!(sandbox_id = %r.sandbox_id, reason = %r.reason, "event not applied by the scheduler");
                        }
                        break;
                    }
                    Err(s) => {
                        self.metrics.scheduler_errors.inc();
                        if s.code() == Code::InvalidArgument {
                            // The scheduler never issued that binding (e.g. a
                            // sandbox created directly on the node); retrying
                            // cannot help, and the heartbeat reconciles.
                            tracing::warn!(status = %s, "the scheduler refused sandbox events");
                            break;
                        }
                        if attempt == EVENT_ATTEMPTS {
                            tracing::error!(status = %s, events = batch.len(), "giving up reporting sandbox events");
                            break;
                        }
                        tokio::time::sleep(backoff.next_pause()).await;
                    }
                }
            }
        }
    }
}

/// The paused record a filesystem-only pause answered (a
/// `warren_template::Template` as JSON) as the scheduler stores it, for the
/// PAUSE report. The node does not know every layer's size: 0 (a paused
/// record counts against no team's bounds).
fn paused_record(id: &str, v: serde_json::Value) -> Option<pb::TemplateRecord> {
    match serde_json::from_value::<warren_template::Template>(v) {
        Ok(t) => Some(warren_proto::records::to_record(
            &t,
            pb::RecordKind::Paused,
            |_| 0,
        )),
        Err(e) => {
            tracing::warn!(sandbox_id = %id, error = %e,
                "cannot decode the paused record; the sandbox can resume on this node only");
            None
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_sandbox_ending_soon_brings_the_next_heartbeat_forward() {
        let interval = Duration::from_secs(2);
        assert_eq!(next_wait(interval, 0), interval, "nothing ends");
        assert_eq!(next_wait(interval, 60_000), interval, "ends later");
        assert_eq!(
            next_wait(interval, 500),
            Duration::from_millis(500) + END_SLACK
        );
    }
}
