//! [`CachedResolver`]: the gateway's route cache.
//!
//! A compact table `sandbox id → route`, built to hold a million routes in
//! well under 100 bytes each (docs/benchmarks.md, "Route cache with a
//! million sandboxes"):
//!
//! - **Sharded**: up to [`MAX_SHARDS`] shards (a power of two, about one per
//!   [`ROUTES_PER_SHARD`] of capacity), each a `parking_lot` mutex over a
//!   dense slab of fixed-size [`Slot`]s and a `hashbrown` index of `u32`
//!   slab positions. No per-entry allocation.
//! - **Fixed-size ids**: a sandbox id (`[a-z0-9]`) of up to [`INLINE_ID_LEN`]
//!   characters is packed six bits a character into 24 bytes ([`Key`]);
//!   warren's ids are 20. An id that does not pack (longer, or a character
//!   a sandbox id cannot have) is resolved uncached, every time: correct,
//!   only slower, and no generated id takes that path.
//! - **Interned parts**: a slot holds the generation, state and insertion
//!   time inline and the node (id + endpoint) and team as `u32` indices into
//!   its shard's reference-counted pools, so a few nodes and teams are
//!   stored once per shard however many routes name them.
//! - **Positive only** (ARCHITECTURE.md, "Positive caching only"): filled by a
//!   successful `LookupNode` or by [`Resolver::learn`] (create, fork, a
//!   refetch that found a move). NotFound and errors are never stored.
//! - **TTL that never renews**: the insertion instant (tokio's clock, so
//!   paused-clock tests are exact, kept as nanoseconds after the cache's
//!   creation) is checked on every read, and an entry older than the TTL is
//!   dropped there (`reason="ttl"`). Entries nobody reads again are dropped
//!   by the eviction sweep when their shard is full (also `reason="ttl"`);
//!   until then they only hold their slot, which the capacity bounds.
//! - **Bounded**: each shard holds its share of `capacity` (the shares add
//!   up to it exactly). A full shard makes room with CLOCK (second chance):
//!   a hand walks the slab; an expired slot is taken first, a slot read since
//!   the hand last passed is spared once (its bit cleared), the first other
//!   one is evicted (`reason="capacity"`) and reused in place. CLOCK needs
//!   one bit a slot and no list to relink on a hit (which an LRU would,
//!   under the lock, on every request), and keeps the hot routes a random
//!   or FIFO choice would drop. Shards fill unevenly, so a cache can start
//!   evicting a little before it holds `capacity` routes in all.
//! - **Coalesced misses**: a miss registers an in-flight lookup in its
//!   shard; concurrent misses for the id join it (`_coalesced_total`)
//!   rather than asking the scheduler again. The lookup runs as its own
//!   task, so it finishes (and is cleaned up) even when every request that
//!   waited for it went away.
//! - **Conditional evictions**: a stale signal or a watch change removes an
//!   entry only if it is not newer than what the signal is about, checked
//!   and done under the shard's lock, so atomically per key; a route
//!   another request just refreshed survives a late signal about the old
//!   one. A signal about an id whose lookup is in flight (and a
//!   [`Resolver::learn`] or a flush meanwhile) keeps that lookup's answer out
//!   of the cache: it may predate the change.

use super::{CachedView, EvictReason, ResolveError, Resolver, ResolverStatus, Route, RouteSource};
use crate::metrics::Metrics;
use futures_util::future::{BoxFuture, FutureExt};
use parking_lot::Mutex;
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use warren_core::admin::Admin;

/// Route cache settings (`--route-cache-capacity`, `--route-cache-ttl`,
/// `--route-cache-watch`).
#[derive(Debug, Clone, Copy)]
pub struct CacheSettings {
    /// Most routes kept (> 0; 0 means no cache at all and is handled by
    /// [`UncachedResolver`](super::UncachedResolver)).
    pub capacity: u64,
    /// Longest a route is served after it was cached (> 0).
    pub ttl: Duration,
    /// Whether a `WatchBindings` task keeps the cache in step.
    pub watch: bool,
}

#[path = "cache_shard.rs"]
mod shard;
use shard::*;

