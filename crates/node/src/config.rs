//! `warren node` settings: flags, `WARREN_NODE_*` env, TOML — parsed and
//! validated completely ([`Config::validate`]) before any socket is bound.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;
use warren_core::config::{parse_duration, ConfigError};

/// Which runtime hosts sandboxes.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum RuntimeChoice {
    /// `isolated` when everything it needs works here, else `process`.
    Auto,
    /// Each sandbox a small machine of its own: a template's root, its own
    /// namespaces, host ids, cgroups, disk and seccomp filter.
    #[value(alias = "bwrap")]
    Isolated,
    /// No isolation: a directory and a session per sandbox.
    Process,
}

/// `--memory-limit-mb`'s default: 8 GiB, E2B's largest standard sandbox
/// (its Pro plan's "8 GB"), so a template or a tenant's build asks for
/// less or gets this. The gateway's `--max-sandbox-memory-mb` has the
/// same default.
pub const DEFAULT_MEMORY_MB: u64 = 8192;
/// `--cpu-limit`'s default: 8, E2B's largest standard sandbox (its "8
/// vCPUs"); the gateway's `--max-sandbox-cpus` has the same.
pub const DEFAULT_CPUS: f64 = 8.0;
/// `--disk-limit-mb`'s default: 20 GiB, ten times `base`'s disk and room
/// for a large toolchain; the gateway's `--max-sandbox-disk-mb` has the
/// same.
pub const DEFAULT_DISK_MB: u64 = 20 * 1024;

/// `--cache-max-bytes`' default: 32 GiB of layers (`base` is about 0.3 GiB).
pub const DEFAULT_CACHE_BYTES: u64 = 32 << 30;

/// `--volume-max-bytes`' default for a local store: 10 GiB per volume
/// (a sparse image: it takes only what is written).
pub const DEFAULT_VOLUME_MAX_BYTES: u64 = 10 << 30;
/// The smallest `--volume-max-bytes` (ext4 needs a few MiB of its own).
pub const MIN_VOLUME_MAX_BYTES: u64 = 16 << 20;

/// Where the node keeps volumes (docs/sandboxes.md, "Volumes").
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct VolumeSettings {
    /// `--volume-dir`.
    pub dir: PathBuf,
    /// `--volume-shared`: `dir` is an operator's shared POSIX mount.
    pub shared: bool,
    /// Each new volume's size limit (0: none, a shared store).
    pub max_bytes: u64,
}

/// Where the node's layers come from when it has a blob store.
#[derive(Debug, Clone)]
pub struct BlobSettings {
    pub store: warren_blob::BlobStoreSettings,
    pub cache_dir: PathBuf,
    pub cache_max_bytes: u64,
}

