//! `warren gateway`: the public entry. It serves the E2B control-plane REST
//! API and proxies sandbox traffic to the node that hosts each sandbox.
//!
//! # Layout
//! - [`config`]: flags/env/TOML ([`Config`]) validated into [`Settings`]
//!   before any socket is bound; API keys never from the command line.
//! - [`check`]: `--check-config`, everything a start checks before it
//!   serves, and nothing more.
//! - [`limits`]: what a tenant may ask for and keep (sandbox caps, builds,
//!   snapshots and templates per team, when unused layers go).
//! - [`server`]: the listeners (HTTP/1.1 + h2c, upgrades; the same over
//!   TLS on `--public-tls-listen`), their connections
//!   served by `--worker-threads` threads (`warren_core::server::Workers`:
//!   each thread owns its connections and its node connections), plane
//!   dispatch, metrics per request, graceful drain.
//! - [`target`]: is a request data plane (`E2b-Sandbox-Id`/`-Port` headers or
//!   host `{port}-{id}.{domain}`), and for which sandbox and port.
//! - [`control`]: the E2B REST API (create, list, get, kill, timeout,
//!   connect, fork); [`models`]: its JSON; [`auth`]: `X-API-Key` → team.
//! - [`resolver`]: the [`Resolver`](resolver::Resolver) trait the data plane
//!   routes through: the route cache (sharded compact slots; positive-only, TTL that hits
//!   never renew, coalesced misses, evicted by the scheduler's
//!   `WatchBindings` and by stale-route signals), or with
//!   `--route-cache-capacity 0` one `LookupNode` per request.
//! - [`proxy`]: the data plane, streaming both ways, WebSocket splicing, and
//!   the stale-route path (evict, one refetch, a replay-safe retry).
//! - the scheduler client with replica failover is `warren_proto::client`,
//!   shared with the node.
//! - [`node_client`]: node connection pools (one per worker thread) and
//!   the nodes' control API.
//! - [`error`]: JSON errors (`code`, `error_code`, `message`);
//!   bodies are `warren_core::body`; [`metrics`]: Prometheus.
//! - [`state`]: [`App`](state::App), what handlers share.
//!
//! # Route cache
//! Each gateway keeps its own bounded, positive-only cache of sandbox routes
//! (ARCHITECTURE.md invariants "Positive caching only" through "Retry only
//! what is safe"), so steady sandbox traffic costs the scheduler
//! nothing:
//! - `--route-cache-capacity` (default 100000 routes; `0` turns the cache
//!   off and every data-plane request makes a `LookupNode`);
//! - `--route-cache-ttl` (default 30s): the longest a route is served after
//!   it was cached; hits never renew it;
//! - `--route-cache-watch` (default true): follow the scheduler's
//!   `WatchBindings` and evict changed routes within milliseconds;
//! - `--retry-max-body` (default 64 KiB): the largest body kept so a
//!   replay-safe request can be retried once on a moved sandbox's new node.
//!
//! Each has a `WARREN_GATEWAY_*` environment twin and a TOML key. Metrics:
//! `warren_gateway_route_cache_{hits,misses,coalesced,retries}_total`,
//! `_evictions_total{reason}`, `_refetches_total{outcome}`, the gauges
//! `_entries`, `_watch_connected`, `_watch_revision`, and
//! `warren_gateway_scheduler_lookups_total`. `warren route <id>` asks
//! `GET /_warren/v1/routes/{id}` what is cached and what the scheduler says.

pub mod auth;
pub mod check;
pub mod config;
mod control;
pub mod error;
pub mod limits;
pub mod metrics;
pub mod models;
pub mod node_client;
mod proxy;
pub mod records;
pub mod resolver;
mod server;
pub mod state;
pub mod target;

pub use config::{Config, Settings};

/// Entry points for the fuzz targets (`fuzz/`); not an API.
#[doc(hidden)]
pub use control::fuzzing;

use anyhow::Context;
use std::future::Future;
use std::sync::Arc;
use tokio::net::TcpListener;
use warren_core::admin::Admin;

