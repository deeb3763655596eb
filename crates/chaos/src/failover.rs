//! `warren chaos failover`: set up, observe, signal, observe, restart,
//! observe, account for everything, report.

use crate::cluster::{Cluster, ClusterSpec, Component};
use crate::haproxy::{Backend, Balancer, Mode};
use crate::probes::{self, Ctx, Pending, Target, Targets};
use crate::record::Recorder;
use crate::report::{self, Summary};
use anyhow::Context;
use rand::{Rng, SeedableRng};
use std::collections::HashMap;
use std::path::{Path, PathBuf};
use std::sync::{Arc, Mutex, RwLock};
use std::time::Duration;
use warren_client::{Client, ClientBuilder, Command, NewSandbox, Sandbox};
use warren_core::config::parse_duration;

/// `warren chaos failover` flags.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "warren chaos failover",
    about = "Kill one replica of a component under load and record every probe: \
             2 schedulers on PostgreSQL, 2 gateways, 2 nodes, HAProxy L4 and L7"
)]
pub struct Config {
    /// Which component loses a replica.
    #[arg(long, value_enum)]
    pub component: Component,
    /// The signal it gets: TERM (graceful) or KILL.
    #[arg(long, value_enum, default_value = "KILL", ignore_case = true)]
    pub signal: Signal,
    /// Which balancers to put in front of the gateways.
    #[arg(long, value_enum, default_value = "both")]
    pub lb: Lb,
    /// Observation before the fault.
    #[arg(long, default_value = "10s", value_parser = parse_duration)]
    pub baseline: Duration,
    /// Observation after the fault, and again after the restart.
    #[arg(long, default_value = "20s", value_parser = parse_duration)]
    pub observe: Duration,
    /// Time between two probes of one kind through one entry point.
    #[arg(long, default_value = "500ms", value_parser = parse_duration)]
    pub probe_interval: Duration,
    /// Most probes per kind and entry point (bounds the run's request count).
    #[arg(long, default_value_t = 2000)]
    pub max_probes: u64,
    /// Where probes.json, probes.csv, summary.md, summary.json, timeline.svg
    /// and the processes' logs go.
    #[arg(long, default_value = "chaos-out")]
    pub out: PathBuf,
    /// Use this (empty) PostgreSQL database instead of starting a private server.
    #[arg(long, env = "WARREN_CHAOS_DATABASE_URL")]
    pub database_url: Option<String>,
    /// Seed for the run id and the probes' start jitter (random if unset).
    #[arg(long)]
    pub seed: Option<u64>,
    /// Sandbox runtime for the nodes: auto, isolated or process.
    #[arg(long, default_value = "auto")]
    pub runtime: String,
    /// Node lease given to the schedulers (how soon a killed node's sandboxes
    /// answer node-down).
    #[arg(long, default_value = "3s")]
    pub lease: String,
    /// `--shutdown-delay` for every part that has the flag (readiness false,
    /// still serving, so the balancers move away before the listener closes).
    #[arg(long, default_value = "2s")]
    pub shutdown_delay: String,
}

/// The signal sent to the replica.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Signal {
    #[value(name = "TERM")]
    Term,
    #[value(name = "KILL")]
    Kill,
}

impl Signal {
    fn name(self) -> &'static str {
        match self {
            Signal::Term => "TERM",
            Signal::Kill => "KILL",
        }
    }
}

/// Which balancers.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum Lb {
    L4,
    L7,
    Both,
}

/// The API key every probe uses.
const API_KEY: &str = "chaos-key";

