//! The template builds one gateway holds in memory, bounded so that no team
//! can lock another out or pin the gateway's memory
//! ([`BuildLimits`], the `--build-*` flags):
//!
//! - per team at most `team_count` builds held (requested, running, or
//!   finished and still readable): a request past it drops the team's
//!   oldest finished build, and is refused (429 naming the flag) only when
//!   all of them are still waiting or running; all teams together at most
//!   `total_count`, the same way;
//! - a requested build that never starts is forgotten `start_ttl` after
//!   its request, a finished one `retention` after it finished;
//! - a build's log keeps at most `log_max_bytes` (every line counted with
//!   [`LINE_COST`] bytes of bookkeeping on top of its text), further lines
//!   are dropped and the log says so once; a team's builds keep at most
//!   `log_team_bytes` together: past it the logs of the team's oldest
//!   finished builds go first (each left saying so), then further lines of
//!   its running ones.
//!
//! Everything is pruned when the table is touched, under one lock.

use super::super::reply;
use crate::error::ApiError;
use crate::limits::BuildLimits;
use http::{Response, StatusCode};
use std::collections::HashMap;
use std::sync::Mutex;
use tokio::time::Instant;
use warren_core::body::Body;

/// What one log line costs besides its text: the entry, its timestamp
/// string, its level, the vector's slot.
pub(super) const LINE_COST: u64 = 64;
/// How many of the last log lines a failed build's reason repeats.
const REASON_LINES: usize = 20;

#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(super) enum Status {
    Waiting,
    Building,
    Ready,
    Error,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct LogEntry {
    timestamp: String,
    pub(super) level: &'static str,
    pub(super) message: String,
}

impl LogEntry {
    fn new(level: &'static str, message: String) -> LogEntry {
        LogEntry {
            timestamp: warren_core::time::rfc3339_ms(warren_core::time::now_ms()),
            level,
            message,
        }
    }

    fn cost(&self) -> u64 {
        self.message.len() as u64 + LINE_COST
    }
}

#[derive(Debug, Clone, serde::Serialize)]
pub(super) struct Reason {
    message: String,
    #[serde(skip_serializing_if = "Option::is_none")]
    step: Option<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
}

/// What a started build runs with, from its request.
#[derive(Debug, Clone)]
pub(super) struct Asked {
    pub name: String,
    /// The tags the build gets (`default` when the request named none).
    pub tags: Vec<String>,
    pub cpu_count: u32,
    pub memory_mb: u64,
}

#[derive(Debug)]
struct Build {
    team: String,
    asked: Asked,
    status: Status,
    logs: Vec<LogEntry>,
    /// What `logs` and `reason` cost, counted against both log bounds.
    log_bytes: u64,
    /// Lines were dropped (and the log said so).
    truncated: bool,
    reason: Option<Reason>,
    requested: Instant,
    finished: Option<Instant>,
}

#[derive(Debug, Default)]
struct Table {
    by_id: HashMap<String, Build>,
    /// Log bytes held per team (the sum of its builds' `log_bytes`).
    log_bytes: HashMap<String, u64>,
}

/// The builds this gateway runs, by build id.
#[derive(Debug)]
pub(crate) struct Builds {
    limits: BuildLimits,
    inner: Mutex<Table>,
}

/// E2B's `TemplateBuildInfo`.
#[derive(Debug, serde::Serialize)]
struct BuildInfo {
    #[serde(rename = "templateID")]
    template_id: String,
    #[serde(rename = "buildID")]
    build_id: String,
    status: Status,
    logs: Vec<String>,
    #[serde(rename = "logEntries")]
    log_entries: Vec<LogEntry>,
    #[serde(skip_serializing_if = "Option::is_none")]
    reason: Option<Reason>,
}

/// Which part of a build's log a status answer carries.
#[derive(Debug, Clone)]
pub(super) struct Page {
    pub offset: usize,
    pub limit: usize,
    /// The lowest level shown (`debug` < `info` < `warn` < `error`).
    pub level: Option<String>,
}

pub(super) fn build_not_found(id: &str) -> ApiError {
    ApiError::new(
        StatusCode::NOT_FOUND,
        "build_not_found",
        format!("template build {id:?} not found"),
    )
}

fn too_many(m: String) -> ApiError {
    ApiError::over_limit("too_many_builds", m)
}

impl Table {
    fn drop_build(&mut self, id: &str) {
        if let Some(b) = self.by_id.remove(id) {
            self.give_back(&b.team, b.log_bytes);
        }
    }

    fn give_back(&mut self, team: &str, n: u64) {
        if let Some(t) = self.log_bytes.get_mut(team) {
            *t = t.saturating_sub(n);
            if *t == 0 {
                self.log_bytes.remove(team);
            }
        }
    }

