//! Template records, the notes of blobs no record names, and what a team
//! keeps (`TeamUsage`).
//!
//! A batch of puts or deletes is one write transaction: every record is
//! one conditional statement (insert-if-absent, or exactly the version
//! read) whose affected-row count decides (a put that finds exactly its
//! own content in place is answered with it: a call sent again after a
//! lost answer, or two writers writing the same), and the team's bounds are
//! checked on the state the batch leaves, in the same transaction; any
//! failure rolls the whole batch back. A replaced or deleted record's
//! layers (those the new record does not name) are noted in the same
//! transaction, so a layer is never forgotten between two calls.

use super::{to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::records::*;
use crate::store::sql_records as sql;
use sqlx::any::AnyRow;
use sqlx::Row;
use std::collections::{BTreeMap, BTreeSet};

/// Store JSON of the values the store writes itself; they always encode.
fn to_json<T: serde::Serialize>(v: &T) -> String {
    serde_json::to_string(v).unwrap_or_default()
}

fn from_json<T: serde::de::DeserializeOwned>(s: &str, what: &str) -> Result<T> {
    serde_json::from_str(s).map_err(|e| Error::Corrupt(format!("{what}: {e}")))
}

fn record_from_row(r: &AnyRow) -> Result<TemplateRecord> {
    let kind: String = r.try_get("kind")?;
    let snapshot: String = r.try_get("snapshot")?;
    Ok(TemplateRecord {
        name: r.try_get("name")?,
        kind: RecordKind::parse(&kind)
            .ok_or_else(|| Error::Corrupt(format!("unknown record kind {kind:?}")))?,
        team_id: r.try_get("team_id")?,
        digest: r.try_get("digest")?,
        layers: from_json(r.try_get("layers")?, "layers")?,
        defaults: from_json(r.try_get("defaults")?, "defaults")?,
        source: r.try_get("source")?,
        images: from_json(r.try_get("images")?, "images")?,
        snapshot: if snapshot.is_empty() {
            None
        } else {
            Some(from_json(&snapshot, "snapshot")?)
        },
        created_at_ms: r.try_get("created_at_ms")?,
        updated_at_ms: r.try_get("updated_at_ms")?,
        version: to_u64(r.try_get("version")?, "version")?,
    })
}

pub(super) async fn record_in(tx: &mut WriteTx, name: &str) -> Result<Option<TemplateRecord>> {
    let row = sqlx::query(sql::RECORD_BY_NAME)
        .bind(name)
        .fetch_optional(tx.conn())
        .await?;
    row.as_ref().map(record_from_row).transpose()
}

/// What a team's record bounds count.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Counts {
    snapshots: u64,
    templates: u64,
    layer_bytes: u64,
}

async fn counts(conn: &mut sqlx::AnyConnection, team: &str) -> Result<Counts> {
    let of_kind = |kind: RecordKind| {
        sqlx::query_scalar::<_, i64>(sql::TEAM_RECORDS_OF_KIND)
            .bind(team.to_string())
            .bind(kind.as_str())
    };
    let snapshots = of_kind(RecordKind::Snapshot).fetch_one(&mut *conn).await?;
    let templates = of_kind(RecordKind::Built).fetch_one(&mut *conn).await?;
    let bytes: i64 = sqlx::query_scalar(sql::TEAM_LAYER_BYTES)
        .bind(team)
        .fetch_one(&mut *conn)
        .await?;
    Ok(Counts {
        snapshots: to_u64(snapshots, "count")?,
        templates: to_u64(templates, "count")?,
        layer_bytes: to_u64(bytes, "bytes")?,
    })
}

