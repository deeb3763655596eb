//! Pausing, halting and snapshots of hosted sandboxes: freezing and
//! thawing in place, stopping one to its filesystem and booting it again,
//! and packing a paused sandbox's writable layer into the template store.

use super::*;

impl Registry {
    /// Freezes (`pause: true`) or thaws the sandbox hosted at `generation`
    /// in place; doing what is already done is a success. Resuming a
    /// sandbox paused filesystem-only boots it again, unless `cold_boot`
    /// is false: then it stays paused and the answer is
    /// [`NodeError::NotResumable`].
    pub async fn set_paused(
        self: &Arc<Self>,
        id: &str,
        generation: u64,
        pause: bool,
        cold_boot: bool,
    ) -> Result<SandboxInfo, NodeError> {
        let lock = self.lock_for(id);
        let result = {
            let _held = lock.lock().await;
            match self.get(id, generation) {
                None => Err(self.not_hosted(id, Some(generation))),
                Some(sb) if sb.is_paused() == pause => Ok(sb.info.clone()),
                Some(sb) if sb.halted && !cold_boot => Err(NodeError::NotResumable(id.into())),
                Some(sb) if sb.halted => {
                    let booted = self.reboot_locked(&sb).await;
                    if booted.is_ok() {
                        self.log_lifecycle(id, "Sandbox resumed (booted again from its files)", []);
                    }
                    booted
                }
                Some(sb) => {
                    if pause {
                        // What envd wrote before it is frozen, readable
                        // while it is.
                        self.read_envd_log(&sb, Duration::from_secs(1)).await;
                    }
                    let rt = self.runtime.clone();
                    let handle = sb.handle.clone();
                    let done =
                        warren_core::blocking::run(move || rt.set_frozen(&handle, pause)).await;
                    match done {
                        Ok(Ok(())) => {
                            sb.paused.store(pause, std::sync::atomic::Ordering::SeqCst);
                            if pause {
                                sb.frozen.notify_waiters();
                            }
                            tracing::info!(sandbox_id = %id, generation, paused = pause, "sandbox frozen state changed");
                            self.log_lifecycle(
                                id,
                                if pause {
                                    "Sandbox paused"
                                } else {
                                    "Sandbox resumed"
                                },
                                [],
                            );
                            Ok(sb.info.clone())
                        }
                        Ok(Err(runtime::RuntimeError::Unsupported(m))) => {
                            Err(NodeError::Unsupported(m))
                        }
                        Ok(Err(e)) => Err(NodeError::Internal(e.to_string())),
                        Err(e) => Err(NodeError::Internal(format!("the freeze task failed: {e}"))),
                    }
                }
            }
        };
        self.release_lock(id, lock);
        result
    }

    /// Pauses the sandbox hosted at `generation` filesystem-only (E2B's
    /// `keep_memory=False`): every process is killed and its cgroups, id
    /// range and egress released; its files stay, and a resume
    /// ([`Registry::set_paused`] with `false`) boots it again from them —
    /// same id, generation, access token and environment, a fresh boot.
    /// Doing what is already done is a success; a sandbox paused with its
    /// memory kept is a conflict. A runtime that cannot: 501, unchanged.
    pub async fn halt(
        self: &Arc<Self>,
        id: &str,
        generation: u64,
    ) -> Result<SandboxInfo, NodeError> {
        let lock = self.lock_for(id);
        let result = {
            let _held = lock.lock().await;
            self.halt_locked(id, generation).await
        };
        self.release_lock(id, lock);
        result
    }