/// Command-line / env / TOML configuration for `warren node`.
#[derive(Debug, Clone, clap::Parser)]
#[command(name = "warren node", about = "A sandbox host")]
pub struct Config {
    /// Config file (TOML; keys are the long flag names).
    #[arg(long, env = "WARREN_CONFIG")]
    pub config: Option<PathBuf>,
    /// This node's id ([a-z0-9-]); default derived from the host name.
    #[arg(long, env = "WARREN_NODE_NODE_ID")]
    pub node_id: Option<String>,
    /// Data plane + control API (HTTP/1.1 and h2c).
    #[arg(long, env = "WARREN_NODE_LISTEN", default_value = "127.0.0.1:0")]
    pub listen: SocketAddr,
    /// host:port gateways dial for this node; default the bound listen address.
    #[arg(long, env = "WARREN_NODE_ADVERTISE")]
    pub advertise: Option<String>,
    /// Admin listener (/metrics, /healthz, /readyz).
    #[arg(long, env = "WARREN_NODE_ADMIN_LISTEN", default_value = "127.0.0.1:0")]
    pub admin_listen: SocketAddr,
    /// Scheduler gRPC URL(s), `host:port` or `http://host:port`,
    /// comma-separated; calls fail over to the next on transport errors.
    #[arg(
        long,
        env = "WARREN_NODE_SCHEDULER",
        default_value = "http://127.0.0.1:50051",
        value_delimiter = ','
    )]
    pub scheduler: Vec<String>,
    /// Where sandboxes' files and state live; default ./.warren/node-<id>.
    #[arg(long, env = "WARREN_NODE_DATA_DIR")]
    pub data_dir: Option<PathBuf>,
    /// Where volumes live (E2B's persistent volumes; docs/sandboxes.md):
    /// default `<data-dir>/volumes`, a directory only root may enter.
    /// Local (the default): each volume an ext4 image of
    /// `--volume-max-bytes` here, mounted by this node only, so sandboxes
    /// that mount it are placed on this node. With `--volume-shared`, an
    /// operator's shared POSIX mount (NFS, CephFS, ...) that every node
    /// declaring it mounts at this path: each volume a directory, any such
    /// node serves any volume.
    #[arg(long, env = "WARREN_NODE_VOLUME_DIR")]
    pub volume_dir: Option<PathBuf>,
    /// `--volume-dir` is a shared mount every node declaring it reaches
    /// (see `--volume-dir`); its filesystem must support idmapped mounts.
    #[arg(long, env = "WARREN_NODE_VOLUME_SHARED")]
    pub volume_shared: bool,
    /// Each new volume's size limit, in bytes (a local store: the size of
    /// its ext4 image, so writes past it fail with ENOSPC inside sandboxes
    /// and 507 on the content API; ext4 keeps a few percent for itself).
    /// Default 10 GiB. A shared store cannot enforce one (its filesystem's
    /// own quotas apply): 0 there, the default.
    #[arg(long, env = "WARREN_NODE_VOLUME_MAX_BYTES")]
    pub volume_max_bytes: Option<u64>,
    /// How many sandboxes this node accepts.
    #[arg(long, env = "WARREN_NODE_CAPACITY", default_value_t = 100)]
    pub capacity: u32,
    /// auto | isolated | process.
    #[arg(long, env = "WARREN_NODE_RUNTIME", value_enum, default_value = "auto")]
    pub runtime: RuntimeChoice,
    /// The `warren` binary started as `<bin> envd ...`; default this executable.
    #[arg(long, env = "WARREN_NODE_ENVD_BIN")]
    pub envd_bin: Option<PathBuf>,
    /// First host uid/gid of the sandbox id ranges (isolated): sandbox k maps
    /// its ids 0..65536 to base + k*65536 ..; no host account may lie there.
    #[arg(
        long,
        env = "WARREN_NODE_SANDBOX_ID_BASE",
        default_value_t = 2_000_000_000
    )]
    pub sandbox_id_base: u32,
    /// Host-wide directory of id range locks, shared by every node on this
    /// machine so no two sandboxes get the same range.
    #[arg(
        long,
        env = "WARREN_NODE_ID_LOCK_DIR",
        default_value = "/run/warren/ids"
    )]
    pub id_lock_dir: PathBuf,
    /// Heartbeat interval; default what the scheduler's RegisterNode answers (2s).
    #[arg(long, env = "WARREN_NODE_HEARTBEAT_INTERVAL", value_parser = parse_duration)]
    pub heartbeat_interval: Option<Duration>,
    /// Where templates live (shared by every node and gateway of the machine).
    #[arg(
        long,
        env = "WARREN_TEMPLATE_DIR",
        default_value = "/var/lib/warren/templates"
    )]
    pub template_dir: PathBuf,
    /// `--blob-store` (docs/blobs.md): with it, the node reads no template
    /// records (each create's gateway hands it the record), fetches the
    /// layers it lacks into its cache (`--cache-dir`), puts the layers its
    /// snapshots make into the blob store, and does not use
    /// `--template-dir`.
    #[command(flatten)]
    pub blob: warren_blob::BlobStoreArgs,
    /// Where layers fetched from the blob store are unpacked (default
    /// `<data-dir>/cache`). Nodes of one host may share it: each layer is
    /// fetched once, and none is evicted while a sandbox of any of them
    /// stacks it.
    #[arg(long, env = "WARREN_NODE_CACHE_DIR")]
    pub cache_dir: Option<PathBuf>,
    /// The most bytes of layers the cache keeps (least recently used
    /// unused layers go first; layers in use are never evicted, so the
    /// cache may stay above it while everything in it is in use).
    #[arg(long, env = "WARREN_NODE_CACHE_MAX_BYTES", default_value_t = DEFAULT_CACHE_BYTES)]
    pub cache_max_bytes: u64,
    /// Most memory a sandbox gets, in MiB, all its processes together, swap
    /// included (cgroup v2 memory.max, v1 memory.limit_in_bytes). The
    /// template's `memory_mb` (E2B's default 512) applies under it; a
    /// template asking for more gets this. The default, 8 GiB, is E2B's
    /// largest standard sandbox.
    #[arg(long, env = "WARREN_NODE_MEMORY_LIMIT_MB", default_value_t = DEFAULT_MEMORY_MB)]
    pub memory_limit_mb: u64,
    /// Processes and threads per sandbox (cgroup pids.max).
    #[arg(long, env = "WARREN_NODE_PIDS_LIMIT", default_value_t = 1024)]
    pub pids_limit: u64,
    /// Most CPUs a sandbox gets (cgroup v2 cpu.max, v1 cpu.cfs_quota_us;
    /// fractions allowed). The template's `cpu_count` (E2B's default 2)
    /// applies under it. The default, 8, is E2B's largest standard sandbox.
    #[arg(long, env = "WARREN_NODE_CPU_LIMIT", default_value_t = DEFAULT_CPUS)]
    pub cpu_limit: f64,
    /// Most disk a sandbox gets, in MiB (the writable layer's filesystem).
    /// The template's `disk_mb` applies under it. The default is 20 GiB.
    #[arg(long, env = "WARREN_NODE_DISK_LIMIT_MB", default_value_t = DEFAULT_DISK_MB)]
    pub disk_limit_mb: u64,
    /// How often each sandbox's CPU, memory and disk use is sampled for
    /// E2B's sandbox metrics (`GET /sandboxes/{id}/metrics`; E2B samples
    /// every 5 s).
    #[arg(long, env = "WARREN_NODE_METRICS_INTERVAL", default_value = "5s", value_parser = parse_duration)]
    pub metrics_interval: Duration,
    /// Most metrics samples kept per sandbox, the oldest dropped first (720: an hour at
    /// 5 s; 56 bytes each, so about 40 KiB per sandbox).
    #[arg(long, env = "WARREN_NODE_METRICS_SAMPLES", default_value_t = 720)]
    pub metrics_samples: usize,
    /// Output each process keeps for reattaching clients (passed to envd).
    #[arg(long, env = "WARREN_NODE_MAX_OUTPUT_BYTES", default_value_t = 16 << 20)]
    pub max_output_bytes: u64,
    /// How long a create waits for the sandbox's envd to answer /health.
    #[arg(long, env = "WARREN_NODE_ENVD_START_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub envd_start_timeout: Duration,
    /// On SIGTERM, how long in-flight requests may take to finish.
    #[arg(long, env = "WARREN_NODE_DRAIN_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub drain_timeout: Duration,
    /// On SIGTERM, how long to keep serving with /readyz false before closing
    /// the listener (give health checks time to notice; 0 = close at once).
    #[arg(long, env = "WARREN_NODE_SHUTDOWN_DELAY", default_value = "0s", value_parser = parse_duration)]
    pub shutdown_delay: Duration,

    #[command(flatten)]
    pub tls: warren_trust::TlsArgs,
    // Listener limits (docs/security.md, "Listeners under load").
    /// How long a client may take to send a request's headers, from
    /// connecting or from the first byte of a later request on a kept-alive
    /// connection; then the connection is closed.
    #[arg(long, env = "WARREN_NODE_HEADER_READ_TIMEOUT", default_value = "10s", value_parser = parse_duration)]
    pub header_read_timeout: Duration,
    /// How long a connection may stay open with no request in flight
    /// (longer than the gateway's 60 s pool, so it never reuses one the
    /// node is closing).
    #[arg(long, env = "WARREN_NODE_IDLE_TIMEOUT", default_value = "120s", value_parser = parse_duration)]
    pub idle_timeout: Duration,
    /// How long a request body may send nothing while the node waits for it
    /// (before answering); then the request is answered 408.
    #[arg(long, env = "WARREN_NODE_BODY_PROGRESS_TIMEOUT", default_value = "30s", value_parser = parse_duration)]
    pub body_progress_timeout: Duration,
    /// Most connections open at once on the data plane + control API
    /// listener; past it new connections are closed at once.
    #[arg(long, env = "WARREN_NODE_MAX_CONNECTIONS", default_value_t = 10_000)]
    pub max_connections: usize,
    /// Most connections open at once on the admin listener.
    #[arg(long, env = "WARREN_NODE_ADMIN_MAX_CONNECTIONS", default_value_t = 128)]
    pub admin_max_connections: usize,
}