    /// The oldest finished build (of `team`, when given).
    fn oldest_finished(&self, team: Option<&str>) -> Option<String> {
        self.by_id
            .iter()
            .filter(|(_, b)| team.is_none_or(|t| b.team == t))
            .filter_map(|(id, b)| b.finished.map(|at| (at, id)))
            .min()
            .map(|(_, id)| id.clone())
    }
}

impl Builds {
    pub(crate) fn new(limits: BuildLimits) -> Builds {
        Builds {
            limits,
            inner: Mutex::default(),
        }
    }

    /// Runs `f` on the table, pruned first: requested builds past the start
    /// TTL and finished ones past the retention are gone.
    fn with<T>(&self, f: impl FnOnce(&mut Table) -> T) -> T {
        let mut g = match self.inner.lock() {
            Ok(g) => g,
            Err(p) => p.into_inner(),
        };
        let now = Instant::now();
        let (ttl, keep) = (self.limits.start_ttl, self.limits.retention);
        let expired: Vec<String> = g
            .by_id
            .iter()
            .filter(|(_, b)| match (b.status, b.finished) {
                (Status::Waiting, _) => now.duration_since(b.requested) >= ttl,
                (_, Some(at)) => now.duration_since(at) >= keep,
                _ => false,
            })
            .map(|(id, _)| id.clone())
            .collect();
        for id in expired {
            g.drop_build(&id);
        }
        f(&mut g)
    }

    /// Holds a new waiting build of `team` (see the module doc for the
    /// bounds); a 429 naming the flag when there is no room.
    pub(super) fn request(&self, build_id: &str, team: &str, asked: Asked) -> Result<(), ApiError> {
        let l = self.limits;
        self.with(|t| {
            let held = t.by_id.values().filter(|b| b.team == team).count();
            if held >= l.team_count {
                let Some(old) = t.oldest_finished(Some(team)) else {
                    return Err(too_many(format!(
                        "team {team} has {held} template builds waiting or running on this \
                         gateway, its limit (--build-team-count) is {}; start or finish one first, \
                         or wait until the requested ones expire (--build-start-ttl {:?})",
                        l.team_count, l.start_ttl
                    )));
                };
                t.drop_build(&old);
            }
            if t.by_id.len() >= l.total_count {
                let Some(old) = t.oldest_finished(None) else {
                    return Err(too_many(format!(
                        "this gateway holds {} template builds, all waiting or running, its limit \
                         (--build-total-count); try again later",
                        t.by_id.len()
                    )));
                };
                t.drop_build(&old);
            }
            t.by_id.insert(
                build_id.to_string(),
                Build {
                    team: team.to_string(),
                    asked,
                    status: Status::Waiting,
                    logs: Vec::new(),
                    log_bytes: 0,
                    truncated: false,
                    reason: None,
                    requested: Instant::now(),
                    finished: None,
                },
            );
            Ok(())
        })
    }

    /// Marks `team`'s waiting build `build_id` of template `name` started;
    /// what it asked for. 404 for any other team's, an expired or unknown
    /// one; 409 once started.
    pub(super) fn start(&self, build_id: &str, team: &str, name: &str) -> Result<Asked, ApiError> {
        self.with(|t| {
            let Some(b) = t
                .by_id
                .get_mut(build_id)
                .filter(|b| b.team == team && b.asked.name == name)
            else {
                return Err(build_not_found(build_id));
            };
            if b.status != Status::Waiting {
                return Err(ApiError::new(
                    StatusCode::CONFLICT,
                    "build_started",
                    format!("template build {build_id} has already started"),
                ));
            }
            b.status = Status::Building;
            Ok(b.asked.clone())
        })
    }

