//! `warren node`: a sandbox host.
//!
//! It creates, forks and deletes sandboxes with a runtime (`isolated`: a
//! template's root in its own namespaces; `process`: no isolation, loudly), checks every data-plane
//! request's sandbox id and generation before it forwards it to that
//! sandbox's envd over a Unix socket, and keeps the scheduler informed
//! (register, heartbeat with its roster, lifecycle events).
//!
//! # Layout
//! - [`config`]: flags / `WARREN_NODE_*` env / TOML, validated before binding.
//! - [`check`]: `--check-config`, everything a start checks before it
//!   makes its data directory or probes its runtime, and nothing more.
//! - [`runtime`]: the [`runtime::Runtime`] trait, `isolated` and `process`;
//!   the sandbox launcher, host id ranges, cgroup limits (v1 and v2), disk
//!   images, the seccomp filter, killing via cgroups and `/proc`.
//! - [`sandbox`]: the registry (roster, per-sandbox locks, create / fork /
//!   delete / adopt), `sandbox.json`, template and fork files.
//! - [`envd`]: the envd API socket, relay handshake and `/health` probe.
//! - [`http`]: the one listener; routes to [`control`] or [`proxy`].
//! - [`control`]: the JSON control API under `/_warren/v1/`.
//! - [`proxy`]: the data plane (identity check, then stream to envd).
//! - [`secrets`]: placeholders of egress rules resolved by the scheduler,
//!   for the egress proxy (`runtime::egress::intercept`, `warren-egress`).
//! - [`link`]: the scheduler link (register, heartbeat, events).
//! - [`metrics`]: `warren_node_*` metrics.
//! - [`samples`]: sandbox metrics (E2B's): the sampler and its bounded
//!   per-sandbox rings.
//! - [`logs`]: each sandbox's log (E2B's sandbox logs): envd's entries
//!   and the node's, bounded, handed on with the sandbox's DELETE.
//! - `mutations` (feature `mutations`, the simulation's only): a switch
//!   that turns the generation check off, to show the simulation notices.
//! - [`volumes`]: the volume store (`--volume-dir`): E2B's persistent
//!   volumes, their content calls (confined to each volume) and what a
//!   sandbox that mounts one is given.
//!
//! # Lifecycle and shutdown policy
//! At start the node adopts sandboxes whose envd still answers on its socket
//! (their `sandbox.json` says who they are) and removes the rest, then
//! registers with a fresh incarnation and that roster; the scheduler answers
//! which of them are orphans, and the node kills those.
//!
//! On SIGTERM/SIGINT `/readyz` turns false, the listener closes, in-flight
//! requests drain for up to `--drain-timeout`, then every sandbox is killed
//! and its files removed, and the node exits 0.
//!
//! **Policy: a sandbox never outlives its node process**, under either
//! runtime. The node is what enforces identity checks, deletes, expiry and
//! limits; a sandbox nobody polices is a leak (under `process`, unisolated
//! code running with nobody to stop it). So: an isolated sandbox's first
//! process dies with the node (a parent-death signal), envd under `process` gets a parent-death signal, and
//! a graceful stop kills everything. After a crash, the next node process on
//! the same `--data-dir` adopts any sandbox whose envd still answers and
//! removes the rest (killing leftover processes by their mark).
//! The scheduler learns the truth from the next registration's roster.

// Tests may unwrap: a panic there is a test failure with a message.
#![cfg_attr(test, allow(clippy::unwrap_used))]

pub mod check;
pub mod config;
pub mod control;
pub mod envd;
pub mod http;
pub mod link;
pub mod logs;
pub mod metrics;
#[cfg(feature = "mutations")]
pub mod mutations;
pub mod proxy;
pub mod runtime;
pub mod samples;
pub mod sandbox;
pub mod secrets;
pub mod volumes;

pub use config::Config;

use config::{RuntimeChoice, Settings};
use runtime::limits::LimitPlan;
use runtime::Runtime;
use std::sync::Arc;
use tokio::net::TcpListener;
use tokio::sync::{mpsc, watch};
use warren_core::admin::Admin;
use warren_core::config::ConfigError;

