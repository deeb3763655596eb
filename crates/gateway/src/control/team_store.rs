//! A team's records in the template store every team shares: counted
//! against the team's bounds (`--snapshot-team-count`,
//! `--snapshot-team-bytes`, `--template-team-count`; 429 naming the flag),
//! and replaced or removed with the layers they named noted, so that a
//! layer no record names is removed once nothing stacks it (`layers`).

use crate::error::ApiError;
use crate::limits::StoreLimits;
use std::collections::HashSet;
use warren_template::{Store, Template};

fn over(code: &'static str, m: String) -> ApiError {
    ApiError::over_limit(code, m)
}

/// Every record of `team`'s: its snapshots and its built templates (the
/// paused records of its sandboxes belong to no team).
pub(super) fn records(store: &Store, team: &str) -> Result<Vec<Template>, ApiError> {
    Ok(store
        .list()
        .map_err(super::snapshots::internal)?
        .into_iter()
        .filter(|t| t.snapshot.as_ref().is_some_and(|s| s.team == team))
        .collect())
}

/// The bytes of the layers `team`'s records name, each counted once
/// however many records name it (only a team's records have layers: the
/// operator's templates are roots).
fn layer_bytes(store: &Store, mine: &[Template]) -> u64 {
    let own: HashSet<&String> = mine.iter().flat_map(|t| t.layers.iter()).collect();
    own.into_iter().filter_map(|l| store.blob_size(l)).sum()
}

/// Whether `team` may take one more snapshot (`replacing`: the record a
/// named snapshot would replace, which does not count).
pub(super) fn room_for_snapshot(
    store: &Store,
    limits: StoreLimits,
    team: &str,
    replacing: &str,
) -> Result<(), ApiError> {
    let mine = records(store, team)?;
    let snapshots = mine
        .iter()
        .filter(|t| !super::builds::is_built(t) && t.name != replacing)
        .count();
    if snapshots >= limits.snapshot_count {
        return Err(over(
            "too_many_snapshots",
            format!(
                "team {team} keeps {snapshots} snapshots, its limit (--snapshot-team-count) is \
                 {}; delete one first",
                limits.snapshot_count
            ),
        ));
    }
    let bytes = layer_bytes(store, &mine);
    if bytes >= limits.snapshot_bytes {
        return Err(over(
            "snapshot_bytes_exceeded",
            format!(
                "team {team}'s snapshots and templates take {bytes} bytes of the template store, \
                 its limit (--snapshot-team-bytes) is {}; delete some first",
                limits.snapshot_bytes
            ),
        ));
    }
    Ok(())
}

/// Whether `team`'s layers are still within `--snapshot-team-bytes` now
/// that it has a new one; the 429 when not.
pub(super) fn within_bytes(store: &Store, limits: StoreLimits, team: &str) -> Result<(), ApiError> {
    let bytes = layer_bytes(store, &records(store, team)?);
    if bytes > limits.snapshot_bytes {
        return Err(over(
            "snapshot_bytes_exceeded",
            format!(
                "the snapshot would take team {team}'s snapshots and templates to {bytes} bytes \
                 of the template store, past its limit (--snapshot-team-bytes) of {}; it was not \
                 kept",
                limits.snapshot_bytes
            ),
        ));
    }
    Ok(())
}

/// Whether `team` may record built templates under `names` (record names
/// it has already are replaced, and do not count).
pub(super) fn room_for_templates(
    store: &Store,
    limits: StoreLimits,
    team: &str,
    names: &[String],
) -> Result<(), ApiError> {
    let built: Vec<Template> = records(store, team)?
        .into_iter()
        .filter(super::builds::is_built)
        .collect();
    let have: HashSet<&str> = built.iter().map(|t| t.name.as_str()).collect();
    let new = names
        .iter()
        .filter(|n| !have.contains(warren_template::named_snapshot_key(team, n).as_str()))
        .count();
    if new > 0 && built.len() + new > limits.template_count {
        return Err(over(
            "too_many_templates",
            format!(
                "team {team} keeps {} templates (each tag counts), its limit \
                 (--template-team-count) is {}; delete some first",
                built.len(),
                limits.template_count
            ),
        ));
    }
    Ok(())
}

/// Records `t`, replacing any record of its name; the layers only the old
/// one named are noted.
pub(super) fn put(store: &Store, t: &Template) -> Result<(), ApiError> {
    let old = store.get(&t.name).ok();
    store.put(t).map_err(super::snapshots::internal)?;
    if let Some(old) = old {
        let gone: Vec<String> = old
            .layers
            .into_iter()
            .filter(|l| !t.layers.contains(l))
            .collect();
        note(store, &gone);
    }
    Ok(())
}

/// Removes the record `t` (as read); its layers are noted. False when it
/// was gone already.
pub(super) fn remove(store: &Store, t: &Template) -> Result<bool, ApiError> {
    let removed = store.remove(&t.name).map_err(super::snapshots::internal)?;
    note(store, &t.layers);
    Ok(removed)
}

/// Notes `layers` for removal; a failure is logged (the layer then stays,
/// taking room, until a later note).
pub(super) fn note(store: &Store, layers: &[String]) {
    if layers.is_empty() {
        return;
    }
    if let Err(e) = store.note_unused(layers) {
        tracing::warn!(error = %e, "cannot note layers for removal");
    }
}
