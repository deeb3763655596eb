//! Route cache behaviour on tokio's paused clock: the TTL is exact, hits
//! never renew it, misses coalesce, NotFound is never stored, evictions are
//! conditional, and watch changes evict what they make wrong.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::resolver::watch;
use std::collections::HashMap;
use std::sync::atomic::{AtomicUsize, Ordering};
use std::sync::Mutex;
use warren_proto::scheduler::v1::{BindingChange, BindingState, ChangeKind};

/// A scheduler stand-in that counts lookups; optionally slow, so that
/// concurrent misses overlap.
#[derive(Default)]
struct Routes {
    known: Mutex<HashMap<String, Route>>,
    calls: AtomicUsize,
    delay: Duration,
}

impl Routes {
    fn put(&self, route: Route) {
        self.known
            .lock()
            .unwrap()
            .insert(route.sandbox_id.clone(), route);
    }

    fn calls(&self) -> usize {
        self.calls.load(Ordering::SeqCst)
    }
}

impl RouteSource for Routes {
    fn lookup<'a>(&'a self, id: &'a str) -> BoxFuture<'a, Result<Route, ResolveError>> {
        Box::pin(async move {
            self.calls.fetch_add(1, Ordering::SeqCst);
            if !self.delay.is_zero() {
                tokio::time::sleep(self.delay).await;
            }
            self.known
                .lock()
                .unwrap()
                .get(id)
                .cloned()
                .ok_or_else(|| ResolveError {
                    sandbox_id: id.to_string(),
                    status: tonic::Status::not_found("unknown"),
                })
        })
    }
}

fn route(id: &str, node: &str, generation: u64) -> Route {
    Route {
        sandbox_id: id.to_string(),
        node_id: node.to_string(),
        endpoint: format!("{node}.local:1"),
        generation,
        state: BindingState::Running,
        team_id: "team".into(),
        auto_resume: false,
    }
}

const TTL: Duration = Duration::from_secs(30);

fn cache_with(routes: Arc<Routes>, capacity: u64) -> (CachedResolver, Metrics) {
    let metrics = Metrics::register(&Admin::new("t"));
    let settings = CacheSettings {
        capacity,
        ttl: TTL,
        watch: true,
    };
    (
        CachedResolver::new(settings, routes, metrics.clone()),
        metrics,
    )
}

#[tokio::test(start_paused = true)]
async fn ttl_is_exact_and_hits_never_renew_it() {
    let routes = Arc::new(Routes::default());
    routes.put(route("sbx", "n1", 1));
    let (cache, m) = cache_with(routes.clone(), 100);

    assert_eq!(cache.resolve("sbx").await.unwrap().node_id, "n1");
    assert_eq!(routes.calls(), 1);
    // Hits all along the TTL, each one a read that must not push expiry out.
    for _ in 0..29 {
        tokio::time::advance(Duration::from_secs(1)).await;
        cache.resolve("sbx").await.unwrap();
    }
    tokio::time::advance(Duration::from_millis(999)).await;
    cache.resolve("sbx").await.unwrap();
    assert_eq!(routes.calls(), 1, "served from the cache within the TTL");
    assert_eq!(m.cache_hits.get(), 30);

    // Exactly TTL after it was cached: expired, looked up again.
    tokio::time::advance(Duration::from_millis(1)).await;
    routes.put(route("sbx", "n2", 2));
    assert_eq!(cache.resolve("sbx").await.unwrap().node_id, "n2");
    assert_eq!(routes.calls(), 2);
    assert_eq!(m.evictions(EvictReason::Ttl), 1);
    assert_eq!(m.cache_misses.get(), 2);

    // `warren route` sees the age and what is left, without renewing.
    tokio::time::advance(Duration::from_secs(10)).await;
    let view = cache.cached("sbx").await.unwrap();
    assert_eq!(view.age, Duration::from_secs(10));
    assert_eq!(view.ttl_left, Duration::from_secs(20));
}

