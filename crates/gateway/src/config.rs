//! `warren gateway` configuration: flags, `WARREN_GATEWAY_*` environment
//! variables and TOML (through `warren_core::config`), validated into
//! [`Settings`] before any socket is bound.

use crate::auth::ApiKeys;
use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use warren_core::config::{parse_duration, ConfigError};
use warren_core::server::Limits;

/// Command-line / env / TOML configuration for `warren gateway`.
#[derive(Debug, Clone, clap::Parser)]
#[command(
    name = "warren gateway",
    about = "The public entry: E2B REST API + sandbox traffic proxy"
)]
pub struct Config {
    /// TOML file with any of these settings (keys are the long flag names).
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,

    /// Address for the public listener (E2B REST API and sandbox traffic;
    /// HTTP/1.1 and h2c on one port).
    #[arg(long, env = "WARREN_GATEWAY_LISTEN", default_value = "127.0.0.1:3000")]
    pub listen: SocketAddr,

    /// Address for the admin listener (/metrics, /healthz, /readyz).
    #[arg(
        long,
        env = "WARREN_GATEWAY_ADMIN_LISTEN",
        default_value = "127.0.0.1:0"
    )]
    pub admin_listen: SocketAddr,

    /// Scheduler gRPC URL(s), comma-separated; the first that answers is used
    /// and the gateway fails over to the next on transport errors.
    #[arg(
        long,
        env = "WARREN_GATEWAY_SCHEDULER",
        default_value = "http://127.0.0.1:50051",
        value_delimiter = ','
    )]
    pub scheduler: Vec<String>,

    /// Sandbox domain: returned to the SDK as `domain` and used for host
    /// routing `{port}-{sandboxId}.{domain}`. It may end in `:PORT` when
    /// clients reach the gateway's sandbox traffic on a port other than
    /// their scheme's (`localhost:3000`: the SDK's `get_host(8080)` is then
    /// `8080-<id>.localhost:3000`, a URL a browser opens); routing matches
    /// the name only.
    #[arg(long, env = "WARREN_GATEWAY_DOMAIN", default_value = "localhost")]
    pub domain: String,

    /// API keys and their teams, as `KEY:TEAM`, comma-separated: from the
    /// environment (`WARREN_GATEWAY_API_KEY`) or a TOML file, never the
    /// command line, where every account on the host can read them (`ps`):
    /// the gateway refuses to start with `--api-key` in its arguments
    /// ([`refuse_secrets_in_args`]).
    #[arg(
        long = "api-key",
        env = "WARREN_GATEWAY_API_KEY",
        value_delimiter = ','
    )]
    pub api_keys: Vec<String>,

    /// A file of API keys, one `KEY TEAM` per line (`#` starts a comment),
    /// readable by its owner only (mode 0600 or 0400; the gateway refuses
    /// one that other accounts can read).
    #[arg(long, env = "WARREN_GATEWAY_API_KEYS_FILE")]
    pub api_keys_file: Option<PathBuf>,

    /// How long to wait for a TCP connection to a node.
    #[arg(long, env = "WARREN_GATEWAY_CONNECT_TIMEOUT", default_value = "1s", value_parser = parse_duration)]
    pub connect_timeout: Duration,

    /// How long a node may leave what the gateway sent it unacknowledged
    /// (TCP_USER_TIMEOUT), or stay silent to keepalive probes on an idle
    /// pooled connection, before the connection is dropped: a request to a
    /// node whose host lost its network answers 502 after this instead of
    /// hanging. At least 1s.
    #[arg(long, env = "WARREN_GATEWAY_DEAD_NODE_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub dead_node_timeout: Duration,

    /// Deadline for each control-plane call (scheduler RPCs, node control API).
    #[arg(long, env = "WARREN_GATEWAY_REQUEST_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub request_timeout: Duration,

    /// How long in-flight requests may take to finish after SIGTERM.
    #[arg(long, env = "WARREN_GATEWAY_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,

    /// On SIGTERM, how long to keep serving with /readyz false before closing
    /// the listener, so load balancers health-checking /readyz move traffic
    /// first (0 = close at once; set it above the balancer's check interval × fall).
    #[arg(long, env = "WARREN_GATEWAY_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    /// Keys of this team are operators: they may list nodes (`GET /nodes`,
    /// `warren node ls`). Repeatable. None by default.
    #[arg(
        long = "admin-team",
        env = "WARREN_GATEWAY_ADMIN_TEAM",
        value_delimiter = ','
    )]
    pub admin_teams: Vec<String>,

    /// The template store (shared with the nodes): `GET /templates` lists
    /// it, and a create naming a template it lacks is a 404.
    #[arg(
        long,
        env = "WARREN_TEMPLATE_DIR",
        default_value = "/var/lib/warren/templates"
    )]
    pub template_dir: PathBuf,

    /// `--blob-store` (docs/blobs.md): with it, the gateway keeps template
    /// and snapshot records in the scheduler's store, hands each create's
    /// node the record, and never reads `--template-dir`.
    #[command(flatten)]
    pub blob: warren_blob::BlobStoreArgs,

    /// Largest control-plane JSON body accepted, in bytes.
    #[arg(long, env = "WARREN_GATEWAY_MAX_BODY", default_value_t = 1024 * 1024)]
    pub max_body: usize,

    /// Where COPY steps' uploaded archives are kept without `--blob-store`
    /// (with it, they are blobs of that store): a local blob store
    /// directory, made (mode 0700) on the first upload. Default:
    /// `<template-dir>/uploads`, shared by the gateways that share the
    /// template store. Archives are opaque blobs here, never extracted on
    /// this host; an upload is staged in the system's temporary directory
    /// while it arrives.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_UPLOAD_DIR")]
    pub build_upload_dir: Option<PathBuf>,

    /// Largest COPY archive one upload may be, in bytes (past it: 413).
    #[arg(
        long,
        env = "WARREN_GATEWAY_BUILD_UPLOAD_MAX_BYTES",
        default_value_t = 512 * 1024 * 1024
    )]
    pub build_upload_max_bytes: u64,

    /// Most bytes all COPY archives kept at once may take (past it: 507
    /// until older ones expire or are replaced).
    #[arg(
        long,
        env = "WARREN_GATEWAY_BUILD_UPLOAD_TOTAL_BYTES",
        default_value_t = 4 * 1024 * 1024 * 1024
    )]
    pub build_upload_total_bytes: u64,

    /// Most bytes one team's COPY archives kept at once may take (past it:
    /// 429 until they expire or are replaced), so one team cannot fill
    /// what every team shares.
    #[arg(
        long,
        env = "WARREN_GATEWAY_BUILD_UPLOAD_TEAM_BYTES",
        default_value_t = 1024 * 1024 * 1024
    )]
    pub build_upload_team_bytes: u64,

    /// How long an upload link works, and how long an uploaded archive is
    /// kept for a build to use (a build started in time keeps it open).
    #[arg(long, env = "WARREN_GATEWAY_BUILD_UPLOAD_TTL", default_value = "1h", value_parser = parse_duration)]
    pub build_upload_ttl: Duration,

    /// A file (mode 0600 or stricter, at least 32 bytes) whose contents
    /// sign COPY upload links. Gateways behind one balancer need the same
    /// file, so that a link one made is taken by another. Default: a key
    /// drawn at start, so a link works only on the gateway that made it,
    /// until it restarts.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_UPLOAD_KEY_FILE")]
    pub build_upload_key_file: Option<PathBuf>,

    /// Most sandbox routes the route cache keeps (a few hundred bytes each).
    /// 0 disables the cache: every data-plane request asks the scheduler.
    #[arg(
        long,
        env = "WARREN_GATEWAY_ROUTE_CACHE_CAPACITY",
        default_value_t = 100_000
    )]
    pub route_cache_capacity: u64,

    /// Longest a cached route is served after it was cached. Hits never
    /// renew it; the watch usually evicts a changed route within
    /// milliseconds, so this bounds staleness only while the watch is down.
    #[arg(long, env = "WARREN_GATEWAY_ROUTE_CACHE_TTL", default_value = "30s", value_parser = parse_duration)]
    pub route_cache_ttl: Duration,

    /// Follow the scheduler's WatchBindings stream to evict changed routes
    /// (true/false). With false, routes change only on TTL expiry and when a
    /// node proves one stale.
    #[arg(
        long,
        env = "WARREN_GATEWAY_ROUTE_CACHE_WATCH",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub route_cache_watch: bool,

    /// Largest request body (with a Content-Length) buffered before sending,
    /// so that a replay-safe request can be retried once on a moved
    /// sandbox's new node. Larger or chunked bodies are streamed and never
    /// retried.
    #[arg(long, env = "WARREN_GATEWAY_RETRY_MAX_BODY", default_value_t = 64 * 1024)]
    pub retry_max_body: u64,

    /// Forward plain HTTP/1.1 sandbox requests on the proxy's fast path
    /// (true/false): the gateway parses and relays them itself, and hands
    /// anything unusual (upgrades, chunked or large bodies, h2c, paused or
    /// unknown sandboxes) to hyper's path. false sends every request
    /// through hyper's path.
    #[arg(
        long,
        env = "WARREN_GATEWAY_PROXY_FAST_PATH",
        default_value_t = true,
        action = clap::ArgAction::Set
    )]
    pub proxy_fast_path: bool,

    /// Threads that serve the public listener's connections, each running
    /// its own event loop with its own pool of node connections (the way
    /// nginx runs worker processes); a connection stays on one thread.
    /// 0 = one per CPU; WARREN_GATEWAY_WORKER_THREADS.
    #[arg(long, env = "WARREN_GATEWAY_WORKER_THREADS", default_value_t = 0)]
    pub worker_threads: usize,

    /// More plain-HTTP listeners serving exactly what --listen serves
    /// (e.g. loopback port 80, where a browser sends
    /// `http://{port}-{id}.localhost/`: `warren dev` binds it where it can).
    /// Comma-separated; none by default.
    #[arg(
        long = "http-listen",
        env = "WARREN_GATEWAY_HTTP_LISTEN",
        value_delimiter = ','
    )]
    pub http_listen: Vec<SocketAddr>,

    /// Addresses for public TLS listeners (HTTPS, HTTP/1.1 and h2 by
    /// ALPN): the same API and sandbox traffic as --listen, with TLS ended
    /// here, so a sandbox is reachable at `https://{port}-{id}.{domain}`.
    /// Repeatable or comma-separated (e.g. 0.0.0.0:443,[::]:443). None by
    /// default: TLS off. Needs --public-tls-cert and --public-tls-key.
    #[arg(
        long = "public-tls-listen",
        env = "WARREN_GATEWAY_PUBLIC_TLS_LISTEN",
        value_delimiter = ','
    )]
    pub public_tls_listen: Vec<SocketAddr>,

    /// The public TLS certificate chain (PEM, the leaf first), e.g. a
    /// wildcard `*.{domain}` certificate. Re-read when the file changes.
    #[arg(long, env = "WARREN_GATEWAY_PUBLIC_TLS_CERT")]
    pub public_tls_cert: Option<PathBuf>,

    /// The private key of --public-tls-cert (PEM).
    #[arg(long, env = "WARREN_GATEWAY_PUBLIC_TLS_KEY")]
    pub public_tls_key: Option<PathBuf>,

    #[command(flatten)]
    pub tls: warren_trust::TlsArgs,

    #[command(flatten)]
    pub limits: crate::limits::LimitArgs,

    #[command(flatten)]
    pub volumes: crate::control::VolumeArgs,
    // Listener limits (docs/security.md, "Listeners under load").
    /// How long a client may take to send a request's headers, from
    /// connecting or from the first byte of a later request on a kept-alive
    /// connection; then the connection is closed.
    #[arg(long, env = "WARREN_GATEWAY_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,

    /// How long a connection may stay open with no request in flight:
    /// longer than the e2b SDK keeps idle connections (300 s), so the SDK,
    /// not the gateway, closes them and never reuses one being closed.
    #[arg(long, env = "WARREN_GATEWAY_IDLE_TIMEOUT", default_value = "6m", value_parser = parse_duration)]
    pub idle_timeout: Duration,

    /// How long a request body may send nothing while the gateway waits for
    /// it (before answering); then the request is answered 408.
    #[arg(long, env = "WARREN_GATEWAY_BODY_PROGRESS_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_progress_timeout: Duration,

    /// Most connections open at once on the public listener; past it new
    /// connections are closed at once (established ones keep working).
    #[arg(long, env = "WARREN_GATEWAY_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,

    /// Most connections open at once from one client IP address, an IPv6
    /// client's /64 (0 = no cap). Behind a load balancer every connection comes from its
    /// address: raise this above the balancer's connection count, or 0.
    #[arg(
        long,
        env = "WARREN_GATEWAY_MAX_CONNECTIONS_PER_PEER",
        default_value_t = 1_000
    )]
    pub max_connections_per_peer: usize,

    /// Most connections open at once on the admin listener.
    #[arg(
        long,
        env = "WARREN_GATEWAY_ADMIN_MAX_CONNECTIONS",
        default_value_t = 128
    )]
    pub admin_max_connections: usize,
}

