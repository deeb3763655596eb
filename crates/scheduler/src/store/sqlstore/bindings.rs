//! Bindings: place, reassign, record, node events, reads and timeouts.

use super::volumes::{self, Pin};
use super::{
    binding_from_row, map_json, nodes, sealed_env, sealed_token, to_i64, SqlStore, WriteTx,
};
use crate::error::{Error, Result};
use crate::store::{sql, types::*};

/// How many fresh ids to try before giving up on a (practically impossible)
/// run of collisions.
const ID_ATTEMPTS: usize = 5;
/// Rows scanned per query when a metadata filter is applied in Rust.
const FILTERED_BATCH: u32 = 500;

pub(super) async fn place(store: &SqlStore, mut spec: PlaceSpec) -> Result<Placed> {
    let mut tx = store.write().await?;
    if let Some(key) = &spec.idempotency_key {
        let row = sqlx::query(sql::BINDING_BY_KEY)
            .bind(&spec.team_id)
            .bind(key)
            .fetch_optional(tx.conn())
            .await?;
        if let Some(row) = row {
            let binding = binding_from_row(&row, &tx.sealer)?;
            let mounts = volumes::mounts_in(&mut tx, &binding.sandbox_id).await?;
            return Ok(Placed {
                binding,
                existing: true,
                mounts,
            });
        }
    }
    if let Some(parent) = &spec.fork_of {
        let parent = tx
            .binding(parent)
            .await?
            .filter(|p| p.team_id == spec.team_id)
            .ok_or_else(|| Error::NotFound(format!("sandbox {parent} not found")))?;
        spec.env_vars = parent.env_vars;
        spec.lifecycle = parent.lifecycle;
    }
    check_quota(&mut tx, &spec.team_id, spec.quota).await?;
    // A fork mounts its parent's volumes (on its parent's node); a create
    // the ones it names, which decide where it may go.
    let (mounts, pin) = match &spec.fork_of {
        Some(_) => (Vec::new(), Pin::Anywhere),
        None => volumes::resolve(&mut tx, &spec.team_id, &spec.volume_mounts).await?,
    };
    let (required, store_kind) = placement_for(&pin, spec.require_node_id.as_deref())?;
    let chosen = nodes::choose(
        &mut tx,
        required,
        spec.avoid_node_id.as_deref().unwrap_or(""),
        spec.prefer_layer.as_deref(),
        store_kind,
    )
    .await
    .map_err(|e| pinned(&pin, e))?;
    let generation = tx.next_generation().await?;
    let sandbox_id = fresh_sandbox_id(&mut tx).await?;
    let now = tx.now;
    let timeout_ms = i64::try_from(spec.timeout.as_millis()).unwrap_or(i64::MAX);
    let binding = BindingRow {
        sandbox_id,
        node_id: chosen.node_id,
        endpoint: chosen.endpoint,
        generation,
        state: State::Creating,
        team_id: spec.team_id,
        template_id: spec.template_id,
        started_at_ms: now,
        end_at_ms: now.saturating_add(timeout_ms),
        metadata: spec.metadata,
        env_vars: spec.env_vars,
        access_token: warren_core::id::random_token(32),
        cpu_count: spec.cpu_count,
        memory_mb: spec.memory_mb,
        assigned_at_ms: now,
        updated_at_ms: now,
        lifecycle: spec.lifecycle,
    };
    sqlx::query(sql::INSERT_BINDING)
        .bind(&binding.sandbox_id)
        .bind(&binding.node_id)
        .bind(&binding.endpoint)
        .bind(to_i64(binding.generation))
        .bind(binding.state.as_str())
        .bind(&binding.team_id)
        .bind(&binding.template_id)
        .bind(binding.started_at_ms)
        .bind(binding.end_at_ms)
        .bind(map_json(&binding.metadata))
        .bind(sealed_env(
            &tx.sealer,
            &binding.sandbox_id,
            &binding.env_vars,
        ))
        .bind(sealed_token(
            &tx.sealer,
            &binding.sandbox_id,
            &binding.access_token,
        ))
        .bind(i64::from(binding.cpu_count))
        .bind(i64::from(binding.memory_mb))
        .bind(binding.assigned_at_ms)
        .bind(binding.updated_at_ms)
        .bind(i64::from(binding.lifecycle.auto_pause))
        .bind(i64::from(binding.lifecycle.auto_resume))
        .bind(spec.idempotency_key.as_deref())
        .execute(tx.conn())
        .await?;
    tx.count_sandboxes(&binding.node_id, 1).await?;
    match &spec.fork_of {
        Some(parent) => volumes::copy_mounts(&mut tx, parent, &binding.sandbox_id).await?,
        None => volumes::write_mounts(&mut tx, &binding.sandbox_id, &mounts).await?,
    }
    let mounts = volumes::mounts_in(&mut tx, &binding.sandbox_id).await?;
    tx.commit(&store.changed).await?;
    Ok(Placed {
        binding,
        existing: false,
        mounts,
    })
}

