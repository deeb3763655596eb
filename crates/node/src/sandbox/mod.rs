//! The sandbox registry: which sandboxes this node hosts, at which
//! generation, and the create / fork / delete / adopt operations on them.
//!
//! **Invariant:** every operation on one sandbox id runs under that id's lock,
//! so two concurrent creates of the same `(sandbox_id, generation)` start one
//! envd, and a delete never races a create. The roster (`hosted`) changes only
//! under that lock; readers (the data plane) take a snapshot `Arc<Sandbox>`.
//!
//! # Layout
//! - [`state`]: API types and `sandbox.json`.
//! - [`files`]: the `base` template, fork copies, removal.
//! - [`network`]: replacing a running sandbox's egress policy; the traffic
//!   access token and Host mask its ports are reached with.
//! - `pause`: freezing and thawing in place, halting to the filesystem and
//!   booting again, snapshots and packing a paused sandbox's layers.
//! - [`pool`]: warm pools, sandboxes started ahead that creates take.
//! - `adopt`: what happens at node start (adopt or clean up what a previous
//!   node process left) and at node shutdown (kill everything).

mod adopt;
pub mod files;
mod logs;
pub mod network;
mod pause;
pub mod pool;
pub mod state;

use crate::envd;
use crate::metrics::Metrics;
use crate::runtime::{self, Handle, LaunchSpec, Paths, Runtime};
use state::{CreateSandbox, Record, SandboxInfo};
use std::collections::{BTreeMap, HashMap};
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use tokio::sync::mpsc;

/// A lifecycle event for the scheduler (sent after the fact).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Event {
    pub sandbox_id: String,
    pub generation: u64,
    pub kind: EventKind,
    /// A DELETE's: the sandbox's log at its end ([`crate::logs`]).
    pub logs: Vec<warren_core::node_api::SandboxLogEntry>,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum EventKind {
    Create,
    Fork,
    Delete,
}

/// Why a control operation failed; maps onto an HTTP status.
#[derive(Debug, thiserror::Error)]
pub enum NodeError {
    /// The caller sent something invalid (400).
    #[error("{0}")]
    BadRequest(String),
    /// Not hosted at that generation (404 with the not-found marker).
    #[error("sandbox {id} (generation {generation}) is not on node {node}")]
    NotHosted {
        id: String,
        generation: String,
        node: String,
    },
    /// The sandbox is paused and the operation needs it running (409).
    #[error("sandbox {0} is paused; resume it first")]
    Paused(String),
    /// Paused filesystem-only, and the caller may not boot it (409 with
    /// the not-resumable marker).
    #[error("sandbox {0} is paused filesystem-only; only a resume or connect boots it again")]
    NotResumable(String),
    /// The runtime cannot do this (501).
    #[error("{0}")]
    Unsupported(String),
    /// Hosted at another generation (409).
    #[error("sandbox {id} is hosted at generation {hosted}, not {asked}")]
    Conflict { id: String, hosted: u64, asked: u64 },
    /// At capacity (503; the scheduler should place elsewhere).
    #[error("node {node} is full ({capacity} sandboxes)")]
    Full { node: String, capacity: u32 },
    /// The node failed (500); the message names the problem.
    #[error("{0}")]
    Internal(String),
    /// The blob store cannot give a layer this node lacks, or take a new
    /// one (503; the message names the store).
    #[error("{0}")]
    StoreUnavailable(String),
}

/// The template record a create was handed (`template_record`), checked:
/// a valid name, digests that are digests, defaults a template may have.
fn template_record(req: &CreateSandbox) -> Result<Option<warren_template::Template>, NodeError> {
    let Some(v) = &req.template_record else {
        return Ok(None);
    };
    let bad = |why: String| NodeError::BadRequest(format!("template_record: {why}"));
    let t: warren_template::Template =
        serde_json::from_value(v.clone()).map_err(|e| bad(e.to_string()))?;
    warren_template::validate_name(&t.name).map_err(|e| bad(e.to_string()))?;
    for d in std::iter::once(&t.digest).chain(&t.layers) {
        d.parse::<warren_blob::Digest>()
            .map_err(|e| bad(format!("{d:?}: {e}")))?;
    }
    if t.layers.len() > runtime::isolated::MAX_LAYERS {
        return Err(bad(format!(
            "{} layers, more than the {} a sandbox may stack",
            t.layers.len(),
            runtime::isolated::MAX_LAYERS
        )));
    }
    t.defaults.validate().map_err(|e| bad(e.to_string()))?;
    Ok(Some(t))
}

