//! The records' RPC bodies (`records.proto`): validate
//! (`validate_records.rs`), call the store, convert the answer. Who may
//! call them (gateways only) is decided in `mod.rs` like for every RPC.

use super::validate::page_size;
use super::validate_records as v;
use super::SchedulerService;
use crate::error::{Error, Result};
use crate::store::records::*;
use warren_proto::scheduler::v1 as pb;

fn record_kind(k: RecordKind) -> pb::RecordKind {
    match k {
        RecordKind::Operator => pb::RecordKind::Operator,
        RecordKind::Snapshot => pb::RecordKind::Snapshot,
        RecordKind::Built => pb::RecordKind::Built,
        RecordKind::Paused => pb::RecordKind::Paused,
    }
}

fn record_pb(r: &TemplateRecord) -> pb::TemplateRecord {
    let d = &r.defaults;
    pb::TemplateRecord {
        name: r.name.clone(),
        kind: record_kind(r.kind) as i32,
        team_id: r.team_id.clone(),
        digest: r.digest.clone(),
        layers: r
            .layers
            .iter()
            .map(|l| pb::Layer {
                digest: l.digest.clone(),
                size_bytes: l.size_bytes,
            })
            .collect(),
        defaults: Some(pb::TemplateDefaults {
            user: d.user.clone(),
            workdir: d.workdir.clone(),
            env: d.env.iter().map(|(k, v)| (k.clone(), v.clone())).collect(),
            start_cmd: d.start_cmd.clone(),
            ready_cmd: d.ready_cmd.clone(),
            ready_timeout_secs: d.ready_timeout_secs,
            cpu_count: d.cpu_count,
            memory_mb: d.memory_mb,
            disk_mb: d.disk_mb,
        }),
        source: r.source.clone(),
        images: r.images.clone(),
        snapshot: r.snapshot.as_ref().map(|s| pb::SnapshotMeta {
            name: s.name.clone(),
            source_sandbox: s.source_sandbox.clone(),
            node_id: s.node_id.clone(),
            paused: s.paused.as_ref().map(|p| pb::PausedMeta {
                generation: p.generation,
                settings_json: p.settings_json.clone(),
                own_layers: p.own_layers.clone(),
            }),
            public: s.public,
        }),
        created_at_ms: r.created_at_ms,
        updated_at_ms: r.updated_at_ms,
        version: r.version,
    }
}

fn build_status(s: BuildStatus) -> pb::BuildStatus {
    match s {
        BuildStatus::Waiting => pb::BuildStatus::Waiting,
        BuildStatus::Building => pb::BuildStatus::Building,
        BuildStatus::Ready => pb::BuildStatus::Ready,
        BuildStatus::Error => pb::BuildStatus::Error,
    }
}

fn build_pb(b: BuildRow) -> pb::Build {
    pb::Build {
        status: build_status(b.status) as i32,
        build_id: b.build_id,
        team_id: b.team_id,
        template_name: b.template_name,
        request_json: b.request_json,
        plan_json: b.plan_json,
        owner: b.owner,
        lease_expires_at_ms: b.lease_expires_at_ms,
        requested_at_ms: b.requested_at_ms,
        start_deadline_ms: b.start_deadline_ms,
        started_at_ms: b.started_at_ms,
        finished_at_ms: b.finished_at_ms,
        expires_at_ms: b.expires_at_ms,
        reason_message: b.reason_message,
        reason_step: b.reason_step,
        log_bytes: b.log_bytes,
        log_next_seq: b.log_next_seq,
        log_truncated: b.log_truncated,
    }
}

fn upload_pb(u: UploadRow) -> pb::Upload {
    pb::Upload {
        team_id: u.team_id,
        files_hash: u.files_hash,
        blob_digest: u.blob_digest,
        size_bytes: u.size_bytes,
        created_at_ms: u.created_at_ms,
        expires_at_ms: u.expires_at_ms,
        version: u.version,
    }
}

/// An optional team filter: empty, or a team id.
fn team_filter(field: &str, t: &str) -> Result<Option<String>> {
    if t.is_empty() {
        return Ok(None);
    }
    v::team(field, t)?;
    Ok(Some(t.to_string()))
}

fn build_not_found(id: &str) -> Error {
    Error::NotFound(format!("template build {id} not found"))
}

