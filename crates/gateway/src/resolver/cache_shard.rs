//! The route cache's storage: packed ids, interned nodes and teams, and
//! the shards of fixed-size slots [`super::CachedResolver`] keeps routes
//! in (see the module doc of `cache.rs`).

use super::{EvictReason, ResolveError, Route};
use futures_util::future::{BoxFuture, Shared};
use hashbrown::HashTable;
use std::hash::{BuildHasher, BuildHasherDefault, DefaultHasher, Hash};
use std::sync::Arc;
use warren_proto::scheduler::v1::BindingState;

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
    pub(super) fn hash(&self) -> u64 {
        const K0: u64 = 0x243f_6a88_85a3_08d3;
        const K1: u64 = 0x1319_8a2e_0370_7344;
        const K2: u64 = 0xa409_3822_299f_31d0;
        let h = fold(self.0[0] ^ K0, self.0[1] ^ K1);
        fold(h ^ self.0[2], K2)
    }
}

pub(super) fn fold(a: u64, b: u64) -> u64 {
    let p = u128::from(a) * u128::from(b);
    (p as u64) ^ ((p >> 64) as u64)
}

/// The hash of interned strings: SipHash with fixed keys (deterministic;
/// only the miss path interns).
pub(super) fn hash_str<T: Hash + ?Sized>(v: &T) -> u64 {
    BuildHasherDefault::<DefaultHasher>::default().hash_one(v)
}

/// One cached route: 56 bytes, no pointers.
#[derive(Debug, Clone, Copy)]
pub(super) struct Slot {
    pub(super) key: Key,
    pub(super) generation: u64,
    /// When it was cached, in nanoseconds after [`Inner::base`] (never
    /// moved by reads).
    pub(super) inserted: u64,
    /// Into the shard's node pool: node id and endpoint.
    pub(super) node: u32,
    /// Into the shard's team pool.
    pub(super) team: u32,
    /// `BindingState` as on the wire.
    pub(super) state: i32,
    pub(super) auto_resume: bool,
    /// CLOCK's bit: read since the hand last passed.
    pub(super) referenced: bool,
}

/// Reference-counted interned values, indexed by `u32`.
pub(super) struct Pool<T> {
    pub(super) index: HashTable<u32>,
    pub(super) items: Vec<Option<Pooled<T>>>,
    pub(super) free: Vec<u32>,
}

pub(super) struct Pooled<T> {
    pub(super) value: T,
    pub(super) hash: u64,
    pub(super) refs: u32,
}

impl<T> Pool<T> {
    pub(super) fn new() -> Self {
        Pool {
            index: HashTable::new(),
            items: Vec::new(),
            free: Vec::new(),
        }
    }

    /// The index of the value `eq` recognises (hashing to `hash`), made by
    /// `make` if the pool has none; one more reference to it.
    pub(super) fn intern(
        &mut self,
        hash: u64,
        eq: impl Fn(&T) -> bool,
        make: impl FnOnce() -> T,
    ) -> u32 {
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

    pub(super) fn get(&self, i: u32) -> Option<&T> {
        self.items
            .get(i as usize)
            .and_then(Option::as_ref)
            .map(|p| &p.value)
    }

    /// One reference fewer; the value is dropped with its last.
    pub(super) fn release(&mut self, i: u32) {
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
    pub(super) fn len(&self) -> usize {
        self.index.len()
    }

    pub(super) fn clear(&mut self) {
        self.index.clear();
        self.items.clear();
        self.free.clear();
    }
}

/// A node as routes name it.
pub(super) struct NodeAddr {
    pub(super) node_id: Box<str>,
    pub(super) endpoint: Box<str>,
}

pub(super) type LookupResult = Result<Arc<Route>, ResolveError>;
pub(super) type SharedLookup = Shared<BoxFuture<'static, LookupResult>>;

/// A lookup in flight, joined by the misses for its id.
pub(super) struct Pending {
    pub(super) key: Key,
    /// Tells this lookup from a later one for the same id.
    pub(super) token: u64,
    pub(super) shared: SharedLookup,
    /// Something about the id happened meanwhile: do not cache the answer.
    pub(super) tainted: bool,
}

/// One shard: its routes, their interned parts and its lookups in flight.
pub(super) struct Shard {
    /// Key hash → position in `slots`.
    pub(super) index: HashTable<u32>,
    /// Dense: removals move the last slot into the hole.
    pub(super) slots: Vec<Slot>,
    /// Most slots held.
    pub(super) capacity: usize,
    /// CLOCK's hand, a position in `slots`.
    pub(super) hand: usize,
    pub(super) nodes: Pool<NodeAddr>,
    pub(super) teams: Pool<Box<str>>,
    pub(super) pending: HashTable<Pending>,
    pub(super) next_token: u64,
}

/// What a read found.
pub(super) enum Found {
    Fresh(usize),
    Expired(usize),
    Absent,
}

impl Shard {
    pub(super) fn new(capacity: usize) -> Self {
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

    pub(super) fn find(&self, key: Key, hash: u64) -> Option<usize> {
        let slots = &self.slots;
        self.index
            .find(hash, |&i| slots[i as usize].key == key)
            .map(|&i| i as usize)
    }

    pub(super) fn read(&self, key: Key, hash: u64, now: u64, ttl: u64) -> Found {
        match self.find(key, hash) {
            Some(i) if now.saturating_sub(self.slots[i].inserted) < ttl => Found::Fresh(i),
            Some(i) => Found::Expired(i),
            None => Found::Absent,
        }
    }

    /// The route in slot `i`, built from its interned parts.
    pub(super) fn route(&self, i: usize, sandbox_id: &str) -> Route {
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
    pub(super) fn slot(&mut self, key: Key, route: &Route, now: u64) -> Slot {
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

    pub(super) fn release(&mut self, slot: &Slot) {
        self.nodes.release(slot.node);
        self.teams.release(slot.team);
    }

    /// Drops the index's entry for position `i` (whatever key it holds).
    pub(super) fn unindex(&mut self, i: usize) {
        let hash = self.slots[i].key.hash();
        if let Ok(e) = self.index.find_entry(hash, |&j| j as usize == i) {
            e.remove();
        }
    }

    pub(super) fn index_at(&mut self, hash: u64, i: usize) {
        let slots = &self.slots;
        self.index
            .insert_unique(hash, u32::try_from(i).unwrap_or(u32::MAX), |&j| {
                slots[j as usize].key.hash()
            });
    }

    /// Removes the slot at `i`, the last one taking its place.
    pub(super) fn remove_at(&mut self, i: usize) -> Slot {
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
    pub(super) fn victim(&mut self, now: u64, ttl: u64) -> (usize, EvictReason) {
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
    pub(super) fn insert(
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
    pub(super) fn taint(&mut self, key: Key, hash: u64) {
        if let Some(p) = self.pending.find_mut(hash, |p| p.key == key) {
            p.tainted = true;
        }
    }

    pub(super) fn clear(&mut self) -> usize {
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
