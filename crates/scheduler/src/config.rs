//! `warren scheduler` configuration: flags, `WARREN_SCHEDULER_*` env, TOML
//! (through `warren_core::config`), validated completely before anything binds.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::str::FromStr;
use std::time::Duration;
use warren_core::config::{parse_duration, ConfigError};
use warren_core::server::Limits;

/// `--quota-sandboxes`' default (see there).
pub const DEFAULT_QUOTA_SANDBOXES: u32 = 100;

/// Command-line / env / TOML configuration for `warren scheduler`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "warren scheduler",
    about = "The source of truth for where sandboxes live: node leases, fenced bindings, placement, sweeps."
)]
pub struct Config {
    /// gRPC listen address (IP:PORT; port 0 picks a free one).
    #[arg(
        long,
        env = "WARREN_SCHEDULER_LISTEN",
        default_value = "127.0.0.1:50051"
    )]
    pub listen: SocketAddr,

    /// Admin listener for /metrics, /healthz, /readyz.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_ADMIN_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub admin_listen: SocketAddr,

    /// Directory of the embedded store (`<dir>/scheduler.db`), created if missing.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_DATA_DIR",
        default_value = "./.warren/scheduler"
    )]
    pub data_dir: PathBuf,

    /// Store URL instead of --data-dir: `sqlite://PATH`, or
    /// `postgres://USER[:PASSWORD]@HOST[:PORT]/DB` to run several replicas on one database.
    #[arg(long, env = "WARREN_SCHEDULER_DATABASE_URL")]
    pub database_url: Option<String>,

    /// The key file sealing access tokens and `envVars` in the store: one
    /// or more keys of 64 hex digits, one per line, the first sealing, all
    /// opening; readable by its owner only (see docs/security.md, "Host
    /// files"). Required with PostgreSQL (every replica the same file);
    /// with SQLite, `store.key` beside the database is made on first start.
    #[arg(long, env = "WARREN_SCHEDULER_STORE_KEY_FILE")]
    pub store_key_file: Option<PathBuf>,

    /// The key file sealing team secrets (E2B's `/secrets`) in the store,
    /// in the same format as --store-key-file (the first key seals, all
    /// open; see docs/security.md, "Secrets and the egress proxy"). With
    /// SQLite, `secrets.key` beside the database is made on first start;
    /// with PostgreSQL, without it the scheduler keeps no secrets (the
    /// secrets API answers 503 naming this flag).
    #[arg(long, env = "WARREN_SCHEDULER_SECRETS_KEY_FILE")]
    pub secrets_key_file: Option<PathBuf>,

    /// Connections for reads (lookups, lists, watch replays); writes use one
    /// more, since writers take the store's write lock one at a time anyway.
    #[arg(long, env = "WARREN_SCHEDULER_DATABASE_POOL_SIZE", default_value_t = 8)]
    pub database_pool_size: u32,

    /// Keep every binding's route in memory (about 100 bytes a sandbox,
    /// loaded at start, kept exact by the change log) so `LookupNode` is a
    /// memory read; false reads the store for every lookup.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_LOOKUP_VIEW",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub lookup_view: bool,

    /// Node liveness lease: a node that has not heartbeated for this long is down.
    #[arg(long, env = "WARREN_SCHEDULER_LEASE", default_value = "10s", value_parser = parse_duration)]
    pub lease: Duration,

    /// How often nodes are told to heartbeat; must be shorter than --lease
    /// [default: 2s, or a third of --lease when that is shorter].
    #[arg(long, env = "WARREN_SCHEDULER_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,

    /// How often the sweep runs (dead nodes, expired sandboxes, stuck creates).
    #[arg(long, env = "WARREN_SCHEDULER_SWEEP_INTERVAL", default_value = "1s", value_parser = parse_duration)]
    pub sweep_interval: Duration,

    /// A binding still `creating` after this long is resolved from its node's
    /// roster; a running one its node has stopped listing for this long is removed.
    #[arg(long, env = "WARREN_SCHEDULER_CREATING_TIMEOUT", default_value = "60s", value_parser = parse_duration)]
    pub creating_timeout: Duration,

    /// How long a paused sandbox is kept before it is deleted (its node
    /// frees its disk), counted from its pause; 0 keeps paused sandboxes
    /// until they are resumed or deleted.
    #[arg(long, env = "WARREN_SCHEDULER_PAUSED_RETENTION", default_value = "0s", value_parser = parse_duration)]
    pub paused_retention: Duration,

    /// How long an ended sandbox's logs (what its node held at its end)
    /// are kept for `GET /sandboxes/{id}/logs`.
    #[arg(long, env = "WARREN_SCHEDULER_SANDBOX_LOG_RETENTION", default_value = "168h", value_parser = parse_duration)]
    pub sandbox_log_retention: Duration,

    /// What one team's kept logs of ended sandboxes may take in the store
    /// (each line its text plus 64 bytes); past it the team's oldest ended
    /// sandboxes' logs go first. 0: no bound.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_SANDBOX_LOG_TEAM_BYTES",
        default_value_t = 64 << 20
    )]
    pub sandbox_log_team_bytes: u64,

    /// How many binding changes are kept for WatchBindings resumes.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_WATCH_RETENTION",
        default_value_t = 100_000
    )]
    pub watch_retention: u64,

    /// On SIGTERM, how long in-flight RPCs may take before the process exits.
    #[arg(long, env = "WARREN_SCHEDULER_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// On SIGTERM, how long to keep serving with /readyz false before closing
    /// the listener (give health checks time to notice; 0 = close at once).
    #[arg(long, env = "WARREN_SCHEDULER_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Most sandboxes one team may have at once, running or paused (a
    /// paused one keeps its node slot: frozen, its memory; filesystem-only,
    /// its disk); a create past it is refused (the gateway answers 429).
    /// 0 = no limit. The default, 100, is E2B's Pro plan's concurrent
    /// sandboxes, so that one team cannot take every node slot.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_QUOTA_SANDBOXES",
        default_value_t = DEFAULT_QUOTA_SANDBOXES
    )]
    pub quota_sandboxes: u32,

    /// Most creates one team may make per minute (in bursts of up to that
    /// many); past it creates are refused (429). 0 = no limit.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_QUOTA_CREATES_PER_MINUTE",
        default_value_t = 0
    )]
    pub quota_creates_per_minute: u32,

    /// One team's own quotas, `TEAM=SANDBOXES/CREATES_PER_MINUTE` (0 = no
    /// limit), instead of the two settings above (repeatable;
    /// comma-separated in the environment).
    #[arg(
        long = "team-quota",
        env = "WARREN_SCHEDULER_TEAM_QUOTA",
        value_delimiter = ','
    )]
    pub team_quotas: Vec<String>,

    #[command(flatten)]
    pub tls: warren_trust::TlsArgs,

    /// TOML file with any of the settings above (read by the `warren` binary).
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,

    // Listener limits (docs/security.md, "Listeners under load").
    /// How long a client may take to send its first request (HTTP/2
    /// preface and headers) after connecting; then the connection is closed.
    #[arg(long, env = "WARREN_SCHEDULER_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// How long a connection may stay open with no RPC in flight (gateways
    /// and nodes reconnect on their next call).
    #[arg(long, env = "WARREN_SCHEDULER_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// How long a request stream may send nothing while the scheduler waits
    /// for it (before answering); then the RPC is ended.
    #[arg(long, env = "WARREN_SCHEDULER_BODY_PROGRESS_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_progress_timeout: Duration,

    /// Most connections open at once on the gRPC listener (gateways and
    /// nodes hold one or a few each); past it new ones are closed at once.
    #[arg(long, env = "WARREN_SCHEDULER_MAX_CONNECTIONS", default_value_t = 4096)]
    pub max_connections: usize,

    /// Most connections open at once on the admin listener.
    #[arg(
        long,
        env = "WARREN_SCHEDULER_ADMIN_MAX_CONNECTIONS",
        default_value_t = 128
    )]
    pub admin_max_connections: usize,
}

