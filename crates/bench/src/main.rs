//! `warren-bench`: load drivers for the scale benchmarks (`bench/*.sh`).
//! They drive real processes and print what they measured; nothing here
//! asserts on a number.
//!
//! # Layout
//! - `seed`: writes N running sandboxes (and the node they are on) into a
//!   scheduler's store, straight into its tables, so a million routes
//!   exist in seconds rather than hours of creates.
//! - `lookup`: `LookupNode` for random seeded sandboxes from C concurrent
//!   callers for D seconds: calls/s, p50/p99.
//! - `create`: `Place` + `RecordAssignment` from C concurrent callers for D
//!   seconds, onto a node this driver registers and keeps alive: creates/s,
//!   p50/p99 per create.
//! - `http-load`: sandbox traffic through a gateway from C keep-alive
//!   connections, at a fixed rate or as fast as answered, printing a
//!   latency timeline and riding out gateway restarts (`http_load.rs`,
//!   its histogram in `hist.rs`).
//! - `postgres`: a private PostgreSQL server (`warren_harness::postgres`)
//!   for the PostgreSQL runs, alive while the script holds its stdin.
//!
//! Sandbox ids are `{prefix}{i:019}` (lowercase and digits, as ids must be).

mod hist;
mod http_load;

use anyhow::Context;
use clap::Parser;
use std::sync::Arc;
use std::time::{Duration, Instant};
use warren_proto::scheduler::v1 as pb;
use warren_trust::{Role, TlsArgs};

#[derive(Debug, Parser)]
#[command(
    name = "warren-bench",
    about = "Load drivers for warren's scale benchmarks"
)]
enum Command {
    /// Write N running sandboxes on one node into a scheduler's store.
    Seed(Seed),
    /// LookupNode throughput against a scheduler.
    Lookup(Lookup),
    /// Place + RecordAssignment throughput against a scheduler.
    Create(Create),
    /// Sandbox traffic through a gateway, with a per-interval latency timeline.
    HttpLoad(http_load::HttpLoad),
    /// A private PostgreSQL server: prints `url <database URL>`, serves
    /// until stdin closes, then stops and removes it.
    Postgres,
}

#[derive(Debug, clap::Args)]
struct Seed {
    /// The store: `sqlite:///path/scheduler.db` or `postgres://...`.
    #[arg(long)]
    database_url: String,
    /// How many sandboxes (ids `{prefix}0..count`).
    #[arg(long)]
    count: u64,
    /// The first id's number (to add to an earlier seed).
    #[arg(long, default_value_t = 0)]
    from: u64,
    #[arg(long, default_value = "b")]
    prefix: String,
    /// The node they are on (created, with a lease that never runs out).
    #[arg(long, default_value = "bench-node")]
    node_id: String,
    /// The address routes point at.
    #[arg(long)]
    endpoint: String,
    #[arg(long, default_value = "bench")]
    team: String,
}

#[derive(Debug, clap::Args)]
struct Target {
    /// Scheduler URL.
    #[arg(long)]
    scheduler: String,
    /// A gateway certificate (the scheduler's clients are gateways).
    #[command(flatten)]
    tls: TlsArgs,
    /// Concurrent callers.
    #[arg(long, default_value_t = 64)]
    concurrency: usize,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
}

#[derive(Debug, clap::Args)]
struct Lookup {
    #[command(flatten)]
    target: Target,
    /// Seeded sandboxes to pick from (`{prefix}0..count`).
    #[arg(long)]
    count: u64,
    #[arg(long, default_value = "b")]
    prefix: String,
    /// Ids per call: 1 calls `LookupNode`; more call `LookupNodes` with
    /// that many random ids (what a gateway sends for concurrent misses).
    /// Rates and counts are then per id, latencies per call.
    #[arg(long, default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=1024))]
    batch: u32,
}

#[derive(Debug, clap::Args)]
struct Create {
    #[command(flatten)]
    target: Target,
    /// The node's certificate (PEM) to register as; its key next to it.
    #[arg(long)]
    node_cert: Option<std::path::PathBuf>,
    #[arg(long)]
    node_key: Option<std::path::PathBuf>,
    /// The node id to register (must match its certificate).
    #[arg(long, default_value = "bench-create")]
    node_id: String,
}