/// Refuses the state a batch left when it grew past a bound.
fn check_bounds(team: &str, before: Counts, after: Counts, b: RecordBounds) -> Result<()> {
    let past = |max: u64, before: u64, after: u64| max > 0 && after > max && after > before;
    if past(b.max_snapshots, before.snapshots, after.snapshots) {
        return Err(Error::Bound {
            message: format!(
                "team {team} would keep {} snapshots, past its bound of {}; delete one first",
                after.snapshots, b.max_snapshots
            ),
            bound: warren_proto::BOUND_SNAPSHOTS,
        });
    }
    if past(b.max_templates, before.templates, after.templates) {
        return Err(Error::Bound {
            message: format!(
                "team {team} would keep {} templates (each tag counts), past its bound of {}; \
                 delete some first",
                after.templates, b.max_templates
            ),
            bound: warren_proto::BOUND_TEMPLATES,
        });
    }
    if past(b.max_layer_bytes, before.layer_bytes, after.layer_bytes) {
        return Err(Error::Bound {
            message: format!(
                "team {team}'s snapshots and templates would take {} bytes, past its bound of {}; \
                 delete some first",
                after.layer_bytes, b.max_layer_bytes
            ),
            bound: warren_proto::BOUND_LAYER_BYTES,
        });
    }
    Ok(())
}

async fn note(tx: &mut WriteTx, digests: impl IntoIterator<Item = &String>) -> Result<()> {
    let now = tx.now;
    for d in digests {
        sqlx::query(sql::NOTE_BLOB)
            .bind(d)
            .bind(now)
            .execute(tx.conn())
            .await?;
    }
    Ok(())
}

/// Whether a record names `digest` as its root.
async fn root_named(tx: &mut WriteTx, digest: &str) -> Result<bool> {
    let n: i64 = sqlx::query_scalar(sql::RECORDS_WITH_ROOT)
        .bind(digest)
        .fetch_one(tx.conn())
        .await?;
    Ok(n > 0)
}

async fn write_layers(tx: &mut WriteTx, r: &TemplateRecord) -> Result<()> {
    sqlx::query(sql::DELETE_RECORD_LAYERS)
        .bind(&r.name)
        .execute(tx.conn())
        .await?;
    for (i, l) in r.layers.iter().enumerate() {
        sqlx::query(sql::INSERT_RECORD_LAYER)
            .bind(&r.name)
            .bind(i as i64)
            .bind(&l.digest)
            .bind(to_i64(l.size_bytes))
            .execute(tx.conn())
            .await?;
    }
    Ok(())
}

fn source_sandbox(r: &TemplateRecord) -> &str {
    r.snapshot
        .as_ref()
        .map_or("", |s| s.source_sandbox.as_str())
}

/// Whether `old` already holds what `new` would write: a put sent again
/// (its answer was lost), or a racing writer that wrote the same.
fn same_content(old: &TemplateRecord, new: &TemplateRecord) -> bool {
    old.kind == new.kind
        && old.team_id == new.team_id
        && old.digest == new.digest
        && old.layers == new.layers
        && old.defaults == new.defaults
        && old.source == new.source
        && old.images == new.images
        && old.snapshot == new.snapshot
        && (new.created_at_ms == 0 || new.created_at_ms == old.created_at_ms)
}

/// The name a record is public under, if it is public.
fn public_name(r: &TemplateRecord) -> Option<String> {
    r.snapshot
        .as_ref()
        .filter(|s| s.public && !s.name.is_empty())
        .map(|s| s.name.clone())
}