/// Runs `warren node` until SIGTERM/Ctrl-C.
/// `mounts` says whether the process got its own mount namespace (see
/// [`runtime::disk::isolate_mounts`]; done before the runtime started).
pub async fn main(config: Config, mounts: Result<(), String>) -> anyhow::Result<()> {
    let settings = config.validate()?;
    if let Err(why) = &mounts {
        tracing::info!(%why, "the node shares the host's mount namespace");
    }
    run(settings, warren_core::shutdown::signal()).await
}

/// Picks the runtime: `auto` is isolated when everything it needs works
/// here (root, cgroups, idmapped mounts — a probe is the first real
/// sandbox), else process.
async fn pick_runtime(
    s: &Settings,
    data_dir: &std::path::Path,
    proxy: Arc<runtime::egress::ProxySetup>,
) -> Result<Arc<dyn Runtime>, ConfigError> {
    let isolated = match s.runtime {
        RuntimeChoice::Process => Err("--runtime process was asked for".to_string()),
        RuntimeChoice::Auto | RuntimeChoice::Isolated => isolated_runtime(s, data_dir, proxy),
    };
    match (isolated, s.runtime) {
        (Ok(rt), _) => Ok(Arc::new(rt)),
        (Err(why), RuntimeChoice::Isolated) => Err(ConfigError::Invalid(format!(
            "--runtime isolated does not work here: {why}"
        ))),
        (Err(why), _) => {
            if s.runtime == RuntimeChoice::Auto {
                tracing::info!(%why, "the isolated runtime is not usable; using the process runtime");
            }
            tracing::error!(
                "RUNTIME IS `process`: SANDBOXES ARE NOT ISOLATED AND NOT LIMITED. Code in a \
                 sandbox runs as this node's user and can read and change everything it can, \
                 see every process and reach every port and every other sandbox. Run the node \
                 as root on a machine with cgroups and idmapped mounts for isolation."
            );
            Ok(Arc::new(runtime::process::Process::new()))
        }
    }
}

fn isolated_runtime(
    s: &Settings,
    data_dir: &std::path::Path,
    proxy: Arc<runtime::egress::ProxySetup>,
) -> Result<runtime::isolated::Isolated, String> {
    if !nix::unistd::geteuid().is_root() {
        return Err("the node does not run as root".into());
    }
    let instance = format!("{:08x}", runtime::instance(data_dir) >> 32);
    let limits = LimitPlan::detect(&s.node_id, &instance);
    let ids = runtime::ids::IdRanges::new(
        s.sandbox_id_base,
        runtime::ids::ranges_above(s.sandbox_id_base).max(1),
        &s.id_lock_dir,
    )?;
    let layers = runtime::layers::Layers::open(&s.template_dir, s.blob.as_ref())?;
    let staged = runtime::disk::stage_binary(&s.envd_bin, &data_dir.join("bin"))
        .map_err(|e| format!("cannot stage the envd binary: {e}"))?;
    std::fs::create_dir_all(runtime::launch::STAGE)
        .map_err(|e| format!("cannot create {}: {e}", runtime::launch::STAGE))?;
    // Before anything can start a sandbox: the guard goes in here.
    let egress = match runtime::egress::Egress::detect(ids.span()) {
        Ok(e) => {
            tracing::info!(
                sandbox_domain = %runtime::egress::intercept::describe(&proxy),
                roots = s.egress.roots.len(),
                "egress proxy ready for sandboxes with egress rules"
            );
            if s.egress.roots.is_empty() {
                tracing::warn!("the egress proxy trusts no roots (no CA certificates on the host and no --egress-ca-file): every request it intercepts will fail verification");
            }
            Some(e.with_proxy(proxy))
        }
        Err(why) => {
            tracing::warn!(%why, "sandboxes get no network access on this node (only allow_internet_access=false creates work)");
            None
        }
    };
    if let Some(e) = &egress {
        e.sweep(|slot| ids.is_free(slot));
    }
    let mechanism = limits.mechanism();
    let rt = runtime::isolated::Isolated::new(
        limits,
        ids,
        s.envd_bin.clone(),
        staged,
        layers,
        egress.clone(),
        runtime::disk::Images::new(data_dir.join("images")),
    )?;
    let Some(store) = rt.layers().shared() else {
        tracing::info!(
            limits = mechanism,
            egress = egress.is_some(),
            layers = %rt.layers().describe(),
            "runtime: isolated (each sandbox a template's root in its own namespaces, id range, cgroups and disk)"
        );
        return Ok(rt);
    };
    let names: Vec<String> = store
        .list()
        .map(|l| l.into_iter().map(|t| t.name).collect())
        .unwrap_or_default();
    tracing::info!(
        limits = mechanism,
        egress = egress.is_some(),
        templates = %names.join(","),
        template_dir = %s.template_dir.display(),
        "runtime: isolated (each sandbox a template's root in its own namespaces, id range, cgroups and disk)"
    );
    if names.is_empty() {
        tracing::warn!(
            template_dir = %s.template_dir.display(),
            "no templates yet: build one with `warren template build templates/base.toml`"
        );
    }
    Ok(rt)
}

