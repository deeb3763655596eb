//! Nodes: registration, heartbeats, roster reconciliation and node choice.

use super::{to_i64, to_u32, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::{sql, types::*};
use sqlx::Row;
use std::collections::HashSet;
use std::time::Duration;

pub(super) async fn register(
    store: &SqlStore,
    reg: NodeRegistration,
    timing: NodeTiming,
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
    let lease_end = tx.now.saturating_add(ms(timing.lease));
    sqlx::query(sql::UPSERT_NODE)
        .bind(&reg.node_id)
        .bind(&reg.endpoint)
        .bind(i64::from(reg.capacity))
        .bind(incarnation_to_db(reg.incarnation))
        .bind(lease_end)
        .bind(tx.now)
        .bind(roster_json(&reg.roster))
        .bind(reg.cached_layers.join(" "))
        .bind(&reg.volume_store)
        .bind(to_i64(reg.volume_max_bytes))
        .execute(tx.conn())
        .await?;
    let out = reconcile(
        &mut tx,
        &reg.node_id,
        &reg.roster,
        Reconcile {
            new_incarnation,
            moved_endpoint,
            roster_grace: timing.roster_grace,
            paused: reg.lists_paused.then_some(&reg.paused[..]),
        },
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
    store: &SqlStore,
    node_id: &str,
    incarnation: u64,
    roster: (&[SandboxRef], Option<&[SandboxRef]>),
    cached_layers: Option<&[String]>,
    timing: NodeTiming,
) -> Result<Reconciled> {
    let (roster, paused) = roster;
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
    let lease_end = tx.now.saturating_add(ms(timing.lease));
    let now = tx.now;
    sqlx::query(sql::RENEW_NODE)
        .bind(node_id)
        .bind(current)
        .bind(lease_end)
        .bind(roster_json(roster))
        .bind(now)
        .bind(cached_layers.map(|l| l.join(" ")))
        .execute(tx.conn())
        .await?;
    // What ended since the sweep last ran goes EXPIRING now, so the
    // reconcile below hands it to the node in this very answer.
    let past_end = sqlx::query(sql::NODE_BINDINGS_PAST_END)
        .bind(node_id)
        .bind(now)
        .fetch_all(tx.conn())
        .await?;
    for row in &past_end {
        let sandbox_id: String = row.try_get(0)?;
        let gen = to_u64(row.try_get(1)?, "generation")?;
        tx.set_state_fenced(
            (sandbox_id.as_str(), node_id, gen),
            State::Running,
            State::Expiring,
            ChangeKind::State,
        )
        .await?;
    }
    let how = Reconcile {
        new_incarnation: false,
        moved_endpoint: None,
        roster_grace: timing.roster_grace,
        paused,
    };
    let mut out = reconcile(&mut tx, node_id, roster, how).await?;
    let next_end: Option<i64> = sqlx::query_scalar(sql::NODE_NEXT_END)
        .bind(node_id)
        .fetch_one(tx.conn())
        .await?;
    out.next_end_in = next_end
        .map(|end| Duration::from_millis(u64::try_from(end.saturating_sub(now)).unwrap_or(0)));
    tx.commit(&store.changed).await?;
    Ok(out)
}

/// What a reconcile knows besides the roster.
struct Reconcile<'a> {
    /// The node process was replaced: what it does not list is gone.
    new_incarnation: bool,
    /// The node now listens here.
    moved_endpoint: Option<&'a str>,
    /// How long a RUNNING/PAUSED/LOST binding may be missing from the roster.
    roster_grace: Duration,
    /// The roster's sandboxes the node says are paused; `None` from a node
    /// that does not say (then nothing is judged by it).
    paused: Option<&'a [SandboxRef]>,
}

/// Brings this node's bindings in line with what it reports hosting:
/// - a new incarnation lost everything not in its roster: removed (fenced);
/// - LOST and in the roster: the node is alive and has it, RUNNING again
///   (PAUSED again when the node says it is paused there: it was paused
///   before its node was cut off);
/// - EXPIRING and not in the roster: the node is alive and lacks it (it
///   was killed and the DELETE report got lost), removed;
/// - RUNNING, PAUSED or LOST and not in the roster: noted
///   (`missing_since_ms`) and removed once missing for `roster_grace` (the
///   sandbox died on the node without a DELETE; until then the roster may
///   just predate its create: a heartbeat sent before it, delayed or
///   failed over to another replica, arrives after it); listed again, the
///   note is cleared;
/// - RUNNING, unchanged for `roster_grace`, and paused on the node: PAUSED
///   (a pause whose answer never reached its gateway); PAUSED, unchanged
///   as long, and running there: RUNNING (for a node that lists what it
///   has paused);
/// - a moved endpoint is copied to every binding (gateways re-resolve on STATE).
///
/// Returns the roster entries not assigned to this node at that generation
/// (orphans) and the bindings waiting for their kill (expired).
async fn reconcile(
    tx: &mut WriteTx,
    node_id: &str,
    roster: &[SandboxRef],
    how: Reconcile<'_>,
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
        let missing_since: Option<i64> = row.try_get(4)?;
        let auto_pause = row.try_get::<i64, _>(5)? != 0;
        let updated_at: i64 = row.try_get(6)?;
        let fence = (sandbox_id.as_str(), node_id, gen);
        let has_it = hosted.contains(&(sandbox_id.as_str(), gen));
        let gone = how.new_incarnation || state == State::Expiring;
        if !has_it && gone {
            tx.delete_fenced(&sandbox_id, node_id, gen).await?;
            continue;
        }
        if !has_it && matches!(state, State::Running | State::Paused | State::Lost) {
            if missing(tx, fence, missing_since, how.roster_grace).await? {
                continue;
            }
        } else if has_it && missing_since.is_some() {
            set_missing_since(tx, fence, None).await?;
        }
        let this = SandboxRef {
            sandbox_id: sandbox_id.clone(),
            generation: gen,
        };
        let paused_there = how.paused.is_some_and(|p| p.contains(&this));
        let running_there = has_it && how.paused.is_some_and(|p| !p.contains(&this));
        if state == State::Lost && has_it {
            let back = if paused_there {
                State::Paused
            } else {
                State::Running
            };
            if tx
                .set_state_fenced(fence, State::Lost, back, ChangeKind::State)
                .await?
            {
                state = back;
            }
        }
        // Paused on its node while RUNNING here, unchanged for longer than
        // any roster can be stale: a pause whose answer was lost (the node
        // paused it, the gateway never reported it). Requests would be
        // answered "paused" and a resume refused as "already running", so
        // the node's word is taken (the deterministic simulation found it).
        // And the other way: PAUSED here, running there (a resume whose
        // answer was lost, or a LOST binding judged PAUSED from a roster
        // sent before its resume): a request would be answered "paused"
        // with the sandbox running; the node's word is taken alike.
        let settled = tx.now.saturating_sub(updated_at) >= ms(how.roster_grace);
        let healed = match state {
            State::Running if paused_there && settled => Some(State::Paused),
            State::Paused if running_there && settled => Some(State::Running),
            _ => None,
        };
        if let Some(to) = healed {
            if tx
                .set_state_fenced(fence, state, to, ChangeKind::State)
                .await?
            {
                tracing::warn!(sandbox = %sandbox_id, node = %node_id, generation = gen, state = ?to,
                    "binding state taken from its node: reported so for longer than --creating-timeout");
                state = to;
            }
        }
        if let Some(ep) = how.moved_endpoint.filter(|ep| *ep != endpoint) {
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
            let r = SandboxRef {
                sandbox_id: sandbox_id.clone(),
                generation: gen,
            };
            if auto_pause {
                out.to_pause.push(r);
            } else {
                out.expired.push(r);
            }
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

/// A RUNNING/PAUSED binding its node's roster lacks: notes since when, or
/// removes it (fenced) once that is `grace` ago. True when removed.
async fn missing(
    tx: &mut WriteTx,
    fence: (&str, &str, u64),
    since: Option<i64>,
    grace: Duration,
) -> Result<bool> {
    let Some(since) = since else {
        set_missing_since(tx, fence, Some(tx.now)).await?;
        return Ok(false);
    };
    if tx.now.saturating_sub(since) < ms(grace) {
        return Ok(false);
    }
    let (sandbox_id, node_id, gen) = fence;
    let removed = tx.delete_fenced(sandbox_id, node_id, gen).await?;
    if removed {
        tracing::warn!(sandbox = %sandbox_id, node = %node_id, generation = gen,
            missing_ms = tx.now.saturating_sub(since),
            "binding removed: its node has not listed the sandbox for longer than --creating-timeout");
    }
    Ok(removed)
}

/// **fenced** Notes (or clears) when the roster started lacking a binding.
/// Not a binding change: routing is unaffected, so nothing is logged.
async fn set_missing_since(
    tx: &mut WriteTx,
    fence: (&str, &str, u64),
    since: Option<i64>,
) -> Result<()> {
    let (sandbox_id, node_id, gen) = fence;
    sqlx::query(sql::SET_MISSING_SINCE)
        .bind(sandbox_id)
        .bind(node_id)
        .bind(to_i64(gen))
        .bind(since)
        .execute(tx.conn())
        .await?;
    Ok(())
}

pub(super) async fn require(store: &SqlStore, node_id: &str) -> Result<()> {
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

pub(super) async fn list(store: &SqlStore) -> Result<Vec<NodeRow>> {
    let now = store.clock_ms().await?;
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
                unreachable_since_ms: r.try_get(7)?,
                cached_layers: r
                    .try_get::<String, _>(8)?
                    .split_whitespace()
                    .map(str::to_string)
                    .collect(),
            })
        })
        .collect()
}