    /// Adds a line to build `id`'s log, within both bounds.
    pub(super) fn log(&self, id: &str, level: &'static str, message: impl Into<String>) {
        let entry = LogEntry::new(level, message.into());
        let l = self.limits;
        self.with(|t| {
            let Some(team) = t.by_id.get(id).map(|b| b.team.clone()) else {
                return;
            };
            let cost = entry.cost();
            // The team's bound: its oldest finished builds' logs go first.
            while t.log_bytes.get(&team).copied().unwrap_or(0) + cost > l.log_team_bytes {
                let victim = t
                    .by_id
                    .iter()
                    .filter(|(_, b)| b.team == team && b.finished.is_some() && b.log_bytes > 0)
                    .filter_map(|(vid, b)| b.finished.map(|at| (at, vid.clone())))
                    .min()
                    .map(|(_, vid)| vid);
                let Some(vid) = victim else { break };
                let freed = t.by_id.get_mut(&vid).map(|v| {
                    let freed = v.log_bytes;
                    v.logs = vec![LogEntry::new(
                        "warn",
                        format!(
                            "(this build's log was dropped: the team's builds keep at most {} \
                             bytes of log on this gateway, --build-log-team-bytes)",
                            l.log_team_bytes
                        ),
                    )];
                    if let Some(r) = v.reason.as_mut() {
                        r.log_entries.clear();
                    }
                    v.log_bytes = 0;
                    v.truncated = true;
                    freed
                });
                if let Some(freed) = freed {
                    t.give_back(&team, freed);
                }
            }
            let team_full = t.log_bytes.get(&team).copied().unwrap_or(0) + cost > l.log_team_bytes;
            let Some(b) = t.by_id.get_mut(id) else { return };
            let build_full = b.log_bytes + cost > l.log_max_bytes;
            if build_full || team_full {
                if !b.truncated {
                    b.truncated = true;
                    let why = if build_full {
                        format!(
                            "a build keeps at most {} bytes of log, --build-log-max-bytes",
                            l.log_max_bytes
                        )
                    } else {
                        format!(
                            "the team's builds keep at most {} bytes of log on this gateway, \
                             --build-log-team-bytes",
                            l.log_team_bytes
                        )
                    };
                    // The notice is small and said once; it is not counted.
                    b.logs.push(LogEntry::new(
                        "warn",
                        format!("(more output; the rest is not kept: {why})"),
                    ));
                }
                return;
            }
            b.log_bytes += cost;
            b.logs.push(entry);
            *t.log_bytes.entry(team).or_default() += cost;
        })
    }

    /// Ends build `id`: ready, or failed with a message and the step.
    pub(super) fn finish(&self, id: &str, result: Result<(), (String, Option<String>)>) {
        self.with(|t| {
            let Some(b) = t.by_id.get_mut(id) else { return };
            b.finished = Some(Instant::now());
            let mut added = 0;
            match result {
                Ok(()) => b.status = Status::Ready,
                Err((message, step)) => {
                    // The failure is always said, whatever the bounds.
                    let last = LogEntry::new("error", message.clone());
                    added += last.cost();
                    b.logs.push(last);
                    let tail = b.logs.len().saturating_sub(REASON_LINES);
                    let log_entries = b.logs[tail..].to_vec();
                    added += log_entries.iter().map(LogEntry::cost).sum::<u64>();
                    b.status = Status::Error;
                    b.reason = Some(Reason {
                        message,
                        step,
                        log_entries,
                    });
                }
            }
            b.log_bytes += added;
            let team = b.team.clone();
            *t.log_bytes.entry(team).or_default() += added;
        })
    }

    /// `GET .../status`: `team`'s build `build_id` of template `name`.
    pub(super) fn status(
        &self,
        build_id: &str,
        team: &str,
        name: &str,
        page: &Page,
    ) -> Result<Response<Body>, ApiError> {
        let info = self.with(|t| {
            let b = t
                .by_id
                .get(build_id)
                .filter(|b| b.team == team && b.asked.name == name)
                .ok_or_else(|| build_not_found(build_id))?;
            let rank = |l: &str| {
                ["debug", "info", "warn", "error"]
                    .iter()
                    .position(|x| *x == l)
            };
            let min = page.level.as_deref().and_then(rank).unwrap_or(0);
            let entries: Vec<LogEntry> = b
                .logs
                .iter()
                .skip(page.offset)
                .take(page.limit)
                .filter(|e| rank(e.level).unwrap_or(0) >= min)
                .cloned()
                .collect();
            Ok::<_, ApiError>(BuildInfo {
                template_id: b.asked.name.clone(),
                build_id: build_id.to_string(),
                status: b.status,
                logs: entries.iter().map(|e| e.message.clone()).collect(),
                log_entries: entries,
                reason: b.reason.clone(),
            })
        })?;
        reply(StatusCode::OK, &info)
    }

    /// Log bytes `team` holds now (for tests).
    #[cfg(test)]
    fn team_log_bytes(&self, team: &str) -> u64 {
        self.with(|t| t.log_bytes.get(team).copied().unwrap_or(0))
    }