/// Runs the experiment with the `warren` binary at `exe`; returns the summary
/// (also written to `config.out` and printed).
pub async fn run(config: Config, exe: &Path) -> anyhow::Result<Summary> {
    std::fs::create_dir_all(&config.out)
        .with_context(|| format!("cannot create {}", config.out.display()))?;
    let out = config.out.canonicalize()?;
    let seed = config.seed.unwrap_or_else(rand::random);
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let run = format!("chaos{:08x}", rng.random::<u32>());
    let work = tempfile::Builder::new().prefix("warren-chaos-").tempdir()?;
    std::fs::create_dir_all(work.path().join("logs"))?;

    // PostgreSQL: the user's, or a private one for this run.
    let mut pg = None;
    let database_url = match &config.database_url {
        Some(u) => u.clone(),
        None => {
            eprintln!("chaos: starting a private PostgreSQL server");
            let server =
                tokio::task::spawn_blocking(warren_harness::postgres::PgServer::start).await??;
            let url = server.create_database("warren")?;
            pg = Some(server);
            url
        }
    };
    let spec = ClusterSpec {
        database_url,
        runtime: config.runtime.clone(),
        api_key: API_KEY.into(),
        lease: config.lease.clone(),
        shutdown_delay: Some(config.shutdown_delay.clone()),
    };
    eprintln!("chaos: starting 2 schedulers, 2 nodes, 2 gateways");
    let mut cluster = Cluster::start(exe, work.path(), &spec).await?;
    let result = experiment(&config, &mut cluster, work.path(), &run, seed, &mut rng).await;
    cluster.stop().await;
    copy_logs(work.path(), &out);
    drop(pg);
    let (records, mut summary) = result?;
    summary.records = records.len();
    report::write_all(&out, &records, &summary)?;
    print!("{}", report::markdown(&summary));
    println!("\nOutputs in {}", out.display());
    Ok(summary)
}

async fn experiment(
    config: &Config,
    cluster: &mut Cluster,
    work: &Path,
    run: &str,
    seed: u64,
    rng: &mut rand::rngs::StdRng,
) -> anyhow::Result<(Vec<crate::record::Record>, Summary)> {
    let gateways: Vec<String> = cluster
        .gateways
        .iter()
        .map(|g| g.addr("gateway http"))
        .collect::<Result<_, _>>()?;
    let mut backends = Vec::new();
    for g in &cluster.gateways {
        let admin = g.addr("gateway admin")?;
        let port = admin
            .rsplit(':')
            .next()
            .and_then(|p| p.parse().ok())
            .context("gateway admin address has no port")?;
        backends.push(Backend {
            http: g.addr("gateway http")?,
            admin_port: port,
        });
    }
    let modes = match config.lb {
        Lb::L4 => vec![Mode::L4],
        Lb::L7 => vec![Mode::L7],
        Lb::Both => vec![Mode::L4, Mode::L7],
    };
    let mut balancers = Vec::new();
    for m in &modes {
        balancers.push(Balancer::start(*m, &backends, work).await?);
    }
    let result = observe(config, cluster, &balancers, &gateways, run, seed, rng).await;
    for b in balancers {
        b.stop().await;
    }
    result
}

/// A client of the gateways themselves (setup and reconciliation).
fn direct(gateways: &[String]) -> anyhow::Result<Client> {
    Ok(ClientBuilder::new(gateways)
        .api_key(API_KEY)
        .timeout(Duration::from_secs(10))
        .attempts(6)
        .backoff(Duration::from_millis(300))
        .build()?)
}

