//! The template and snapshot records a request reads and writes, wherever
//! this gateway keeps them ([`crate::records`]): the shared store's files,
//! or the scheduler's store (`--blob-store`).
//!
//! Versions: a record read from the scheduler comes with its version, and
//! a replace or delete names it, so of two gateways racing on one record
//! one wins and the other gets a 409 (nothing of its call is written). The
//! shared store's files have no versions (0); its writes are atomic
//! renames, the last one wins.

use crate::error::ApiError;
use crate::records::{from_record, kind_of, to_record, Records};
use crate::state::App;
use http::StatusCode;
use std::collections::HashMap;
use warren_proto::scheduler::v1 as pb;
use warren_template::{Store, Template, TemplateError};

/// A record and the version it was read at (0: the shared store's).
pub(super) type Versioned = (Template, u64);

/// The shared store, when records are its files (and it is there: a
/// gateway never makes one).
pub(super) fn local(app: &App) -> Option<Store> {
    match &app.records {
        Records::Local(dir) => open(dir),
        Records::Scheduler(_) => None,
    }
}

fn open(dir: &std::path::Path) -> Option<Store> {
    dir.is_dir().then(|| Store::open(dir).ok()).flatten()
}

fn internal(m: String) -> ApiError {
    ApiError::new(StatusCode::INTERNAL_SERVER_ERROR, "internal", m)
}

fn store_error(e: TemplateError) -> ApiError {
    internal(e.to_string())
}

/// A records RPC's refusal, for the client: 429 naming the flag of the
/// bound it would pass, 409 for a lost race, 503 when no replica answers.
fn refused(s: &tonic::Status, what: &str) -> ApiError {
    use tonic::Code;
    let bound = s
        .metadata()
        .get(warren_proto::BOUND_METADATA)
        .and_then(|v| v.to_str().ok())
        .unwrap_or("");
    match s.code() {
        Code::ResourceExhausted => {
            let flag = match bound {
                warren_proto::BOUND_SNAPSHOTS => "--snapshot-team-count",
                warren_proto::BOUND_TEMPLATES => "--template-team-count",
                warren_proto::BOUND_LAYER_BYTES => "--snapshot-team-bytes",
                _ => "a gateway limit",
            };
            let code = match bound {
                warren_proto::BOUND_SNAPSHOTS => "too_many_snapshots",
                warren_proto::BOUND_TEMPLATES => "too_many_templates",
                _ => "snapshot_bytes_exceeded",
            };
            ApiError::over_limit(code, format!("{what}: {} ({flag})", s.message()))
        }
        Code::Aborted | Code::AlreadyExists => ApiError::new(
            StatusCode::CONFLICT,
            "record_changed",
            format!(
                "{what}: another request changed the record at the same time ({}); try again",
                s.message()
            ),
        ),
        Code::InvalidArgument | Code::FailedPrecondition => internal(format!(
            "{what}: the scheduler refused the record: {}",
            s.message()
        )),
        _ => ApiError::from_scheduler(s, None),
    }
}

/// The record called `name`, any team's.
pub(super) async fn get(app: &App, name: &str) -> Result<Option<Versioned>, ApiError> {
    match &app.records {
        Records::Local(dir) => {
            let Some(store) = open(dir) else {
                return Ok(None);
            };
            match store.get(name) {
                Ok(t) => Ok(Some((t, 0))),
                Err(TemplateError::NotFound(_)) => Ok(None),
                Err(e) => Err(store_error(e)),
            }
        }
        Records::Scheduler(_) => {
            if warren_template::validate_name(name).is_err() {
                return Ok(None);
            }
            let req = pb::GetTemplateRecordRequest {
                name: name.to_string(),
                team_id: String::new(),
            };
            let got = app
                .scheduler
                .call("GetTemplateRecord", |mut c| {
                    let req = req.clone();
                    async move { c.get_template_record(req).await }
                })
                .await;
            match got {
                Ok(r) => {
                    let version = r.version;
                    Ok(Some((from_record(r).map_err(internal)?, version)))
                }
                Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
                Err(s) => Err(refused(&s, &format!("reading template {name:?}"))),
            }
        }
    }
}

