//! E2B's sandbox logs: `GET /sandboxes/{id}/logs` (v1: `start`, `limit`;
//! `logs` as JSON lines and `logEntries`) and `GET /v2/sandboxes/{id}/logs`
//! (`cursor`, `limit`, `direction`, `level`, `search`; structured entries).
//!
//! A sandbox's log is envd's own entries (its start, each process started
//! and how it ended, the template's start command) and its node's
//! lifecycle entries (created, paused, resumed, killed), structured
//! (timestamp, level, message, fields). Where it is read from:
//!
//! - while the sandbox has a binding (running, paused): from its node,
//!   which reads envd's newest entries first (`node_client::logs`); a node
//!   that cannot be reached is a `502`, as for every call that needs it;
//! - once it ended: from the scheduler's store (`ReadSandboxLogs`), where
//!   the DELETE report that removed its binding left them, so any gateway
//!   answers them for the scheduler's `--sandbox-log-retention` after the
//!   sandbox and its node are gone.
//!
//! Another team's sandbox, running or ended, is `404` like an unknown one.

use super::owned;
use crate::auth::Team;
use crate::error::ApiError;
use crate::node_client::NodeError;
use crate::state::App;
use http::{Response, StatusCode};
use std::collections::BTreeMap;
use warren_core::body::Body;
use warren_core::node_api::SandboxLogEntry;
use warren_core::time::rfc3339_ms;
use warren_proto::scheduler::v1 as pb;

/// Most entries one answer carries (E2B's v2 `limit` maximum and the
/// default of both versions).
pub const MAX_LIMIT: u64 = 1000;
/// Longest `search` (E2B's).
const MAX_SEARCH: usize = 256;

/// The node's entries as a DELETE report carries them.
pub(super) fn to_event(entries: Vec<SandboxLogEntry>) -> Vec<pb::SandboxLogEntry> {
    entries
        .into_iter()
        .map(|l| pb::SandboxLogEntry {
            at_ms: l.at_ms,
            level: l.level,
            logger: l.logger,
            message: l.message,
            fields: l.fields.into_iter().collect(),
        })
        .collect()
}

/// `team`'s sandbox `id`'s log, oldest first, wherever it is now.
async fn entries(app: &App, team: &Team, id: &str) -> Result<Vec<SandboxLogEntry>, ApiError> {
    match owned(app, team, id).await {
        Ok(b) => match app.nodes.logs(&b.endpoint, id, b.generation).await {
            Ok(entries) => Ok(entries),
            // Gone (or moved) between the read and the ask: its end's
            // report has it, or its new node.
            Err(NodeError::Status {
                not_hosted: true, ..
            }) => ended(app, team, id).await,
            Err(e) => Err(ApiError::new(
                StatusCode::BAD_GATEWAY,
                "upstream_unreachable",
                format!("cannot read sandbox {id}'s logs from its node: {e}"),
            )),
        },
        Err(e) if e.status == StatusCode::NOT_FOUND => ended(app, team, id).await,
        Err(e) => Err(e),
    }
}

/// An ended sandbox's kept log, from the scheduler's store.
async fn ended(app: &App, team: &Team, id: &str) -> Result<Vec<SandboxLogEntry>, ApiError> {
    let req = pb::ReadSandboxLogsRequest {
        sandbox_id: id.to_string(),
        team_id: team.0.clone(),
    };
    let read = app
        .scheduler
        .call("ReadSandboxLogs", |mut c| {
            let req = req.clone();
            async move { c.read_sandbox_logs(req).await }
        })
        .await
        .map_err(|s| ApiError::from_scheduler(&s, Some(id)))?;
    Ok(read
        .entries
        .into_iter()
        .map(|l| SandboxLogEntry {
            at_ms: l.at_ms,
            level: l.level,
            logger: l.logger,
            message: l.message,
            fields: l.fields.into_iter().collect(),
        })
        .collect())
}

/// E2B's `SandboxLogEntry`: the logger rides among the fields.
#[derive(Debug, serde::Serialize)]
struct Entry {
    timestamp: String,
    message: String,
    level: String,
    fields: BTreeMap<String, String>,
}

