//! Ended sandboxes' logs: written with the DELETE that removes the
//! binding (in its transaction, under the binding's team), read by the
//! team through any gateway, gone after their retention or when the team's
//! bound needs room (its oldest ended sandboxes' logs first).

use super::{to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::records::{EndedLog, SandboxLogLine};
use crate::store::sql_records as sql;
use crate::store::SweepReport;
use std::collections::BTreeMap;

/// What a kept line costs its team besides its text.
pub const LOG_LINE_COST: u64 = 64;

fn cost(l: &SandboxLogLine, fields: &str) -> u64 {
    (l.level.len() + l.logger.len() + l.message.len() + fields.len()) as u64 + LOG_LINE_COST
}

/// Keeps `log` as sandbox `sandbox_id`'s (of `team`), in the transaction
/// that removed its binding; then trims the team's kept logs to its bound.
pub(super) async fn keep(
    tx: &mut WriteTx,
    sandbox_id: &str,
    team: &str,
    log: &EndedLog,
) -> Result<()> {
    if log.lines.is_empty() {
        return Ok(());
    }
    let now = tx.now;
    let expires = now.saturating_add(log.retention_ms);
    // A sandbox id is never reused; a report sent twice finds its lines.
    sqlx::query(sql::DELETE_SANDBOX_LOG)
        .bind(sandbox_id)
        .execute(tx.conn())
        .await?;
    for (seq, l) in log.lines.iter().enumerate() {
        let fields = serde_json::to_string(&l.fields).unwrap_or_else(|_| "{}".into());
        sqlx::query(sql::INSERT_SANDBOX_LOG_LINE)
            .bind(sandbox_id)
            .bind(seq as i64)
            .bind(team)
            .bind(l.at_ms)
            .bind(&l.level)
            .bind(&l.logger)
            .bind(&l.message)
            .bind(&fields)
            .bind(to_i64(cost(l, &fields)))
            .bind(now)
            .bind(expires)
            .execute(tx.conn())
            .await?;
    }
    if log.team_max_bytes == 0 {
        return Ok(());
    }
    // The team's oldest ended sandboxes' logs make room, then this one's
    // oldest lines.
    loop {
        let used: i64 = sqlx::query_scalar(sql::TEAM_SANDBOX_LOG_BYTES)
            .bind(team)
            .fetch_one(tx.conn())
            .await?;
        if to_u64(used, "bytes")? <= log.team_max_bytes {
            return Ok(());
        }
        let victim: Option<String> = sqlx::query_scalar(sql::OLDEST_SANDBOX_LOG)
            .bind(team)
            .bind(sandbox_id)
            .fetch_optional(tx.conn())
            .await?;
        match victim {
            Some(v) => {
                sqlx::query(sql::DELETE_SANDBOX_LOG)
                    .bind(&v)
                    .execute(tx.conn())
                    .await?;
            }
            None => {
                let dropped = sqlx::query(sql::DROP_OLDEST_SANDBOX_LOG_LINE)
                    .bind(sandbox_id)
                    .execute(tx.conn())
                    .await?
                    .rows_affected();
                if dropped == 0 {
                    return Ok(());
                }
            }
        }
    }
}

/// Sandbox `sandbox_id`'s kept log, if it was `team`'s and is kept.
pub(super) async fn read(
    store: &SqlStore,
    sandbox_id: &str,
    team: &str,
) -> Result<Vec<SandboxLogLine>> {
    let now = store.clock_ms().await?;
    let rows: Vec<(i64, String, String, String, String)> = sqlx::query_as(sql::READ_SANDBOX_LOG)
        .bind(sandbox_id)
        .bind(team)
        .bind(now)
        .fetch_all(&store.reader)
        .await?;
    if rows.is_empty() {
        return Err(Error::NotFound(format!(
            "no logs of sandbox {sandbox_id} are kept for team {team}"
        )));
    }
    rows.into_iter()
        .map(|(at_ms, level, logger, message, fields)| {
            let fields: BTreeMap<String, String> = serde_json::from_str(&fields)
                .map_err(|e| Error::Corrupt(format!("sandbox log fields: {e}")))?;
            Ok(SandboxLogLine {
                at_ms,
                level,
                logger,
                message,
                fields,
            })
        })
        .collect()
}

/// The sweep's part: logs past their retention go.
pub(super) async fn sweep(store: &SqlStore, report: &mut SweepReport) -> Result<()> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let gone: Vec<String> = sqlx::query_scalar(sql::SANDBOX_LOGS_PAST_RETENTION)
        .bind(now)
        .fetch_all(tx.conn())
        .await?;
    sqlx::query(sql::DELETE_SANDBOX_LOGS_PAST_RETENTION)
        .bind(now)
        .execute(tx.conn())
        .await?;
    report.logs_expired += gone.len() as u64;
    tx.commit(&store.changed).await
}

impl SqlStore {
    /// Sandbox `sandbox_id`'s kept log (oldest first); NOT_FOUND unless it
    /// was `team`'s and is kept.
    pub async fn read_sandbox_log(
        &self,
        sandbox_id: &str,
        team: &str,
    ) -> Result<Vec<SandboxLogLine>> {
        if let Some(exec) = &self.exec {
            let (s, id, team) = (self.clone(), sandbox_id.to_string(), team.to_string());
            return super::run_on(
                exec,
                async move { s.read_sandbox_log_now(&id, &team).await },
            );
        }
        self.read_sandbox_log_now(sandbox_id, team).await
    }

    async fn read_sandbox_log_now(
        &self,
        sandbox_id: &str,
        team: &str,
    ) -> Result<Vec<SandboxLogLine>> {
        read(self, sandbox_id, team).await
    }
}