impl SchedulerService {
    pub(super) async fn put_template_records(
        &self,
        r: pb::PutTemplateRecordsRequest,
    ) -> Result<pb::PutTemplateRecordsResponse> {
        let puts = v::puts(r.puts)?;
        let bounds = v::bounds(r.bounds)?;
        let written = self.store.put_records(puts, bounds).await?;
        Ok(pb::PutTemplateRecordsResponse {
            records: written.iter().map(record_pb).collect(),
        })
    }

    pub(super) async fn get_template_record(
        &self,
        r: pb::GetTemplateRecordRequest,
    ) -> Result<pb::TemplateRecord> {
        v::record_name("name", &r.name)?;
        let team = team_filter("team_id", &r.team_id)?;
        self.store
            .get_record(&r.name)
            .await?
            .filter(|rec| team.as_ref().is_none_or(|t| *t == rec.team_id))
            .map(|rec| record_pb(&rec))
            .ok_or_else(|| Error::NotFound(format!("template record {} not found", r.name)))
    }

    pub(super) async fn list_template_records(
        &self,
        r: pb::ListTemplateRecordsRequest,
    ) -> Result<pb::ListTemplateRecordsResponse> {
        let order = v::record_order(r.order)?;
        let kinds = r
            .kinds
            .iter()
            .enumerate()
            .map(|(i, k)| v::kind(&format!("kinds[{i}]"), *k))
            .collect::<Result<Vec<_>>>()?;
        let source_sandbox = match r.source_sandbox.as_str() {
            "" => None,
            id => {
                warren_core::id::validate_sandbox_id(id)
                    .map_err(|e| Error::invalid(format!("source_sandbox: {e}")))?;
                Some(id.to_string())
            }
        };
        let filter = RecordFilter {
            team_id: team_filter("team_id", &r.team_id)?,
            kinds,
            source_sandbox,
            order,
            after: v::record_token(&r.page_token, order)?,
            limit: page_size(r.page_size),
            public_only: r.public_only,
        };
        let (rows, next) = self.store.list_records(&filter).await?;
        Ok(pb::ListTemplateRecordsResponse {
            records: rows.iter().map(record_pb).collect(),
            next_page_token: next
                .map(|c| v::make_record_token(&c, order))
                .unwrap_or_default(),
        })
    }

    pub(super) async fn delete_template_records(
        &self,
        r: pb::DeleteTemplateRecordsRequest,
    ) -> Result<pb::DeleteTemplateRecordsResponse> {
        let refs = v::refs(r.records)?;
        let team = team_filter("team_id", &r.team_id)?;
        let noted = self.store.delete_records(refs, team).await?;
        Ok(pb::DeleteTemplateRecordsResponse {
            noted_digests: noted,
        })
    }

    pub(super) async fn get_team_usage(&self, r: pb::GetTeamUsageRequest) -> Result<pb::TeamUsage> {
        v::team("team_id", &r.team_id)?;
        let u = self.store.team_usage(&r.team_id).await?;
        Ok(pb::TeamUsage {
            snapshots: u.snapshots,
            templates: u.templates,
            layer_bytes: u.layer_bytes,
            builds: u.builds,
            build_log_bytes: u.build_log_bytes,
            uploads: u.uploads,
            upload_bytes: u.upload_bytes,
        })
    }

    pub(super) async fn note_unused_blobs(
        &self,
        r: pb::NoteUnusedBlobsRequest,
    ) -> Result<pb::NoteUnusedBlobsResponse> {
        v::digests("digests", &r.digests)?;
        if !r.digests.is_empty() {
            self.store.note_blobs(r.digests).await?;
        }
        Ok(pb::NoteUnusedBlobsResponse {})
    }

    pub(super) async fn list_unused_blobs(
        &self,
        r: pb::ListUnusedBlobsRequest,
    ) -> Result<pb::ListUnusedBlobsResponse> {
        if r.grace_ms > v::MAX_TTL_MS {
            return Err(Error::invalid(format!(
                "grace_ms {} is above the limit of {}",
                r.grace_ms,
                v::MAX_TTL_MS
            )));
        }
        let after = v::blob_token(&r.page_token)?;
        let (blobs, next) = self
            .store
            .due_blobs(r.grace_ms as i64, &after, page_size(r.page_size))
            .await?;
        Ok(pb::ListUnusedBlobsResponse {
            blobs: blobs
                .into_iter()
                .map(|b| pb::UnusedBlob {
                    digest: b.digest,
                    noted_at_ms: b.noted_at_ms,
                })
                .collect(),
            next_page_token: next.map(|d| v::make_blob_token(&d)).unwrap_or_default(),
        })
    }