/// **fenced** One put: the version it was written at. A put that finds
/// exactly its content in place (at any version) answers with that record.
/// A record made public under a name another record is public under
/// already is ALREADY_EXISTS (the unique index on `public_name` backs this
/// check).
pub(super) async fn put_one(tx: &mut WriteTx, p: &RecordPut) -> Result<TemplateRecord> {
    let new = &p.record;
    let name = &new.name;
    let old = record_in(tx, name).await?;
    if let Some(o) = old.as_ref().filter(|o| same_content(o, new)) {
        return Ok(o.clone());
    }
    let public = public_name(new);
    if let Some(public) = &public {
        let holder: Option<String> = sqlx::query_scalar(sql::PUBLIC_NAME_HOLDER)
            .bind(public)
            .bind(name)
            .fetch_optional(tx.conn())
            .await?;
        if let Some(holder) = holder {
            return Err(Error::AlreadyExists(format!(
                "another team's template is public as {public:?} already (record {holder}); \
                 one name is public once"
            )));
        }
    }
    let version = tx.next_counter("record_version").await?;
    let now = tx.now;
    let created = if new.created_at_ms > 0 {
        new.created_at_ms
    } else {
        now
    };
    let snapshot = new.snapshot.as_ref().map(to_json).unwrap_or_default();
    let (layers, defaults, images) = (
        to_json(&new.layers),
        to_json(&new.defaults),
        to_json(&new.images),
    );
    let written = match (p.expected_version, &old) {
        (0, Some(o)) => {
            return Err(Error::AlreadyExists(format!(
                "template record {name} already exists (at version {}); read it and replace \
                 that version",
                o.version
            )))
        }
        (0, None) => sqlx::query(sql::INSERT_RECORD)
            .bind(name)
            .bind(new.kind.as_str())
            .bind(&new.team_id)
            .bind(&new.digest)
            .bind(&layers)
            .bind(&defaults)
            .bind(&new.source)
            .bind(&images)
            .bind(&snapshot)
            .bind(source_sandbox(new))
            .bind(created)
            .bind(now)
            .bind(to_i64(version))
            .bind(public.clone())
            .execute(tx.conn())
            .await?
            .rows_affected(),
        (want, None) => {
            return Err(Error::Aborted(format!(
                "template record {name} no longer exists (the put expected version {want}); \
                 another writer deleted it"
            )))
        }
        (want, Some(o)) => {
            if o.version != want {
                return Err(Error::Aborted(format!(
                    "template record {name} is at version {}, not {want}: another writer \
                     changed it; read it again",
                    o.version
                )));
            }
            if o.team_id != new.team_id {
                return Err(Error::precondition(format!(
                    "template record {name} belongs to team {:?}, not {:?}; a replace keeps \
                     the record's team",
                    o.team_id, new.team_id
                )));
            }
            let fixed = |k: RecordKind| matches!(k, RecordKind::Operator | RecordKind::Paused);
            if (fixed(o.kind) || fixed(new.kind)) && o.kind != new.kind {
                return Err(Error::precondition(format!(
                    "template record {name} is of kind {}; a record of kind {} cannot \
                     replace it",
                    o.kind.as_str(),
                    new.kind.as_str()
                )));
            }
            sqlx::query(sql::REPLACE_RECORD)
                .bind(name)
                .bind(new.kind.as_str())
                .bind(&new.team_id)
                .bind(&new.digest)
                .bind(&layers)
                .bind(&defaults)
                .bind(&new.source)
                .bind(&images)
                .bind(&snapshot)
                .bind(source_sandbox(new))
                .bind(created)
                .bind(now)
                .bind(to_i64(version))
                .bind(to_i64(want))
                .bind(public.clone())
                .execute(tx.conn())
                .await?
                .rows_affected()
        }
    };
    if written != 1 {
        // Not reached under the write lock; said plainly if it ever is.
        return Err(Error::Aborted(format!(
            "template record {name} changed while it was written; read it again"
        )));
    }
    if let Some(o) = &old {
        let keep: BTreeSet<&String> = new.layers.iter().map(|l| &l.digest).collect();
        let mut gone: Vec<String> = o
            .layers
            .iter()
            .map(|l| l.digest.clone())
            .filter(|d| !keep.contains(d))
            .collect();
        // The old root too once nothing names it (a rebuilt operator
        // template's, re-imported).
        if o.digest != new.digest && !root_named(tx, &o.digest).await? {
            gone.push(o.digest.clone());
        }
        note(tx, &gone).await?;
    }
    write_layers(tx, new).await?;
    Ok(TemplateRecord {
        created_at_ms: created,
        updated_at_ms: now,
        version,
        ..new.clone()
    })
}

pub(super) async fn put(
    store: &SqlStore,
    puts: &[RecordPut],
    bounds: RecordBounds,
) -> Result<Vec<TemplateRecord>> {
    let mut tx = store.write().await?;
    let teams: BTreeSet<&str> = puts
        .iter()
        .filter(|p| p.record.kind.is_teams())
        .map(|p| p.record.team_id.as_str())
        .collect();
    let mut before = BTreeMap::new();
    for team in &teams {
        before.insert(*team, counts(tx.conn(), team).await?);
    }
    let mut out = Vec::with_capacity(puts.len());
    for p in puts {
        out.push(put_one(&mut tx, p).await?);
    }
    for (team, before) in before {
        let after = counts(tx.conn(), team).await?;
        check_bounds(team, before, after, bounds)?;
    }
    tx.commit(&store.changed).await?;
    Ok(out)
}