/// [`Config`] after validation: every value the node runs with.
#[derive(Debug, Clone)]
pub struct Settings {
    pub node_id: String,
    pub listen: SocketAddr,
    pub advertise: Option<String>,
    pub admin_listen: SocketAddr,
    /// Scheduler endpoints in the order they are tried.
    pub schedulers: Vec<String>,
    pub data_dir: PathBuf,
    pub capacity: u32,
    pub runtime: RuntimeChoice,
    pub envd_bin: PathBuf,
    pub sandbox_id_base: u32,
    pub id_lock_dir: PathBuf,
    pub template_dir: PathBuf,
    /// `--blob-store` and its cache; `None`: roots from `--template-dir`.
    pub blob: Option<BlobSettings>,
    /// `--volume-dir`, `--volume-shared`, `--volume-max-bytes`.
    pub volumes: VolumeSettings,
    pub heartbeat_interval: Option<Duration>,
    pub caps: Caps,
    pub max_output_bytes: u64,
    /// How often sandboxes are sampled for metrics.
    pub metrics_interval: Duration,
    /// Most metrics samples kept per sandbox.
    pub metrics_samples: usize,
    pub envd_start_timeout: Duration,
    pub drain_timeout: Duration,
    pub shutdown_delay: Duration,
    /// Internal TLS flags, loaded when the part starts (before it binds).
    pub tls: warren_trust::TlsArgs,
    /// The listener's timeouts and connection limit (drain: `drain_timeout`).
    pub listener: warren_core::server::Limits,
    /// The admin listener's.
    pub admin_listener: warren_core::server::Limits,
}