/// Marks a node unreachable (until its next heartbeat); false when it is
/// unknown or already marked.
pub(super) async fn mark_unreachable(store: &SqlStore, node_id: &str) -> Result<bool> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let marked = sqlx::query(sql::MARK_NODE_UNREACHABLE)
        .bind(node_id)
        .bind(now)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    tx.commit(&store.changed).await?;
    Ok(marked)
}

/// A node chosen for a placement.
pub(super) struct Chosen {
    pub node_id: String,
    pub endpoint: String,
}

/// Picks the node for a new assignment: `required` if it is live and has
/// room, else the least loaded live node with room other than `exclude`;
/// either with the volume store `store` when one is named.
pub(super) async fn choose(
    tx: &mut WriteTx,
    required: Option<&str>,
    exclude: &str,
    prefer_layer: Option<&str>,
    store: Option<&str>,
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
        let has: String = row.try_get(5)?;
        if let Some(kind) = store.filter(|k| *k != has) {
            return Err(Error::precondition(format!(
                "node {node_id} has no {kind} volume store"
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
        .bind(prefer_layer.map_or_else(|| "%".to_string(), |l| format!("%{l}%")))
        .bind(store.unwrap_or(""))
        .fetch_optional(tx.conn())
        .await?
        .ok_or_else(|| match store {
            Some(kind) => Error::NoCapacity(format!(
                "no live node with capacity has the {kind} volume store"
            )),
            None => Error::NoCapacity("no live node with capacity".into()),
        })?;
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

fn ms(d: Duration) -> i64 {
    i64::try_from(d.as_millis()).unwrap_or(i64::MAX)
}