/// The node a placement must use and the volume store it must have, for
/// a sandbox whose volumes say `pin` (and a caller that requires
/// `required`).
fn placement_for<'a>(
    pin: &'a Pin,
    required: Option<&'a str>,
) -> Result<(Option<&'a str>, Option<&'static str>)> {
    match pin {
        Pin::Anywhere => Ok((required, None)),
        Pin::SharedStore => Ok((required, Some(crate::store::volumes::STORE_SHARED))),
        Pin::Node(n) => match required {
            Some(r) if r != n => Err(Error::invalid(format!(
                "the sandbox must be on node {r}, but the volumes it mounts are on node {n}"
            ))),
            _ => Ok((Some(n.as_str()), None)),
        },
    }
}

/// A placement error, saying which volumes pinned the sandbox where.
fn pinned(pin: &Pin, e: Error) -> Error {
    match (pin, e) {
        (Pin::Node(n), Error::NodeDown(_)) => Error::NodeDown(format!(
            "the volumes the sandbox mounts are local to node {n}, which is down; they are \
             available again when that node is back"
        )),
        (Pin::Node(n), Error::NoCapacity(m)) => Error::NoCapacity(format!(
            "the volumes the sandbox mounts are local to node {n}, and it has no room: {m}"
        )),
        (_, e) => e,
    }
}

/// Refuses a new sandbox past the team's quotas, and takes one token from
/// its create-rate bucket. Runs in the placing transaction: writers are
/// serialized (one write lock, or PostgreSQL's advisory lock), so the
/// quotas hold across every gateway and scheduler replica.
async fn check_quota(tx: &mut WriteTx, team: &str, quota: Quota) -> Result<()> {
    if quota.max_sandboxes > 0 {
        let held: i64 = sqlx::query_scalar(sql::TEAM_SANDBOXES)
            .bind(team)
            .fetch_one(tx.conn())
            .await?;
        if held >= i64::from(quota.max_sandboxes) {
            return Err(Error::Quota(format!(
                "team {team} already has {held} sandboxes, its limit (--quota-sandboxes) is {}; \
                 kill one first",
                quota.max_sandboxes
            )));
        }
    }
    if quota.creates_per_minute > 0 {
        let now = tx.now;
        let per_minute = f64::from(quota.creates_per_minute);
        let row: Option<(f64, i64)> = sqlx::query_as(sql::TEAM_BUDGET)
            .bind(team)
            .fetch_optional(tx.conn())
            .await?;
        let tokens = match row {
            Some((tokens, at)) => {
                let elapsed_min = (now.saturating_sub(at)).max(0) as f64 / 60_000.0;
                (tokens + elapsed_min * per_minute).min(per_minute)
            }
            None => per_minute,
        };
        if tokens < 1.0 {
            let wait_s = ((1.0 - tokens) * 60.0 / per_minute).ceil();
            return Err(Error::Quota(format!(
                "team {team} created {} sandboxes in the last minute, its limit \
                 (--quota-creates-per-minute); try again in {wait_s} s",
                quota.creates_per_minute
            )));
        }
        sqlx::query(sql::UPSERT_TEAM_BUDGET)
            .bind(team)
            .bind(tokens - 1.0)
            .bind(now)
            .execute(tx.conn())
            .await?;
    }
    Ok(())
}

async fn fresh_sandbox_id(tx: &mut WriteTx) -> Result<String> {
    for _ in 0..ID_ATTEMPTS {
        let id = warren_core::id::new_sandbox_id();
        let taken: i64 = sqlx::query_scalar(sql::SANDBOX_ID_TAKEN)
            .bind(&id)
            .fetch_one(tx.conn())
            .await?;
        if taken == 0 {
            return Ok(id);
        }
    }
    Err(Error::Corrupt(format!(
        "{ID_ATTEMPTS} random sandbox ids in a row were taken"
    )))
}