#[tokio::test(start_paused = true)]
async fn learned_routes_expire_too() {
    let routes = Arc::new(Routes::default());
    let (cache, _) = cache_with(routes.clone(), 100);
    cache.learn(Arc::new(route("new", "n1", 1))).await;
    assert_eq!(cache.resolve("new").await.unwrap().generation, 1);
    assert_eq!(
        routes.calls(),
        0,
        "a created sandbox's first request is a hit"
    );
    tokio::time::advance(TTL).await;
    assert!(cache.resolve("new").await.unwrap_err().is_not_found());
    assert_eq!(routes.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn capacity_bounds_the_cache() {
    let routes = Arc::new(Routes::default());
    let (cache, m) = cache_with(routes, 10);
    for i in 0..200 {
        cache
            .learn(Arc::new(route(&format!("s{i}"), "n1", 1)))
            .await;
    }
    let len = cache.len().await;
    assert!(len <= 10, "{len} entries in a cache of 10");
    assert!(len > 0);
    assert_eq!(m.evictions(EvictReason::Capacity), 200 - len);
}

#[tokio::test(start_paused = true)]
async fn concurrent_misses_share_one_lookup() {
    let routes = Arc::new(Routes {
        delay: Duration::from_millis(50),
        ..Default::default()
    });
    routes.put(route("hot", "n1", 1));
    let (cache, m) = cache_with(routes.clone(), 100);
    let tasks: Vec<_> = (0..200)
        .map(|_| {
            let cache = cache.clone();
            tokio::spawn(async move { cache.resolve("hot").await.map(|r| r.generation) })
        })
        .collect();
    for t in tasks {
        assert_eq!(t.await.unwrap().unwrap(), 1);
    }
    assert_eq!(routes.calls(), 1);
    assert_eq!(m.cache_misses.get(), 200);
    assert_eq!(m.cache_coalesced.get(), 199);
}

#[tokio::test(start_paused = true)]
async fn not_found_and_errors_are_never_cached() {
    let routes = Arc::new(Routes::default());
    let (cache, _) = cache_with(routes.clone(), 100);
    assert!(cache.resolve("later").await.unwrap_err().is_not_found());
    assert!(cache.resolve("later").await.unwrap_err().is_not_found());
    assert_eq!(routes.calls(), 2, "each NotFound asked the scheduler");
    routes.put(route("later", "n1", 1));
    assert_eq!(cache.resolve("later").await.unwrap().node_id, "n1");
    assert!(cache.cached("later").await.is_some());
}

#[tokio::test(start_paused = true)]
async fn evictions_spare_newer_routes() {
    let routes = Arc::new(Routes::default());
    let (cache, m) = cache_with(routes, 100);
    cache.learn(Arc::new(route("s", "n2", 2))).await;
    // A late stale signal about generation 1 leaves generation 2 alone.
    cache.evict(&route("s", "n1", 1), EvictReason::Stale).await;
    assert!(cache.cached("s").await.is_some());
    cache.evict(&route("s", "n2", 2), EvictReason::Stale).await;
    assert!(cache.cached("s").await.is_none());
    assert_eq!(m.evictions(EvictReason::Stale), 1);
    // Evicting what is not there counts nothing.
    cache.evict(&route("s", "n2", 2), EvictReason::Delete).await;
    assert_eq!(m.evictions(EvictReason::Delete), 0);
}

fn change(kind: ChangeKind, id: &str, node: &str, generation: u64, revision: u64) -> BindingChange {
    BindingChange {
        revision,
        kind: kind as i32,
        sandbox_id: id.into(),
        node_id: node.into(),
        generation,
        state: BindingState::Running as i32,
        ..Default::default()
    }
}

#[tokio::test(start_paused = true)]
async fn watch_changes_evict_what_they_make_wrong() {
    let routes = Arc::new(Routes::default());
    let (cache, m) = cache_with(routes, 100);
    let learn = |id: &str, node: &str, generation: u64| {
        let cache = cache.clone();
        let r = Arc::new(route(id, node, generation));
        async move { cache.learn(r).await }
    };

    learn("a", "n1", 3).await;
    // The first HELLO of a process flushes what was cached before the watch.
    let hello = BindingChange {
        revision: 40,
        kind: ChangeKind::Hello as i32,
        ..Default::default()
    };
    assert_eq!(watch::apply(&cache, &hello, 0).await, 40);
    assert!(cache.cached("a").await.is_none());

    learn("a", "n1", 3).await;
    let mut rev = 40;
    // Same generation: still right.
    for kind in [ChangeKind::Assigned, ChangeKind::State] {
        rev = watch::apply(&cache, &change(kind, "a", "n1", 3, rev + 1), rev).await;
        assert!(
            cache.cached("a").await.is_some(),
            "{kind:?} at the cached generation"
        );
    }
    // Moved to generation 4: wrong now.
    rev = watch::apply(
        &cache,
        &change(ChangeKind::Moved, "a", "n2", 4, rev + 1),
        rev,
    )
    .await;
    assert!(cache.cached("a").await.is_none());
    // Removed and lost at the cached generation.
    for kind in [ChangeKind::Removed, ChangeKind::Lost] {
        learn("a", "n2", 4).await;
        rev = watch::apply(&cache, &change(kind, "a", "n2", 4, rev + 1), rev).await;
        assert!(cache.cached("a").await.is_none(), "{kind:?}");
    }
    // A replayed old removal does not touch a newer route.
    learn("a", "n1", 5).await;
    rev = watch::apply(
        &cache,
        &change(ChangeKind::Removed, "a", "n2", 4, rev + 1),
        rev,
    )
    .await;
    assert!(cache.cached("a").await.is_some());
    assert_eq!(rev, 46);
    // The first HELLO's flush, then moved, removed and lost.
    assert_eq!(m.evictions(EvictReason::Watch), 4);
    // Same place, another state (paused by its node at its end, or through
    // another gateway): the cached RUNNING route is wrong now.
    let paused = BindingChange {
        state: BindingState::Paused as i32,
        ..change(ChangeKind::State, "a", "n1", 5, rev + 1)
    };
    rev = watch::apply(&cache, &paused, rev).await;
    assert!(cache.cached("a").await.is_none(), "paused in place");
    assert_eq!(m.evictions(EvictReason::Watch), 5);
    learn("a", "n1", 5).await;

    // A plain reconnect HELLO keeps the cache and the revision...
    let again = BindingChange {
        revision: 60,
        ..hello.clone()
    };
    assert_eq!(watch::apply(&cache, &again, rev).await, rev);
    assert!(cache.cached("a").await.is_some());
    // ...a resync drops everything and restarts at the head.
    let resync = BindingChange {
        resync_required: true,
        ..again
    };
    assert_eq!(watch::apply(&cache, &resync, rev).await, 60);
    assert!(cache.cached("a").await.is_none());
}

// The compact table's own properties.

fn route_on(id: &str, node: &str, team: &str) -> Route {
    Route {
        team_id: team.into(),
        ..route(id, node, 1)
    }
}

#[test]
fn ids_pack_without_collisions_and_odd_ones_do_not_pack() {
    let ids = ["a", "a0", "0a", "aa", "0", "00", "z9", "9z"];
    let keys: Vec<_> = ids.iter().map(|id| Key::pack(id).unwrap()).collect();
    for (i, a) in keys.iter().enumerate() {
        for b in &keys[i + 1..] {
            assert_ne!(a, b);
        }
    }
    assert!(Key::pack(&"z".repeat(INLINE_ID_LEN)).is_some());
    for odd in [
        String::new(),
        "z".repeat(INLINE_ID_LEN + 1),
        "Abc".into(),
        "a-b".into(),
        "é".into(),
    ] {
        assert!(Key::pack(&odd).is_none(), "{odd:?}");
    }
}

#[tokio::test(start_paused = true)]
async fn ids_too_long_to_pack_are_resolved_uncached() {
    let routes = Arc::new(Routes::default());
    let long = "l".repeat(INLINE_ID_LEN + 1);
    routes.put(route(&long, "n1", 1));
    let fits = "f".repeat(INLINE_ID_LEN);
    routes.put(route(&fits, "n1", 1));
    let (cache, m) = cache_with(routes.clone(), 100);

    for _ in 0..3 {
        assert_eq!(cache.resolve(&long).await.unwrap().sandbox_id, long);
    }
    assert_eq!(routes.calls(), 3, "every request asked the scheduler");
    cache.learn(Arc::new(route(&long, "n1", 2))).await;
    assert!(cache.cached(&long).await.is_none());
    cache
        .evict(&route(&long, "n1", 2), EvictReason::Stale)
        .await;
    assert_eq!(m.cache_hits.get(), 0);
    assert_eq!(cache.len().await, 0);

    // The longest id that packs is cached as usual.
    cache.resolve(&fits).await.unwrap();
    assert_eq!(cache.resolve(&fits).await.unwrap().sandbox_id, fits);
    assert_eq!(routes.calls(), 4);
}

#[tokio::test(start_paused = true)]
async fn churn_never_grows_past_capacity_and_spares_hot_routes() {
    let routes = Arc::new(Routes::default());
    let capacity = 500u64;
    let (cache, m) = cache_with(routes.clone(), capacity);
    let hot: Vec<String> = (0..10).map(|i| format!("hot{i}")).collect();
    for id in &hot {
        routes.put(route(id, "n1", 1));
        cache.resolve(id).await.unwrap();
    }
    for i in 0..20_000u64 {
        cache
            .learn(Arc::new(route(&format!("c{i}"), "n1", 1)))
            .await;
        // The hot routes are read all along; the churned ones never again.
        cache.resolve(&hot[(i % 10) as usize]).await.unwrap();
        assert!(cache.len().await <= capacity);
    }
    assert_eq!(cache.len().await, capacity);
    assert_eq!(
        cache.allocated(),
        capacity as usize,
        "the slab was never allocated past its capacity"
    );
    assert_eq!(routes.calls(), 10, "no hot route was evicted");
    assert_eq!(
        m.evictions(EvictReason::Capacity),
        20_000 + 10 - capacity,
        "one eviction per route beyond capacity"
    );
}

#[tokio::test(start_paused = true)]
async fn a_full_shard_takes_expired_routes_first() {
    let routes = Arc::new(Routes::default());
    let (cache, m) = cache_with(routes, 4);
    for i in 0..4 {
        cache
            .learn(Arc::new(route(&format!("old{i}"), "n1", 1)))
            .await;
    }
    tokio::time::advance(TTL).await;
    for i in 0..4 {
        cache
            .learn(Arc::new(route(&format!("new{i}"), "n1", 1)))
            .await;
    }
    assert_eq!(m.evictions(EvictReason::Ttl), 4);
    assert_eq!(m.evictions(EvictReason::Capacity), 0);
    for i in 0..4 {
        assert!(cache.cached(&format!("new{i}")).await.is_some());
    }
}

#[tokio::test(start_paused = true)]
async fn large_caches_are_sharded_and_bounded_in_all() {
    let routes = Arc::new(Routes::default());
    let capacity = 64 * ROUTES_PER_SHARD;
    let (cache, m) = cache_with(routes.clone(), capacity);
    assert_eq!(cache.inner.shards.len(), MAX_SHARDS);
    let shares: usize = cache.inner.shards.iter().map(|s| s.lock().capacity).sum();
    assert_eq!(shares as u64, capacity, "the shares add up to the capacity");
    for i in 0..20_000 {
        cache
            .learn(Arc::new(route(&format!("s{i}"), "n1", 1)))
            .await;
    }
    assert_eq!(cache.len().await, 20_000);
    for i in (0..20_000).step_by(97) {
        assert_eq!(cache.resolve(&format!("s{i}")).await.unwrap().node_id, "n1");
    }
    assert_eq!(routes.calls(), 0);
    // Past the capacity: bounded overall, every extra route an eviction.
    for i in 20_000..(capacity + 5_000) {
        cache
            .learn(Arc::new(route(&format!("s{i}"), "n1", 1)))
            .await;
    }
    let len = cache.len().await;
    assert!(len <= capacity);
    assert_eq!(m.evictions(EvictReason::Capacity), capacity + 5_000 - len);
    // Small capacities are a single shard with an exact bound.
    let (small, _) = cache_with(routes, 1000);
    assert_eq!(small.inner.shards.len(), 1);
}

#[tokio::test(start_paused = true)]
async fn nodes_and_teams_are_interned_once_and_released() {
    let routes = Arc::new(Routes::default());
    let (cache, _) = cache_with(routes, 1000);
    for i in 0..300 {
        let node = if i % 2 == 0 { "n1" } else { "n2" };
        let team = ["ta", "tb", "tc"][i % 3];
        cache
            .learn(Arc::new(route_on(&format!("s{i}"), node, team)))
            .await;
    }
    assert_eq!(cache.interned(), (2, 3), "one copy of each node and team");
    let r = cache.resolve("s3").await.unwrap();
    assert_eq!(
        (r.node_id.as_str(), r.endpoint.as_str(), r.team_id.as_str()),
        ("n2", "n2.local:1", "ta")
    );
    // Moving every n2 route to n3 releases n2.
    for i in (1..300).step_by(2) {
        cache
            .learn(Arc::new(route_on(&format!("s{i}"), "n3", "ta")))
            .await;
    }
    assert_eq!(cache.interned(), (2, 3));
    assert_eq!(cache.resolve("s3").await.unwrap().node_id, "n3");
    // The last route of a node or team gone: so is its entry.
    for i in (0..300).step_by(2) {
        cache
            .evict(&route(&format!("s{i}"), "n1", 1), EvictReason::Stale)
            .await;
    }
    assert_eq!(cache.interned(), (1, 1));
    cache.flush(EvictReason::Watch).await;
    assert_eq!(cache.interned(), (0, 0));
    assert_eq!(cache.len().await, 0);
}

#[tokio::test(start_paused = true)]
async fn a_learn_during_a_lookup_wins_over_its_answer() {
    let routes = Arc::new(Routes {
        delay: Duration::from_millis(50),
        ..Default::default()
    });
    routes.put(route("s", "n1", 1));
    let (cache, _) = cache_with(routes.clone(), 100);
    let miss = {
        let cache = cache.clone();
        tokio::spawn(async move { cache.resolve("s").await.map(|r| r.generation) })
    };
    tokio::time::sleep(Duration::from_millis(10)).await;
    cache.learn(Arc::new(route("s", "n2", 2))).await;
    assert_eq!(miss.await.unwrap().unwrap(), 1, "the miss gets its answer");
    assert_eq!(cache.cached("s").await.unwrap().route.generation, 2);
    assert_eq!(cache.resolve("s").await.unwrap().node_id, "n2");
    assert_eq!(routes.calls(), 1);
}

#[tokio::test(start_paused = true)]
async fn a_lookup_whose_requests_went_away_still_fills_the_cache() {
    let routes = Arc::new(Routes {
        delay: Duration::from_millis(50),
        ..Default::default()
    });
    routes.put(route("s", "n1", 1));
    let (cache, m) = cache_with(routes.clone(), 100);
    let gave_up = tokio::time::timeout(Duration::from_millis(10), cache.resolve("s")).await;
    assert!(gave_up.is_err());
    tokio::time::sleep(Duration::from_millis(100)).await;
    assert_eq!(cache.resolve("s").await.unwrap().node_id, "n1");
    assert_eq!(routes.calls(), 1);
    assert_eq!(m.cache_hits.get(), 1);
    // A lookup that found nothing leaves no trace either.
    assert!(cache.resolve("none").await.unwrap_err().is_not_found());
    assert!(cache.resolve("none").await.unwrap_err().is_not_found());
    assert_eq!(routes.calls(), 3);
}
