//! The tonic service: validates each request (`validate.rs`), calls the
//! store, converts the result (`convert.rs`) and records the RPC's metrics.
//! Status codes follow the table in `docs/internals.md` via
//! `crate::error::Error`. The records' RPCs (`records.proto`: template
//! records, unused blobs, builds, uploads) have their bodies in
//! `records.rs` and their checks in `validate_records.rs`, the volumes'
//! (`volumes.proto`) in `volumes.rs`; who may call each RPC is decided
//! here, in the trait impl at the bottom. The `Secrets` service
//! (`secrets.proto`) is implemented by the same struct in `secrets.rs`.

pub(crate) mod convert;
mod records;
pub mod validate;
pub mod validate_records;
mod volumes;

use crate::error::{Error, Result};
use crate::metrics::Metrics;
use crate::route_view::RouteView;
use crate::store::{ListFilter, NodeEvent, NodeRegistration, NodeTiming, PlaceSpec, SqlStore};
use crate::watch::Hub;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::watch;
use tokio::time::Instant;
use tonic::{Request, Response, Status};
use warren_proto::scheduler::v1 as pb;

/// Settings the service hands out or applies.
#[derive(Debug, Clone, Copy)]
pub struct ServiceSettings {
    /// Node liveness lease, and how long a node may stop listing a sandbox.
    pub nodes: NodeTiming,
    /// Advertised heartbeat interval.
    pub heartbeat_interval: Duration,
    /// Callers are authenticated by their certificates (mutual TLS). When
    /// false (`--insecure-internal`) every caller may call everything.
    pub secure: bool,
    /// How ended sandboxes' logs are kept.
    pub logs: LogSettings,
}

/// How ended sandboxes' logs are kept (`--sandbox-log-*`).
#[derive(Debug, Clone, Copy)]
pub struct LogSettings {
    /// How long after its end a sandbox's log is kept.
    pub retention: Duration,
    /// What a team's kept logs may cost in all (0: no bound).
    pub team_max_bytes: u64,
}

impl Default for LogSettings {
    fn default() -> Self {
        LogSettings {
            retention: Duration::from_secs(7 * 24 * 3600),
            team_max_bytes: 64 << 20,
        }
    }
}

/// Who may call an RPC.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Allowed {
    /// Nodes (about themselves only) and gateways.
    NodesAndGateways,
    /// Nodes only, each as the node its certificate names.
    Nodes,
    Gateways,
}

/// The caller, as its certificate names it.
#[derive(Debug)]
enum Caller {
    /// `--insecure-internal`: unknown, allowed everything.
    Anyone,
    Node(String),
    Gateway,
}

/// `warren.scheduler.v1.Scheduler` over the [`SqlStore`].
pub struct SchedulerService {
    store: Arc<SqlStore>,
    /// Fans the change log out to `WatchBindings` streams.
    hub: Hub,
    /// Every binding's route in memory: `LookupNode`'s answers.
    view: Arc<RouteView>,
    settings: ServiceSettings,
    quotas: crate::config::Quotas,
    metrics: Metrics,
    /// Flips to true at shutdown; open watch streams end on it.
    shutdown: watch::Receiver<bool>,
}

impl SchedulerService {
    pub fn new(
        store: Arc<SqlStore>,
        hub: Hub,
        view: Arc<RouteView>,
        settings: ServiceSettings,
        quotas: crate::config::Quotas,
        metrics: Metrics,
        shutdown: watch::Receiver<bool>,
    ) -> Self {
        SchedulerService {
            store,
            hub,
            view,
            settings,
            quotas,
            metrics,
            shutdown,
        }
    }

    /// Runs one RPC body, recording its code and latency.
    async fn observe<T>(
        &self,
        rpc: &'static str,
        body: impl Future<Output = Result<T>>,
    ) -> Result<Response<T>, Status> {
        let start = Instant::now();
        let result = body.await.map_err(Status::from);
        let code = result
            .as_ref()
            .map_or_else(Status::code, |_| tonic::Code::Ok);
        self.metrics.rpc(rpc, code, start.elapsed());
        result.map(Response::new)
    }