/// Refuses a scheduler whose own command line (`args`, as every account
/// on the host can read it in `/proc/<pid>/cmdline`) holds a database
/// password: a `--database-url` with one belongs in the environment
/// (`WARREN_SCHEDULER_DATABASE_URL`) or a TOML file (`--config`). A URL
/// without a password is fine there.
pub fn refuse_secrets_in_args<I, S>(args: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    let args: Vec<String> = args
        .into_iter()
        .map(|a| a.as_ref().to_string_lossy().into_owned())
        .collect();
    let urls = args.iter().enumerate().filter_map(|(i, a)| {
        if a == "--database-url" {
            args.get(i + 1).map(String::as_str)
        } else {
            a.strip_prefix("--database-url=")
        }
    });
    for url in urls {
        if url_has_password(url) {
            return Err(ConfigError::Invalid(
                "--database-url with a password on the command line: every account on this \
                 host can read a process's arguments (ps, /proc/<pid>/cmdline). Give the URL \
                 in WARREN_SCHEDULER_DATABASE_URL or in the TOML file (--config) instead"
                    .into(),
            ));
        }
    }
    Ok(())
}

/// Whether a database URL carries a password (`scheme://user:pw@...` or
/// a `password=` parameter).
fn url_has_password(url: &str) -> bool {
    let Some((_, rest)) = url.split_once("://") else {
        return false;
    };
    let authority = rest.split(['/', '?']).next().unwrap_or("");
    let in_userinfo = authority
        .rsplit_once('@')
        .is_some_and(|(userinfo, _)| userinfo.contains(':'));
    let in_query = rest
        .split_once('?')
        .is_some_and(|(_, q)| q.split('&').any(|kv| kv.starts_with("password=")));
    in_userinfo || in_query
}