/// Runs `warren gateway` until SIGTERM/Ctrl-C.
pub async fn main(config: Config) -> anyhow::Result<()> {
    config::refuse_secrets_in_args(std::env::args_os())?;
    let settings = config.validate()?;
    // The certificates before anything is bound: what `--check-config`
    // checks, found as it finds it.
    let trust = check::trust(&settings)?;
    // The gateway starts no programs: its connection limits, not EMFILE,
    // should decide when connections are refused.
    warren_core::server::raise_fd_limit();
    let listener = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {}", config.listen))?;
    let mut http_listeners = Vec::new();
    for addr in &settings.http_listen {
        let tcp = TcpListener::bind(addr).await.with_context(|| {
            format!(
                "cannot listen on {addr} (--http-listen; ports below 1024 need root or \
                 CAP_NET_BIND_SERVICE)"
            )
        })?;
        http_listeners.push(tcp);
    }
    let mut tls_listeners = Vec::new();
    for addr in settings.public_tls.iter().flat_map(|t| &t.listen) {
        let tcp = TcpListener::bind(addr).await.with_context(|| {
            format!(
                "cannot listen on {addr} (--public-tls-listen; ports below 1024 need root \
                 or CAP_NET_BIND_SERVICE)"
            )
        })?;
        tls_listeners.push(tcp);
    }
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (admin)", config.admin_listen))?;
    run_trusted(
        settings,
        trust,
        std::iter::once(listener).chain(http_listeners).collect(),
        tls_listeners,
        admin,
        warren_core::shutdown::signal(),
    )
    .await
}

/// The gateway's shared state over `scheduler` and `http`: its metrics
/// (registered with `admin`), its resolver (the route cache with its
/// `WatchBindings` follower, whose task is returned, or one `LookupNode`
/// per request) and [`state::App`]. What [`run`] serves, and what the
/// deterministic simulation (`crates/sim`) serves over its own network.
pub fn assemble(
    settings: Settings,
    admin: &Admin,
    scheduler: Arc<warren_proto::client::Scheduler>,
    http: node_client::NodeHttp,
) -> anyhow::Result<(Arc<state::App>, Option<tokio::task::JoinHandle<()>>)> {
    let metrics = metrics::Metrics::register(admin);
    let source = Arc::new(resolver::LookupNode::new(
        scheduler.clone(),
        metrics.clone(),
    ));
    let mut watch = None;
    let resolver: Arc<dyn resolver::Resolver> = match settings.route_cache {
        None => Arc::new(resolver::UncachedResolver::new(source)),
        Some(cache_settings) => {
            let cache = resolver::CachedResolver::new(cache_settings, source, metrics.clone());
            cache.register_gauge(admin);
            if cache_settings.watch {
                watch = Some(resolver::watch::spawn(cache.clone(), scheduler.clone()));
            }
            Arc::new(cache)
        }
    };
    let upload_dir = settings.uploads.staging.clone();
    let app = Arc::new(
        state::App::new(settings, scheduler, resolver, http, metrics).map_err(|e| {
            warren_core::config::ConfigError::Invalid(format!(
                "cannot make the gateway's upload staging directory in {} (or open --blob-store): {e}",
                upload_dir.display()
            ))
        })?,
    );
    Ok((app, watch))
}

/// Serves the public API on `listener` on this runtime (no worker
/// threads, no TLS) until `shutdown` resolves, then drains for up to
/// `limits.drain`: how the deterministic simulation (`crates/sim`) runs a
/// gateway over its simulated network. A response cut off upstream ends
/// the client's connection as HTTP/1.1 does without the reset
/// [`run`]'s listeners send.
pub async fn serve_plain<L>(
    app: Arc<state::App>,
    listener: L,
    shutdown: impl Future<Output = ()>,
    limits: warren_core::server::Limits,
    metrics: warren_core::server::ListenerMetrics,
) where
    L: warren_core::server::Accept<Peer = std::net::SocketAddr>,
{
    server::serve_plain(app, listener, shutdown, limits, metrics).await;
}

/// Runs a gateway on already-bound listeners until `shutdown` resolves, then
/// turns readiness off, stops accepting, and drains in-flight requests for
/// up to `settings.drain_timeout`. Announces the listeners on stdout.
/// `listeners` are plain HTTP (the first is `--listen`, announced `http`;
/// the others `http-2`, ...); `tls_listeners` are served with
/// `settings.public_tls`'s certificate (none when it is off).
pub async fn run(
    settings: Settings,
    listeners: Vec<TcpListener>,
    tls_listeners: Vec<TcpListener>,
    admin_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let trust = check::trust(&settings)?;
    run_trusted(
        settings,
        trust,
        listeners,
        tls_listeners,
        admin_listener,
        shutdown,
    )
    .await
}