/// What clones of a [`CachedResolver`] share.
struct Inner {
    shards: Box<[Mutex<Shard>]>,
    /// `shards.len() - 1`.
    mask: usize,
    /// Asked on a miss and for refetches.
    source: Arc<dyn RouteSource>,
    settings: CacheSettings,
    /// The TTL in nanoseconds.
    ttl: u64,
    /// Insertion times count from here (tokio's clock).
    base: Instant,
    metrics: Metrics,
}

impl Inner {
    fn shard(&self, hash: u64) -> &Mutex<Shard> {
        // Bits hashbrown uses neither for buckets (low) nor tags (top 7).
        &self.shards[(hash >> 32) as usize & self.mask]
    }

    fn now(&self) -> u64 {
        u64::try_from(Instant::now().duration_since(self.base).as_nanos()).unwrap_or(u64::MAX)
    }

    /// The end of the lookup `token` for `key`: the entry leaves the
    /// in-flight table, and a route found is cached unless something about
    /// the id happened meanwhile.
    fn complete(&self, key: Key, hash: u64, token: u64, route: Option<&Route>) {
        let evicted = {
            let mut shard = self.shard(hash).lock();
            let Ok(entry) = shard
                .pending
                .find_entry(hash, |p| p.key == key && p.token == token)
            else {
                return;
            };
            let (pending, _) = entry.remove();
            match route {
                Some(route) if !pending.tainted => {
                    let now = self.now();
                    shard.insert(key, hash, route, now, self.ttl)
                }
                _ => None,
            }
        };
        if let Some(reason) = evicted {
            self.metrics.evicted(reason, 1);
        }
    }

    fn len(&self) -> usize {
        self.shards.iter().map(|s| s.lock().slots.len()).sum()
    }
}

/// Ends a lookup's in-flight entry however its task ends (answered,
/// panicked or cancelled with the runtime).
struct Completion {
    inner: Arc<Inner>,
    key: Key,
    hash: u64,
    token: u64,
    done: bool,
}

impl Completion {
    fn finish(mut self, route: Option<&Route>) {
        self.done = true;
        self.inner.complete(self.key, self.hash, self.token, route);
    }
}

impl Drop for Completion {
    fn drop(&mut self) {
        if !self.done {
            self.inner.complete(self.key, self.hash, self.token, None);
        }
    }
}

/// The caching resolver. Clones share the cache.
#[derive(Clone)]
pub struct CachedResolver {
    inner: Arc<Inner>,
    /// Hit/miss/eviction counters, and the watch's gauges.
    pub(super) metrics: Metrics,
}

impl CachedResolver {
    /// An empty cache in front of `source`. Nothing is allocated for the
    /// capacity up front: shards grow as routes arrive.
    pub fn new(settings: CacheSettings, source: Arc<dyn RouteSource>, metrics: Metrics) -> Self {
        let capacity = settings.capacity.max(1);
        let wanted = usize::try_from(capacity / ROUTES_PER_SHARD)
            .unwrap_or(MAX_SHARDS)
            .clamp(1, MAX_SHARDS);
        // The largest power of two not above `wanted`.
        let n = 1usize << (usize::BITS - 1 - wanted.leading_zeros());
        let n_u64 = n as u64;
        let shards = (0..n_u64)
            .map(|i| {
                let share = capacity / n_u64 + u64::from(i < capacity % n_u64);
                Mutex::new(Shard::new(usize::try_from(share).unwrap_or(usize::MAX)))
            })
            .collect();
        let inner = Inner {
            shards,
            mask: n - 1,
            source,
            settings,
            ttl: u64::try_from(settings.ttl.as_nanos()).unwrap_or(u64::MAX),
            base: Instant::now(),
            metrics: metrics.clone(),
        };
        CachedResolver {
            inner: Arc::new(inner),
            metrics,
        }
    }

    /// Exposes `warren_gateway_route_cache_entries`, read at each scrape.
    pub fn register_gauge(&self, admin: &Admin) {
        if let Ok(mut reg) = admin.registry.write() {
            reg.register_collector(Box::new(EntriesGauge(self.inner.clone())));
        }
    }