/// Every team's quotas.
#[derive(Debug, Clone, Default)]
pub struct Quotas {
    pub default: crate::store::Quota,
    pub teams: std::collections::HashMap<String, crate::store::Quota>,
}

impl Quotas {
    pub fn of(&self, team: &str) -> crate::store::Quota {
        self.teams.get(team).copied().unwrap_or(self.default)
    }
}

/// Where the store lives, decided from `--database-url` / `--data-dir`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum StoreLocation {
    /// An SQLite file at this path.
    SqliteFile(PathBuf),
    /// An SQLite URL as given (`sqlite://...`, may carry options).
    SqliteUrl(String),
    /// A PostgreSQL URL as given (`postgres://...`).
    Postgres(String),
}

impl StoreLocation {
    /// Where the store key is when `--store-key-file` names none: beside
    /// an SQLite database file (made on first start); `None` for an
    /// in-memory database (a key for this process only will do) and for
    /// PostgreSQL (the key file must be named).
    pub fn default_key_file(&self) -> Option<Option<PathBuf>> {
        self.default_file("store.key")
    }

    /// Where the secrets key is when `--secrets-key-file` names none (as
    /// [`StoreLocation::default_key_file`], `secrets.key`).
    pub fn default_secrets_key_file(&self) -> Option<Option<PathBuf>> {
        self.default_file("secrets.key")
    }

    fn default_file(&self, name: &str) -> Option<Option<PathBuf>> {
        let beside = |db: &std::path::Path| {
            Some(db.parent().unwrap_or(std::path::Path::new(".")).join(name))
        };
        match self {
            StoreLocation::SqliteFile(db) => Some(beside(db)),
            StoreLocation::SqliteUrl(url) => {
                let opts = sqlx::sqlite::SqliteConnectOptions::from_str(url).ok()?;
                let db = opts.get_filename();
                if db.as_os_str().is_empty() || db == std::path::Path::new(":memory:") {
                    Some(None)
                } else {
                    Some(beside(db))
                }
            }
            StoreLocation::Postgres(_) => None,
        }
    }
}

