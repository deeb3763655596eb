//! The sweep pass, the change log reads and the census.

use super::{nodes, parse_state, to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::{sql, types::*};
use sqlx::Row;
use std::collections::{HashMap, HashSet};

/// Bindings handled per step per pass, so one pass never holds the write lock
/// for long; the next pass continues.
const SWEEP_BATCH: i64 = 1000;

pub(super) async fn run(store: &SqlStore, settings: &SweepSettings) -> Result<SweepReport> {
    let mut report = SweepReport::default();
    if settings.expire_nodes {
        let mut tx = store.write().await?;
        expire_nodes(&mut tx, &mut report).await?;
        tx.commit(&store.changed).await?;
    }
    let mut tx = store.write().await?;
    expire_bindings(&mut tx, &mut report).await?;
    tx.commit(&store.changed).await?;

    if let Some(retention) = settings.paused_retention {
        let mut tx = store.write().await?;
        let keep = i64::try_from(retention.as_millis()).unwrap_or(i64::MAX);
        let cutoff = tx.now.saturating_sub(keep);
        retire_paused(&mut tx, cutoff, &mut report).await?;
        tx.commit(&store.changed).await?;
    }

    let mut tx = store.write().await?;
    let timeout = i64::try_from(settings.creating_timeout.as_millis()).unwrap_or(i64::MAX);
    let cutoff = tx.now.saturating_sub(timeout);
    resolve_stuck_creates(&mut tx, cutoff, &mut report).await?;
    tx.commit(&store.changed).await?;

    // The records' TTLs (the gateways named them when they made each one).
    super::builds::sweep(store, &mut report).await?;
    super::uploads::sweep(store, &mut report).await?;
    let stale = super::volumes::sweep(store).await?;
    if stale > 0 {
        tracing::debug!(
            stale,
            "removed the volume mounts of sandboxes that are gone"
        );
    }

    let bounds = change_bounds(store).await?;
    if bounds.head > settings.watch_retention {
        let keep_after = bounds.head - settings.watch_retention;
        report.changes_pruned = sqlx::query(sql::PRUNE_CHANGES)
            .bind(to_i64(keep_after))
            .execute(&store.writer)
            .await?
            .rows_affected();
    }
    Ok(report)
}

/// Nodes whose lease ran out go DOWN; everything they held goes LOST.
async fn expire_nodes(tx: &mut WriteTx, report: &mut SweepReport) -> Result<()> {
    let now = tx.now;
    let expired: Vec<(String, i64)> = sqlx::query_as(sql::NODES_PAST_LEASE)
        .bind(now)
        .fetch_all(tx.conn())
        .await?;
    for (node_id, lease_expired_at) in expired {
        let down = sqlx::query(sql::MARK_NODE_DOWN)
            .bind(&node_id)
            .bind(now)
            .execute(tx.conn())
            .await?
            .rows_affected()
            == 1;
        if !down {
            continue;
        }
        report.nodes_down += 1;
        let rows = sqlx::query(sql::NODE_BINDINGS)
            .bind(&node_id)
            .fetch_all(tx.conn())
            .await?;
        let mut lost = 0;
        for row in &rows {
            let sandbox_id: String = row.try_get(0)?;
            let gen = to_u64(row.try_get(1)?, "generation")?;
            let state = parse_state(row.try_get(2)?)?;
            if state == State::Lost {
                continue;
            }
            let fence = (sandbox_id.as_str(), node_id.as_str(), gen);
            tx.change_at = Some(lease_expired_at);
            let marked = tx
                .set_state_fenced(fence, state, State::Lost, ChangeKind::Lost)
                .await;
            tx.change_at = None;
            if marked? {
                lost += 1;
            }
        }
        report.bindings_lost += lost;
        tracing::warn!(node = %node_id, bindings_lost = lost, "node lease expired; node is down");
    }
    Ok(())
}

/// Past `end_at`: live bindings go EXPIRING (their node kills them when its
/// heartbeat returns them); LOST ones are removed, since their node is not
/// there to do it (if it comes back, the sandbox is an orphan and is killed).
async fn expire_bindings(tx: &mut WriteTx, report: &mut SweepReport) -> Result<()> {
    let rows = sqlx::query(sql::BINDINGS_PAST_END)
        .bind(tx.now)
        .bind(SWEEP_BATCH)
        .fetch_all(tx.conn())
        .await?;
    for row in &rows {
        let sandbox_id: String = row.try_get(0)?;
        let node_id: String = row.try_get(1)?;
        let gen = to_u64(row.try_get(2)?, "generation")?;
        let state = parse_state(row.try_get(3)?)?;
        if state == State::Lost {
            if tx.delete_fenced(&sandbox_id, &node_id, gen).await? {
                report.bindings_removed += 1;
            }
            continue;
        }
        let fence = (sandbox_id.as_str(), node_id.as_str(), gen);
        if tx
            .set_state_fenced(fence, state, State::Expiring, ChangeKind::State)
            .await?
        {
            report.bindings_expired += 1;
        }
    }
    Ok(())
}

/// Paused since `cutoff` or earlier (`--paused-retention`): EXPIRING, and
/// no longer auto-pause, so the node's next heartbeat has it delete the
/// sandbox (and its disk) instead of freezing it again.
async fn retire_paused(tx: &mut WriteTx, cutoff: i64, report: &mut SweepReport) -> Result<()> {
    let rows: Vec<(String, String, i64)> = sqlx::query_as(sql::PAUSED_SINCE)
        .bind(cutoff)
        .bind(SWEEP_BATCH)
        .fetch_all(tx.conn())
        .await?;
    for (sandbox_id, node_id, gen) in rows {
        let retired = sqlx::query(sql::RETIRE_PAUSED)
            .bind(&sandbox_id)
            .bind(&node_id)
            .bind(gen)
            .bind(tx.now)
            .execute(tx.conn())
            .await?
            .rows_affected()
            == 1;
        if retired {
            let gen = to_u64(gen, "generation")?;
            tx.emit(
                ChangeKind::State,
                &sandbox_id,
                &node_id,
                gen,
                Some(State::Expiring),
            )
            .await?;
            report.paused_retired += 1;
        }
    }
    Ok(())
}

/// CREATING bindings assigned before `cutoff`: the node's last roster decides.
/// In it → RUNNING; absent from a roster reported after the assignment →
/// removed; no roster since the assignment → wait for one.
async fn resolve_stuck_creates(
    tx: &mut WriteTx,
    cutoff: i64,
    report: &mut SweepReport,
) -> Result<()> {
    let rows = sqlx::query(sql::STUCK_CREATES)
        .bind(cutoff)
        .bind(SWEEP_BATCH)
        .fetch_all(tx.conn())
        .await?;
    let mut rosters: HashMap<String, Option<(HashSet<SandboxRef>, i64)>> = HashMap::new();
    for row in &rows {
        let sandbox_id: String = row.try_get(0)?;
        let node_id: String = row.try_get(1)?;
        let gen = to_u64(row.try_get(2)?, "generation")?;
        let assigned_at: i64 = row.try_get(3)?;
        if !rosters.contains_key(&node_id) {
            let roster = nodes::last_roster(tx, &node_id).await?;
            rosters.insert(node_id.clone(), roster);
        }
        let Some(Some((roster, roster_at))) = rosters.get(&node_id) else {
            continue;
        };
        let hosted = roster.contains(&SandboxRef {
            sandbox_id: sandbox_id.clone(),
            generation: gen,
        });
        let fence = (sandbox_id.as_str(), node_id.as_str(), gen);
        if hosted {
            if tx
                .set_state_fenced(fence, State::Creating, State::Running, ChangeKind::Assigned)
                .await?
            {
                report.creates_confirmed += 1;
            }
        } else if *roster_at > assigned_at && tx.delete_fenced(&sandbox_id, &node_id, gen).await? {
            report.bindings_removed += 1;
            tracing::info!(sandbox = %sandbox_id, node = %node_id, generation = gen,
                "stuck create removed: its node does not host it");
        }
    }
    Ok(())
}

pub(super) async fn change_bounds(store: &SqlStore) -> Result<ChangeBounds> {
    let (oldest, head): (Option<i64>, i64) = sqlx::query_as(sql::CHANGE_BOUNDS)
        .fetch_one(&store.reader)
        .await?;
    Ok(ChangeBounds {
        oldest: oldest.map(|o| to_u64(o, "revision")).transpose()?,
        head: to_u64(head, "revision")?,
    })
}

pub(super) async fn changes_after(store: &SqlStore, after: u64, limit: u32) -> Result<Vec<Change>> {
    let rows = sqlx::query(sql::CHANGES_AFTER)
        .bind(to_i64(after))
        .bind(i64::from(limit))
        .fetch_all(&store.reader)
        .await?;
    rows.iter()
        .map(|r| {
            let kind: String = r.try_get(1)?;
            let state: String = r.try_get(5)?;
            Ok(Change {
                revision: to_u64(r.try_get(0)?, "revision")?,
                kind: ChangeKind::parse(&kind)
                    .ok_or_else(|| Error::Corrupt(format!("unknown change kind {kind:?}")))?,
                sandbox_id: r.try_get(2)?,
                node_id: r.try_get(3)?,
                generation: to_u64(r.try_get(4)?, "generation")?,
                state: if state.is_empty() {
                    None
                } else {
                    Some(parse_state(&state)?)
                },
                at_ms: r.try_get(6)?,
            })
        })
        .collect()
}

pub(super) async fn census(store: &SqlStore) -> Result<Census> {
    let (up, total): (i64, i64) = sqlx::query_as(sql::NODE_CENSUS)
        .bind(store.clock_ms().await?)
        .fetch_one(&store.reader)
        .await?;
    let rows: Vec<(String, i64)> = sqlx::query_as(sql::BINDING_CENSUS)
        .fetch_all(&store.reader)
        .await?;
    let mut bindings: Vec<(State, u64)> = State::ALL.iter().map(|s| (*s, 0)).collect();
    for (state, n) in rows {
        let state = parse_state(&state)?;
        if let Some(slot) = bindings.iter_mut().find(|(s, _)| *s == state) {
            slot.1 = to_u64(n, "count")?;
        }
    }
    Ok(Census {
        nodes_up: to_u64(up, "count")?,
        nodes_down: to_u64(total - up, "count")?,
        bindings,
    })
}

pub(super) async fn issued_generation(store: &SqlStore) -> Result<u64> {
    let v: i64 = sqlx::query_scalar(sql::COUNTER)
        .bind("generation")
        .fetch_one(&store.reader)
        .await?;
    to_u64(v, "generation")
}