impl Entry {
    fn of(e: &SandboxLogEntry) -> Entry {
        let mut fields = e.fields.clone();
        fields.insert("logger".into(), e.logger.clone());
        Entry {
            timestamp: rfc3339_ms(e.at_ms),
            message: e.message.clone(),
            level: e.level.clone(),
            fields,
        }
    }
}

/// E2B's v1 `SandboxLog`: the entry as one JSON line (`level`, `logger`,
/// `message` and the fields), which the e2b CLI prints.
#[derive(Debug, serde::Serialize)]
struct Line {
    timestamp: String,
    line: String,
}

impl Line {
    fn of(e: &SandboxLogEntry) -> Line {
        let mut obj = serde_json::Map::new();
        for (k, v) in &e.fields {
            obj.insert(k.clone(), v.clone().into());
        }
        obj.insert("level".into(), e.level.clone().into());
        obj.insert("logger".into(), e.logger.clone().into());
        obj.insert("message".into(), e.message.clone().into());
        Line {
            timestamp: rfc3339_ms(e.at_ms),
            line: serde_json::Value::Object(obj).to_string(),
        }
    }
}

fn bad(m: String) -> ApiError {
    ApiError::bad_request("invalid_query", m)
}

fn number(k: &str, v: &str, max: u64) -> Result<u64, ApiError> {
    v.parse::<u64>()
        .ok()
        .filter(|n| *n <= max)
        .ok_or_else(|| bad(format!("{k} {v:?} must be a whole number from 0 to {max}")))
}

/// `GET /sandboxes/{id}/logs?start=&limit=`: entries at or after `start`
/// (Unix milliseconds), oldest first, at most `limit` (default 1000).
pub(super) async fn v1(
    app: &App,
    team: &Team,
    id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let (mut start, mut limit) = (0u64, MAX_LIMIT);
    for (k, v) in form_urlencoded::parse(query.as_bytes()) {
        match k.as_ref() {
            "start" => start = number("start", &v, i64::MAX as u64)?,
            "limit" => limit = number("limit", &v, u32::MAX as u64)?,
            _ => {}
        }
    }
    let kept: Vec<SandboxLogEntry> = entries(app, team, id)
        .await?
        .into_iter()
        .filter(|e| e.at_ms >= start as i64)
        .take(limit as usize)
        .collect();
    super::reply(
        StatusCode::OK,
        &serde_json::json!({
            "logs": kept.iter().map(Line::of).collect::<Vec<_>>(),
            "logEntries": kept.iter().map(Entry::of).collect::<Vec<_>>(),
        }),
    )
}

fn rank(level: &str) -> usize {
    ["debug", "info", "warn", "error"]
        .iter()
        .position(|l| *l == level)
        .unwrap_or(1)
}

/// What a v2 request asks for.
#[derive(Debug, PartialEq, Eq)]
struct V2 {
    cursor: Option<i64>,
    limit: usize,
    forward: bool,
    min_level: usize,
    search: Option<String>,
}