/// Validated settings the gateway runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    /// Scheduler endpoints in failover order (each with a scheme).
    pub schedulers: Vec<String>,
    /// Lower-cased sandbox domain, the name host routing matches.
    pub domain: String,
    /// What SDKs are told the domain is (`domain`, with `:PORT` when
    /// `--domain` named one).
    pub advertised_domain: String,
    /// More plain-HTTP listeners (`--http-listen`).
    pub http_listen: Vec<SocketAddr>,
    /// API key → team.
    pub api_keys: ApiKeys,
    /// TCP connect timeout towards nodes and schedulers.
    pub connect_timeout: Duration,
    /// Bound on a node connection whose peer stopped answering.
    pub dead_node_timeout: Duration,
    /// Deadline for each control-plane call.
    pub request_timeout: Duration,
    /// Bound on draining in-flight requests at shutdown.
    pub drain_timeout: Duration,
    /// Serving with readiness false before the listener closes.
    pub shutdown_delay: Duration,
    /// Teams whose keys may use operator endpoints.
    pub admin_teams: Vec<String>,
    /// The template store.
    pub template_dir: PathBuf,
    /// `--blob-store` and its options: records in the scheduler.
    pub blob_store: Option<warren_blob::BlobStoreSettings>,
    /// Largest control-plane JSON body accepted.
    pub max_body: usize,
    /// COPY uploads: where they wait, how big they may be, how long kept.
    pub uploads: crate::control::UploadSettings,
    /// The route cache; `None` with `--route-cache-capacity 0`.
    pub route_cache: Option<crate::resolver::CacheSettings>,
    /// Largest body buffered for a possible replay (and the largest the
    /// fast path takes).
    pub retry_max_body: u64,
    /// `--proxy-fast-path`.
    pub proxy_fast_path: bool,
    /// Internal TLS flags, loaded when the part starts (before it binds).
    pub tls: warren_trust::TlsArgs,
    /// The public TLS listeners' addresses and their server configuration
    /// (certificate loaded); `None` when TLS is off.
    pub public_tls: Option<PublicTls>,
    /// The public listener's timeouts and connection limits (its drain is
    /// `drain_timeout`).
    pub listener: Limits,
    /// The admin listener's.
    pub admin_listener: Limits,
    /// Threads serving the public listener (at least one).
    pub worker_threads: usize,
    /// What tenants may ask for and keep (`crate::limits`).
    pub limits: crate::limits::Limits,
    /// Volumes: the team bounds and how long a content route is trusted.
    pub volumes: crate::control::VolumeSettings,
}

