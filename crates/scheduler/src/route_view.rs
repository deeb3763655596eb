//! The route view: every binding's route (the columns `LookupNode` answers
//! with) in memory, so that a lookup is a memory read and not a query.
//!
//! The store stays the truth; the view is a copy kept exact by the change
//! log, the same stream `WatchBindings` follows. The watch hub hands each
//! batch of new change rows to [`RouteView::follow`] *before* it broadcasts
//! them; `follow` re-reads the routes of the sandboxes the batch names from
//! the store (a change row says *that* a binding changed, the row says what
//! it is now) and records the batch's last revision as the view's
//! `applied` revision. Every write to a route column appends a change row
//! in its transaction (`store::sqlstore`), except the insert of a new
//! binding by `Place`: a sandbox the view lacks is read from the store.
//!
//! **Invariant: an answer from the view is never older than what its
//! caller has seen.** [`RouteView::lookup`] answers from memory only when
//! the view has applied at least (a) the revision the caller names (a
//! gateway sends the last `WatchBindings` revision it applied, from any
//! replica) and (b) every revision this process has committed (a gateway
//! that just wrote through this replica reads its own write). Otherwise,
//! for a sandbox the view lacks, while the view is loading, and when the
//! caller asks for a consistent read (a gateway that a node has just
//! proved wrong), the store answers. A replica that is behind therefore
//! answers slower, never staler than what it reported.
//!
//! A store read also repairs the view, but only when no batch was applied
//! since the read began ([`RouteView::repair`]): a read that began before
//! a change committed may be older than that change's re-read.
//!
//! At start the view loads every binding in pages, concurrently with the
//! hub: the hub starts from the head revision read before the load's first
//! page (so every page shows at least that), and a sandbox the hub has
//! touched meanwhile is not overwritten by the (possibly older) page.

use crate::error::Result;
use crate::metrics::Metrics;
use crate::store::{Change, RouteRow, SqlStore, State};
use parking_lot::{Mutex, RwLock};
use std::collections::{HashMap, HashSet};
use std::sync::atomic::{AtomicBool, AtomicU64, Ordering};
use std::sync::Arc;
use std::time::{Duration, Instant};

/// Independent locks over the routes (a power of two).
const SHARDS: usize = 16;
/// Routes read per page while loading.
const LOAD_PAGE: u32 = 4096;
/// Pause after a failed page before reading it again.
const LOAD_RETRY: Duration = Duration::from_millis(500);

/// What a lookup needs the answer to reflect.
#[derive(Debug, Clone, Copy, Default)]
pub struct Freshness {
    /// The newest change-log revision the caller has seen; the answer
    /// reflects at least that.
    pub min_revision: u64,
    /// Read the store, not the view.
    pub consistent: bool,
}

/// One route, its strings interned ([`Names`]): 24 bytes beside its id.
#[derive(Debug, Clone, Copy)]
struct Entry {
    generation: u64,
    node: u32,
    endpoint: u32,
    team: u32,
    state: State,
    auto_resume: bool,
}

/// The few distinct node ids, endpoints and team ids, each stored once.
/// Never shrinks: it holds what nodes and teams the process has seen.
#[derive(Default)]
struct Names {
    index: HashMap<Arc<str>, u32>,
    names: Vec<Arc<str>>,
}

impl Names {
    fn intern(&mut self, name: &str) -> u32 {
        if let Some(&i) = self.index.get(name) {
            return i;
        }
        let i = u32::try_from(self.names.len()).unwrap_or(u32::MAX);
        let name: Arc<str> = Arc::from(name);
        self.names.push(name.clone());
        self.index.insert(name, i);
        i
    }

    fn get(&self, i: u32) -> String {
        self.names
            .get(i as usize)
            .map(|n| n.to_string())
            .unwrap_or_default()
    }
}

type Shard = RwLock<HashMap<Box<str>, Entry>>;

/// The in-memory copy of every binding's route. Shared by the watch hub
/// (which keeps it up to date) and the service (which reads it).
pub struct RouteView {
    /// False with `--lookup-view false`: every lookup reads the store.
    enabled: bool,
    shards: Box<[Shard]>,
    names: RwLock<Names>,
    /// Every change with a revision up to this one is in the view.
    applied: AtomicU64,
    /// Bumped when a batch starts being applied (see [`RouteView::repair`]).
    epoch: AtomicU64,
    /// True once the load at start has finished.
    ready: AtomicBool,
    /// While loading: the sandboxes the hub has applied, which the load's
    /// pages must not overwrite. `None` once loaded.
    touched: Mutex<Option<HashSet<Box<str>>>>,
    metrics: Metrics,
}

