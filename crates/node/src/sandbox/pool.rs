//! Warm pools (`--warm-pool base=8,...`): sandboxes of named templates
//! started ahead, so a create takes one already running.
//!
//! A pooled sandbox is started exactly as a create starts one — its id
//! range, disk, cgroups, namespaces, root, launcher, pid 1, egress with
//! the open policy (or none, on a node that can give no network) — except
//! that envd is handed nothing: it waits on its stdin for its settings.
//! It lives under `<data>/pool/<key>/`, named by a key of its own; no
//! tenant, id, token or name is in it yet.
//!
//! A create takes one when it can be handed over exactly ([`Registry::take`]):
//! the template it names is pooled, its record (the one the create
//! carries, else the store's) is the one the pooled sandbox was made
//! from, and the create mounts no volumes (pid 1 attaches them at start)
//! and has no egress rules (its egress proxy is set up with its network);
//! such creates start a sandbox of their own. A fork and a boot after a filesystem-only pause never take one.
//! The claim ([`Registry::claim`]) moves the sandbox's directory to
//! `<data>/sandboxes/<id>/`, applies the create's egress policy as a cold
//! start would have made it, and hands envd the create's settings through
//! the same function a cold start uses (token, environment, start command,
//! user, working directory, hostname); from there the create goes on as a
//! cold one does (envd's health, the start command, `sandbox.json`, the
//! roster). What stays different: the sandbox's first processes (its
//! launcher, pid 1 and envd) started when the pool made it, not at the
//! create, as their start times in `/proc` show.
//!
//! Each pooled sandbox is taken by one create only: it is popped from its
//! queue under the pool's lock. The pool refills in the background, one
//! sandbox at a time and only while no create is starting, so refilling
//! never competes with a create for the CPU. By default pooled sandboxes
//! count against `--capacity`: the pool fills only room no sandbox uses,
//! and a cold create that needs that room stops one
//! (`--warm-pool-beyond-capacity` puts them on top). They belong to no
//! team until taken, so no team's quota counts them. When a template's
//! record changes (a rebuild: the shared store's record, checked every
//! second, or a newer one a create carries), its pooled sandboxes are
//! stopped and the pool refills from the new one.

use super::Registry;
use crate::runtime::{self, LaunchSpec, Launched, Paths};
use std::collections::{BTreeMap, HashMap, VecDeque};
use std::path::PathBuf;
use std::sync::{Arc, Mutex};
use std::time::Duration;
use tokio::sync::{watch, Notify};
use warren_core::network::NetworkPolicy;
use warren_template::Template;

/// How often the refill task looks again without being woken (a rebuilt
/// template's record, a sandbox deleted by the sweep).
const TICK: Duration = Duration::from_secs(1);

/// The longest wait after failed starts before the next try.
const MAX_BACKOFF: Duration = Duration::from_secs(30);

/// A node's warm pools (see the module doc).
pub struct WarmPool {
    /// `(template, how many)` as configured.
    targets: Vec<(String, u32)>,
    beyond_capacity: bool,
    /// `<data>/pool`: where pooled sandboxes' files live until taken.
    dir: PathBuf,
    state: Mutex<PoolState>,
    /// Wakes the refill task: a sandbox was taken or stopped, a create
    /// ended.
    pub(super) wake: Notify,
}

#[derive(Default)]
struct PoolState {
    ready: HashMap<String, VecDeque<Pooled>>,
    /// The newest record a create carried per pooled template (a node
    /// whose layers come from a blob store has no records of its own).
    carried: HashMap<String, Template>,
    /// Pooled sandboxes being started (counted against the room).
    filling: usize,
}

/// One sandbox waiting in a pool.
pub struct Pooled {
    key: String,
    paths: Paths,
    launched: Launched,
    /// The template record it was made from.
    record: Template,
    /// The egress policy it was started with.
    network: NetworkPolicy,
}

impl Pooled {
    fn alive(&mut self) -> bool {
        self.launched
            .child
            .as_mut()
            .is_some_and(|c| matches!(c.try_wait(), Ok(None)))
    }
}

/// Whether two records make the same sandbox: the same root, layers and
/// defaults (its name and times aside).
fn same_template(a: &Template, b: &Template) -> bool {
    a.digest == b.digest && a.layers == b.layers && a.defaults == b.defaults
}

