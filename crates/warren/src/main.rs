//! `warren`: one binary for every part.
//!
//! # Layout
//! - `main.rs`: parses the subcommand and hands the rest of the command line to
//!   that part's `Config` (flags + `WARREN_*` env + `--config FILE` TOML, via
//!   `warren_core::config`), then runs it. Bad configuration exits with 64.
//! - `dev.rs`: `warren dev`, a whole local cluster as child processes.
//! - `cli/`: operator commands (`sandbox`, `node`, `route`) over the gateway's API.
// Dev-dependencies are for the integration tests under tests/; this crate's
// own unit-test build sees them too.
#![cfg_attr(test, allow(unused_crate_dependencies))]

mod cli;
mod dev;

/// mimalloc instead of glibc's malloc: a proxied request allocates a few
/// dozen small blocks across hyper, rustls and the proxy, and glibc spent
/// ~280 instructions per allocate-and-free on the gateway's hot path
/// (callgrind, `bench/gateway.sh`); see docs/benchmarks.md for the effect.
#[global_allocator]
static ALLOCATOR: mimalloc::MiMalloc = mimalloc::MiMalloc;

use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use warren_core::config::{self, EX_CONFIG};
use warren_core::logging::{self, LogFormat};

const USAGE: &str = "\
warren — routing and control for AI agent sandboxes (speaks the E2B API)

Usage: warren <COMMAND> [OPTIONS]

Run a cluster:
  dev         a whole local cluster (scheduler, nodes, gateways) in one command
  scheduler   the source of truth for where sandboxes live
  gateway     the public entry: E2B REST API + sandbox traffic proxy
  node        a sandbox host
  envd        the agent inside each sandbox (started by the node)

Operate:
  sandbox     ls | create | exec | rm   (through a gateway)
  node ls     list nodes (through a gateway; needs an operator key)
  route <id>  how a gateway routes a sandbox: its cache vs the scheduler
  template    build FILE | import TARBALL --name N | ls   (sandbox templates)
  certs       init | issue --role R --name N --host H   (internal mutual TLS)
  chaos       failover: kill a replica under load behind HAProxy, record every probe

Every command takes --help. Settings come from flags, WARREN_* environment
variables, or a TOML file named by --config (or WARREN_CONFIG).
`warren scheduler|gateway|node ... --check-config` checks a part's whole
configuration as a start would, binds and starts nothing, and exits 0 or 64.
Logs: --log-format text|json (WARREN_LOG_FORMAT); filter with WARREN_LOG / RUST_LOG.
";