    async fn halt_locked(&self, id: &str, generation: u64) -> Result<SandboxInfo, NodeError> {
        let sb = self
            .get(id, generation)
            .ok_or_else(|| self.not_hosted(id, Some(generation)))?;
        if sb.halted {
            return Ok(sb.info.clone());
        }
        if sb.is_paused() {
            return Err(NodeError::Paused(id.to_string()));
        }
        // Unchanged when the runtime cannot (nothing is killed then).
        if self.runtime.kind() != runtime::RuntimeKind::Isolated {
            return Err(NodeError::Unsupported(format!(
                "the {} runtime cannot pause a sandbox filesystem-only (it keeps no disk \
                 to boot it again from); use the isolated runtime",
                self.runtime.kind().as_str()
            )));
        }
        let rt = self.runtime.clone();
        let (paths, handle) = (sb.paths.clone(), sb.handle.clone());
        let Some(boot) = sb.boot.clone() else {
            return Err(NodeError::Unsupported(format!(
                "sandbox {id} was adopted after a node restart and cannot be booted \
                 again; pause it with its memory kept"
            )));
        };
        self.read_envd_log(&sb, Duration::from_secs(1)).await;
        self.log_lifecycle(id, "Sandbox paused (filesystem only)", []);
        sb.paused.store(true, std::sync::atomic::Ordering::SeqCst);
        sb.frozen.notify_waiters();
        let egress = sb.egress.lock().ok().and_then(|mut e| e.take());
        if let Some(e) = egress {
            e.detach().await;
        }
        // Its writable layer into the store, for a boot on another node
        // (its own node keeps booting from its disk). Without it the pause
        // still happens: the sandbox can then only resume here.
        let (own_layers, record) = match self.pack_paused(&sb, &boot).await {
            Ok(packed) => packed,
            Err(why) => {
                tracing::warn!(sandbox_id = %id, generation, error = %why,
                    "cannot pack the paused sandbox's layer; it can resume on this node only");
                self.forget_paused(id, None, false);
                (sb.own_layers.clone(), None)
            }
        };
        // Kept in the halted sandbox's info, so a repeated pause (a lost
        // auto-pause report answered again) answers the same record.
        let paused_record = record.and_then(|t| match serde_json::to_value(&t) {
            Ok(v) => Some(v),
            Err(e) => {
                tracing::warn!(sandbox_id = %id, error = %e,
                    "cannot encode the paused record; it can resume on this node only");
                None
            }
        });
        let done = warren_core::blocking::run(move || rt.halt(&paths, &handle)).await;
        let failed = match done {
            Ok(Ok(())) => None,
            Ok(Err(e)) => Some(e.to_string()),
            Err(e) => Some(format!("the stop task failed: {e}")),
        };
        if let Some(why) = failed {
            // Half-stopped is no state to keep: it is deleted (and the
            // scheduler told), and the answer says so.
            let _ = self
                .delete_locked(id, Some(generation), "filesystem-only pause failed")
                .await;
            return Err(NodeError::Internal(format!(
                "cannot pause sandbox {id} filesystem-only: {why} (the sandbox was deleted)"
            )));
        }
        let info = SandboxInfo {
            paused_record,
            ..sb.info.clone()
        };
        let halted = Arc::new(Sandbox {
            info: info.clone(),
            paths: sb.paths.clone(),
            handle: sb.handle.clone(),
            metadata: sb.metadata.clone(),
            timeout_secs: sb.timeout_secs,
            network: Mutex::new(sb.policy()),
            access: sb.access.clone(),
            rules: Mutex::new(sb.rules()),
            egress: Mutex::new(None),
            // The old boot's range is released with it: a new boot takes
            // one again (this one when still free).
            ids: None,
            paused: std::sync::atomic::AtomicBool::new(true),
            frozen: tokio::sync::Notify::new(),
            halted: true,
            boot: Some(boot),
            own_layers,
        });
        self.insert(halted);
        tracing::info!(sandbox_id = %id, generation, "sandbox paused filesystem-only");
        Ok(info)
    }

    /// Boots a filesystem-paused sandbox again from its kept files, with
    /// its create's access token, environment and lifecycle and its
    /// egress policy now. On failure it stays paused.
    async fn reboot_locked(self: &Arc<Self>, sb: &Arc<Sandbox>) -> Result<SandboxInfo, NodeError> {
        let Some(Boot(mut req)) = sb.boot.clone() else {
            return Err(NodeError::Internal(format!(
                "sandbox {} has nothing to boot from",
                sb.info.sandbox_id
            )));
        };
        req.network = Some(sb.policy());
        req.egress_rules = sb.rules();
        req.timeout_secs = sb.timeout_secs;
        let info = self.start(&req, None, Some(sb)).await?;
        // Running here again: the layer its pause packed is stale.
        self.forget_paused(&info.sandbox_id, Some(info.generation), true);
        tracing::info!(sandbox_id = %info.sandbox_id, generation = info.generation, "sandbox booted again after a filesystem-only pause");
        Ok(info)
    }