    /// Who is calling `rpc`, refused (and logged) when their certificate's
    /// role may not call it.
    fn caller<T>(&self, rpc: &'static str, req: &Request<T>, allowed: Allowed) -> Result<Caller> {
        if !self.settings.secure {
            return Ok(Caller::Anyone);
        }
        let peer = req.extensions().get::<warren_trust::Peer>();
        let Some(identity) = peer.and_then(|p| p.identity.as_ref()) else {
            return Err(Error::PermissionDenied(format!(
                "{rpc} needs a client certificate"
            )));
        };
        let caller = match identity.role {
            warren_trust::Role::Node => Caller::Node(identity.name.clone()),
            warren_trust::Role::Gateway => Caller::Gateway,
            warren_trust::Role::Scheduler => {
                return Err(refuse(
                    rpc,
                    peer,
                    identity,
                    "schedulers call no scheduler RPCs",
                ))
            }
        };
        let ok = matches!(
            (allowed, &caller),
            (Allowed::NodesAndGateways, _)
                | (Allowed::Nodes, Caller::Node(_))
                | (Allowed::Gateways, Caller::Gateway)
        );
        if !ok {
            let why = match allowed {
                Allowed::Nodes => "only nodes may call it",
                _ => "only gateways may call it",
            };
            return Err(refuse(rpc, peer, identity, why));
        }
        Ok(caller)
    }

    fn lease_ms(&self) -> u64 {
        u64::try_from(self.settings.nodes.lease.as_millis()).unwrap_or(u64::MAX)
    }

    async fn register_node(&self, r: pb::RegisterNodeRequest) -> Result<pb::RegisterNodeResponse> {
        validate::node_id(&r.node_id)?;
        validate::endpoint(&r.endpoint)?;
        validate::capacity(r.capacity)?;
        validate::incarnation(r.incarnation)?;
        let roster = validate::roster(&r.roster)?;
        cached_layers(&r.cached_layers)?;
        volumes::store_kind(&r.volume_store)?;
        let reg = NodeRegistration {
            node_id: r.node_id,
            endpoint: r.endpoint,
            capacity: r.capacity,
            incarnation: r.incarnation,
            roster,
            cached_layers: r.cached_layers,
            paused: validate::roster(&r.paused)?,
            lists_paused: r.lists_paused,
            volume_store: r.volume_store,
            volume_max_bytes: r.volume_max_bytes,
        };
        let out = self.store.register_node(reg, self.settings.nodes).await?;
        Ok(pb::RegisterNodeResponse {
            lease_ms: self.lease_ms(),
            heartbeat_interval_ms: u64::try_from(self.settings.heartbeat_interval.as_millis())
                .unwrap_or(u64::MAX),
            orphans: convert::refs(out.orphans),
        })
    }

    async fn heartbeat(&self, r: pb::HeartbeatRequest) -> Result<pb::HeartbeatResponse> {
        validate::node_id(&r.node_id)?;
        validate::incarnation(r.incarnation)?;
        let roster = validate::roster(&r.roster)?;
        let paused = validate::roster(&r.paused)?;
        cached_layers(&r.cached_layers)?;
        let out = self
            .store
            .heartbeat_with_layers(
                &r.node_id,
                r.incarnation,
                (&roster, r.lists_paused.then_some(&paused[..])),
                Some(r.cached_layers),
                self.settings.nodes,
            )
            .await?;
        Ok(pb::HeartbeatResponse {
            lease_ms: self.lease_ms(),
            orphans: convert::refs(out.orphans),
            expired: convert::refs(out.expired),
            to_pause: convert::refs(out.to_pause),
            next_end_in_ms: out.next_end_in.map_or(0, |d| {
                u64::try_from(d.as_millis()).unwrap_or(u64::MAX).max(1)
            }),
        })
    }