/// The public TLS listeners: where, and with which certificate.
#[derive(Debug, Clone)]
pub struct PublicTls {
    pub listen: Vec<SocketAddr>,
    pub config: std::sync::Arc<rustls::ServerConfig>,
}

impl Config {
    /// The public TLS flags, all or none; the certificate and key loaded.
    fn public_tls(&self) -> Result<Option<PublicTls>, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        match (&self.public_tls_cert, &self.public_tls_key) {
            (None, None) if self.public_tls_listen.is_empty() => Ok(None),
            (Some(cert), Some(key)) if !self.public_tls_listen.is_empty() => {
                let config = warren_trust::public::server_config(cert, key)
                    .map_err(|e| invalid(format!("--public-tls-cert/--public-tls-key: {e}")))?;
                Ok(Some(PublicTls {
                    listen: self.public_tls_listen.clone(),
                    config,
                }))
            }
            _ => Err(invalid(
                "--public-tls-listen, --public-tls-cert and --public-tls-key go together: \
                 give all three for a public TLS listener, or none"
                    .into(),
            )),
        }
    }

    /// Checks everything that can be checked without the network.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let invalid = |m: String| ConfigError::Invalid(m);
        let schedulers = warren_proto::client::parse_urls(&self.scheduler)
            .map_err(|e| invalid(format!("--scheduler: {e}")))?;

        let full = self.domain.trim().to_ascii_lowercase();
        let (name, port) = match full.rsplit_once(':') {
            Some((n, p)) => match p.parse::<u16>() {
                Ok(p) if p > 0 => (n.to_string(), Some(p)),
                _ => {
                    return Err(invalid(format!(
                        "--domain {:?}: {p:?} is not a port (1 to 65535)",
                        self.domain
                    )))
                }
            },
            None => (full.clone(), None),
        };
        let domain = name.trim_end_matches('.').to_string();
        let advertised_domain = match port {
            Some(p) => format!("{domain}:{p}"),
            None => domain.clone(),
        };
        let domain_ok = !domain.is_empty()
            && domain.split('.').all(|label| {
                !label.is_empty()
                    && label
                        .bytes()
                        .all(|b| b.is_ascii_alphanumeric() || b == b'-')
            });
        if !domain_ok {
            return Err(invalid(format!(
                "--domain {:?} is not a DNS name (labels of [a-z0-9-] separated by dots, \
                 optionally :PORT)",
                self.domain
            )));
        }

        let mut api_keys = ApiKeys::default();
        for entry in &self.api_keys {
            let Some((key, team)) = entry.split_once(':') else {
                return Err(invalid(format!(
                    "--api-key {:?} must be KEY:TEAM",
                    redact(entry)
                )));
            };
            api_keys
                .insert(key.trim(), team.trim())
                .map_err(|e| invalid(format!("--api-key: {e}")))?;
        }
        if let Some(path) = &self.api_keys_file {
            let text = read_private(path, "--api-keys-file")?;
            for (n, line) in text.lines().enumerate() {
                let line = line.split('#').next().unwrap_or("").trim();
                if line.is_empty() {
                    continue;
                }
                let mut parts = line.split_whitespace();
                let (Some(key), Some(team), None) = (parts.next(), parts.next(), parts.next())
                else {
                    return Err(invalid(format!(
                        "{}:{}: expected `KEY TEAM`",
                        path.display(),
                        n + 1
                    )));
                };
                api_keys
                    .insert(key, team)
                    .map_err(|e| invalid(format!("{}:{}: {e}", path.display(), n + 1)))?;
            }
        }
        if api_keys.is_empty() {
            return Err(invalid(
                "no API keys configured: give --api-keys-file FILE (`KEY TEAM` per line, mode \
                 0600) or WARREN_GATEWAY_API_KEY=KEY:TEAM,..."
                    .into(),
            ));
        }

        if self.dead_node_timeout < Duration::from_secs(1) {
            return Err(invalid(format!(
                "--dead-node-timeout {:?} is too short (at least 1s: a node under load \
                 may take that long to acknowledge)",
                self.dead_node_timeout
            )));
        }
        if self.connect_timeout.is_zero() {
            return Err(invalid(
                "--connect-timeout must be greater than zero".into(),
            ));
        }
        if self.request_timeout.is_zero() {
            return Err(invalid(
                "--request-timeout must be greater than zero".into(),
            ));
        }
        if self.max_body == 0 {
            return Err(invalid("--max-body must be greater than zero".into()));
        }
        if self.build_upload_max_bytes == 0 || self.build_upload_ttl.is_zero() {
            return Err(invalid(
                "--build-upload-max-bytes and --build-upload-ttl must be greater than zero".into(),
            ));
        }
        if self.build_upload_total_bytes < self.build_upload_max_bytes {
            return Err(invalid(format!(
                "--build-upload-total-bytes {} is less than --build-upload-max-bytes {}",
                self.build_upload_total_bytes, self.build_upload_max_bytes
            )));
        }
        if self.build_upload_team_bytes < self.build_upload_max_bytes
            || self.build_upload_team_bytes > self.build_upload_total_bytes
        {
            return Err(invalid(format!(
                "--build-upload-team-bytes {} must be between --build-upload-max-bytes {} and \
                 --build-upload-total-bytes {}",
                self.build_upload_team_bytes,
                self.build_upload_max_bytes,
                self.build_upload_total_bytes
            )));
        }
        let key = match &self.build_upload_key_file {
            None => None,
            Some(path) => Some(read_upload_key(path)?),
        };
        let uploads = crate::control::UploadSettings {
            dir: self
                .build_upload_dir
                .clone()
                .unwrap_or_else(|| self.template_dir.join("uploads")),
            staging: std::env::temp_dir(),
            key,
            max_bytes: self.build_upload_max_bytes,
            total_bytes: self.build_upload_total_bytes,
            team_bytes: self.build_upload_team_bytes,
            ttl: self.build_upload_ttl,
        };
        let route_cache = if self.route_cache_capacity == 0 {
            None
        } else {
            if self.route_cache_ttl.is_zero() {
                return Err(invalid(
                    "--route-cache-ttl must be greater than zero \
                     (use --route-cache-capacity 0 to turn the cache off)"
                        .into(),
                ));
            }
            Some(crate::resolver::CacheSettings {
                capacity: self.route_cache_capacity,
                ttl: self.route_cache_ttl,
                watch: self.route_cache_watch,
            })
        };
        let listener = Limits::from_flags(
            self.header_read_timeout,
            self.idle_timeout,
            self.body_progress_timeout,
            self.max_connections,
            self.max_connections_per_peer,
            self.drain_timeout,
        )?;
        let admin_listener =
            listener.for_admin(self.admin_max_connections, "--admin-max-connections")?;
        let worker_threads = match self.worker_threads {
            0 => std::thread::available_parallelism().map_or(1, usize::from),
            n if n > 1024 => {
                return Err(invalid(format!(
                    "--worker-threads {n} is more than 1024; one per CPU is the most that helps"
                )))
            }
            n => n,
        };
        let public_tls = self.public_tls()?;
        let limits = self.limits.validate()?;
        let volumes = self.volumes.validate()?;
        let blob_store = self.blob.settings().map_err(invalid)?;
        Ok(Settings {
            volumes,
            blob_store,
            limits,
            worker_threads,
            tls: self.tls.clone(),
            public_tls,
            schedulers,
            domain,
            advertised_domain,
            http_listen: self.http_listen.clone(),
            api_keys,
            connect_timeout: self.connect_timeout,
            dead_node_timeout: self.dead_node_timeout,
            request_timeout: self.request_timeout,
            drain_timeout: self.drain_timeout,
            shutdown_delay: self.shutdown_delay,
            admin_teams: self.admin_teams.clone(),
            template_dir: self.template_dir.clone(),
            max_body: self.max_body,
            uploads,
            route_cache,
            retry_max_body: self.retry_max_body,
            proxy_fast_path: self.proxy_fast_path,
            listener,
            admin_listener,
        })
    }
}

