//! `warren scheduler`: the one source of truth for where sandboxes live.
//!
//! It owns nodes (with liveness leases) and bindings
//! `sandbox_id → (node_id, endpoint, generation, state, ...)`, places new
//! sandboxes on live nodes, runs the sweeps, and streams every binding change
//! to the gateways. The gRPC contract is
//! `crates/proto/proto/warren/scheduler/v1/scheduler.proto`.
//!
//! # Layout
//! - [`config`]: flags/env/TOML, validated before anything binds.
//! - [`check`]: `--check-config`, everything a start checks before it
//!   binds or opens the store, and nothing more.
//! - [`store`]: [`store::SqlStore`], the store, on SQLite (embedded, one replica) or PostgreSQL
//!   (many replicas: writers serialize on an advisory lock, changes fan out
//!   with LISTEN/NOTIFY, the sweep runs under an advisory-lock lease).
//!   **Invariant:** fenced writes are single conditional statements, and
//!   every binding change is logged in the same transaction.
//! - [`service`]: the tonic service: input validation, status codes, metrics.
//! - [`watch`]: the change-log hub behind `WatchBindings`.
//! - [`route_view`]: every binding's route in memory, kept exact by the
//!   hub, so `LookupNode` is a memory read (`--lookup-view`).
//! - [`sweep`]: dead nodes, expired sandboxes, stuck creates, log pruning,
//!   under a [`sweep::LeaderLease`].
//! - [`metrics`]: `warren_scheduler_*` Prometheus metrics.
//! - [`error`]: the error type and its gRPC status mapping.
//! - `mutations` (feature `mutations`, the simulation's only): a switch
//!   that unfences binding removals, to show the simulation notices.
//! - this file: [`main`] (binds, announces, serves until SIGTERM), [`serve`]
//!   (the same on listeners passed in, for in-process tests) and
//!   [`serve_on`] (the gRPC API alone over an open store on any
//!   listener: the deterministic simulation's replicas). The gRPC
//!   service runs on `warren_core::server`, the loop and listener limits
//!   every part shares.
// Dev-dependencies are for the integration tests under tests/; this crate's
// own unit-test build sees them too.
#![cfg_attr(test, allow(unused_crate_dependencies))]

pub mod check;
pub mod config;
pub mod error;
pub mod metrics;
#[cfg(feature = "mutations")]
pub mod mutations;
pub mod route_view;
pub mod service;
pub mod store;
pub mod sweep;
pub mod watch;

pub use config::Config;

use anyhow::Context as _;
use std::future::Future;
use std::sync::Arc;
use std::time::Duration;
use store::postgres::{AdvisoryLease, ReplicaLease};
use store::{SqlStore, SweepSettings};
use tokio::net::TcpListener;
use tonic::codegen::{http, Service as _};
use warren_core::admin::Admin;
use warren_proto::scheduler::v1::scheduler_server::SchedulerServer;
use warren_proto::scheduler::v1::secrets_server::SecretsServer;

/// How long background tasks get to finish after the server stopped.
const TASK_STOP_TIMEOUT: Duration = Duration::from_secs(5);

/// Runs `warren scheduler` until SIGTERM/Ctrl-C.
pub async fn main(config: Config) -> anyhow::Result<()> {
    config::refuse_secrets_in_args(std::env::args_os())?;
    let location = config.validate()?;
    // The store and secrets keys too, before any socket is bound (made on
    // first start with SQLite; `serve` reads the same files), and the
    // certificates: what `--check-config` checks, found before anything is
    // bound.
    sealer(&config, &location)?;
    secrets_sealer(&config, &location)?;
    let trust = check::trust(&config)?;
    // The scheduler starts no programs: its connection limits, not EMFILE,
    // should decide when connections are refused.
    warren_core::server::raise_fd_limit();
    let grpc = TcpListener::bind(config.listen)
        .await
        .with_context(|| format!("cannot listen on {} (--listen)", config.listen))?;
    let admin = TcpListener::bind(config.admin_listen)
        .await
        .with_context(|| format!("cannot listen on {} (--admin-listen)", config.admin_listen))?;
    warren_core::announce("scheduler", "grpc", grpc.local_addr()?);
    warren_core::announce("scheduler", "admin", admin.local_addr()?);
    match serve_trusted(config, trust, grpc, admin, warren_core::shutdown::signal()).await {
        // A data directory that cannot be created is a configuration problem (exit 64).
        Err(ServeError::Open(e @ store::OpenError::CreateDir { .. })) => {
            Err(warren_core::config::ConfigError::Invalid(format!("--data-dir: {e}")).into())
        }
        r => Ok(r?),
    }
}