pub(super) async fn reassign(
    store: &SqlStore,
    sandbox_id: &str,
    node_id: Option<&str>,
) -> Result<BindingRow> {
    let mut tx = store.write().await?;
    let old = tx
        .binding(sandbox_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} not found")))?;
    // Without a target, "move" means "somewhere else".
    let exclude = if node_id.is_none() { &old.node_id } else { "" };
    // Its volumes come along: local ones keep it on their node.
    let pin = volumes::pin_of(&volumes::mounts_in(&mut tx, sandbox_id).await?);
    if let Pin::Node(n) = &pin {
        if node_id.is_none() && *n == old.node_id {
            return Err(Error::NodeDown(format!(
                "sandbox {sandbox_id} mounts volumes local to node {n}, so it cannot move to \
                 another node; it can resume when node {n} is back"
            )));
        }
    }
    let (required, store_kind) = placement_for(&pin, node_id)?;
    let chosen = nodes::choose(&mut tx, required, exclude, None, store_kind)
        .await
        .map_err(|e| pinned(&pin, e))?;
    let generation = tx.next_generation().await?;
    let now = tx.now;
    let moved = sqlx::query(sql::REASSIGN)
        .bind(sandbox_id)
        .bind(&old.node_id)
        .bind(to_i64(old.generation))
        .bind(&chosen.node_id)
        .bind(&chosen.endpoint)
        .bind(to_i64(generation))
        .bind(now)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !moved {
        return Err(tx
            .explain_miss(sandbox_id, &old.node_id, old.generation)
            .await?);
    }
    tx.count_sandboxes(&old.node_id, -1).await?;
    tx.count_sandboxes(&chosen.node_id, 1).await?;
    tx.emit(
        ChangeKind::Moved,
        sandbox_id,
        &chosen.node_id,
        generation,
        Some(State::Creating),
    )
    .await?;
    let new = tx
        .binding(sandbox_id)
        .await?
        .ok_or_else(|| Error::Corrupt(format!("sandbox {sandbox_id} vanished mid-transaction")))?;
    tx.commit(&store.changed).await?;
    tracing::info!(sandbox = %sandbox_id, from = %old.node_id, to = %new.node_id, generation, "sandbox reassigned");
    Ok(new)
}

pub(super) async fn record_assignment(
    store: &SqlStore,
    sandbox_id: &str,
    node_id: &str,
    generation: u64,
) -> Result<BindingRow> {
    let mut tx = store.write().await?;
    let b = record_in(&mut tx, sandbox_id, node_id, generation).await?;
    tx.commit(&store.changed).await?;
    Ok(b)
}

/// CREATING → RUNNING, fenced; already RUNNING at that fence is success.
async fn record_in(
    tx: &mut WriteTx,
    sandbox_id: &str,
    node_id: &str,
    generation: u64,
) -> Result<BindingRow> {
    let fence = (sandbox_id, node_id, generation);
    tx.set_state_fenced(fence, State::Creating, State::Running, ChangeKind::Assigned)
        .await?;
    match tx.binding(sandbox_id).await? {
        Some(b) if b.node_id == node_id && b.generation == generation => match b.state {
            State::Running => Ok(b),
            other => Err(Error::precondition(format!(
                "sandbox {sandbox_id} is {}, not creating",
                other.as_str()
            ))),
        },
        _ => Err(tx.explain_miss(sandbox_id, node_id, generation).await?),
    }
}

pub(super) async fn apply_event(
    store: &SqlStore,
    node_id: &str,
    ev: &NodeEvent,
) -> Result<EventOutcome> {
    let mut tx = store.write().await?;
    let (id, gen) = (ev.sandbox_id.as_str(), ev.generation);
    let applied = |reason: &str| EventOutcome {
        applied: true,
        reason: reason.to_string(),
    };
    let outcome = match ev.kind {
        EventType::Create => match record_in(&mut tx, id, node_id, gen).await {
            Ok(_) => applied("running"),
            Err(e @ (Error::Store(_) | Error::Corrupt(_))) => return Err(e),
            Err(e) => missed(e),
        },
        EventType::Delete => {
            if tx.delete_fenced(id, node_id, gen).await? {
                applied("removed")
            } else {
                missed(tx.explain_miss(id, node_id, gen).await?)
            }
        }
        // An auto-pause sandbox's node froze it at its end (EXPIRING ->
        // PAUSED), or a gateway paused a running one.
        // Its paused record, if the report carries one, in the same
        // transaction: only a PAUSE that applies writes it.
        EventType::Pause if pause_at_end(&mut tx, (id, node_id, gen)).await? => {
            keep_paused(&mut tx, ev).await?;
            applied("paused at its end")
        }
        EventType::Pause => {
            match transition(&mut tx, (id, node_id, gen), State::Running, State::Paused).await? {
                // Already paused at this fence: a report sent again.
                Some(done) if done.applied => {
                    keep_paused(&mut tx, ev).await?;
                    done
                }
                Some(miss) => miss,
                None => {
                    keep_paused(&mut tx, ev).await?;
                    applied("paused")
                }
            }
        }
        // Running again where it was: what a filesystem-only pause left
        // of it is stale (a later loss of its node must not boot it from
        // that old layer), so its paused record goes in this transaction.
        EventType::Resume => {
            match transition(&mut tx, (id, node_id, gen), State::Paused, State::Running).await? {
                Some(miss) if !miss.applied => miss,
                done => {
                    super::records::drop_paused(&mut tx, id).await?;
                    done.unwrap_or_else(|| applied("running"))
                }
            }
        }
        EventType::Fork => match tx.binding(id).await? {
            Some(b) if b.node_id == node_id && b.generation == gen => applied("fork noted"),
            _ => missed(tx.explain_miss(id, node_id, gen).await?),
        },
    };
    tx.commit(&store.changed).await?;
    Ok(outcome)
}

