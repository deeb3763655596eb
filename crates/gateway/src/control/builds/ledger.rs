//! Template builds as the scheduler's store keeps them (`records.proto`'s
//! builds), so any gateway answers any build's status and logs, and a
//! restarted gateway forgets nothing:
//!
//! - a request is a waiting build (`CreateBuild`), gone `start_ttl` after
//!   it if never started;
//! - a start claims it (`ClaimBuild`) for this gateway ([`Builds::owner`],
//!   an id of this process) under a lease of `--build-lease`, which the
//!   running build renews every third of it; a build whose gateway stops
//!   renewing (it died, or lost every scheduler replica) is failed by the
//!   scheduler's sweep once the lease runs out, its reason naming the
//!   gateway: it is never taken over (its build sandbox is the dead
//!   gateway's, and its steps may have run halfway);
//! - its log is appended in batches (every [`FLUSH`] or [`BATCH`] lines),
//!   each numbered, so a batch the scheduler client sends twice (a
//!   failover) is appended once;
//! - its end (`UpdateBuildStatus`) is READY or ERROR with the reason and
//!   step.
//!
//! The bounds ([`BuildLimits`], the `--build-*` flags) are the store's to
//! check, in the writing transaction, so they hold across gateways: per
//! team at most `team_count` builds held (a request past it drops the
//! team's oldest finished build, and is refused, 429 naming the flag, only
//! when all are waiting or running), all teams at most `total_count`; a
//! build's log at most `log_max_bytes`, a team's at most `log_team_bytes`
//! (each line counted with 64 bytes on top of its text; the oldest
//! finished builds' logs go first; the log says what was dropped).

use super::super::reply;
use crate::error::ApiError;
use crate::limits::BuildLimits;
use http::{Response, StatusCode};
use std::sync::Arc;
use std::time::Duration;
use tokio::sync::mpsc;
use warren_core::body::Body;
use warren_proto::client::Scheduler;
use warren_proto::scheduler::v1 as pb;

/// How many of the last log lines a failed build's reason repeats.
const REASON_LINES: u32 = 20;
/// Longest a log line waits before it is sent.
const FLUSH: Duration = Duration::from_millis(250);
/// Most lines one append carries (the scheduler's bound).
const BATCH: usize = 1000;

/// What a request asked for, kept with the build (its `request_json`).
#[derive(Debug, Clone, Default, serde::Serialize, serde::Deserialize)]
pub(super) struct Asked {
    pub name: String,
    pub tags: Vec<String>,
    pub cpu_count: u32,
    pub memory_mb: u64,
}

/// E2B's `LogEntry`.
#[derive(Debug, Clone, serde::Serialize)]
struct LogEntry {
    timestamp: String,
    level: String,
    message: String,
}

impl LogEntry {
    fn of(l: pb::LogLine) -> LogEntry {
        LogEntry {
            timestamp: warren_core::time::rfc3339_ms(l.at_ms),
            level: l.level,
            message: l.message,
        }
    }
}

/// E2B's `BuildStatusReason`.
#[derive(Debug, Clone, serde::Serialize)]
struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
}

/// E2B's `TemplateBuildInfo`.
#[derive(Debug, serde::Serialize)]
struct BuildInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: &'static str,
    logs: Vec<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

/// Which log lines a status answer carries (E2B's `logsOffset`, `limit`,
/// `level`).
#[derive(Debug, Clone)]
pub(super) struct Page {
    pub offset: u64,
    pub limit: u32,
    pub level: Option<String>,
}

pub(super) fn build_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "build_not_found",
        format!("template build {id:?} not found"),
    )
}