/// One hosted sandbox.
#[derive(Debug)]
pub struct Sandbox {
    pub info: SandboxInfo,
    pub paths: Paths,
    pub handle: Handle,
    pub metadata: BTreeMap<String, String>,
    pub timeout_secs: Option<u64>,
    /// Its egress policy now (a fork inherits it; replaced by
    /// [`Registry::update_network`] under the sandbox id's lock).
    pub network: Mutex<runtime::egress::NetworkPolicy>,
    /// Who may reach its ports, and with which Host (fixed at create).
    pub access: network::PortAccess,
    /// Its egress rules now (a fork inherits them; replaced with the
    /// policy by [`Registry::update_network`]).
    pub rules: Mutex<warren_core::network::rules::EgressRules>,
    /// Its egress (slirp4netns and nftables table), stopped at delete.
    /// Declared before `ids`: fields drop in order, and the range must stay
    /// held until the egress that names it is gone.
    pub egress: Mutex<Option<runtime::egress::EgressHandle>>,
    /// The host id range the sandbox holds (isolated), released when dropped.
    pub ids: Option<runtime::ids::IdRange>,
    /// Frozen in place by a pause (changed under the sandbox id's lock).
    pub paused: std::sync::atomic::AtomicBool,
    /// Woken when a pause froze it: requests waiting for its answer are
    /// answered 502 "paused" instead of hanging until a resume.
    pub frozen: tokio::sync::Notify,
    /// Paused filesystem-only ([`Registry::halt`]): no process runs, its
    /// files are kept, a resume boots it again. Always with `paused`.
    pub halted: bool,
    /// What it was created with, to boot it again after a filesystem-only
    /// pause (None: adopted after a node restart, cannot be).
    pub boot: Option<Boot>,
    /// The layers its own filesystem-only pauses packed that it stacks
    /// (booted on this node from one; see [`Registry::halt`]): removed
    /// from the store when it is deleted.
    pub own_layers: Vec<String>,
}

impl Sandbox {
    /// Frozen by a pause, or paused filesystem-only.
    pub fn is_paused(&self) -> bool {
        self.paused.load(std::sync::atomic::Ordering::SeqCst)
    }

    /// Paused at its end filesystem-only (E2B's `autoPauseMemory: false`).
    pub fn pauses_filesystem_only(&self) -> bool {
        self.boot
            .as_ref()
            .is_some_and(|b| b.0.auto_pause_filesystem_only)
    }
}

/// A sandbox's create request, held in the node's memory only (it carries
/// its envd access token and environment, never written to disk) for a
/// boot after a filesystem-only pause.
#[derive(Clone)]
pub struct Boot(pub CreateSandbox);

impl std::fmt::Debug for Boot {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("Boot(..)")
    }
}

/// The delete reason of a sandbox the scheduler no longer assigns here
/// (it may have moved: what it left in the template store stays).
pub const ORPHAN: &str = "orphan (scheduler)";

/// Settings the registry needs from the node's configuration.
#[derive(Debug, Clone)]
pub struct RegistryConfig {
    pub node_id: String,
    pub data_dir: PathBuf,
    pub capacity: u32,
    pub envd_bin: PathBuf,
    pub max_output_bytes: u64,
    pub envd_start_timeout: Duration,
    /// The most a sandbox may have (its template's values apply under these).
    pub caps: crate::config::Caps,
    /// `--warm-pool`: templates and how many sandboxes to keep started.
    pub warm_pool: Vec<(String, u32)>,
    /// Pooled sandboxes come on top of `capacity`.
    pub warm_pool_beyond_capacity: bool,
    /// What each sandbox's log may hold.
    pub log_bounds: crate::logs::Bounds,
}

/// Whether the simulation switched the generation check off (feature
/// `mutations` only; always false in a node).
fn generation_check_skipped() -> bool {
    #[cfg(feature = "mutations")]
    {
        crate::mutations::generation_check_skipped()
    }
    #[cfg(not(feature = "mutations"))]
    {
        false
    }
}

/// See the module doc.
pub struct Registry {
    cfg: RegistryConfig,
    sandboxes_dir: PathBuf,
    runtime: Arc<dyn Runtime>,
    hosted: RwLock<HashMap<String, Arc<Sandbox>>>,
    /// Per-sandbox-id locks (see the module doc).
    locks: Mutex<HashMap<String, Arc<tokio::sync::Mutex<()>>>>,
    events: mpsc::UnboundedSender<Event>,
    metrics: Metrics,
    /// Creates under way, `(id, generation)`: listed in the roster too, so
    /// the scheduler's sweep does not take a create that outlasts
    /// `--creating-timeout` (a template's layers being fetched) for one
    /// that died (see [`Registry::roster`]).
    starting: Mutex<std::collections::HashSet<(String, u64)>>,
    /// Each hosted sandbox's log (`logs.rs`).
    logs: crate::logs::LogBooks,
    /// This node's volume store, when it has one (`crate::volumes`).
    volumes: Option<Arc<crate::volumes::VolumeStore>>,
    /// The warm pools (isolated runtime, `--warm-pool`).
    pool: Option<pool::WarmPool>,
}