/// What the node allows a sandbox at most; a template's own values apply
/// under these (see [`Caps::limits`]). The operator's, never a tenant's:
/// a template a team built through the API was checked against the
/// gateway's caps, and these hold whatever a record says.
#[derive(Debug, Clone, Copy, PartialEq)]
pub struct Caps {
    pub memory_mb: u64,
    pub cpus: f64,
    pub disk_mb: u64,
    pub pids: u64,
}

impl Caps {
    /// The limits of a sandbox whose template asks for `cpus`, `memory_mb`
    /// and `disk_mb`: each the smaller of the template's and the node's cap.
    /// Returns the limits and the disk size in bytes.
    pub fn limits(&self, cpus: u32, memory_mb: u64, disk_mb: u64) -> (Limits, u64) {
        let memory = self.memory_mb.min(memory_mb);
        let cpus = self.cpus.min(f64::from(cpus));
        let disk = self.disk_mb.min(disk_mb);
        (
            Limits {
                memory_bytes: memory << 20,
                pids: self.pids,
                cpus,
            },
            disk << 20,
        )
    }
}

/// Resource limits applied to one sandbox.
#[derive(Debug, Clone, Copy)]
pub struct Limits {
    pub memory_bytes: u64,
    pub pids: u64,
    /// CPUs (fractional); 0 means unlimited.
    pub cpus: f64,
}

fn invalid(msg: impl Into<String>) -> ConfigError {
    ConfigError::Invalid(msg.into())
}