#[allow(clippy::too_many_arguments)]
async fn observe(
    config: &Config,
    cluster: &mut Cluster,
    balancers: &[Balancer],
    gateways: &[String],
    run: &str,
    seed: u64,
    rng: &mut rand::rngs::StdRng,
) -> anyhow::Result<(Vec<crate::record::Record>, Summary)> {
    let setup = direct(gateways)?;
    let runtime = cluster.node_runtime();
    // Every entry point answers before probing starts.
    for b in balancers {
        let c = ClientBuilder::new(std::slice::from_ref(&b.addr))
            .api_key(API_KEY)
            .attempts(20)
            .backoff(Duration::from_millis(100))
            .build()?;
        c.list()
            .await
            .with_context(|| format!("{} never answered", b.mode.name()))?;
    }

    // One sandbox per node for the command probes; node-2's also hosts the
    // long streams and is the list probes' anchor (node-1 is the one a node
    // fault kills).
    eprintln!("chaos: creating probe sandboxes");
    let mut targets = HashMap::new();
    for node in ["node-1", "node-2"] {
        let t = target_on(&setup, node, run, "setup").await?;
        targets.insert(node.to_string(), t);
    }
    let anchor = targets["node-2"].sandbox.clone();
    let targets: Targets = Arc::new(RwLock::new(targets));

    let rec = Arc::new(Recorder::new());
    let (stop_tx, stop_rx) = tokio::sync::watch::channel(false);
    let ctx = Ctx {
        rec: rec.clone(),
        stop: stop_rx,
        interval: config.probe_interval,
        max_probes: config.max_probes,
        timeout: Duration::from_secs(5),
        bwrap: runtime == "isolated",
        run: run.to_string(),
    };
    let pending: Arc<Mutex<Vec<Pending>>> = Arc::new(Mutex::new(Vec::new()));
    let total = config.baseline + config.observe * 2;
    // The streams outlast the observation: 20 lines a second.
    let lines = ((total.as_millis() / 50) as u32).max(20);
    let mut loops = Vec::new();
    let mut streams = Vec::new();
    for b in balancers {
        let name = b.mode.name().to_string();
        let entry = [b.addr.clone()];
        let single = |fresh: bool| {
            ClientBuilder::new(&entry)
                .api_key(API_KEY)
                .fresh_connections(fresh)
                .attempts(1)
                .resume_attempts(0)
                .timeout(ctx.timeout)
                .build()
        };
        let resilient = ClientBuilder::new(&entry)
            .api_key(API_KEY)
            .timeout(ctx.timeout)
            .attempts(4)
            .backoff(Duration::from_millis(250))
            .stream_idle_timeout(Duration::from_secs(10))
            .resume_attempts(20)
            .build()?;
        // Jitter the loops' start so probes of different kinds interleave.
        let jitter = |rng: &mut rand::rngs::StdRng| {
            Duration::from_millis(
                rng.random_range(0..config.probe_interval.as_millis().max(1) as u64),
            )
        };
        let (c, a, n, d) = (
            ctx.clone(),
            anchor.sandbox_id.clone(),
            name.clone(),
            jitter(rng),
        );
        let list = single(true)?;
        loops.push(tokio::spawn(async move {
            tokio::time::sleep(d).await;
            probes::list_loop(c, n, list, a).await
        }));
        for node in ["node-1", "node-2"] {
            let (c, n, t, d) = (ctx.clone(), name.clone(), targets.clone(), jitter(rng));
            let cmd = single(false)?;
            loops.push(tokio::spawn(async move {
                tokio::time::sleep(d).await;
                probes::command_loop(c, n, cmd, t, node.to_string()).await
            }));
        }
        let (mut c, n, p, r, d) = (
            ctx.clone(),
            name.clone(),
            pending.clone(),
            resilient.clone(),
            jitter(rng),
        );
        // Workflows are heavier: half as often.
        c.interval = config.probe_interval * 2;
        loops.push(tokio::spawn(async move {
            tokio::time::sleep(d).await;
            probes::workflow_loop(c, n, r, p).await
        }));
        let (c, n, s) = (ctx.clone(), name.clone(), anchor.clone());
        streams.push(tokio::spawn(probes::stream_once(c, n, resilient, s, lines)));
    }

    eprintln!("chaos: baseline {:?}", config.baseline);
    tokio::time::sleep(config.baseline).await;

    let index = match config.component {
        Component::Scheduler => cluster.leader().await.unwrap_or(0),
        _ => 0,
    };
    let replica = cluster.part_mut(config.component, index).name.clone();
    eprintln!("chaos: SIG{} {replica}", config.signal.name());
    if config.component == Component::Node {
        if let Ok(mut t) = targets.write() {
            if let Some(t) = t.get_mut("node-1") {
                t.lost = true;
            }
        }
    }
    rec.mark_fault();
    let part = cluster.part_mut(config.component, index);
    part.signal(match config.signal {
        Signal::Term => nix::sys::signal::Signal::SIGTERM,
        Signal::Kill => nix::sys::signal::Signal::SIGKILL,
    });
    let fault_deadline = tokio::time::Instant::now() + config.observe;
    let ((exit_after, on_its_own), _) = tokio::join!(
        part.wait_exit(config.observe.max(Duration::from_secs(15))),
        tokio::time::sleep_until(fault_deadline)
    );
    eprintln!("chaos: {replica} exited after {exit_after:?}; restarting it");

    rec.mark_restore();
    cluster.restart(config.component, index).await?;
    let restored_deadline = tokio::time::Instant::now() + config.observe;
    if config.component == Component::Node {
        // The restarted node hosts none of its old sandboxes (they died with
        // it); probe a new one there.
        match target_on(&setup, "node-1", run, "restored").await {
            Ok(t) => {
                if let Ok(mut ts) = targets.write() {
                    ts.insert("node-1".into(), t);
                }
            }
            Err(e) => eprintln!("chaos: no new sandbox on the restarted node-1: {e:#}"),
        }
    }
    eprintln!("chaos: observing after the restart");
    tokio::time::sleep_until(restored_deadline).await;
    let _ = stop_tx.send(true);
    for l in loops {
        let _ = l.await;
    }
    eprintln!("chaos: waiting for the streams to end");
    for s in streams {
        let _ = s.await;
    }
    let end_ms = rec.now_ms();

    eprintln!("chaos: reconciling");
    let pending = pending.lock().map(|p| p.clone()).unwrap_or_default();
    let reconciled = crate::reconcile::reconcile(&setup, &rec, run, &pending, &[]).await;
    let records = rec.snapshot();
    let (fault_ms, restore_ms) = rec.marks();
    let streams: Vec<_> = records.iter().filter(|r| r.kind == "stream").collect();
    let summary = Summary {
        component: config.component.to_string(),
        signal: config.signal.name().into(),
        replica,
        entries: balancers
            .iter()
            .map(|b| b.mode.name().to_string())
            .collect(),
        runtime,
        run: run.to_string(),
        seed,
        fault_ms,
        restore_ms,
        end_ms,
        exit_ms: exit_after.as_millis() as u64,
        exited_on_its_own: on_its_own,
        records: records.len(),
        rows: report::rows(&records),
        unknown_workflows: reconciled.unknown,
        reconciled,
        streams: streams.len(),
        complete_streams: streams
            .iter()
            .filter(|r| r.outcome == crate::record::Outcome::Ok)
            .count(),
    };
    Ok((records, summary))
}

