//! `warren-bench http-load`: sandbox traffic through a gateway, with a
//! latency timeline rather than one whole-run figure, and clients that
//! outlive the gateway (a refused or cut connection is counted and
//! dialled again), so a restart in the middle of a run can be watched.
//!
//! C keep-alive HTTP/1.1 connections each send `GET {path}` naming a
//! seeded sandbox by the E2B headers (`E2b-Sandbox-Id`,
//! `E2b-Sandbox-Port`), as the e2b SDK does with `E2B_SANDBOX_URL`.
//! With `--rate` the connections share a fixed offered rate, each on its
//! own schedule, and a latency is measured from when the request was due
//! (as wrk2 does), so a stall shows as the wait it causes and not as
//! fewer samples; a request that fails still uses its turn, so an outage
//! costs errors, not a burst of catch-up afterwards. Without `--rate`
//! each connection sends its next request when the last is answered.
//!
//! Prints one tab-separated line per interval (`#` lines are comments):
//! the interval's end (Unix ms), requests answered 2xx, answered otherwise,
//! failed (connect, reset, timeout), and p50/p99/max in ms; then totals and
//! the longest time without any answer. `--histograms FILE` writes each
//! interval's latency buckets, so a script can take percentiles over any
//! span of intervals.

use crate::hist::Histogram;
use anyhow::Context;
use bytes::Bytes;
use http_body_util::{BodyExt, Empty};
use hyper::client::conn::http1::SendRequest;
use hyper_util::rt::TokioIo;
use std::io::Write;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::sync::atomic::{AtomicU64, Ordering};
use std::sync::{Arc, Mutex};
use std::time::{Duration, SystemTime, UNIX_EPOCH};
use tokio::time::Instant;

#[derive(Debug, clap::Args)]
pub struct HttpLoad {
    /// The gateway's public address (`127.0.0.1:8080`).
    #[arg(long)]
    target: SocketAddr,
    /// Keep-alive connections.
    #[arg(long, default_value_t = 64)]
    connections: usize,
    /// Requests per second offered across all connections; 0: each
    /// connection sends as soon as its last request is answered.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Seconds to run.
    #[arg(long, default_value_t = 10)]
    duration: u64,
    /// Milliseconds per timeline line.
    #[arg(long, default_value_t = 1000)]
    interval_ms: u64,
    /// Seeded sandboxes to ask for (`{prefix}0..count`).
    #[arg(long)]
    count: u64,
    #[arg(long, default_value = "b")]
    prefix: String,
    /// Ask for every sandbox once, in order, then stop (fills a cache).
    #[arg(long)]
    walk: bool,
    /// Skew: the first this fraction of the sandboxes (0..1) ...
    #[arg(long, default_value_t = 0.0)]
    hot_ids: f64,
    /// ... get this share (0..1) of the requests; the rest are uniform
    /// over all. 0: uniform.
    #[arg(long, default_value_t = 0.0)]
    hot_share: f64,
    /// The sandbox port named in `E2b-Sandbox-Port`.
    #[arg(long, default_value_t = 49983)]
    port: u16,
    #[arg(long, default_value = "/health")]
    path: String,
    /// Give up on a request after this many milliseconds (counted failed).
    #[arg(long, default_value_t = 10_000)]
    timeout_ms: u64,
    /// Where to write each interval's latency buckets (`end_ms<TAB>us:count,...`).
    #[arg(long)]
    histograms: Option<PathBuf>,
}

/// What the connections share.
struct Ctx {
    args: HttpLoad,
    /// `Host` header: the target.
    host: String,
    /// The run's start, and the same instant as Unix ms.
    start: Instant,
    start_unix_ms: u64,
    /// The next sandbox for `--walk`.
    walk_next: AtomicU64,
    /// The interval being filled; the reporter swaps it out.
    window: Mutex<Window>,
    /// µs since `start` of the latest 2xx answer (0: none yet).
    last_ok: AtomicU64,
    /// The longest time without a 2xx answer: (length µs, ended at µs).
    longest_gap: Mutex<(u64, u64)>,
    /// The first few distinct failures, for stderr.
    failures: Mutex<Vec<String>>,
}

#[derive(Default)]
struct Window {
    latency: Histogram,
    ok: u64,
    other: u64,
    failed: u64,
}

fn unix_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map(|d| u64::try_from(d.as_millis()).unwrap_or(u64::MAX))
        .unwrap_or(0)
}

fn lock<T>(m: &Mutex<T>) -> std::sync::MutexGuard<'_, T> {
    // A panicked connection task leaves nothing half-written worth refusing.
    m.lock().unwrap_or_else(|e| e.into_inner())
}

