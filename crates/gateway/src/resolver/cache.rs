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
use futures_util::future::{BoxFuture, FutureExt, Shared};
use hashbrown::HashTable;
use parking_lot::Mutex;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash};
use std::sync::Arc;
use std::time::Duration;
use tokio::time::Instant;
use warren_core::admin::Admin;
use warren_proto::scheduler::v1::BindingState;

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

/// Most shards a cache is split into.
pub(super) const MAX_SHARDS: usize = 64;
/// Capacity per shard below which a cache has fewer shards (a small cache
/// is one shard, and its bound is exact in every respect).
pub(super) const ROUTES_PER_SHARD: u64 = 1024;
/// Longest sandbox id kept in the cache: ten six-bit characters per `u64`.
pub(super) const INLINE_ID_LEN: usize = 30;

/// A sandbox id packed six bits a character (`0` is padding, so ids that
/// differ only in trailing padding cannot collide).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(super) struct Key([u64; 3]);

impl Key {
    /// The packed id, or `None` when it does not fit (empty, longer than
    /// [`INLINE_ID_LEN`], or a character outside `[a-z0-9]`).
    pub(super) fn pack(id: &str) -> Option<Key> {
        let bytes = id.as_bytes();
        if bytes.is_empty() || bytes.len() > INLINE_ID_LEN {
            return None;
        }
        let mut words = [0u64; 3];
        for (i, b) in bytes.iter().enumerate() {
            let code = match b {
                b'0'..=b'9' => b - b'0' + 1,
                b'a'..=b'z' => b - b'a' + 11,
                _ => return None,
            };
            words[i / 10] |= u64::from(code) << ((i % 10) * 6);
        }
        Some(Key(words))
    }

    /// A 64-bit hash (folded multiplies, fixed constants: the same in
    /// every process, so a simulation replays). The ids in the table are
    /// the scheduler's random ones; nobody chooses them.
    fn hash(&self) -> u64 {
        const K0: u64 = 0x243f_6a88_85a3_08d3;
        const K1: u64 = 0x1319_8a2e_0370_7344;
        const K2: u64 = 0xa409_3822_299f_31d0;
        let h = fold(self.0[0] ^ K0, self.0[1] ^ K1);
        fold(h ^ self.0[2], K2)
    }
}

fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The hash of interned strings: SipHash with fixed keys (deterministic;
/// only the miss path interns).
fn hash_str<T: Hash + ?Sized>(v: &T) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(v)
}

/// One cached route: 56 bytes, no pointers.
#[derive(Debug, Clone, Copy)]
struct Slot {
    key: Key,
    generation: u64,
    /// When it was cached, in nanoseconds after [`Inner::base`] (never
    /// moved by reads).
    inserted: u64,
    /// Into the shard's node pool: node id and endpoint.
    node: u32,
    /// Into the shard's team pool.
    team: u32,
    /// `BindingState` as on the wire.
    state: i32,
    auto_resume: bool,
    /// CLOCK's bit: read since the hand last passed.
    referenced: bool,
}

/// Reference-counted interned values, indexed by `u32`.
struct Pool<T> {
    index: HashTable<u32>,
    items: Vec<Option<Pooled<T>>>,
    free: Vec<u32>,
}

struct Pooled<T> {
    value: T,
    hash: u64,
    refs: u32,
}

