//! Removing layers nothing uses any more (ARCHITECTURE.md, "Layers of
//! deleted snapshots").
//!
//! A deleted or replaced snapshot (or built template) leaves its layers in
//! the shared template store, noted (`warren_template::unused`): a
//! sandbox on any node sharing the store may still stack them (made from
//! the snapshot, a fork of one, a filesystem-paused one that moved), and
//! only the nodes know which. Every `--layer-gc-interval` this gateway
//! takes the layers noted at least `--layer-gc-grace` ago (room for a
//! create that read the record just before it went), asks every node the
//! scheduler knows which layers its sandboxes stack (the control API's
//! sandbox list), and removes each noted layer that none stacks and no
//! record names. A node that does not answer may hold sandboxes that stack
//! any of them, so then nothing is removed this round. Several gateways
//! sweeping the same store is harmless: a removal that finds nothing to
//! remove is no error.
//!
//! Blobs ([`sweep_blobs`]): the scheduler's store notes each blob a write
//! left unnamed (a deleted or replaced record's layers, a replaced or
//! expired upload's archive, an archive whose record was refused). Every
//! round this gateway takes the notes older than `--layer-gc-grace` and
//! asks the store to remove each (`RemoveUnusedBlob`): only a note that
//! nothing names (no record, upload or running build) and that was not
//! noted again is removed, by exactly one gateway, which then deletes the
//! blob from the blob store (`--blob-store`, or the local upload store).
//! With `--blob-store`, a layer that a sandbox on any node stacks is kept
//! (as in the shared store's sweep: its snapshot or pause names it again,
//! and another node must then fetch it); a node that does not answer
//! keeps every note for the next round.

use crate::state::App;
use std::collections::HashSet;
use std::sync::Arc;
use warren_proto::scheduler::v1::{self as pb, ListNodesRequest};
use warren_template::Removal;

/// Sweeps until the gateway stops.
pub(crate) async fn sweep_forever(app: Arc<App>) {
    let every = app.settings.limits.layer_gc.interval;
    loop {
        tokio::time::sleep(every).await;
        match sweep(&app).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(layers = n, "removed layers nothing uses any more"),
            Err(why) => tracing::debug!(%why, "unused layers kept this round"),
        }
        match sweep_blobs(&app).await {
            Ok(0) => {}
            Ok(n) => tracing::info!(blobs = n, "removed blobs nothing names any more"),
            Err(why) => tracing::debug!(%why, "unused blobs kept this round"),
        }
    }
}

/// One round of the blob sweep (see the module doc): the number of blobs
/// removed, or why none could be.
pub(crate) async fn sweep_blobs(app: &App) -> Result<usize, String> {
    let Some(blobs) = app.uploads.existing() else {
        return Ok(0);
    };
    let grace = app.settings.limits.layer_gc.grace.as_millis() as u64;
    let mut due = Vec::new();
    let mut token = String::new();
    loop {
        let req = pb::ListUnusedBlobsRequest {
            grace_ms: grace,
            page_size: 1000,
            page_token: token.clone(),
        };
        let page = app
            .scheduler
            .call("ListUnusedBlobs", |mut c| {
                let req = req.clone();
                async move { c.list_unused_blobs(req).await }
            })
            .await
            .map_err(|s| format!("cannot list unused blobs: {}", s.message()))?;
        due.extend(page.blobs);
        if page.next_page_token.is_empty() || due.len() >= 10_000 {
            break;
        }
        token = page.next_page_token;
    }
    if due.is_empty() {
        return Ok(0);
    }
    // A layer a sandbox stacks stays: a snapshot or pause of that sandbox
    // names it again, and another node must then fetch it. (Archives are
    // never stacked.)
    let in_use = match &app.records {
        crate::records::Records::Scheduler(_) => stacked(app).await?,
        crate::records::Records::Local(_) => HashSet::new(),
    };
    let mut removed = 0;
    for b in due.into_iter().filter(|b| !in_use.contains(&b.digest)) {
        let req = pb::RemoveUnusedBlobRequest {
            digest: b.digest.clone(),
            noted_at_ms: b.noted_at_ms,
        };
        let outcome = app
            .scheduler
            .call("RemoveUnusedBlob", |mut c| {
                let req = req.clone();
                async move { c.remove_unused_blob(req).await }
            })
            .await
            .map_err(|s| format!("cannot remove the note of {}: {}", b.digest, s.message()))?;
        if outcome.outcome != pb::BlobRemoval::Removed as i32 {
            continue;
        }
        let Ok(digest) = b.digest.parse::<warren_blob::Digest>() else {
            tracing::warn!(digest = %b.digest, "an unused-blob note names no digest");
            continue;
        };
        match blobs.delete(&digest).await {
            Ok(()) => {
                tracing::info!(blob = %b.digest, store = %blobs, "unused blob removed");
                app.metrics.blobs_removed.inc();
                removed += 1;
            }
            // Its note is gone: a leak, never a loss.
            Err(e) => tracing::warn!(blob = %b.digest, error = %e, "cannot remove an unused blob"),
        }
    }
    Ok(removed)
}

/// One round: the number of layers removed, or why none could be.
pub(crate) async fn sweep(app: &App) -> Result<usize, String> {
    let Ok(store) = super::snapshots::store(app) else {
        return Ok(0);
    };
    let grace = app.settings.limits.layer_gc.grace;
    let s = store.clone();
    let due: Vec<String> = tokio::task::spawn_blocking(move || s.noted_unused())
        .await
        .map_err(|e| e.to_string())?
        .map_err(|e| e.to_string())?
        .into_iter()
        .filter(|(_, age)| *age >= grace)
        .map(|(d, _)| d)
        .collect();
    if due.is_empty() {
        return Ok(0);
    }
    let in_use = stacked(app).await?;
    let s = store.clone();
    tokio::task::spawn_blocking(move || {
        let mut removed = 0;
        for layer in due.iter().filter(|l| !in_use.contains(*l)) {
            match s.remove_unused(layer) {
                Ok(Removal::Removed) => {
                    tracing::info!(%layer, "unused layer removed from the template store");
                    removed += 1;
                }
                Ok(Removal::Named | Removal::Gone | Removal::InUse) => {}
                Err(e) => tracing::warn!(%layer, error = %e, "cannot remove an unused layer"),
            }
        }
        removed
    })
    .await
    .map_err(|e| e.to_string())
}

/// Every layer a sandbox on any node stacks; an error when a node the
/// scheduler knows cannot say.
async fn stacked(app: &App) -> Result<HashSet<String>, String> {
    let nodes = app
        .scheduler
        .call("ListNodes", |mut c| async move {
            c.list_nodes(ListNodesRequest {}).await
        })
        .await
        .map_err(|s| format!("cannot list the nodes: {}", s.message()))?
        .nodes;
    let mut in_use = HashSet::new();
    for n in nodes {
        let sandboxes = app
            .nodes
            .list(&n.endpoint)
            .await
            .map_err(|e| format!("node {} cannot say what it stacks: {e}", n.node_id))?;
        in_use.extend(sandboxes.into_iter().flat_map(|s| s.layers));
    }
    Ok(in_use)
}
