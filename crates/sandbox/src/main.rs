//! `warren-sandbox`: the one binary an isolated sandbox runs, called by
//! the name of what to be (a multi-call binary, like busybox):
//! - `warren-sandbox sandbox-launch [--hold] ...`: the holder and the
//!   launcher (`warren_launch`), started by the node on the host;
//! - `warren-sandbox sandbox-init ...`: the sandbox's pid 1;
//! - `warren-sandbox envd ...`: the agent (`warren_envd`).
//!
//! The node starts it instead of its own `warren` binary when it finds it
//! beside that one (or is told where with `--envd-bin`): every sandbox
//! keeps a launcher, pid 1 and envd resident, so what they are made of
//! is what each idle sandbox costs the host (docs/benchmarks.md). It
//! links only envd and the launch code — no scheduler, gateway, node, SQL
//! or TLS — and the release build is statically linked (musl) and
//! optimised for size (`[profile.sandbox]` in the workspace's Cargo.toml;
//! README, "Building"): it runs in any template, whatever libc the
//! template has, or none.

use std::ffi::OsString;
use std::process::ExitCode;
use warren_core::config::{ConfigError, EX_CONFIG};
use warren_core::logging::{self, LogFormat};

const USAGE: &str = "\
warren-sandbox — what runs inside an isolated warren sandbox (started by the node)

Usage: warren-sandbox envd|sandbox-launch|sandbox-init [OPTIONS]
";

/// The most worker threads envd's runtime gets: one sandbox's agent, which
/// mostly waits, on a host that may have many cores and hundreds of
/// sandboxes (each thread is a kernel task and a stack).
const ENVD_WORKERS: usize = 2;

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.len() < 2 {
        eprint!("{USAGE}");
        return ExitCode::from(EX_CONFIG as u8);
    }
    let sub = args.remove(1).to_string_lossy().into_owned();
    match sub.as_str() {
        warren_launch::SUBCOMMAND => warren_launch::main(args.get(1..).unwrap_or_default()),
        warren_launch::INIT_SUBCOMMAND => {
            warren_launch::init_main(args.get(1..).unwrap_or_default())
        }
        "envd" => {
            args[0] = "warren envd".into();
            envd(args)
        }
        "-V" | "--version" | "version" => {
            println!("warren-sandbox {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        other => {
            eprintln!("warren-sandbox: unknown command {other:?}\n\n{USAGE}");
            ExitCode::from(EX_CONFIG as u8)
        }
    }
}

/// `envd`: as `warren envd` runs it (flags and `WARREN_ENVD_*`; no config
/// file), on a runtime of at most [`ENVD_WORKERS`] threads.
fn envd(args: Vec<OsString>) -> ExitCode {
    // Before any thread exists (it reads and clears `LISTEN_FDS`).
    let inherited = match warren_envd::take_inherited() {
        Ok(i) => i,
        Err(e) => {
            eprintln!("warren envd: {e}");
            return ExitCode::from(EX_CONFIG as u8);
        }
    };
    let config: warren_envd::Config = match warren_core::config::load_from(args, None) {
        Ok(c) => c,
        Err(ConfigError::Help(msg)) => {
            print!("{msg}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("warren envd: bad configuration: {e}");
            return ExitCode::from(EX_CONFIG as u8);
        }
    };
    logging::init(match std::env::var("WARREN_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    });
    let workers = std::thread::available_parallelism()
        .map_or(1, |n| n.get())
        .min(ENVD_WORKERS);
    let rt = match tokio::runtime::Builder::new_multi_thread()
        .worker_threads(workers)
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren envd: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
    };
    match rt.block_on(warren_envd::main(config, inherited)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren envd: {e:#}");
            match e.downcast_ref::<ConfigError>() {
                Some(_) => ExitCode::from(EX_CONFIG as u8),
                None => ExitCode::FAILURE,
            }
        }
    }
}
