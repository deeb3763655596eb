//! COPY uploads: a team's files hash → the blob of the archive it
//! uploaded, until the TTL its put named.
//!
//! A put is insert-if-absent (an expired upload counts as absent) or a
//! replace of exactly the version read, within the team's and every
//! team's upload bytes, in one transaction; a put that finds the same
//! archive recorded (a repeat, or another gateway's upload of the same
//! bytes) is answered with it. An upload past its expiry is
//! hidden from reads at once and deleted by the sweep, which notes its
//! archive's blob (as a replaced or deleted upload's is noted): the
//! gateway removes it through the unused-blob notes, where the removal is
//! refused while any record, upload or building build names the blob
//! (two teams' identical archives are one blob; a build that claimed an
//! upload keeps reading its archive after the upload expired).

use super::{to_i64, to_u64, SqlStore, WriteTx};
use crate::error::{Error, Result};
use crate::store::records::*;
use crate::store::sql_records as sql;
use crate::store::SweepReport;
use sqlx::any::AnyRow;
use sqlx::Row;

const SWEEP_BATCH: i64 = 1000;

fn upload_from_row(r: &AnyRow) -> Result<UploadRow> {
    Ok(UploadRow {
        team_id: r.try_get("team_id")?,
        files_hash: r.try_get("files_hash")?,
        blob_digest: r.try_get("blob_digest")?,
        size_bytes: to_u64(r.try_get("size_bytes")?, "size_bytes")?,
        created_at_ms: r.try_get("created_at_ms")?,
        expires_at_ms: r.try_get("expires_at_ms")?,
        version: to_u64(r.try_get("version")?, "version")?,
    })
}

/// The upload row, expired or not, in `tx`.
pub(super) async fn get_in(tx: &mut WriteTx, team: &str, hash: &str) -> Result<Option<UploadRow>> {
    let row = sqlx::query(sql::UPLOAD_BY_KEY)
        .bind(team)
        .bind(hash)
        .fetch_optional(tx.conn())
        .await?;
    row.as_ref().map(upload_from_row).transpose()
}

async fn other_bytes(tx: &mut WriteTx, q: &str, team: &str, hash: &str) -> Result<u64> {
    let n: i64 = sqlx::query_scalar(q)
        .bind(team)
        .bind(hash)
        .fetch_one(tx.conn())
        .await?;
    to_u64(n, "bytes")
}

/// **fenced** Puts an upload (module doc); the old archive's blob, when
/// the put replaced one with another, is noted.
pub(super) async fn put(store: &SqlStore, u: &NewUpload) -> Result<UploadRow> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let (team, hash) = (u.team_id.as_str(), u.files_hash.as_str());
    let old = get_in(&mut tx, team, hash).await?;
    if let Some(o) = &old {
        // The same put again (its answer was lost), or another gateway's
        // upload of the same bytes: the upload is there.
        if o.expires_at_ms > now && o.blob_digest == u.blob_digest && o.size_bytes == u.size_bytes {
            return Ok(o.clone());
        }
    }
    if u.max_team_bytes > 0 {
        let others = other_bytes(&mut tx, sql::TEAM_UPLOAD_BYTES, team, hash).await?;
        if others + u.size_bytes > u.max_team_bytes {
            return Err(Error::Bound {
                message: format!(
                    "team {team}'s uploads would take {} bytes, past its bound of {}; uploads \
                     are kept until they expire, or replaced by a new upload of the same files",
                    others + u.size_bytes,
                    u.max_team_bytes
                ),
                bound: warren_proto::BOUND_TEAM_UPLOAD_BYTES,
            });
        }
    }
    if u.max_total_bytes > 0 {
        let others = other_bytes(&mut tx, sql::OTHER_UPLOAD_BYTES, team, hash).await?;
        if others + u.size_bytes > u.max_total_bytes {
            return Err(Error::Bound {
                message: format!(
                    "every team's uploads together would take {} bytes, past the bound of {}; \
                     try again later",
                    others + u.size_bytes,
                    u.max_total_bytes
                ),
                bound: warren_proto::BOUND_TOTAL_UPLOAD_BYTES,
            });
        }
    }
    let version = tx.next_counter("record_version").await?;
    let expires = now.saturating_add(u.ttl_ms);
    let exists = |o: &UploadRow| {
        Error::AlreadyExists(format!(
            "team {team}'s upload of the files with hash {hash} already exists (at version {}, \
             until {})",
            o.version,
            warren_core::time::rfc3339_ms(o.expires_at_ms)
        ))
    };
    // (version to replace, only if expired)
    let replace = match (u.expected_version, &old) {
        (0, None) => None,
        (0, Some(o)) if o.expires_at_ms <= now => Some((o.version, true)),
        (0, Some(o)) => return Err(exists(o)),
        (want, None) => {
            return Err(Error::Aborted(format!(
                "team {team}'s upload of the files with hash {hash} no longer exists (the put \
                 expected version {want})"
            )))
        }
        (want, Some(o)) if o.version != want => {
            return Err(Error::Aborted(format!(
                "team {team}'s upload of the files with hash {hash} is at version {}, not \
                 {want}: another writer changed it",
                o.version
            )))
        }
        (want, Some(_)) => Some((want, false)),
    };
    let written = match replace {
        None => sqlx::query(sql::INSERT_UPLOAD)
            .bind(team)
            .bind(hash)
            .bind(&u.blob_digest)
            .bind(to_i64(u.size_bytes))
            .bind(now)
            .bind(expires)
            .bind(to_i64(version))
            .execute(tx.conn())
            .await?
            .rows_affected(),
        Some((at, only_expired)) => sqlx::query(sql::REPLACE_UPLOAD)
            .bind(team)
            .bind(hash)
            .bind(&u.blob_digest)
            .bind(to_i64(u.size_bytes))
            .bind(now)
            .bind(expires)
            .bind(to_i64(version))
            .bind(to_i64(at))
            .bind(i64::from(only_expired))
            .bind(now)
            .execute(tx.conn())
            .await?
            .rows_affected(),
    };
    if written != 1 {
        return Err(Error::Aborted(format!(
            "team {team}'s upload of the files with hash {hash} changed while it was written"
        )));
    }
    if let Some(o) = old.filter(|o| o.blob_digest != u.blob_digest) {
        super::records::note_in(&mut tx, &o.blob_digest).await?;
    }
    tx.commit(&store.changed).await?;
    Ok(UploadRow {
        team_id: team.to_string(),
        files_hash: hash.to_string(),
        blob_digest: u.blob_digest.clone(),
        size_bytes: u.size_bytes,
        created_at_ms: now,
        expires_at_ms: expires,
        version,
    })
}

