//! The timeouts and connection limits every listener gets, their defaults,
//! and how they meet the process's open-file limit.

use crate::config::ConfigError;
use std::time::Duration;

/// Timeouts and limits of one listener. Each part fills them from its own
/// flags (`--header-read-timeout`, `--idle-timeout`,
/// `--body-progress-timeout`, `--max-connections`, ...); docs/security.md,
/// "Listeners under load", lists them all.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    /// How long a client may take to send a complete request head: from
    /// being accepted (a handshake included) to the end of the first
    /// request's headers, and on a kept-alive connection from the first
    /// byte of a later request to the end of its headers. Then the
    /// connection is closed, so a silent or trickling client cannot hold a
    /// slot for long.
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight
    /// (HTTP/1.1 keep-alive, an HTTP/2 connection without streams); then it
    /// is closed gracefully.
    pub idle_timeout: Duration,
    /// How long a handler may wait for the next bytes of a request body
    /// before it has answered; then the request is abandoned with `408`.
    pub body_progress_timeout: Duration,
    /// Most connections open at once; past it new connections are accepted
    /// and closed at once, and established ones keep working.
    pub max_connections: usize,
    /// Most connections open at once from one IP address (`None`: no cap).
    /// Only listeners that know their peers' addresses (TCP) apply it.
    pub max_connections_per_peer: Option<usize>,
    /// How long in-flight requests may finish after shutdown; then the
    /// remaining connections are closed.
    pub drain: Duration,
}

impl Limits {
    /// Default of [`Limits::header_read_timeout`]: a request head is a few
    /// hundred bytes; any client that means to send one does so well within
    /// this.
    pub const HEADER_READ_TIMEOUT: Duration = Duration::from_secs(10);
    /// Default of [`Limits::idle_timeout`]: longer than the clients' own
    /// keep-alive pools (the gateway's towards nodes keeps idle connections
    /// 60 s, Go's 90 s), so a client never reuses a connection the server is
    /// closing at the same moment. (The gateway's public listener waits
    /// longer: the e2b SDK keeps idle connections 300 s.)
    pub const IDLE_TIMEOUT: Duration = Duration::from_secs(120);
    /// Default of [`Limits::body_progress_timeout`].
    pub const BODY_PROGRESS_TIMEOUT: Duration = Duration::from_secs(30);
    /// Default connection limit of every admin listener (`/metrics`,
    /// health checks: a handful of clients).
    pub const ADMIN_MAX_CONNECTIONS: usize = 128;

    /// The default timeouts with `max_connections`, no per-peer cap, and
    /// `drain`.
    pub fn new(max_connections: usize, drain: Duration) -> Self {
        Limits {
            header_read_timeout: Self::HEADER_READ_TIMEOUT,
            idle_timeout: Self::IDLE_TIMEOUT,
            body_progress_timeout: Self::BODY_PROGRESS_TIMEOUT,
            max_connections,
            max_connections_per_peer: None,
            drain,
        }
    }

    /// Checks the flag values every part has and builds its listener's
    /// limits; `per_peer` 0 means no per-peer cap. Messages name the flag.
    pub fn from_flags(
        header_read_timeout: Duration,
        idle_timeout: Duration,
        body_progress_timeout: Duration,
        max_connections: usize,
        per_peer: usize,
        drain: Duration,
    ) -> Result<Self, ConfigError> {
        let zero = |flag: &str| {
            ConfigError::Invalid(format!(
                "{flag} must be greater than zero (a listener without it can be held open forever)"
            ))
        };
        if header_read_timeout.is_zero() {
            return Err(zero("--header-read-timeout"));
        }
        if idle_timeout.is_zero() {
            return Err(zero("--idle-timeout"));
        }
        if body_progress_timeout.is_zero() {
            return Err(zero("--body-progress-timeout"));
        }
        if max_connections == 0 {
            return Err(ConfigError::Invalid(
                "--max-connections must be at least 1".into(),
            ));
        }
        Ok(Limits {
            header_read_timeout,
            idle_timeout,
            body_progress_timeout,
            max_connections,
            max_connections_per_peer: (per_peer > 0).then_some(per_peer),
            drain,
        })
    }