/// Why [`serve`] stopped with an error.
#[derive(Debug, thiserror::Error)]
pub enum ServeError {
    #[error(transparent)]
    Config(#[from] warren_core::config::ConfigError),
    #[error(transparent)]
    Open(#[from] store::OpenError),
    #[error(transparent)]
    Store(#[from] error::Error),
}

/// Serves the scheduler on `grpc` and the admin endpoints on `admin` until
/// `shutdown` resolves; then readiness goes false, watch streams end, and
/// in-flight RPCs get `--drain-timeout` to finish.
pub async fn serve(
    config: Config,
    grpc: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let trust = check::trust(&config)?;
    serve_trusted(config, trust, grpc, admin, shutdown).await
}

/// [`serve`] with the internal TLS material already loaded.
async fn serve_trusted(
    config: Config,
    trust: Option<Arc<warren_trust::Trust>>,
    grpc: TcpListener,
    admin: TcpListener,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError> {
    let location = config.validate()?;
    let sealer = Arc::new(sealer(&config, &location)?);
    let secrets = secrets_sealer(&config, &location)?.map(Arc::new);
    if secrets.is_none() {
        tracing::warn!(
            "no --secrets-key-file: this scheduler keeps no team secrets (the secrets API \
             answers 503)"
        );
    }
    let mut store = open_store(location, config.database_pool_size, sealer).await?;
    if let Some(s) = secrets {
        store = store.with_secrets(s);
    }
    let store = Arc::new(store);
    tokio::spawn(reseal_all(store.clone()));
    let lease = match store.postgres_url() {
        None => ReplicaLease::Sole(sweep::SoleReplica),
        Some(url) => ReplicaLease::Advisory(Box::new(
            AdvisoryLease::new(url).map_err(store::OpenError::Open)?,
        )),
    };
    let grpc = warren_trust::Listener::new(
        grpc,
        trust.as_deref(),
        &[warren_trust::Role::Node, warren_trust::Role::Gateway],
        "scheduler",
    )
    .map_err(warren_core::config::ConfigError::Invalid)?;
    let secure = grpc.is_tls();
    let result = serve_store(
        config,
        store.clone(),
        lease,
        grpc,
        secure,
        Some(admin),
        shutdown,
    )
    .await;
    store.close().await;
    result
}

/// Serves the scheduler's gRPC API on `grpc` over an open `store` until
/// `shutdown` resolves: watch hub, sweeps (as the sole replica: several
/// such schedulers over one store all sweep, each write fenced), no admin
/// listener and no TLS. How the deterministic simulation (`crates/sim`)
/// runs scheduler replicas over its simulated network, with the same
/// service, hub and sweep as [`serve`].
pub async fn serve_on<L>(
    config: Config,
    store: Arc<SqlStore>,
    grpc: L,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    L: warren_core::server::Accept<Peer = warren_trust::Peer>,
{
    let lease = ReplicaLease::Sole(sweep::SoleReplica);
    serve_store(config, store, lease, grpc, false, None, shutdown).await
}

/// The store's sealer: from `--store-key-file`, else the default key file
/// for `location` (made on first start), else refused (PostgreSQL).
fn sealer(
    config: &Config,
    location: &config::StoreLocation,
) -> Result<store::seal::Sealer, warren_core::config::ConfigError> {
    check::StoreKey::of(config, location)?.open()
}

/// The secrets' sealer: from `--secrets-key-file`, else the default key
/// file beside an SQLite database (made on first start); None with
/// PostgreSQL and no flag (the scheduler keeps no secrets then).
fn secrets_sealer(
    config: &Config,
    location: &config::StoreLocation,
) -> Result<Option<store::seal::Sealer>, warren_core::config::ConfigError> {
    use store::seal::{Sealer, SECRETS_KEY};
    if let Some(path) = &config.secrets_key_file {
        return check::secrets_key_file(path).map(Some);
    }
    match location.default_secrets_key_file() {
        Some(Some(path)) => {
            Sealer::open_or_create_key_file(&path, SECRETS_KEY, "--secrets-key-file")
                .map(Some)
                .map_err(|e| warren_core::config::ConfigError::Invalid(format!("--data-dir: {e}")))
        }
        Some(None) => Ok(Some(Sealer::ephemeral())),
        None => Ok(None),
    }
}

/// Bindings sealed again per write transaction: small, so a create that
/// queues behind one waits ~10 ms at most (PostgreSQL, on a loaded machine).
const RESEAL_BATCH: u32 = 100;
/// How many times as long as a reseal batch took the pass rests before the
/// next: it holds the write lock a quarter of the time at most.
const RESEAL_REST: u32 = 3;

/// Seals again, in the background, every token and `envVars` stored under
/// another key than the one that seals now (a rotation), or before sealing
/// existed, and every team secret sealed under another secrets key; says
/// once when none is left.
async fn reseal_all(store: Arc<SqlStore>) {
    let mut secrets = 0usize;
    loop {
        match store.reseal_secrets(500).await {
            Ok(0) => break,
            Ok(n) => secrets += n,
            Err(e) => {
                tracing::error!(error = %e, "store: cannot seal secrets again; they stay readable, under their old key");
                break;
            }
        }
        tokio::task::yield_now().await;
    }
    if secrets > 0 {
        tracing::info!(
            secrets,
            key = store.secrets_key_id().unwrap_or_default(),
            "store: sealed again every secret stored under another secrets key"
        );
    }
    let mut total = 0usize;
    let mut after = String::new();
    loop {
        let started = tokio::time::Instant::now();
        match store.reseal(&after, RESEAL_BATCH).await {
            Ok(None) => break,
            Ok(Some(batch)) => {
                total += batch.looked_at;
                after = batch.last;
            }
            Err(e) => {
                tracing::error!(error = %e, "store: cannot seal stored values again; they stay readable, under their old key");
                return;
            }
        }
        // Each batch is a write transaction, and every write in the store
        // (a create's Place and RecordAssignment, heartbeats) waits for
        // the one write lock: back to back, a million rows' worth held it
        // for minutes and creates fell to a few a second. Resting
        // RESEAL_REST times as long as the batch took keeps this pass to
        // a fraction of the lock, and slower when writers queue (a batch
        // that waited longer for the lock rests longer).
        tokio::time::sleep(started.elapsed() * RESEAL_REST).await;
    }
    // Volumes' tokens the same way.
    loop {
        match store.reseal_volumes(500).await {
            Ok(0) => break,
            Ok(n) => total += n,
            Err(e) => {
                tracing::error!(error = %e, "store: cannot seal volume tokens again; they stay readable, under their old key");
                return;
            }
        }
        tokio::task::yield_now().await;
    }
    if total > 0 {
        tracing::info!(
            values = total,
            key = store.sealing_key_id(),
            "store: sealed again every access token and envVars stored under another key or unsealed"
        );
    }
}

async fn open_store(
    location: config::StoreLocation,
    pool_size: u32,
    sealer: Arc<store::seal::Sealer>,
) -> Result<SqlStore, store::OpenError> {
    match location {
        config::StoreLocation::SqliteFile(path) => {
            SqlStore::open_sqlite_file(path, pool_size, sealer).await
        }
        config::StoreLocation::SqliteUrl(url) => {
            SqlStore::open_sqlite_url(&url, pool_size, sealer).await
        }
        config::StoreLocation::Postgres(url) => {
            SqlStore::open_postgres(&url, pool_size, sealer).await
        }
    }
}

async fn serve_store<L>(
    config: Config,
    store: Arc<SqlStore>,
    lease: ReplicaLease,
    grpc: L,
    secure: bool,
    admin_listener: Option<TcpListener>,
    shutdown: impl Future<Output = ()>,
) -> Result<(), ServeError>
where
    L: warren_core::server::Accept<Peer = warren_trust::Peer>,
{
    let (grpc_limits, admin_limits) = config.listener_limits()?;
    let admin = Admin::new("warren_scheduler");
    let metrics = match admin.registry.write() {
        Ok(mut registry) => metrics::Metrics::register(&mut registry),
        Err(poisoned) => metrics::Metrics::register(&mut poisoned.into_inner()),
    };
    // `stop` ends the server, the watch streams, the hub and the sweep;
    // `admin_stop` ends the admin listener last, so /readyz is visible while draining.
    let (stop, stopped) = tokio::sync::watch::channel(false);
    let (admin_stop, admin_stopped) = tokio::sync::watch::channel(false);

    // On PostgreSQL, other replicas' commits wake this replica's hub too.
    let listener_task = store.postgres_url().map(|url| {
        tokio::spawn(store::postgres::follow_changes(
            url.to_string(),
            store.change_signal(),
            stopped.clone(),
        ))
    });
    let view = Arc::new(route_view::RouteView::new(
        config.lookup_view,
        metrics.clone(),
    ));
    let (hub, hub_task) = watch::Hub::start(store.clone(), view.clone(), stopped.clone()).await?;
    let timing = sweep::SweepTiming {
        interval: config.sweep_interval,
        lease: config.lease,
        settings: SweepSettings {
            expire_nodes: true,
            creating_timeout: config.creating_timeout,
            watch_retention: config.watch_retention,
            paused_retention: (!config.paused_retention.is_zero())
                .then_some(config.paused_retention),
        },
    };
    let sweep_task = tokio::spawn(sweep::run(
        store.clone(),
        lease,
        timing,
        metrics.clone(),
        stopped.clone(),
    ));
    let admin_task = admin_listener.map(|listener| {
        tokio::spawn(
            admin
                .clone()
                .serve(listener, flipped(admin_stopped), admin_limits),
        )
    });

    let store_name = store.backend().name();
    let service = service::SchedulerService::new(
        store,
        hub,
        view,
        service::ServiceSettings {
            nodes: store::NodeTiming {
                lease: config.lease,
                roster_grace: config.creating_timeout,
            },
            heartbeat_interval: config.heartbeat_interval(),
            secure,
            logs: service::LogSettings {
                retention: config.sandbox_log_retention,
                team_max_bytes: config.sandbox_log_team_bytes,
            },
        },
        config.quotas()?,
        metrics,
        stopped.clone(),
    );
    // The gRPC service on the one server loop every listener runs, with
    // its timeouts, connection limit and drain (h2c; HTTP/1.1 callers get
    // gRPC's answer to a request it cannot serve).
    let service = Arc::new(service);
    let routes = tonic::service::Routes::new(SchedulerServer::from_arc(service.clone()))
        .add_service(SecretsServer::from_arc(service))
        .prepare();
    // The caller's identity (its certificate) rides with each request, for
    // the service's per-RPC authorization.
    let handler = move |peer: warren_trust::Peer,
                        mut req: http::Request<warren_core::server::Incoming>| {
        let mut routes = routes.clone();
        req.extensions_mut().insert(peer);
        async move {
            match routes.call(req).await {
                Ok(resp) => resp,
                Err(never) => match never {},
            }
        }
    };
    let server = warren_core::server::serve(
        grpc,
        handler,
        flipped(stopped),
        grpc_limits,
        admin.listeners.listener("grpc"),
    );
    tokio::pin!(server);
    // Readiness goes false at the signal; RPCs keep being served for
    // --shutdown-delay so balancers and clients move away first.
    let shutdown = warren_core::shutdown::readiness_first(shutdown, &admin, config.shutdown_delay);
    tokio::pin!(shutdown);
    admin.set_ready(true);
    tracing::info!(store = store_name, "scheduler serving");

    tokio::select! {
        () = &mut server => {}
        () = &mut shutdown => {
            admin.set_ready(false);
            let _ = stop.send(true);
            // Stopped accepting; in-flight RPCs get --drain-timeout.
            server.await;
        }
    }
    admin.set_ready(false);
    let _ = stop.send(true);
    for task in [hub_task, sweep_task].into_iter().chain(listener_task) {
        if tokio::time::timeout(TASK_STOP_TIMEOUT, task).await.is_err() {
            tracing::warn!("a background task did not stop in time");
        }
    }
    let _ = admin_stop.send(true);
    if let Some(admin_task) = admin_task {
        let _ = tokio::time::timeout(TASK_STOP_TIMEOUT, admin_task).await;
    }
    tracing::info!("scheduler stopped");
    Ok(())
}

/// Resolves once the flag is true (or its sender is gone).
async fn flipped(mut rx: tokio::sync::watch::Receiver<bool>) {
    let _ = rx.wait_for(|v| *v).await;
}
