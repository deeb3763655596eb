//! The end of a run: every sandbox it created is accounted for.
//!
//! Sandboxes carry `chaos_run` and `chaos_key` metadata. Listing them at the
//! end finds duplicates (two sandboxes for one idempotency key — must never
//! happen), settles workflows whose create or delete answer was lost (the
//! sandbox exists → it is deleted now; it does not → it was never made),
//! and removes whatever is left.

use crate::probes::Pending;
use crate::record::Recorder;
use serde::{Deserialize, Serialize};
use std::collections::BTreeMap;
use warren_client::Client;

/// What reconciliation found.
#[derive(Debug, Clone, Default, Serialize, Deserialize)]
pub struct Reconciled {
    /// Sandboxes of this run still listed at the end (before cleanup).
    pub listed: usize,
    /// Distinct idempotency keys among them.
    pub keys: usize,
    /// Keys with more than one sandbox.
    pub duplicate_keys: Vec<String>,
    /// Workflows whose outcome was settled here.
    pub settled: usize,
    /// Workflows whose outcome could still not be told (listing failed).
    pub unknown: usize,
    /// Sandboxes deleted here.
    pub cleaned: usize,
}

/// Lists this run's sandboxes, settles `pending`, deletes leftovers except `keep`.
pub async fn reconcile(
    client: &Client,
    rec: &Recorder,
    run: &str,
    pending: &[Pending],
    keep: &[String],
) -> Reconciled {
    let mut out = Reconciled::default();
    let list = {
        let mut last = None;
        let mut got = None;
        for _ in 0..5 {
            match client.list().await {
                Ok(l) => {
                    got = Some(l);
                    break;
                }
                Err(e) => last = Some(e),
            }
            tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        }
        match got {
            Some(l) => l,
            None => {
                tracing::warn!(error = ?last, "cannot list sandboxes to reconcile");
                out.unknown = pending.len();
                for p in pending {
                    rec.update(p.index, |r| {
                        r.detail
                            .push_str("; outcome unknown: the final listing failed")
                    });
                }
                return out;
            }
        }
    };
    let mine: Vec<_> = list
        .into_iter()
        .filter(|s| s.metadata.get("chaos_run").map(String::as_str) == Some(run))
        .collect();
    out.listed = mine.len();
    let mut by_key: BTreeMap<String, Vec<String>> = BTreeMap::new();
    for s in &mine {
        let key = s.metadata.get("chaos_key").cloned().unwrap_or_default();
        by_key.entry(key).or_default().push(s.sandbox_id.clone());
    }
    out.keys = by_key.len();
    out.duplicate_keys = by_key
        .iter()
        .filter(|(_, ids)| ids.len() > 1)
        .map(|(k, _)| k.clone())
        .collect();
    for p in pending {
        let found = by_key.get(&p.key).cloned().unwrap_or_default();
        let note = if found.is_empty() {
            "; reconciled: no sandbox exists for this key".to_string()
        } else {
            format!(
                "; reconciled: {} existed, deleted at the end",
                found.join(",")
            )
        };
        rec.update(p.index, |r| r.detail.push_str(&note));
        out.settled += 1;
    }
    for s in mine {
        if keep.contains(&s.sandbox_id) {
            continue;
        }
        if client.kill(&s.sandbox_id).await.is_ok() {
            out.cleaned += 1;
        }
    }
    out
}