impl Config {
    /// Checks every value and fills in derived defaults.
    pub fn validate(&self) -> Result<Settings, ConfigError> {
        let node_id = match &self.node_id {
            Some(id) => id.clone(),
            None => node_id_from_hostname(),
        };
        warren_core::id::validate_node_id(&node_id)
            .map_err(|e| invalid(format!("--node-id: {e}")))?;
        let schedulers = warren_proto::client::parse_urls(&self.scheduler)
            .map_err(|e| invalid(format!("--scheduler: {e}")))?;
        if let Some(a) = &self.advertise {
            let ok = a
                .rsplit_once(':')
                .is_some_and(|(h, p)| !h.is_empty() && p.parse::<u16>().is_ok_and(|p| p > 0));
            if !ok {
                return Err(invalid(format!(
                    "--advertise: {a:?} must be host:port with a non-zero port"
                )));
            }
        }
        if self.disk_limit_mb < 64 {
            return Err(invalid("--disk-limit-mb must be at least 64"));
        }
        if self.capacity == 0 {
            return Err(invalid("--capacity must be at least 1"));
        }
        if self.memory_limit_mb < 64 {
            return Err(invalid("--memory-limit-mb must be at least 64"));
        }
        if self.pids_limit < 16 {
            return Err(invalid("--pids-limit must be at least 16"));
        }
        if !self.cpu_limit.is_finite() || self.cpu_limit <= 0.0 {
            return Err(invalid("--cpu-limit must be a positive number of CPUs"));
        }
        if self.max_output_bytes < 4096 {
            return Err(invalid("--max-output-bytes must be at least 4096"));
        }
        if let Some(hb) = self.heartbeat_interval {
            if hb < Duration::from_millis(100) {
                return Err(invalid("--heartbeat-interval must be at least 100ms"));
            }
        }
        if self.metrics_interval < Duration::from_millis(100) {
            return Err(invalid("--metrics-interval must be at least 100ms"));
        }
        if !(1..=1_000_000).contains(&self.metrics_samples) {
            return Err(invalid("--metrics-samples must be between 1 and 1000000"));
        }
        if self.envd_start_timeout < Duration::from_millis(100) {
            return Err(invalid("--envd-start-timeout must be at least 100ms"));
        }
        let envd_bin = match &self.envd_bin {
            Some(p) => p.clone(),
            None => std::env::current_exe()
                .map_err(|e| invalid(format!("cannot find this executable for --envd-bin: {e}")))?,
        };
        if !envd_bin.is_file() {
            return Err(invalid(format!(
                "--envd-bin: {} is not a file",
                envd_bin.display()
            )));
        }
        let envd_bin = envd_bin
            .canonicalize()
            .map_err(|e| invalid(format!("--envd-bin: {}: {e}", envd_bin.display())))?;
        let listener = warren_core::server::Limits::from_flags(
            self.header_read_timeout,
            self.idle_timeout,
            self.body_progress_timeout,
            self.max_connections,
            0,
            self.drain_timeout,
        )?;
        let admin_listener =
            listener.for_admin(self.admin_max_connections, "--admin-max-connections")?;
        let data_dir = self
            .data_dir
            .clone()
            .unwrap_or_else(|| PathBuf::from(format!("./.warren/node-{node_id}")));
        let blob = match self.blob.settings().map_err(invalid)? {
            None => None,
            Some(store) => {
                if self.cache_max_bytes < 1 << 20 {
                    return Err(invalid(
                        "--cache-max-bytes must be at least 1048576 (1 MiB)",
                    ));
                }
                Some(BlobSettings {
                    store,
                    cache_dir: self
                        .cache_dir
                        .clone()
                        .unwrap_or_else(|| data_dir.join("cache")),
                    cache_max_bytes: self.cache_max_bytes,
                })
            }
        };
        let volumes = VolumeSettings {
            dir: self
                .volume_dir
                .clone()
                .unwrap_or_else(|| data_dir.join("volumes")),
            shared: self.volume_shared,
            max_bytes: match (self.volume_shared, self.volume_max_bytes) {
                (false, None) => DEFAULT_VOLUME_MAX_BYTES,
                (false, Some(b)) if b < MIN_VOLUME_MAX_BYTES => {
                    return Err(invalid(format!(
                        "--volume-max-bytes must be at least {MIN_VOLUME_MAX_BYTES} (16 MiB)"
                    )))
                }
                (false, Some(b)) => b,
                (true, None | Some(0)) => 0,
                (true, Some(_)) => {
                    return Err(invalid(
                        "--volume-max-bytes cannot be enforced on a shared store \
                         (--volume-shared): each volume there is a plain directory, bounded \
                         only by the shared filesystem's own quotas; leave it unset",
                    ))
                }
            },
        };
        Ok(Settings {
            volumes,
            blob,
            tls: self.tls.clone(),
            node_id,
            listen: self.listen,
            advertise: self.advertise.clone(),
            admin_listen: self.admin_listen,
            schedulers,
            data_dir,
            capacity: self.capacity,
            runtime: self.runtime,
            envd_bin,
            sandbox_id_base: self.sandbox_id_base,
            id_lock_dir: self.id_lock_dir.clone(),
            template_dir: self.template_dir.clone(),
            heartbeat_interval: self.heartbeat_interval,
            caps: Caps {
                memory_mb: self.memory_limit_mb,
                cpus: self.cpu_limit,
                disk_mb: self.disk_limit_mb,
                pids: self.pids_limit,
            },
            max_output_bytes: self.max_output_bytes,
            metrics_interval: self.metrics_interval,
            metrics_samples: self.metrics_samples,
            envd_start_timeout: self.envd_start_timeout,
            drain_timeout: self.drain_timeout,
            shutdown_delay: self.shutdown_delay,
            listener,
            admin_listener,
        })
    }
}