/// Shortest lease accepted: below this, ordinary scheduling jitter kills nodes.
const MIN_LEASE: Duration = Duration::from_millis(100);
/// Shortest sweep interval accepted: below this the sweep is a busy loop.
const MIN_SWEEP: Duration = Duration::from_millis(10);

/// Most connections one replica may hold for reads.
const MAX_POOL: u32 = 1000;

/// The advertised heartbeat interval when none is configured.
const DEFAULT_HEARTBEAT: Duration = Duration::from_secs(2);

impl Config {
    /// The heartbeat interval nodes are told to use: as configured, else 2s,
    /// or a third of the lease when that is shorter (so a short `--lease`
    /// alone is a valid configuration).
    pub fn heartbeat_interval(&self) -> Duration {
        self.heartbeat_interval
            .unwrap_or_else(|| DEFAULT_HEARTBEAT.min(self.lease / 3))
    }

    /// The quotas from `--quota-*` and `--team-quota`.
    pub fn quotas(&self) -> Result<Quotas, ConfigError> {
        let mut quotas = Quotas {
            default: crate::store::Quota {
                max_sandboxes: self.quota_sandboxes,
                creates_per_minute: self.quota_creates_per_minute,
            },
            teams: Default::default(),
        };
        for raw in &self.team_quotas {
            let bad = || {
                ConfigError::Invalid(format!(
                    "--team-quota {raw:?}: expected TEAM=SANDBOXES/CREATES_PER_MINUTE, e.g. team-a=20/60"
                ))
            };
            let (team, limits) = raw.trim().split_once('=').ok_or_else(bad)?;
            let (n, rate) = limits.split_once('/').ok_or_else(bad)?;
            let team = team.trim();
            if team.is_empty() {
                return Err(bad());
            }
            let quota = crate::store::Quota {
                max_sandboxes: n.trim().parse().map_err(|_| bad())?,
                creates_per_minute: rate.trim().parse().map_err(|_| bad())?,
            };
            if quotas.teams.insert(team.to_string(), quota).is_some() {
                return Err(ConfigError::Invalid(format!(
                    "--team-quota: team {team:?} is given twice"
                )));
            }
        }
        Ok(quotas)
    }

    /// The gRPC and admin listeners' timeouts and connection limits.
    pub fn listener_limits(&self) -> Result<(Limits, Limits), ConfigError> {
        let grpc = Limits::from_flags(
            self.header_read_timeout,
            self.idle_timeout,
            self.body_progress_timeout,
            self.max_connections,
            0,
            self.drain_timeout,
        )?;
        let admin = grpc.for_admin(self.admin_max_connections, "--admin-max-connections")?;
        Ok((grpc, admin))
    }

    /// Checks every setting against the others; the message names the flag.
    pub fn validate(&self) -> Result<StoreLocation, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        self.quotas()?;
        self.listener_limits()?;
        if self.lease < MIN_LEASE {
            return bad(format!(
                "--lease {:?} is too short (at least {MIN_LEASE:?})",
                self.lease
            ));
        }
        let heartbeat = self.heartbeat_interval();
        if heartbeat.is_zero() || heartbeat >= self.lease {
            return bad(format!(
                "--heartbeat-interval {heartbeat:?} must be above zero and shorter than --lease {:?}",
                self.lease
            ));
        }
        if self.sweep_interval < MIN_SWEEP {
            return bad(format!(
                "--sweep-interval {:?} is too short (at least {MIN_SWEEP:?})",
                self.sweep_interval
            ));
        }
        if self.creating_timeout.is_zero() {
            return bad("--creating-timeout must be above zero".into());
        }
        if self.watch_retention == 0 {
            return bad("--watch-retention must be at least 1".into());
        }
        if self.database_pool_size == 0 || self.database_pool_size > MAX_POOL {
            return bad(format!(
                "--database-pool-size {} must be between 1 and {MAX_POOL}",
                self.database_pool_size
            ));
        }
        if self.listen == self.admin_listen && self.listen.port() != 0 {
            return bad(format!(
                "--listen and --admin-listen are both {}",
                self.listen
            ));
        }
        match self.database_url.as_deref().map(str::trim) {
            None | Some("") => {
                if self.data_dir.as_os_str().is_empty() {
                    return bad("--data-dir is empty".into());
                }
                Ok(StoreLocation::SqliteFile(
                    self.data_dir.join("scheduler.db"),
                ))
            }
            Some(url) if url.starts_with("sqlite:") => Ok(StoreLocation::SqliteUrl(url.into())),
            Some(url) if url.starts_with("postgres://") || url.starts_with("postgresql://") => {
                match sqlx::postgres::PgConnectOptions::from_str(url) {
                    Ok(_) => Ok(StoreLocation::Postgres(url.into())),
                    Err(e) => bad(format!(
                        "--database-url {}: {e}",
                        crate::store::redact_url(url)
                    )),
                }
            }
            Some(url) => {
                let scheme = url.split(':').next().unwrap_or(url);
                bad(format!(
                    "--database-url: unsupported scheme {scheme:?} (expected sqlite://PATH or postgres://...)"
                ))
            }
        }
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Config {
        Config::try_parse_from(std::iter::once("s").chain(args.iter().copied())).unwrap()
    }