    /// Pauses a sandbox at its end (auto-pause): filesystem-only when it
    /// was created so (`autoPauseMemory: false`), else frozen in place.
    pub async fn pause_at_end(
        self: &Arc<Self>,
        id: &str,
        generation: u64,
    ) -> Result<SandboxInfo, NodeError> {
        match self.get(id, generation) {
            Some(sb) if sb.pauses_filesystem_only() => self.halt(id, generation).await,
            _ => self.set_paused(id, generation, true, true).await,
        }
    }

    /// Makes a snapshot of the sandbox hosted at `generation` (see
    /// [`Runtime::snapshot`]), under its lock: no delete, pause or fork
    /// runs while its disk is copied.
    pub async fn snapshot(
        self: &Arc<Self>,
        id: &str,
        req: warren_core::node_api::CreateSnapshot,
    ) -> Result<warren_core::node_api::SnapshotMade, NodeError> {
        warren_template::validate_name(&req.snapshot_id)
            .map_err(|e| NodeError::BadRequest(format!("snapshot_id: {e}")))?;
        let lock = self.lock_for(id);
        let result = {
            let _held = lock.lock().await;
            match self.get(id, req.generation) {
                None => Err(self.not_hosted(id, Some(req.generation))),
                Some(sb) => {
                    let rt = self.runtime.clone();
                    let spec = runtime::SnapshotSpec {
                        key: req.snapshot_id.clone(),
                        meta: warren_template::Snapshot {
                            team: req.team_id.clone(),
                            name: req.name.clone(),
                            source_sandbox: id.to_string(),
                            node_id: self.cfg.node_id.clone(),
                            paused: None,
                            public: false,
                        },
                        template_id: sb.info.template_id.clone(),
                    };
                    let frozen = sb.is_paused();
                    let s2 = sb.clone();
                    let done = warren_core::blocking::run(move || {
                        rt.snapshot(&s2.paths, &s2.handle, frozen, &spec)
                    })
                    .await;
                    match done {
                        Ok(Ok(t)) => {
                            tracing::info!(sandbox_id = %id, snapshot = %t.name, layers = t.layers.len(), "snapshot made");
                            // No shared store took the record: the gateway keeps it.
                            let record = match self.runtime.store() {
                                Some(_) => Ok(None),
                                None => serde_json::to_value(&t).map(Some).map_err(|e| {
                                    NodeError::Internal(format!(
                                        "cannot encode the snapshot's record: {e}"
                                    ))
                                }),
                            };
                            record.map(|record| warren_core::node_api::SnapshotMade {
                                layer: t.layers.last().cloned().unwrap_or_default(),
                                layers: t.layers.len(),
                                node_id: self.cfg.node_id.clone(),
                                snapshot_id: t.name,
                                record,
                            })
                        }
                        Ok(Err(runtime::RuntimeError::LayerUnavailable(m))) => {
                            Err(NodeError::StoreUnavailable(m))
                        }
                        // A client error: this node's runtime cannot, and
                        // no retry changes that.
                        Ok(Err(runtime::RuntimeError::Unsupported(m))) => {
                            Err(NodeError::BadRequest(m))
                        }
                        Ok(Err(e)) => Err(NodeError::Internal(format!(
                            "cannot snapshot sandbox {id}: {e}"
                        ))),
                        Err(e) => Err(NodeError::Internal(format!(
                            "the snapshot task failed: {e}"
                        ))),
                    }
                }
            }
        };
        self.release_lock(id, lock);
        result
    }