/// The host name folded into a valid node id (`My_Host.local` → `my-host-local`).
fn node_id_from_hostname() -> String {
    let raw = std::fs::read_to_string("/proc/sys/kernel/hostname")
        .or_else(|_| std::fs::read_to_string("/etc/hostname"))
        .unwrap_or_default();
    let mut id: String = raw
        .trim()
        .chars()
        .map(|c| {
            let c = c.to_ascii_lowercase();
            if c.is_ascii_lowercase() || c.is_ascii_digit() {
                c
            } else {
                '-'
            }
        })
        .collect();
    id.truncate(warren_core::id::MAX_NODE_ID_LEN);
    let id = id.trim_matches('-').to_string();
    if id.is_empty() {
        "node".to_string()
    } else {
        id
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser;

    fn parse(args: &[&str]) -> Result<Settings, ConfigError> {
        let c = Config::try_parse_from(std::iter::once("node").chain(args.iter().copied()))
            .map_err(|e| invalid(e.to_string()))?;
        c.validate()
    }

    #[test]
    fn defaults_validate() {
        let s = parse(&["--node-id", "n1", "--envd-bin", "/bin/sh"]).unwrap();
        assert_eq!(s.data_dir, PathBuf::from("./.warren/node-n1"));
        assert_eq!(s.schedulers, vec!["http://127.0.0.1:50051".to_string()]);
        assert_eq!(s.capacity, 100);
        assert_eq!(
            s.caps,
            Caps {
                memory_mb: 8192,
                cpus: 8.0,
                disk_mb: 20480,
                pids: 1024
            }
        );
        assert_eq!(
            (s.metrics_interval, s.metrics_samples),
            (Duration::from_secs(5), 720)
        );
    }

    #[test]
    fn rejects_bad_values() {
        let bad: &[&[&str]] = &[
            &["--node-id", "Bad_Id"],
            &["--scheduler", " , "],
            &["--advertise", "nohost"],
            &["--capacity", "0"],
            &["--cpu-limit", "-1"],
            &["--envd-bin", "/definitely/not/here"],
            &["--metrics-interval", "10ms"],
            &["--metrics-samples", "0"],
            &["--blob-store-option", "region=x"],
            &["--blob-store", "s3://b", "--blob-store-option", "region"],
            &[
                "--blob-store",
                "s3://b",
                "--blob-store-option",
                "secret_access_key=k",
            ],
            &["--blob-store", "s3://b", "--cache-max-bytes", "1000"],
        ];
        for args in bad {
            let mut all = vec!["--node-id", "n1", "--envd-bin", "/bin/sh"];
            all.extend_from_slice(args);
            assert!(parse(&all).is_err(), "{args:?} should be rejected");
        }
        let s = parse(&[
            "--node-id",
            "n1",
            "--envd-bin",
            "/bin/sh",
            "--scheduler",
            "http://a:1, b:2",
        ])
        .unwrap();
        assert_eq!(s.schedulers, vec!["http://a:1", "http://b:2"]);
        assert!(s.blob.is_none());
        let s = parse(&[
            "--node-id",
            "n1",
            "--envd-bin",
            "/bin/sh",
            "--data-dir",
            "/d",
            "--blob-store",
            "s3://b/p",
            "--blob-store-option",
            "region=garage",
        ])
        .unwrap();
        let b = s.blob.expect("a blob store");
        assert_eq!(b.store.url, "s3://b/p");
        assert_eq!(
            b.store.options,
            vec![("region".to_string(), "garage".to_string())]
        );
        assert_eq!(b.cache_dir, std::path::Path::new("/d/cache"));
        assert_eq!(b.cache_max_bytes, DEFAULT_CACHE_BYTES);
    }

    #[test]
    fn volume_stores() {
        let base = [
            "--node-id",
            "n1",
            "--envd-bin",
            "/bin/sh",
            "--data-dir",
            "/d",
        ];
        let s = parse(&base).unwrap();
        assert_eq!(
            s.volumes,
            VolumeSettings {
                dir: PathBuf::from("/d/volumes"),
                shared: false,
                max_bytes: DEFAULT_VOLUME_MAX_BYTES
            }
        );
        let with = |more: &[&str]| {
            let mut all = base.to_vec();
            all.extend_from_slice(more);
            parse(&all)
        };
        let s = with(&["--volume-shared", "--volume-dir", "/mnt/nfs/v"]).unwrap();
        assert!(s.volumes.shared);
        assert_eq!(s.volumes.max_bytes, 0);
        assert_eq!(s.volumes.dir, PathBuf::from("/mnt/nfs/v"));
        assert_eq!(
            with(&["--volume-max-bytes", "67108864"])
                .unwrap()
                .volumes
                .max_bytes,
            64 << 20
        );
        let e = with(&["--volume-shared", "--volume-max-bytes", "1073741824"])
            .unwrap_err()
            .to_string();
        assert!(
            e.contains("--volume-max-bytes") && e.contains("shared"),
            "{e}"
        );
        assert!(with(&["--volume-max-bytes", "1000"]).is_err());
    }

    #[test]
    fn caps_bound_what_a_template_asks() {
        let s = parse(&["--node-id", "n1", "--envd-bin", "/bin/sh"]).unwrap();
        // `base` (2 CPUs, 512 MiB, 2 GiB) is under every default cap.
        let (l, disk) = s.caps.limits(2, 512, 2048);
        assert_eq!((l.cpus, l.memory_bytes, disk), (2.0, 512 << 20, 2048 << 20));
        // A template asking for more than the node allows gets the cap.
        let (l, disk) = s.caps.limits(64, 1 << 20, 1 << 20);
        assert_eq!(
            (l.cpus, l.memory_bytes, disk),
            (8.0, 8192 << 20, 20480 << 20)
        );
        let s = parse(&[
            "--node-id",
            "n1",
            "--envd-bin",
            "/bin/sh",
            "--memory-limit-mb",
            "256",
            "--cpu-limit",
            "0.5",
        ])
        .unwrap();
        let (l, _) = s.caps.limits(2, 512, 2048);
        assert_eq!((l.cpus, l.memory_bytes), (0.5, 256 << 20));
        for bad in [
            &["--memory-limit-mb", "10"][..],
            &["--disk-limit-mb", "1"],
            &["--cpu-limit", "0"],
        ] {
            let mut all = vec!["--node-id", "n1", "--envd-bin", "/bin/sh"];
            all.extend_from_slice(bad);
            assert!(parse(&all).is_err(), "{bad:?}");
        }
    }

    #[test]
    fn hostname_becomes_a_valid_node_id() {
        let id = node_id_from_hostname();
        assert!(warren_core::id::validate_node_id(&id).is_ok(), "{id}");
    }
}
