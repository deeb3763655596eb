//! Template builds and their logs, readable through any gateway.
//!
//! - **Bounds on builds held** (waiting, building, finished and still
//!   readable), checked in the creating transaction: past the team's bound
//!   the team's oldest finished build is dropped, and the create is refused
//!   only when every one is waiting or building; the same for every team's
//!   builds together.
//! - **Lease.** A gateway claims a waiting build (WAITING → BUILDING, one
//!   conditional statement: of two gateways exactly one wins) with a lease
//!   it renews; every write of the owner (renew, log lines, the end) is
//!   fenced on `(build_id, owner, building, lease not run out)`. A build
//!   whose lease runs out is **failed** by the sweep (ERROR, the reason
//!   naming the owner and when its lease ran out), never handed to
//!   another gateway: a build's RUN steps have run in a sandbox the dead
//!   gateway made, and running them again elsewhere could repeat what they
//!   did outside it. The SDK sees the error and can build again.
//! - **Repeats.** A call sent again because its answer was lost finds its
//!   own result: the same create, claim (same owner) or end answers as the
//!   first did, and an append names its batch number (increasing per
//!   build), so a batch sent twice is appended once.
//! - **Logs** live in `build_logs`, one row a line, numbered from 0 in
//!   order (`seq`, the read cursor). Each line costs its text plus
//!   [`LINE_COST`]; an append keeps the build's and the team's bounds in its
//!   own transaction: past the team's, the team's oldest finished builds'
//!   logs are dropped first (each left with one line saying so), then the
//!   line itself is dropped; past the build's, the line is dropped. The
//!   first dropped line leaves a notice; notices cost nothing.
//! - **TTLs** (from the create call): a waiting build is gone at its start
//!   deadline, a finished one its retention after it finished. Reads hide
//!   them at once; the sweep deletes them (with their logs).