fn reason_of(s: &tonic::Status) -> &str {
    s.metadata()
        .get(warren_proto::REASON_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

fn bound_of(s: &tonic::Status) -> &str {
    s.metadata()
        .get(warren_proto::BOUND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("")
}

/// A build RPC's refusal for the client: 404 for a build that is not the
/// team's, the scheduler's own mapping for the rest.
fn refused(s: &tonic::Status, build_id: &str) -> ApiError {
    match s.code() {
        tonic::Code::NotFound => build_not_found(build_id),
        _ => ApiError::from_scheduler(s, None),
    }
}

/// The builds, in the scheduler's store.
pub(crate) struct Builds {
    scheduler: Arc<Scheduler>,
    limits: BuildLimits,
    /// This gateway process, as the builds it claims name it.
    owner: String,
}

impl Builds {
    pub(crate) fn new(scheduler: Arc<Scheduler>, limits: BuildLimits) -> Builds {
        let host = std::fs::read_to_string("/proc/sys/kernel/hostname").unwrap_or_default();
        Builds {
            scheduler,
            limits,
            owner: format!(
                "gateway {}/{} ({})",
                host.trim(),
                std::process::id(),
                warren_core::id::random_token(8)
            ),
        }
    }

    /// `POST /v3/templates`: a waiting build of `team`'s.
    pub(super) async fn request(
        &self,
        build_id: &str,
        team: &str,
        asked: &Asked,
    ) -> Result<(), ApiError> {
        let l = self.limits;
        let req = pb::CreateBuildRequest {
            build_id: build_id.to_string(),
            team_id: team.to_string(),
            template_name: asked.name.clone(),
            request_json: serde_json::to_string(asked).map_err(|e| {
                ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", e.to_string())
            })?,
            start_ttl_ms: l.start_ttl.as_millis() as u64,
            retention_ms: l.retention.as_millis() as u64,
            bounds: Some(pb::BuildBounds {
                max_team_builds: l.team_count as u64,
                max_total_builds: l.total_count as u64,
            }),
        };
        let made = self
            .scheduler
            .call("CreateBuild", |mut c| {
                let req = req.clone();
                async move { c.create_build(req).await }
            })
            .await;
        match made {
            Ok(_) => Ok(()),
            Err(s) if s.code() == tonic::Code::ResourceExhausted => {
                let m = if bound_of(&s) == warren_proto::BOUND_TOTAL_BUILDS {
                    format!(
                        "{} template builds are held, all waiting or running, the limit \
                         (--build-total-count); try again later",
                        l.total_count
                    )
                } else {
                    format!(
                        "team {team} has {} template builds waiting or running, its limit \
                         (--build-team-count); start or finish one first, or wait until the \
                         requested ones expire (--build-start-ttl {:?})",
                        l.team_count, l.start_ttl
                    )
                };
                Err(ApiError::over_limit("too_many_builds", m))
            }
            Err(s) => Err(refused(&s, build_id)),
        }
    }

    /// `POST /v2/templates/{id}/builds/{buildID}`: claims the waiting
    /// build for this gateway with its steps; what was asked, and the
    /// uploads its COPY steps read (in the order of `hashes`).
    pub(super) async fn claim(
        &self,
        build_id: &str,
        team: &str,
        name: &str,
        plan_json: String,
        hashes: Vec<String>,
    ) -> Result<(Asked, Vec<pb::Upload>), ApiError> {
        let req = pb::ClaimBuildRequest {
            build_id: build_id.to_string(),
            team_id: team.to_string(),
            template_name: name.to_string(),
            owner: self.owner.clone(),
            lease_ms: self.limits.lease.as_millis() as u64,
            plan_json,
            upload_hashes: hashes,
        };
        let claimed = self
            .scheduler
            .call("ClaimBuild", |mut c| {
                let req = req.clone();
                async move { c.claim_build(req).await }
            })
            .await;
        let claimed = match claimed {
            Ok(c) => c,
            Err(s) if reason_of(&s) == warren_proto::REASON_BUILD_STARTED => {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "build_started",
                    format!("template build {build_id} has already started"),
                ))
            }
            Err(s) if reason_of(&s) == warren_proto::REASON_UPLOAD_MISSING => {
                return Err(ApiError::bad_request(
                    "files_not_uploaded",
                    format!(
                        "{} (COPY's files are uploaded before the build starts, through \
                         GET /templates/{{id}}/files/{{hash}})",
                        s.message()
                    ),
                ))
            }
            Err(s) => return Err(refused(&s, build_id)),
        };
        let build = claimed.build.unwrap_or_default();
        let asked = serde_json::from_str(&build.request_json).map_err(|e| {
            ApiError::new(
                StatusCode::INTERNAL_SERVER_ERROR,
                "internal",
                format!("template build {build_id}'s request is unreadable: {e}"),
            )
        })?;
        Ok((asked, claimed.uploads))
    }

    /// The log and lease of a claimed build, kept by a task of its own
    /// until [`Running::finish`].
    pub(super) fn running(self: &Arc<Self>, build_id: &str) -> Running {
        let (tx, rx) = mpsc::unbounded_channel();
        let keeper = tokio::spawn(self.clone().keep(build_id.to_string(), rx));
        Running {
            builds: self.clone(),
            build_id: build_id.to_string(),
            tx,
            keeper,
        }
    }

    /// Sends the log in batches and renews the lease, until the channel
    /// closes (after a last batch).
    async fn keep(self: Arc<Self>, build_id: String, mut rx: mpsc::UnboundedReceiver<pb::LogLine>) {
        let renew_every = self.limits.lease / 3;
        let mut renew =
            tokio::time::interval_at(tokio::time::Instant::now() + renew_every, renew_every);
        let mut flush = tokio::time::interval(FLUSH);
        let (mut pending, mut batch, mut open) = (Vec::new(), 0u64, true);
        while open {
            tokio::select! {
                line = rx.recv() => match line {
                    Some(l) => {
                        pending.push(l);
                        if pending.len() < BATCH {
                            continue;
                        }
                    }
                    None => open = false,
                },
                _ = flush.tick() => {}
                _ = renew.tick() => {
                    self.renew(&build_id).await;
                    continue;
                }
            }
            if !pending.is_empty() {
                batch += 1;
                self.append(&build_id, std::mem::take(&mut pending), batch)
                    .await;
            }
        }
    }

    async fn renew(&self, build_id: &str) {
        let req = pb::RenewBuildLeaseRequest {
            build_id: build_id.to_string(),
            owner: self.owner.clone(),
            lease_ms: self.limits.lease.as_millis() as u64,
        };
        if let Err(s) = self
            .scheduler
            .call("RenewBuildLease", |mut c| {
                let req = req.clone();
                async move { c.renew_build_lease(req).await }
            })
            .await
        {
            tracing::warn!(build = build_id, error = %s.message(), "cannot renew a template build's lease");
        }
    }

    async fn append(&self, build_id: &str, lines: Vec<pb::LogLine>, batch: u64) {
        let l = self.limits;
        let req = pb::AppendBuildLogRequest {
            build_id: build_id.to_string(),
            owner: self.owner.clone(),
            lines,
            bounds: Some(pb::LogBounds {
                max_build_bytes: l.log_max_bytes,
                max_team_bytes: l.log_team_bytes,
                build_bound_name: "--build-log-max-bytes".into(),
                team_bound_name: "--build-log-team-bytes".into(),
            }),
            batch,
        };
        if let Err(s) = self
            .scheduler
            .call("AppendBuildLog", |mut c| {
                let req = req.clone();
                async move { c.append_build_log(req).await }
            })
            .await
        {
            tracing::warn!(build = build_id, error = %s.message(), "cannot append to a template build's log");
        }
    }

    /// `GET /templates/{id}/builds/{buildID}/status`: the build of the
    /// team's template `name`, with the page of its log asked for.
    pub(super) async fn status(
        &self,
        build_id: &str,
        team: &str,
        name: &str,
        page: &Page,
    ) -> Result<Response<Body>, ApiError> {
        let get = pb::GetBuildRequest {
            build_id: build_id.to_string(),
            team_id: team.to_string(),
        };
        let b = self
            .scheduler
            .call("GetBuild", |mut c| {
                let req = get.clone();
                async move { c.get_build(req).await }
            })
            .await
            .map_err(|s| refused(&s, build_id))?;
        if b.template_name != name {
            return Err(build_not_found(build_id));
        }
        let rank = |l: &str| {
            ["debug", "info", "warn", "error"]
                .iter()
                .position(|x| *x == l)
        };
        let min = page.level.as_deref().and_then(rank).unwrap_or(0);
        let entries: Vec<LogEntry> = self
            .read_log(build_id, team, page.offset, page.limit)
            .await?
            .into_iter()
            .filter(|e| rank(&e.level).unwrap_or(0) >= min)
            .map(LogEntry::of)
            .collect();
        let status = match pb::BuildStatus::try_from(b.status) {
            Ok(pb::BuildStatus::Building) => "building",
            Ok(pb::BuildStatus::Ready) => "ready",
            Ok(pb::BuildStatus::Error) => "error",
            _ => "waiting",
        };
        let reason = if status == "error" {
            let from = b.log_next_seq.saturating_sub(REASON_LINES as u64);
            Some(Reason {
                message: b.reason_message.clone(),
                step: (!b.reason_step.is_empty()).then(|| b.reason_step.clone()),
                log_entries: self
                    .read_log(build_id, team, from, REASON_LINES)
                    .await?
                    .into_iter()
                    .map(LogEntry::of)
                    .collect(),
            })
        } else {
            None
        };
        reply(
            StatusCode::OK,
            &BuildInfo {
                template_id: b.template_name,
                build_id: build_id.to_string(),
                status,
                logs: entries.iter().map(|e| e.message.clone()).collect(),
                log_entries: entries,
                reason,
            },
        )
    }

    /// The team's build `build_id` (404 for any other).
    pub(in crate::control) async fn get(
        &self,
        build_id: &str,
        team: &str,
    ) -> Result<pb::Build, ApiError> {
        let get = pb::GetBuildRequest {
            build_id: build_id.to_string(),
            team_id: team.to_string(),
        };
        self.scheduler
            .call("GetBuild", |mut c| {
                let req = get.clone();
                async move { c.get_build(req).await }
            })
            .await
            .map_err(|s| refused(&s, build_id))
    }

    /// A page of `team`'s builds of template `name`, newest first, and the
    /// next page's token (empty: none).
    pub(super) async fn list(
        &self,
        team: &str,
        name: &str,
        token: &str,
        limit: u32,
    ) -> Result<(Vec<pb::Build>, String), ApiError> {
        let req = pb::ListBuildsRequest {
            team_id: team.to_string(),
            template_name: name.to_string(),
            page_size: limit,
            page_token: token.to_string(),
        };
        let page = self
            .scheduler
            .call("ListBuilds", |mut c| {
                let req = req.clone();
                async move { c.list_builds(req).await }
            })
            .await
            .map_err(|s| match s.code() {
                tonic::Code::InvalidArgument => ApiError::bad_request(
                    "invalid_query",
                    format!("nextToken is not one this API gave: {}", s.message()),
                ),
                _ => ApiError::from_scheduler(&s, None),
            })?;
        Ok((page.builds, page.next_page_token))
    }

    /// The build's whole log, in order (bounded by `--build-log-max-bytes`).
    pub(super) async fn whole_log(
        &self,
        build_id: &str,
        team: &str,
    ) -> Result<Vec<pb::LogLine>, ApiError> {
        let mut out = Vec::new();
        loop {
            let from = out.last().map_or(0, |l: &pb::LogLine| l.seq + 1);
            let page = self.read_log(build_id, team, from, 1000).await?;
            if page.is_empty() {
                return Ok(out);
            }
            out.extend(page);
        }
    }

    async fn read_log(
        &self,
        build_id: &str,
        team: &str,
        from: u64,
        limit: u32,
    ) -> Result<Vec<pb::LogLine>, ApiError> {
        if limit == 0 {
            return Ok(Vec::new());
        }
        let req = pb::ReadBuildLogRequest {
            build_id: build_id.to_string(),
            team_id: team.to_string(),
            from_seq: from,
            limit,
        };
        Ok(self
            .scheduler
            .call("ReadBuildLog", |mut c| {
                let req = req.clone();
                async move { c.read_build_log(req).await }
            })
            .await
            .map_err(|s| refused(&s, build_id))?
            .lines)
    }
}

/// A claimed build's log and lease, until its end.
pub(super) struct Running {
    builds: Arc<Builds>,
    build_id: String,
    tx: mpsc::UnboundedSender<pb::LogLine>,
    keeper: tokio::task::JoinHandle<()>,
}

impl Running {
    /// One line for the build's log (sent within [`FLUSH`]).
    pub(super) fn log(&self, level: &str, message: String) {
        let _ = self.tx.send(pb::LogLine {
            seq: 0,
            at_ms: warren_core::time::now_ms(),
            level: level.to_string(),
            message: truncate(message, 16 * 1024),
        });
    }

    /// Ends the build: the rest of its log sent, then READY, or ERROR with
    /// the reason (also its last log line) and the step.
    pub(super) async fn finish(self, result: Result<(), (String, Option<String>)>) {
        if let Err((m, _)) = &result {
            self.log("error", m.clone());
        }
        let Running {
            builds,
            build_id,
            tx,
            keeper,
        } = self;
        drop(tx);
        let _ = keeper.await;
        let (status, message, step) = match result {
            Ok(()) => (pb::BuildStatus::Ready, String::new(), String::new()),
            Err((m, s)) => (pb::BuildStatus::Error, m, s.unwrap_or_default()),
        };
        let req = pb::UpdateBuildStatusRequest {
            build_id: build_id.clone(),
            owner: builds.owner.clone(),
            status: status as i32,
            reason_message: truncate(message, 16 * 1024),
            reason_step: truncate(step, 64),
        };
        if let Err(s) = builds
            .scheduler
            .call("UpdateBuildStatus", |mut c| {
                let req = req.clone();
                async move { c.update_build_status(req).await }
            })
            .await
        {
            tracing::warn!(build = %build_id, error = %s.message(), "cannot record a template build's end");
        }
    }
}

/// `s` cut to at most `max` bytes, at a character boundary.
fn truncate(mut s: String, max: usize) -> String {
    if s.len() > max {
        let mut at = max;
        while !s.is_char_boundary(at) {
            at -= 1;
        }
        s.truncate(at);
    }
    s
}
