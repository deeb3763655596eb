//! `warren envd`'s configuration, and [`Settings`], the validated form the
//! server runs on.

use std::path::{Path, PathBuf};
use std::time::Duration;
use warren_core::config::{parse_duration, ConfigError};
use warren_core::server::Limits;

/// The env var that carries the sandbox's access token. Never a flag: argv is
/// visible to every process in the sandbox through `/proc`.
pub const ACCESS_TOKEN_ENV: &str = "WARREN_ENVD_ACCESS_TOKEN";

/// Command-line / env / TOML configuration for `warren envd`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "warren envd",
    about = "The agent inside a sandbox: E2B's envd API (process and filesystem RPCs, /files, /health) and a port relay"
)]
pub struct Config {
    /// Unix socket to serve the envd API on (what the node uses).
    #[arg(long, env = "WARREN_ENVD_SOCKET", conflicts_with = "listen")]
    pub socket: Option<PathBuf>,

    /// TCP address to serve the envd API on instead of a Unix socket (tests, development).
    #[arg(long, env = "WARREN_ENVD_LISTEN")]
    pub listen: Option<String>,

    /// Unix socket for the port relay (`<port>\n` → `OK\n` + spliced bytes).
    #[arg(long, env = "WARREN_ENVD_RELAY_SOCKET")]
    pub relay_socket: Option<PathBuf>,

    /// The sandbox's root directory: every client path is resolved under it,
    /// and neither `..` nor a symlink can lead out of it.
    #[arg(long, env = "WARREN_ENVD_ROOT", default_value = "/")]
    pub root: PathBuf,

    /// The user's home, as seen from inside the sandbox (relative to --root):
    /// relative client paths start here, and processes get it as cwd and HOME.
    #[arg(long, env = "WARREN_ENVD_HOME", default_value = "/home/user")]
    pub home: String,

    /// How much output (stdout and stderr together) each process keeps for
    /// replay with `ConnectRequest.offset`.
    #[arg(long, env = "WARREN_ENVD_MAX_OUTPUT_BYTES", default_value_t = 16 * 1024 * 1024)]
    pub max_output_bytes: usize,

    /// How many finished processes are kept so that Connect after exit works.
    #[arg(long, env = "WARREN_ENVD_KEEP_FINISHED", default_value_t = 64)]
    pub keep_finished: usize,

    /// Interval of keepalive events on process streams when the client sends
    /// no `Keepalive-Ping-Interval` header (the e2b SDK sends 50 s).
    #[arg(long, env = "WARREN_ENVD_KEEPALIVE", default_value = "30s", value_parser = parse_duration)]
    pub keepalive: Duration,

    /// Serve on the listening Unix sockets the node passed down (API, then
    /// relay; the `LISTEN_FDS` protocol) instead of binding paths: the node
    /// dials sockets the sandbox cannot rename or replace.
    #[arg(long, conflicts_with_all = ["socket", "listen", "relay_socket"])]
    pub inherited_sockets: bool,

    /// Read the access token and the sandbox's environment as JSON
    /// (`{"access_token": ..., "env_vars": {...}}`) from stdin, so neither is
    /// ever in an environment or on a command line.
    #[arg(long)]
    pub settings_on_stdin: bool,

    /// Run processes and create files as the user each request names
    /// (default `user`), from `<root>/etc/passwd`; envd itself stays root of
    /// the sandbox's user namespace.
    #[arg(long)]
    pub switch_users: bool,

    // Listener limits (docs/security.md, "Listeners under load"); under a
    // node, envd runs with these defaults.
    /// How long a client may take to send a request's headers, from
    /// connecting or from the first byte of a later request on a kept-alive
    /// connection; then the connection is closed.
    #[arg(long, env = "WARREN_ENVD_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight.
    #[arg(long, env = "WARREN_ENVD_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long a request body may send nothing while envd waits for it
    /// (before answering); then the request is answered 408.
    #[arg(long, env = "WARREN_ENVD_BODY_PROGRESS_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_progress_timeout: Duration,
    /// Most connections open at once on the API listener, and apart from
    /// those on the relay socket; past it new connections are closed at once.
    #[arg(long, env = "WARREN_ENVD_MAX_CONNECTIONS", default_value_t = DEFAULT_MAX_CONNECTIONS)]
    pub max_connections: usize,
}