/// Runs the node with validated settings until `shutdown` resolves.
pub async fn run(
    settings: Settings,
    shutdown: impl std::future::Future<Output = ()>,
) -> anyhow::Result<()> {
    // The certificates before anything is made on disk: a bad one is
    // configuration, found as `--check-config` finds it.
    let trust = check::trust(&settings)?;
    std::fs::create_dir_all(settings.data_dir.join("sandboxes")).map_err(|e| {
        ConfigError::Invalid(format!(
            "--data-dir {}: cannot create it: {e}",
            settings.data_dir.display()
        ))
    })?;
    let data_dir = settings.data_dir.canonicalize().map_err(|e| {
        ConfigError::Invalid(format!("--data-dir {}: {e}", settings.data_dir.display()))
    })?;
    // The egress proxy's resolver talks to the scheduler on a client of
    // its own (the link's follows below).
    let egress_events = metrics::EgressEvents::default();
    let proxy = {
        let scheduler = warren_proto::client::Scheduler::new(
            &settings.schedulers,
            warren_proto::client::CONNECT_TIMEOUT,
            warren_proto::client::CALL_TIMEOUT,
            trust.as_deref(),
        )
        .map_err(|e| ConfigError::Invalid(format!("--scheduler: {e}")))?;
        let client = warren_egress::tls::client_config(settings.egress.roots.clone())
            .map_err(|e| anyhow::anyhow!("egress proxy TLS: {e}"))?;
        Arc::new(runtime::egress::ProxySetup {
            settings: Arc::new(warren_egress::Settings {
                client: Arc::new(client),
                sandbox_domain: settings
                    .egress
                    .sandbox_domain
                    .as_ref()
                    .map(|(d, _)| d.clone()),
                observe: Some(metrics::egress_observer(egress_events.clone())),
            }),
            resolver: Arc::new(secrets::SchedulerSecrets::new(
                scheduler,
                settings.node_id.clone(),
            )),
            gateway: settings
                .egress
                .sandbox_domain
                .as_ref()
                .map(|(_, g)| g.clone()),
        })
    };
    let runtime = pick_runtime(&settings, &data_dir, proxy).await?;

    let admin = Admin::new("warren_node");
    let metrics = {
        let mut reg = admin
            .registry
            .write()
            .map_err(|_| anyhow::anyhow!("metrics registry poisoned"))?;
        metrics::Metrics::register(&mut reg, egress_events)
    };
    let volumes = match volumes::VolumeStore::open(settings.volumes.clone(), &settings.node_id) {
        Ok(v) => {
            tracing::info!(
                store = v.kind(),
                dir = %settings.volumes.dir.display(),
                max_bytes = v.max_bytes(),
                "volumes: {}",
                if v.shared() {
                    "a shared store (each volume a directory any node with it serves; no size limit of warren's)"
                } else {
                    "local (each volume an ext4 image of its size limit, served by this node only)"
                }
            );
            Some(Arc::new(v))
        }
        Err(why) => {
            tracing::warn!(%why, "this node holds no volumes (creates that mount one are placed elsewhere)");
            None
        }
    };
    let (events_tx, events_rx) = mpsc::unbounded_channel();
    let registry = sandbox::Registry::new(
        sandbox::RegistryConfig {
            node_id: settings.node_id.clone(),
            data_dir,
            capacity: settings.capacity,
            envd_bin: settings.envd_bin.clone(),
            max_output_bytes: settings.max_output_bytes,
            envd_start_timeout: settings.envd_start_timeout,
            caps: settings.caps,
            warm_pool: settings.warm_pool.clone(),
            warm_pool_beyond_capacity: settings.warm_pool_beyond_capacity,
            log_bounds: settings.log_bounds,
        },
        runtime.clone(),
        metrics.clone(),
        events_tx,
        volumes,
    );
    registry.restore().await;

    let listener = TcpListener::bind(settings.listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.listen))?;
    let admin_listener = TcpListener::bind(settings.admin_listen)
        .await
        .map_err(|e| anyhow::anyhow!("cannot listen on {}: {e}", settings.admin_listen))?;
    let addr = listener.local_addr()?;
    let endpoint = settings
        .advertise
        .clone()
        .unwrap_or_else(|| addr.to_string());
    if settings.advertise.is_none() && addr.ip().is_unspecified() {
        tracing::warn!(%addr, "listening on a wildcard address without --advertise; gateways will be told {endpoint}");
    }
    {
        use std::io::Write;
        let mut out = std::io::stdout().lock();
        let _ = writeln!(out, "node runtime {}", runtime.kind().as_str());
        let _ = out.flush();
    }
    warren_core::announce("node", "http", addr);
    warren_core::announce("node", "admin", admin_listener.local_addr()?);

    let incarnation = loop {
        let n: u64 = rand::random();
        if n != 0 {
            break n;
        }
    };
    let scheduler = check::scheduler(&settings, trust.as_deref())?;
    // Only gateways may use the control API and the data plane.
    let listener = warren_trust::Listener::new(
        listener,
        trust.as_deref(),
        &[warren_trust::Role::Gateway],
        "node",
    )
    .map_err(ConfigError::Invalid)?;
    let (stop_tx, stop_rx) = watch::channel(false);
    let check_in = Arc::new(tokio::sync::Notify::new());
    let link = link::Link::new(
        link::NodeIdentity {
            node_id: settings.node_id.clone(),
            endpoint,
            capacity: settings.capacity,
            incarnation,
        },
        scheduler,
        registry.clone(),
        metrics.clone(),
        admin.clone(),
        settings.heartbeat_interval,
        check_in.clone(),
    );
    tokio::spawn(link.clone().run_heartbeats(stop_rx.clone()));
    tokio::spawn(link.run_events(events_rx));
    {
        let mut stop = stop_rx.clone();
        tokio::spawn(admin.clone().serve(
            admin_listener,
            async move {
                let _ = stop.wait_for(|s| *s).await;
            },
            settings.admin_listener,
        ));
    }

    let samples = Arc::new(samples::Samples::new(
        settings.metrics_interval,
        settings.metrics_samples,
    ));
    tokio::spawn(samples.clone().run(registry.clone(), stop_rx.clone()));
    let pool_task = tokio::spawn(registry.clone().run_warm_pool(stop_rx.clone()));
    let shared = Arc::new(http::Shared {
        registry,
        metrics,
        incarnation,
        check_in,
        samples,
    });
    let admin_for_shutdown = admin.clone();
    let shutdown_delay = settings.shutdown_delay;
    let shutdown = async move {
        warren_core::shutdown::readiness_first(shutdown, &admin_for_shutdown, shutdown_delay).await;
    };
    let registry = shared.registry.clone();
    http::serve(
        listener,
        shared,
        shutdown,
        settings.listener,
        admin.listeners.listener("http"),
    )
    .await;
    let _ = stop_tx.send(true);
    // The pool's task stops its sandboxes before the hosted ones go.
    let _ = pool_task.await;
    registry.shutdown_all().await;
    runtime.shutdown();
    tracing::info!("node stopped");
    Ok(())
}
