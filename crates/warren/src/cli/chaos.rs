//! `warren chaos failover`: the failover experiment (see `warren-chaos` and
//! docs/failover.md).
//!
//! Exit codes: 0 the experiment ran and lost no data; 2 it ran and found lost
//! data (a duplicate sandbox, an incomplete stream, a workflow with an
//! unknown outcome); 1 it could not run; 64 bad usage.

use std::ffi::OsString;
use std::process::ExitCode;
use warren_core::config::{self, ConfigError, EX_CONFIG};
use warren_core::logging::{self, LogFormat};

const USAGE: &str = "\
Usage: warren chaos failover --component gateway|scheduler|node [OPTIONS]

Experiments:
  failover   kill one replica under load behind HAProxy L4/L7; record every probe

`warren chaos failover --help` lists the options.
";

pub fn run(mut args: Vec<OsString>, log_format: LogFormat) -> ExitCode {
    match args
        .get(1)
        .map(|a| a.to_string_lossy().into_owned())
        .as_deref()
    {
        Some("failover") => {}
        Some("-h" | "--help" | "help") => {
            print!("{USAGE}");
            return ExitCode::SUCCESS;
        }
        other => {
            eprintln!("warren chaos: unknown experiment {other:?}\n\n{USAGE}");
            return ExitCode::from(EX_CONFIG as u8);
        }
    }
    args.remove(1);
    args[0] = "warren chaos failover".into();
    let cfg: warren_chaos::Config = match config::load_from(args, None) {
        Ok(c) => c,
        Err(ConfigError::Help(text)) => {
            print!("{text}");
            return ExitCode::SUCCESS;
        }
        Err(e) => {
            eprintln!("warren: bad configuration: {e}");
            return ExitCode::from(EX_CONFIG as u8);
        }
    };
    logging::init(log_format);
    let exe = match std::env::current_exe() {
        Ok(p) => p,
        Err(e) => {
            eprintln!("warren: cannot find the warren binary: {e}");
            return ExitCode::FAILURE;
        }
    };
    let rt = match crate::runtime(true) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    match rt.block_on(warren_chaos::run(cfg, &exe)) {
        Ok(s) => {
            let lost = !s.reconciled.duplicate_keys.is_empty()
                || s.unknown_workflows > 0
                || s.complete_streams < s.streams;
            if lost {
                eprintln!("warren chaos: data was lost (see the summary above)");
                ExitCode::from(2)
            } else {
                ExitCode::SUCCESS
            }
        }
        Err(e) => {
            eprintln!("warren chaos: {e:#}");
            ExitCode::FAILURE
        }
    }
}