/// Refuses a gateway whose own command line (`args`: the process's, as
/// `/proc/<pid>/cmdline` shows it to every account on the host) holds an
/// API key: `--api-key` is for the environment and TOML only, and
/// `--api-keys-file` names a file.
pub fn refuse_secrets_in_args<I, S>(args: I) -> Result<(), ConfigError>
where
    I: IntoIterator<Item = S>,
    S: AsRef<std::ffi::OsStr>,
{
    if warren_core::config::names_flag(args, "--api-key") {
        return Err(ConfigError::Invalid(
            "--api-key on the command line: every account on this host can read a process's \
             arguments (ps, /proc/<pid>/cmdline), so API keys are never taken there. Give them \
             in --api-keys-file FILE (`KEY TEAM` per line, mode 0600) or in the environment, \
             WARREN_GATEWAY_API_KEY=KEY:TEAM,..."
                .into(),
        ));
    }
    Ok(())
}

/// A file of secrets named by `flag`, refused (naming the flag and the
/// fix) when an account other than its owner may read or write it.
pub fn read_private(path: &std::path::Path, flag: &str) -> Result<String, ConfigError> {
    warren_core::private::check(path).map_err(|e| ConfigError::Invalid(format!("{flag}: {e}")))?;
    std::fs::read_to_string(path).map_err(|source| ConfigError::Read {
        path: path.display().to_string(),
        source,
    })
}

/// The upload-link key in `path` (`--build-upload-key-file`): private, at
/// least 32 bytes once trimmed.
fn read_upload_key(path: &std::path::Path) -> Result<Vec<u8>, ConfigError> {
    let key = read_private(path, "--build-upload-key-file")?;
    let key = key.trim();
    if key.len() < 32 {
        return Err(ConfigError::Invalid(format!(
            "--build-upload-key-file {}: the key is {} bytes; it must be at least 32 \
             (e.g. `head -c 32 /dev/urandom | base64`)",
            path.display(),
            key.len()
        )));
    }
    Ok(key.as_bytes().to_vec())
}

/// Shows only the start of a secret in error messages.
fn redact(s: &str) -> String {
    let shown: String = s.chars().take(4).collect();
    format!("{shown}…")
}

#[cfg(test)]
#[path = "config_tests.rs"]
mod tests;
