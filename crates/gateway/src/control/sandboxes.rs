//! Reading and changing existing sandboxes: get, list (v1 and v2), kill,
//! timeout and connect.

use super::{access_token, owned, reply};
use crate::auth::Team;
use crate::error::ApiError;
use crate::models::{parse_metadata_filter, Sandbox, SandboxDetail, SandboxLifecycle, Timeout};
use crate::node_client::NodeError;
use crate::state::App;
use http::{header, HeaderValue, Response, StatusCode};
use std::collections::HashMap;
use warren_core::body::{status as no_content, Body};
use warren_core::time::{now_ms, rfc3339_ms};
use warren_proto::scheduler::v1::{
    Binding, BindingState, EventType, ListOrder, ListSandboxesRequest, ReportSandboxEventRequest,
    SandboxEvent, SetTimeoutRequest,
};

/// What the API reports when the scheduler has no resources for a sandbox
/// (the built-in template's sizes).
const DEFAULT_CPU_COUNT: u32 = 2;
const DEFAULT_MEMORY_MB: u32 = 512;
/// Largest page `GET /v2/sandboxes` returns (E2B's limit).
const MAX_PAGE: u32 = 100;
/// How many times a kill re-reads a binding that moved under it.
const KILL_ATTEMPTS: usize = 3;

/// E2B's `SandboxState` has only `running` and `paused`; warren's other
/// states are running as far as a client can tell (a lost sandbox answers
/// 502 on the data plane, which says more than a new state name would).
fn state_name(state: i32) -> &'static str {
    match BindingState::try_from(state) {
        Ok(BindingState::Paused) => "paused",
        _ => "running",
    }
}

fn detail(app: &App, b: &Binding, envd_version: String, full: bool) -> SandboxDetail {
    let res = b.resources.unwrap_or_default();
    SandboxDetail {
        template_id: b.template_id.clone(),
        sandbox_id: b.sandbox_id.clone(),
        client_id: b.node_id.clone(),
        started_at: rfc3339_ms(b.started_at_ms),
        end_at: rfc3339_ms(b.end_at_ms),
        envd_version,
        cpu_count: if res.cpu_count == 0 {
            DEFAULT_CPU_COUNT
        } else {
            res.cpu_count
        },
        memory_mb: if res.memory_mb == 0 {
            DEFAULT_MEMORY_MB
        } else {
            res.memory_mb
        },
        disk_size_mb: 0,
        state: state_name(b.state),
        metadata: b.metadata.clone(),
        envd_access_token: (full && !b.access_token.is_empty()).then(|| b.access_token.clone()),
        domain: full.then(|| app.settings.advertised_domain.clone()),
        lifecycle: full.then(|| {
            let l = b.lifecycle.unwrap_or_default();
            SandboxLifecycle {
                auto_resume: l.auto_resume,
                on_timeout: if l.auto_pause { "pause" } else { "kill" },
            }
        }),
        allow_internet_access: None,
        network: None,
        volume_mounts: full.then(|| {
            b.volume_mounts
                .iter()
                .map(|m| crate::models::VolumeMountJson {
                    name: m.name.clone(),
                    path: m.path.clone(),
                })
                .collect()
        }),
    }
}

/// `GET /sandboxes/{id}`.
pub(super) async fn get(app: &App, team: &Team, id: &str) -> Result<Response<Body>, ApiError> {
    let mut b = owned(app, team, id).await?;
    b.access_token = access_token(app, team, id).await?;
    let envd_version = app.envd_version(&b.endpoint).await;
    let mut d = detail(app, &b, envd_version, true);
    if let Some(n) = super::network::current(app, &b).await {
        d.allow_internet_access = Some(n.policy.allow_internet);
        d.network = Some(n.into());
    }
    reply(StatusCode::OK, &d)
}

fn query_pairs(query: &str) -> Vec<(String, String)> {
    form_urlencoded::parse(query.as_bytes())
        .map(|(k, v)| (k.into_owned(), v.into_owned()))
        .collect()
}

/// Filters that `ListSandboxes` cannot apply, applied per page.
#[derive(Default)]
struct LocalFilter {
    template: Option<String>,
    started_after_ms: Option<i64>,
}

impl LocalFilter {
    /// Takes `key=value` when it is one of these filters (`Ok(true)`); a
    /// value that is not usable is a 400 naming the parameter, never a
    /// filter silently dropped.
    fn take(&mut self, key: &str, value: &str) -> Result<bool, ApiError> {
        match key {
            "template" if !value.is_empty() => self.template = Some(value.to_string()),
            "template" => {}
            "startedAfter" => self.started_after_ms = Some(parse_started_after(value)?),
            _ => return Ok(false),
        }
        Ok(true)
    }

