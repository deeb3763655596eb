//! A template's builds as E2B lists them (`GET /templates/{id}`'s
//! `builds`) and a build's log as E2B pages it
//! (`GET /templates/{id}/builds/{buildID}/logs`), from the builds the
//! scheduler's store keeps (finished ones for `--build-retention`).

use super::ledger::Asked;
use crate::auth::Team;
use crate::error::ApiError;
use crate::state::App;
use http::{Response, StatusCode};
use warren_core::body::Body;
use warren_core::time::rfc3339_ms;
use warren_proto::scheduler::v1 as pb;

/// Most log entries one page carries (E2B's `limit` maximum and default).
const MAX_LOG_PAGE: usize = 100;

fn status_name(b: &pb::Build) -> &'static str {
    match pb::BuildStatus::try_from(b.status) {
        Ok(pb::BuildStatus::Building) => "building",
        Ok(pb::BuildStatus::Ready) => "ready",
        Ok(pb::BuildStatus::Error) => "error",
        _ => "waiting",
    }
}

/// E2B's `TemplateBuild` of `b`.
fn build_json(b: &pb::Build) -> serde_json::Value {
    let asked: Asked = serde_json::from_str(&b.request_json).unwrap_or_default();
    let updated = [b.finished_at_ms, b.started_at_ms, b.requested_at_ms]
        .into_iter()
        .find(|t| *t > 0)
        .unwrap_or(b.requested_at_ms);
    let mut v = serde_json::json!({
        "buildID": b.build_id,
        "status": status_name(b),
        "createdAt": rfc3339_ms(b.requested_at_ms),
        "updatedAt": rfc3339_ms(updated),
        "cpuCount": asked.cpu_count,
        "memoryMB": asked.memory_mb,
        "envdVersion": warren_core::node_api::ENVD_VERSION,
    });
    if b.finished_at_ms > 0 {
        v["finishedAt"] = rfc3339_ms(b.finished_at_ms).into();
    }
    v
}

/// A page of `owner`'s builds of template `name`, newest first, as E2B's
/// `TemplateBuild`s, and the next page's token (empty: the last).
pub(in crate::control) async fn listed(
    app: &App,
    owner: &str,
    name: &str,
    token: &str,
    limit: u32,
) -> Result<(Vec<serde_json::Value>, String), ApiError> {
    let (builds, next) = app.builds.list(owner, name, token, limit).await?;
    Ok((builds.iter().map(build_json).collect(), next))
}

/// What a log page asks for.
#[derive(Debug, PartialEq, Eq)]
struct LogQuery {
    cursor: Option<i64>,
    limit: usize,
    forward: bool,
    min_level: usize,
}

fn rank(level: &str) -> usize {
    ["debug", "info", "warn", "error"]
        .iter()
        .position(|l| *l == level)
        .unwrap_or(1)
}

impl LogQuery {
    fn parse(query: &str) -> Result<LogQuery, ApiError> {
        let bad = |m: String| ApiError::bad_request("invalid_query", m);
        let mut q = LogQuery {
            cursor: None,
            limit: MAX_LOG_PAGE,
            forward: true,
            min_level: 0,
        };
        for (k, v) in form_urlencoded::parse(query.as_bytes()) {
            match k.as_ref() {
                "cursor" => {
                    q.cursor = Some(
                        v.parse::<i64>()
                            .ok()
                            .filter(|c| *c >= 0)
                            .ok_or_else(|| bad(format!("cursor {v:?} is not a time in ms")))?,
                    )
                }
                "limit" => {
                    q.limit = v
                        .parse()
                        .ok()
                        .filter(|n| *n <= MAX_LOG_PAGE)
                        .ok_or_else(|| bad(format!("limit must be between 0 and {MAX_LOG_PAGE}")))?
                }
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
                // One log here: what the build wrote while it ran is what
                // is kept.
                "source" => match v.as_ref() {
                    "temporary" | "persistent" => {}
                    _ => return Err(bad(format!("source {v:?} is not temporary or persistent"))),
                },
                _ => {}
            }
        }
        Ok(q)
    }
}

