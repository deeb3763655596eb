//! One run: the store, the hosts, the fault schedule and the loop that
//! steps turmoil and applies the faults when their time comes.

use crate::{check, net, sandbox, Mutation, Options, Outcome};
use rand::{Rng, SeedableRng};
use std::cell::Cell;
use std::path::{Path, PathBuf};
use std::sync::Arc;
use std::time::{Duration, UNIX_EPOCH};
use turmoil::net::TcpListener;
use warren_scheduler::store::SqlStore;

/// The parts, by host name.
pub const SCHEDULERS: &[&str] = &["sched-1", "sched-2"];
pub const GATEWAYS: &[&str] = &["gw-1", "gw-2"];
pub const NODES: &[&str] = &["node-1", "node-2", "node-3"];
pub const SCHEDULER_PORT: u16 = 7000;
pub const GATEWAY_PORT: u16 = 3000;
pub const NODE_PORT: u16 = 5000;
/// The one API key and team of the run's clients.
pub const API_KEY: &str = "sim-key";
pub const TEAM: &str = "sim-team";
/// The simulated wall clock starts here (2027-01-15).
const EPOCH_SECS: u64 = 1_800_000_000;
/// Turmoil's step: every host runs this much simulated time per step.
const TICK: Duration = Duration::from_millis(10);
/// A run that has not finished by then is a violation (a hang).
const RUN_LIMIT: Duration = Duration::from_secs(120);

thread_local! {
    /// The store clock's step (ms) now: the "clock skew" fault.
    static SKEW_MS: Cell<i64> = const { Cell::new(0) };
    /// On the store's thread: the simulated time the running operation
    /// began at (the simulation's thread waits for it).
    static OP_CLOCK_MS: Cell<i64> = const { Cell::new(0) };
    /// The store executor of this (simulation) thread.
    static STORE_RT: std::cell::OnceCell<tokio::runtime::Handle> = const { std::cell::OnceCell::new() };
}

/// The wall clock every part reads (`warren_core::time::now_ms`): the
/// simulation's time from a fixed epoch, stepped by the skew fault; on
/// the store's thread, the time its operation was handed over at.
fn wall_clock() -> i64 {
    match turmoil::since_epoch() {
        Some(d) => i64::try_from(d.as_millis()).unwrap_or(i64::MAX) + SKEW_MS.with(Cell::get),
        None => OP_CLOCK_MS.with(Cell::get),
    }
}

/// Process-wide setup: the clock, the envd dialer.
fn init() {
    static ONCE: std::sync::Once = std::sync::Once::new();
    ONCE.call_once(|| {
        warren_core::time::set_wall_clock(wall_clock);
        warren_node::envd::simulate_envd(sandbox::dial);
    });
}

/// This thread's store executor: a thread of its own with its own runtime,
/// where every store operation runs to its end while the simulation's
/// thread waits (`SqlStore::with_executor`).
fn store_runtime() -> tokio::runtime::Handle {
    STORE_RT.with(|h| {
        h.get_or_init(|| {
            let (tx, rx) = std::sync::mpsc::channel();
            std::thread::Builder::new()
                .name("sim-store".into())
                .spawn(move || {
                    let rt = match tokio::runtime::Builder::new_current_thread()
                        .enable_all()
                        .build()
                    {
                        Ok(rt) => rt,
                        Err(e) => panic!("the store's runtime: {e}"),
                    };
                    let _ = tx.send(rt.handle().clone());
                    rt.block_on(std::future::pending::<()>());
                })
                .unwrap_or_else(|e| panic!("the store's thread: {e}"));
            rx.recv()
                .unwrap_or_else(|e| panic!("the store's runtime handle: {e}"))
        })
        .clone()
    })
}

