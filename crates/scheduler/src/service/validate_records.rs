//! Input checks for the records' RPCs (`records.proto`), run before
//! anything touches the store: each message names the field, and nothing
//! is written.

use crate::error::{Error, Result};
use crate::store::records::*;
use std::collections::{BTreeMap, BTreeSet};
use warren_core::id::{validate_node_id, validate_sandbox_id};
use warren_proto::scheduler::v1 as pb;

/// Records (or refs) in one put or delete.
pub const MAX_BATCH: usize = 64;
const MAX_LAYERS: usize = 256;
const MAX_IMAGES: usize = 64;
const MAX_IMAGE: usize = 256;
const MAX_SOURCE: usize = 1024;
const MAX_LABEL: usize = 128;
/// `user` and `workdir`.
const MAX_PATHISH: usize = 256;
const MAX_CMD: usize = 64 * 1024;
const MAX_ENV_PAIRS: usize = 512;
const MAX_ENV_KEY: usize = 256;
const MAX_ENV_BYTES: usize = 256 * 1024;
const MAX_READY_TIMEOUT_SECS: u64 = 86_400;
/// A paused sandbox's settings: its egress policy (2 000 entries at most)
/// and rules (64 KiB of headers, 100 hosts) with room for the JSON.
const MAX_SETTINGS: usize = 512 * 1024;
/// Longest TTL or retention a caller may name: 30 days.
pub const MAX_TTL_MS: u64 = 30 * 86_400_000;
/// Longest build lease: 1 hour.
pub const MAX_LEASE_MS: u64 = 3_600_000;
const MAX_REQUEST_JSON: usize = 64 * 1024;
const MAX_PLAN_JSON: usize = 1024 * 1024;
const MAX_UPLOAD_HASHES: usize = 256;
const MAX_REASON: usize = 16 * 1024;
const MAX_STEP: usize = 64;
pub const MAX_LINES: usize = 1000;
const MAX_LINE: usize = 16 * 1024;
const MAX_NOTES: usize = 1000;
const LEVELS: [&str; 4] = ["debug", "info", "warn", "error"];

fn bad(m: String) -> Error {
    Error::InvalidArgument(m)
}

fn shown(v: &str) -> String {
    format!("{:?}", v.chars().take(80).collect::<String>())
}

/// At most `max` bytes.
fn bounded(field: &str, v: &str, max: usize) -> Result<()> {
    if v.len() > max {
        return Err(bad(format!(
            "{field} is {} bytes long; the limit is {max}",
            v.len()
        )));
    }
    Ok(())
}

/// At most `max` bytes, no control characters.
fn printable(field: &str, v: &str, max: usize) -> Result<()> {
    bounded(field, v, max)?;
    if v.chars().any(char::is_control) {
        return Err(bad(format!("{field} contains control characters")));
    }
    Ok(())
}

/// A team id: required, short and printable.
pub fn team(field: &str, v: &str) -> Result<()> {
    if v.is_empty() {
        return Err(bad(format!("{field} is required")));
    }
    printable(field, v, MAX_LABEL)
}

/// 1 to `max` of the bytes `ok` allows, starting with a letter or digit.
fn word(field: &str, v: &str, max: usize, ok: fn(u8) -> bool, rule: &str) -> Result<()> {
    let fine = !v.is_empty()
        && v.len() <= max
        && v.as_bytes()[0].is_ascii_alphanumeric()
        && v.bytes().all(ok);
    if fine {
        Ok(())
    } else {
        Err(bad(format!(
            "{field} {} must be 1 to {max} of {rule}, starting with a letter or digit",
            shown(v)
        )))
    }
}

/// A record name: the template store's rule (1 to 64 of a-z 0-9 . _ -).
pub fn record_name(field: &str, v: &str) -> Result<()> {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b"._-".contains(&b);
    word(field, v, 64, ok, "a-z, 0-9, '.', '_', '-'")
}

/// A team's template name (the build API's: 1 to 128 of A-Z a-z 0-9 . _ -).
pub fn template_name(field: &str, v: &str) -> Result<()> {
    let ok = |b: u8| b.is_ascii_alphanumeric() || b"._-".contains(&b);
    word(field, v, MAX_LABEL, ok, "A-Z, a-z, 0-9, '.', '_', '-'")
}