    /// Log lines of build `id` (for tests).
    #[cfg(test)]
    fn lines(&self, id: &str) -> Vec<String> {
        self.with(|t| {
            t.by_id
                .get(id)
                .map(|b| b.logs.iter().map(|e| e.message.clone()).collect())
                .unwrap_or_default()
        })
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use std::time::Duration;

    fn limits() -> BuildLimits {
        BuildLimits {
            team_count: 2,
            total_count: 3,
            start_ttl: Duration::from_secs(60),
            retention: Duration::from_secs(600),
            log_max_bytes: 1000,
            log_team_bytes: 1500,
        }
    }

    fn asked(name: &str) -> Asked {
        Asked {
            name: name.into(),
            tags: vec!["default".into()],
            cpu_count: 1,
            memory_mb: 512,
        }
    }

    fn message(e: ApiError) -> String {
        format!("{} {}", e.status, e.message)
    }

    #[tokio::test(start_paused = true)]
    async fn one_team_cannot_take_every_build() {
        let b = Builds::new(limits());
        b.request("a1", "team-a", asked("t")).unwrap();
        b.request("a2", "team-a", asked("t")).unwrap();
        let e = message(b.request("a3", "team-a", asked("t")).unwrap_err());
        assert!(
            e.starts_with("429") && e.contains("--build-team-count"),
            "{e}"
        );
        // Another team still builds.
        b.request("b1", "team-b", asked("t")).unwrap();
        // Every slot of the gateway waiting: the total bound.
        let e = message(b.request("c1", "team-c", asked("t")).unwrap_err());
        assert!(e.contains("--build-total-count"), "{e}");
        // A finished build makes room: the team's oldest finished goes.
        b.start("a1", "team-a", "t").unwrap();
        b.finish("a1", Ok(()));
        b.request("a3", "team-a", asked("t")).unwrap();
        assert!(b.start("a1", "team-a", "t").is_err(), "dropped");
        // Another team's build is not found; a started one cannot start again.
        assert_eq!(b.start("a2", "team-b", "t").unwrap_err().status, 404);
        b.start("a2", "team-a", "t").unwrap();
        assert_eq!(b.start("a2", "team-a", "t").unwrap_err().status, 409);
    }

    #[tokio::test(start_paused = true)]
    async fn requested_builds_expire_and_finished_ones_go() {
        let b = Builds::new(limits());
        b.request("a1", "team-a", asked("t")).unwrap();
        b.request("a2", "team-a", asked("t")).unwrap();
        b.start("a2", "team-a", "t").unwrap();
        tokio::time::advance(Duration::from_secs(61)).await;
        // The waiting one is gone; the running one stays however long.
        assert_eq!(b.start("a1", "team-a", "t").unwrap_err().status, 404);
        b.request("a3", "team-a", asked("t")).unwrap();
        b.finish("a2", Err(("failed".into(), Some("1".into()))));
        let page = Page {
            offset: 0,
            limit: 100,
            level: None,
        };
        assert!(b.status("a2", "team-a", "t", &page).is_ok());
        tokio::time::advance(Duration::from_secs(601)).await;
        assert_eq!(
            b.status("a2", "team-a", "t", &page).unwrap_err().status,
            404
        );
        assert_eq!(b.team_log_bytes("team-a"), 0, "its log went with it");
    }

    #[tokio::test(start_paused = true)]
    async fn logs_keep_their_bounds_and_say_what_they_dropped() {
        let b = Builds::new(limits());
        b.request("a1", "team-a", asked("t")).unwrap();
        b.start("a1", "team-a", "t").unwrap();
        for i in 0..100 {
            b.log("a1", "info", format!("line {i:04}"));
        }
        let lines = b.lines("a1");
        let kept: u64 = lines.iter().map(|l| l.len() as u64 + LINE_COST).sum();
        assert!(b.team_log_bytes("team-a") <= 1000, "the build's bound");
        assert!(kept <= 1000 + 200, "{kept}");
        let last = lines.last().unwrap();
        assert!(last.contains("--build-log-max-bytes"), "{last}");
        assert_eq!(lines.iter().filter(|l| l.contains("not kept")).count(), 1);
        // The team's bound: a second build pushes the first's log out once
        // the first has finished.
        b.finish("a1", Ok(()));
        b.request("a2", "team-a", asked("t")).unwrap();
        b.start("a2", "team-a", "t").unwrap();
        for i in 0..10 {
            b.log("a2", "info", format!("second {i:04}"));
        }
        assert!(b.team_log_bytes("team-a") <= 1500);
        let first = b.lines("a1");
        assert_eq!(first.len(), 1, "{first:?}");
        assert!(first[0].contains("--build-log-team-bytes"), "{first:?}");
        assert_eq!(b.lines("a2").len(), 10);
        // Another team's bound is its own.
        b.request("b1", "team-b", asked("t")).unwrap();
        b.start("b1", "team-b", "t").unwrap();
        b.log("b1", "info", "hello");
        assert_eq!(b.lines("b1"), ["hello"]);
    }
}