fn main() -> ExitCode {
    let mut args: Vec<OsString> = std::env::args_os().collect();
    if args.len() < 2 {
        eprint!("{USAGE}");
        return ExitCode::from(EX_CONFIG as u8);
    }
    let sub = args.remove(1).to_string_lossy().into_owned();
    // Whatever descriptors this process inherited (an operator's shell
    // leaves some open; a supervisor may too) go no further than this
    // process: nothing it starts gets one unless it is handed on by name.
    // Not for the sandbox's first processes, which pass theirs on by
    // number and close the rest themselves (`runtime::launch`). Before any
    // thread exists.
    if sub != warren_node::runtime::launch::SUBCOMMAND
        && sub != warren_node::runtime::launch::INIT_SUBCOMMAND
    {
        if let Err(e) = warren_sys::cloexec_from(3) {
            eprintln!("warren: cannot mark inherited descriptors close-on-exec: {e}");
            return ExitCode::FAILURE;
        }
    }
    let log_format = take_log_format(&mut args);
    let prog = format!("warren {sub}");
    args[0] = prog.clone().into();
    let is_part = matches!(sub.as_str(), "scheduler" | "gateway")
        || (sub == "node" && args.get(1).is_none_or(|a| a != "ls"));
    if is_part && take_switch(&mut args, CHECK_CONFIG) {
        return match sub.as_str() {
            "scheduler" => check::<warren_scheduler::Config>(args, log_format, |c| {
                warren_scheduler::check::check(&c)
            }),
            "gateway" => check::<warren_gateway::Config>(args, log_format, |c| {
                warren_gateway::check::check(&c)
            }),
            _ => check::<warren_node::Config>(args, log_format, |c| warren_node::check::check(&c)),
        };
    }
    match sub.as_str() {
        "-h" | "--help" | "help" => {
            print!("{USAGE}");
            ExitCode::SUCCESS
        }
        "-V" | "--version" | "version" => {
            println!("warren {}", env!("CARGO_PKG_VERSION"));
            ExitCode::SUCCESS
        }
        "scheduler" => {
            component::<warren_scheduler::Config, _, _>(args, log_format, warren_scheduler::main)
        }
        "gateway" => {
            component::<warren_gateway::Config, _, _>(args, log_format, warren_gateway::main)
        }
        "envd" => match warren_envd::take_inherited() {
            Ok(inherited) => component::<warren_envd::Config, _, _>(args, log_format, move |c| {
                warren_envd::main(c, inherited)
            }),
            Err(e) => {
                eprintln!("warren envd: {e}");
                ExitCode::from(EX_CONFIG as u8)
            }
        },
        // Internal: the first processes of an isolated sandbox, started by the node.
        warren_node::runtime::launch::SUBCOMMAND => {
            warren_node::runtime::launch::main(args.get(1..).unwrap_or_default())
        }
        warren_node::runtime::launch::INIT_SUBCOMMAND => {
            warren_node::runtime::launch::init_main(args.get(1..).unwrap_or_default())
        }
        "node" if args.get(1).is_some_and(|a| a == "ls") => cli::run(&sub, args, log_format),
        "node" => {
            // Before any thread exists: mount namespaces are per process only then.
            let mounts = warren_node::runtime::disk::isolate_mounts();
            component::<warren_node::Config, _, _>(args, log_format, move |c| {
                warren_node::main(c, mounts)
            })
        }
        "dev" => component::<dev::Config, _, _>(args, log_format, dev::main),
        "sandbox" | "route" => cli::run(&sub, args, log_format),
        "template" => cli::template::run(args),
        "certs" => cli::certs::run(args),
        "chaos" => cli::chaos::run(args, log_format),
        other => {
            eprintln!("warren: unknown command {other:?}\n\n{USAGE}");
            ExitCode::from(EX_CONFIG as u8)
        }
    }
}

// Set by `warren dev` and the chaos experiment on their children (through
// `warren_harness::Launch::exit_with_parent`): when the parent goes away
// (even by SIGKILL, which it cannot forward), the child shuts down as if it
// got SIGTERM.
use warren_harness::EXIT_WITH_PARENT;

async fn exit_with_parent() {
    let parent = nix::unistd::getppid();
    loop {
        tokio::time::sleep(std::time::Duration::from_millis(500)).await;
        if nix::unistd::getppid() != parent {
            tracing::warn!("parent process exited; shutting down");
            let _ = nix::sys::signal::raise(nix::sys::signal::Signal::SIGTERM);
            return;
        }
    }
}

/// `--log-format` is shared by every subcommand, so it is taken out before the
/// subcommand's own parser sees the line.
fn take_log_format(args: &mut Vec<OsString>) -> LogFormat {
    let mut format = match std::env::var("WARREN_LOG_FORMAT").as_deref() {
        Ok("json") => LogFormat::Json,
        _ => LogFormat::Text,
    };
    let mut i = 1;
    while i < args.len() {
        let a = args[i].to_string_lossy().into_owned();
        let value = if a == "--log-format" && i + 1 < args.len() {
            let v = args[i + 1].to_string_lossy().into_owned();
            args.drain(i..i + 2);
            Some(v)
        } else if let Some(v) = a.strip_prefix("--log-format=") {
            let v = v.to_string();
            args.remove(i);
            Some(v)
        } else {
            i += 1;
            None
        };
        match value.as_deref() {
            Some("json") => format = LogFormat::Json,
            Some("text") => format = LogFormat::Text,
            Some(other) => eprintln!("warren: ignoring unknown --log-format {other:?} (text|json)"),
            None => {}
        }
    }
    format
}

/// The switch that makes `warren scheduler|gateway|node` check its
/// configuration instead of starting. A flag on the part's own command
/// line, not a subcommand, so that the very line a unit or a chart renders
/// is checked by adding one word; and taken out before the part's parser
/// sees the line, so it is neither a TOML key nor a `WARREN_*` variable (a
/// check-only switch left in an environment would keep a part from ever
/// starting).
const CHECK_CONFIG: &str = "--check-config";

