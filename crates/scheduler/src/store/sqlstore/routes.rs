//! The route columns `LookupNode` answers with: one sandbox's, a batch's
//! (the route view re-reading what the change log says changed), and a page
//! in id order (the route view loading every binding at start).

use super::{parse_state, run_on, sql, to_i64, to_u64, RouteRow, SqlStore};
use crate::error::Result;
use sqlx::any::AnyRow;
use sqlx::Row;
use std::sync::atomic::Ordering;

/// Most ids bound in one batch read (SQLite allows 32 766 parameters).
const BATCH_IDS: usize = 256;

impl SqlStore {
    /// Where a sandbox is, if it exists (the columns `LookupNode` answers).
    pub async fn route(&self, sandbox_id: &str) -> Result<Option<RouteRow>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), sandbox_id.to_string());
            return run_on(exec, async move { s.route_now(&id).await });
        }
        self.route_now(sandbox_id).await
    }

    async fn route_now(&self, sandbox_id: &str) -> Result<Option<RouteRow>> {
        let row = sqlx::query(sql::ROUTE_BY_ID)
            .bind(sandbox_id)
            .fetch_optional(&self.reader)
            .await?;
        row.as_ref().map(route_from_row).transpose()
    }

    /// The routes of those of `ids` that exist, in no particular order.
    pub async fn routes(&self, ids: Vec<String>) -> Result<Vec<RouteRow>> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { s.routes_now(&ids).await });
        }
        self.routes_now(&ids).await
    }

    async fn routes_now(&self, ids: &[String]) -> Result<Vec<RouteRow>> {
        let mut out = Vec::with_capacity(ids.len());
        for chunk in ids.chunks(BATCH_IDS) {
            let text = sql::routes_by_ids(chunk.len());
            let mut q = sqlx::query(&text);
            for id in chunk {
                q = q.bind(id);
            }
            for row in q.fetch_all(&self.reader).await? {
                out.push(route_from_row(&row)?);
            }
        }
        Ok(out)
    }

    /// Up to `limit` routes whose ids sort after `after`, in id order.
    pub async fn route_page(&self, after: String, limit: u32) -> Result<Vec<RouteRow>> {
        if let Some(exec) = &self.exec {
            let s = self.clone();
            return run_on(exec, async move { s.route_page_now(&after, limit).await });
        }
        self.route_page_now(&after, limit).await
    }

    async fn route_page_now(&self, after: &str, limit: u32) -> Result<Vec<RouteRow>> {
        sqlx::query(sql::ROUTES_AFTER)
            .bind(after)
            .bind(to_i64(u64::from(limit)))
            .fetch_all(&self.reader)
            .await?
            .iter()
            .map(route_from_row)
            .collect()
    }

    /// The newest change-log revision this process has committed (0
    /// before its first write that logged a change).
    pub fn committed_revision(&self) -> u64 {
        self.committed.load(Ordering::Acquire)
    }
}

fn route_from_row(r: &AnyRow) -> Result<RouteRow> {
    Ok(RouteRow {
        sandbox_id: r.try_get("sandbox_id")?,
        node_id: r.try_get("node_id")?,
        endpoint: r.try_get("endpoint")?,
        generation: to_u64(r.try_get("generation")?, "generation")?,
        state: parse_state(r.try_get("state")?)?,
        team_id: r.try_get("team_id")?,
        auto_resume: r.try_get::<i64, _>("auto_resume")? != 0,
    })
}