    #[test]
    fn database_passwords_are_refused_on_the_command_line() {
        for args in [
            &[
                "scheduler",
                "--database-url",
                "postgres://warren:pw@db/warren",
            ][..],
            &[
                "scheduler",
                "--database-url=postgres://warren:pw@db:5432/warren",
            ],
            &[
                "scheduler",
                "--database-url",
                "postgres://warren@db/warren?password=pw",
            ],
        ] {
            let err = refuse_secrets_in_args(args).unwrap_err().to_string();
            assert!(
                err.contains("WARREN_SCHEDULER_DATABASE_URL"),
                "{args:?}: {err}"
            );
        }
        for args in [
            &["scheduler", "--database-url", "postgres://warren@db/warren"][..],
            &[
                "scheduler",
                "--database-url",
                "sqlite:///var/lib/warren/s.db",
            ],
            &["scheduler", "--data-dir", "/x:y@z"],
        ] {
            assert!(refuse_secrets_in_args(args).is_ok(), "{args:?}");
        }
    }

    #[test]
    fn defaults_are_valid() {
        let c = parse(&[]);
        assert_eq!(c.heartbeat_interval(), Duration::from_secs(2));
        let short = parse(&["--lease", "900ms"]);
        assert_eq!(short.heartbeat_interval(), Duration::from_millis(300));
        assert!(short.validate().is_ok());
        assert_eq!(
            c.validate().unwrap(),
            StoreLocation::SqliteFile(PathBuf::from("./.warren/scheduler/scheduler.db"))
        );
        // A team may not take every node slot by default.
        let q = c.quotas().unwrap();
        assert_eq!(q.of("any-team").max_sandboxes, 100);
        assert_eq!(q.of("any-team").creates_per_minute, 0);
    }

    #[test]
    fn rejects_inconsistent_settings() {
        let err = parse(&["--lease", "1s", "--heartbeat-interval", "2s"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("--heartbeat-interval"), "{err}");
        assert_eq!(
            parse(&["--database-url", "postgres://u:p@db:5432/warren"])
                .validate()
                .unwrap(),
            StoreLocation::Postgres("postgres://u:p@db:5432/warren".into())
        );
        let err = parse(&["--database-url", "postgres://u:secret@db:notaport/w"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("--database-url"), "{err}");
        assert!(!err.to_string().contains("secret"), "{err}");
        let err = parse(&["--database-pool-size", "0"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("--database-pool-size"), "{err}");
        let err = parse(&["--database-url", "mysql://x"])
            .validate()
            .unwrap_err();
        assert!(err.to_string().contains("--database-url"), "{err}");
        let err = parse(&["--watch-retention", "0"]).validate().unwrap_err();
        assert!(err.to_string().contains("--watch-retention"), "{err}");
        assert!(Config::try_parse_from(["s", "--lease", "soon"]).is_err());
    }
}