use super::{to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::records::*;
use crate::store::sql_records as sql;
use crate::store::SweepReport;
use sqlx::any::AnyRow;
use sqlx::Row;

/// What one log line costs besides its text (the gateway's held builds
/// counted the same).
pub const LINE_COST: u64 = 64;

/// Rows per sweep step.
const SWEEP_BATCH: i64 = 1000;

fn build_from_row(r: &AnyRow) -> Result<BuildRow> {
    let status: String = r.try_get("status")?;
    Ok(BuildRow {
        build_id: r.try_get("build_id")?,
        team_id: r.try_get("team_id")?,
        template_name: r.try_get("template_name")?,
        status: BuildStatus::parse(&status)
            .ok_or_else(|| Error::Corrupt(format!("unknown build status {status:?}")))?,
        request_json: r.try_get("request")?,
        plan_json: r.try_get("plan")?,
        owner: r.try_get("owner")?,
        lease_expires_at_ms: r.try_get("lease_expires_at_ms")?,
        requested_at_ms: r.try_get("requested_at_ms")?,
        start_deadline_ms: r.try_get("start_deadline_ms")?,
        retention_ms: r.try_get("retention_ms")?,
        started_at_ms: r.try_get("started_at_ms")?,
        finished_at_ms: r.try_get("finished_at_ms")?,
        expires_at_ms: r.try_get("expires_at_ms")?,
        reason_message: r.try_get("reason_message")?,
        reason_step: r.try_get("reason_step")?,
        log_bytes: to_u64(r.try_get("log_bytes")?, "log_bytes")?,
        log_next_seq: to_u64(r.try_get("log_next_seq")?, "log_next_seq")?,
        log_truncated: r.try_get::<i64, _>("log_truncated")? != 0,
        log_batch: to_u64(r.try_get("log_batch")?, "log_batch")?,
    })
}

/// Whether a reader may still see `b` at `now` (see the module doc).
fn visible(b: &BuildRow, now: i64) -> bool {
    match b.status {
        BuildStatus::Waiting => b.start_deadline_ms > now,
        BuildStatus::Building => true,
        BuildStatus::Ready | BuildStatus::Error => b.expires_at_ms > now,
    }
}

async fn build_in(tx: &mut WriteTx, id: &str) -> Result<Option<BuildRow>> {
    let row = sqlx::query(sql::BUILD_BY_ID)
        .bind(id)
        .fetch_optional(tx.conn())
        .await?;
    row.as_ref().map(build_from_row).transpose()
}

fn not_found(id: &str) -> Error {
    Error::NotFound(format!("template build {id} not found"))
}

async fn delete_build(tx: &mut WriteTx, id: &str) -> Result<u64> {
    let n = sqlx::query(sql::DELETE_BUILD)
        .bind(id)
        .execute(tx.conn())
        .await?
        .rows_affected();
    drop_rows(tx, id).await?;
    Ok(n)
}

async fn drop_rows(tx: &mut WriteTx, id: &str) -> Result<()> {
    for q in [sql::DELETE_BUILD_LOGS, sql::DELETE_BUILD_UPLOADS] {
        sqlx::query(q).bind(id).execute(tx.conn()).await?;
    }
    Ok(())
}

async fn count(tx: &mut WriteTx, team: Option<&str>) -> Result<u64> {
    let now = tx.now;
    let n: i64 = match team {
        Some(t) => {
            sqlx::query_scalar(sql::TEAM_BUILDS_HELD)
                .bind(t)
                .bind(now)
                .fetch_one(tx.conn())
                .await?
        }
        None => {
            sqlx::query_scalar(sql::ALL_BUILDS_HELD)
                .bind(now)
                .fetch_one(tx.conn())
                .await?
        }
    };
    to_u64(n, "count")
}

/// Makes room under one bound: drops the oldest finished build (of `team`),
/// or refuses.
async fn make_room(tx: &mut WriteTx, team: Option<&str>, max: u64, team_id: &str) -> Result<()> {
    if max == 0 {
        return Ok(());
    }
    let held = count(tx, team).await?;
    if held < max {
        return Ok(());
    }
    let victim: Option<String> = sqlx::query_scalar(sql::OLDEST_FINISHED_BUILD)
        .bind(team.unwrap_or(""))
        .bind(tx.now)
        .fetch_optional(tx.conn())
        .await?;
    match victim {
        Some(id) => {
            delete_build(tx, &id).await?;
            Ok(())
        }
        None if team.is_some() => Err(Error::Bound {
            message: format!(
                "team {team_id} holds {held} template builds, all waiting or building, its \
                 bound is {max}; start or finish one first, or wait until the requested ones \
                 expire"
            ),
            bound: warren_proto::BOUND_TEAM_BUILDS,
        }),
        None => Err(Error::Bound {
            message: format!(
                "{held} template builds are held, all waiting or building, the bound for every \
                 team together is {max}; try again later"
            ),
            bound: warren_proto::BOUND_TOTAL_BUILDS,
        }),
    }
}

pub(super) async fn create(store: &SqlStore, b: &NewBuild) -> Result<BuildRow> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let old = build_in(&mut tx, &b.build_id).await?;
    if let Some(old) = old.as_ref().filter(|o| !visible(o, now)) {
        // Past its TTL and not swept yet: gone, as readers see it.
        delete_build(&mut tx, &old.build_id).await?;
    } else if let Some(old) = old {
        // The same create again (its answer was lost) finds its build.
        let same = old.team_id == b.team_id
            && old.template_name == b.template_name
            && old.request_json == b.request_json;
        if same {
            return Ok(old);
        }
        return Err(Error::AlreadyExists(format!(
            "template build {} already exists",
            b.build_id
        )));
    }
    make_room(&mut tx, Some(&b.team_id), b.max_team_builds, &b.team_id).await?;
    make_room(&mut tx, None, b.max_total_builds, &b.team_id).await?;
    let made = sqlx::query(sql::INSERT_BUILD)
        .bind(&b.build_id)
        .bind(&b.team_id)
        .bind(&b.template_name)
        .bind(&b.request_json)
        .bind(now)
        .bind(now.saturating_add(b.start_ttl_ms))
        .bind(b.retention_ms)
        .execute(tx.conn())
        .await?
        .rows_affected();
    if made != 1 {
        return Err(Error::AlreadyExists(format!(
            "template build {} already exists",
            b.build_id
        )));
    }
    let row = build_in(&mut tx, &b.build_id)
        .await?
        .ok_or_else(|| not_found(&b.build_id))?;
    tx.commit(&store.changed).await?;
    Ok(row)
}

/// A build a reader may see (hidden once past its TTL).
pub(super) async fn get(store: &SqlStore, id: &str) -> Result<Option<BuildRow>> {
    let now = store.clock_ms().await?;
    let row = sqlx::query(sql::BUILD_BY_ID)
        .bind(id)
        .fetch_optional(&store.reader)
        .await?;
    Ok(row
        .as_ref()
        .map(build_from_row)
        .transpose()?
        .filter(|b| visible(b, now)))
}