impl WarmPool {
    pub fn new(
        targets: Vec<(String, u32)>,
        beyond_capacity: bool,
        data_dir: &std::path::Path,
    ) -> WarmPool {
        WarmPool {
            targets,
            beyond_capacity,
            dir: data_dir.join("pool"),
            state: Mutex::new(PoolState::default()),
            wake: Notify::new(),
        }
    }

    fn state(&self) -> std::sync::MutexGuard<'_, PoolState> {
        self.state.lock().unwrap_or_else(|p| p.into_inner())
    }

    /// Pooled sandboxes ready and being started.
    pub fn count(&self) -> usize {
        let s = self.state();
        s.ready.values().map(VecDeque::len).sum::<usize>() + s.filling
    }

    fn target(&self, template: &str) -> Option<u32> {
        self.targets
            .iter()
            .find(|(t, _)| t == template)
            .map(|(_, n)| *n)
    }
}

impl Registry {
    /// The pooled sandbox a create of `template` (its record `record`,
    /// else the store's) may take, if there is one (see the module doc).
    /// `eligible`: the create can be handed to a pooled sandbox at all.
    pub(super) fn take(
        self: &Arc<Self>,
        template: &str,
        record: Option<&Template>,
        eligible: bool,
    ) -> Option<Pooled> {
        let pool = self.pool.as_ref()?;
        pool.target(template)?;
        if !eligible {
            self.metrics.pool_take(template, "ineligible");
            return None;
        }
        let want = match record {
            Some(r) => r.clone(),
            None => self.store_record(template)?,
        };
        let (taken, stale) = {
            let mut s = pool.state();
            if record.is_some() {
                s.carried.insert(template.to_string(), want.clone());
            }
            let queue = s.ready.entry(template.to_string()).or_default();
            let mut stale = Vec::new();
            let mut taken = None;
            while let Some(mut p) = queue.pop_front() {
                if same_template(&p.record, &want) && p.alive() {
                    taken = Some(p);
                    break;
                }
                stale.push(p);
            }
            if !stale.is_empty() {
                // The rest of this queue is as old as what was just found
                // stale (made from the same record, or before it).
                if taken.is_none() {
                    stale.extend(queue.drain(..));
                }
            }
            (taken, stale)
        };
        self.metrics
            .pool_ready(template, self.ready_count(template));
        for p in stale {
            let me = self.clone();
            tokio::spawn(async move { me.stop_pooled(p, "its template changed or it died").await });
        }
        self.metrics
            .pool_take(template, if taken.is_some() { "taken" } else { "empty" });
        pool.wake.notify_one();
        taken
    }

    fn ready_count(&self, template: &str) -> usize {
        self.pool.as_ref().map_or(0, |p| {
            p.state().ready.get(template).map_or(0, VecDeque::len)
        })
    }

    /// The template's record in the node's shared store, if it has one.
    fn store_record(&self, template: &str) -> Option<Template> {
        self.runtime.store()?.get(template).ok()
    }

    /// The record the pool fills `template` from now: the store's, else
    /// the newest a create carried.
    fn current_record(&self, template: &str) -> Option<Template> {
        if self.runtime.store().is_some() {
            return self.store_record(template);
        }
        let pool = self.pool.as_ref()?;
        let carried = pool.state().carried.get(template).cloned();
        carried
    }

    /// Hands the pooled sandbox `p` to the create `spec` describes (its
    /// files move to `spec.paths`): its launch, ready for the rest of the
    /// create, or None when it could not be handed over (it is stopped;
    /// the create starts a sandbox of its own).
    pub(super) async fn claim(
        self: &Arc<Self>,
        mut p: Pooled,
        spec: &LaunchSpec<'_>,
    ) -> Option<Launched> {
        let mut steps = runtime::Steps::start();
        let id = spec.sandbox_id.to_string();
        let moved = {
            let (from, to) = (p.paths.dir.clone(), spec.paths.dir.clone());
            let rt = self.runtime.clone();
            let paths = spec.paths.clone();
            tokio::task::spawn_blocking(move || {
                if to.exists() {
                    // Leftovers of a create that died half-way.
                    rt.destroy(&paths, None).map_err(|e| e.to_string())?;
                }
                std::fs::rename(&from, &to).map_err(|e| e.to_string())
            })
            .await
            .map_err(|e| e.to_string())
            .and_then(|r| r)
        };
        if let Err(why) = moved {
            tracing::warn!(sandbox_id = %id, pooled = %p.key, %why, "cannot move a pooled sandbox's files; starting one");
            self.stop_pooled(p, "its files could not be moved").await;
            return None;
        }
        p.paths = spec.paths.clone();
        steps.mark("pool");
        p.launched.steps = steps;
        match self.runtime.claim(&mut p.launched, spec, &p.network).await {
            Ok(()) => {
                tracing::info!(sandbox_id = %id, pooled = %p.key, "sandbox taken from the warm pool");
                Some(p.launched)
            }
            Err(e) => {
                tracing::warn!(sandbox_id = %id, pooled = %p.key, error = %e, "cannot hand over a pooled sandbox; starting one");
                self.stop_pooled(p, "it could not be handed over").await;
                None
            }
        }
    }