impl Ctx {
    /// The next sandbox to ask for; None when a walk is done.
    fn pick(&self) -> Option<u64> {
        let a = &self.args;
        if a.walk {
            let k = self.walk_next.fetch_add(1, Ordering::Relaxed);
            return (k < a.count).then_some(k);
        }
        let hot = ((a.count as f64 * a.hot_ids) as u64).min(a.count);
        if hot > 0 && rand::random_bool(a.hot_share) {
            return Some(rand::random_range(0..hot));
        }
        Some(rand::random_range(0..a.count))
    }

    fn answered(&self, due: Instant, ok: bool) {
        let now = Instant::now();
        let micros = u64::try_from(now.duration_since(due).as_micros()).unwrap_or(u64::MAX);
        {
            let mut w = lock(&self.window);
            w.latency.record(micros);
            if ok {
                w.ok += 1;
            } else {
                w.other += 1;
            }
        }
        if ok {
            let at = u64::try_from(now.duration_since(self.start).as_micros()).unwrap_or(u64::MAX);
            let prev = self.last_ok.fetch_max(at, Ordering::Relaxed);
            if prev > 0 && at > prev {
                let mut g = lock(&self.longest_gap);
                if at - prev > g.0 {
                    *g = (at - prev, at);
                }
            }
        }
    }

    fn failed(&self, why: String) {
        lock(&self.window).failed += 1;
        let mut f = lock(&self.failures);
        if f.len() < 5 && !f.contains(&why) {
            f.push(why);
        }
    }
}

pub async fn run(args: HttpLoad) -> anyhow::Result<()> {
    anyhow::ensure!(args.connections > 0, "--connections must be at least 1");
    anyhow::ensure!(args.count > 0, "--count must be at least 1");
    anyhow::ensure!(args.interval_ms > 0, "--interval-ms must be at least 1");
    anyhow::ensure!(
        (0.0..=1.0).contains(&args.hot_ids) && (0.0..=1.0).contains(&args.hot_share),
        "--hot-ids and --hot-share are fractions between 0 and 1"
    );
    anyhow::ensure!(
        args.path.starts_with('/'),
        "--path must start with '/': {}",
        args.path
    );
    let mut buckets = match &args.histograms {
        Some(p) => Some(std::io::BufWriter::new(
            std::fs::File::create(p).with_context(|| format!("cannot create {}", p.display()))?,
        )),
        None => None,
    };
    let ctx = Arc::new(Ctx {
        host: args.target.to_string(),
        start: Instant::now(),
        start_unix_ms: unix_ms(),
        walk_next: AtomicU64::new(0),
        window: Mutex::new(Window::default()),
        last_ok: AtomicU64::new(0),
        longest_gap: Mutex::new((0, 0)),
        failures: Mutex::new(Vec::new()),
        args,
    });
    let a = &ctx.args;
    let until = ctx.start + Duration::from_secs(a.duration);
    let mut tasks = tokio::task::JoinSet::new();
    for slot in 0..a.connections {
        tasks.spawn(connection(ctx.clone(), slot, until));
    }

    let mut stdout = std::io::stdout().lock();
    writeln!(
        stdout,
        "#end_unix_ms\tok\tnon2xx\tfailed\tp50_ms\tp99_ms\tmax_ms"
    )?;
    let mut total = Window::default();
    let mut tick = tokio::time::interval_at(
        ctx.start + Duration::from_millis(a.interval_ms),
        Duration::from_millis(a.interval_ms),
    );
    tick.set_missed_tick_behavior(tokio::time::MissedTickBehavior::Delay);
    let mut last = false;
    while !last {
        tokio::select! {
            _ = tick.tick() => {}
            _ = tokio::time::sleep_until(until) => last = true,
            // A walk ends when every connection has run out of sandboxes.
            joined = tasks.join_next(), if a.walk => {
                if joined.is_some() {
                    continue;
                }
                last = true;
            }
        }
        let w = std::mem::take(&mut *lock(&ctx.window));
        let end = unix_ms();
        let ms = |q: f64| {
            w.latency
                .quantile(q)
                .map_or("-".to_string(), |us| format!("{:.2}", us as f64 / 1000.0))
        };
        writeln!(
            stdout,
            "{end}\t{}\t{}\t{}\t{}\t{}\t{}",
            w.ok,
            w.other,
            w.failed,
            ms(0.5),
            ms(0.99),
            ms(1.0)
        )?;
        stdout.flush()?;
        if let Some(b) = buckets.as_mut() {
            writeln!(b, "{end}\t{}", w.latency.sparse())?;
        }
        total.latency.merge(&w.latency);
        total.ok += w.ok;
        total.other += w.other;
        total.failed += w.failed;
    }
    tasks.abort_all();
    if let Some(mut b) = buckets {
        b.flush()?;
    }

    let secs = ctx.start.elapsed().as_secs_f64();
    let ms = |q: f64| total.latency.quantile(q).unwrap_or(0) as f64 / 1000.0;
    writeln!(
        stdout,
        "# total: {} ok, {} non-2xx, {} failed in {secs:.1} s ({:.0}/s answered) with {} connections; p50 {:.2} ms, p99 {:.2} ms, max {:.2} ms",
        total.ok,
        total.other,
        total.failed,
        (total.ok + total.other) as f64 / secs,
        a.connections,
        ms(0.5),
        ms(0.99),
        ms(1.0),
    )?;
    let (gap, ended) = *lock(&ctx.longest_gap);
    writeln!(
        stdout,
        "# longest without a 2xx answer: {:.1} ms, ended at {} (Unix ms)",
        gap as f64 / 1000.0,
        ctx.start_unix_ms + ended / 1000
    )?;
    for f in lock(&ctx.failures).iter() {
        eprintln!("http-load: failure seen: {f}");
    }
    Ok(())
}