fn executor(rt: tokio::runtime::Handle) -> warren_scheduler::store::Executor {
    Arc::new(move |op| {
        let now = warren_core::time::now_ms();
        let unfenced = warren_scheduler::mutations::removals_unfenced();
        let (tx, rx) = std::sync::mpsc::channel();
        rt.spawn(async move {
            OP_CLOCK_MS.with(|c| c.set(now));
            warren_scheduler::mutations::unfence_removals(unfenced);
            op.await;
            let _ = tx.send(());
        });
        let _ = rx.recv();
    })
}

/// Opens the run's store (a fresh SQLite file under `dir`) on the store's
/// thread, with that thread as its executor.
fn open_store(dir: &Path, seed: u64) -> Arc<SqlStore> {
    let rt = store_runtime();
    let path = dir.join("scheduler.db");
    let sealer = Arc::new(warren_scheduler::store::seal::Sealer::ephemeral());
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        // The ids and tokens the store makes come from the run's seed too.
        warren_core::entropy::seed_this_thread(Some(seed ^ 0x5708_e5ee));
        let _ = tx.send(SqlStore::open_sqlite_file(path, 1, sealer).await);
    });
    let store = match rx.recv() {
        Ok(Ok(store)) => store,
        Ok(Err(e)) => panic!("cannot open the simulation's store: {e}"),
        Err(e) => panic!("the store's thread died: {e}"),
    };
    Arc::new(store.with_executor(executor(rt)))
}

/// The template every sandbox is made from (a record only: nothing is
/// unpacked in a simulation).
pub fn base_template() -> warren_template::Template {
    warren_template::Template {
        name: "base".into(),
        digest: format!("sha256-{}", "0".repeat(64)),
        defaults: Default::default(),
        created_at_ms: 1,
        source: "simulation".into(),
        layers: Vec::new(),
        snapshot: None,
        images: Vec::new(),
    }
}

fn scheduler_urls() -> Vec<String> {
    SCHEDULERS
        .iter()
        .map(|s| format!("http://{s}:{SCHEDULER_PORT}"))
        .collect()
}

fn scheduler_config() -> warren_scheduler::Config {
    use clap::Parser as _;
    let lease = format!("{}ms", crate::LEASE.as_millis());
    let sweep = format!("{}ms", crate::SWEEP.as_millis());
    let heartbeat = format!("{}ms", crate::HEARTBEAT.as_millis());
    warren_scheduler::Config::try_parse_from([
        "scheduler",
        "--lease",
        &lease,
        "--sweep-interval",
        &sweep,
        "--heartbeat-interval",
        &heartbeat,
        "--creating-timeout",
        "3s",
    ])
    .unwrap_or_else(|e| panic!("the simulation's scheduler flags: {e}"))
}

fn gateway_settings(templates: &Path, staging: &Path) -> warren_gateway::Settings {
    use clap::Parser as _;
    let ttl = format!("{}ms", crate::ROUTE_TTL.as_millis());
    let schedulers = scheduler_urls().join(",");
    let api_key = format!("{API_KEY}:{TEAM}");
    let templates = templates.display().to_string();
    let config = warren_gateway::Config::try_parse_from([
        "gateway",
        "--scheduler",
        &schedulers,
        "--insecure-internal",
        "--api-key",
        &api_key,
        "--template-dir",
        &templates,
        "--domain",
        "sim.test",
        "--route-cache-ttl",
        &ttl,
        "--connect-timeout",
        "500ms",
        "--request-timeout",
        "3s",
    ])
    .unwrap_or_else(|e| panic!("the simulation's gateway flags: {e}"));
    let mut settings = config
        .validate()
        .unwrap_or_else(|e| panic!("the simulation's gateway settings: {e}"));
    settings.uploads.staging = staging.to_path_buf();
    settings
}

async fn scheduler_host(store: Arc<SqlStore>) -> turmoil::Result {
    let listener = TcpListener::bind(("0.0.0.0", SCHEDULER_PORT)).await?;
    warren_scheduler::serve_on(
        scheduler_config(),
        store,
        net::SchedulerListener(listener),
        std::future::pending::<()>(),
    )
    .await?;
    Ok(())
}