/// A page of the team's builds, newest first; where the next one starts.
pub(super) async fn list(
    store: &SqlStore,
    team: &str,
    template: &str,
    after: Option<(i64, String)>,
    limit: u32,
) -> Result<(Vec<BuildRow>, Option<(i64, String)>)> {
    let now = store.clock_ms().await?;
    let limit = limit.max(1);
    let (at, id) = after.unwrap_or((i64::MAX, String::new()));
    // No cursor: every build was requested before i64::MAX.
    let rows = sqlx::query(sql::LIST_BUILDS)
        .bind(team)
        .bind(template)
        .bind(now)
        .bind(at)
        .bind(id)
        .bind(i64::from(limit) + 1)
        .fetch_all(&store.reader)
        .await?;
    let mut out = rows
        .iter()
        .map(build_from_row)
        .collect::<Result<Vec<_>>>()?;
    if out.len() > limit as usize {
        out.truncate(limit as usize);
        let next = out.last().map(|b| (b.requested_at_ms, b.build_id.clone()));
        return Ok((out, next));
    }
    Ok((out, None))
}

/// **fenced** WAITING → BUILDING for `claim.owner`, with the uploads the
/// build reads (each must be the team's and not expired); they are held
/// (their blobs stay) while it builds.
pub(super) async fn claim(
    store: &SqlStore,
    claim: &BuildClaim,
) -> Result<(BuildRow, Vec<UploadRow>)> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let mut uploads = Vec::with_capacity(claim.upload_hashes.len());
    for hash in &claim.upload_hashes {
        match super::uploads::get_in(&mut tx, &claim.team_id, hash).await? {
            Some(u) if u.expires_at_ms > now => uploads.push(u),
            _ => {
                return Err(Error::Refused {
                    message: format!(
                        "team {} has no upload of the files with hash {hash} (never uploaded, \
                         or expired)",
                        claim.team_id
                    ),
                    reason: warren_proto::REASON_UPLOAD_MISSING,
                })
            }
        }
    }
    let claimed = sqlx::query(sql::CLAIM_BUILD)
        .bind(&claim.build_id)
        .bind(&claim.team_id)
        .bind(&claim.template_name)
        .bind(&claim.owner)
        .bind(now.saturating_add(claim.lease_ms))
        .bind(now)
        .bind(&claim.plan_json)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !claimed {
        let id = &claim.build_id;
        return Err(match build_in(&mut tx, id).await? {
            // The same claim again (its answer was lost): it holds.
            Some(b)
                if b.status == BuildStatus::Building
                    && b.owner == claim.owner
                    && b.team_id == claim.team_id
                    && b.template_name == claim.template_name =>
            {
                return Ok((b, uploads));
            }
            Some(b)
                if b.team_id == claim.team_id
                    && b.template_name == claim.template_name
                    && visible(&b, now) =>
            {
                Error::Refused {
                    message: format!(
                        "template build {id} has already started (it is {})",
                        b.status.as_str()
                    ),
                    reason: warren_proto::REASON_BUILD_STARTED,
                }
            }
            _ => not_found(id),
        });
    }
    for u in &uploads {
        sqlx::query(sql::INSERT_BUILD_UPLOAD)
            .bind(&claim.build_id)
            .bind(&u.team_id)
            .bind(&u.files_hash)
            .bind(&u.blob_digest)
            .execute(tx.conn())
            .await?;
    }
    let row = build_in(&mut tx, &claim.build_id)
        .await?
        .ok_or_else(|| not_found(&claim.build_id))?;
    tx.commit(&store.changed).await?;
    Ok((row, uploads))
}

/// Why an owner's fenced write found nothing to change.
async fn explain_lease(tx: &mut WriteTx, id: &str, owner: &str) -> Result<Error> {
    let lost = |message: String| Error::Refused {
        message,
        reason: warren_proto::REASON_LEASE_LOST,
    };
    Ok(match build_in(tx, id).await? {
        None => not_found(id),
        Some(b) if b.status != BuildStatus::Building => lost(format!(
            "template build {id} is {}, not building",
            b.status.as_str()
        )),
        Some(b) if b.owner != owner => lost(format!(
            "template build {id} is run by {:?}, not {owner:?}",
            b.owner
        )),
        Some(b) => lost(format!(
            "the lease of template build {id} ran out at {}; the sweep fails it",
            warren_core::time::rfc3339_ms(b.lease_expires_at_ms)
        )),
    })
}