/// Removes a create from [`Registry::starting`] however it ends.
struct Starting<'a>(&'a Registry, (String, u64));

impl Drop for Starting<'_> {
    fn drop(&mut self) {
        let mut s = self.0.starting.lock().unwrap_or_else(|p| p.into_inner());
        s.remove(&self.1);
        // The pool refills only while no create starts.
        if let Some(pool) = &self.0.pool {
            pool.wake.notify_one();
        }
    }
}

impl Registry {
    pub fn new(
        cfg: RegistryConfig,
        runtime: Arc<dyn Runtime>,
        metrics: Metrics,
        events: mpsc::UnboundedSender<Event>,
        volumes: Option<Arc<crate::volumes::VolumeStore>>,
    ) -> Arc<Registry> {
        let pool = match (cfg.warm_pool.is_empty(), runtime.kind()) {
            (true, _) => None,
            (false, runtime::RuntimeKind::Isolated) => Some(pool::WarmPool::new(
                cfg.warm_pool.clone(),
                cfg.warm_pool_beyond_capacity,
                &cfg.data_dir,
            )),
            (false, kind) => {
                tracing::warn!(
                    runtime = kind.as_str(),
                    "--warm-pool is ignored: only the isolated runtime keeps warm pools"
                );
                None
            }
        };
        let cfg_log_bounds = cfg.log_bounds;
        Arc::new(Registry {
            volumes,
            pool,
            sandboxes_dir: cfg.data_dir.join("sandboxes"),
            cfg,
            runtime,
            hosted: RwLock::new(HashMap::new()),
            locks: Mutex::new(HashMap::new()),
            events,
            metrics,
            starting: Mutex::new(std::collections::HashSet::new()),
            logs: crate::logs::LogBooks::new(cfg_log_bounds),
        })
    }

    pub fn node_id(&self) -> &str {
        &self.cfg.node_id
    }

    /// This node's volume store, if it has one.
    pub fn volumes(&self) -> Option<&Arc<crate::volumes::VolumeStore>> {
        self.volumes.as_ref()
    }