/// One keep-alive connection's loop: pick a sandbox, (re)connect if
/// needed, ask, record.
async fn connection(ctx: Arc<Ctx>, slot: usize, until: Instant) {
    let a = &ctx.args;
    let period =
        (a.rate > 0).then(|| Duration::from_secs_f64(a.connections as f64 / a.rate as f64));
    // Spread the connections' schedules over one period.
    let mut due =
        ctx.start + period.map_or(Duration::ZERO, |p| p * slot as u32 / a.connections as u32);
    let mut conn: Option<SendRequest<Empty<Bytes>>> = None;
    let timeout = Duration::from_millis(a.timeout_ms);
    loop {
        let this = match period {
            Some(p) => {
                tokio::time::sleep_until(due).await;
                let this = due;
                due += p;
                this
            }
            None => Instant::now(),
        };
        if this >= until {
            return;
        }
        let Some(k) = ctx.pick() else { return };
        // A connection the gateway closed (a response with `Connection:
        // close`, or idle) is dialled again without counting a failure.
        if let Some(s) = conn.as_mut() {
            if s.ready().await.is_err() {
                conn = None;
            }
        }
        let sender = match conn.as_mut() {
            Some(s) => s,
            None => match tokio::time::timeout(timeout, dial(a.target)).await {
                Ok(Ok(s)) => conn.insert(s),
                Ok(Err(e)) => {
                    ctx.failed(format!("connect: {e:#}"));
                    back_off(period).await;
                    continue;
                }
                Err(_) => {
                    ctx.failed("connect: timed out".into());
                    continue;
                }
            },
        };
        let req = match hyper::Request::get(&a.path)
            .header(hyper::header::HOST, &ctx.host)
            .header("e2b-sandbox-id", format!("{}{k:019}", a.prefix))
            .header("e2b-sandbox-port", a.port)
            .body(Empty::new())
        {
            Ok(r) => r,
            Err(e) => {
                ctx.failed(format!("request: {e}"));
                return;
            }
        };
        let asked = async {
            let resp = sender.send_request(req).await?;
            let ok = resp.status().is_success();
            resp.into_body().collect().await?;
            Ok::<_, hyper::Error>(ok)
        };
        match tokio::time::timeout(timeout, asked).await {
            Ok(Ok(ok)) => ctx.answered(this, ok),
            Ok(Err(e)) => {
                conn = None;
                ctx.failed(format!("request: {e}"));
                back_off(period).await;
            }
            Err(_) => {
                conn = None;
                ctx.failed("request: timed out".into());
            }
        }
    }
}

/// Without a schedule, a connection that just failed waits a little
/// before dialling again rather than spinning on a closed port.
async fn back_off(period: Option<Duration>) {
    if period.is_none() {
        tokio::time::sleep(Duration::from_millis(10)).await;
    }
}

async fn dial(target: SocketAddr) -> anyhow::Result<SendRequest<Empty<Bytes>>> {
    let stream = tokio::net::TcpStream::connect(target).await?;
    stream.set_nodelay(true)?;
    let (sender, conn) = hyper::client::conn::http1::handshake(TokioIo::new(stream)).await?;
    // Driving the connection; it ends when either side closes it.
    tokio::spawn(conn);
    Ok(sender)
}
