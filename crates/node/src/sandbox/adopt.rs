//! The registry at the node's start and end: adopting or cleaning up what a
//! previous node process left behind, and killing everything at shutdown
//! (a sandbox never outlives its node; see the crate doc).

use super::state::Record;
use super::{Registry, Sandbox};
use crate::envd;
use crate::runtime::Paths;
use std::sync::Arc;

impl Registry {
    /// At start: adopts sandboxes a previous node process left running (their
    /// envd still answers) and cleans up the rest.
    pub async fn restore(self: &Arc<Self>) {
        let Ok(dir) = std::fs::read_dir(&self.sandboxes_dir) else {
            return;
        };
        let ids: Vec<String> = dir
            .filter_map(|e| e.ok()?.file_name().into_string().ok())
            .collect();
        for id in ids {
            if warren_core::id::validate_sandbox_id(&id).is_err() {
                tracing::warn!(entry = %id, dir = %self.sandboxes_dir.display(), "ignoring a stray entry");
                continue;
            }
            let paths = Paths::new(&self.sandboxes_dir, &id);
            let record = Record::load(&paths.state);
            let adopted = match &record {
                Ok(rec)
                    if rec.info.sandbox_id == id
                        && rec.handle.runtime == self.runtime.kind()
                        // An isolated sandbox's disk was mounted in the old node
                        // process's mount namespace, gone with it.
                        && rec.handle.runtime == crate::runtime::RuntimeKind::Process
                        && envd::health(&paths.envd_sock).await.is_ok() =>
                {
                    let mut info = rec.info.clone();
                    info.node_id = self.cfg.node_id.clone();
                    self.insert(Arc::new(Sandbox {
                        info,
                        paths: paths.clone(),
                        handle: rec.handle.clone(),
                        metadata: rec.metadata.clone(),
                        timeout_secs: rec.timeout_secs,
                        ids: None,
                        network: std::sync::Mutex::new(
                            rec.network
                                .clone()
                                .unwrap_or_else(crate::runtime::egress::NetworkPolicy::open),
                        ),
                        access: rec.access.clone(),
                        // A process sandbox has no egress proxy.
                        rules: std::sync::Mutex::new(Default::default()),
                        egress: std::sync::Mutex::new(None),
                        // Only `process` sandboxes are adopted, and they cannot pause.
                        paused: std::sync::atomic::AtomicBool::new(false),
                        frozen: tokio::sync::Notify::new(),
                        halted: false,
                        boot: None,
                        own_layers: Vec::new(),
                    }));
                    tracing::info!(sandbox_id = %id, generation = rec.info.generation, "adopted a running sandbox");
                    true
                }
                _ => false,
            };
            if !adopted {
                let handle = record.as_ref().ok().map(|r| r.handle.clone());
                tracing::info!(sandbox_id = %id, "cleaning up a sandbox that is no longer running");
                self.cleanup(&paths, handle.as_ref(), &id).await;
                // Paused filesystem-only here, and not moved since (its
                // record is still this node's at that generation): the
                // scheduler forgets it, so what its pause packed goes too.
                if let Ok(rec) = &record {
                    let ours = self.paused_record(&id).is_some_and(|(t, _)| {
                        t.snapshot.is_some_and(|s| s.node_id == self.cfg.node_id)
                    });
                    if ours {
                        self.forget_paused(&id, Some(rec.info.generation), true);
                    }
                }
            }
        }
    }

    /// Kills every hosted sandbox and removes its files (node shutdown:
    /// sandboxes never outlive the node; see the crate doc). No events are
    /// reported: the next registration's roster tells the scheduler.
    pub async fn shutdown_all(self: &Arc<Self>) {
        let ids: Vec<String> = self.list().into_iter().map(|i| i.sandbox_id).collect();
        let tasks = ids.into_iter().map(|id| {
            let me = self.clone();
            tokio::spawn(async move {
                let lock = me.lock_for(&id);
                let _held = lock.lock().await;
                let Some(sandbox) = me.hosted.write().ok().and_then(|mut h| h.remove(&id)) else {
                    return;
                };
                let egress = sandbox.egress.lock().ok().and_then(|mut e| e.take());
                if let Some(e) = egress {
                    e.detach().await;
                }
                me.cleanup(&sandbox.paths, Some(&sandbox.handle), &id).await;
            })
        });
        for t in tasks.collect::<Vec<_>>() {
            let _ = t.await;
        }
        self.metrics.sandboxes.set(0);
    }
}