/// The step each line belongs to: the build's own lines before the first
/// step none, `[n/total]` starts step `n` (its output follows), the
/// lines from "saving the template" on `finalize`.
fn steps(lines: &[pb::LogLine]) -> Vec<Option<String>> {
    let mut step: Option<String> = None;
    lines
        .iter()
        .map(|l| {
            if let Some(rest) = l.message.strip_prefix('[') {
                if let Some((n, _)) = rest.split_once('/') {
                    if !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit()) {
                        step = Some(n.to_string());
                    }
                }
            }
            if l.message == "saving the template" {
                step = Some("finalize".into());
            }
            step.clone()
        })
        .collect()
}

/// `GET /templates/{id}/builds/{buildID}/logs?cursor=&limit=&direction=&level=&source=`:
/// the build's log (its steps' output included) as E2B's
/// `TemplateBuildLogsResponse`: forward (the default), the entries at or
/// after `cursor` (ms) oldest first; backward, those at or before it
/// (default: the newest) newest first; at most `limit` (100).
pub(in crate::control) async fn logs(
    app: &App,
    team: &Team,
    template_raw: &str,
    build_id: &str,
    query: &str,
) -> Result<Response<Body>, ApiError> {
    let template_id = super::decode(template_raw)?;
    let q = LogQuery::parse(query)?;
    let b = app.builds.get(build_id, &team.0).await?;
    if b.template_name != template_id.split(':').next().unwrap_or_default() {
        return Err(super::ledger::build_not_found(build_id));
    }
    let lines = app.builds.whole_log(build_id, &team.0).await?;
    let steps = steps(&lines);
    let keeps = |(l, _): &(&pb::LogLine, &Option<String>)| rank(&l.level) >= q.min_level;
    let both = lines.iter().zip(steps.iter());
    let page: Vec<(&pb::LogLine, &Option<String>)> = if q.forward {
        let from = q.cursor.unwrap_or(0);
        both.filter(|(l, _)| l.at_ms >= from)
            .filter(keeps)
            .take(q.limit)
            .collect()
    } else {
        let to = q.cursor.unwrap_or(i64::MAX);
        both.rev()
            .filter(|(l, _)| l.at_ms <= to)
            .filter(keeps)
            .take(q.limit)
            .collect()
    };
    let out: Vec<serde_json::Value> = page
        .into_iter()
        .map(|(l, step)| {
            let mut v = serde_json::json!({
                "timestamp": rfc3339_ms(l.at_ms),
                "message": l.message,
                "level": l.level,
            });
            if let Some(s) = step {
                v["step"] = s.clone().into();
            }
            v
        })
        .collect();
    super::super::reply(StatusCode::OK, &serde_json::json!({ "logs": out }))
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    fn line(seq: u64, message: &str) -> pb::LogLine {
        pb::LogLine {
            seq,
            at_ms: seq as i64,
            level: "info".into(),
            message: message.into(),
        }
    }

    #[test]
    fn lines_belong_to_their_steps() {
        let lines = [
            line(0, "build sandbox s1 from base"),
            line(1, "[1/2] RUN echo hi"),
            line(2, "hi"),
            line(3, "[2/2] WORKDIR /app"),
            line(4, "saving the template"),
            line(5, "template app built"),
        ];
        assert_eq!(
            steps(&lines),
            [
                None,
                Some("1".into()),
                Some("1".into()),
                Some("2".into()),
                Some("finalize".into()),
                Some("finalize".into())
            ]
        );
    }

    #[test]
    fn queries_are_checked() {
        assert_eq!(
            LogQuery::parse("").unwrap(),
            LogQuery {
                cursor: None,
                limit: 100,
                forward: true,
                min_level: 0
            }
        );
        let q = LogQuery::parse("cursor=5&limit=3&direction=backward&level=warn&source=persistent")
            .unwrap();
        assert_eq!(
            (q.cursor, q.limit, q.forward, q.min_level),
            (Some(5), 3, false, 2)
        );
        for bad in [
            "limit=101",
            "cursor=-1",
            "direction=x",
            "level=x",
            "source=x",
        ] {
            assert!(LogQuery::parse(bad).is_err(), "{bad}");
        }
    }
}