    async fn place(&self, r: pb::PlaceRequest) -> Result<pb::Placement> {
        validate::label("team_id", &r.team_id)?;
        validate::label("template_id", &r.template_id)?;
        let require_node_id = match r.require_node_id.as_str() {
            "" => None,
            id => {
                validate::node_id(id)?;
                Some(id.to_string())
            }
        };
        let avoid_node_id = match r.avoid_node_id.as_str() {
            "" => None,
            id => {
                validate::node_id(id)?;
                Some(id.to_string())
            }
        };
        let prefer_layer = match r.prefer_layer.as_str() {
            "" => None,
            d => {
                validate_records::digest("prefer_layer", d)?;
                Some(d.to_string())
            }
        };
        let resources = r.resources.unwrap_or_default();
        let spec = PlaceSpec {
            prefer_layer,
            // Empty means the one built-in template, as on the node.
            template_id: if r.template_id.is_empty() {
                "base".into()
            } else {
                r.template_id
            },
            cpu_count: resources.cpu_count,
            memory_mb: resources.memory_mb,
            timeout: Duration::from_secs(validate::timeout_secs(r.timeout_secs)?),
            metadata: validate::metadata(&r.metadata)?,
            env_vars: validate::env_vars(&r.env_vars)?,
            idempotency_key: validate::idempotency_key(&r.idempotency_key)?,
            require_node_id,
            avoid_node_id,
            fork_of: match r.fork_of.as_str() {
                "" => None,
                id => {
                    validate::sandbox_id(id)?;
                    if !r.env_vars.is_empty() {
                        return Err(Error::invalid(
                            "a fork takes its parent's env_vars; env_vars must be empty",
                        ));
                    }
                    Some(id.to_string())
                }
            },
            lifecycle: r.lifecycle.map(convert::lifecycle).unwrap_or_default(),
            quota: self.quotas.of(&r.team_id),
            volume_mounts: volumes::mount_requests(&r.volume_mounts)?,
            team_id: r.team_id,
        };
        if spec.fork_of.is_some() && !spec.volume_mounts.is_empty() {
            return Err(Error::invalid(
                "a fork mounts its parent's volumes; volume_mounts must be empty",
            ));
        }
        let placed = self.store.place(spec).await?;
        let mut p = convert::placement(&placed.binding, placed.existing);
        if let Some(b) = p.binding.as_mut() {
            b.volume_mounts = placed.mounts.into_iter().map(volumes::mount_pb).collect();
        }
        Ok(p)
    }

    async fn reassign(&self, r: pb::ReassignRequest) -> Result<pb::Placement> {
        validate::sandbox_id(&r.sandbox_id)?;
        let node = match r.node_id.as_str() {
            "" => None,
            id => {
                validate::node_id(id)?;
                Some(id)
            }
        };
        let b = self.store.reassign(&r.sandbox_id, node).await?;
        let mut p = convert::placement(&b, false);
        if let Some(b) = p.binding.as_mut() {
            b.volume_mounts = self.mounts_pb(&r.sandbox_id).await?;
        }
        Ok(p)
    }

    async fn record_assignment(&self, r: pb::RecordAssignmentRequest) -> Result<pb::Binding> {
        validate::sandbox_id(&r.sandbox_id)?;
        validate::node_id(&r.node_id)?;
        validate::generation(r.generation)?;
        let b = self
            .store
            .record_assignment(&r.sandbox_id, &r.node_id, r.generation)
            .await?;
        Ok(convert::binding(&b))
    }