/// **fenced** Renews the owner's lease to `lease_ms` from now.
pub(super) async fn renew(
    store: &SqlStore,
    id: &str,
    owner: &str,
    lease_ms: i64,
) -> Result<BuildRow> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let renewed = sqlx::query(sql::RENEW_BUILD_LEASE)
        .bind(id)
        .bind(owner)
        .bind(now)
        .bind(now.saturating_add(lease_ms))
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !renewed {
        return Err(explain_lease(&mut tx, id, owner).await?);
    }
    let row = build_in(&mut tx, id).await?.ok_or_else(|| not_found(id))?;
    tx.commit(&store.changed).await?;
    Ok(row)
}

/// **fenced** BUILDING → READY or ERROR by its owner.
pub(super) async fn finish(
    store: &SqlStore,
    id: &str,
    owner: &str,
    status: BuildStatus,
    reason: (&str, &str),
) -> Result<BuildRow> {
    let mut tx = store.write().await?;
    let done = sqlx::query(sql::FINISH_BUILD)
        .bind(id)
        .bind(owner)
        .bind(tx.now)
        .bind(status.as_str())
        .bind(reason.0)
        .bind(reason.1)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !done {
        match build_in(&mut tx, id).await? {
            // The same end again (its answer was lost); not an end the
            // sweep gave it once its lease ran out.
            Some(b)
                if b.owner == owner
                    && b.status == status
                    && (b.reason_message.as_str(), b.reason_step.as_str()) == reason =>
            {
                return Ok(b)
            }
            _ => return Err(explain_lease(&mut tx, id, owner).await?),
        }
    }
    let row = build_in(&mut tx, id).await?.ok_or_else(|| not_found(id))?;
    tx.commit(&store.changed).await?;
    Ok(row)
}

async fn insert_line(tx: &mut WriteTx, id: &str, seq: u64, line: (i64, &str, &str)) -> Result<()> {
    sqlx::query(sql::INSERT_LOG_LINE)
        .bind(id)
        .bind(to_i64(seq))
        .bind(line.0)
        .bind(line.1)
        .bind(line.2)
        .execute(tx.conn())
        .await?;
    Ok(())
}

fn named(bytes: u64, name: &str) -> String {
    if name.is_empty() {
        format!("{bytes} bytes of log")
    } else {
        format!("{bytes} bytes of log, {name}")
    }
}

/// Drops the log of the team's oldest finished build that keeps one;
/// the bytes freed, or `None` when there is none.
async fn drop_oldest_log(tx: &mut WriteTx, team: &str, b: &LogBounds) -> Result<Option<u64>> {
    let victim: Option<(String, i64, i64)> = sqlx::query_as(sql::LOG_VICTIM)
        .bind(team)
        .fetch_optional(tx.conn())
        .await?;
    let Some((id, bytes, next)) = victim else {
        return Ok(None);
    };
    sqlx::query(sql::DELETE_BUILD_LOGS)
        .bind(&id)
        .execute(tx.conn())
        .await?;
    let next = to_u64(next, "log_next_seq")?;
    let notice = format!(
        "(this build's log was dropped: the team's builds keep at most {})",
        named(b.max_team_bytes, &b.team_bound_name)
    );
    let now = tx.now;
    insert_line(tx, &id, next, (now, "warn", &notice)).await?;
    sqlx::query(sql::SET_BUILD_LOG)
        .bind(&id)
        .bind(0i64)
        .bind(to_i64(next + 1))
        .bind(1i64)
        .execute(tx.conn())
        .await?;
    Ok(Some(to_u64(bytes, "log_bytes")?))
}