/// [`run`] with the internal TLS material already loaded.
async fn run_trusted(
    settings: Settings,
    trust: Option<Arc<warren_trust::Trust>>,
    listeners: Vec<TcpListener>,
    tls_listeners: Vec<TcpListener>,
    admin_listener: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> anyhow::Result<()> {
    let admin = Admin::new("warren_gateway");
    let scheduler = Arc::new(check::scheduler(&settings, trust.as_deref())?);
    let workers = warren_core::server::Workers::start(settings.worker_threads, "gateway-worker")
        .context("cannot start the worker threads")?;
    let http = check::node_http(&settings, trust.as_deref(), Some(&workers))?;
    let limits = settings.listener;
    let admin_limits = settings.admin_listener;
    let shutdown_delay = settings.shutdown_delay;
    let public_tls = settings.public_tls.as_ref().map(|t| t.config.clone());
    if !tls_listeners.is_empty() && public_tls.is_none() {
        return Err(warren_core::config::ConfigError::Invalid(
            "public TLS listeners given without --public-tls-cert/--public-tls-key".into(),
        )
        .into());
    }
    let (app, watch) = assemble(settings, &admin, scheduler, http)?;

    let mut listeners = listeners.into_iter();
    let listener = listeners
        .next()
        .ok_or_else(|| anyhow::anyhow!("the gateway needs a listener"))?;
    {
        let mut at = listener.local_addr()?;
        if at.ip().is_unspecified() {
            at.set_ip(if at.is_ipv4() {
                std::net::Ipv4Addr::LOCALHOST.into()
            } else {
                std::net::Ipv6Addr::LOCALHOST.into()
            });
        }
        let _ = app.self_url.set(format!("http://{at}"));
    }
    warren_core::announce("gateway", "http", listener.local_addr()?);
    // Metrics label every TLS listener `https`.
    let mut publics = vec![(server::Public::plain(listener), "http")];
    for (i, tcp) in listeners.enumerate() {
        warren_core::announce("gateway", &format!("http-{}", i + 2), tcp.local_addr()?);
        publics.push((server::Public::plain(tcp), "http"));
    }
    for (i, tcp) in tls_listeners.into_iter().enumerate() {
        // The first is `https`, any others `https-2`, `https-3`, ...
        let name = match i {
            0 => "https".to_string(),
            n => format!("https-{}", n + 1),
        };
        warren_core::announce("gateway", &name, tcp.local_addr()?);
        if let Some(config) = &public_tls {
            publics.push((server::Public::tls(tcp, config.clone()), "https"));
        }
    }
    warren_core::announce("gateway", "admin", admin_listener.local_addr()?);
    let (admin_stop, admin_stopped) = tokio::sync::oneshot::channel::<()>();
    let admin_task = tokio::spawn(admin.clone().serve(
        admin_listener,
        async move {
            let _ = admin_stopped.await;
        },
        admin_limits,
    ));
    admin.set_ready(true);
    // Layers of deleted snapshots, removed once no node's sandbox stacks them.
    let layer_gc = tokio::spawn(control::layers::sweep_forever(app.clone()));

    let ready = admin.clone();
    // Load balancers see the replica leave (/readyz false) and get
    // --shutdown-delay to move traffic before the listeners close.
    let shutdown = futures_util::FutureExt::shared(Box::pin(async move {
        warren_core::shutdown::readiness_first(shutdown, &ready, shutdown_delay).await
    }));
    futures_util::future::join_all(publics.into_iter().map(|(public, name)| {
        server::serve(
            app.clone(),
            &workers,
            public,
            shutdown.clone(),
            limits,
            admin.listeners.listener(name),
        )
    }))
    .await;
    if let Some(watch) = watch {
        watch.abort();
    }
    layer_gc.abort();
    let _ = admin_stop.send(());
    let _ = admin_task.await;
    Ok(())
}