    pub(super) async fn remove_unused_blob(
        &self,
        r: pb::RemoveUnusedBlobRequest,
    ) -> Result<pb::RemoveUnusedBlobResponse> {
        v::digest("digest", &r.digest)?;
        if r.noted_at_ms < 0 {
            return Err(Error::invalid(format!(
                "noted_at_ms {} is not a time",
                r.noted_at_ms
            )));
        }
        let outcome = match self
            .store
            .remove_blob_note(&r.digest, r.noted_at_ms)
            .await?
        {
            BlobRemoval::Removed => pb::BlobRemoval::Removed,
            BlobRemoval::Named => pb::BlobRemoval::Named,
            BlobRemoval::NotedAgain => pb::BlobRemoval::NotedAgain,
            BlobRemoval::Gone => pb::BlobRemoval::Gone,
        };
        Ok(pb::RemoveUnusedBlobResponse {
            outcome: outcome as i32,
        })
    }

    pub(super) async fn create_build(&self, r: pb::CreateBuildRequest) -> Result<pb::Build> {
        v::build_id("build_id", &r.build_id)?;
        v::team("team_id", &r.team_id)?;
        v::template_name("template_name", &r.template_name)?;
        v::request_json(&r.request_json)?;
        let bounds = r.bounds.unwrap_or_default();
        let build = NewBuild {
            start_ttl_ms: v::millis("start_ttl_ms", r.start_ttl_ms, v::MAX_TTL_MS)?,
            retention_ms: v::millis("retention_ms", r.retention_ms, v::MAX_TTL_MS)?,
            max_team_builds: v::size("bounds.max_team_builds", bounds.max_team_builds)?,
            max_total_builds: v::size("bounds.max_total_builds", bounds.max_total_builds)?,
            build_id: r.build_id,
            team_id: r.team_id,
            template_name: r.template_name,
            request_json: r.request_json,
        };
        Ok(build_pb(self.store.create_build(build).await?))
    }

    /// The team's build, as readers see it.
    async fn team_build(&self, build_id: &str, team: &str) -> Result<BuildRow> {
        v::build_id("build_id", build_id)?;
        v::team("team_id", team)?;
        self.store
            .get_build(build_id)
            .await?
            .filter(|b| b.team_id == team)
            .ok_or_else(|| build_not_found(build_id))
    }

    pub(super) async fn get_build(&self, r: pb::GetBuildRequest) -> Result<pb::Build> {
        Ok(build_pb(self.team_build(&r.build_id, &r.team_id).await?))
    }

    pub(super) async fn list_builds(
        &self,
        r: pb::ListBuildsRequest,
    ) -> Result<pb::ListBuildsResponse> {
        v::team("team_id", &r.team_id)?;
        if !r.template_name.is_empty() {
            v::template_name("template_name", &r.template_name)?;
        }
        let after = v::build_token(&r.page_token)?;
        let (rows, next) = self
            .store
            .list_builds(&r.team_id, &r.template_name, after, page_size(r.page_size))
            .await?;
        Ok(pb::ListBuildsResponse {
            builds: rows.into_iter().map(build_pb).collect(),
            next_page_token: next.map(|c| v::make_build_token(&c)).unwrap_or_default(),
        })
    }

    pub(super) async fn claim_build(
        &self,
        r: pb::ClaimBuildRequest,
    ) -> Result<pb::ClaimBuildResponse> {
        v::build_id("build_id", &r.build_id)?;
        v::team("team_id", &r.team_id)?;
        v::template_name("template_name", &r.template_name)?;
        v::owner("owner", &r.owner)?;
        v::plan_json(&r.plan_json)?;
        v::upload_hashes(&r.upload_hashes)?;
        let claim = BuildClaim {
            lease_ms: v::millis("lease_ms", r.lease_ms, v::MAX_LEASE_MS)?,
            build_id: r.build_id,
            team_id: r.team_id,
            template_name: r.template_name,
            owner: r.owner,
            plan_json: r.plan_json,
            upload_hashes: r.upload_hashes,
        };
        let (build, uploads) = self.store.claim_build(claim).await?;
        Ok(pb::ClaimBuildResponse {
            build: Some(build_pb(build)),
            uploads: uploads.into_iter().map(upload_pb).collect(),
        })
    }

