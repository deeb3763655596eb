//! [`CachedResolver`]: the gateway's route cache.
//!
//! A moka future cache `sandbox id → (route, inserted at)`:
//!
//! - **Positive only** (ARCHITECTURE.md, "Positive caching only"): filled by a successful `LookupNode`
//!   or by [`Resolver::learn`] (create, fork, a refetch that found a move).
//!   NotFound and errors are never stored: moka's `try_get_with` does not
//!   cache an `Err`.
//! - **TTL that never renews**: the insertion instant (tokio's clock, so
//!   paused-clock tests are exact) is checked on every read, and an entry
//!   older than the TTL is dropped there (`reason="ttl"`). moka's own
//!   `time_to_live` (same length, its own clock) only reclaims memory of
//!   entries nobody reads.
//! - **Bounded**: `max_capacity`; moka's size evictions are counted as
//!   `reason="capacity"` by the eviction listener.
//! - **Coalesced misses**: concurrent misses for one id share one lookup
//!   (`try_get_with`); the callers that waited are `_coalesced_total`.
//! - **Conditional evictions**: a stale signal or a watch change removes an
//!   entry only if it is not newer than what the signal is about, atomically
//!   per key (`and_compute_with`), so a route another request just
//!   refreshed survives a late signal about the old one.

use super::{CachedView, EvictReason, ResolveError, Resolver, ResolverStatus, Route, RouteSource};
use crate::metrics::Metrics;
use futures_util::future::BoxFuture;
use moka::future::Cache;
use moka::notification::RemovalCause;
use moka::ops::compute::{CompResult, Op};
use std::sync::atomic::{AtomicBool, Ordering};
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

/// One cached route. Cheap to clone: the route is shared.
#[derive(Debug, Clone)]
struct Entry {
    route: Arc<Route>,
    /// When it was cached (never moved by reads).
    inserted: Instant,
}

/// The caching resolver. Clones share the cache.
#[derive(Clone)]
pub struct CachedResolver {
    /// id → route; moka does the bounding, coalescing and memory reclaim.
    cache: Cache<String, Entry>,
    /// Asked on a miss and for refetches.
    source: Arc<dyn RouteSource>,
    settings: CacheSettings,
    /// Hit/miss/eviction counters, and the watch's gauges.
    pub(super) metrics: Metrics,
}

impl CachedResolver {
    /// An empty cache in front of `source`.
    pub fn new(settings: CacheSettings, source: Arc<dyn RouteSource>, metrics: Metrics) -> Self {
        let listener_metrics = metrics.clone();
        let cache = Cache::builder()
            .max_capacity(settings.capacity)
            .time_to_live(settings.ttl)
            .eviction_listener(move |_id, _entry, cause| match cause {
                RemovalCause::Size => listener_metrics.evicted(EvictReason::Capacity, 1),
                RemovalCause::Expired => listener_metrics.evicted(EvictReason::Ttl, 1),
                // Explicit removals are counted, with their reason, where
                // they are made; replacements are not evictions.
                RemovalCause::Explicit | RemovalCause::Replaced => {}
            })
            .build();
        CachedResolver {
            cache,
            source,
            settings,
            metrics,
        }
    }

    /// Exposes `warren_gateway_route_cache_entries`, read at each scrape.
    pub fn register_gauge(&self, admin: &Admin) {
        if let Ok(mut reg) = admin.registry.write() {
            reg.register_collector(Box::new(EntriesGauge(self.cache.clone())));
        }
    }

    /// Drops every entry: the watch lost track of changes it cannot replay.
    pub async fn flush(&self, reason: EvictReason) {
        // Settle moka's pending writes so the count is exact.
        self.cache.run_pending_tasks().await;
        let n = self.cache.entry_count();
        self.cache.invalidate_all();
        if n > 0 {
            self.metrics.evicted(reason, n);
        }
        tracing::info!(entries = n, "route cache flushed");
    }

    /// Removes the entry for `id` when `stale(cached route)` says so, as
    /// one atomic step for that key. True when something was removed.
    pub(super) async fn remove_if(
        &self,
        id: &str,
        reason: EvictReason,
        stale: impl FnOnce(&Route, Instant) -> bool,
    ) -> bool {
        let result = self
            .cache
            .entry_by_ref(id)
            .and_compute_with(|current| {
                let op = match current {
                    Some(e) if stale(&e.value().route, e.value().inserted) => Op::Remove,
                    _ => Op::Nop,
                };
                std::future::ready(op)
            })
            .await;
        let removed = matches!(result, CompResult::Removed(_));
        if removed {
            self.metrics.evicted(reason, 1);
        }
        removed
    }

    /// Entries right now (after moka's pending maintenance).
    #[cfg(test)]
    async fn len(&self) -> u64 {
        self.cache.run_pending_tasks().await;
        self.cache.entry_count()
    }

    async fn resolve_inner(&self, id: &str) -> Result<Arc<Route>, ResolveError> {
        if let Some(entry) = self.cache.get(id).await {
            if entry.inserted.elapsed() < self.settings.ttl {
                self.metrics.cache_hits.inc();
                return Ok(entry.route);
            }
            let ttl = self.settings.ttl;
            self.remove_if(id, EvictReason::Ttl, |_, inserted| {
                inserted.elapsed() >= ttl
            })
            .await;
        }
        self.metrics.cache_misses.inc();
        let looked_up = AtomicBool::new(false);
        let entry = self
            .cache
            .try_get_with_by_ref(id, async {
                looked_up.store(true, Ordering::Relaxed);
                let route = self.source.lookup(id).await?;
                Ok::<_, ResolveError>(Entry {
                    route: Arc::new(route),
                    inserted: Instant::now(),
                })
            })
            .await
            .map_err(|shared| (*shared).clone())?;
        if !looked_up.load(Ordering::Relaxed) {
            // Another request's lookup answered this one.
            self.metrics.cache_coalesced.inc();
        }
        Ok(entry.route)
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
        Box::pin(async move { self.source.lookup(sandbox_id).await.map(Arc::new) })
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
            let id = route.sandbox_id.clone();
            self.cache
                .insert(
                    id,
                    Entry {
                        route,
                        inserted: Instant::now(),
                    },
                )
                .await;
        })
    }

    fn cached<'a>(&'a self, sandbox_id: &'a str) -> BoxFuture<'a, Option<CachedView>> {
        Box::pin(async move {
            let entry = self.cache.get(sandbox_id).await?;
            let age = entry.inserted.elapsed();
            Some(CachedView {
                route: entry.route,
                age,
                ttl_left: self.settings.ttl.saturating_sub(age),
            })
        })
    }

    fn status(&self) -> ResolverStatus {
        let watch = match (self.settings.watch, self.metrics.watch_connected.get()) {
            (false, _) => "off",
            (true, 1) => "connected",
            (true, _) => "disconnected",
        };
        ResolverStatus {
            enabled: true,
            capacity: self.settings.capacity,
            ttl_ms: u64::try_from(self.settings.ttl.as_millis()).unwrap_or(u64::MAX),
            watch,
            revision: u64::try_from(self.metrics.watch_revision.get()).unwrap_or(0),
        }
    }
}

/// `warren_gateway_route_cache_entries`, computed at scrape time so it
/// never drifts from the cache. moka's count is eventually consistent: an
/// insert is counted once the cache's pending housekeeping has run, so a
/// scrape right after a create may still show the old number.
struct EntriesGauge(Cache<String, Entry>);

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
            i64::try_from(self.0.entry_count()).unwrap_or(i64::MAX),
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