/// Writes the paused record a PAUSE event carries, in place of the
/// sandbox's earlier one (at the version it is at now, under the write
/// lock). A record of another kind under that name stays, and the pause
/// applies without it.
async fn keep_paused(tx: &mut WriteTx, ev: &NodeEvent) -> Result<()> {
    let Some(record) = &ev.paused_record else {
        return Ok(());
    };
    let expected_version = match super::records::record_in(tx, &record.name).await? {
        None => 0,
        Some(old) if old.kind == crate::store::RecordKind::Paused => old.version,
        Some(old) => {
            tracing::warn!(sandbox_id = %ev.sandbox_id, record = %record.name, kind = old.kind.as_str(),
                "a record of another kind has the paused record's name; the pause goes without it");
            return Ok(());
        }
    };
    super::records::put_one(
        tx,
        &crate::store::RecordPut {
            record: record.clone(),
            expected_version,
        },
    )
    .await?;
    Ok(())
}

fn missed(e: Error) -> EventOutcome {
    EventOutcome {
        applied: false,
        reason: e.to_string(),
    }
}

/// EXPIRING → PAUSED for a binding with `auto_pause` (one conditional
/// statement, its change row in the same transaction): true when applied.
async fn pause_at_end(tx: &mut WriteTx, fence: (&str, &str, u64)) -> Result<bool> {
    let (sandbox_id, node_id, gen) = fence;
    let now = tx.now;
    let done = sqlx::query(sql::PAUSE_AT_END)
        .bind(sandbox_id)
        .bind(node_id)
        .bind(to_i64(gen))
        .bind(now)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if done {
        tx.emit(
            ChangeKind::State,
            sandbox_id,
            node_id,
            gen,
            Some(State::Paused),
        )
        .await?;
    }
    Ok(done)
}

/// A fenced `from` → `to` change for PAUSE/RESUME: `None` when applied (now
/// or already), else why not.
async fn transition(
    tx: &mut WriteTx,
    fence: (&str, &str, u64),
    from: State,
    to: State,
) -> Result<Option<EventOutcome>> {
    if tx
        .set_state_fenced(fence, from, to, ChangeKind::State)
        .await?
    {
        return Ok(None);
    }
    let (id, node_id, gen) = fence;
    Ok(match tx.binding(id).await? {
        Some(b) if b.node_id == node_id && b.generation == gen => {
            if b.state == to {
                Some(EventOutcome {
                    applied: true,
                    reason: format!("already {}", to.as_str()),
                })
            } else {
                Some(missed(Error::precondition(format!(
                    "sandbox {id} is {}, not {}",
                    b.state.as_str(),
                    from.as_str()
                ))))
            }
        }
        _ => Some(missed(tx.explain_miss(id, node_id, gen).await?)),
    })
}