/// **fenced** Deletes each record at exactly its version (of `team`, when
/// given: another team's record is not found); notes their layers.
/// Returns the noted digests.
pub(super) async fn delete(
    store: &SqlStore,
    refs: &[RecordRef],
    team: Option<&str>,
) -> Result<Vec<String>> {
    let mut tx = store.write().await?;
    let mut noted = BTreeSet::new();
    for r in refs {
        let name = &r.name;
        let not_found = || Error::NotFound(format!("template record {name} not found"));
        let old = record_in(&mut tx, name).await?.ok_or_else(not_found)?;
        if team.is_some_and(|t| t != old.team_id) {
            return Err(not_found());
        }
        if old.version != r.expected_version {
            return Err(Error::Aborted(format!(
                "template record {name} is at version {}, not {}: another writer changed it; \
                 read it again",
                old.version, r.expected_version
            )));
        }
        let gone = sqlx::query(sql::DELETE_RECORD)
            .bind(name)
            .bind(to_i64(r.expected_version))
            .execute(tx.conn())
            .await?
            .rows_affected();
        if gone != 1 {
            return Err(Error::Aborted(format!(
                "template record {name} changed while it was deleted; read it again"
            )));
        }
        sqlx::query(sql::DELETE_RECORD_LAYERS)
            .bind(name)
            .execute(tx.conn())
            .await?;
        noted.extend(old.layers.into_iter().map(|l| l.digest));
        // Its root too, once no record names it (a deleted operator
        // template's).
        if !root_named(&mut tx, &old.digest).await? {
            noted.insert(old.digest);
        }
    }
    note(&mut tx, &noted).await?;
    tx.commit(&store.changed).await?;
    Ok(noted.into_iter().collect())
}

/// Deletes sandbox `sandbox_id`'s paused record (`paused-<id>`, kind
/// PAUSED), if there is one, and notes its layers, in the transaction
/// that removes the sandbox's binding or resumes it.
pub(super) async fn drop_paused(tx: &mut WriteTx, sandbox_id: &str) -> Result<()> {
    let name = format!("paused-{sandbox_id}");
    let Some(old) = record_in(tx, &name)
        .await?
        .filter(|r| r.kind == RecordKind::Paused)
    else {
        return Ok(());
    };
    sqlx::query(sql::DELETE_RECORD)
        .bind(&name)
        .bind(to_i64(old.version))
        .execute(tx.conn())
        .await?;
    sqlx::query(sql::DELETE_RECORD_LAYERS)
        .bind(&name)
        .execute(tx.conn())
        .await?;
    let layers: Vec<String> = old.layers.into_iter().map(|l| l.digest).collect();
    note(tx, &layers).await
}

pub(super) async fn get(store: &SqlStore, name: &str) -> Result<Option<TemplateRecord>> {
    let row = sqlx::query(sql::RECORD_BY_NAME)
        .bind(name)
        .fetch_optional(&store.reader)
        .await?;
    row.as_ref().map(record_from_row).transpose()
}