fn main() -> anyhow::Result<()> {
    let command = Command::parse();
    let rt = tokio::runtime::Builder::new_multi_thread()
        .enable_all()
        .build()?;
    rt.block_on(async move {
        match command {
            Command::Seed(s) => seed(s).await,
            Command::Lookup(l) => lookup(l).await,
            Command::Create(c) => create(c).await,
            Command::HttpLoad(h) => http_load::run(h).await,
            Command::Postgres => postgres().await,
        }
    })
}

async fn postgres() -> anyhow::Result<()> {
    let pg = warren_harness::postgres::PgServer::start()?;
    let url = pg.create_database("warren_bench")?;
    println!("url {url}");
    // Until the script closes our stdin (or exits).
    tokio::task::spawn_blocking(|| {
        let mut sink = String::new();
        while std::io::stdin()
            .read_line(&mut sink)
            .map(|n| n > 0)
            .unwrap_or(false)
        {}
    })
    .await?;
    drop(pg);
    Ok(())
}

fn id(prefix: &str, i: u64) -> String {
    format!("{prefix}{i:019}")
}

fn now_ms() -> i64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map(|d| i64::try_from(d.as_millis()).unwrap_or(i64::MAX))
        .unwrap_or(0)
}

async fn seed(s: Seed) -> anyhow::Result<()> {
    sqlx::any::install_default_drivers();
    let pool = sqlx::any::AnyPoolOptions::new()
        .max_connections(1)
        .connect(&s.database_url)
        .await
        .with_context(|| format!("cannot open {}", s.database_url))?;
    let now = now_ms();
    let far = now + 10 * 365 * 24 * 3600 * 1000;
    sqlx::query(
        "INSERT INTO nodes (node_id, endpoint, capacity, incarnation, lease_expires_at_ms, \
         registered_at_ms, state, roster, roster_at_ms) VALUES ($1, $2, $3, 1, $4, $5, 'up', '[]', $5) \
         ON CONFLICT (node_id) DO UPDATE SET lease_expires_at_ms = $4, endpoint = $2",
    )
    .bind(&s.node_id)
    .bind(&s.endpoint)
    .bind(i64::MAX / 2)
    .bind(far)
    .bind(now)
    .execute(&pool)
    .await
    .context("the node row")?;
    let started = Instant::now();
    const BATCH: u64 = 500;
    let end = s.from + s.count;
    let mut i = s.from;
    while i < end {
        let n = BATCH.min(end - i);
        let mut sql = String::from(
            "INSERT INTO bindings (sandbox_id, node_id, endpoint, generation, state, team_id, \
             template_id, started_at_ms, end_at_ms, metadata, env_vars, access_token, cpu_count, \
             memory_mb, assigned_at_ms, updated_at_ms) VALUES ",
        );
        for k in 0..n {
            let b = k * 5;
            if k > 0 {
                sql.push(',');
            }
            sql.push_str(&format!(
                "(${}, ${}, ${}, ${}, 'running', ${}, 'base', {now}, {far}, '{{}}', '{{}}', '', 2, 512, {now}, {now})",
                b + 1,
                b + 2,
                b + 3,
                b + 4,
                b + 5
            ));
        }
        let mut q = sqlx::query(&sql);
        for j in i..i + n {
            q = q
                .bind(id(&s.prefix, j))
                .bind(&s.node_id)
                .bind(&s.endpoint)
                .bind(i64::try_from(j + 1)?)
                .bind(&s.team);
        }
        q.execute(&pool).await.context("inserting bindings")?;
        i += n;
    }
    // Placement reads each node's kept count (schema 4), not the rows.
    sqlx::query("UPDATE nodes SET sandboxes = sandboxes + $2 WHERE node_id = $1")
        .bind(&s.node_id)
        .bind(i64::try_from(s.count)?)
        .execute(&pool)
        .await
        .context("the node's sandbox count")?;
    sqlx::query("UPDATE counters SET value = $1 WHERE name = 'generation' AND value < $1")
        .bind(i64::try_from(end)?)
        .execute(&pool)
        .await?;
    if s.database_url.starts_with("postgres") {
        // What autovacuum would do soon after a bulk load: without fresh
        // statistics the planner treats the table as empty.
        sqlx::query("ANALYZE bindings").execute(&pool).await?;
        sqlx::query("ANALYZE nodes").execute(&pool).await?;
    }
    println!(
        "seeded {} sandboxes ({}..{}) in {:.1} s",
        s.count,
        id(&s.prefix, s.from),
        id(&s.prefix, end.saturating_sub(1)),
        started.elapsed().as_secs_f64()
    );
    Ok(())
}