/// A build id (a UUID): 1 to 64 of a-z 0-9 -.
pub fn build_id(field: &str, v: &str) -> Result<()> {
    let ok = |b: u8| b.is_ascii_lowercase() || b.is_ascii_digit() || b == b'-';
    word(field, v, 64, ok, "a-z, 0-9, '-'")
}

/// `sha256-` and 64 lowercase hex digits.
pub fn digest(field: &str, v: &str) -> Result<()> {
    if v.strip_prefix("sha256-").is_some_and(is_hex64) {
        Ok(())
    } else {
        Err(bad(format!(
            "{field} {} is not a blob digest (sha256- and 64 lowercase hex digits)",
            shown(v)
        )))
    }
}

fn is_hex64(h: &str) -> bool {
    h.len() == 64 && h.bytes().all(|b| matches!(b, b'0'..=b'9' | b'a'..=b'f'))
}

/// The SDK's files hash: 64 lowercase hex digits.
pub fn files_hash(field: &str, v: &str) -> Result<()> {
    if is_hex64(v) {
        Ok(())
    } else {
        Err(bad(format!(
            "{field} {} is not a files hash (64 lowercase hex digits)",
            shown(v)
        )))
    }
}

/// A gateway's own id for its leases.
pub fn owner(field: &str, v: &str) -> Result<()> {
    team(field, v)
}

/// 1 ms to `max` ms.
pub fn millis(field: &str, v: u64, max: u64) -> Result<i64> {
    if v == 0 || v > max {
        return Err(bad(format!(
            "{field} {v} must be between 1 and {max} milliseconds"
        )));
    }
    Ok(v as i64)
}

/// A count or size that fits the store (below 2^63).
fn fits(field: &str, v: u64) -> Result<u64> {
    if v > i64::MAX as u64 {
        return Err(bad(format!("{field} {v} is too large")));
    }
    Ok(v)
}

/// A version as read (0 means "none": insert-if-absent).
pub fn version(field: &str, v: u64) -> Result<u64> {
    fits(field, v)
}

/// A version that must name one read (deletes).
pub fn read_version(field: &str, v: u64) -> Result<u64> {
    if v == 0 {
        return Err(bad(format!(
            "{field} is 0; a delete names the version it read"
        )));
    }
    fits(field, v)
}

/// JSON text of an object, at most `max` bytes.
fn json_object(field: &str, v: &str, max: usize) -> Result<()> {
    bounded(field, v, max)?;
    match serde_json::from_str::<serde_json::Value>(v) {
        Ok(serde_json::Value::Object(_)) => Ok(()),
        Ok(_) => Err(bad(format!("{field} must be a JSON object"))),
        Err(e) => Err(bad(format!("{field} is not JSON: {e}"))),
    }
}

pub fn kind(field: &str, v: i32) -> Result<RecordKind> {
    match pb::RecordKind::try_from(v) {
        Ok(pb::RecordKind::Operator) => Ok(RecordKind::Operator),
        Ok(pb::RecordKind::Snapshot) => Ok(RecordKind::Snapshot),
        Ok(pb::RecordKind::Built) => Ok(RecordKind::Built),
        Ok(pb::RecordKind::Paused) => Ok(RecordKind::Paused),
        Ok(pb::RecordKind::Unspecified) | Err(_) => Err(bad(format!(
            "{field} {v} is not a record kind (operator, snapshot, built or paused)"
        ))),
    }
}