/// Every record of the `kinds` given (empty: all), of `team` when given.
pub(super) async fn list(
    app: &App,
    team: Option<&str>,
    kinds: &[pb::RecordKind],
) -> Result<Vec<Template>, ApiError> {
    Ok(list_versioned(app, team, kinds, false)
        .await?
        .into_iter()
        .map(|(t, _)| t)
        .collect())
}

/// Every public record (a team's template published under its name), of
/// every team.
pub(super) async fn list_public(app: &App) -> Result<Vec<Versioned>, ApiError> {
    list_versioned(app, None, &[], true).await
}

/// [`list`] with each record's version (0: the shared store's); only
/// public records with `public_only`.
pub(super) async fn list_versioned(
    app: &App,
    team: Option<&str>,
    kinds: &[pb::RecordKind],
    public_only: bool,
) -> Result<Vec<Versioned>, ApiError> {
    match &app.records {
        Records::Local(dir) => {
            let Some(store) = open(dir) else {
                return Ok(Vec::new());
            };
            Ok(store
                .list()
                .map_err(store_error)?
                .into_iter()
                .filter(|t| {
                    team.is_none_or(|team| t.snapshot.as_ref().is_some_and(|s| s.team == team))
                })
                .filter(|t| {
                    kinds.is_empty() || kinds.contains(&kind_of(t, super::builds::is_built(t)))
                })
                .filter(|t| !public_only || t.snapshot.as_ref().is_some_and(|s| s.public))
                .map(|t| (t, 0))
                .collect())
        }
        Records::Scheduler(_) => {
            let mut out = Vec::new();
            let mut token = String::new();
            loop {
                let req = pb::ListTemplateRecordsRequest {
                    team_id: team.unwrap_or_default().to_string(),
                    kinds: kinds.iter().map(|k| *k as i32).collect(),
                    source_sandbox: String::new(),
                    order: pb::RecordOrder::Unspecified as i32,
                    page_size: 1000,
                    page_token: token.clone(),
                    public_only,
                };
                let page = app
                    .scheduler
                    .call("ListTemplateRecords", |mut c| {
                        let req = req.clone();
                        async move { c.list_template_records(req).await }
                    })
                    .await
                    .map_err(|s| refused(&s, "listing templates"))?;
                for r in page.records {
                    let version = r.version;
                    out.push((from_record(r).map_err(internal)?, version));
                }
                if page.next_page_token.is_empty() {
                    return Ok(out);
                }
                token = page.next_page_token;
            }
        }
    }
}

/// Writes every record of `puts` (each `(record, built, version read)`,
/// naming the layers it named when it was read: a flag changed, such as
/// `public`): with the scheduler's records all or none in one batch (its
/// fence: of two writers racing one wins whole), in the shared store one
/// after the other (atomic renames, the last wins).
pub(super) async fn put_all(app: &App, puts: &[(Template, bool, u64)]) -> Result<(), ApiError> {
    if let Records::Local(dir) = &app.records {
        let store = Store::open(dir).map_err(store_error)?;
        for (t, _, _) in puts {
            super::team_store::put(&store, t)?;
        }
        return Ok(());
    }
    let mut batch = Vec::with_capacity(puts.len());
    for (t, built, version) in puts {
        batch.push(pb::RecordPut {
            record: Some(to_record(t, kind_of(t, *built), |_| 0)),
            expected_version: *version,
        });
    }
    // The layers' sizes as recorded (a blob store is not asked again).
    for (put, (t, _, _)) in batch.iter_mut().zip(puts) {
        if let (Some(r), Some((old, _))) = (put.record.as_mut(), get_record(app, &t.name).await?) {
            r.layers = old.layers;
        }
    }
    let limits = app.settings.limits.store;
    let req = pb::PutTemplateRecordsRequest {
        puts: batch,
        bounds: Some(pb::RecordBounds {
            max_snapshots: limits.snapshot_count as u64,
            max_templates: limits.template_count as u64,
            max_layer_bytes: limits.snapshot_bytes,
        }),
    };
    app.scheduler
        .call("PutTemplateRecords", |mut c| {
            let req = req.clone();
            async move { c.put_template_records(req).await }
        })
        .await
        .map_err(|s| refused(&s, "updating templates"))?;
    Ok(())
}