impl RouteView {
    /// An empty view; [`RouteView::load`] fills it. Disabled, it stays
    /// empty and every lookup reads the store.
    pub fn new(enabled: bool, metrics: Metrics) -> RouteView {
        RouteView {
            enabled,
            shards: (0..SHARDS).map(|_| Shard::default()).collect(),
            names: RwLock::new(Names::default()),
            applied: AtomicU64::new(0),
            epoch: AtomicU64::new(0),
            ready: AtomicBool::new(false),
            touched: Mutex::new(Some(HashSet::new())),
            metrics,
        }
    }

    /// Whether lookups can be answered from memory yet.
    pub fn ready(&self) -> bool {
        self.ready.load(Ordering::Acquire)
    }

    /// The revision every change up to which the view has applied.
    pub fn applied(&self) -> u64 {
        self.applied.load(Ordering::Acquire)
    }

    /// Where `sandbox_id` is, reflecting at least `want` (see the module
    /// docs): from memory when the view is that fresh and holds it, else
    /// from the store.
    pub async fn lookup(
        &self,
        store: &SqlStore,
        sandbox_id: &str,
        want: Freshness,
    ) -> Result<Option<RouteRow>> {
        if self.ready() && !want.consistent {
            let need = want.min_revision.max(store.committed_revision());
            if self.applied() >= need {
                if let Some(row) = self.get(sandbox_id) {
                    self.metrics.lookup_answered(true);
                    return Ok(Some(row));
                }
            }
        }
        let epoch = self.epoch.load(Ordering::Acquire);
        let row = store.route(sandbox_id).await?;
        self.repair(sandbox_id, row.as_ref(), epoch);
        self.metrics.lookup_answered(false);
        Ok(row)
    }

    /// Applies a batch of change rows the hub read: re-reads the routes of
    /// the sandboxes they name and stores them (or drops those that are
    /// gone), then records the batch's last revision. On error nothing is
    /// recorded; the hub reads the batch again.
    pub async fn follow(&self, store: &SqlStore, batch: &[Arc<Change>]) -> Result<()> {
        let Some(last) = batch.last().map(|c| c.revision) else {
            return Ok(());
        };
        if !self.enabled {
            self.applied.store(last, Ordering::Release);
            return Ok(());
        }
        self.epoch.fetch_add(1, Ordering::AcqRel);
        let mut seen = HashSet::with_capacity(batch.len());
        let ids: Vec<String> = batch
            .iter()
            .filter(|c| seen.insert(c.sandbox_id.as_str()))
            .map(|c| c.sandbox_id.clone())
            .collect();
        let rows = store.routes(ids.clone()).await?;
        let mut touched = self.touched.lock();
        let mut found = HashSet::with_capacity(rows.len());
        for row in &rows {
            found.insert(row.sandbox_id.as_str());
            self.put(row);
        }
        for id in &ids {
            if !found.contains(id.as_str()) {
                self.remove(id);
            }
            if let Some(t) = touched.as_mut() {
                t.insert(id.as_str().into());
            }
        }
        drop(touched);
        self.applied.store(last, Ordering::Release);
        Ok(())
    }

    /// The hub starts from revision `head`: everything up to it is in the
    /// store the load reads.
    pub fn start_at(&self, head: u64) {
        self.applied.store(head, Ordering::Release);
    }