    /// Packs a filesystem-paused sandbox's writable layer, with its paused
    /// record ([`warren_template::paused_key`]) saying what a gateway needs
    /// to boot it on another node: layer and record into the shared
    /// template store, or, from a blob store's node, the layer into the
    /// blob store (and this host's cache, like a snapshot's) and the record
    /// returned, for the pause's answer. The layers it owns after, and
    /// that record. Its processes are frozen first (they are killed next),
    /// and the layer is made from the node's own copy of its disk, like a
    /// snapshot's.
    async fn pack_paused(
        &self,
        sb: &Arc<Sandbox>,
        boot: &Boot,
    ) -> Result<(Vec<String>, Option<warren_template::Template>), String> {
        let store = self.runtime.store().cloned();
        let id = sb.info.sandbox_id.clone();
        let settings = warren_core::node_api::PausedSettings {
            network: Some(sb.policy()),
            private_ports: boot.0.traffic_access_token.is_some(),
            mask_request_host: boot.0.mask_request_host.clone(),
            auto_pause_filesystem_only: boot.0.auto_pause_filesystem_only,
            egress_rules: sb.rules(),
        };
        let spec = runtime::SnapshotSpec {
            key: warren_template::paused_key(&id),
            meta: warren_template::Snapshot {
                // No team: no API call of any team finds it.
                team: String::new(),
                name: None,
                source_sandbox: id.clone(),
                node_id: self.cfg.node_id.clone(),
                paused: Some(warren_template::Paused {
                    generation: sb.info.generation,
                    settings: serde_json::to_value(&settings).map_err(|e| e.to_string())?,
                    own_layers: Vec::new(),
                }),
                public: false,
            },
            template_id: sb.info.template_id.clone(),
        };
        let (rt, s2) = (self.runtime.clone(), sb.clone());
        let mut own = sb.own_layers.clone();
        warren_core::blocking::run(move || {
            rt.set_frozen(&s2.handle, true).map_err(|e| e.to_string())?;
            let mut t = rt
                .snapshot(&s2.paths, &s2.handle, true, &spec)
                .map_err(|e| e.to_string())?;
            if let Some(l) = t.layers.last() {
                own.push(l.clone());
            }
            if let Some(p) = t.snapshot.as_mut().and_then(|s| s.paused.as_mut()) {
                p.own_layers = own.clone();
            }
            tracing::info!(sandbox_id = %id, layers = t.layers.len(), "paused sandbox's layer packed");
            match store {
                Some(store) => {
                    store.put(&t).map_err(|e| e.to_string())?;
                    Ok((own, None))
                }
                None => Ok((own, Some(t))),
            }
        })
        .await
        .map_err(|e| format!("the pack task failed: {e}"))?
    }

    /// The paused record of sandbox `id`, if the store holds one.
    pub(super) fn paused_record(
        &self,
        id: &str,
    ) -> Option<(warren_template::Template, warren_template::Paused)> {
        let t = self
            .runtime
            .store()?
            .get(&warren_template::paused_key(id))
            .ok()?;
        let s = t.snapshot.as_ref().filter(|s| s.source_sandbox == id)?;
        let p = s.paused.clone()?;
        Some((t, p))
    }

    /// Removes sandbox `id`'s paused record (when it was made at
    /// `generation`, if given); with `layer`, the layer that pause packed
    /// too (nothing stacks it yet).
    pub(super) fn forget_paused(&self, id: &str, generation: Option<u64>, layer: bool) {
        let Some((t, p)) = self.paused_record(id) else {
            return;
        };
        if generation.is_some_and(|g| g != p.generation) {
            return;
        }
        let Some(store) = self.runtime.store() else {
            return;
        };
        if let Err(e) = store.remove(&t.name) {
            tracing::warn!(sandbox_id = %id, error = %e, "cannot remove the paused record");
            return;
        }
        if layer {
            if let Some(l) = t.layers.last().filter(|l| p.own_layers.contains(l)) {
                self.remove_layers(std::slice::from_ref(l));
            }
        }
    }

    /// Removes `layers` from the store, each unless a sandbox here stacks
    /// it (a fork) or a record names it (a snapshot); see
    /// [`warren_template::Store::remove_layer`].
    pub(super) fn remove_layers(&self, layers: &[String]) {
        let Some(store) = self.runtime.store() else {
            return;
        };
        let hosted = self.hosted();
        for l in layers {
            if hosted.iter().any(|s| s.handle.layers.contains(l)) {
                continue;
            }
            match store.remove_layer(l) {
                Ok(_) => tracing::info!(layer = %l, "paused layer removed from the store"),
                Err(e) => tracing::warn!(layer = %l, error = %e, "cannot remove a paused layer"),
            }
        }
    }
}