    fn keeps(&self, b: &Binding) -> bool {
        self.template.as_ref().is_none_or(|t| &b.template_id == t)
            && self.started_after_ms.is_none_or(|t| b.started_at_ms >= t)
    }
}

/// Sandboxes being created are not listed: they are not usable yet.
fn listed_states(running: bool, paused: bool) -> Vec<i32> {
    let mut states = Vec::new();
    if running {
        states.extend([
            BindingState::Running as i32,
            BindingState::Lost as i32,
            BindingState::Expiring as i32,
        ]);
    }
    if paused {
        states.push(BindingState::Paused as i32);
    }
    states
}

async fn list_page(
    app: &App,
    req: ListSandboxesRequest,
) -> Result<(Vec<Binding>, String), ApiError> {
    let resp = app
        .scheduler
        .call("ListSandboxes", |mut c| {
            let req = req.clone();
            async move { c.list_sandboxes(req).await }
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, None))?;
    Ok((resp.sandboxes, resp.next_page_token))
}

async fn listed(app: &App, bindings: &[Binding]) -> Vec<SandboxDetail> {
    let mut out = Vec::with_capacity(bindings.len());
    for b in bindings {
        let v = app.cached_envd_version(&b.endpoint).await;
        out.push(detail(app, b, v, false));
    }
    out
}

/// `GET /sandboxes` (deprecated v1): every running sandbox of the team.
pub(super) async fn list_v1(
    app: &App,
    team: &Team,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let mut metadata = HashMap::new();
    // Not in E2B's v1, but the same filters as v2 when given: a client that
    // sends them means them.
    let mut local = LocalFilter::default();
    for (k, v) in query_pairs(query) {
        if k == "metadata" {
            metadata = parse_metadata_filter(&v);
        } else {
            local.take(&k, &v)?;
        }
    }
    let mut all = Vec::new();
    let mut token = String::new();
    loop {
        let (page, next) = list_page(
            app,
            ListSandboxesRequest {
                team_id: team.0.clone(),
                states: listed_states(true, false),
                metadata: metadata.clone(),
                page_size: 1000,
                page_token: token,
                node_id: String::new(),
                order: ListOrder::StartedDesc as i32,
            },
        )
        .await?;
        all.extend(page.into_iter().filter(|b| local.keeps(b)));
        if next.is_empty() {
            break;
        }
        token = next;
    }
    reply(StatusCode::OK, &listed(app, &all).await)
}

/// `GET /v2/sandboxes`: one page, `x-next-token` naming the next.
pub(super) async fn list_v2(
    app: &App,
    team: &Team,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let bad = |m: String| ApiError::bad_request("invalid_query", m);
    let mut metadata = HashMap::new();
    let (mut running, mut paused) = (true, true);
    let mut limit = MAX_PAGE;
    let mut token = String::new();
    let mut local = LocalFilter::default();
    // E2B's default: newest first.
    let mut order = ListOrder::StartedDesc;
    for (k, v) in query_pairs(query) {
        match k.as_str() {
            "metadata" => metadata = parse_metadata_filter(&v),
            "state" => {
                (running, paused) = (false, false);
                for s in v.split(',').map(str::trim).filter(|s| !s.is_empty()) {
                    match s {
                        "running" => running = true,
                        "paused" => paused = true,
                        other => {
                            return Err(bad(format!(
                                "unknown state {other:?} (use running, paused)"
                            )))
                        }
                    }
                }
            }
            "limit" => {
                limit = v
                    .parse()
                    .ok()
                    .filter(|n| (1..=MAX_PAGE).contains(n))
                    .ok_or_else(|| bad(format!("limit must be between 1 and {MAX_PAGE}")))?;
            }
            "nextToken" => token = v,
            "order" => {
                order = match v.as_str() {
                    "desc" => ListOrder::StartedDesc,
                    "asc" => ListOrder::StartedAsc,
                    _ => return Err(bad(format!("order {v:?} must be asc or desc"))),
                }
            }
            other => {
                local.take(other, &v)?;
            }
        }
    }
    let (page, next) = list_page(
        app,
        ListSandboxesRequest {
            team_id: team.0.clone(),
            states: listed_states(running, paused),
            metadata,
            page_size: limit,
            page_token: token,
            node_id: String::new(),
            order: order as i32,
        },
    )
    .await?;
    let kept: Vec<Binding> = page.into_iter().filter(|b| local.keeps(b)).collect();
    let mut r = warren_core::body::json(StatusCode::OK, &listed(app, &kept).await);
    if !next.is_empty() {
        if let Ok(v) = HeaderValue::from_str(&next) {
            r.headers_mut().insert("x-next-token", v);
        }
    }
    Ok(r)
}