    /// Stops a pooled sandbox and removes its files.
    async fn stop_pooled(&self, p: Pooled, why: &str) {
        tracing::info!(pooled = %p.key, why, "stopping a pooled sandbox");
        let Launched {
            handle,
            child,
            ids,
            egress,
            ..
        } = p.launched;
        if let Some(e) = egress {
            e.detach().await;
        }
        let (paths, rt) = (p.paths.clone(), self.runtime.clone());
        let _ = tokio::task::spawn_blocking(move || rt.destroy(&paths, Some(&handle))).await;
        if let Some(mut c) = child {
            let _ = c.wait().await;
        }
        // The id range goes last: nothing that named it is left.
        drop(ids);
    }

    /// Makes room for a cold create when pooled sandboxes fill the rest of
    /// the node's capacity (see the module doc): stops one, the oldest of
    /// the fullest pool.
    pub(super) async fn make_room(&self, hosted: usize) {
        let Some(pool) = &self.pool else { return };
        if pool.beyond_capacity || hosted + pool.count() < self.cfg.capacity as usize {
            return;
        }
        let victim = {
            let mut s = pool.state();
            s.ready
                .values_mut()
                .max_by_key(|q| q.len())
                .and_then(VecDeque::pop_front)
        };
        if let Some(p) = victim {
            let template = p.record.name.clone();
            self.stop_pooled(p, "a create needs its room").await;
            self.metrics
                .pool_ready(&template, self.ready_count(&template));
        }
    }

    /// Whether the pool may start another sandbox now: room under the
    /// capacity (unless beyond it) and no create starting.
    fn may_fill(&self, pool: &WarmPool) -> bool {
        let starting = self
            .starting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .len();
        if starting > 0 {
            return false;
        }
        let hosted = self.hosted.read().map(|h| h.len()).unwrap_or(0);
        pool.beyond_capacity || hosted + pool.count() < self.cfg.capacity as usize
    }

    /// Whether the pool's sandboxes, one more among them, still fit the
    /// node's capacity with what it hosts (always, beyond capacity).
    fn room_for_one_more(&self, pool: &WarmPool) -> bool {
        let hosted = self.hosted.read().map(|h| h.len()).unwrap_or(0);
        pool.beyond_capacity || hosted + pool.count() < self.cfg.capacity as usize
    }

    /// The refill task (see the module doc), until `stop`; then every
    /// pooled sandbox is stopped.
    pub async fn run_warm_pool(self: Arc<Self>, mut stop: watch::Receiver<bool>) {
        let Some(pool) = &self.pool else { return };
        // What an earlier node process left (its sandboxes died with it).
        {
            let dir = pool.dir.clone();
            let rt = self.runtime.clone();
            let _ = tokio::task::spawn_blocking(move || {
                for e in std::fs::read_dir(&dir).into_iter().flatten().flatten() {
                    let paths = Paths::new(&dir, &e.file_name().to_string_lossy());
                    let _ = rt.destroy(&paths, None);
                }
                std::fs::create_dir_all(&dir)
            })
            .await;
        }
        let mut failures = 0u32;
        let mut warned: BTreeMap<String, bool> = BTreeMap::new();
        while !*stop.borrow() {
            self.drop_stale().await;
            let next = if self.may_fill(pool) {
                pool.targets.iter().find_map(|(t, n)| {
                    let s = pool.state();
                    let have = s.ready.get(t).map_or(0, VecDeque::len);
                    (have < *n as usize).then(|| t.clone())
                })
            } else {
                None
            };
            let Some(template) = next else {
                tokio::select! {
                    _ = pool.wake.notified() => {}
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stop.changed() => {}
                }
                continue;
            };
            let Some(record) = self.current_record(&template) else {
                if !warned.insert(template.clone(), true).unwrap_or(false) {
                    tracing::info!(template = %template, "the warm pool for this template fills once its record is known (the first create that names it)");
                }
                tokio::select! {
                    _ = pool.wake.notified() => {}
                    _ = tokio::time::sleep(TICK) => {}
                    _ = stop.changed() => {}
                }
                continue;
            };
            pool.state().filling += 1;
            let made = self.prestart(pool, &template, record).await;
            pool.state().filling -= 1;
            match made {
                Ok(p) if *stop.borrow() => self.stop_pooled(p, "the node is stopping").await,
                // A create took the room while this one started.
                Ok(p) if !self.room_for_one_more(pool) => {
                    self.stop_pooled(p, "a create took its room").await
                }
                Ok(p) => {
                    failures = 0;
                    pool.state()
                        .ready
                        .entry(template.clone())
                        .or_default()
                        .push_back(p);
                    self.metrics
                        .pool_ready(&template, self.ready_count(&template));
                }
                Err(why) => {
                    failures += 1;
                    let wait = (TICK * 2u32.saturating_pow(failures.min(5))).min(MAX_BACKOFF);
                    tracing::warn!(template = %template, %why, retry_in = ?wait, "cannot start a sandbox for the warm pool");
                    tokio::select! {
                        _ = tokio::time::sleep(wait) => {}
                        _ = stop.changed() => {}
                    }
                }
            }
        }
        self.drain_pool().await;
    }

