//! Pause and resume: E2B's `POST /sandboxes/{id}/pause` and `/resume` (and
//! `connect`, which resumes). A pause freezes every process of the sandbox
//! in place on its node (the cgroup freezer), memory kept; a resume thaws it.
//! The binding goes PAUSED / RUNNING through the same fenced
//! `ReportSandboxEvent` a node would send, so the change is in the scheduler
//! (and every gateway's routes) before the answer. A paused sandbox never
//! expires; resuming gives it a new timeout.
//!
//!
//! A filesystem-only pause (`"memory": false`, E2B's `keep_memory=False`)
//! kills the sandbox's processes on its node and keeps its files; a resume
//! boots it again there from them (same id, generation, access token and
//! environment; a fresh boot with a new boot id). The node knows which
//! kind of pause it holds, so a resume is the same call either way.
//!
//! At a filesystem-only pause the node also packs the sandbox's writable
//! layer with a record `paused-<id>` no team sees (`warren_template::Paused`):
//! both into the shared template store, or, with `--blob-store`, the layer
//! into the blob store and the record back in the pause's answer, which
//! this gateway's PAUSE event carries ([`paused_for_event`]): the
//! scheduler writes it (kind PAUSED) with the PAUSE, fenced alike, as it
//! does for a node's own auto-pause report. A resume whose node cannot be reached
//! (or whose binding is LOST) boots it from that layer on another node
//! instead ([`move_paused`]): the scheduler's fenced `Reassign` gives it
//! a new node and generation, that node creates it from the record with
//! its create's access token, environment, metadata, lifecycle, egress
//! policy and port access (handed the record with `--blob-store`), and
//! gateways' route caches follow the MOVED change. The node that had it
//! deletes its copy as an orphan when it is back. Once the sandbox runs
//! again (moved, or booted on its node) or is killed, its record goes.
//!
//! A data-plane request for a paused sandbox resumes it ([`wake`]) only
//! when it was created with E2B's `autoResume.enabled`; otherwise it is
//! answered 502 "paused" ([`ApiError::sandbox_paused`]) and the sandbox
//! stays paused. A sandbox created with `autoPause` is paused by its node
//! at its end instead of killed (the scheduler's heartbeat answer
//! `to_pause`; the node's `link`).

use super::{catalog, owned};
use crate::auth::Team;
use crate::error::ApiError;
use crate::models::{object, Timeout};
use crate::node_client::NodeError;
use crate::records::Records;
use crate::resolver::Route;
use crate::state::App;
use http::{Response, StatusCode};
use std::sync::Arc;
use warren_core::body::{status as no_content, Body};
use warren_core::node_api::CreateSandbox;
use warren_core::time::now_ms;
use warren_proto::scheduler::v1::{
    Binding, BindingState, EventType, ReassignRequest, RecordAssignmentRequest,
    ReportSandboxEventRequest, SandboxEvent,
};

/// A resumed sandbox's timeout when `POST /resume` names none (E2B's
/// `ResumedSandbox.timeout` default).
pub(super) const DEFAULT_RESUME_TIMEOUT_SECS: u64 = 15;
/// A sandbox's timeout after `connect` without one, or after a data-plane
/// request woke it (E2B's default sandbox timeout).
pub(crate) const WAKE_TIMEOUT_SECS: u64 = 300;

/// `POST /sandboxes/{id}/pause`: 204, 409 when already paused.
pub(super) async fn pause(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let obj = object(body, true)?;
    let keep_memory = match obj.get("memory") {
        None | Some(serde_json::Value::Null) => true,
        Some(serde_json::Value::Bool(b)) => *b,
        Some(_) => {
            return Err(ApiError::new(
                StatusCode::BAD_REQUEST,
                "invalid_argument",
                "field \"memory\" must be a boolean",
            ))
        }
    };
    let b = owned(app, team, id).await?;
    match BindingState::try_from(b.state) {
        Ok(BindingState::Running) => {}
        Ok(BindingState::Paused) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("sandbox {id} is already paused"),
            ))
        }
        Ok(BindingState::Creating) => return Err(ApiError::sandbox_not_ready(id)),
        Ok(BindingState::Lost) => return Err(ApiError::node_down(id)),
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    let how = if keep_memory {
        Change::Freeze
    } else {
        Change::Halt
    };
    change(app, id, &b, how).await?;
    Ok(no_content(StatusCode::NO_CONTENT))
}