/// `DELETE /sandboxes/{id}`: node delete, then the fenced scheduler delete.
pub(super) async fn kill(app: &App, team: &Team, id: &str) -> Result<Response<Body>, ApiError> {
    // The generation our last node delete was for.
    let mut deleted = None;
    for _ in 0..KILL_ATTEMPTS {
        let b = match owned(app, team, id).await {
            Ok(b) => b,
            // Gone after our node delete: the node reported the DELETE
            // itself before we did. That is the kill succeeding.
            Err(e) => match deleted {
                Some(generation) if e.status == StatusCode::NOT_FOUND => {
                    forget(app, id, generation).await;
                    super::pause::drop_paused(app, id).await;
                    return Ok(no_content(StatusCode::NO_CONTENT));
                }
                _ => return Err(e),
            },
        };
        deleted = Some(b.generation);
        // A lost node cannot be asked; an unreachable one will kill the
        // sandbox as an orphan when it comes back (its roster no longer
        // matches the scheduler). Either way the binding goes. The node's
        // answer is the sandbox's log at its end: this DELETE report
        // carries it (the node's own report does too; whichever applies
        // first keeps it).
        let mut logs = Vec::new();
        if b.state != BindingState::Lost as i32 {
            match app.nodes.delete(&b.endpoint, id, b.generation).await {
                Ok(entries) => logs = super::logs::to_event(entries),
                Err(NodeError::Status {
                    not_hosted: true, ..
                }) => {}
                Err(e) => {
                    tracing::warn!(sandbox = id, error = %e, "node delete failed; removing the binding anyway")
                }
            }
        }
        let resp = app
            .scheduler
            .call("ReportSandboxEvent", |mut c| {
                let (b, logs) = (&b, logs.clone());
                async move {
                    c.report_sandbox_event(ReportSandboxEventRequest {
                        node_id: b.node_id.clone(),
                        events: vec![SandboxEvent {
                            sandbox_id: id.to_string(),
                            generation: b.generation,
                            r#type: EventType::Delete as i32,
                            paused_record: None,
                            logs,
                        }],
                    })
                    .await
                }
            })
            .await
            .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
        // Not applied: the binding is gone (the node reported the delete
        // first) or moved (new node or generation) since our read; read it
        // again to tell which, and delete the new one.
        if resp.results.iter().all(|r| r.applied) {
            forget(app, id, b.generation).await;
            super::pause::drop_paused(app, id).await;
            return Ok(no_content(StatusCode::NO_CONTENT));
        }
    }
    Err(ApiError::new(
        StatusCode::CONFLICT,
        "conflict",
        format!("sandbox {id} kept moving while being killed; retry"),
    ))
}

/// The fenced removal of `id` at `generation` succeeded: this gateway
/// forgets the route now; the others hear it from the scheduler's watch.
async fn forget(app: &App, id: &str, generation: u64) {
    let gone = crate::resolver::Route {
        sandbox_id: id.to_string(),
        node_id: String::new(),
        endpoint: String::new(),
        generation,
        state: BindingState::Unspecified,
        team_id: String::new(),
        auto_resume: false,
    };
    app.resolver
        .evict(&gone, crate::resolver::EvictReason::Delete)
        .await;
}

pub(super) async fn set_end(app: &App, id: &str, end_at_ms: i64) -> Result<Binding, ApiError> {
    app.scheduler
        .call("SetTimeout", |mut c| async move {
            c.set_timeout(SetTimeoutRequest {
                sandbox_id: id.to_string(),
                end_at_ms,
            })
            .await
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))
}

/// `POST /sandboxes/{id}/timeout`: the sandbox ends `timeout` seconds from now.
pub(super) async fn set_timeout(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
) -> Result<Response<Body>, ApiError> {
    let t = Timeout::parse(body, true)?;
    let before = owned(app, team, id).await?;
    let secs = t.timeout_secs.unwrap_or(0) as i64;
    let after = set_end(app, id, now_ms() + secs * 1000).await?;
    if after.end_at_ms < before.end_at_ms {
        // The node kills at the end its scheduler names, and hears of a
        // new end at its next heartbeat; a shortened one may come sooner,
        // so it is asked to heartbeat now (best effort: the heartbeat
        // after that, or the sweep, enforces it anyway).
        let (nodes, endpoint) = (app.nodes.clone(), after.endpoint.clone());
        let sandbox = id.to_string();
        tokio::spawn(async move {
            if let Err(e) = nodes.heartbeat_now(&endpoint).await {
                tracing::debug!(sandbox, error = %e, "asking the node to heartbeat failed");
            }
        });
    }
    Ok(no_content(StatusCode::NO_CONTENT))
}