    pub fn runtime_name(&self) -> &'static str {
        self.runtime.kind().as_str()
    }

    /// The sandbox if hosted at exactly `generation` (the data plane's check).
    pub fn get(&self, id: &str, generation: u64) -> Option<Arc<Sandbox>> {
        let hosted = self.hosted.read().ok()?;
        hosted
            .get(id)
            .filter(|s| s.info.generation == generation || generation_check_skipped())
            .cloned()
    }

    /// Every hosted sandbox, sorted by id, with its network now and the
    /// layers it stacks.
    pub fn list(&self) -> Vec<SandboxInfo> {
        let mut v: Vec<SandboxInfo> = self
            .hosted
            .read()
            .map(|h| {
                h.values()
                    .map(|s| SandboxInfo {
                        network: Some(s.network_info()),
                        layers: s.handle.layers.clone(),
                        paused_record: None,
                        ..s.info.clone()
                    })
                    .collect()
            })
            .unwrap_or_default();
        v.sort_by(|a, b| a.sandbox_id.cmp(&b.sandbox_id));
        v
    }

    /// Every hosted sandbox (the metrics sampler reads them).
    pub fn hosted(&self) -> Vec<Arc<Sandbox>> {
        self.hosted
            .read()
            .map(|h| h.values().cloned().collect())
            .unwrap_or_default()
    }

    /// `(sandbox_id, generation)` of everything hosted, for the scheduler.
    /// What the node hosts, and the creates under way: a create the
    /// scheduler finds still CREATING past `--creating-timeout` is
    /// confirmed while the node lists it, and removed once it does not
    /// (a failed create's gateway removes it sooner).
    pub fn roster(&self) -> Vec<(String, u64)> {
        let mut out: Vec<(String, u64)> = self
            .list()
            .into_iter()
            .map(|i| (i.sandbox_id, i.generation))
            .collect();
        let starting = self.starting.lock().unwrap_or_else(|p| p.into_inner());
        out.extend(
            starting
                .iter()
                .filter(|s| !out.contains(s))
                .cloned()
                .collect::<Vec<_>>(),
        );
        out
    }

    fn lock_for(&self, id: &str) -> Arc<tokio::sync::Mutex<()>> {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        locks.entry(id.to_string()).or_default().clone()
    }

    fn release_lock(&self, id: &str, lock: Arc<tokio::sync::Mutex<()>>) {
        let mut locks = self.locks.lock().unwrap_or_else(|p| p.into_inner());
        // Ours plus the map's: nobody else waits, so the entry can go.
        if Arc::strong_count(&lock) <= 2 {
            locks.remove(id);
        }
    }

    fn not_hosted(&self, id: &str, generation: Option<u64>) -> NodeError {
        NodeError::NotHosted {
            id: id.to_string(),
            generation: generation.map_or("any".to_string(), |g| g.to_string()),
            node: self.cfg.node_id.clone(),
        }
    }

    fn validate(&self, req: &CreateSandbox) -> Result<(), NodeError> {
        warren_core::id::validate_sandbox_id(&req.sandbox_id)
            .map_err(|e| NodeError::BadRequest(e.to_string()))?;
        if req.generation == 0 {
            return Err(NodeError::BadRequest(
                "generation must be at least 1".into(),
            ));
        }
        if let Some(n) = &req.network {
            n.validate().map_err(NodeError::BadRequest)?;
        }
        req.egress_rules
            .validate("egress_rules")
            .map_err(NodeError::BadRequest)?;
        if !req.egress_rules.is_empty() && self.runtime.kind() != runtime::RuntimeKind::Isolated {
            return Err(NodeError::BadRequest(format!(
                "network.rules need the isolated runtime (this node runs {}): its sandboxes have \
                 no egress of their own to pass through the egress proxy",
                self.runtime.kind().as_str()
            )));
        }
        network::PortAccess::new(
            req.traffic_access_token.as_deref(),
            req.mask_request_host.as_deref(),
        )?;
        warren_core::env::check_vars(&req.env_vars).map_err(NodeError::BadRequest)?;
        template_record(req)?;
        let paths = warren_core::volume::mount_paths(req.volumes.iter().map(|v| v.path.as_str()))
            .map_err(NodeError::BadRequest)?;
        for (v, p) in req.volumes.iter().zip(paths) {
            warren_core::volume::validate_id(&v.volume_id).map_err(NodeError::BadRequest)?;
            if v.path != p {
                return Err(NodeError::BadRequest(format!(
                    "volume mount path {:?} is not normalized (it is {p})",
                    v.path
                )));
            }
        }
        Ok(())
    }

    /// Whether this node's layers come from a blob store (its cache
    /// changes as it creates).
    pub fn fetches_layers(&self) -> bool {
        self.runtime.kind() == runtime::RuntimeKind::Isolated && self.runtime.store().is_none()
    }

    /// The layers this host's cache holds (most recently used first, at
    /// most the scheduler's 1000), for the heartbeat.
    pub fn cached_layers(&self) -> Vec<String> {
        let mut l = self.runtime.cached_layers();
        l.truncate(1000);
        l
    }

    /// Creates a sandbox; `Ok((true, info))` when it was created now,
    /// `Ok((false, info))` when that `(id, generation)` was already here.
    pub async fn create(
        self: &Arc<Self>,
        req: CreateSandbox,
    ) -> Result<(bool, SandboxInfo), NodeError> {
        self.validate(&req)?;
        let lock = self.lock_for(&req.sandbox_id);
        let result = {
            let _held = lock.lock().await;
            self.create_locked(&req, None).await
        };
        self.release_lock(&req.sandbox_id, lock);
        result
    }

    /// Forks `parent_id` (hosted at `parent_generation`) into `child`.
    pub async fn fork(
        self: &Arc<Self>,
        parent_id: &str,
        parent_generation: u64,
        child: CreateSandbox,
    ) -> Result<(bool, SandboxInfo), NodeError> {
        self.validate(&child)?;
        if child.sandbox_id == parent_id {
            return Err(NodeError::BadRequest(
                "a fork needs a new sandbox id".into(),
            ));
        }
        // Both locks, in id order, so two opposite forks cannot deadlock.
        let (a, b) = if parent_id < child.sandbox_id.as_str() {
            (parent_id.to_string(), child.sandbox_id.clone())
        } else {
            (child.sandbox_id.clone(), parent_id.to_string())
        };
        let (la, lb) = (self.lock_for(&a), self.lock_for(&b));
        let result = {
            let _ga = la.lock().await;
            let _gb = lb.lock().await;
            match self.get(parent_id, parent_generation) {
                None => Err(self.not_hosted(parent_id, Some(parent_generation))),
                // Copying freezes and then thaws the parent: never a paused one.
                Some(parent) if parent.is_paused() => Err(NodeError::Paused(parent_id.into())),
                Some(parent) => {
                    // A fork copies its parent's lifecycle.
                    let mut child = child;
                    child.auto_pause_filesystem_only |= parent.pauses_filesystem_only();
                    self.create_locked(&child, Some(&parent)).await
                }
            }
        };
        self.release_lock(&a, la);
        self.release_lock(&b, lb);
        result
    }

    async fn create_locked(
        self: &Arc<Self>,
        req: &CreateSandbox,
        parent: Option<&Sandbox>,
    ) -> Result<(bool, SandboxInfo), NodeError> {
        if let Some(existing) = self
            .hosted
            .read()
            .ok()
            .and_then(|h| h.get(&req.sandbox_id).cloned())
        {
            if existing.info.generation == req.generation {
                return Ok((false, existing.info.clone()));
            }
            return Err(NodeError::Conflict {
                id: req.sandbox_id.clone(),
                hosted: existing.info.generation,
                asked: req.generation,
            });
        }
        let count = self.hosted.read().map(|h| h.len()).unwrap_or(0);
        if count >= self.cfg.capacity as usize {
            return Err(NodeError::Full {
                node: self.cfg.node_id.clone(),
                capacity: self.cfg.capacity,
            });
        }
        let key = (req.sandbox_id.clone(), req.generation);
        self.starting
            .lock()
            .unwrap_or_else(|p| p.into_inner())
            .insert(key.clone());
        let started = Starting(self, key);
        let result = self.start(req, parent, None).await;
        drop(started);
        match &result {
            Ok(_) => self.metrics.creates.inc(),
            Err(_) => self.metrics.create_failures.inc(),
        };
        let info = result?;
        let kind = if parent.is_some() {
            EventKind::Fork
        } else {
            EventKind::Create
        };
        self.log_lifecycle(
            &info.sandbox_id,
            if parent.is_some() {
                "Sandbox forked"
            } else {
                "Sandbox created"
            },
            [
                ("template", info.template_id.clone()),
                ("generation", info.generation.to_string()),
                ("node", self.cfg.node_id.clone()),
            ],
        );
        self.emit(&info.sandbox_id, info.generation, kind);
        Ok((true, info))
    }

    /// Files, envd, health, `sandbox.json`, roster — undoing everything on
    /// failure. `kept`: a boot from the files a filesystem-only pause kept
    /// (that sandbox, replaced in the roster on success); a failure then
    /// stops what started and keeps the files.
    async fn start(
        self: &Arc<Self>,
        req: &CreateSandbox,
        parent: Option<&Sandbox>,
        kept: Option<&Sandbox>,
    ) -> Result<SandboxInfo, NodeError> {
        let paths = Paths::new(&self.sandboxes_dir, &req.sandbox_id);
        // A fork keeps its parent's policy unless the create says otherwise.
        let network = req
            .network
            .clone()
            .or_else(|| parent.map(|p| p.policy()))
            .unwrap_or_else(runtime::egress::NetworkPolicy::open);
        // And its rules, as it has no say over them (E2B's fork cannot).
        let rules = match parent {
            Some(p) if req.egress_rules.is_empty() => p.rules().normalized(),
            _ => req.egress_rules.normalized(),
        };
        // Checked by `validate` already: this cannot fail after the launch.
        let access = network::PortAccess::new(
            req.traffic_access_token.as_deref(),
            req.mask_request_host.as_deref(),
        )?;
        let record = template_record(req)?;
        // A fork mounts its parent's volumes, a boot after a filesystem-only
        // pause its own again; a create what it asks for.
        let mounts = match (parent, kept) {
            (Some(p), _) => p.handle.volumes.clone(),
            (None, Some(k)) => k.handle.volumes.clone(),
            (None, None) => req.volumes.clone(),
        };
        let volumes = {
            let (store, mounts) = (self.volumes.clone(), mounts.clone());
            // Through the blocking seam, so the simulation replays it.
            warren_core::blocking::run(move || crate::volumes::sources(store.as_deref(), &mounts))
                .await
                .map_err(|e| NodeError::Internal(format!("the volume task failed: {e}")))?
                .map_err(|e| match e {
                    crate::volumes::VolumeError::Store(m) => NodeError::Internal(m),
                    e => NodeError::BadRequest(format!("cannot mount its volumes: {e}")),
                })?
        };
        let spec = LaunchSpec {
            volumes: &volumes,
            mounts: &mounts,
            template: record.as_ref(),
            sandbox_id: &req.sandbox_id,
            generation: req.generation,
            paths: &paths,
            parent: parent.map(|p| (&p.paths, &p.handle)),
            kept: kept.map(|k| &k.handle),
            template_id: &req.template_id,
            network: &network,
            egress_rules: &rules,
            egress_ca: req.egress_ca.as_deref(),
            env_vars: &req.env_vars,
            access_token: req.access_token.as_deref(),
            envd_bin: &self.cfg.envd_bin,
            max_output_bytes: self.cfg.max_output_bytes,
            mark: &runtime::mark(&req.sandbox_id, req.generation, &self.cfg.data_dir),
            caps: self.cfg.caps,
            hold_settings: false,
        };
        // A sandbox moved here after a filesystem-only pause boots from
        // the record its pause left (template root, its layers and the
        // pause's): handed in the create with a blob store, else read from
        // the shared store. The layers its pauses made are its own.
        let moved_in = kept.is_none()
            && parent.is_none()
            && req.template_id == warren_template::paused_key(&req.sandbox_id);
        let handed = record
            .as_ref()
            .and_then(|t| t.snapshot.as_ref())
            .filter(|s| s.source_sandbox == req.sandbox_id)
            .and_then(|s| s.paused.as_ref())
            .map(|p| p.own_layers.clone());
        let own_layers = match (kept, moved_in) {
            (Some(k), _) => k.own_layers.clone(),
            (None, true) => handed.unwrap_or_else(|| {
                self.paused_record(&req.sandbox_id)
                    .map_or_else(Vec::new, |(_, p)| p.own_layers)
            }),
            (None, false) => Vec::new(),
        };
        // A create a warm pool can serve takes a sandbox from it (see
        // `pool`); any other start launches one here, on an async worker
        // thread (see runtime's module doc).
        let template = if req.template_id.is_empty() {
            files::BASE_TEMPLATE
        } else {
            req.template_id.as_str()
        };
        let pooled = match (parent, kept) {
            // Volumes are attached by pid 1 at start, and an egress proxy is
            // set up with the network: such creates start their own.
            (None, None) => self.take(
                template,
                record.as_ref(),
                mounts.is_empty() && rules.is_empty(),
            ),
            _ => None,
        };
        let claimed = match pooled {
            Some(p) => self.claim(p, &spec).await,
            None => None,
        };
        let from_pool = claimed.is_some();
        let launched = match claimed {
            Some(l) => Ok(l),
            None => {
                let hosted = self.hosted.read().map(|h| h.len()).unwrap_or(0);
                self.make_room(hosted).await;
                self.runtime.launch(&spec).await
            }
        };
        let launched = match launched {
            Ok(l) => l,
            Err(e) => {
                if kept.is_none() {
                    self.cleanup(&paths, None, &req.sandbox_id).await;
                }
                return Err(match e {
                    runtime::RuntimeError::Template(m) | runtime::RuntimeError::Policy(m) => {
                        NodeError::BadRequest(m)
                    }
                    runtime::RuntimeError::LayerUnavailable(m) => NodeError::StoreUnavailable(m),
                    runtime::RuntimeError::Unsupported(m) => NodeError::Unsupported(m),
                    e => NodeError::Internal(format!("cannot start the sandbox: {e}")),
                });
            }
        };
        let ids = launched.ids;
        let egress = launched.egress;
        let ready_within = launched.ready_within;
        let mut steps = launched.steps;
        let mut handle = launched.handle;
        let mut child = launched.child;
        let healthy = match child.as_mut() {
            Some(c) => tokio::select! {
                r = envd::wait_healthy(&paths.envd_sock, self.cfg.envd_start_timeout) => r,
                status = c.wait() => Err(match status {
                    Ok(s) => format!("envd exited ({s}) before answering /health"),
                    Err(e) => format!("cannot wait for envd: {e}"),
                }),
            },
            None => envd::wait_healthy(&paths.envd_sock, self.cfg.envd_start_timeout).await,
        };
        steps.mark("envd_ready");
        // Then the template's start command, when it has one (bounded by
        // the template's ready timeout).
        let healthy = match (healthy, ready_within) {
            (Ok(()), Some(within)) => {
                let token = req.access_token.as_deref();
                let started = match child.as_mut() {
                    Some(c) => tokio::select! {
                        r = envd::wait_started(&paths.envd_sock, token, within) => r,
                        status = c.wait() => Err(match status {
                            Ok(s) => format!("envd exited ({s}) while the start command was starting"),
                            Err(e) => format!("cannot wait for envd: {e}"),
                        }),
                    },
                    None => envd::wait_started(&paths.envd_sock, token, within).await,
                };
                started.map_err(|why| {
                    format!(
                        "template {:?}'s start command did not become ready: {why}",
                        req.template_id
                    )
                })
            }
            (r, _) => r,
        };
        if ready_within.is_some() {
            steps.mark("start_cmd");
        }
        if let Err(why) = healthy {
            if let Some(e) = egress {
                e.detach().await;
            }
            self.undo(&paths, &handle, &req.sandbox_id, kept.is_some())
                .await;
            if let Some(mut c) = child {
                let _ = c.wait().await;
            }
            return Err(NodeError::Internal(format!(
                "sandbox {} did not start: {why} (cleaned up)",
                req.sandbox_id
            )));
        }
        self.runtime.settle(&mut handle);
        // Only what it stacks (a boot at home does not stack its pause's).
        let own_layers: Vec<String> = own_layers
            .into_iter()
            .filter(|l| handle.layers.contains(l))
            .collect();
        let info = SandboxInfo {
            sandbox_id: req.sandbox_id.clone(),
            generation: req.generation,
            template_id: if req.template_id.is_empty() {
                files::BASE_TEMPLATE.to_string()
            } else {
                req.template_id.clone()
            },
            node_id: self.cfg.node_id.clone(),
            started_at_ms: warren_core::time::now_ms(),
            envd_version: warren_core::node_api::ENVD_VERSION.to_string(),
            network: None,
            layers: Vec::new(),
            paused_record: None,
        };
        let record = Record {
            info: info.clone(),
            metadata: req.metadata.clone(),
            timeout_secs: req.timeout_secs,
            handle: handle.clone(),
            network: Some(network.clone()),
            access: access.clone(),
            rules: rules.clone(),
        };
        if let Err(e) = record.save(&paths.state) {
            if let Some(e) = egress {
                e.detach().await;
            }
            self.undo(&paths, &handle, &req.sandbox_id, kept.is_some())
                .await;
            return Err(NodeError::Internal(format!(
                "cannot write sandbox.json: {e}"
            )));
        }
        let sandbox = Arc::new(Sandbox {
            info: info.clone(),
            paths,
            handle,
            metadata: req.metadata.clone(),
            timeout_secs: req.timeout_secs,
            ids,
            network: Mutex::new(network.clone()),
            access,
            rules: Mutex::new(rules),
            egress: Mutex::new(egress),
            paused: std::sync::atomic::AtomicBool::new(false),
            frozen: tokio::sync::Notify::new(),
            halted: false,
            boot: Some(Boot(req.clone())),
            own_layers,
        });
        steps.mark("record");
        let total = steps.took.iter().map(|(_, d)| *d).sum();
        steps.took.push(("total", total));
        self.metrics.create_steps(&steps.took, from_pool);
        let pid = sandbox.handle.pid;
        self.insert(sandbox);
        if moved_in {
            // Running here now: its pause's record is done with (the layer
            // stays, stacked by this sandbox).
            self.forget_paused(&req.sandbox_id, None, false);
        }
        if let Some(child) = child {
            self.watch_envd(child, info.sandbox_id.clone(), info.generation, pid);
        }
        tracing::info!(sandbox_id = %info.sandbox_id, generation = info.generation, "sandbox started");
        Ok(info)
    }

    fn insert(&self, sandbox: Arc<Sandbox>) {
        if let Ok(mut h) = self.hosted.write() {
            h.insert(sandbox.info.sandbox_id.clone(), sandbox);
            self.metrics.sandboxes.set(h.len() as i64);
        }
    }

    /// Reaps envd; if it dies while its sandbox is still hosted and
    /// running this boot (`pid`: its launcher), the sandbox is gone for
    /// good: delete it (and tell the scheduler). A filesystem-only pause
    /// kills it on purpose: that boot is no longer the hosted one.
    fn watch_envd(
        self: &Arc<Self>,
        mut child: tokio::process::Child,
        id: String,
        generation: u64,
        pid: i32,
    ) {
        let me = Arc::downgrade(self);
        tokio::spawn(async move {
            let status = child.wait().await;
            let Some(me) = me.upgrade() else { return };
            let lock = me.lock_for(&id);
            {
                let _held = lock.lock().await;
                let this_boot = me
                    .get(&id, generation)
                    .is_some_and(|s| !s.halted && s.handle.pid == pid);
                if this_boot {
                    tracing::error!(sandbox_id = %id, generation, ?status, "envd exited; removing the sandbox");
                    let _ = me.delete_locked(&id, Some(generation), "envd exited").await;
                }
            }
            me.release_lock(&id, lock);
        });
    }

    /// Stops what a boot started after its launch, and removes its files
    /// unless they are `kept` ones (which stay for the delete or a retry).
    async fn undo(&self, paths: &Paths, handle: &Handle, id: &str, kept: bool) {
        if !kept {
            return self.cleanup(paths, Some(handle), id).await;
        }
        let (p, h, rt) = (paths.clone(), handle.clone(), self.runtime.clone());
        match warren_core::blocking::run(move || rt.halt(&p, &h)).await {
            Ok(Ok(())) => {}
            Ok(Err(e)) => {
                tracing::error!(sandbox_id = %id, error = %e, "cannot stop a failed boot")
            }
            Err(e) => tracing::error!(sandbox_id = %id, error = %e, "the stop task failed"),
        }
    }

    async fn cleanup(&self, paths: &Paths, handle: Option<&Handle>, id: &str) {
        let (paths, handle, id) = (paths.clone(), handle.cloned(), id.to_string());
        let rt = self.runtime.clone();
        let r = warren_core::blocking::run(move || rt.destroy(&paths, handle.as_ref())).await;
        match r {
            Ok(Ok(())) => {}
            Ok(Err(e)) => tracing::error!(sandbox_id = %id, error = %e, "cannot destroy a sandbox"),
            Err(e) => tracing::error!(sandbox_id = %id, error = %e, "the destroy task failed"),
        }
    }

    /// Kills every process of the sandbox and removes its files.
    /// `generation: None` deletes whatever generation is hosted.
    /// Answers its log at its end too (what its DELETE event carries).
    pub async fn delete(
        self: &Arc<Self>,
        id: &str,
        generation: Option<u64>,
        reason: &str,
    ) -> Result<(SandboxInfo, Vec<warren_core::node_api::SandboxLogEntry>), NodeError> {
        let lock = self.lock_for(id);
        let result = {
            let _held = lock.lock().await;
            self.delete_locked(id, generation, reason).await
        };
        self.release_lock(id, lock);
        result
    }

    async fn delete_locked(
        &self,
        id: &str,
        generation: Option<u64>,
        reason: &str,
    ) -> Result<(SandboxInfo, Vec<warren_core::node_api::SandboxLogEntry>), NodeError> {
        let sandbox = self
            .hosted
            .read()
            .ok()
            .and_then(|h| h.get(id).cloned())
            .filter(|s| generation.is_none_or(|g| g == s.info.generation))
            .ok_or_else(|| self.not_hosted(id, generation))?;
        // envd's last entries, while it still runs.
        self.last_log(&sandbox, reason).await;
        // Out of the roster first: from here on the data plane answers
        // not-found, and a heartbeat no longer claims it.
        if let Ok(mut h) = self.hosted.write() {
            h.remove(id);
            self.metrics.sandboxes.set(h.len() as i64);
        }
        let egress = sandbox.egress.lock().ok().and_then(|mut e| e.take());
        if let Some(e) = egress {
            e.detach().await;
        }
        self.cleanup(&sandbox.paths, Some(&sandbox.handle), id)
            .await;
        // Gone for good unless it moved (an orphan here): what its pauses
        // left in the store goes too.
        if reason != ORPHAN {
            if sandbox.halted {
                self.forget_paused(id, Some(sandbox.info.generation), true);
            }
            self.remove_layers(&sandbox.own_layers);
        }
        self.metrics.deletes.inc();
        let logs = self.end_log(id);
        let _ = self.events.send(Event {
            sandbox_id: id.to_string(),
            generation: sandbox.info.generation,
            kind: EventKind::Delete,
            logs: logs.clone(),
        });
        tracing::info!(sandbox_id = %id, generation = sandbox.info.generation, reason, "sandbox deleted");
        Ok((sandbox.info.clone(), logs))
    }

    fn emit(&self, id: &str, generation: u64, kind: EventKind) {
        let _ = self.events.send(Event {
            sandbox_id: id.to_string(),
            generation,
            kind,
            logs: Vec::new(),
        });
    }

    /// The directory holding every sandbox.
    pub fn sandboxes_dir(&self) -> &Path {
        &self.sandboxes_dir
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with(record: serde_json::Value) -> CreateSandbox {
        CreateSandbox {
            template_record: Some(record),
            ..Default::default()
        }
    }

    #[test]
    fn a_handed_record_is_checked() {
        let digest = format!("sha256-{}", "a".repeat(64));
        let good = serde_json::json!({
            "name": "base", "digest": digest, "defaults": {}, "created_at_ms": 1
        });
        let t = template_record(&with(good.clone())).unwrap().unwrap();
        assert_eq!(t.digest, digest);
        assert!(template_record(&CreateSandbox::default())
            .unwrap()
            .is_none());
        let mut bad = Vec::new();
        let mut v = good.clone();
        v["digest"] = "sha256-../../etc".into();
        bad.push((v, "digest"));
        let mut v = good.clone();
        v["layers"] = serde_json::json!(["nope"]);
        bad.push((v, "nope"));
        let mut v = good.clone();
        v["name"] = "../x".into();
        bad.push((v, "name"));
        let mut v = good.clone();
        v["layers"] = serde_json::json!(vec![digest.clone(); runtime::isolated::MAX_LAYERS + 1]);
        bad.push((v, "layers"));
        bad.push((serde_json::json!("text"), "template_record"));
        for (v, what) in bad {
            match template_record(&with(v.clone())) {
                Err(NodeError::BadRequest(m)) => {
                    assert!(m.starts_with("template_record"), "{what}: {m}")
                }
                other => panic!("{what}: {v} gave {other:?}"),
            }
        }
    }
}