    /// Reads every binding's route from the store, page after page, then
    /// serves lookups from memory. Retries a failed page until `stop`.
    pub async fn load(&self, store: &SqlStore, stop: tokio::sync::watch::Receiver<bool>) {
        if !self.enabled {
            return;
        }
        let started = Instant::now();
        let mut after = String::new();
        let mut loaded = 0u64;
        loop {
            if *stop.borrow() {
                return;
            }
            let page = match store.route_page(after.clone(), LOAD_PAGE).await {
                Ok(page) => page,
                Err(e) => {
                    tracing::warn!(error = %e, "route view: cannot read the bindings; retrying");
                    tokio::time::sleep(LOAD_RETRY).await;
                    continue;
                }
            };
            let full = page.len() == LOAD_PAGE as usize;
            {
                let touched = self.touched.lock();
                for row in &page {
                    let hub_has_it = touched
                        .as_ref()
                        .is_some_and(|t| t.contains(row.sandbox_id.as_str()));
                    if !hub_has_it {
                        self.put(row);
                    }
                }
            }
            loaded += page.len() as u64;
            match page.last() {
                Some(last) if full => after = last.sandbox_id.clone(),
                _ => break,
            }
            // Let lookups and the hub in between pages.
            tokio::task::yield_now().await;
        }
        *self.touched.lock() = None;
        self.ready.store(true, Ordering::Release);
        self.metrics.route_view_ready(true);
        tracing::info!(
            routes = loaded,
            took_ms = started.elapsed().as_millis() as u64,
            "route view loaded; lookups are answered from memory"
        );
    }

    /// Stores what a store read found (or drops what it did not), unless
    /// a batch has started being applied since the read began (`epoch`
    /// then differs): that batch's re-read may be newer than this read.
    /// Reads that began after a change committed see it; a change that
    /// commits after the read is applied later by the hub, over this.
    fn repair(&self, sandbox_id: &str, row: Option<&RouteRow>, epoch: u64) {
        if !self.ready() {
            return;
        }
        let entry = row.map(|row| self.entry(row));
        let mut routes = self.shards[shard_of(sandbox_id)].write();
        if self.epoch.load(Ordering::Acquire) != epoch {
            return;
        }
        match row.zip(entry) {
            Some((row, entry)) => {
                if routes
                    .insert(row.sandbox_id.as_str().into(), entry)
                    .is_none()
                {
                    self.metrics.route_view_routes(1);
                }
            }
            None => {
                if routes.remove(sandbox_id).is_some() {
                    self.metrics.route_view_routes(-1);
                }
            }
        }
    }

    fn get(&self, sandbox_id: &str) -> Option<RouteRow> {
        let entry = *self.shards[shard_of(sandbox_id)].read().get(sandbox_id)?;
        let names = self.names.read();
        Some(RouteRow {
            sandbox_id: sandbox_id.to_string(),
            node_id: names.get(entry.node),
            endpoint: names.get(entry.endpoint),
            generation: entry.generation,
            state: entry.state,
            team_id: names.get(entry.team),
            auto_resume: entry.auto_resume,
        })
    }

    fn entry(&self, row: &RouteRow) -> Entry {
        {
            let names = self.names.read();
            let known = |n: &str| names.index.get(n).copied();
            if let (Some(node), Some(endpoint), Some(team)) = (
                known(&row.node_id),
                known(&row.endpoint),
                known(&row.team_id),
            ) {
                return Entry {
                    generation: row.generation,
                    node,
                    endpoint,
                    team,
                    state: row.state,
                    auto_resume: row.auto_resume,
                };
            }
        }
        let mut names = self.names.write();
        Entry {
            generation: row.generation,
            node: names.intern(&row.node_id),
            endpoint: names.intern(&row.endpoint),
            team: names.intern(&row.team_id),
            state: row.state,
            auto_resume: row.auto_resume,
        }
    }

    fn put(&self, row: &RouteRow) {
        let entry = self.entry(row);
        let mut routes = self.shards[shard_of(&row.sandbox_id)].write();
        if routes
            .insert(row.sandbox_id.as_str().into(), entry)
            .is_none()
        {
            self.metrics.route_view_routes(1);
        }
    }

    fn remove(&self, sandbox_id: &str) {
        let mut routes = self.shards[shard_of(sandbox_id)].write();
        if routes.remove(sandbox_id).is_some() {
            self.metrics.route_view_routes(-1);
        }
    }
}

/// The shard of an id: FNV-1a, fixed, so a run's layout does not depend on
/// the process.
fn shard_of(sandbox_id: &str) -> usize {
    let mut h: u32 = 0x811c_9dc5;
    for b in sandbox_id.bytes() {
        h = (h ^ u32::from(b)).wrapping_mul(0x0100_0193);
    }
    h as usize & (SHARDS - 1)
}