impl<T> Pool<T> {
    fn new() -> Self {
        Pool {
            index: HashTable::new(),
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    /// The index of the value `eq` recognises (hashing to `hash`), made by
    /// `make` if the pool has none; one more reference to it.
    fn intern(&mut self, hash: u64, eq: impl Fn(&T) -> bool, make: impl FnOnce() -> T) -> u32 {
        let Pool { index, items, free } = self;
        let found = index.find(hash, |&i| {
            items[i as usize]
                .as_ref()
                .is_some_and(|p| p.hash == hash && eq(&p.value))
        });
        if let Some(&i) = found {
            if let Some(p) = items[i as usize].as_mut() {
                p.refs += 1;
            }
            return i;
        }
        let pooled = Some(Pooled {
            value: make(),
            hash,
            refs: 1,
        });
        let i = match free.pop() {
            Some(i) => {
                items[i as usize] = pooled;
                i
            }
            None => {
                items.push(pooled);
                u32::try_from(items.len() - 1).unwrap_or(u32::MAX)
            }
        };
        index.insert_unique(hash, i, |&j| {
            items[j as usize].as_ref().map_or(0, |p| p.hash)
        });
        i
    }

    fn get(&self, i: u32) -> Option<&T> {
        self.items
            .get(i as usize)
            .and_then(Option::as_ref)
            .map(|p| &p.value)
    }

    /// One reference fewer; the value is dropped with its last.
    fn release(&mut self, i: u32) {
        let Some(Some(p)) = self.items.get_mut(i as usize) else {
            return;
        };
        p.refs -= 1;
        if p.refs > 0 {
            return;
        }
        let hash = p.hash;
        if let Ok(e) = self.index.find_entry(hash, |&j| j == i) {
            e.remove();
        }
        self.items[i as usize] = None;
        self.free.push(i);
    }

    /// Distinct values held.
    #[cfg(test)]
    fn len(&self) -> usize {
        self.index.len()
    }

    fn clear(&mut self) {
        self.index.clear();
        self.items.clear();
        self.free.clear();
    }
}

/// A node as routes name it.
struct NodeAddr {
    node_id: Box<str>,
    endpoint: Box<str>,
}

type LookupResult = Result<Arc<Route>, ResolveError>;
type SharedLookup = Shared<BoxFuture<'static, LookupResult>>;

/// A lookup in flight, joined by the misses for its id.
struct Pending {
    key: Key,
    /// Tells this lookup from a later one for the same id.
    token: u64,
    shared: SharedLookup,
    /// Something about the id happened meanwhile: do not cache the answer.
    tainted: bool,
}

/// One shard: its routes, their interned parts and its lookups in flight.
struct Shard {
    /// Key hash → position in `slots`.
    index: HashTable<u32>,
    /// Dense: removals move the last slot into the hole.
    slots: Vec<Slot>,
    /// Most slots held.
    capacity: usize,
    /// CLOCK's hand, a position in `slots`.
    hand: usize,
    nodes: Pool<NodeAddr>,
    teams: Pool<Box<str>>,
    pending: HashTable<Pending>,
    next_token: u64,
}

/// What a read found.
enum Found {
    Fresh(usize),
    Expired(usize),
    Absent,
}

impl Shard {
    fn new(capacity: usize) -> Self {
        Shard {
            index: HashTable::new(),
            slots: Vec::new(),
            capacity,
            hand: 0,
            nodes: Pool::new(),
            teams: Pool::new(),
            pending: HashTable::new(),
            next_token: 0,
        }
    }

    fn find(&self, key: Key, hash: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slots[i as usize].key == key)
            .map(|&i| i as usize)
    }

    fn read(&self, key: Key, hash: u64, now: u64, ttl: u64) -> Found {
        match self.find(key, hash) {
            Some(i) if now.saturating_sub(self.slots[i].inserted) < ttl => Found::Fresh(i),
            Some(i) => Found::Expired(i),
            None => Found::Absent,
        }
    }

    /// The route in slot `i`, built from its interned parts.
    fn route(&self, i: usize, sandbox_id: &str) -> Route {
        let s = &self.slots[i];
        let (node_id, endpoint) = self
            .nodes
            .get(s.node)
            .map_or((String::new(), String::new()), |n| {
                (n.node_id.to_string(), n.endpoint.to_string())
            });
        Route {
            sandbox_id: sandbox_id.to_string(),
            node_id,
            endpoint,
            generation: s.generation,
            state: BindingState::try_from(s.state).unwrap_or(BindingState::Unspecified),
            team_id: self
                .teams
                .get(s.team)
                .map(|t| t.to_string())
                .unwrap_or_default(),
            auto_resume: s.auto_resume,
        }
    }

    /// A slot for `route`, its parts interned.
    fn slot(&mut self, key: Key, route: &Route, now: u64) -> Slot {
        let node_hash = hash_str(&(route.node_id.as_str(), route.endpoint.as_str()));
        let node = self.nodes.intern(
            node_hash,
            |n| *n.node_id == *route.node_id && *n.endpoint == *route.endpoint,
            || NodeAddr {
                node_id: route.node_id.as_str().into(),
                endpoint: route.endpoint.as_str().into(),
            },
        );
        let team = self.teams.intern(
            hash_str(route.team_id.as_str()),
            |t| **t == *route.team_id,
            || route.team_id.as_str().into(),
        );
        Slot {
            key,
            generation: route.generation,
            inserted: now,
            node,
            team,
            state: route.state as i32,
            auto_resume: route.auto_resume,
            referenced: false,
        }
    }

    fn release(&mut self, slot: &Slot) {
        self.nodes.release(slot.node);
        self.teams.release(slot.team);
    }

    /// Drops the index's entry for position `i` (whatever key it holds).
    fn unindex(&mut self, i: usize) {
        let hash = self.slots[i].key.hash();
        if let Ok(e) = self.index.find_entry(hash, |&j| j as usize == i) {
            e.remove();
        }
    }

    fn index_at(&mut self, hash: u64, i: usize) {
        let slots = &self.slots;
        self.index
            .insert_unique(hash, u32::try_from(i).unwrap_or(u32::MAX), |&j| {
                slots[j as usize].key.hash()
            });
    }

    /// Removes the slot at `i`, the last one taking its place.
    fn remove_at(&mut self, i: usize) -> Slot {
        self.unindex(i);
        let last = self.slots.len() - 1;
        if i != last {
            let moved_hash = self.slots[last].key.hash();
            if let Some(j) = self.index.find_mut(moved_hash, |&j| j as usize == last) {
                *j = u32::try_from(i).unwrap_or(u32::MAX);
            }
        }
        let slot = self.slots.swap_remove(i);
        self.release(&slot);
        if self.hand >= self.slots.len() {
            self.hand = 0;
        }
        slot
    }

    /// The slot CLOCK gives up for a new route, and why: the first expired
    /// one, or the first not read since the hand last passed. Ends within
    /// one turn and a slot (every bit passed is cleared).
    fn victim(&mut self, now: u64, ttl: u64) -> (usize, EvictReason) {
        let n = self.slots.len();
        for _ in 0..=n {
            let i = self.hand;
            self.hand = (i + 1) % n;
            let s = &mut self.slots[i];
            if now.saturating_sub(s.inserted) >= ttl {
                return (i, EvictReason::Ttl);
            }
            if !s.referenced {
                return (i, EvictReason::Capacity);
            }
            s.referenced = false;
        }
        (self.hand, EvictReason::Capacity)
    }

    /// Caches `route` under `key`, replacing what the id had; a full shard
    /// first gives up a slot. Returns the reason of the eviction it made.
    fn insert(
        &mut self,
        key: Key,
        hash: u64,
        route: &Route,
        now: u64,
        ttl: u64,
    ) -> Option<EvictReason> {
        // Interned first: the old slot's references are released after, so
        // a route that keeps its node never drops the node from the pool.
        let slot = self.slot(key, route, now);
        if let Some(i) = self.find(key, hash) {
            let old = std::mem::replace(&mut self.slots[i], slot);
            self.release(&old);
            return None;
        }
        if self.slots.len() < self.capacity {
            if self.slots.len() == self.slots.capacity() {
                // Doubling, but never past the shard's share.
                let more = self
                    .slots
                    .len()
                    .max(4)
                    .min(self.capacity - self.slots.len());
                self.slots.reserve_exact(more);
            }
            self.slots.push(slot);
            self.index_at(hash, self.slots.len() - 1);
            return None;
        }
        if self.slots.is_empty() {
            // A shard of capacity 0 (never made: every share is ≥ 1).
            self.release(&slot);
            return None;
        }
        let (i, reason) = self.victim(now, ttl);
        self.unindex(i);
        let old = std::mem::replace(&mut self.slots[i], slot);
        self.release(&old);
        self.index_at(hash, i);
        Some(reason)
    }

    /// Keeps the answer of the lookup in flight for `key` (if any) out of
    /// the cache.
    fn taint(&mut self, key: Key, hash: u64) {
        if let Some(p) = self.pending.find_mut(hash, |p| p.key == key) {
            p.tainted = true;
        }
    }

    fn clear(&mut self) -> usize {
        let n = self.slots.len();
        self.slots.clear();
        self.index.clear();
        self.nodes.clear();
        self.teams.clear();
        self.hand = 0;
        for p in self.pending.iter_mut() {
            p.tainted = true;
        }
        n
    }
}

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
        Box::pin(async move { self.inner.source.lookup(sandbox_id).await.map(Arc::new) })
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