/// Default `--max-connections`: envd's one client is its node, with a
/// connection per request in flight and per open stream. It stays within
/// what the usual open-file limit of 1024 leaves room for, which envd (like
/// its node) does not raise: the sandbox's processes would inherit it.
pub const DEFAULT_MAX_CONNECTIONS: usize = 512;

/// How long in-flight requests may finish after shutdown is asked for
/// (process streams end once their processes are killed).
const DRAIN: Duration = Duration::from_secs(2);

/// What the node writes to envd's stdin with `--settings-on-stdin`.
#[derive(Debug, Default, serde::Deserialize)]
#[serde(deny_unknown_fields)]
pub struct StdinSettings {
    #[serde(default)]
    pub access_token: Option<String>,
    #[serde(default)]
    pub env_vars: std::collections::BTreeMap<String, String>,
    /// The template's start command, if it has one.
    #[serde(default)]
    pub start: Option<crate::start::StartCommand>,
    /// The template's user: who a request naming nobody acts as (default
    /// `user`).
    #[serde(default)]
    pub default_user: Option<String>,
    /// The template's working directory: where the default user's
    /// processes start when a request names none (default: their home).
    #[serde(default)]
    pub default_workdir: Option<String>,
    /// CA certificates to install into the sandbox's trust store (its
    /// egress CA's; see [`crate::trust`]).
    #[serde(default)]
    pub ca_bundle: Option<String>,
    /// The sandbox's hostname (isolated: its id), set by envd before it
    /// serves (see [`crate::identity`]).
    #[serde(default)]
    pub hostname: Option<String>,
}

/// Where the envd API listens.
#[derive(Debug, Clone)]
pub enum ApiAddr {
    /// A Unix socket path (production: the node connects here).
    Unix(PathBuf),
    /// A TCP address (tests, development).
    Tcp(String),
}

/// Everything the server needs, validated. Built by [`Settings::from_config`]
/// or directly by tests.
#[derive(Debug, Clone)]
pub struct Settings {
    /// The sandbox root, canonicalized (so prefix checks on canonical paths work).
    pub root: PathBuf,
    /// The home directory as the client sees it (absolute, normalized).
    pub home: String,
    /// Per-process output retention in bytes.
    pub max_output_bytes: usize,
    /// How many finished processes stay reattachable.
    pub keep_finished: usize,
    /// Default keepalive interval on process streams.
    pub keepalive: Duration,
    /// The access token every request but `/health` must carry, if set.
    pub access_token: Option<String>,
    /// The sandbox's environment, applied to every process it starts.
    pub env_vars: std::collections::BTreeMap<String, String>,
    /// Whether requests run as the users they name (see [`crate::users`]).
    pub switch_users: bool,
    /// The template's start command, run once at start (see [`crate::start`]).
    pub start: Option<crate::start::StartCommand>,
    /// The template's user and working directory (see [`StdinSettings`]).
    pub default_user: Option<String>,
    pub default_workdir: Option<String>,
    /// The API listener's timeouts and connection limit; the relay socket
    /// has the same connection limit.
    pub listener: Limits,
}

impl Settings {
    /// Settings with defaults for `root` (tests start from here).
    pub fn new(root: impl AsRef<Path>) -> Result<Settings, ConfigError> {
        Settings::build(
            root.as_ref(),
            "/home/user",
            16 * 1024 * 1024,
            64,
            Duration::from_secs(30),
            None,
        )
    }