    /// Drops every entry: the watch lost track of changes it cannot replay.
    /// Lookups in flight answer their requests but cache nothing.
    pub async fn flush(&self, reason: EvictReason) {
        let n: usize = self.inner.shards.iter().map(|s| s.lock().clear()).sum();
        if n > 0 {
            self.metrics.evicted(reason, n as u64);
        }
        tracing::info!(entries = n, "route cache flushed");
    }

    /// Removes the entry for `id` when `stale(cached route, cached at)`
    /// says so, as one atomic step for that key (under its shard's lock).
    /// True when something was removed. A lookup in flight for `id` will
    /// not cache its answer either way.
    pub(super) async fn remove_if(
        &self,
        id: &str,
        reason: EvictReason,
        stale: impl FnOnce(&Route, Instant) -> bool,
    ) -> bool {
        let Some(key) = Key::pack(id) else {
            return false;
        };
        let hash = key.hash();
        let removed = {
            let mut shard = self.inner.shard(hash).lock();
            shard.taint(key, hash);
            match shard.find(key, hash) {
                Some(i) => {
                    let inserted = self.inner.base + Duration::from_nanos(shard.slots[i].inserted);
                    if stale(&shard.route(i, id), inserted) {
                        shard.remove_at(i);
                        true
                    } else {
                        false
                    }
                }
                None => false,
            }
        };
        if removed {
            self.metrics.evicted(reason, 1);
        }
        removed
    }

    /// Entries right now.
    #[cfg(test)]
    async fn len(&self) -> u64 {
        self.inner.len() as u64
    }

    /// Distinct (nodes, teams) interned, summed over the shards.
    #[cfg(test)]
    fn interned(&self) -> (usize, usize) {
        self.inner.shards.iter().fold((0, 0), |(n, t), s| {
            let s = s.lock();
            (n + s.nodes.len(), t + s.teams.len())
        })
    }

    /// Slab capacity (allocated slots), summed over the shards.
    #[cfg(test)]
    fn allocated(&self) -> usize {
        self.inner
            .shards
            .iter()
            .map(|s| s.lock().slots.capacity())
            .sum()
    }

    async fn resolve_inner(&self, id: &str) -> Result<Arc<Route>, ResolveError> {
        let Some(key) = Key::pack(id) else {
            // Not a shape the table holds: always asked, never cached.
            self.metrics.cache_misses.inc();
            return self.inner.source.lookup(id).await.map(Arc::new);
        };
        let hash = key.hash();
        let now = self.inner.now();
        let ttl = self.inner.ttl;
        let shared = {
            let mut guard = self.inner.shard(hash).lock();
            let shard = &mut *guard;
            match shard.read(key, hash, now, ttl) {
                Found::Fresh(i) => {
                    shard.slots[i].referenced = true;
                    let route = shard.route(i, id);
                    drop(guard);
                    self.metrics.cache_hits.inc();
                    return Ok(Arc::new(route));
                }
                Found::Expired(i) => {
                    shard.remove_at(i);
                    self.metrics.evicted(EvictReason::Ttl, 1);
                }
                Found::Absent => {}
            }
            self.metrics.cache_misses.inc();
            if let Some(p) = shard.pending.find(hash, |p| p.key == key) {
                // Another request's lookup answers this one.
                self.metrics.cache_coalesced.inc();
                p.shared.clone()
            } else {
                let token = shard.next_token;
                shard.next_token = token.wrapping_add(1);
                let (tx, rx) = tokio::sync::oneshot::channel();
                let owned = id.to_string();
                let shared = async move {
                    rx.await.unwrap_or_else(|_| {
                        Err(ResolveError {
                            sandbox_id: owned,
                            status: tonic::Status::unavailable("route lookup did not finish"),
                        })
                    })
                }
                .boxed()
                .shared();
                shard.pending.insert_unique(
                    hash,
                    Pending {
                        key,
                        token,
                        shared: shared.clone(),
                        tainted: false,
                    },
                    |p| p.key.hash(),
                );
                drop(guard);
                // Spawned with the lock released: a runtime that is shutting
                // down drops the task at once, and its completion locks.
                self.spawn_lookup(id, key, hash, token, tx);
                shared
            }
        };
        shared.await
    }