fn scheduler(t: &Target, role: Role) -> anyhow::Result<warren_proto::client::Scheduler> {
    let trust = t.tls.load(role, None).map_err(anyhow::Error::msg)?;
    let urls = warren_proto::client::parse_urls(std::slice::from_ref(&t.scheduler))?;
    Ok(warren_proto::client::Scheduler::new(
        &urls,
        Duration::from_secs(5),
        Duration::from_secs(30),
        trust.as_deref(),
    )?)
}

/// Latencies in microseconds, and the calls that failed.
#[derive(Default)]
struct Tally {
    micros: Vec<u32>,
    errors: u64,
    first_error: Option<String>,
}

impl Tally {
    fn merge(&mut self, other: Tally) {
        self.micros.extend(other.micros);
        self.errors += other.errors;
        if self.first_error.is_none() {
            self.first_error = other.first_error;
        }
    }

    fn record(&mut self, started: Instant, result: Result<(), tonic::Status>) {
        match result {
            Ok(()) => self
                .micros
                .push(u32::try_from(started.elapsed().as_micros()).unwrap_or(u32::MAX)),
            Err(e) => {
                self.errors += 1;
                self.first_error.get_or_insert_with(|| e.to_string());
            }
        }
    }

    fn report(self, what: &str, elapsed: Duration, concurrency: usize) {
        self.report_per(what, elapsed, concurrency, 1)
    }

    /// As [`Tally::report`] for calls of `per` items each: counts and the
    /// rate per item, latencies per call.
    fn report_per(mut self, what: &str, elapsed: Duration, concurrency: usize, per: u32) {
        self.micros.sort_unstable();
        let pct = |p: f64| -> f64 {
            if self.micros.is_empty() {
                return f64::NAN;
            }
            let i = ((self.micros.len() as f64 - 1.0) * p).round() as usize;
            f64::from(self.micros[i]) / 1000.0
        };
        let n = self.micros.len() * per as usize;
        println!(
            "{what}: {n} ok, {} errors in {:.1} s with {concurrency} callers: {:.0}/s, p50 {:.2} ms, p99 {:.2} ms",
            self.errors * u64::from(per),
            elapsed.as_secs_f64(),
            n as f64 / elapsed.as_secs_f64(),
            pct(0.5),
            pct(0.99),
        );
        if let Some(e) = self.first_error {
            println!("{what}: first error: {e}");
        }
    }
}