async fn gateway_host(templates: PathBuf, staging: PathBuf) -> turmoil::Result {
    let settings = gateway_settings(&templates, &staging);
    let scheduler = warren_proto::client::Scheduler::with_connector(
        &settings.schedulers,
        settings.connect_timeout,
        settings.request_timeout,
        net::SchedulerConnector,
    )?;
    let http = warren_gateway::node_client::NodeHttp::single(
        warren_gateway::node_client::NodePool::with_dial(net::node_dial()),
    );
    let admin = warren_core::admin::Admin::new("warren_gateway");
    let limits = settings.listener;
    let (app, _watch) = warren_gateway::assemble(settings, &admin, Arc::new(scheduler), http)?;
    let listener = TcpListener::bind(("0.0.0.0", GATEWAY_PORT)).await?;
    warren_gateway::serve_plain(
        app,
        net::Listener(listener),
        std::future::pending::<()>(),
        limits,
        admin.listeners.listener("http"),
    )
    .await;
    Ok(())
}

async fn node_host(name: &'static str, data_dir: PathBuf, templates: PathBuf) -> turmoil::Result {
    use warren_node::http as node_http;
    use warren_node::{link, metrics, samples, sandbox as nsb};
    std::fs::create_dir_all(data_dir.join("sandboxes"))?;
    let admin = warren_core::admin::Admin::new("warren_node");
    let metrics = {
        let mut reg = admin
            .registry
            .write()
            .map_err(|_| "metrics registry poisoned")?;
        metrics::Metrics::register(&mut reg, metrics::EgressEvents::default())
    };
    let store = warren_template::Store::open(&templates)?;
    let runtime = Arc::new(sandbox::SimRuntime::new(name, store, base_template()));
    let (events_tx, events_rx) = tokio::sync::mpsc::unbounded_channel();
    let registry = nsb::Registry::new(
        nsb::RegistryConfig {
            node_id: name.to_string(),
            data_dir,
            capacity: 100,
            envd_bin: PathBuf::from("/nonexistent/warren"),
            max_output_bytes: 1 << 20,
            envd_start_timeout: Duration::from_secs(2),
            caps: warren_node::config::Caps {
                memory_mb: 8192,
                cpus: 8.0,
                disk_mb: 20 * 1024,
                pids: 4096,
            },
            log_bounds: warren_node::logs::Bounds {
                entries: 1000,
                bytes: 512 * 1024,
            },
            // Warm pools are not simulated: every create is a cold one.
            warm_pool: Vec::new(),
            warm_pool_beyond_capacity: false,
        },
        runtime,
        metrics.clone(),
        events_tx,
        // Volumes are not simulated (docs/simulation.md).
        None,
    );
    registry.restore().await;
    let incarnation = loop {
        let n = warren_core::entropy::with(|r| r.next_u64());
        if n != 0 {
            break n;
        }
    };
    let scheduler = warren_proto::client::Scheduler::with_connector(
        &scheduler_urls(),
        Duration::from_millis(500),
        Duration::from_secs(3),
        net::SchedulerConnector,
    )?;
    let check_in = Arc::new(tokio::sync::Notify::new());
    let link = link::Link::new(
        link::NodeIdentity {
            node_id: name.to_string(),
            endpoint: format!("{name}:{NODE_PORT}"),
            capacity: 100,
            incarnation,
        },
        scheduler,
        registry.clone(),
        metrics.clone(),
        admin.clone(),
        Some(crate::HEARTBEAT),
        check_in.clone(),
    );
    let (_stop, stopped) = tokio::sync::watch::channel(false);
    tokio::spawn(link.clone().run_heartbeats(stopped));
    tokio::spawn(link.run_events(events_rx));
    let shared = Arc::new(node_http::Shared {
        registry,
        metrics,
        incarnation,
        check_in,
        samples: Arc::new(samples::Samples::new(Duration::from_secs(60), 1)),
    });
    let listener = TcpListener::bind(("0.0.0.0", NODE_PORT)).await?;
    let limits = warren_core::server::Limits::from_flags(
        Duration::from_secs(10),
        Duration::from_secs(120),
        Duration::from_secs(30),
        10_000,
        0,
        Duration::from_secs(1),
    )?;
    let handler = move |_peer, req: http::Request<warren_core::server::Incoming>| {
        note_node_request(name, &req);
        node_http::route(shared.clone(), req)
    };
    warren_core::server::serve(
        net::Listener(listener),
        handler,
        std::future::pending::<()>(),
        limits,
        admin.listeners.listener("http"),
    )
    .await;
    Ok(())
}