    /// The same timeouts for another listener of the part (its admin
    /// listener) with its own connection limit, named by `flag` in errors,
    /// and no per-peer cap.
    pub fn for_admin(&self, max_connections: usize, flag: &str) -> Result<Self, ConfigError> {
        if max_connections == 0 {
            return Err(ConfigError::Invalid(format!("{flag} must be at least 1")));
        }
        Ok(Limits {
            max_connections,
            max_connections_per_peer: None,
            ..*self
        })
    }
}

/// Descriptors kept out of the connection budget: listeners, upstream
/// connections, files, logs. A quarter of the limit, at least 64.
fn reserve(soft: u64) -> u64 {
    (soft / 4).max(64)
}

/// Raises this process's soft open-file limit to its hard limit, so the
/// connection limits, not `EMFILE`, decide when connections are refused.
/// For parts that start no other programs (gateway, scheduler): children
/// would inherit the raised limit. Returns the soft limit now in force.
pub fn raise_fd_limit() -> Option<u64> {
    use nix::sys::resource::{getrlimit, setrlimit, Resource};
    let (soft, hard) = getrlimit(Resource::RLIMIT_NOFILE).ok()?;
    if soft < hard {
        match setrlimit(Resource::RLIMIT_NOFILE, hard, hard) {
            Ok(()) => {
                tracing::debug!(from = soft, to = hard, "raised the open-file limit");
                return Some(hard);
            }
            Err(e) => tracing::debug!(error = %e, soft, hard, "cannot raise the open-file limit"),
        }
    }
    Some(soft)
}

/// `max_connections` lowered to what the open-file limit leaves room for:
/// a limit the process cannot reach would make `EMFILE`, which also starves
/// established connections of upstream sockets, the limit. Said at info
/// level: the node's default meets a default open-file limit of 1024 under
/// `warren dev`, where a warning would only alarm.
pub(crate) fn fit_fd_limit(limits: Limits, listener: &str) -> Limits {
    use nix::sys::resource::{getrlimit, Resource};
    let Ok((soft, _)) = getrlimit(Resource::RLIMIT_NOFILE) else {
        return limits;
    };
    let room = usize::try_from(soft.saturating_sub(reserve(soft))).unwrap_or(usize::MAX);
    if limits.max_connections <= room {
        return limits;
    }
    tracing::info!(
        listener,
        configured = limits.max_connections,
        admitted = room.max(1),
        open_file_limit = soft,
        "the connection limit is more than the open-file limit (RLIMIT_NOFILE) leaves room for; \
         admitting fewer. Raise the limit (systemd: LimitNOFILE=) to admit more"
    );
    Limits {
        max_connections: room.max(1),
        ..limits
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn flags_are_checked_and_named() {
        let s = Duration::from_secs(1);
        let ok = Limits::from_flags(s, s, s, 10, 0, s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(ok.max_connections_per_peer, None, "0 turns the cap off");
        let capped = Limits::from_flags(s, s, s, 10, 3, s).unwrap_or_else(|e| panic!("{e}"));
        assert_eq!(capped.max_connections_per_peer, Some(3));
        let z = Duration::ZERO;
        for (args, flag) in [
            ((z, s, s, 10), "--header-read-timeout"),
            ((s, z, s, 10), "--idle-timeout"),
            ((s, s, z, 10), "--body-progress-timeout"),
            ((s, s, s, 0), "--max-connections"),
        ] {
            let err =
                Limits::from_flags(args.0, args.1, args.2, args.3, 0, s).expect_err("refused");
            assert!(err.to_string().contains(flag), "{err}");
        }
        let err = ok
            .for_admin(0, "--admin-max-connections")
            .expect_err("refused");
        assert!(err.to_string().contains("--admin-max-connections"), "{err}");
    }

    #[test]
    fn the_reserve_leaves_room_for_other_descriptors() {
        assert_eq!(reserve(1024), 256);
        assert_eq!(reserve(100), 64);
    }
}