    async fn get_binding(&self, sandbox_id: &str) -> Result<crate::store::BindingRow> {
        self.store
            .get(sandbox_id)
            .await?
            .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} not found")))
    }

    async fn report_sandbox_event(
        &self,
        r: pb::ReportSandboxEventRequest,
    ) -> Result<pb::ReportSandboxEventResponse> {
        validate::node_id(&r.node_id)?;
        if r.events.len() > validate::MAX_EVENTS {
            return Err(Error::invalid(format!(
                "{} events in one report; the limit is {}",
                r.events.len(),
                validate::MAX_EVENTS
            )));
        }
        // Check the whole batch before applying any of it.
        let events = r
            .events
            .iter()
            .enumerate()
            .map(|(i, e)| {
                let checked = validate::sandbox_id(&e.sandbox_id)
                    .and_then(|()| validate::generation(e.generation))
                    .and_then(|()| validate::event_type(e.r#type))
                    .and_then(|kind| Ok((kind, paused_record(e, kind)?)))
                    .and_then(|(kind, record)| {
                        Ok((kind, record, ended_log(e, kind, self.settings.logs)?))
                    });
                match checked {
                    Ok((kind, paused_record, logs)) => Ok(NodeEvent {
                        sandbox_id: e.sandbox_id.clone(),
                        generation: e.generation,
                        kind,
                        paused_record,
                        logs,
                    }),
                    Err(err) => Err(Error::invalid(format!("event {i}: {err}"))),
                }
            })
            .collect::<Result<Vec<_>>>()?;
        self.store.require_node(&r.node_id).await?;
        let issued = self.store.issued_generation().await?;
        if let Some((i, e)) = events
            .iter()
            .enumerate()
            .find(|(_, e)| e.generation > issued)
        {
            return Err(Error::invalid(format!(
                "event {i}: generation {} was never issued (the highest is {issued})",
                e.generation
            )));
        }
        let mut results = Vec::with_capacity(events.len());
        for e in &events {
            let out = self.store.apply_event(&r.node_id, e).await?;
            results.push(pb::EventResult {
                sandbox_id: e.sandbox_id.clone(),
                applied: out.applied,
                reason: out.reason,
            });
        }
        Ok(pb::ReportSandboxEventResponse { results })
    }

    async fn list_sandboxes(
        &self,
        r: pb::ListSandboxesRequest,
    ) -> Result<pb::ListSandboxesResponse> {
        validate::label("team_id", &r.team_id)?;
        if !r.node_id.is_empty() {
            validate::node_id(&r.node_id)?;
        }
        let order = validate::list_order(r.order)?;
        let filter = ListFilter {
            team_id: Some(r.team_id).filter(|t| !t.is_empty()),
            node_id: Some(r.node_id).filter(|n| !n.is_empty()),
            states: validate::states(&r.states)?,
            metadata: validate::metadata(&r.metadata)?,
            after: validate::page_token(&r.page_token, order)?,
            limit: validate::page_size(r.page_size),
            order,
        };
        let (rows, next) = self.store.list(&filter).await?;
        Ok(pb::ListSandboxesResponse {
            sandboxes: rows.iter().map(convert::binding).collect(),
            next_page_token: next
                .as_ref()
                .map(|c| validate::make_page_token(c, order))
                .unwrap_or_default(),
        })
    }

    async fn get_access_token(&self, r: pb::GetAccessTokenRequest) -> Result<pb::AccessToken> {
        validate::sandbox_id(&r.sandbox_id)?;
        validate::label("team_id", &r.team_id)?;
        let b = self.get_binding(&r.sandbox_id).await?;
        if b.team_id != r.team_id {
            return Err(Error::NotFound(format!(
                "sandbox {} not found",
                r.sandbox_id
            )));
        }
        Ok(pb::AccessToken {
            access_token: b.access_token,
        })
    }

    async fn read_sandbox_logs(
        &self,
        r: pb::ReadSandboxLogsRequest,
    ) -> Result<pb::ReadSandboxLogsResponse> {
        validate::sandbox_id(&r.sandbox_id)?;
        validate::label("team_id", &r.team_id)?;
        let lines = self
            .store
            .read_sandbox_log(&r.sandbox_id, &r.team_id)
            .await?;
        Ok(pb::ReadSandboxLogsResponse {
            entries: lines
                .into_iter()
                .map(|l| pb::SandboxLogEntry {
                    at_ms: l.at_ms,
                    level: l.level,
                    logger: l.logger,
                    message: l.message,
                    fields: l.fields.into_iter().collect(),
                })
                .collect(),
        })
    }

    async fn report_node_unreachable(
        &self,
        r: pb::ReportNodeUnreachableRequest,
    ) -> Result<pb::ReportNodeUnreachableResponse> {
        validate::node_id(&r.node_id)?;
        let applied = self.store.mark_unreachable(&r.node_id).await?;
        if applied {
            let reason: String = r.reason.chars().take(200).collect();
            tracing::warn!(node = %r.node_id, %reason,
                "a gateway cannot reach the node; placing nothing on it until it heartbeats");
        }
        Ok(pb::ReportNodeUnreachableResponse { applied })
    }

    async fn list_nodes(&self) -> Result<pb::ListNodesResponse> {
        let nodes = self.store.list_nodes().await?;
        Ok(pb::ListNodesResponse {
            nodes: nodes.iter().map(convert::node).collect(),
        })
    }

    async fn set_timeout(&self, r: pb::SetTimeoutRequest) -> Result<pb::Binding> {
        validate::sandbox_id(&r.sandbox_id)?;
        if r.end_at_ms <= 0 {
            return Err(Error::invalid(format!(
                "end_at_ms {} is not a time (milliseconds since the Unix epoch)",
                r.end_at_ms
            )));
        }
        let b = self.store.set_end_at(&r.sandbox_id, r.end_at_ms).await?;
        Ok(convert::binding(&b))
    }
}

fn refuse(
    rpc: &'static str,
    peer: Option<&warren_trust::Peer>,
    identity: &warren_trust::Identity,
    why: &str,
) -> Error {
    let addr = peer.map(|p| p.addr.to_string()).unwrap_or_default();
    tracing::warn!(rpc, caller = %identity, peer = %addr, "refused: {why}");
    Error::PermissionDenied(format!("{identity} may not call {rpc}: {why}"))
}

/// The paused record a PAUSE event carries, checked: only on a PAUSE, a
/// valid paused record (`validate_records::record`), the sandbox's own
/// (`paused-<id>`, its `source_sandbox`) and of this pause (its
/// generation). Anything else is refused with the whole report.
fn paused_record(
    e: &pb::SandboxEvent,
    kind: crate::store::EventType,
) -> Result<Option<crate::store::TemplateRecord>> {
    let Some(r) = e.paused_record.clone() else {
        return Ok(None);
    };
    if kind != crate::store::EventType::Pause {
        return Err(Error::invalid("paused_record is only for a PAUSE event"));
    }
    let r = validate_records::record("paused_record", Some(r))?;
    let own = format!("paused-{}", e.sandbox_id);
    let paused = r.snapshot.as_ref().and_then(|s| {
        (s.source_sandbox == e.sandbox_id)
            .then_some(s.paused.as_ref())
            .flatten()
    });
    match paused {
        Some(p) if r.name == own && p.generation == e.generation => Ok(Some(r)),
        _ => Err(Error::invalid(format!(
            "paused_record must be sandbox {}'s own paused record ({own}, of generation {})",
            e.sandbox_id, e.generation
        ))),
    }
}

/// Most log lines one DELETE report keeps of a sandbox (the newest).
pub const MAX_SANDBOX_LOG_ENTRIES: usize = 1000;
/// Most bytes of a kept line's message; the rest is cut.
const MAX_LOG_MESSAGE: usize = 4096;
/// Most fields of a kept line, and bytes of each name and value.
const MAX_LOG_FIELDS: usize = 32;
const MAX_LOG_FIELD: usize = 256;

/// `s` cut to at most `max` bytes at a character boundary.
fn cut(s: &str, max: usize) -> String {
    let mut at = s.len().min(max);
    while !s.is_char_boundary(at) {
        at -= 1;
    }
    s[..at].to_string()
}

/// A DELETE's log, trimmed to what the store keeps: the newest
/// [`MAX_SANDBOX_LOG_ENTRIES`] lines, each cut to its bounds, an unknown
/// level read as `info`. Never refused (a DELETE must not fail on its
/// log); logs on any other event are.
fn ended_log(
    e: &pb::SandboxEvent,
    kind: crate::store::EventType,
    settings: LogSettings,
) -> Result<Option<crate::store::EndedLog>> {
    if e.logs.is_empty() {
        return Ok(None);
    }
    if kind != crate::store::EventType::Delete {
        return Err(Error::invalid("logs are only for a DELETE event"));
    }
    let skip = e.logs.len().saturating_sub(MAX_SANDBOX_LOG_ENTRIES);
    let lines = e.logs[skip..]
        .iter()
        .map(|l| crate::store::SandboxLogLine {
            at_ms: l.at_ms.max(0),
            level: match l.level.as_str() {
                "debug" | "info" | "warn" | "error" => l.level.clone(),
                _ => "info".into(),
            },
            logger: cut(&l.logger, 64),
            message: cut(&l.message, MAX_LOG_MESSAGE),
            fields: l
                .fields
                .iter()
                .take(MAX_LOG_FIELDS)
                .map(|(k, v)| (cut(k, MAX_LOG_FIELD), cut(v, MAX_LOG_FIELD)))
                .collect(),
        })
        .collect();
    Ok(Some(crate::store::EndedLog {
        lines,
        retention_ms: i64::try_from(settings.retention.as_millis()).unwrap_or(i64::MAX),
        team_max_bytes: settings.team_max_bytes,
    }))
}

/// A node's certificate must name the node it speaks for.
fn speaks_for(rpc: &'static str, caller: &Caller, node_id: &str) -> Result<()> {
    match caller {
        Caller::Node(own) if own != node_id => {
            tracing::warn!(rpc, caller = %own, claimed = %node_id,
                "refused: a node spoke for another node");
            Err(Error::PermissionDenied(format!(
                "node {own:?} may not call {rpc} as node {node_id:?}: its certificate names {own:?}"
            )))
        }
        _ => Ok(()),
    }
}

/// Every RPC: who may call it, then its body under [`SchedulerService::observe`].
macro_rules! rpc {
    ($self:ident, $req:ident, $name:literal, $allowed:ident, |$r:ident, $caller:ident| $body:expr) => {{
        let caller = $self.caller($name, &$req, Allowed::$allowed);
        let $r = $req.into_inner();
        $self
            .observe($name, async {
                #[allow(unused_variables)]
                let $caller = caller?;
                $body.await
            })
            .await
    }};
}

// After the macro above, which it uses.
mod lookups;
mod secrets;

#[tonic::async_trait]
impl pb::scheduler_server::Scheduler for SchedulerService {
    async fn register_node(
        &self,
        req: Request<pb::RegisterNodeRequest>,
    ) -> Result<Response<pb::RegisterNodeResponse>, Status> {
        rpc!(self, req, "RegisterNode", Nodes, |r, caller| async {
            speaks_for("RegisterNode", &caller, &r.node_id)?;
            self.register_node(r).await
        })
    }

    async fn heartbeat(
        &self,
        req: Request<pb::HeartbeatRequest>,
    ) -> Result<Response<pb::HeartbeatResponse>, Status> {
        rpc!(self, req, "Heartbeat", Nodes, |r, caller| async {
            speaks_for("Heartbeat", &caller, &r.node_id)?;
            self.heartbeat(r).await
        })
    }

    async fn place(
        &self,
        req: Request<pb::PlaceRequest>,
    ) -> Result<Response<pb::Placement>, Status> {
        rpc!(self, req, "Place", Gateways, |r, caller| self.place(r))
    }

    async fn reassign(
        &self,
        req: Request<pb::ReassignRequest>,
    ) -> Result<Response<pb::Placement>, Status> {
        rpc!(self, req, "Reassign", Gateways, |r, caller| self
            .reassign(r))
    }

    async fn record_assignment(
        &self,
        req: Request<pb::RecordAssignmentRequest>,
    ) -> Result<Response<pb::Binding>, Status> {
        rpc!(self, req, "RecordAssignment", Gateways, |r, caller| self
            .record_assignment(r))
    }

    async fn lookup_node(
        &self,
        req: Request<pb::LookupNodeRequest>,
    ) -> Result<Response<pb::Route>, Status> {
        rpc!(self, req, "LookupNode", Gateways, |r, caller| self
            .lookup_node(r))
    }

    async fn lookup_nodes(
        &self,
        req: Request<pb::LookupNodesRequest>,
    ) -> Result<Response<pb::LookupNodesResponse>, Status> {
        rpc!(self, req, "LookupNodes", Gateways, |r, caller| self
            .lookup_nodes(r))
    }

    async fn report_sandbox_event(
        &self,
        req: Request<pb::ReportSandboxEventRequest>,
    ) -> Result<Response<pb::ReportSandboxEventResponse>, Status> {
        rpc!(
            self,
            req,
            "ReportSandboxEvent",
            NodesAndGateways,
            |r, caller| async {
                speaks_for("ReportSandboxEvent", &caller, &r.node_id)?;
                self.report_sandbox_event(r).await
            }
        )
    }

    async fn report_node_unreachable(
        &self,
        req: Request<pb::ReportNodeUnreachableRequest>,
    ) -> Result<Response<pb::ReportNodeUnreachableResponse>, Status> {
        rpc!(self, req, "ReportNodeUnreachable", Gateways, |r, caller| {
            self.report_node_unreachable(r)
        })
    }

    async fn read_sandbox_logs(
        &self,
        req: Request<pb::ReadSandboxLogsRequest>,
    ) -> Result<Response<pb::ReadSandboxLogsResponse>, Status> {
        rpc!(self, req, "ReadSandboxLogs", Gateways, |r, caller| self
            .read_sandbox_logs(r))
    }

    async fn list_sandboxes(
        &self,
        req: Request<pb::ListSandboxesRequest>,
    ) -> Result<Response<pb::ListSandboxesResponse>, Status> {
        rpc!(self, req, "ListSandboxes", Gateways, |r, caller| self
            .list_sandboxes(r))
    }

    async fn get_sandbox(
        &self,
        req: Request<pb::GetSandboxRequest>,
    ) -> Result<Response<pb::Binding>, Status> {
        rpc!(self, req, "GetSandbox", Gateways, |r, caller| async {
            validate::sandbox_id(&r.sandbox_id)?;
            let mut b = convert::binding(&self.get_binding(&r.sandbox_id).await?);
            b.volume_mounts = self.mounts_pb(&r.sandbox_id).await?;
            Ok(b)
        })
    }

    async fn get_access_token(
        &self,
        req: Request<pb::GetAccessTokenRequest>,
    ) -> Result<Response<pb::AccessToken>, Status> {
        rpc!(self, req, "GetAccessToken", Gateways, |r, caller| self
            .get_access_token(r))
    }

    async fn list_nodes(
        &self,
        req: Request<pb::ListNodesRequest>,
    ) -> Result<Response<pb::ListNodesResponse>, Status> {
        rpc!(self, req, "ListNodes", Gateways, |_r, caller| self
            .list_nodes())
    }

    async fn set_timeout(
        &self,
        req: Request<pb::SetTimeoutRequest>,
    ) -> Result<Response<pb::Binding>, Status> {
        rpc!(self, req, "SetTimeout", Gateways, |r, caller| self
            .set_timeout(r))
    }

    // ---- records (records.proto): gateways only; nodes are handed what
    // they need in their create requests. ----

    async fn put_template_records(
        &self,
        req: Request<pb::PutTemplateRecordsRequest>,
    ) -> Result<Response<pb::PutTemplateRecordsResponse>, Status> {
        rpc!(self, req, "PutTemplateRecords", Gateways, |r, caller| self
            .put_template_records(r))
    }

    async fn get_template_record(
        &self,
        req: Request<pb::GetTemplateRecordRequest>,
    ) -> Result<Response<pb::TemplateRecord>, Status> {
        rpc!(self, req, "GetTemplateRecord", Gateways, |r, caller| self
            .get_template_record(r))
    }

    async fn list_template_records(
        &self,
        req: Request<pb::ListTemplateRecordsRequest>,
    ) -> Result<Response<pb::ListTemplateRecordsResponse>, Status> {
        rpc!(self, req, "ListTemplateRecords", Gateways, |r, caller| self
            .list_template_records(r))
    }

    async fn delete_template_records(
        &self,
        req: Request<pb::DeleteTemplateRecordsRequest>,
    ) -> Result<Response<pb::DeleteTemplateRecordsResponse>, Status> {
        rpc!(self, req, "DeleteTemplateRecords", Gateways, |r, caller| {
            self.delete_template_records(r)
        })
    }

    async fn get_team_usage(
        &self,
        req: Request<pb::GetTeamUsageRequest>,
    ) -> Result<Response<pb::TeamUsage>, Status> {
        rpc!(self, req, "GetTeamUsage", Gateways, |r, caller| self
            .get_team_usage(r))
    }

    async fn note_unused_blobs(
        &self,
        req: Request<pb::NoteUnusedBlobsRequest>,
    ) -> Result<Response<pb::NoteUnusedBlobsResponse>, Status> {
        rpc!(self, req, "NoteUnusedBlobs", Gateways, |r, caller| self
            .note_unused_blobs(r))
    }

    async fn list_unused_blobs(
        &self,
        req: Request<pb::ListUnusedBlobsRequest>,
    ) -> Result<Response<pb::ListUnusedBlobsResponse>, Status> {
        rpc!(self, req, "ListUnusedBlobs", Gateways, |r, caller| self
            .list_unused_blobs(r))
    }

    async fn remove_unused_blob(
        &self,
        req: Request<pb::RemoveUnusedBlobRequest>,
    ) -> Result<Response<pb::RemoveUnusedBlobResponse>, Status> {
        rpc!(self, req, "RemoveUnusedBlob", Gateways, |r, caller| self
            .remove_unused_blob(r))
    }

    async fn create_build(
        &self,
        req: Request<pb::CreateBuildRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        rpc!(self, req, "CreateBuild", Gateways, |r, caller| self
            .create_build(r))
    }

    async fn get_build(
        &self,
        req: Request<pb::GetBuildRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        rpc!(self, req, "GetBuild", Gateways, |r, caller| self
            .get_build(r))
    }

    async fn list_builds(
        &self,
        req: Request<pb::ListBuildsRequest>,
    ) -> Result<Response<pb::ListBuildsResponse>, Status> {
        rpc!(self, req, "ListBuilds", Gateways, |r, caller| self
            .list_builds(r))
    }

    async fn claim_build(
        &self,
        req: Request<pb::ClaimBuildRequest>,
    ) -> Result<Response<pb::ClaimBuildResponse>, Status> {
        rpc!(self, req, "ClaimBuild", Gateways, |r, caller| self
            .claim_build(r))
    }

    async fn renew_build_lease(
        &self,
        req: Request<pb::RenewBuildLeaseRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        rpc!(self, req, "RenewBuildLease", Gateways, |r, caller| self
            .renew_build_lease(r))
    }

    async fn update_build_status(
        &self,
        req: Request<pb::UpdateBuildStatusRequest>,
    ) -> Result<Response<pb::Build>, Status> {
        rpc!(self, req, "UpdateBuildStatus", Gateways, |r, caller| self
            .update_build_status(r))
    }

    async fn append_build_log(
        &self,
        req: Request<pb::AppendBuildLogRequest>,
    ) -> Result<Response<pb::AppendBuildLogResponse>, Status> {
        rpc!(self, req, "AppendBuildLog", Gateways, |r, caller| self
            .append_build_log(r))
    }

    async fn read_build_log(
        &self,
        req: Request<pb::ReadBuildLogRequest>,
    ) -> Result<Response<pb::ReadBuildLogResponse>, Status> {
        rpc!(self, req, "ReadBuildLog", Gateways, |r, caller| self
            .read_build_log(r))
    }

    async fn put_upload(
        &self,
        req: Request<pb::PutUploadRequest>,
    ) -> Result<Response<pb::Upload>, Status> {
        rpc!(self, req, "PutUpload", Gateways, |r, caller| self
            .put_upload(r))
    }

    async fn get_upload(
        &self,
        req: Request<pb::GetUploadRequest>,
    ) -> Result<Response<pb::Upload>, Status> {
        rpc!(self, req, "GetUpload", Gateways, |r, caller| self
            .get_upload(r))
    }

    async fn delete_upload(
        &self,
        req: Request<pb::DeleteUploadRequest>,
    ) -> Result<Response<pb::DeleteUploadResponse>, Status> {
        rpc!(self, req, "DeleteUpload", Gateways, |r, caller| self
            .delete_upload(r))
    }

    // ---- volumes (volumes.proto): gateways only. ----

    async fn create_volume(
        &self,
        req: Request<pb::CreateVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        rpc!(self, req, "CreateVolume", Gateways, |r, caller| self
            .create_volume(r))
    }

    async fn get_volume(
        &self,
        req: Request<pb::GetVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        rpc!(self, req, "GetVolume", Gateways, |r, caller| self
            .get_volume(r))
    }

    async fn list_volumes(
        &self,
        req: Request<pb::ListVolumesRequest>,
    ) -> Result<Response<pb::ListVolumesResponse>, Status> {
        rpc!(self, req, "ListVolumes", Gateways, |r, caller| self
            .list_volumes(r))
    }

    async fn begin_delete_volume(
        &self,
        req: Request<pb::BeginDeleteVolumeRequest>,
    ) -> Result<Response<pb::Volume>, Status> {
        rpc!(self, req, "BeginDeleteVolume", Gateways, |r, caller| self
            .begin_delete_volume(r))
    }

    async fn finish_delete_volume(
        &self,
        req: Request<pb::FinishDeleteVolumeRequest>,
    ) -> Result<Response<pb::FinishDeleteVolumeResponse>, Status> {
        rpc!(self, req, "FinishDeleteVolume", Gateways, |r, caller| self
            .finish_delete_volume(r))
    }

    async fn route_volume(
        &self,
        req: Request<pb::RouteVolumeRequest>,
    ) -> Result<Response<pb::VolumeRoute>, Status> {
        rpc!(self, req, "RouteVolume", Gateways, |r, caller| self
            .route_volume(r))
    }

    type WatchBindingsStream =
        tokio_stream::wrappers::ReceiverStream<Result<pb::BindingChange, Status>>;

    async fn watch_bindings(
        &self,
        req: Request<pb::WatchBindingsRequest>,
    ) -> Result<Response<Self::WatchBindingsStream>, Status> {
        rpc!(self, req, "WatchBindings", Gateways, |r, caller| async {
            Ok(self.hub.subscribe(
                self.store.clone(),
                r.from_revision,
                self.metrics.clone(),
                self.shutdown.clone(),
            ))
        })
    }
}

/// The most layers a node reports in its cache.
pub const MAX_CACHED_LAYERS: usize = 1000;

/// A node's cached layers: at most [`MAX_CACHED_LAYERS`] digests.
fn cached_layers(layers: &[String]) -> Result<()> {
    if layers.len() > MAX_CACHED_LAYERS {
        return Err(Error::invalid(format!(
            "cached_layers: {} digests, at most {MAX_CACHED_LAYERS}",
            layers.len()
        )));
    }
    validate_records::digests("cached_layers", layers)
}