/// Creates sandboxes until one lands on `node` (others are removed), starts
/// its counter, and waits until a probe reads it.
async fn target_on(client: &Client, node: &str, run: &str, label: &str) -> anyhow::Result<Target> {
    let mut extra = Vec::new();
    let mut found = None;
    for i in 0..12 {
        let mut new = NewSandbox::base(3600);
        new.metadata.insert("chaos_run".into(), run.into());
        // Keys are unique per call: a key names one sandbox for good (a
        // retry with it returns that sandbox, even a lost one).
        let key = format!("{run}-{label}-{node}-{i}");
        new.metadata.insert("chaos_key".into(), key.clone());
        let created = client.create(&new, &key).await?;
        if created.sandbox.client_id == node {
            found = Some(created.sandbox);
            break;
        }
        extra.push(created.sandbox.sandbox_id);
    }
    for id in extra {
        let _ = client.kill(&id).await;
    }
    let sandbox: Sandbox = found.with_context(|| format!("no sandbox landed on {node}"))?;
    let mut counter = Command::shell(probes::COUNTER_SETUP);
    counter
        .envs
        .insert("WARREN_CHAOS_ID".into(), sandbox.sandbox_id.clone());
    let mut stream = client.run(&sandbox, counter).await?;
    // Started is enough: the loop runs on in the sandbox without a client.
    while let Some(ev) = stream.next().await? {
        if matches!(ev, warren_client::StreamEvent::Started { .. }) {
            break;
        }
    }
    drop(stream);
    let check = Command::shell("cat $HOME/.chaos-counter");
    let started = warren_harness::poll_until(Duration::from_secs(5), || async {
        let out = client.run_to_end(&sandbox, check.clone()).await.ok()?;
        (out.exit.exit_code == 0).then_some(())
    })
    .await;
    anyhow::ensure!(
        started.is_some(),
        "the counter in {} never started",
        sandbox.sandbox_id
    );
    Ok(Target {
        node: node.to_string(),
        sandbox,
        lost: false,
    })
}

fn copy_logs(work: &Path, out: &Path) {
    let to = out.join("logs");
    let _ = std::fs::create_dir_all(&to);
    if let Ok(entries) = std::fs::read_dir(work.join("logs")) {
        for e in entries.flatten() {
            let _ = std::fs::copy(e.path(), to.join(e.file_name()));
        }
    }
}
