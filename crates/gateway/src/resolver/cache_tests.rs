//! Route cache behaviour on tokio's paused clock: the TTL is exact, hits
//! never renew it, misses coalesce, NotFound is never stored, evictions are
//! conditional, and watch changes evict what they make wrong.

#![allow(clippy::unwrap_used)]

use super::*;
use crate::resolver::watch;
use std::collections::HashMap;
use std::sync::atomic::AtomicUsize;
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