/// The scheduler's record `name` as it stores it (layer sizes included).
async fn get_record(app: &App, name: &str) -> Result<Option<(pb::TemplateRecord, u64)>, ApiError> {
    let req = pb::GetTemplateRecordRequest {
        name: name.to_string(),
        team_id: String::new(),
    };
    match app
        .scheduler
        .call("GetTemplateRecord", |mut c| {
            let req = req.clone();
            async move { c.get_template_record(req).await }
        })
        .await
    {
        Ok(r) => {
            let v = r.version;
            Ok(Some((r, v)))
        }
        Err(s) if s.code() == tonic::Code::NotFound => Ok(None),
        Err(s) => Err(refused(&s, &format!("reading template {name:?}"))),
    }
}

/// Records `t` (`built`: a template a team built): a new record when
/// `expected` is 0, else the replacement of the one read at that version.
/// The team's bounds are checked by the write itself where the records
/// are the scheduler's.
pub(super) async fn put(
    app: &App,
    t: &Template,
    built: bool,
    expected: u64,
) -> Result<(), ApiError> {
    match &app.records {
        Records::Local(dir) => Store::open(dir).and_then(|s| s.put(t)).map_err(store_error),
        Records::Scheduler(blobs) => {
            let mut sizes = HashMap::new();
            for l in &t.layers {
                let digest: warren_blob::Digest = l
                    .parse()
                    .map_err(|e| internal(format!("layer {l:?} of {}: {e}", t.name)))?;
                let size = blobs.size(&digest).await.map_err(|e| {
                    ApiError::new(
                        StatusCode::SERVICE_UNAVAILABLE,
                        "blob_store_unavailable",
                        format!(
                            "cannot read layer {l} of {} from the blob store: {e}",
                            t.name
                        ),
                    )
                })?;
                let size = size.ok_or_else(|| {
                    internal(format!(
                        "layer {l} of {} is not in the blob store {blobs}",
                        t.name
                    ))
                })?;
                sizes.insert(l.clone(), size);
            }
            let limits = app.settings.limits.store;
            let req = pb::PutTemplateRecordsRequest {
                puts: vec![pb::RecordPut {
                    record: Some(to_record(t, kind_of(t, built), |l| {
                        sizes.get(l).copied().unwrap_or(0)
                    })),
                    expected_version: expected,
                }],
                bounds: Some(pb::RecordBounds {
                    max_snapshots: limits.snapshot_count as u64,
                    max_templates: limits.template_count as u64,
                    max_layer_bytes: limits.snapshot_bytes,
                }),
            };
            app.scheduler
                .call("PutTemplateRecords", |mut c| {
                    let req = req.clone();
                    async move { c.put_template_records(req).await }
                })
                .await
                .map_err(|s| refused(&s, &format!("recording {}", t.name)))?;
            Ok(())
        }
    }
}

/// Removes record `name` as read at `version`; false when it was gone.
pub(super) async fn remove(app: &App, name: &str, version: u64) -> Result<bool, ApiError> {
    match &app.records {
        Records::Local(dir) => Store::open(dir)
            .and_then(|s| s.remove(name))
            .map_err(store_error),
        Records::Scheduler(_) => {
            let req = pb::DeleteTemplateRecordsRequest {
                records: vec![pb::RecordRef {
                    name: name.to_string(),
                    expected_version: version,
                }],
                team_id: String::new(),
            };
            let done = app
                .scheduler
                .call("DeleteTemplateRecords", |mut c| {
                    let req = req.clone();
                    async move { c.delete_template_records(req).await }
                })
                .await;
            match done {
                Ok(_) => Ok(true),
                Err(s) if s.code() == tonic::Code::NotFound => Ok(false),
                Err(s) => Err(refused(&s, &format!("deleting {name}"))),
            }
        }
    }
}