async fn lookup(l: Lookup) -> anyhow::Result<()> {
    let sched = Arc::new(scheduler(&l.target, Role::Gateway)?);
    // One call first, so connecting is not measured.
    let first = id(&l.prefix, 0);
    let _ = sched
        .call("LookupNode", |mut c| {
            let sandbox_id = first.clone();
            async move {
                c.lookup_node(pb::LookupNodeRequest {
                    sandbox_id,
                    ..Default::default()
                })
                .await
            }
        })
        .await
        .context("the first LookupNode")?;
    let until = Instant::now() + Duration::from_secs(l.target.duration);
    let started = Instant::now();
    let tasks: Vec<_> = (0..l.target.concurrency)
        .map(|_| {
            let (sched, prefix, count, batch) = (sched.clone(), l.prefix.clone(), l.count, l.batch);
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < until {
                    if batch > 1 {
                        let ids: Vec<String> = (0..batch)
                            .map(|_| id(&prefix, rand::random_range(0..count)))
                            .collect();
                        let t = Instant::now();
                        let r = sched
                            .call("LookupNodes", |mut c| {
                                let sandbox_ids = ids.clone();
                                async move {
                                    c.lookup_nodes(pb::LookupNodesRequest {
                                        sandbox_ids,
                                        min_revision: 0,
                                    })
                                    .await
                                }
                            })
                            .await;
                        let r =
                            r.and_then(|r| match r.results.iter().find(|x| x.route.is_none()) {
                                Some(x) => {
                                    Err(tonic::Status::new(x.code.into(), x.message.clone()))
                                }
                                None => Ok(()),
                            });
                        tally.record(t, r);
                        continue;
                    }
                    let sandbox_id = id(&prefix, rand::random_range(0..count));
                    let t = Instant::now();
                    let r = sched
                        .call("LookupNode", |mut c| {
                            let sandbox_id = sandbox_id.clone();
                            async move {
                                c.lookup_node(pb::LookupNodeRequest {
                                    sandbox_id,
                                    ..Default::default()
                                })
                                .await
                            }
                        })
                        .await;
                    tally.record(t, r.map(|_| ()));
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await?);
    }
    if l.batch > 1 {
        let what = format!("LookupNodes x{}", l.batch);
        tally.report_per(&what, started.elapsed(), l.target.concurrency, l.batch);
    } else {
        tally.report("LookupNode", started.elapsed(), l.target.concurrency);
    }
    Ok(())
}

async fn create(c: Create) -> anyhow::Result<()> {
    let sched = Arc::new(scheduler(&c.target, Role::Gateway)?);
    // The node: registered, and kept alive while the creates run.
    let node_tls = match (&c.node_cert, &c.node_key) {
        (Some(cert), Some(key)) => TlsArgs {
            tls_ca: c.target.tls.tls_ca.clone(),
            tls_cert: Some(cert.clone()),
            tls_key: Some(key.clone()),
            insecure_internal: false,
        },
        _ => c.target.tls.clone(),
    };
    let node_target = Target {
        scheduler: c.target.scheduler.clone(),
        tls: node_tls,
        concurrency: 1,
        duration: 0,
    };
    let trust = node_target
        .tls
        .load(Role::Node, Some(&c.node_id))
        .map_err(anyhow::Error::msg)?;
    let urls = warren_proto::client::parse_urls(std::slice::from_ref(&c.target.scheduler))?;
    let as_node = Arc::new(warren_proto::client::Scheduler::new(
        &urls,
        Duration::from_secs(5),
        Duration::from_secs(30),
        trust.as_deref(),
    )?);
    let node_id = c.node_id.clone();
    let incarnation = u64::try_from(now_ms())?;
    let registered = as_node
        .call("RegisterNode", |mut s| {
            let node_id = node_id.clone();
            async move {
                s.register_node(pb::RegisterNodeRequest {
                    node_id,
                    endpoint: "127.0.0.1:9".into(),
                    capacity: 1_000_000,
                    incarnation,
                    roster: Vec::new(),
                    cached_layers: vec![],
                    ..Default::default()
                })
                .await
            }
        })
        .await
        .context("RegisterNode")?;
    let beat = Duration::from_millis(registered.heartbeat_interval_ms.max(100));
    let heart = {
        let (as_node, node_id) = (as_node.clone(), node_id.clone());
        tokio::spawn(async move {
            loop {
                tokio::time::sleep(beat).await;
                let node_id = node_id.clone();
                let _ = as_node
                    .call("Heartbeat", |mut s| {
                        let node_id = node_id.clone();
                        async move {
                            s.heartbeat(pb::HeartbeatRequest {
                                node_id,
                                incarnation,
                                roster: Vec::new(),
                                cached_layers: vec![],
                                paused: Vec::new(),
                                lists_paused: false,
                            })
                            .await
                        }
                    })
                    .await;
            }
        })
    };
    let until = Instant::now() + Duration::from_secs(c.target.duration);
    let started = Instant::now();
    let tasks: Vec<_> = (0..c.target.concurrency)
        .map(|_| {
            let sched = sched.clone();
            tokio::spawn(async move {
                let mut tally = Tally::default();
                while Instant::now() < until {
                    let t = Instant::now();
                    let r = place_and_record(&sched).await;
                    tally.record(t, r);
                }
                tally
            })
        })
        .collect();
    let mut tally = Tally::default();
    for t in tasks {
        tally.merge(t.await?);
    }
    heart.abort();
    tally.report(
        "Place+RecordAssignment",
        started.elapsed(),
        c.target.concurrency,
    );
    Ok(())
}

async fn place_and_record(sched: &warren_proto::client::Scheduler) -> Result<(), tonic::Status> {
    let placement = sched
        .call("Place", |mut s| async move {
            s.place(pb::PlaceRequest {
                template_id: "base".into(),
                team_id: "bench".into(),
                timeout_secs: 3600,
                ..Default::default()
            })
            .await
        })
        .await?;
    sched
        .call("RecordAssignment", |mut s| {
            let p = placement.clone();
            async move {
                s.record_assignment(pb::RecordAssignmentRequest {
                    sandbox_id: p.sandbox_id,
                    node_id: p.node_id,
                    generation: p.generation,
                })
                .await
            }
        })
        .await?;
    Ok(())
}
