//! Nodes: registration, heartbeats, roster reconciliation and node choice.

use super::{clock_ms, to_i64, to_u32, to_u64, SqliteStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::{sql, types::*};
use sqlx::Row;
use std::collections::HashSet;
use std::time::Duration;

pub(super) async fn register(
    store: &SqliteStore,
    reg: NodeRegistration,
    lease: Duration,
) -> Result<Reconciled> {
    let mut tx = store.write().await?;
    let prev: Option<(i64, String)> = sqlx::query_as(sql::NODE_INCARNATION)
        .bind(&reg.node_id)
        .fetch_optional(tx.conn())
        .await?;
    let new_incarnation = prev
        .as_ref()
        .is_none_or(|(inc, _)| *inc != incarnation_to_db(reg.incarnation));
    let moved_endpoint = prev
        .as_ref()
        .is_some_and(|(_, ep)| *ep != reg.endpoint)
        .then_some(reg.endpoint.as_str());
    let lease_end = tx.now.saturating_add(lease_ms(lease));
    sqlx::query(sql::UPSERT_NODE)
        .bind(&reg.node_id)
        .bind(&reg.endpoint)
        .bind(i64::from(reg.capacity))
        .bind(incarnation_to_db(reg.incarnation))
        .bind(lease_end)
        .bind(tx.now)
        .bind(roster_json(&reg.roster))
        .execute(tx.conn())
        .await?;
    let out = reconcile(
        &mut tx,
        &reg.node_id,
        &reg.roster,
        new_incarnation,
        moved_endpoint,
    )
    .await?;
    tx.commit(&store.changed).await?;
    if new_incarnation {
        tracing::info!(node = %reg.node_id, incarnation = reg.incarnation, endpoint = %reg.endpoint,
            orphans = out.orphans.len(), "node registered");
    }
    Ok(out)
}

pub(super) async fn heartbeat(
    store: &SqliteStore,
    node_id: &str,
    incarnation: u64,
    roster: &[SandboxRef],
    lease: Duration,
) -> Result<Reconciled> {
    let mut tx = store.write().await?;
    let current: Option<(i64, String)> = sqlx::query_as(sql::NODE_INCARNATION)
        .bind(node_id)
        .fetch_optional(tx.conn())
        .await?;
    let Some((current, _)) = current else {
        return Err(Error::precondition(format!(
            "unknown node, register first (node {node_id})"
        )));
    };
    if current != incarnation_to_db(incarnation) {
        return Err(Error::precondition(format!(
            "stale incarnation {incarnation}: node {node_id} is registered at incarnation {}",
            incarnation_from_db(current)
        )));
    }
    let lease_end = tx.now.saturating_add(lease_ms(lease));
    let now = tx.now;
    sqlx::query(sql::RENEW_NODE)
        .bind(node_id)
        .bind(current)
        .bind(lease_end)
        .bind(roster_json(roster))
        .bind(now)
        .execute(tx.conn())
        .await?;
    let out = reconcile(&mut tx, node_id, roster, false, None).await?;
    tx.commit(&store.changed).await?;
    Ok(out)
}

/// Brings this node's bindings in line with what it reports hosting:
/// - a new incarnation lost everything not in its roster: removed (fenced);
/// - LOST and in the roster: the node is alive and has it, RUNNING again;
/// - LOST or EXPIRING and not in the roster: the node is alive and lacks it
///   (it died, or was killed and the DELETE report got lost), removed;
/// - a moved endpoint is copied to every binding (gateways re-resolve on STATE).
///
/// Returns the roster entries not assigned to this node at that generation
/// (orphans) and the bindings waiting for their kill (expired).
async fn reconcile(
    tx: &mut WriteTx,
    node_id: &str,
    roster: &[SandboxRef],
    new_incarnation: bool,
    moved_endpoint: Option<&str>,
) -> Result<Reconciled> {
    let rows = sqlx::query(sql::NODE_BINDINGS)
        .bind(node_id)
        .fetch_all(tx.conn())
        .await?;
    let hosted: HashSet<(&str, u64)> = roster
        .iter()
        .map(|r| (r.sandbox_id.as_str(), r.generation))
        .collect();
    let mut assigned: HashSet<(String, u64)> = HashSet::new();
    let mut out = Reconciled::default();
    for row in &rows {
        let sandbox_id: String = row.try_get(0)?;
        let gen = to_u64(row.try_get(1)?, "generation")?;
        let mut state = super::parse_state(row.try_get(2)?)?;
        let endpoint: String = row.try_get(3)?;
        let fence = (sandbox_id.as_str(), node_id, gen);
        let has_it = hosted.contains(&(sandbox_id.as_str(), gen));
        // RUNNING/PAUSED/CREATING bindings missing from a same-incarnation
        // roster are left alone: the roster may predate their create.
        let gone = new_incarnation || matches!(state, State::Lost | State::Expiring);
        if !has_it && gone {
            tx.delete_fenced(&sandbox_id, node_id, gen).await?;
            continue;
        }
        if state == State::Lost
            && tx
                .set_state_fenced(fence, State::Lost, State::Running, ChangeKind::State)
                .await?
        {
            state = State::Running;
        }
        if let Some(ep) = moved_endpoint.filter(|ep| *ep != endpoint) {
            let moved = sqlx::query(sql::SET_ENDPOINT)
                .bind(&sandbox_id)
                .bind(node_id)
                .bind(to_i64(gen))
                .bind(ep)
                .bind(tx.now)
                .execute(tx.conn())
                .await?
                .rows_affected()
                == 1;
            if moved {
                tx.emit(ChangeKind::State, &sandbox_id, node_id, gen, Some(state))
                    .await?;
            }
        }
        if state == State::Expiring {
            out.expired.push(SandboxRef {
                sandbox_id: sandbox_id.clone(),
                generation: gen,
            });
        }
        assigned.insert((sandbox_id, gen));
    }
    out.orphans = roster
        .iter()
        .filter(|r| !assigned.contains(&(r.sandbox_id.clone(), r.generation)))
        .cloned()
        .collect();
    out.orphans.sort();
    out.orphans.dedup();
    Ok(out)
}

pub(super) async fn require(store: &SqliteStore, node_id: &str) -> Result<()> {
    let found: Option<(i64, String)> = sqlx::query_as(sql::NODE_INCARNATION)
        .bind(node_id)
        .fetch_optional(&store.reader)
        .await?;
    match found {
        Some(_) => Ok(()),
        None => Err(Error::precondition(format!(
            "unknown node, register first (node {node_id})"
        ))),
    }
}

pub(super) async fn list(store: &SqliteStore) -> Result<Vec<NodeRow>> {
    let now = clock_ms();
    let rows = sqlx::query(sql::LIST_NODES)
        .fetch_all(&store.reader)
        .await?;
    rows.iter()
        .map(|r| {
            let lease: i64 = r.try_get(4)?;
            Ok(NodeRow {
                node_id: r.try_get(0)?,
                endpoint: r.try_get(1)?,
                capacity: to_u32(r.try_get(2)?, "capacity")?,
                incarnation: incarnation_from_db(r.try_get(3)?),
                up: lease > now,
                lease_expires_at_ms: lease,
                registered_at_ms: r.try_get(5)?,
                sandboxes: to_u32(r.try_get(6)?, "sandbox count")?,
            })
        })
        .collect()
}

/// A node chosen for a placement.
pub(super) struct Chosen {
    pub node_id: String,
    pub endpoint: String,
}

/// Picks the node for a new assignment: `required` if it is live and has
/// room, else the least loaded live node with room other than `exclude`.
pub(super) async fn choose(
    tx: &mut WriteTx,
    required: Option<&str>,
    exclude: &str,
) -> Result<Chosen> {
    let now = tx.now;
    if let Some(node_id) = required {
        let row = sqlx::query(sql::NODE_FOR_PLACEMENT)
            .bind(node_id)
            .fetch_optional(tx.conn())
            .await?
            .ok_or_else(|| Error::precondition(format!("unknown node {node_id}")))?;
        let (capacity, lease, used): (i64, i64, i64) =
            (row.try_get(2)?, row.try_get(3)?, row.try_get(4)?);
        if lease <= now {
            return Err(Error::NodeDown(format!(
                "node {node_id} is down (its lease expired)"
            )));
        }
        if used >= capacity {
            return Err(Error::NoCapacity(format!(
                "node {node_id} is full ({used} of {capacity} sandboxes)"
            )));
        }
        return Ok(Chosen {
            node_id: row.try_get(0)?,
            endpoint: row.try_get(1)?,
        });
    }
    let row = sqlx::query(sql::LEAST_LOADED_NODE)
        .bind(now)
        .bind(exclude)
        .fetch_optional(tx.conn())
        .await?
        .ok_or_else(|| Error::NoCapacity("no live node with capacity".into()))?;
    Ok(Chosen {
        node_id: row.try_get(0)?,
        endpoint: row.try_get(1)?,
    })
}

/// The last roster a node reported, and when (store clock).
pub(super) async fn last_roster(
    tx: &mut WriteTx,
    node_id: &str,
) -> Result<Option<(HashSet<SandboxRef>, i64)>> {
    let row: Option<(String, i64)> = sqlx::query_as(sql::NODE_ROSTER)
        .bind(node_id)
        .fetch_optional(tx.conn())
        .await?;
    let Some((json, at)) = row else {
        return Ok(None);
    };
    let roster: Vec<SandboxRef> = serde_json::from_str(&json)
        .map_err(|e| Error::Corrupt(format!("roster of node {node_id}: {e}")))?;
    Ok(Some((roster.into_iter().collect(), at)))
}

fn roster_json(roster: &[SandboxRef]) -> String {
    serde_json::to_string(roster).unwrap_or_else(|_| "[]".into())
}

/// Incarnations are arbitrary u64s (nodes pick random ones); BIGINT is
/// signed, so they are stored bit for bit, not by value.
fn incarnation_to_db(v: u64) -> i64 {
    i64::from_ne_bytes(v.to_ne_bytes())
}

fn incarnation_from_db(v: i64) -> u64 {
    u64::from_ne_bytes(v.to_ne_bytes())
}

fn lease_ms(lease: Duration) -> i64 {
    i64::try_from(lease.as_millis()).unwrap_or(i64::MAX)
}