/// Tells the checker what a data-plane request names, before the node's
/// own identity check runs.
fn note_node_request<B>(node: &str, req: &http::Request<B>) {
    let h = req.headers();
    let get = |name: &str| h.get(name).and_then(|v| v.to_str().ok());
    let Some(id) = get(warren_core::headers::SANDBOX_ID) else {
        return;
    };
    let generation = get(warren_core::headers::GENERATION)
        .and_then(|g| g.parse().ok())
        .unwrap_or(0);
    let request = get(crate::REQUEST_HEADER).and_then(|r| r.parse().ok());
    let id = id.to_string();
    check::with(|c| c.node_request(node, &id, generation, request));
}

/// One fault, at a simulated time.
#[derive(Debug, Clone)]
pub enum Fault {
    /// No messages between two hosts, both ways, until repaired (then
    /// what was sent arrives, as TCP retransmits it).
    Partition(&'static str, &'static str),
    Repair(&'static str, &'static str),
    /// Messages between two hosts held (delayed, then delivered together).
    Hold(&'static str, &'static str),
    Release(&'static str, &'static str),
    /// A part's process dies (and with a node, its sandboxes).
    Crash(&'static str),
    /// ... and starts again.
    Restart(&'static str),
    /// The store's clock steps by this many milliseconds.
    ClockStep(i64),
}

/// Every host the faults may touch.
fn parts() -> Vec<&'static str> {
    let mut v: Vec<&'static str> = Vec::new();
    v.extend(SCHEDULERS);
    v.extend(GATEWAYS);
    v.extend(NODES);
    v
}

/// The run's faults, drawn from its seed: (when, what), in time order,
/// ending with everything healed at [`crate::FAULTS_END`] except, in some
/// runs, one node left dead (returned apart).
pub fn schedule(seed: u64) -> (Vec<(Duration, Fault)>, Option<&'static str>) {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed ^ 0x5eed_fa17);
    let parts = parts();
    let mut with_client = parts.clone();
    with_client.push("client");
    let end = crate::FAULTS_END.as_millis() as u64;
    let mut out = Vec::new();
    let n = rng.random_range(2..10);
    for _ in 0..n {
        let at = rng.random_range(200..end.saturating_sub(500));
        let dur = Duration::from_millis(rng.random_range(100..3000));
        let t = Duration::from_millis(at);
        let heal = (t + dur).min(crate::FAULTS_END);
        match rng.random_range(0..10) {
            0..=2 => {
                let a = parts[rng.random_range(0..parts.len())];
                let b = with_client[rng.random_range(0..with_client.len())];
                if a != b {
                    out.push((t, Fault::Partition(a, b)));
                    out.push((heal, Fault::Repair(a, b)));
                }
            }
            3..=4 => {
                let a = parts[rng.random_range(0..parts.len())];
                let b = with_client[rng.random_range(0..with_client.len())];
                let short =
                    (t + Duration::from_millis(rng.random_range(20..800))).min(crate::FAULTS_END);
                if a != b {
                    out.push((t, Fault::Hold(a, b)));
                    out.push((short, Fault::Release(a, b)));
                }
            }
            5..=8 => {
                let a = parts[rng.random_range(0..parts.len())];
                out.push((t, Fault::Crash(a)));
                out.push((heal, Fault::Restart(a)));
            }
            _ => {
                out.push((t, Fault::ClockStep(rng.random_range(-500..=500))));
            }
        }
    }
    // A node cut off from both gateways for a while: a resume of a
    // sandbox paused filesystem-only there moves it to another node.
    if rng.random_bool(0.5) {
        let node = NODES[rng.random_range(0..NODES.len())];
        let at = Duration::from_millis(rng.random_range(500..end - 1000));
        let heal = (at + Duration::from_millis(rng.random_range(500..3000))).min(crate::FAULTS_END);
        for g in GATEWAYS {
            out.push((at, Fault::Partition(node, g)));
            out.push((heal, Fault::Repair(node, g)));
        }
    }
    // A node partitioned from both schedulers past its lease: its
    // bindings go LOST while its sandboxes keep running.
    if rng.random_bool(0.5) {
        let node = NODES[rng.random_range(0..NODES.len())];
        let at = Duration::from_millis(rng.random_range(500..end / 2));
        let heal = (at + crate::LEASE + crate::SWEEP * 2).min(crate::FAULTS_END);
        for s in SCHEDULERS {
            out.push((at, Fault::Partition(node, s)));
            out.push((heal, Fault::Repair(node, s)));
        }
    }
    out.sort_by_key(|(t, _)| *t);
    let dead = rng
        .random_bool(0.25)
        .then(|| NODES[rng.random_range(0..NODES.len())]);
    (out, dead)
}

/// Heals everything at the end of the faults (a dead node stays dead).
fn heal_all(sim: &mut turmoil::Sim<'_>, crashed: &mut Vec<&'static str>, dead: Option<&str>) {
    let mut all = parts();
    all.push("client");
    for (i, a) in all.iter().enumerate() {
        for b in &all[i + 1..] {
            sim.release(*a, *b);
        }
    }
    for host in std::mem::take(crashed) {
        if Some(host) != dead {
            sim.bounce(host);
        } else {
            crashed.push(host);
        }
    }
}

fn crash(sim: &mut turmoil::Sim<'_>, host: &'static str) {
    let now = sim.elapsed().as_millis();
    sim.crash(host);
    if NODES.contains(&host) {
        sandbox::node_died(host);
        check::with(|c| c.node_crashed(host));
    }
    check::with(|c| c.trace.push(format!("t={now} crash {host}")));
}

/// Runs one seed.
pub fn run(options: &Options) -> Outcome {
    init();
    warren_core::entropy::seed_this_thread(Some(options.seed));
    warren_core::blocking::run_inline_on_this_thread(true);
    SKEW_MS.with(|s| s.set(0));
    set_mutation(options.mutation);
    let dir = tempfile::tempdir().unwrap_or_else(|e| panic!("a scratch directory: {e}"));
    let templates = dir.path().join("templates");
    let staging = dir.path().join("staging");
    std::fs::create_dir_all(&staging).unwrap_or_else(|e| panic!("{e}"));
    warren_template::Store::open(&templates)
        .and_then(|s| s.put(&base_template()))
        .unwrap_or_else(|e| panic!("the simulation's template store: {e}"));
    let store = open_store(dir.path(), options.seed);
    sandbox::reset();
    check::begin(
        store.clone(),
        i64::try_from(crate::ROUTE_TTL.as_millis()).unwrap_or(i64::MAX),
        i64::try_from(crate::IN_FLIGHT.as_millis()).unwrap_or(i64::MAX),
        Vec::new(),
    );

    let mut sim = turmoil::Builder::new()
        .rng_seed(options.seed)
        .epoch(UNIX_EPOCH + Duration::from_secs(EPOCH_SECS))
        .tick_duration(TICK)
        .simulation_duration(RUN_LIMIT + Duration::from_secs(10))
        .min_message_latency(Duration::from_millis(1))
        .max_message_latency(Duration::from_millis(20))
        .build();
    for name in SCHEDULERS {
        let store = store.clone();
        sim.host(*name, move || scheduler_host(store.clone()));
    }
    for name in GATEWAYS {
        let (t, s) = (templates.clone(), staging.join(name));
        sim.host(*name, move || {
            let _ = std::fs::create_dir_all(&s);
            gateway_host(t.clone(), s.clone())
        });
    }
    for name in NODES {
        let (d, t) = (dir.path().join(name), templates.clone());
        sim.host(*name, move || node_host(name, d.clone(), t.clone()));
    }
    let (faults, dead) = schedule(options.seed);
    sim.client(
        "client",
        crate::client::drive(options.seed, options.ops, dead, store.clone()),
    );

    let mut faults = faults.into_iter().peekable();
    let mut crashed: Vec<&'static str> = Vec::new();
    let mut healed = false;
    let mut failure = None;
    loop {
        let now = sim.elapsed();
        while let Some((at, _)) = faults.peek() {
            if *at > now {
                break;
            }
            let Some((_, fault)) = faults.next() else {
                break;
            };
            check::with(|c| {
                c.trace
                    .push(format!("t={} fault {fault:?}", now.as_millis()))
            });
            match fault {
                // turmoil drops what crosses a partition, and its TCP does
                // not retransmit: a connection that lost a segment stalls
                // for good. Real TCP delivers, late, once the network
                // heals; so a partition here holds the link's traffic and
                // delivers it when repaired (connects and calls time out
                // meanwhile, as they would).
                Fault::Partition(a, b) => sim.hold(a, b),
                Fault::Repair(a, b) => sim.release(a, b),
                Fault::Hold(a, b) => sim.hold(a, b),
                Fault::Release(a, b) => sim.release(a, b),
                Fault::Crash(h) if !crashed.contains(&h) => {
                    crash(&mut sim, h);
                    crashed.push(h);
                }
                Fault::Crash(_) => {}
                Fault::Restart(h) => {
                    if let Some(i) = crashed.iter().position(|c| *c == h) {
                        crashed.remove(i);
                        sim.bounce(h);
                    }
                }
                Fault::ClockStep(ms) => SKEW_MS.with(|s| s.set(s.get() + ms)),
            }
        }
        if !healed && now >= crate::FAULTS_END {
            healed = true;
            heal_all(&mut sim, &mut crashed, None);
            if let Some(node) = dead {
                crash(&mut sim, node);
                crashed.push(node);
            }
            check::with(|c| {
                c.trace
                    .push(format!("t={} healed; dead node {dead:?}", now.as_millis()))
            });
        }
        match sim.step() {
            Ok(true) => break,
            Ok(false) => {}
            Err(e) => {
                failure = Some(format!("a part failed: {e}"));
                break;
            }
        }
        if now > RUN_LIMIT {
            failure = Some(format!("the run did not finish within {RUN_LIMIT:?}"));
            break;
        }
    }
    let simulated = sim.elapsed();
    drop(sim);
    check::with(|c| c.follow_changes());
    let mut checker = check::end().unwrap_or_default();
    if let Some(f) = failure {
        checker.violation(f);
    }
    sandbox::reset();
    set_mutation(None);
    warren_core::blocking::run_inline_on_this_thread(false);
    warren_core::entropy::seed_this_thread(None);
    close(&store);
    Outcome {
        seed: options.seed,
        violations: checker.violations,
        trace: checker.trace,
        deliveries: checker.deliveries,
        answers: checker.answers,
        moves: checker.moves,
        simulated,
    }
}

/// Closes the store's pools on its thread.
fn close(store: &SqlStore) {
    let rt = store_runtime();
    let done = store.close();
    let (tx, rx) = std::sync::mpsc::channel();
    rt.spawn(async move {
        done.await;
        let _ = tx.send(());
    });
    let _ = rx.recv();
}

fn set_mutation(m: Option<Mutation>) {
    warren_scheduler::mutations::unfence_removals(m == Some(Mutation::Unfenced));
    warren_node::mutations::skip_generation_check(m == Some(Mutation::NoGenerationCheck));
}