pub(super) async fn list(
    store: &SqlStore,
    f: &RecordFilter,
) -> Result<(Vec<TemplateRecord>, Option<RecordCursor>)> {
    let limit = f.limit.max(1);
    // Keyset pagination, strictly after the cursor `($1 name, $5 created_at)`.
    let (after_rows, order_by, start) = match f.order {
        RecordOrder::ByName => ("name > $1 AND $5 = $5", "name", i64::MIN),
        RecordOrder::CreatedDesc => (
            "(created_at_ms < $5 OR (created_at_ms = $5 AND name > $1))",
            "created_at_ms DESC, name",
            i64::MAX,
        ),
    };
    let mut query = String::from(sql::LIST_RECORDS_PREFIX);
    query.push_str(after_rows);
    query.push_str(" AND ($2 = '' OR team_id = $2) AND ($3 = '' OR source_sandbox = $3)");
    if f.public_only {
        query.push_str(" AND public_name IS NOT NULL");
    }
    if !f.kinds.is_empty() {
        // Spelled from the fixed enum, never from client text.
        let kinds: Vec<String> = f
            .kinds
            .iter()
            .map(|k| format!("'{}'", k.as_str()))
            .collect();
        query.push_str(&format!(" AND kind IN ({})", kinds.join(", ")));
    }
    query.push_str(&format!(" ORDER BY {order_by} LIMIT $4"));
    let (name, at) = match &f.after {
        Some(c) => (c.name.clone(), c.created_at_ms),
        None => (String::new(), start),
    };
    let rows = sqlx::query(&query)
        .bind(name)
        .bind(f.team_id.as_deref().unwrap_or(""))
        .bind(f.source_sandbox.as_deref().unwrap_or(""))
        .bind(i64::from(limit) + 1)
        .bind(at)
        .fetch_all(&store.reader)
        .await?;
    let mut out = rows
        .iter()
        .map(record_from_row)
        .collect::<Result<Vec<_>>>()?;
    if out.len() > limit as usize {
        out.truncate(limit as usize);
        let next = out.last().map(|r| RecordCursor {
            name: r.name.clone(),
            created_at_ms: r.created_at_ms,
        });
        return Ok((out, next));
    }
    Ok((out, None))
}

pub(super) async fn team_usage(store: &SqlStore, team: &str) -> Result<TeamUsage> {
    let now = store.clock_ms().await?;
    let mut conn = store.reader.acquire().await?;
    let c = counts(&mut conn, team).await?;
    let (builds, log_bytes): (i64, i64) = sqlx::query_as(sql::TEAM_BUILD_USAGE)
        .bind(team)
        .bind(now)
        .fetch_one(&mut *conn)
        .await?;
    let (uploads, upload_bytes): (i64, i64) = sqlx::query_as(sql::TEAM_UPLOADS)
        .bind(team)
        .fetch_one(&mut *conn)
        .await?;
    Ok(TeamUsage {
        snapshots: c.snapshots,
        templates: c.templates,
        layer_bytes: c.layer_bytes,
        builds: to_u64(builds, "count")?,
        build_log_bytes: to_u64(log_bytes, "bytes")?,
        uploads: to_u64(uploads, "count")?,
        upload_bytes: to_u64(upload_bytes, "bytes")?,
    })
}

pub(super) async fn note_blobs(store: &SqlStore, digests: &[String]) -> Result<()> {
    let mut tx = store.write().await?;
    note(&mut tx, digests).await?;
    tx.commit(&store.changed).await
}

/// Notes in `tx` (for the sweep's expired uploads).
pub(super) async fn note_in(tx: &mut WriteTx, digest: &String) -> Result<()> {
    note(tx, [digest]).await
}

pub(super) async fn due_blobs(
    store: &SqlStore,
    grace_ms: i64,
    after: &str,
    limit: u32,
) -> Result<(Vec<UnusedBlob>, Option<String>)> {
    let cutoff = store.clock_ms().await?.saturating_sub(grace_ms);
    let limit = limit.max(1);
    let rows: Vec<(String, i64)> = sqlx::query_as(sql::DUE_BLOBS)
        .bind(cutoff)
        .bind(after)
        .bind(i64::from(limit) + 1)
        .fetch_all(&store.reader)
        .await?;
    let mut out: Vec<UnusedBlob> = rows
        .into_iter()
        .map(|(digest, noted_at_ms)| UnusedBlob {
            digest,
            noted_at_ms,
        })
        .collect();
    if out.len() > limit as usize {
        out.truncate(limit as usize);
        let next = out.last().map(|b| b.digest.clone());
        return Ok((out, next));
    }
    Ok((out, None))
}

/// **fenced** Removes the note of `digest` made at `noted_at_ms`, unless a
/// record or an upload names the blob.
pub(super) async fn remove_blob_note(
    store: &SqlStore,
    digest: &str,
    noted_at_ms: i64,
) -> Result<BlobRemoval> {
    let mut tx = store.write().await?;
    let removed = sqlx::query(sql::REMOVE_BLOB_NOTE)
        .bind(digest)
        .bind(noted_at_ms)
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    let outcome = if removed {
        BlobRemoval::Removed
    } else {
        let at: Option<i64> = sqlx::query_scalar(sql::BLOB_NOTE)
            .bind(digest)
            .fetch_optional(tx.conn())
            .await?;
        match at {
            None => BlobRemoval::Gone,
            Some(t) if t != noted_at_ms => BlobRemoval::NotedAgain,
            Some(_) => BlobRemoval::Named,
        }
    };
    tx.commit(&store.changed).await?;
    Ok(outcome)
}