/// `POST /sandboxes/{id}/resume`: 201 with the sandbox, 409 when it is not
/// paused (E2B's answers).
pub(super) async fn resume_endpoint(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let t = Timeout::parse(body, false)?;
    let b = owned(app, team, id).await?;
    match BindingState::try_from(b.state) {
        Ok(BindingState::Paused) => {}
        Ok(BindingState::Running) | Ok(BindingState::Creating) => {
            return Err(ApiError::new(
                StatusCode::CONFLICT,
                "conflict",
                format!("sandbox {id} is already running"),
            ))
        }
        Ok(BindingState::Lost) => {
            let b = resume_lost(app, id, &b, t.timeout_secs).await?;
            return super::sandboxes::describe(app, team, &b, StatusCode::CREATED).await;
        }
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    let b = resume(app, id, &b, t.timeout_secs).await?;
    super::sandboxes::describe(app, team, &b, StatusCode::CREATED).await
}

/// Resumes the sandbox a data-plane request found paused at `route`, once
/// however many requests wait: concurrent callers for the same
/// `id@generation` share one resume (and its outcome). The route to proxy
/// to after. A sandbox without auto-resume is not resumed: a 502
/// "paused", unless the scheduler says it was resumed meanwhile (the
/// cached route was behind). Only the paused path pays for this: a cache
/// hit on a running sandbox never gets here.
pub(crate) async fn wake(app: &App, route: &Route) -> Result<Arc<Route>, ApiError> {
    let key = format!("{}@{}", route.sandbox_id, route.generation);
    let id = route.sandbox_id.as_str();
    let woke = app
        .resumes
        .try_get_with(key.clone(), async {
            // Read it again: another gateway, or an earlier wave, may have
            // resumed it already.
            let fresh = app
                .resolver
                .lookup_uncached(id)
                .await
                .map_err(ApiError::from)?;
            if fresh.state != BindingState::Paused {
                app.resolver.learn(fresh.clone()).await;
                return Ok::<_, ApiError>(fresh);
            }
            if !fresh.auto_resume {
                return Err(ApiError::sandbox_paused(id));
            }
            let b = Binding {
                sandbox_id: fresh.sandbox_id.clone(),
                node_id: fresh.node_id.clone(),
                endpoint: fresh.endpoint.clone(),
                generation: fresh.generation,
                team_id: fresh.team_id.clone(),
                lifecycle: Some(warren_proto::scheduler::v1::Lifecycle {
                    auto_pause: false,
                    auto_resume: true,
                }),
                ..Default::default()
            };
            // Never a cold boot: E2B does not auto-resume a sandbox paused
            // filesystem-only (the node answers so, and it stays paused).
            resume_as(app, id, &b, Some(WAKE_TIMEOUT_SECS), Change::Wake).await?;
            tracing::info!(
                sandbox_id = id,
                generation = fresh.generation,
                "resumed by a data-plane request"
            );
            Ok(Arc::new(Route {
                state: BindingState::Running,
                ..(*fresh).clone()
            }))
        })
        .await;
    app.resumes.invalidate(&key).await;
    woke.map_err(|e| (*e).clone())
}

/// Thaws the paused sandbox `b` and gives it `timeout_secs` (default
/// [`DEFAULT_RESUME_TIMEOUT_SECS`]) from now; the binding after.
pub(super) async fn resume(
    app: &App,
    id: &str,
    b: &Binding,
    timeout_secs: Option<u64>,
) -> Result<Binding, ApiError> {
    resume_as(app, id, b, timeout_secs, Change::Resume).await
}

/// [`resume`] as `how` ([`Change::Resume`] or [`Change::Wake`]).
async fn resume_as(
    app: &App,
    id: &str,
    b: &Binding,
    timeout_secs: Option<u64>,
    how: Change,
) -> Result<Binding, ApiError> {
    // The new end first, while it is still paused (paused sandboxes never
    // expire): resumed with the end it had before its pause, long past, the
    // next heartbeat or sweep would expire it before a later set_end came.
    let secs = timeout_secs.unwrap_or(DEFAULT_RESUME_TIMEOUT_SECS) as i64;
    let end_at_ms = now_ms() + secs * 1000;
    let mut after = super::sandboxes::set_end(app, id, end_at_ms).await?;
    match change(app, id, b, how).await {
        // Running on its node again: a filesystem-only pause's record is
        // stale, and gone (the scheduler deletes it with the RESUME; on a
        // shared store its node removed it).
        Ok(()) => {}
        // Its node cannot be reached: booted elsewhere from its paused
        // layer, when it has one.
        Err(e) if how == Change::Resume && e.error_code == "upstream_unreachable" => {
            super::create::report_unreachable(app, &b.node_id, &e.message).await;
            return match move_paused(app, id, b, secs as u64).await? {
                Some(moved) => Ok(moved),
                None => Err(e),
            };
        }
        Err(e) => return Err(e),
    }
    after.state = BindingState::Running as i32;
    Ok(after)
}

/// Resumes the paused sandbox `b` whose binding is LOST (its node's lease
/// ran out) on another node, when its pause left a layer to boot from;
/// else the "node down" answer as before.
pub(super) async fn resume_lost(
    app: &App,
    id: &str,
    b: &Binding,
    timeout_secs: Option<u64>,
) -> Result<Binding, ApiError> {
    if paused_record(app, id, b.generation).await.is_none() {
        return Err(ApiError::node_down(id));
    }
    let secs = timeout_secs.unwrap_or(DEFAULT_RESUME_TIMEOUT_SECS);
    super::sandboxes::set_end(app, id, now_ms() + secs as i64 * 1000).await?;
    move_paused(app, id, b, secs)
        .await?
        .ok_or_else(|| ApiError::node_down(id))
}

/// The paused record of sandbox `id` paused at `generation`, if this
/// gateway's records hold it (the shared store's files, or the
/// scheduler's with `--blob-store`).
async fn paused_record(
    app: &App,
    id: &str,
    generation: u64,
) -> Option<(
    warren_template::Template,
    warren_core::node_api::PausedSettings,
)> {
    let (t, _) = match catalog::get(app, &warren_template::paused_key(id)).await {
        Ok(got) => got?,
        Err(e) => {
            tracing::warn!(sandbox_id = id, error = %e.message, "cannot read the paused record");
            return None;
        }
    };
    let s = t.snapshot.as_ref().filter(|s| s.source_sandbox == id)?;
    let p = s.paused.as_ref().filter(|p| p.generation == generation)?;
    let settings = serde_json::from_value(p.settings.clone()).ok()?;
    Some((t.clone(), settings))
}

/// The paused record a blob store's node answered for sandbox `id`'s
/// filesystem-only pause at `generation` (`record`, a
/// `warren_template::Template` as JSON), as the scheduler stores it, for
/// the PAUSE event to carry: the scheduler writes it (kind PAUSED, no
/// team, in place of an earlier pause's) in the transaction that applies
/// the PAUSE, so a pause it refuses leaves none and a resume right after
/// finds it. Checked first: it must be that sandbox's own record, of that
/// pause; anything else is dropped, logged. Without it the sandbox
/// resumes on its own node only. Its layers' sizes are 0, as a node's
/// report gives them (a paused record counts against no team's bounds).
fn paused_for_event(
    app: &App,
    id: &str,
    generation: u64,
    record: serde_json::Value,
) -> Option<warren_proto::scheduler::v1::TemplateRecord> {
    if !matches!(app.records, Records::Scheduler(_)) {
        // A node on a blob store behind a gateway on a shared store: the
        // record has nowhere to go that the node could read.
        tracing::warn!(
            sandbox_id = id,
            "a paused record from a node, but no --blob-store here; not kept"
        );
        return None;
    }
    let t: warren_template::Template = match serde_json::from_value(record) {
        Ok(t) => t,
        Err(e) => {
            tracing::warn!(sandbox_id = id, error = %e, "the node's paused record does not parse; not kept");
            return None;
        }
    };
    let ours = t.name == warren_template::paused_key(id)
        && t.snapshot.as_ref().is_some_and(|s| {
            s.team.is_empty()
                && s.source_sandbox == id
                && s.paused
                    .as_ref()
                    .is_some_and(|p| p.generation == generation)
        });
    if !ours {
        tracing::warn!(sandbox_id = id, generation, record = %t.name,
            "the node's paused record is not this pause's; not kept");
        return None;
    }
    let kind = crate::records::kind_of(&t, false);
    Some(crate::records::to_record(&t, kind, |_| 0))
}

/// Removes sandbox `id`'s paused record from the scheduler's store, as
/// read (the store's delete notes the layers no record names any more).
/// Best effort.
async fn forget_record(app: &App, id: &str) {
    let key = warren_template::paused_key(id);
    match catalog::get(app, &key).await {
        Ok(Some((t, version)))
            if t.snapshot
                .as_ref()
                .is_some_and(|s| s.source_sandbox == id && s.paused.is_some()) =>
        {
            if let Err(e) = catalog::remove(app, &key, version).await {
                tracing::warn!(sandbox_id = id, error = %e.message, "cannot remove the paused record");
            }
        }
        Ok(_) => {}
        Err(e) => {
            tracing::warn!(sandbox_id = id, error = %e.message, "cannot read the paused record to remove it")
        }
    }
}

/// Boots the filesystem-paused sandbox `b` on another node from the layer
/// its pause packed (see the module doc), running for `secs`; `None` when
/// there is no such layer (nothing changed). The binding after.
async fn move_paused(
    app: &App,
    id: &str,
    b: &Binding,
    secs: u64,
) -> Result<Option<Binding>, ApiError> {
    let Some((record, settings)) = paused_record(app, id, b.generation).await else {
        return Ok(None);
    };
    // With a blob store the node keeps no records: it is handed this one
    // (and knows its own layers from it); else it reads it from the
    // shared store.
    let blobs = matches!(app.records, Records::Scheduler(_));
    let template_record = if blobs {
        Some(serde_json::to_value(&record).map_err(|e| {
            ApiError::internal(format!("cannot encode sandbox {id}'s paused record: {e}"))
        })?)
    } else {
        None
    };
    let placement = app
        .scheduler
        .call("Reassign", |mut c| async move {
            c.reassign(ReassignRequest {
                sandbox_id: id.to_string(),
                node_id: String::new(),
            })
            .await
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    let moved = placement.binding.clone().unwrap_or_default();
    let token = (!moved.access_token.is_empty()).then(|| moved.access_token.clone());
    let create = CreateSandbox {
        sandbox_id: id.to_string(),
        generation: placement.generation,
        template_id: record.name.clone(),
        env_vars: moved.env_vars.clone().into_iter().collect(),
        metadata: moved.metadata.clone().into_iter().collect(),
        traffic_access_token: (settings.private_ports)
            .then(|| super::network::traffic_token(&moved.access_token)),
        access_token: token,
        timeout_secs: Some(secs),
        network: settings.network,
        mask_request_host: settings.mask_request_host,
        egress_rules: settings.egress_rules,
        egress_ca: (!moved.egress_ca.is_empty()).then(|| moved.egress_ca.clone()),
        auto_pause_filesystem_only: settings.auto_pause_filesystem_only,
        template_record,
        // Its volumes come along (a shared store's: the scheduler moved it
        // only to a node with that store).
        volumes: super::volumes::node_mounts(&moved),
    };
    // The new node fetches the pause's layers (and any of the template's
    // it lacks) from the blob store before it boots: as a create from a
    // blob store, it gets that much longer than `--request-timeout`.
    let extra = super::create::ready_time(&record.defaults) + super::create::LAYER_FETCH_TIME;
    if let Err(e) = app.nodes.create(&placement.endpoint, &create, extra).await {
        tracing::warn!(sandbox_id = id, node = %placement.node_id, error = %e,
            "cannot boot the paused sandbox on another node");
        // Whatever it made there goes; the binding stays at the new node
        // (CREATING) and the layer in the store.
        let _ = app
            .nodes
            .delete(&placement.endpoint, id, placement.generation)
            .await;
        return Err(ApiError::new(
            StatusCode::BAD_GATEWAY,
            "resume_failed",
            format!(
                "sandbox {id}'s node {} cannot be reached, and booting it on node {} failed: {e}",
                b.node_id, placement.node_id
            ),
        ));
    }
    let after = app
        .scheduler
        .call("RecordAssignment", |mut c| {
            let node_id = placement.node_id.clone();
            async move {
                c.record_assignment(RecordAssignmentRequest {
                    sandbox_id: id.to_string(),
                    node_id,
                    generation: placement.generation,
                })
                .await
            }
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    tracing::info!(sandbox_id = id, from = %b.node_id, to = %placement.node_id,
        generation = placement.generation, "paused sandbox resumed on another node");
    // Running there now: its pause's record is done with (on a shared
    // store the new node removed it).
    if blobs {
        forget_record(app, id).await;
    }
    app.resolver
        .learn(Arc::new(Route::of_binding(&after, BindingState::Running)))
        .await;
    Ok(Some(after))
}

/// Removes what a filesystem-only pause of sandbox `id` left (its record,
/// and the layer nothing stacks yet): the sandbox is gone for good. Best
/// effort. With `--blob-store` the record is the scheduler's: removed as
/// read (`catalog::remove`, which notes its layers as unused), should the
/// binding's removal not have taken it already.
pub(super) async fn drop_paused(app: &App, id: &str) {
    if matches!(app.records, Records::Scheduler(_)) {
        return forget_record(app, id).await;
    }
    let Ok(store) = super::snapshots::store(app) else {
        return;
    };
    let Ok(t) = store.get(&warren_template::paused_key(id)) else {
        return;
    };
    let Some(p) = t
        .snapshot
        .as_ref()
        .filter(|s| s.source_sandbox == id)
        .and_then(|s| s.paused.as_ref())
    else {
        return;
    };
    if let Err(e) = store.remove(&t.name) {
        tracing::warn!(sandbox_id = id, error = %e, "cannot remove the paused record");
        return;
    }
    if let Some(l) = t.layers.last().filter(|l| p.own_layers.contains(l)) {
        if let Err(e) = store.remove_layer(l) {
            tracing::warn!(sandbox_id = id, layer = %l, error = %e, "cannot remove the paused layer");
        }
    }
}

/// What [`change`] does on the node.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
enum Change {
    /// Pause with memory kept: freeze in place.
    Freeze,
    /// Pause filesystem-only: the processes are killed, the files kept.
    Halt,
    /// Thaw, or boot again from the kept files (the node knows which).
    Resume,
    /// A data-plane request's auto-resume: thaw only; a sandbox paused
    /// filesystem-only stays paused (`502` "paused").
    Wake,
}

/// The node pauses (or resumes), then the fenced state change; a change
/// the scheduler refuses (the sandbox moved or went meanwhile) is undone on
/// the node and answered as a conflict.
async fn change(app: &App, id: &str, b: &Binding, how: Change) -> Result<(), ApiError> {
    let pause = matches!(how, Change::Freeze | Change::Halt);
    let keep_memory = how != Change::Halt;
    let cold_boot = how != Change::Wake;
    let record = match app
        .nodes
        .set_paused(&b.endpoint, id, b.generation, pause, keep_memory, cold_boot)
        .await
    {
        Ok(record) => record,
        Err(NodeError::Status {
            not_hosted: true, ..
        }) => return Err(ApiError::sandbox_not_found(id)),
        Err(NodeError::Status {
            status, message, ..
        }) if status == StatusCode::CONFLICT
            && message.contains(warren_core::node_api::NOT_RESUMABLE) =>
        {
            return Err(ApiError::sandbox_paused_filesystem_only(id))
        }
        Err(NodeError::Status {
            status, message, ..
        }) if status == StatusCode::NOT_IMPLEMENTED || status == StatusCode::CONFLICT => {
            let code = if status == StatusCode::CONFLICT {
                "conflict"
            } else {
                "not_implemented"
            };
            return Err(ApiError::new(status, code, message));
        }
        // No answer at all: the connection never came up, or a pooled one
        // went dead (`--dead-node-timeout`) or was reset. Either way the
        // node cannot be reached now, and a resume boots the sandbox
        // elsewhere from its paused layer when it has one: the scheduler's
        // Reassign fences the copy the cut-off node may still hold (it is
        // an orphan there once the node is back).
        Err(NodeError::Unreachable { .. }) => return Err(ApiError::upstream_unreachable()),
        // It took the request and said nothing in time: unreachable it is
        // not (a resume elsewhere could run the sandbox twice).
        Err(NodeError::Timeout { timeout, .. }) => {
            return Err(ApiError::upstream_timeout(
                if pause { "pause" } else { "resume" },
                timeout,
            ))
        }
        Err(e) => {
            return Err(ApiError::internal(format!(
                "cannot {} sandbox {id}: {e}",
                if pause { "pause" } else { "resume" }
            )))
        }
    };
    let kind = if pause {
        EventType::Pause
    } else {
        EventType::Resume
    };
    let paused_record = record.and_then(|r| paused_for_event(app, id, b.generation, r));
    let report = |paused_record: Option<warren_proto::scheduler::v1::TemplateRecord>| {
        app.scheduler.call("ReportSandboxEvent", move |mut c| {
            let paused_record = paused_record.clone();
            async move {
                c.report_sandbox_event(ReportSandboxEventRequest {
                    node_id: b.node_id.clone(),
                    events: vec![SandboxEvent {
                        sandbox_id: id.to_string(),
                        generation: b.generation,
                        r#type: kind as i32,
                        paused_record,
                        logs: Vec::new(),
                    }],
                })
                .await
            }
        })
    };
    let with_record = paused_record.is_some();
    let resp = match report(paused_record).await {
        // A record the scheduler refuses must not cost the pause, which
        // has happened on the node: reported again without it.
        Err(s) if with_record && s.code() == tonic::Code::InvalidArgument => {
            tracing::warn!(sandbox_id = id, status = %s,
                "the scheduler refused the paused record; the sandbox can resume on its node only");
            report(None).await
        }
        r => r,
    }
    .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    if let Some(r) = resp.results.iter().find(|r| !r.applied) {
        // Put the node back as the scheduler still has it.
        let _ = app
            .nodes
            .set_paused(&b.endpoint, id, b.generation, !pause, true, true)
            .await;
        return Err(ApiError::new(
            StatusCode::CONFLICT,
            "conflict",
            format!(
                "sandbox {id} changed while being paused or resumed: {}",
                r.reason
            ),
        ));
    }
    // This gateway routes by the new state at once; the others hear it
    // from the scheduler's watch.
    let state = if pause {
        BindingState::Paused
    } else {
        BindingState::Running
    };
    app.resolver
        .learn(Arc::new(Route::of_binding(b, state)))
        .await;
    Ok(())
}
