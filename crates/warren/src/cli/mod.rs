//! Operator commands: placeholder, being written.

use std::ffi::OsString;
use std::process::ExitCode;
use warren_core::logging::LogFormat;

pub fn run(sub: &str, _args: Vec<OsString>, _log: LogFormat) -> ExitCode {
    eprintln!("warren {sub}: not implemented yet");
    ExitCode::FAILURE
}