/// **fenced** Appends the owner's batch `batch` of lines within both
/// bounds (module doc); a batch at or below the last one appended is a
/// repeat, answered without appending.
pub(super) async fn append(
    store: &SqlStore,
    id: &str,
    owner: &str,
    batch: u64,
    lines: &[LogLine],
    bounds: &LogBounds,
) -> Result<Appended> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let owned = sqlx::query(sql::BUILD_APPEND)
        .bind(id)
        .bind(owner)
        .bind(now)
        .bind(to_i64(batch))
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !owned {
        return match build_in(&mut tx, id).await? {
            Some(b)
                if b.status == BuildStatus::Building
                    && b.owner == owner
                    && b.lease_expires_at_ms > now
                    && b.log_batch >= batch =>
            {
                Ok(Appended {
                    repeated: true,
                    truncated: b.log_truncated,
                    log_bytes: b.log_bytes,
                    ..Appended::default()
                })
            }
            _ => Err(explain_lease(&mut tx, id, owner).await?),
        };
    }
    let b = build_in(&mut tx, id).await?.ok_or_else(|| not_found(id))?;
    let team_bytes: i64 = sqlx::query_scalar(sql::TEAM_LOG_BYTES)
        .bind(&b.team_id)
        .fetch_one(tx.conn())
        .await?;
    let mut team_bytes = to_u64(team_bytes, "bytes")?;
    let (mut bytes, mut seq, mut truncated) = (b.log_bytes, b.log_next_seq, b.log_truncated);
    let mut out = Appended::default();
    let (max_build, max_team) = (bounds.max_build_bytes, bounds.max_team_bytes);
    for line in lines {
        let cost = line.message.len() as u64 + LINE_COST;
        while max_team > 0 && team_bytes + cost > max_team {
            match drop_oldest_log(&mut tx, &b.team_id, bounds).await? {
                Some(freed) => team_bytes = team_bytes.saturating_sub(freed),
                None => break,
            }
        }
        let team_full = max_team > 0 && team_bytes + cost > max_team;
        let build_full = max_build > 0 && bytes + cost > max_build;
        if team_full || build_full {
            out.dropped += 1;
            if !truncated {
                truncated = true;
                let why = if build_full {
                    format!(
                        "a build keeps at most {}",
                        named(max_build, &bounds.build_bound_name)
                    )
                } else {
                    format!(
                        "the team's builds keep at most {}",
                        named(max_team, &bounds.team_bound_name)
                    )
                };
                let notice = format!("(more output; the rest is not kept: {why})");
                insert_line(&mut tx, id, seq, (now, "warn", &notice)).await?;
                seq += 1;
            }
            continue;
        }
        let at = if line.at_ms > 0 { line.at_ms } else { now };
        insert_line(&mut tx, id, seq, (at, &line.level, &line.message)).await?;
        seq += 1;
        bytes += cost;
        team_bytes += cost;
        out.kept += 1;
    }
    sqlx::query(sql::SET_BUILD_LOG)
        .bind(id)
        .bind(to_i64(bytes))
        .bind(to_i64(seq))
        .bind(i64::from(truncated))
        .execute(tx.conn())
        .await?;
    tx.commit(&store.changed).await?;
    out.truncated = truncated;
    out.log_bytes = bytes;
    Ok(out)
}

/// Up to `limit` lines of build `id` from `from_seq` on.
pub(super) async fn read_log(
    store: &SqlStore,
    id: &str,
    from_seq: u64,
    limit: u32,
) -> Result<Vec<LogLine>> {
    let rows: Vec<(i64, i64, String, String)> = sqlx::query_as(sql::READ_LOG)
        .bind(id)
        .bind(to_i64(from_seq))
        .bind(i64::from(limit.max(1)))
        .fetch_all(&store.reader)
        .await?;
    rows.into_iter()
        .map(|(seq, at_ms, level, message)| {
            Ok(LogLine {
                seq: to_u64(seq, "seq")?,
                at_ms,
                level,
                message,
            })
        })
        .collect()
}

/// The sweep's part: waiting builds past their start deadline and finished
/// ones past their retention are deleted (with their logs); building ones
/// whose lease ran out fail.
pub(super) async fn sweep(store: &SqlStore, report: &mut SweepReport) -> Result<()> {
    let mut tx = store.write().await?;
    let now = tx.now;
    for (select, delete) in [
        (
            sql::WAITING_PAST_DEADLINE,
            sql::DELETE_WAITING_PAST_DEADLINE,
        ),
        (
            sql::FINISHED_PAST_RETENTION,
            sql::DELETE_FINISHED_PAST_RETENTION,
        ),
    ] {
        let ids: Vec<String> = sqlx::query_scalar(select)
            .bind(now)
            .bind(SWEEP_BATCH)
            .fetch_all(tx.conn())
            .await?;
        for id in ids {
            let gone = sqlx::query(delete)
                .bind(&id)
                .bind(now)
                .execute(tx.conn())
                .await?
                .rows_affected()
                == 1;
            if gone {
                drop_rows(&mut tx, &id).await?;
                report.builds_expired += 1;
            }
        }
    }
    let lost: Vec<(String, String, i64, i64)> = sqlx::query_as(sql::LEASES_PAST)
        .bind(now)
        .bind(SWEEP_BATCH)
        .fetch_all(tx.conn())
        .await?;
    for (id, owner, lease_end, next_seq) in lost {
        let message = format!(
            "the gateway running this build ({owner}) stopped renewing its lease, which ran \
             out at {}; the build failed and was not taken over: build the template again",
            warren_core::time::rfc3339_ms(lease_end)
        );
        let failed = sqlx::query(sql::FAIL_LOST_BUILD)
            .bind(&id)
            .bind(now)
            .bind(&message)
            .execute(tx.conn())
            .await?
            .rows_affected()
            == 1;
        if failed {
            // Said in the log too, where the SDK prints a build's progress.
            let seq = to_u64(next_seq, "log_next_seq")?;
            insert_line(&mut tx, &id, seq, (now, "error", &message)).await?;
            report.builds_lost += 1;
            tracing::warn!(build = %id, %owner, "template build failed: its gateway's lease ran out");
        }
    }
    tx.commit(&store.changed).await
}