    /// Stops pooled sandboxes whose template's record changed, or that
    /// died.
    async fn drop_stale(self: &Arc<Self>) {
        let Some(pool) = &self.pool else { return };
        let mut stale = Vec::new();
        for (template, _) in &pool.targets {
            let current = self.current_record(template);
            let mut s = pool.state();
            let Some(queue) = s.ready.get_mut(template) else {
                continue;
            };
            let mut keep = VecDeque::new();
            while let Some(mut p) = queue.pop_front() {
                let fresh = current.as_ref().is_none_or(|c| same_template(&p.record, c));
                if fresh && p.alive() {
                    keep.push_back(p);
                } else {
                    stale.push(p);
                }
            }
            *queue = keep;
        }
        for p in stale {
            let template = p.record.name.clone();
            self.stop_pooled(p, "its template changed or it died").await;
            self.metrics
                .pool_ready(&template, self.ready_count(&template));
        }
    }

    /// Starts one sandbox of `template` for the pool.
    async fn prestart(
        self: &Arc<Self>,
        pool: &WarmPool,
        template: &str,
        record: Template,
    ) -> Result<Pooled, String> {
        let key = format!("pool{:016x}", rand::random::<u64>());
        let paths = Paths::new(&pool.dir, &key);
        // The policy a create without one gets, where the node can give
        // a network at all.
        let network = if self.runtime.can_egress() {
            NetworkPolicy::open()
        } else {
            NetworkPolicy {
                allow_internet: false,
                allow_out: Vec::new(),
                deny_out: Vec::new(),
            }
        };
        let env = BTreeMap::new();
        let rules = warren_core::network::rules::EgressRules::default();
        let spec = LaunchSpec {
            egress_rules: &rules,
            egress_ca: None,
            volumes: &[],
            mounts: &[],
            template: Some(&record),
            sandbox_id: &key,
            generation: 0,
            paths: &paths,
            parent: None,
            kept: None,
            template_id: template,
            network: &network,
            env_vars: &env,
            access_token: None,
            envd_bin: &self.cfg.envd_bin,
            max_output_bytes: self.cfg.max_output_bytes,
            mark: &runtime::mark(&key, 0, &self.cfg.data_dir),
            caps: self.cfg.caps,
            hold_settings: true,
        };
        match self.runtime.launch(&spec).await {
            Ok(launched) => Ok(Pooled {
                key,
                paths,
                launched,
                record,
                network,
            }),
            Err(e) => {
                let rt = self.runtime.clone();
                let _ = tokio::task::spawn_blocking(move || rt.destroy(&paths, None)).await;
                Err(e.to_string())
            }
        }
    }

    /// Stops every pooled sandbox (node shutdown).
    pub async fn drain_pool(&self) {
        let Some(pool) = &self.pool else { return };
        let all: Vec<Pooled> = {
            let mut s = pool.state();
            s.ready.drain().flat_map(|(_, q)| q).collect()
        };
        for p in all {
            self.stop_pooled(p, "the node is stopping").await;
        }
        for (t, _) in &pool.targets {
            self.metrics.pool_ready(t, 0);
        }
    }
}