impl V2 {
    fn parse(query: &str) -> Result<V2, ApiError> {
        let mut q = V2 {
            cursor: None,
            limit: MAX_LIMIT as usize,
            forward: false,
            min_level: 0,
            search: None,
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "cursor" => q.cursor = Some(number("cursor", &v, i64::MAX as u64)? as i64),
                "limit" => q.limit = number("limit", &v, MAX_LIMIT)? as usize,
                "direction" => {
                    q.forward = match v.as_ref() {
                        "forward" => true,
                        "backward" => false,
                        _ => {
                            return Err(bad(format!("direction {v:?} is not forward or backward")))
                        }
                    }
                }
                "level" => match v.as_ref() {
                    "debug" | "info" | "warn" | "error" => q.min_level = rank(&v),
                    _ => {
                        return Err(bad(format!(
                            "level {v:?} is not debug, info, warn or error"
                        )))
                    }
                },
                "search" => {
                    if v.chars().count() > MAX_SEARCH {
                        return Err(bad(format!(
                            "search is {} characters long; at most {MAX_SEARCH}",
                            v.chars().count()
                        )));
                    }
                    q.search = Some(v.into_owned());
                }
                _ => {}
            }
        }
        Ok(q)
    }

    /// The page of `all` (oldest first) asked for: forward, the entries at
    /// or after the cursor, oldest first; backward (the default), the
    /// entries at or before it (default: the newest), newest first.
    fn page<'a>(&self, all: &'a [SandboxLogEntry]) -> Vec<&'a SandboxLogEntry> {
        let keeps = |e: &&SandboxLogEntry| {
            rank(&e.level) >= self.min_level
                && self
                    .search
                    .as_ref()
                    .is_none_or(|s| e.message.contains(s.as_str()))
        };
        if self.forward {
            let from = self.cursor.unwrap_or(0);
            all.iter()
                .filter(|e| e.at_ms >= from)
                .filter(keeps)
                .take(self.limit)
                .collect()
        } else {
            let to = self.cursor.unwrap_or(i64::MAX);
            all.iter()
                .rev()
                .filter(|e| e.at_ms <= to)
                .filter(keeps)
                .take(self.limit)
                .collect()
        }
    }
}

/// `GET /v2/sandboxes/{id}/logs`.
pub(super) async fn v2(
    app: &App,
    team: &Team,
    id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let q = V2::parse(query)?;
    let all = entries(app, team, id).await?;
    let page: Vec<Entry> = q.page(&all).into_iter().map(Entry::of).collect();
    super::reply(StatusCode::OK, &serde_json::json!({ "logs": page }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn entry(at_ms: i64, level: &str, message: &str) -> SandboxLogEntry {
        SandboxLogEntry {
            at_ms,
            level: level.into(),
            logger: "process".into(),
            message: message.into(),
            fields: BTreeMap::from([("pid".to_string(), "7".to_string())]),
        }
    }

    #[test]
    fn v2_pages_filter_and_refuse_what_e2b_refuses() {
        let all = vec![
            entry(10, "info", "Process started"),
            entry(20, "debug", "noise"),
            entry(30, "warn", "Process exited"),
            entry(40, "info", "Process started"),
        ];
        let msgs = |q: &str| {
            V2::parse(q)
                .unwrap()
                .page(&all)
                .iter()
                .map(|e| e.at_ms)
                .collect::<Vec<_>>()
        };
        // Backward by default: newest first.
        assert_eq!(msgs(""), [40, 30, 20, 10]);
        assert_eq!(msgs("cursor=30"), [30, 20, 10]);
        assert_eq!(msgs("direction=forward&cursor=20&limit=2"), [20, 30]);
        assert_eq!(msgs("level=info"), [40, 30, 10]);
        assert_eq!(msgs("level=warn"), [30]);
        assert_eq!(msgs("search=started"), [40, 10]);
        assert_eq!(msgs("search=Started"), Vec::<i64>::new(), "case-sensitive");
        assert_eq!(msgs("limit=0"), Vec::<i64>::new());
        for bad in [
            "limit=1001",
            "limit=-1",
            "cursor=x",
            "direction=up",
            "level=fatal",
            &format!("search={}", "a".repeat(257)),
        ] {
            let e = V2::parse(bad).unwrap_err();
            assert_eq!(e.status, StatusCode::BAD_REQUEST, "{bad}");
        }
    }

    #[test]
    fn v1_lines_are_json_the_cli_reads() {
        let e = entry(1_700_000_000_123, "info", "Process started");
        let line = Line::of(&e);
        let v: serde_json::Value = serde_json::from_str(&line.line).unwrap();
        assert_eq!(v["level"], "info");
        assert_eq!(v["logger"], "process");
        assert_eq!(v["message"], "Process started");
        assert_eq!(v["pid"], "7");
        assert_eq!(line.timestamp, "2023-11-14T22:13:20.123Z");
        let structured = Entry::of(&e);
        assert_eq!(structured.fields["logger"], "process");
    }
}