/// Removes every `flag` from the line; whether there was one.
fn take_switch(args: &mut Vec<OsString>, flag: &str) -> bool {
    let before = args.len();
    let mut first = true;
    // The program name stays whatever it is.
    args.retain(|a| std::mem::take(&mut first) || a.to_str() != Some(flag));
    args.len() != before
}

/// The `--config FILE` (or `WARREN_CONFIG`) named on the line, if any.
fn config_path(args: &[OsString]) -> Option<PathBuf> {
    let mut it = args.iter().skip(1);
    while let Some(a) = it.next() {
        let a = a.to_string_lossy();
        if a == "--config" {
            return it.next().map(PathBuf::from);
        }
        if let Some(v) = a.strip_prefix("--config=") {
            return Some(PathBuf::from(v));
        }
    }
    std::env::var_os("WARREN_CONFIG").map(PathBuf::from)
}

/// A part's configuration from the line, the environment and the file,
/// or the exit code (with `--help`'s text or the error printed).
fn load<C>(args: Vec<OsString>) -> Result<C, ExitCode>
where
    C: clap::CommandFactory + clap::FromArgMatches,
{
    let path = config_path(&args);
    match config::load_from(args, path.as_deref()) {
        Ok(c) => Ok(c),
        Err(config::ConfigError::Help(msg)) => {
            print!("{msg}");
            Err(ExitCode::SUCCESS)
        }
        Err(e) => {
            eprintln!("warren: bad configuration: {e}");
            Err(ExitCode::from(EX_CONFIG as u8))
        }
    }
}

/// `--check-config`: the configuration loaded as a start loads it, then
/// `check` (the part's own, which runs what its start runs before it binds
/// or starts anything); its report on stdout and 0, or the error a start
/// would print and 64.
fn check<C>(
    args: Vec<OsString>,
    log_format: LogFormat,
    check: impl FnOnce(C) -> Result<String, config::ConfigError>,
) -> ExitCode
where
    C: clap::CommandFactory + clap::FromArgMatches,
{
    let cfg: C = match load(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Warnings a start would log (`--insecure-internal`) are logged too.
    logging::init(log_format);
    // One thread: the scheduler clients' lazy channels need a runtime to
    // exist; nothing is spawned that outlives the check.
    let rt = match runtime(false) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(async move { check(cfg) }) {
        Ok(report) => {
            print!("{report}");
            ExitCode::SUCCESS
        }
        Err(e) => {
            // As `component` prints what a start's `main` returns.
            eprintln!("warren: {:#}", anyhow::Error::from(e));
            ExitCode::from(EX_CONFIG as u8)
        }
    }
}

/// Parses a part's configuration completely, then starts a runtime and runs it.
fn component<C, F, Fut>(args: Vec<OsString>, log_format: LogFormat, run: F) -> ExitCode
where
    C: clap::CommandFactory + clap::FromArgMatches,
    F: FnOnce(C) -> Fut,
    Fut: std::future::Future<Output = anyhow::Result<()>>,
{
    let cfg: C = match load(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    // Only this process watches its parent; what it starts does not inherit
    // the duty. Read and cleared before the runtime starts any thread:
    // changing the environment while other threads may read it is unsound.
    let watch_parent = std::env::var_os(EXIT_WITH_PARENT).is_some();
    if watch_parent {
        std::env::remove_var(EXIT_WITH_PARENT);
    }
    logging::init(log_format);
    let rt = match runtime(true) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    if watch_parent {
        rt.spawn(exit_with_parent());
    }
    match rt.block_on(run(cfg)) {
        Ok(()) => ExitCode::SUCCESS,
        Err(e) => {
            eprintln!("warren: {e:#}");
            match e.downcast_ref::<config::ConfigError>() {
                Some(_) => ExitCode::from(EX_CONFIG as u8),
                None => ExitCode::FAILURE,
            }
        }
    }
}

/// The async runtime for one command (multi-threaded for the parts, one
/// thread for the operator commands), or the exit code when it cannot start.
fn runtime(multi_thread: bool) -> Result<tokio::runtime::Runtime, ExitCode> {
    let mut builder = if multi_thread {
        tokio::runtime::Builder::new_multi_thread()
    } else {
        tokio::runtime::Builder::new_current_thread()
    };
    builder.enable_all().build().map_err(|e| {
        eprintln!("warren: cannot start the async runtime: {e}");
        ExitCode::FAILURE
    })
}