fn defaults(field: &str, d: Option<pb::TemplateDefaults>) -> Result<Defaults> {
    let d = d.ok_or_else(|| bad(format!("{field} is required")))?;
    printable(&format!("{field}.user"), &d.user, MAX_PATHISH)?;
    printable(&format!("{field}.workdir"), &d.workdir, MAX_PATHISH)?;
    bounded(&format!("{field}.start_cmd"), &d.start_cmd, MAX_CMD)?;
    bounded(&format!("{field}.ready_cmd"), &d.ready_cmd, MAX_CMD)?;
    if d.ready_timeout_secs > MAX_READY_TIMEOUT_SECS {
        return Err(bad(format!(
            "{field}.ready_timeout_secs {} is above the limit of {MAX_READY_TIMEOUT_SECS}",
            d.ready_timeout_secs
        )));
    }
    fits(&format!("{field}.memory_mb"), d.memory_mb)?;
    fits(&format!("{field}.disk_mb"), d.disk_mb)?;
    if d.env.len() > MAX_ENV_PAIRS {
        return Err(bad(format!(
            "{field}.env has {} entries; the limit is {MAX_ENV_PAIRS}",
            d.env.len()
        )));
    }
    let mut total = 0;
    for (k, v) in &d.env {
        if k.is_empty() || k.len() > MAX_ENV_KEY || k.chars().any(char::is_control) {
            return Err(bad(format!(
                "{field}.env key {} must be 1 to {MAX_ENV_KEY} bytes without control characters",
                shown(k)
            )));
        }
        total += k.len() + v.len();
    }
    if total > MAX_ENV_BYTES {
        return Err(bad(format!(
            "{field}.env holds {total} bytes; the limit is {MAX_ENV_BYTES}"
        )));
    }
    Ok(Defaults {
        user: d.user,
        workdir: d.workdir,
        env: d.env.into_iter().collect::<BTreeMap<_, _>>(),
        start_cmd: d.start_cmd,
        ready_cmd: d.ready_cmd,
        ready_timeout_secs: d.ready_timeout_secs,
        cpu_count: d.cpu_count,
        memory_mb: d.memory_mb,
        disk_mb: d.disk_mb,
    })
}

fn snapshot(
    field: &str,
    kind: RecordKind,
    s: Option<pb::SnapshotMeta>,
    layers: &[Layer],
) -> Result<Option<SnapshotMeta>> {
    let s = match (kind, s) {
        (RecordKind::Operator, None) => return Ok(None),
        (RecordKind::Operator, Some(_)) => {
            return Err(bad(format!(
                "{field} must be absent for an operator record"
            )))
        }
        (_, None) => {
            return Err(bad(format!(
                "{field} is required for a {} record",
                kind.as_str()
            )))
        }
        (_, Some(s)) => s,
    };
    printable(&format!("{field}.name"), &s.name, MAX_LABEL)?;
    if !s.source_sandbox.is_empty() {
        validate_sandbox_id(&s.source_sandbox)
            .map_err(|e| bad(format!("{field}.source_sandbox: {e}")))?;
    }
    if !s.node_id.is_empty() {
        validate_node_id(&s.node_id).map_err(|e| bad(format!("{field}.node_id: {e}")))?;
    }
    let paused = match (kind, s.paused) {
        (RecordKind::Paused, None) => {
            return Err(bad(format!(
                "{field}.paused is required for a paused record"
            )))
        }
        (RecordKind::Paused, Some(p)) => Some(paused(&format!("{field}.paused"), p, layers)?),
        (_, Some(_)) => {
            return Err(bad(format!(
                "{field}.paused is only for a paused record, not a {} one",
                kind.as_str()
            )))
        }
        (_, None) => None,
    };
    if s.public && (!kind.is_teams() || s.name.is_empty()) {
        return Err(bad(format!(
            "{field}.public is only for a team's snapshot or built record with a name, not \
             a {} one{}",
            kind.as_str(),
            if s.name.is_empty() {
                " without a name"
            } else {
                ""
            }
        )));
    }
    Ok(Some(SnapshotMeta {
        name: s.name,
        source_sandbox: s.source_sandbox,
        node_id: s.node_id,
        paused,
        public: s.public,
    }))
}

fn paused(field: &str, p: pb::PausedMeta, layers: &[Layer]) -> Result<PausedMeta> {
    if !p.settings_json.is_empty() {
        let f = format!("{field}.settings_json");
        bounded(&f, &p.settings_json, MAX_SETTINGS)?;
        serde_json::from_str::<serde_json::Value>(&p.settings_json)
            .map_err(|e| bad(format!("{f} is not JSON: {e}")))?;
    }
    fits(&format!("{field}.generation"), p.generation)?;
    for (i, l) in p.own_layers.iter().enumerate() {
        let f = format!("{field}.own_layers[{i}]");
        digest(&f, l)?;
        if !layers.iter().any(|x| &x.digest == l) {
            return Err(bad(format!("{f} {l} is not one of the record's layers")));
        }
    }
    Ok(PausedMeta {
        generation: p.generation,
        settings_json: p.settings_json,
        own_layers: p.own_layers,
    })
}