/// `POST /sandboxes/{id}/connect` (timeout required) and
/// `POST /v2/sandboxes/{id}/connect` (optional): a running sandbox's
/// details, its end time only ever extended; a paused one is resumed first
/// (201, as E2B answers).
pub(super) async fn connect(
    app: &App,
    team: &Team,
    id: &str,
    body: &[u8],
    v2: bool,
) -> Result<Response<Body>, ApiError> {
    let t = Timeout::parse(body, !v2)?;
    let mut b = owned(app, team, id).await?;
    match BindingState::try_from(b.state) {
        Ok(BindingState::Running) | Ok(BindingState::Creating) => {}
        Ok(BindingState::Lost) => {
            b = super::pause::resume_lost(app, id, &b, t.timeout_secs).await?;
            return describe(app, team, &b, StatusCode::CREATED).await;
        }
        Ok(BindingState::Paused) => {
            b = super::pause::resume(app, id, &b, t.timeout_secs).await?;
            return describe(app, team, &b, StatusCode::CREATED).await;
        }
        _ => return Err(ApiError::sandbox_not_found(id)),
    }
    if let Some(secs) = t.timeout_secs {
        let wanted = now_ms() + secs as i64 * 1000;
        if wanted > b.end_at_ms {
            b = set_end(app, id, wanted).await?;
        }
    }
    describe(app, team, &b, StatusCode::OK).await
}

/// The `Sandbox` answer (connect, resume) for `team`'s binding `b`.
pub(super) async fn describe(
    app: &App,
    team: &Team,
    b: &Binding,
    status: StatusCode,
) -> Result<Response<Body>, ApiError> {
    let id = b.sandbox_id.as_str();
    let token = access_token(app, team, id).await?;
    let envd_version = app.envd_version(&b.endpoint).await;
    // E2B hands the traffic access token out again at connect.
    let traffic = match super::network::current(app, b).await {
        Some(n) if !n.allow_public_traffic => Some(super::network::traffic_token(&token)),
        _ => None,
    };
    let json = Sandbox {
        template_id: b.template_id.clone(),
        sandbox_id: b.sandbox_id.clone(),
        client_id: b.node_id.clone(),
        envd_version,
        envd_access_token: (!token.is_empty()).then_some(token),
        traffic_access_token: traffic,
        domain: app.settings.advertised_domain.clone(),
    };
    let mut r = warren_core::body::json(status, &json);
    r.headers_mut()
        .insert(header::CACHE_CONTROL, HeaderValue::from_static("no-store"));
    Ok(r)
}

/// `startedAfter` (E2B: `format: date-time`, RFC 3339 with an offset) as
/// Unix milliseconds; anything else is a 400 that names the parameter.
pub(super) fn parse_started_after(v: &str) -> Result<i64, ApiError> {
    v.trim()
        .parse::<jiff::Timestamp>()
        .map(|t| t.as_millisecond())
        .map_err(|e| {
            ApiError::bad_request(
                "invalid_query",
                format!(
                    "startedAfter {v:?} is not an RFC 3339 timestamp with an offset, \
                     such as 2024-01-02T03:04:05Z ({e})"
                ),
            )
        })
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn started_after_is_rfc3339_or_a_400() {
        let ms = 1_796_000_000_123;
        assert_eq!(parse_started_after(&rfc3339_ms(ms)).unwrap(), ms);
        assert_eq!(parse_started_after("1970-01-01T01:00:00+01:00").unwrap(), 0);
        // What Python's `datetime.isoformat()` sends (the e2b SDK).
        assert_eq!(
            parse_started_after("1970-01-01T00:00:01.500000+00:00").unwrap(),
            1500
        );
        for bad in [
            "",
            "yesterday",
            "1700000000",
            "2024-01-01",
            "2024-01-01T00:00",
            "2024-01-01T00:00:00",
            "2024-02-31T00:00:00Z",
            "2024-01-01T00:00:99Z",
            "2024-01-01T00:00:NaNZ",
            "2024-01-01T25:00:00Z",
            "2024-01-01T00:00:00+99:00",
        ] {
            let e = parse_started_after(bad).expect_err(bad);
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
            assert!(e.message.contains("startedAfter"), "{bad}: {}", e.message);
        }
    }
}