pub(super) async fn list(
    store: &SqlStore,
    filter: &ListFilter,
) -> Result<(Vec<BindingRow>, Option<ListCursor>)> {
    let limit = filter.limit.max(1);
    // Keyset pagination: each order's condition continues strictly after
    // the cursor `($1 id, $5 started_at)`, so pages never overlap or skip.
    let (after_rows, order_by, mut after) = match (filter.order, &filter.after) {
        (ListOrder::ById, c) => (
            "sandbox_id > $1 AND $5 = $5",
            "sandbox_id",
            c.clone().unwrap_or(ListCursor {
                sandbox_id: String::new(),
                started_at_ms: 0,
            }),
        ),
        (ListOrder::StartedDesc, c) => (
            "(started_at_ms < $5 OR (started_at_ms = $5 AND sandbox_id < $1))",
            "started_at_ms DESC, sandbox_id DESC",
            c.clone().unwrap_or(ListCursor {
                sandbox_id: String::new(),
                started_at_ms: i64::MAX,
            }),
        ),
        (ListOrder::StartedAsc, c) => (
            "(started_at_ms > $5 OR (started_at_ms = $5 AND sandbox_id > $1))",
            "started_at_ms, sandbox_id",
            c.clone().unwrap_or(ListCursor {
                sandbox_id: String::new(),
                started_at_ms: i64::MIN,
            }),
        ),
    };
    let mut query = String::from(sql::LIST_BINDINGS_PREFIX);
    query.push_str(after_rows);
    query.push_str(" AND ($2 = '' OR team_id = $2) AND ($3 = '' OR node_id = $3)");
    if !filter.states.is_empty() {
        // Spelled from the fixed enum, never from client text.
        let states: Vec<String> = filter
            .states
            .iter()
            .map(|s| format!("'{}'", s.as_str()))
            .collect();
        query.push_str(&format!(" AND state IN ({})", states.join(", ")));
    }
    query.push_str(&format!(" ORDER BY {order_by} LIMIT $4"));
    // Without a metadata filter one query of limit+1 rows says whether there is more.
    let batch = if filter.metadata.is_empty() {
        limit + 1
    } else {
        FILTERED_BATCH
    };
    let mut out: Vec<BindingRow> = Vec::new();
    loop {
        let rows = sqlx::query(&query)
            .bind(&after.sandbox_id)
            .bind(filter.team_id.as_deref().unwrap_or(""))
            .bind(filter.node_id.as_deref().unwrap_or(""))
            .bind(i64::from(batch))
            .bind(after.started_at_ms)
            .fetch_all(&store.reader)
            .await?;
        let exhausted = rows.len() < batch as usize;
        for row in &rows {
            let b = binding_from_row(row, &store.sealer)?;
            after = ListCursor {
                sandbox_id: b.sandbox_id.clone(),
                started_at_ms: b.started_at_ms,
            };
            let matches = filter
                .metadata
                .iter()
                .all(|(k, v)| b.metadata.get(k) == Some(v));
            if matches {
                out.push(b);
                if out.len() > limit as usize {
                    break;
                }
            }
        }
        if out.len() > limit as usize || exhausted {
            break;
        }
    }
    if out.len() > limit as usize {
        out.truncate(limit as usize);
        let next = out.last().map(|b| ListCursor {
            sandbox_id: b.sandbox_id.clone(),
            started_at_ms: b.started_at_ms,
        });
        return Ok((out, next));
    }
    Ok((out, None))
}

pub(super) async fn set_end_at(
    store: &SqlStore,
    sandbox_id: &str,
    end_at_ms: i64,
) -> Result<BindingRow> {
    let mut tx = store.write().await?;
    let b = tx
        .binding(sandbox_id)
        .await?
        .ok_or_else(|| Error::NotFound(format!("sandbox {sandbox_id} not found")))?;
    if b.state == State::Expiring {
        return Err(Error::precondition(format!(
            "sandbox {sandbox_id} is expiring; its timeout can no longer change"
        )));
    }
    let live = matches!(b.state, State::Creating | State::Running | State::Paused);
    let state = if end_at_ms <= tx.now && live {
        State::Expiring
    } else {
        b.state
    };
    let now = tx.now;
    let done = sqlx::query(sql::SET_END_AT)
        .bind(sandbox_id)
        .bind(&b.node_id)
        .bind(to_i64(b.generation))
        .bind(end_at_ms)
        .bind(state.as_str())
        .bind(now)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !done {
        return Err(tx
            .explain_miss(sandbox_id, &b.node_id, b.generation)
            .await?);
    }
    if state != b.state {
        tx.emit(
            ChangeKind::State,
            sandbox_id,
            &b.node_id,
            b.generation,
            Some(state),
        )
        .await?;
    }
    let updated = tx
        .binding(sandbox_id)
        .await?
        .ok_or_else(|| Error::Corrupt(format!("sandbox {sandbox_id} vanished mid-transaction")))?;
    tx.commit(&store.changed).await?;
    Ok(updated)
}