/// A template record to write.
pub fn record(field: &str, r: Option<pb::TemplateRecord>) -> Result<TemplateRecord> {
    let r = r.ok_or_else(|| bad(format!("{field} is required")))?;
    record_name(&format!("{field}.name"), &r.name)?;
    let kind = kind(&format!("{field}.kind"), r.kind)?;
    let team_field = format!("{field}.team_id");
    if kind.is_teams() {
        team(&team_field, &r.team_id)?;
    } else if !r.team_id.is_empty() {
        return Err(bad(format!(
            "{team_field} must be empty for a {} record (it belongs to no team)",
            kind.as_str()
        )));
    }
    digest(&format!("{field}.digest"), &r.digest)?;
    if r.layers.len() > MAX_LAYERS {
        return Err(bad(format!(
            "{field}.layers has {} entries; the limit is {MAX_LAYERS}",
            r.layers.len()
        )));
    }
    let layers = r
        .layers
        .into_iter()
        .enumerate()
        .map(|(i, l)| {
            digest(&format!("{field}.layers[{i}].digest"), &l.digest)?;
            fits(&format!("{field}.layers[{i}].size_bytes"), l.size_bytes)?;
            Ok(Layer {
                digest: l.digest,
                size_bytes: l.size_bytes,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    printable(&format!("{field}.source"), &r.source, MAX_SOURCE)?;
    if r.images.len() > MAX_IMAGES {
        return Err(bad(format!(
            "{field}.images has {} entries; the limit is {MAX_IMAGES}",
            r.images.len()
        )));
    }
    for (i, img) in r.images.iter().enumerate() {
        let f = format!("{field}.images[{i}]");
        if img.is_empty() {
            return Err(bad(format!("{f} is empty")));
        }
        printable(&f, img, MAX_IMAGE)?;
    }
    if r.created_at_ms < 0 {
        return Err(bad(format!(
            "{field}.created_at_ms {} is not a time (milliseconds since the epoch)",
            r.created_at_ms
        )));
    }
    Ok(TemplateRecord {
        defaults: defaults(&format!("{field}.defaults"), r.defaults)?,
        snapshot: snapshot(&format!("{field}.snapshot"), kind, r.snapshot, &layers)?,
        name: r.name,
        kind,
        team_id: r.team_id,
        digest: r.digest,
        layers,
        source: r.source,
        images: r.images,
        created_at_ms: r.created_at_ms,
        updated_at_ms: 0,
        version: 0,
    })
}

/// 1 to [`MAX_BATCH`] entries, each name once.
pub fn batch<'a>(field: &str, names: impl ExactSizeIterator<Item = &'a str>) -> Result<()> {
    let n = names.len();
    if n == 0 || n > MAX_BATCH {
        return Err(bad(format!(
            "{field} has {n} entries; it takes 1 to {MAX_BATCH}"
        )));
    }
    let mut seen = BTreeSet::new();
    for name in names {
        if !seen.insert(name) {
            return Err(bad(format!("{field} names {} twice", shown(name))));
        }
    }
    Ok(())
}

pub fn puts(v: Vec<pb::RecordPut>) -> Result<Vec<RecordPut>> {
    let puts = v
        .into_iter()
        .enumerate()
        .map(|(i, p)| {
            Ok(RecordPut {
                record: record(&format!("puts[{i}].record"), p.record)?,
                expected_version: version(
                    &format!("puts[{i}].expected_version"),
                    p.expected_version,
                )?,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    batch("puts", puts.iter().map(|p| p.record.name.as_str()))?;
    Ok(puts)
}

pub fn refs(v: Vec<pb::RecordRef>) -> Result<Vec<RecordRef>> {
    let refs = v
        .into_iter()
        .enumerate()
        .map(|(i, r)| {
            record_name(&format!("records[{i}].name"), &r.name)?;
            Ok(RecordRef {
                expected_version: read_version(
                    &format!("records[{i}].expected_version"),
                    r.expected_version,
                )?,
                name: r.name,
            })
        })
        .collect::<Result<Vec<_>>>()?;
    batch("records", refs.iter().map(|r| r.name.as_str()))?;
    Ok(refs)
}

pub fn bounds(b: Option<pb::RecordBounds>) -> Result<RecordBounds> {
    let b = b.unwrap_or_default();
    Ok(RecordBounds {
        max_snapshots: fits("bounds.max_snapshots", b.max_snapshots)?,
        max_templates: fits("bounds.max_templates", b.max_templates)?,
        max_layer_bytes: fits("bounds.max_layer_bytes", b.max_layer_bytes)?,
    })
}

pub fn digests(field: &str, v: &[String]) -> Result<()> {
    if v.len() > MAX_NOTES {
        return Err(bad(format!(
            "{field} has {} entries; the limit is {MAX_NOTES}",
            v.len()
        )));
    }
    for (i, d) in v.iter().enumerate() {
        digest(&format!("{field}[{i}]"), d)?;
    }
    Ok(())
}

/// A JSON object of a build's request.
pub fn request_json(v: &str) -> Result<()> {
    json_object("request_json", v, MAX_REQUEST_JSON)
}

/// A JSON object of a build's steps.
pub fn plan_json(v: &str) -> Result<()> {
    json_object("plan_json", v, MAX_PLAN_JSON)
}

pub fn upload_hashes(v: &[String]) -> Result<()> {
    if v.len() > MAX_UPLOAD_HASHES {
        return Err(bad(format!(
            "upload_hashes has {} entries; the limit is {MAX_UPLOAD_HASHES}",
            v.len()
        )));
    }
    for (i, h) in v.iter().enumerate() {
        files_hash(&format!("upload_hashes[{i}]"), h)?;
    }
    Ok(())
}

/// READY or ERROR, with a bounded reason.
pub fn finish(status: i32, message: &str, step: &str) -> Result<BuildStatus> {
    let s = match pb::BuildStatus::try_from(status) {
        Ok(pb::BuildStatus::Ready) => BuildStatus::Ready,
        Ok(pb::BuildStatus::Error) => BuildStatus::Error,
        _ => {
            return Err(bad(format!(
                "status {status} is not READY or ERROR (a build is claimed with ClaimBuild)"
            )))
        }
    };
    bounded("reason_message", message, MAX_REASON)?;
    printable("reason_step", step, MAX_STEP)?;
    Ok(s)
}

pub fn log_lines(v: Vec<pb::LogLine>) -> Result<Vec<LogLine>> {
    if v.len() > MAX_LINES {
        return Err(bad(format!(
            "lines has {} entries; the limit is {MAX_LINES}",
            v.len()
        )));
    }
    v.into_iter()
        .enumerate()
        .map(|(i, l)| {
            if !LEVELS.contains(&l.level.as_str()) {
                return Err(bad(format!(
                    "lines[{i}].level {} is not debug, info, warn or error",
                    shown(&l.level)
                )));
            }
            bounded(&format!("lines[{i}].message"), &l.message, MAX_LINE)?;
            if l.at_ms < 0 {
                return Err(bad(format!("lines[{i}].at_ms {} is not a time", l.at_ms)));
            }
            Ok(LogLine {
                seq: 0,
                at_ms: l.at_ms,
                level: l.level,
                message: l.message,
            })
        })
        .collect()
}

/// An append's batch number: from 1.
pub fn batch_number(v: u64) -> Result<u64> {
    if v == 0 {
        return Err(bad(
            "batch is 0; an owner numbers its appends to a build from 1".into(),
        ));
    }
    fits("batch", v)
}

pub fn log_bounds(b: Option<pb::LogBounds>) -> Result<LogBounds> {
    let b = b.unwrap_or_default();
    printable("bounds.build_bound_name", &b.build_bound_name, MAX_LABEL)?;
    printable("bounds.team_bound_name", &b.team_bound_name, MAX_LABEL)?;
    Ok(LogBounds {
        max_build_bytes: fits("bounds.max_build_bytes", b.max_build_bytes)?,
        max_team_bytes: fits("bounds.max_team_bytes", b.max_team_bytes)?,
        build_bound_name: b.build_bound_name,
        team_bound_name: b.team_bound_name,
    })
}

/// A size that fits the store.
pub fn size(field: &str, v: u64) -> Result<u64> {
    fits(field, v)
}

// ---- page tokens: opaque to clients, `<kind>.<fields>` inside ----

pub fn record_token(t: &str, order: RecordOrder) -> Result<Option<RecordCursor>> {
    if t.is_empty() {
        return Ok(None);
    }
    let foreign = || bad("page_token is not one this scheduler issued for this order".into());
    let cursor = match order {
        RecordOrder::ByName => RecordCursor {
            name: t.strip_prefix("r1.").ok_or_else(foreign)?.to_string(),
            created_at_ms: 0,
        },
        RecordOrder::CreatedDesc => {
            let (ms, name) = t
                .strip_prefix("r2.")
                .and_then(|r| r.split_once('.'))
                .ok_or_else(foreign)?;
            RecordCursor {
                name: name.to_string(),
                created_at_ms: ms.parse().map_err(|_| foreign())?,
            }
        }
    };
    record_name("page_token", &cursor.name).map_err(|_| foreign())?;
    Ok(Some(cursor))
}

pub fn make_record_token(c: &RecordCursor, order: RecordOrder) -> String {
    match order {
        RecordOrder::ByName => format!("r1.{}", c.name),
        RecordOrder::CreatedDesc => format!("r2.{}.{}", c.created_at_ms, c.name),
    }
}

pub fn record_order(v: i32) -> Result<RecordOrder> {
    match pb::RecordOrder::try_from(v) {
        Ok(pb::RecordOrder::Unspecified) => Ok(RecordOrder::ByName),
        Ok(pb::RecordOrder::CreatedDesc) => Ok(RecordOrder::CreatedDesc),
        Err(_) => Err(bad(format!("order {v} is not a record order"))),
    }
}

pub fn build_token(t: &str) -> Result<Option<(i64, String)>> {
    if t.is_empty() {
        return Ok(None);
    }
    let foreign = || bad("page_token is not one this scheduler issued".into());
    let (ms, id) = t
        .strip_prefix("b1.")
        .and_then(|r| r.split_once('.'))
        .ok_or_else(foreign)?;
    build_id("page_token", id).map_err(|_| foreign())?;
    Ok(Some((ms.parse().map_err(|_| foreign())?, id.to_string())))
}

pub fn make_build_token(c: &(i64, String)) -> String {
    format!("b1.{}.{}", c.0, c.1)
}

pub fn blob_token(t: &str) -> Result<String> {
    if t.is_empty() {
        return Ok(String::new());
    }
    let d = t
        .strip_prefix("u1.")
        .ok_or_else(|| bad("page_token is not one this scheduler issued".into()))?;
    digest("page_token", d)?;
    Ok(d.to_string())
}

pub fn make_blob_token(digest: &str) -> String {
    format!("u1.{digest}")
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;

    #[test]
    fn names_and_digests() {
        for ok in ["base", "code-interpreter-v1", "snap-0a", "paused-abc"] {
            assert!(record_name("n", ok).is_ok(), "{ok}");
        }
        for no in ["", "Base", "-x", "../x", "a/b", &"x".repeat(65)] {
            assert!(record_name("n", no).is_err(), "{no}");
        }
        let d = format!("sha256-{}", "a".repeat(64));
        assert!(digest("d", &d).is_ok());
        for no in [
            "",
            "sha256-",
            &format!("sha256-{}", "A".repeat(64)),
            &"a".repeat(64),
        ] {
            assert!(digest("d", no).is_err(), "{no}");
        }
        assert!(build_id("b", "0f8fad5b-d9cb-469f-a165-70867728950e").is_ok());
        assert!(build_id("b", "0F8F").is_err());
    }

    #[test]
    fn tokens_round_trip_and_refuse_others() {
        let c = RecordCursor {
            name: "snap-a".into(),
            created_at_ms: 17,
        };
        for order in [RecordOrder::ByName, RecordOrder::CreatedDesc] {
            let t = make_record_token(&c, order);
            assert_eq!(record_token(&t, order).unwrap().unwrap().name, "snap-a");
        }
        let t = make_record_token(&c, RecordOrder::CreatedDesc);
        assert!(record_token(&t, RecordOrder::ByName).is_err());
        let b = (5, "abc-1".to_string());
        assert_eq!(build_token(&make_build_token(&b)).unwrap(), Some(b));
        assert!(build_token("b1.x.abc").is_err());
        let d = format!("sha256-{}", "0".repeat(64));
        assert_eq!(blob_token(&make_blob_token(&d)).unwrap(), d);
        assert!(blob_token("u1.../x").is_err());
    }
}
