//! `warren-sim` (scripts/simulate): runs seeds of the deterministic
//! simulation and reports every violation with its seed; `--seed S`
//! replays one seed exactly and prints its trace (docs/simulation.md).

use clap::Parser;
use std::time::Instant;
use warren_sim::{Mutation, Options};

#[derive(Debug, Parser)]
#[command(
    name = "warren-sim",
    about = "Deterministic simulation of warren's routing layer"
)]
struct Args {
    /// How many seeds to run (from --first).
    #[arg(long, default_value_t = 100)]
    seeds: u64,
    /// The first seed of the range.
    #[arg(long, default_value_t = 0)]
    first: u64,
    /// Replay this one seed and print its trace.
    #[arg(long)]
    seed: Option<u64>,
    /// Client operations per run.
    #[arg(long, default_value_t = 30)]
    ops: usize,
    /// Threads running seeds side by side.
    #[arg(long, default_value_t = 1)]
    threads: u64,
    /// Break an invariant on purpose: `unfenced` or `no-generation-check`.
    #[arg(long)]
    mutation: Option<String>,
    /// Print every violating seed's violations (default: the first 20).
    #[arg(long)]
    all: bool,
}

fn mutation(name: Option<&str>) -> Result<Option<Mutation>, String> {
    match name {
        None => Ok(None),
        Some("unfenced") => Ok(Some(Mutation::Unfenced)),
        Some("no-generation-check") => Ok(Some(Mutation::NoGenerationCheck)),
        Some(other) => Err(format!(
            "--mutation {other:?}: expected unfenced or no-generation-check"
        )),
    }
}

/// Log lines stamped with simulated time (`WARREN_SIM_LOG=warren=debug`).
struct SimTime;

impl tracing_subscriber::fmt::time::FormatTime for SimTime {
    fn format_time(&self, w: &mut tracing_subscriber::fmt::format::Writer<'_>) -> std::fmt::Result {
        match turmoil::sim_elapsed() {
            Some(d) => write!(w, "t={}", d.as_millis()),
            None => write!(w, "t=?"),
        }
    }
}

fn main() {
    let args = Args::parse();
    if let Ok(filter) = std::env::var("WARREN_SIM_LOG") {
        tracing_subscriber::fmt()
            .with_env_filter(tracing_subscriber::EnvFilter::new(filter))
            .with_timer(SimTime)
            .with_writer(std::io::stderr)
            .init();
    }
    let mutation = match mutation(args.mutation.as_deref()) {
        Ok(m) => m,
        Err(e) => {
            eprintln!("warren-sim: {e}");
            std::process::exit(64);
        }
    };
    if let Some(seed) = args.seed {
        let outcome = warren_sim::run(&Options {
            seed,
            mutation,
            ops: args.ops,
        });
        for line in &outcome.trace {
            println!("{line}");
        }
        println!(
            "seed {seed}: {} violations, {} deliveries, {} answers, {} moves, {:?} simulated, fingerprint {:016x}",
            outcome.violations.len(),
            outcome.deliveries,
            outcome.answers,
            outcome.moves,
            outcome.simulated,
            outcome.fingerprint()
        );
        for v in &outcome.violations {
            println!("VIOLATION {v}");
        }
        std::process::exit(i32::from(!outcome.violations.is_empty()));
    }
    let start = Instant::now();
    let threads = args.threads.max(1);
    let (tx, rx) = std::sync::mpsc::channel();
    let handles: Vec<_> = (0..threads)
        .map(|t| {
            let tx = tx.clone();
            let (first, n, ops) = (args.first, args.seeds, args.ops);
            std::thread::spawn(move || {
                let mut seed = first + t;
                while seed < first + n {
                    let o = warren_sim::run(&Options {
                        seed,
                        mutation,
                        ops,
                    });
                    let _ = tx.send(o);
                    seed += threads;
                }
            })
        })
        .collect();
    drop(tx);
    let (mut runs, mut failing, mut deliveries, mut answers, mut moves) =
        (0u64, Vec::new(), 0u64, 0u64, 0u64);
    for o in rx {
        runs += 1;
        deliveries += o.deliveries;
        answers += o.answers;
        moves += o.moves;
        if !o.violations.is_empty() {
            // Said at once, so a long run stopped early still names them.
            for v in &o.violations {
                eprintln!("warren-sim: seed {}: {v}", o.seed);
            }
            failing.push((o.seed, o.violations));
        }
        if runs % 1000 == 0 {
            eprintln!(
                "warren-sim: {runs} seeds, {} violating, {:.0?}",
                failing.len(),
                start.elapsed()
            );
        }
    }
    for h in handles {
        let _ = h.join();
    }
    failing.sort_by_key(|(s, _)| *s);
    let shown = if args.all { failing.len() } else { 20 };
    for (seed, violations) in failing.iter().take(shown) {
        for v in violations {
            println!("seed {seed}: {v}");
        }
    }
    println!(
        "{runs} seeds ({}..{}), {} violating, {deliveries} deliveries, {answers} answers, {moves} moves, {:.1?} ({:.1} ms a seed)",
        args.first,
        args.first + args.seeds,
        failing.len(),
        start.elapsed(),
        start.elapsed().as_secs_f64() * 1000.0 / runs.max(1) as f64
    );
    if let Some((seed, _)) = failing.first() {
        println!("replay one: scripts/simulate --seed {seed}");
    }
    std::process::exit(i32::from(!failing.is_empty()));
}