/// Template records and unused-blob notes; writes run detached (see
/// [`SqlStore::detached`]).
impl SqlStore {
    /// Writes `puts` (each insert-if-absent or a replace of exactly the
    /// version read) in one transaction, within `bounds`; all or nothing.
    pub async fn put_records(
        &self,
        puts: Vec<RecordPut>,
        bounds: RecordBounds,
    ) -> Result<Vec<TemplateRecord>> {
        self.detached(move |s| async move { put(&s, &puts, bounds).await })
            .await
    }

    /// Deletes `refs` (each at exactly its version; of `team` when given)
    /// in one transaction; the layers they named are noted and returned.
    pub async fn delete_records(
        &self,
        refs: Vec<RecordRef>,
        team: Option<String>,
    ) -> Result<Vec<String>> {
        self.detached(move |s| async move { delete(&s, &refs, team.as_deref()).await })
            .await
    }

    pub async fn get_record(&self, name: &str) -> Result<Option<TemplateRecord>> {
        if let Some(exec) = &self.exec {
            let (s, name) = (self.clone(), name.to_string());
            return super::run_on(exec, async move { s.get_record_now(&name).await });
        }
        self.get_record_now(name).await
    }

    async fn get_record_now(&self, name: &str) -> Result<Option<TemplateRecord>> {
        get(self, name).await
    }

    /// A page of records matching `filter`, and where the next one starts.
    pub async fn list_records(
        &self,
        filter: &RecordFilter,
    ) -> Result<(Vec<TemplateRecord>, Option<RecordCursor>)> {
        if let Some(exec) = &self.exec {
            let (s, filter) = (self.clone(), filter.clone());
            return super::run_on(exec, async move { s.list_records_now(&filter).await });
        }
        self.list_records_now(filter).await
    }

    async fn list_records_now(
        &self,
        filter: &RecordFilter,
    ) -> Result<(Vec<TemplateRecord>, Option<RecordCursor>)> {
        list(self, filter).await
    }

    /// What `team` keeps, as the bounds count it.
    pub async fn team_usage(&self, team: &str) -> Result<TeamUsage> {
        if let Some(exec) = &self.exec {
            let (s, team) = (self.clone(), team.to_string());
            return super::run_on(exec, async move { s.team_usage_now(&team).await });
        }
        self.team_usage_now(team).await
    }

    async fn team_usage_now(&self, team: &str) -> Result<TeamUsage> {
        team_usage(self, team).await
    }

    /// Notes blobs no record names any more (each at the store's now).
    pub async fn note_blobs(&self, digests: Vec<String>) -> Result<()> {
        self.detached(move |s| async move { note_blobs(&s, &digests).await })
            .await
    }

    /// Notes made at least `grace_ms` ago, by digest after `after`.
    pub async fn due_blobs(
        &self,
        grace_ms: i64,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<UnusedBlob>, Option<String>)> {
        if let Some(exec) = &self.exec {
            let (s, after) = (self.clone(), after.to_string());
            return super::run_on(exec, async move {
                s.due_blobs_now(grace_ms, &after, limit).await
            });
        }
        self.due_blobs_now(grace_ms, after, limit).await
    }

    async fn due_blobs_now(
        &self,
        grace_ms: i64,
        after: &str,
        limit: u32,
    ) -> Result<(Vec<UnusedBlob>, Option<String>)> {
        due_blobs(self, grace_ms, after, limit).await
    }

    /// Removes the note of `digest` made at `noted_at_ms`, unless the blob
    /// is named again (see [`BlobRemoval`]).
    pub async fn remove_blob_note(&self, digest: &str, noted_at_ms: i64) -> Result<BlobRemoval> {
        let digest = digest.to_string();
        self.detached(move |s| async move { remove_blob_note(&s, &digest, noted_at_ms).await })
            .await
    }
}