/// The team's upload, unless it expired.
pub(super) async fn get(store: &SqlStore, team: &str, hash: &str) -> Result<Option<UploadRow>> {
    let now = store.clock_ms().await?;
    let row = sqlx::query(sql::UPLOAD_BY_KEY)
        .bind(team)
        .bind(hash)
        .fetch_optional(&store.reader)
        .await?;
    Ok(row
        .as_ref()
        .map(upload_from_row)
        .transpose()?
        .filter(|u| u.expires_at_ms > now))
}

/// **fenced** Deletes exactly version `expected`; its blob is noted and
/// returned.
pub(super) async fn delete(
    store: &SqlStore,
    team: &str,
    hash: &str,
    expected: u64,
) -> Result<String> {
    let mut tx = store.write().await?;
    let old = get_in(&mut tx, team, hash).await?.ok_or_else(|| {
        Error::NotFound(format!(
            "team {team} has no upload of the files with hash {hash}"
        ))
    })?;
    let gone = sqlx::query(sql::DELETE_UPLOAD)
        .bind(team)
        .bind(hash)
        .bind(to_i64(expected))
        .execute(tx.conn())
        .await?
        .rows_affected()
        == 1;
    if !gone {
        return Err(Error::Aborted(format!(
            "team {team}'s upload of the files with hash {hash} is at version {}, not \
             {expected}: another writer changed it",
            old.version
        )));
    }
    super::records::note_in(&mut tx, &old.blob_digest).await?;
    tx.commit(&store.changed).await?;
    Ok(old.blob_digest)
}

/// The sweep's part: uploads past their expiry are deleted, their
/// archives' blobs noted.
pub(super) async fn sweep(store: &SqlStore, report: &mut SweepReport) -> Result<()> {
    let mut tx = store.write().await?;
    let now = tx.now;
    let rows: Vec<(String, String, String)> = sqlx::query_as(sql::UPLOADS_PAST_EXPIRY)
        .bind(now)
        .bind(SWEEP_BATCH)
        .fetch_all(tx.conn())
        .await?;
    for (team, hash, blob) in rows {
        let gone = sqlx::query(sql::DELETE_EXPIRED_UPLOAD)
            .bind(&team)
            .bind(&hash)
            .bind(now)
            .execute(tx.conn())
            .await?
            .rows_affected()
            == 1;
        if gone {
            super::records::note_in(&mut tx, &blob).await?;
            report.uploads_expired += 1;
        }
    }
    tx.commit(&store.changed).await
}

/// COPY uploads; writes run detached (see [`SqlStore::detached`]).
impl SqlStore {
    /// Records an upload (insert-if-absent, or a replace of the version
    /// read) within the upload bounds.
    pub async fn put_upload(&self, upload: NewUpload) -> Result<UploadRow> {
        self.detached(move |s| async move { put(&s, &upload).await })
            .await
    }

    /// The team's upload of `files_hash`, unless it expired.
    pub async fn get_upload(&self, team: &str, files_hash: &str) -> Result<Option<UploadRow>> {
        if let Some(exec) = &self.exec {
            let (s, team, hash) = (self.clone(), team.to_string(), files_hash.to_string());
            return super::run_on(exec, async move { s.get_upload_now(&team, &hash).await });
        }
        self.get_upload_now(team, files_hash).await
    }

    async fn get_upload_now(&self, team: &str, files_hash: &str) -> Result<Option<UploadRow>> {
        get(self, team, files_hash).await
    }

    /// Deletes exactly version `expected`; the archive's blob (noted).
    pub async fn delete_upload(
        &self,
        team: &str,
        files_hash: &str,
        expected: u64,
    ) -> Result<String> {
        let (team, hash) = (team.to_string(), files_hash.to_string());
        self.detached(move |s| async move { delete(&s, &team, &hash, expected).await })
            .await
    }
}