/// Template builds; writes run detached (see [`SqlStore::detached`]).
impl SqlStore {
    /// A new waiting build, within the bounds on builds held.
    pub async fn create_build(&self, build: NewBuild) -> Result<BuildRow> {
        self.detached(move |s| async move { create(&s, &build).await })
            .await
    }

    /// A build, unless past its TTL.
    pub async fn get_build(&self, build_id: &str) -> Result<Option<BuildRow>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), build_id.to_string());
            return super::run_on(exec, async move { s.get_build_now(&id).await });
        }
        self.get_build_now(build_id).await
    }

    async fn get_build_now(&self, build_id: &str) -> Result<Option<BuildRow>> {
        get(self, build_id).await
    }

    /// A page of `team`'s builds (of `template`, unless empty), newest first.
    pub async fn list_builds(
        &self,
        team: &str,
        template: &str,
        after: Option<(i64, String)>,
        limit: u32,
    ) -> Result<(Vec<BuildRow>, Option<(i64, String)>)> {
        if let Some(exec) = &self.exec {
            let (s, team, template) = (self.clone(), team.to_string(), template.to_string());
            return super::run_on(exec, async move {
                s.list_builds_now(&team, &template, after, limit).await
            });
        }
        self.list_builds_now(team, template, after, limit).await
    }

    async fn list_builds_now(
        &self,
        team: &str,
        template: &str,
        after: Option<(i64, String)>,
        limit: u32,
    ) -> Result<(Vec<BuildRow>, Option<(i64, String)>)> {
        list(self, team, template, after, limit).await
    }

    /// WAITING → BUILDING under a lease; the uploads it reads.
    pub async fn claim_build(&self, c: BuildClaim) -> Result<(BuildRow, Vec<UploadRow>)> {
        self.detached(move |s| async move { claim(&s, &c).await })
            .await
    }

    /// Renews the owner's lease for `lease_ms` from now.
    pub async fn renew_build_lease(
        &self,
        build_id: &str,
        owner: &str,
        lease_ms: i64,
    ) -> Result<BuildRow> {
        let (id, owner) = (build_id.to_string(), owner.to_string());
        self.detached(move |s| async move { renew(&s, &id, &owner, lease_ms).await })
            .await
    }

    /// BUILDING → READY or ERROR (with its reason: message, step).
    pub async fn finish_build(
        &self,
        build_id: &str,
        owner: &str,
        status: BuildStatus,
        reason: (String, String),
    ) -> Result<BuildRow> {
        let (id, owner) = (build_id.to_string(), owner.to_string());
        self.detached(move |s| async move {
            finish(&s, &id, &owner, status, (&reason.0, &reason.1)).await
        })
        .await
    }

    /// Appends the owner's batch `batch` of log lines within `bounds`.
    pub async fn append_build_log(
        &self,
        build_id: &str,
        owner: &str,
        batch: u64,
        lines: Vec<LogLine>,
        bounds: LogBounds,
    ) -> Result<Appended> {
        let (id, owner) = (build_id.to_string(), owner.to_string());
        self.detached(move |s| async move { append(&s, &id, &owner, batch, &lines, &bounds).await })
            .await
    }

    /// Up to `limit` lines of a build's log from `from_seq` on.
    pub async fn read_build_log(
        &self,
        build_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<LogLine>> {
        if let Some(exec) = &self.exec {
            let (s, id) = (self.clone(), build_id.to_string());
            return super::run_on(exec, async move {
                s.read_build_log_now(&id, from_seq, limit).await
            });
        }
        self.read_build_log_now(build_id, from_seq, limit).await
    }

    async fn read_build_log_now(
        &self,
        build_id: &str,
        from_seq: u64,
        limit: u32,
    ) -> Result<Vec<LogLine>> {
        read_log(self, build_id, from_seq, limit).await
    }
}
