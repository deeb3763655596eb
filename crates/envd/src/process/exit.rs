//! How a process ended, reported as E2B's envd does (Go's `ProcessState`).

use std::os::unix::process::ExitStatusExt;
use std::process::ExitStatus;

/// How a process ended, as E2B's envd reports it (Go's `ProcessState`).
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Exit {
    /// The exit code; -1 when killed by a signal.
    pub exit_code: i32,
    /// Whether it exited on its own (as opposed to by a signal).
    pub exited: bool,
    /// `"exit status 3"`, `"signal: killed"`, ...
    pub status: String,
    /// Set when envd could not wait for it.
    pub error: Option<String>,
}

/// Go's `ProcessState.String()` and `ExitCode()`, which E2B's envd reports.
pub fn exit_of(status: ExitStatus) -> Exit {
    if let Some(code) = status.code() {
        return Exit {
            exit_code: code,
            exited: true,
            status: format!("exit status {code}"),
            error: None,
        };
    }
    let sig = status.signal().unwrap_or(0);
    let mut text = format!("signal: {}", signal_name(sig));
    if status.core_dumped() {
        text.push_str(" (core dumped)");
    }
    Exit {
        exit_code: -1,
        exited: false,
        status: text,
        error: None,
    }
}

/// Go's names for signals in `ProcessState.String()`.
fn signal_name(sig: i32) -> String {
    let name = match sig {
        libc::SIGHUP => "hangup",
        libc::SIGINT => "interrupt",
        libc::SIGQUIT => "quit",
        libc::SIGILL => "illegal instruction",
        libc::SIGTRAP => "trace/breakpoint trap",
        libc::SIGABRT => "aborted",
        libc::SIGBUS => "bus error",
        libc::SIGFPE => "floating point exception",
        libc::SIGKILL => "killed",
        libc::SIGUSR1 => "user defined signal 1",
        libc::SIGSEGV => "segmentation fault",
        libc::SIGUSR2 => "user defined signal 2",
        libc::SIGPIPE => "broken pipe",
        libc::SIGALRM => "alarm clock",
        libc::SIGTERM => "terminated",
        _ => return format!("signal {sig}"),
    };
    name.to_string()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn exit_statuses_read_like_go() {
        let e = exit_of(ExitStatus::from_raw(3 << 8));
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (3, true, "exit status 3")
        );
        let e = exit_of(ExitStatus::from_raw(libc::SIGKILL));
        assert_eq!(
            (e.exit_code, e.exited, e.status.as_str()),
            (-1, false, "signal: killed")
        );
        let e = exit_of(ExitStatus::from_raw(libc::SIGTERM));
        assert_eq!(e.status, "signal: terminated");
    }
}