    /// Starts the lookup for a miss as its own task, which caches the
    /// answer and then hands it to the waiting requests through `tx`.
    fn spawn_lookup(
        &self,
        id: &str,
        key: Key,
        hash: u64,
        token: u64,
        tx: tokio::sync::oneshot::Sender<LookupResult>,
    ) {
        let completion = Completion {
            inner: self.inner.clone(),
            key,
            hash,
            token,
            done: false,
        };
        let id = id.to_string();
        tokio::spawn(async move {
            let result = completion.inner.source.lookup(&id).await.map(Arc::new);
            completion.finish(result.as_deref().ok());
            // Nobody waiting any more is fine: the route is cached.
            let _ = tx.send(result);
        });
    }
}

impl Resolver for CachedResolver {
    fn resolve<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>> {
        Box::pin(self.resolve_inner(sandbox_id))
    }

    fn lookup_uncached<'a>(
        &'a self,
        sandbox_id: &'a str,
    ) -> BoxFuture<'a, Result<Arc<Route>, ResolveError>> {
        Box::pin(async move {
            self.inner
                .source
                .lookup_consistent(sandbox_id)
                .await
                .map(Arc::new)
        })
    }

    fn evict<'a>(&'a self, route: &'a Route, reason: EvictReason) -> BoxFuture<'a, ()> {
        Box::pin(async move {
            // Generations only grow, so an entry at or below the one proven
            // wrong is wrong too; a newer one was put there by someone who
            // already knows better.
            self.remove_if(&route.sandbox_id, reason, |cached, _| {
                cached.generation <= route.generation
            })
            .await;
        })
    }

    fn learn(&self, route: Arc<Route>) -> BoxFuture<'_, ()> {
        Box::pin(async move {
            let Some(key) = Key::pack(&route.sandbox_id) else {
                return;
            };
            let hash = key.hash();
            let now = self.inner.now();
            let evicted = {
                let mut shard = self.inner.shard(hash).lock();
                // What this gateway just did is newer than what a lookup in
                // flight will answer.
                shard.taint(key, hash);
                shard.insert(key, hash, &route, now, self.inner.ttl)
            };
            if let Some(reason) = evicted {
                self.metrics.evicted(reason, 1);
            }
        })
    }

    fn cached<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Option<CachedView>> {
        Box::pin(async move {
            let key = Key::pack(sandbox_id)?;
            let hash = key.hash();
            let now = self.inner.now();
            let (route, inserted) = {
                let shard = self.inner.shard(hash).lock();
                let i = shard.find(key, hash)?;
                (shard.route(i, sandbox_id), shard.slots[i].inserted)
            };
            let age = Duration::from_nanos(now.saturating_sub(inserted));
            Some(CachedView {
                route: Arc::new(route),
                age,
                ttl_left: self.inner.settings.ttl.saturating_sub(age),
            })
        })
    }

    fn status(&self) -> ResolverStatus {
        let settings = &self.inner.settings;
        let watch = match (settings.watch, self.metrics.watch_connected.get()) {
            (false, _) => "off",
            (true, 1) => "connected",
            (true, _) => "disconnected",
        };
        ResolverStatus {
            enabled: true,
            capacity: settings.capacity,
            ttl_ms: u64::try_from(settings.ttl.as_millis()).unwrap_or(u64::MAX),
            watch,
            revision: u64::try_from(self.metrics.watch_revision.get()).unwrap_or(0),
        }
    }
}

/// `warren_gateway_route_cache_entries`, counted at scrape time (exact:
/// each shard is read under its lock).
struct EntriesGauge(Arc<Inner>);

impl std::fmt::Debug for EntriesGauge {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("EntriesGauge")
    }
}

impl prometheus_client::collector::Collector for EntriesGauge {
    fn encode(
        &self,
        mut encoder: prometheus_client::encoding::DescriptorEncoder<'_>,
    ) -> Result<(), std::fmt::Error> {
        use prometheus_client::encoding::EncodeMetric;
        let gauge = prometheus_client::metrics::gauge::ConstGauge::new(
            i64::try_from(self.0.len()).unwrap_or(i64::MAX),
        );
        let metric = encoder.encode_descriptor(
            "route_cache_entries",
            "Routes in the cache now",
            None,
            gauge.metric_type(),
        )?;
        gauge.encode(metric)
    }
}

#[cfg(test)]
#[path = "cache_tests.rs"]
mod tests;