    pub(super) async fn renew_build_lease(
        &self,
        r: pb::RenewBuildLeaseRequest,
    ) -> Result<pb::Build> {
        v::build_id("build_id", &r.build_id)?;
        v::owner("owner", &r.owner)?;
        let lease = v::millis("lease_ms", r.lease_ms, v::MAX_LEASE_MS)?;
        let b = self
            .store
            .renew_build_lease(&r.build_id, &r.owner, lease)
            .await?;
        Ok(build_pb(b))
    }

    pub(super) async fn update_build_status(
        &self,
        r: pb::UpdateBuildStatusRequest,
    ) -> Result<pb::Build> {
        v::build_id("build_id", &r.build_id)?;
        v::owner("owner", &r.owner)?;
        let status = v::finish(r.status, &r.reason_message, &r.reason_step)?;
        let b = self
            .store
            .finish_build(
                &r.build_id,
                &r.owner,
                status,
                (r.reason_message, r.reason_step),
            )
            .await?;
        Ok(build_pb(b))
    }

    pub(super) async fn append_build_log(
        &self,
        r: pb::AppendBuildLogRequest,
    ) -> Result<pb::AppendBuildLogResponse> {
        v::build_id("build_id", &r.build_id)?;
        v::owner("owner", &r.owner)?;
        let batch = v::batch_number(r.batch)?;
        let lines = v::log_lines(r.lines)?;
        let bounds = v::log_bounds(r.bounds)?;
        let a = self
            .store
            .append_build_log(&r.build_id, &r.owner, batch, lines, bounds)
            .await?;
        Ok(pb::AppendBuildLogResponse {
            repeated: a.repeated,
            kept: a.kept,
            dropped: a.dropped,
            truncated: a.truncated,
            log_bytes: a.log_bytes,
        })
    }

    pub(super) async fn read_build_log(
        &self,
        r: pb::ReadBuildLogRequest,
    ) -> Result<pb::ReadBuildLogResponse> {
        self.team_build(&r.build_id, &r.team_id).await?;
        let lines = self
            .store
            .read_build_log(&r.build_id, r.from_seq, page_size(r.limit))
            .await?;
        let next_seq = lines.last().map_or(r.from_seq, |l| l.seq + 1);
        Ok(pb::ReadBuildLogResponse {
            lines: lines
                .into_iter()
                .map(|l| pb::LogLine {
                    seq: l.seq,
                    at_ms: l.at_ms,
                    level: l.level,
                    message: l.message,
                })
                .collect(),
            next_seq,
        })
    }

    pub(super) async fn put_upload(&self, r: pb::PutUploadRequest) -> Result<pb::Upload> {
        v::team("team_id", &r.team_id)?;
        v::files_hash("files_hash", &r.files_hash)?;
        v::digest("blob_digest", &r.blob_digest)?;
        let bounds = r.bounds.unwrap_or_default();
        let upload = NewUpload {
            size_bytes: v::size("size_bytes", r.size_bytes)?,
            ttl_ms: v::millis("ttl_ms", r.ttl_ms, v::MAX_TTL_MS)?,
            expected_version: v::version("expected_version", r.expected_version)?,
            max_team_bytes: v::size("bounds.max_team_bytes", bounds.max_team_bytes)?,
            max_total_bytes: v::size("bounds.max_total_bytes", bounds.max_total_bytes)?,
            team_id: r.team_id,
            files_hash: r.files_hash,
            blob_digest: r.blob_digest,
        };
        Ok(upload_pb(self.store.put_upload(upload).await?))
    }

    pub(super) async fn get_upload(&self, r: pb::GetUploadRequest) -> Result<pb::Upload> {
        v::team("team_id", &r.team_id)?;
        v::files_hash("files_hash", &r.files_hash)?;
        self.store
            .get_upload(&r.team_id, &r.files_hash)
            .await?
            .map(upload_pb)
            .ok_or_else(|| {
                Error::NotFound(format!(
                    "team {} has no upload of the files with hash {}",
                    r.team_id, r.files_hash
                ))
            })
    }

    pub(super) async fn delete_upload(
        &self,
        r: pb::DeleteUploadRequest,
    ) -> Result<pb::DeleteUploadResponse> {
        v::team("team_id", &r.team_id)?;
        v::files_hash("files_hash", &r.files_hash)?;
        let expected = v::read_version("expected_version", r.expected_version)?;
        let noted = self
            .store
            .delete_upload(&r.team_id, &r.files_hash, expected)
            .await?;
        Ok(pb::DeleteUploadResponse {
            noted_digest: noted,
        })
    }
}