    /// Validates `config`; the access token and environment come from
    /// `stdin` (with `--settings-on-stdin`) or the token from
    /// `WARREN_ENVD_ACCESS_TOKEN` (development).
    pub fn from_config(
        config: &Config,
        stdin: Option<StdinSettings>,
    ) -> Result<Settings, ConfigError> {
        let (token, env_vars, start, user, workdir) = match stdin {
            Some(s) => (
                s.access_token,
                s.env_vars,
                s.start,
                s.default_user,
                s.default_workdir,
            ),
            None => (
                std::env::var(ACCESS_TOKEN_ENV).ok(),
                Default::default(),
                None,
                None,
                None,
            ),
        };
        let mut s = Settings::build(
            &config.root,
            &config.home,
            config.max_output_bytes,
            config.keep_finished,
            config.keepalive,
            token.filter(|t| !t.is_empty()),
        )?;
        s.env_vars = env_vars;
        s.switch_users = config.switch_users;
        s.start = start;
        s.default_user = user.filter(|u| !u.is_empty());
        s.default_workdir = workdir.filter(|w| w.starts_with('/'));
        s.listener = Limits::from_flags(
            config.header_read_timeout,
            config.idle_timeout,
            config.body_progress_timeout,
            config.max_connections,
            0,
            DRAIN,
        )?;
        Ok(s)
    }

    fn build(
        root: &Path,
        home: &str,
        max_output_bytes: usize,
        keep_finished: usize,
        keepalive: Duration,
        access_token: Option<String>,
    ) -> Result<Settings, ConfigError> {
        let root = std::fs::canonicalize(root)
            .map_err(|e| ConfigError::Invalid(format!("--root {}: {e}", root.display())))?;
        if !root.is_dir() {
            return Err(ConfigError::Invalid(format!(
                "--root {} is not a directory",
                root.display()
            )));
        }
        let home = crate::paths::normalize_absolute(home).map_err(|e| {
            ConfigError::Invalid(format!(
                "--home {home:?}: {e} (it must be absolute, like /home/user)"
            ))
        })?;
        if max_output_bytes < 1024 {
            return Err(ConfigError::Invalid(format!(
                "--max-output-bytes {max_output_bytes} is too small (at least 1024)"
            )));
        }
        if keepalive < Duration::from_millis(10) {
            return Err(ConfigError::Invalid(
                "--keepalive must be at least 10ms".to_string(),
            ));
        }
        Ok(Settings {
            root,
            home,
            max_output_bytes,
            keep_finished,
            keepalive,
            access_token,
            env_vars: Default::default(),
            switch_users: false,
            start: None,
            default_user: None,
            default_workdir: None,
            listener: Limits::new(DEFAULT_MAX_CONNECTIONS, DRAIN),
        })
    }

    /// Replaces the access token (tests).
    pub fn with_access_token(mut self, token: impl Into<String>) -> Settings {
        self.access_token = Some(token.into());
        self
    }

    /// Sets a start command (tests).
    pub fn with_start(mut self, start: crate::start::StartCommand) -> Settings {
        self.start = Some(start);
        self
    }

    /// Replaces the listener limits (tests).
    pub fn with_listener(mut self, limits: Limits) -> Settings {
        self.listener = limits;
        self
    }

    /// Replaces the output retention (tests).
    pub fn with_max_output_bytes(mut self, bytes: usize) -> Settings {
        self.max_output_bytes = bytes.max(1);
        self
    }
}

impl Config {
    /// Where the API should listen: exactly one of `--socket` and `--listen`.
    pub fn api_addr(&self) -> Result<ApiAddr, ConfigError> {
        match (&self.socket, &self.listen) {
            (Some(path), None) => Ok(ApiAddr::Unix(path.clone())),
            (None, Some(addr)) => Ok(ApiAddr::Tcp(addr.clone())),
            (None, None) => Err(ConfigError::Invalid(
                "one of --socket PATH or --listen HOST:PORT is required".to_string(),
            )),
            (Some(_), Some(_)) => Err(ConfigError::Invalid(
                "--socket and --listen are mutually exclusive".to_string(),
            )),
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn relative_home_is_rejected() {
        let dir = tempfile::tempdir().expect("tempdir");
        let err = Settings::build(
            dir.path(),
            "home/user",
            4096,
            1,
            Duration::from_secs(1),
            None,
        )
        .expect_err("relative home");
        assert!(err.to_string().contains("--home"), "{err}");
    }
}
