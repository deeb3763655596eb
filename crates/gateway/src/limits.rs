//! What a tenant may ask for and keep (docs/security.md, "Tenant bounds"):
//! the flags ([`LimitArgs`], flattened into the gateway's
//! [`Config`](crate::Config), so each has a `WARREN_GATEWAY_*` twin and a
//! TOML key) and the checked values ([`Limits`]).
//!
//! - [`SandboxCaps`]: the most CPU, memory and disk a sandbox of a team's
//!   template may have; a build asking for more is a `400` naming the flag.
//!   The nodes cap again (`--cpu-limit`, `--memory-limit-mb`,
//!   `--disk-limit-mb`, the same defaults), so a record in the store that
//!   says more never gets more.
//! - [`BuildLimits`]: template builds held in the scheduler's store, per
//!   team and in all, how long a requested build may wait to start, how
//!   long a finished one is kept, and how much log each keeps.
//! - [`StoreLimits`]: a team's snapshots and built templates in the shared
//!   template store, by count and by bytes.
//! - [`LayerGc`]: when layers no record names any more are removed.

use std::time::Duration;
use warren_core::config::{parse_duration, ConfigError};

/// The defaults of [`SandboxCaps`]: E2B's largest standard sandbox (8
/// vCPUs, 8 GB), and 20 GiB of disk; the nodes' `--cpu-limit`,
/// `--memory-limit-mb` and `--disk-limit-mb` default to the same.
pub const DEFAULT_MAX_CPUS: u32 = 8;
pub const DEFAULT_MAX_MEMORY_MB: u64 = 8192;
pub const DEFAULT_MAX_DISK_MB: u64 = 20 * 1024;

const MIB: u64 = 1024 * 1024;

/// The flags (see the module doc).
#[derive(Debug, Clone, clap::Args)]
pub struct LimitArgs {
    /// Most memory (MiB) a team's template may ask for (a build's
    /// `memoryMB`; past it: 400 naming this flag). Keep it at or under
    /// the nodes' --memory-limit-mb, which caps every sandbox anyway.
    #[arg(long, env = "WARREN_GATEWAY_MAX_SANDBOX_MEMORY_MB", default_value_t = DEFAULT_MAX_MEMORY_MB)]
    pub max_sandbox_memory_mb: u64,

    /// Most CPUs a team's template may ask for (a build's `cpuCount`;
    /// past it: 400). The nodes' --cpu-limit caps every sandbox anyway.
    #[arg(long, env = "WARREN_GATEWAY_MAX_SANDBOX_CPUS", default_value_t = DEFAULT_MAX_CPUS)]
    pub max_sandbox_cpus: u32,

    /// Most disk (MiB) a sandbox of a team's template may have: a built
    /// template keeps its parent's disk size, at most this. The nodes'
    /// --disk-limit-mb caps every sandbox anyway.
    #[arg(long, env = "WARREN_GATEWAY_MAX_SANDBOX_DISK_MB", default_value_t = DEFAULT_MAX_DISK_MB)]
    pub max_sandbox_disk_mb: u64,

    /// Most template builds one team may hold at once (in the scheduler's
    /// store, across every gateway): requested, running, and finished
    /// ones still readable. A request
    /// past it drops the team's oldest finished build, or, when none is
    /// finished, is refused (429 naming this flag); other teams are not
    /// affected. 20 is E2B's concurrent-build limit.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_TEAM_COUNT", default_value_t = 20)]
    pub build_team_count: usize,

    /// Most template builds held at once, all teams together (past it:
    /// 429).
    #[arg(long, env = "WARREN_GATEWAY_BUILD_TOTAL_COUNT", default_value_t = 1000)]
    pub build_total_count: usize,

    /// How long a requested build may wait for its start (the SDK uploads
    /// COPY's files in between; as long as an upload link lives by
    /// default): then it is forgotten (404).
    #[arg(long, env = "WARREN_GATEWAY_BUILD_START_TTL", default_value = "1h", value_parser = parse_duration)]
    pub build_start_ttl: Duration,

    /// How long a finished build's status and logs stay readable.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_RETENTION", default_value = "1h", value_parser = parse_duration)]
    pub build_retention: Duration,

    /// Most bytes of log one build keeps (each line counted with 64 bytes
    /// of bookkeeping); past it further lines are dropped and the log
    /// says so.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_LOG_MAX_BYTES", default_value_t = MIB)]
    pub build_log_max_bytes: u64,

    /// Most bytes of log one team's builds keep together:
    /// past it the logs of the team's oldest finished builds are dropped
    /// first (their log says so), then a running build's further lines.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_LOG_TEAM_BYTES", default_value_t = 16 * MIB)]
    pub build_log_team_bytes: u64,

    /// How long a running build's claim holds without a renewal: the
    /// gateway running it renews it every third of this, and a build
    /// whose gateway stopped renewing (it died, or lost the scheduler)
    /// fails once it runs out, its status naming that gateway. At least
    /// 1s, at most 1h.
    #[arg(long, env = "WARREN_GATEWAY_BUILD_LEASE", default_value = "30s", value_parser = parse_duration)]
    pub build_lease: Duration,

    /// Most templates one team may build and keep (each tag of a
    /// template counts as one; past it: 429 naming this flag).
    #[arg(
        long,
        env = "WARREN_GATEWAY_TEMPLATE_TEAM_COUNT",
        default_value_t = 100
    )]
    pub template_team_count: usize,

    /// Most snapshots one team may keep (past it: 429 naming this flag).
    /// A build saves through one snapshot, so it needs room for one more.
    #[arg(
        long,
        env = "WARREN_GATEWAY_SNAPSHOT_TEAM_COUNT",
        default_value_t = 100
    )]
    pub snapshot_team_count: usize,

    /// Most secrets one team may keep (E2B's `/secrets`; past it: 429
    /// naming this flag).
    #[arg(long, env = "WARREN_GATEWAY_SECRETS_TEAM_COUNT", default_value_t = 100)]
    pub secrets_team_count: usize,

    /// Most bytes the layers of one team's snapshots and built templates
    /// may take in the template store every team shares (past it: 429
    /// naming this flag; a snapshot that takes the team past it is not
    /// kept).
    #[arg(long, env = "WARREN_GATEWAY_SNAPSHOT_TEAM_BYTES", default_value_t = 32 * 1024 * MIB)]
    pub snapshot_team_bytes: u64,

    /// How often the gateway removes layers that no record names any more
    /// (deleted snapshots and templates) and that no node's sandbox
    /// stacks.
    #[arg(long, env = "WARREN_GATEWAY_LAYER_GC_INTERVAL", default_value = "1m", value_parser = parse_duration)]
    pub layer_gc_interval: Duration,

    /// How long a layer stays after its last record went before it may
    /// be removed: room for a create that read the record just before the
    /// delete to finish stacking it (and then to be seen on its node).
    #[arg(long, env = "WARREN_GATEWAY_LAYER_GC_GRACE", default_value = "10m", value_parser = parse_duration)]
    pub layer_gc_grace: Duration,
}

/// The most a sandbox of a team's template may have.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct SandboxCaps {
    pub cpus: u32,
    pub memory_mb: u64,
    pub disk_mb: u64,
}

/// Template builds held in the scheduler's store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct BuildLimits {
    pub team_count: usize,
    pub total_count: usize,
    pub start_ttl: Duration,
    pub retention: Duration,
    pub log_max_bytes: u64,
    pub log_team_bytes: u64,
    pub lease: Duration,
}

/// A team's share of the template store.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct StoreLimits {
    pub template_count: usize,
    pub snapshot_count: usize,
    pub snapshot_bytes: u64,
}

/// When unused layers are removed.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct LayerGc {
    pub interval: Duration,
    pub grace: Duration,
}

/// Every bound of this module, checked.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Limits {
    pub sandbox: SandboxCaps,
    pub builds: BuildLimits,
    pub store: StoreLimits,
    pub layer_gc: LayerGc,
    /// `--secrets-team-count`.
    pub secrets_team_count: usize,
}

impl LimitArgs {
    /// Checks the flags against each other; the message names the flag.
    pub fn validate(&self) -> Result<Limits, ConfigError> {
        let bad = |m: String| Err(ConfigError::Invalid(m));
        if self.max_sandbox_cpus == 0 {
            return bad("--max-sandbox-cpus must be at least 1".into());
        }
        if self.max_sandbox_memory_mb < 128 {
            return bad("--max-sandbox-memory-mb must be at least 128 (E2B's smallest)".into());
        }
        if self.max_sandbox_disk_mb < 64 {
            return bad("--max-sandbox-disk-mb must be at least 64".into());
        }
        if self.build_team_count == 0 || self.build_total_count < self.build_team_count {
            return bad(format!(
                "--build-team-count {} must be at least 1 and at most --build-total-count {}",
                self.build_team_count, self.build_total_count
            ));
        }
        let month = Duration::from_secs(30 * 24 * 3600);
        if self.build_start_ttl.is_zero()
            || self.build_retention.is_zero()
            || self.build_start_ttl > month
            || self.build_retention > month
        {
            return bad(
                "--build-start-ttl and --build-retention must be greater than zero and at most 30 days"
                    .into(),
            );
        }
        if self.build_lease < Duration::from_secs(1) || self.build_lease > Duration::from_secs(3600)
        {
            return bad(format!(
                "--build-lease {:?} must be at least 1s and at most 1h",
                self.build_lease
            ));
        }
        if self.build_log_max_bytes < 4096 || self.build_log_team_bytes < self.build_log_max_bytes {
            return bad(format!(
                "--build-log-max-bytes {} must be at least 4096 and at most \
                 --build-log-team-bytes {}",
                self.build_log_max_bytes, self.build_log_team_bytes
            ));
        }
        if self.layer_gc_interval.is_zero() {
            return bad("--layer-gc-interval must be greater than zero".into());
        }
        Ok(Limits {
            sandbox: SandboxCaps {
                cpus: self.max_sandbox_cpus,
                memory_mb: self.max_sandbox_memory_mb,
                disk_mb: self.max_sandbox_disk_mb,
            },
            builds: BuildLimits {
                team_count: self.build_team_count,
                total_count: self.build_total_count,
                start_ttl: self.build_start_ttl,
                retention: self.build_retention,
                log_max_bytes: self.build_log_max_bytes,
                log_team_bytes: self.build_log_team_bytes,
                lease: self.build_lease,
            },
            store: StoreLimits {
                template_count: self.template_team_count,
                snapshot_count: self.snapshot_team_count,
                snapshot_bytes: self.snapshot_team_bytes,
            },
            layer_gc: LayerGc {
                interval: self.layer_gc_interval,
                grace: self.layer_gc_grace,
            },
            secrets_team_count: self.secrets_team_count,
        })
    }
}

impl SandboxCaps {
    /// A team's requested CPU count, checked: a 400 naming the cap past it.
    pub fn cpus(&self, asked: u64) -> Result<u32, String> {
        match u32::try_from(asked) {
            Ok(n) if n >= 1 && n <= self.cpus => Ok(n),
            Ok(0) => Err("cpuCount must be at least 1".into()),
            _ => Err(format!(
                "cpuCount {asked} is more than this platform allows ({}, --max-sandbox-cpus)",
                self.cpus
            )),
        }
    }

    /// A team's requested memory, checked the same way (E2B's least is
    /// 128 MiB; warren takes 64).
    pub fn memory_mb(&self, asked: u64) -> Result<u64, String> {
        if asked < 64 {
            return Err(format!("memoryMB {asked} is less than 64"));
        }
        if asked > self.memory_mb {
            return Err(format!(
                "memoryMB {asked} is more than this platform allows ({}, --max-sandbox-memory-mb)",
                self.memory_mb
            ));
        }
        Ok(asked)
    }

    /// The defaults a team's template gets: its values, each at most the
    /// cap (a template recorded under an older, higher cap is held to
    /// today's).
    pub fn bound(&self, d: &mut warren_template::spec::Defaults) {
        d.cpu_count = d.cpu_count.clamp(1, self.cpus);
        d.memory_mb = d.memory_mb.min(self.memory_mb);
        d.disk_mb = d.disk_mb.min(self.disk_mb);
    }
}

#[cfg(test)]
#[allow(clippy::unwrap_used)]
mod tests {
    use super::*;
    use clap::Parser;

    #[derive(Debug, clap::Parser)]
    struct Only {
        #[command(flatten)]
        limits: LimitArgs,
    }

    fn parse(args: &[&str]) -> Result<Limits, ConfigError> {
        Only::try_parse_from(std::iter::once("gw").chain(args.iter().copied()))
            .map_err(|e| ConfigError::Invalid(e.to_string()))?
            .limits
            .validate()
    }

    #[test]
    fn defaults() {
        let l = parse(&[]).unwrap();
        assert_eq!(
            l.sandbox,
            SandboxCaps {
                cpus: 8,
                memory_mb: 8192,
                disk_mb: 20480
            }
        );
        assert_eq!(l.builds.team_count, 20);
        assert_eq!(l.builds.total_count, 1000);
        assert_eq!(l.builds.start_ttl, Duration::from_secs(3600));
        assert_eq!(l.builds.log_max_bytes, MIB);
        assert_eq!(l.store.snapshot_count, 100);
        assert_eq!(l.layer_gc.grace, Duration::from_secs(600));
    }

    #[test]
    fn caps_name_the_flag() {
        let caps = parse(&[]).unwrap().sandbox;
        let e = caps.memory_mb(1024 * 1024).unwrap_err();
        assert_eq!(
            e,
            "memoryMB 1048576 is more than this platform allows (8192, --max-sandbox-memory-mb)"
        );
        assert!(caps.cpus(64).unwrap_err().contains("--max-sandbox-cpus"));
        assert!(caps
            .cpus(u64::MAX)
            .unwrap_err()
            .contains("--max-sandbox-cpus"));
        assert!(caps.cpus(0).is_err());
        assert_eq!(caps.cpus(8).unwrap(), 8);
        assert_eq!(caps.memory_mb(512).unwrap(), 512);
        assert!(caps.memory_mb(10).is_err());
        let mut d = warren_template::spec::Defaults {
            cpu_count: 64,
            memory_mb: 1 << 20,
            disk_mb: 1 << 20,
            ..Default::default()
        };
        caps.bound(&mut d);
        assert_eq!((d.cpu_count, d.memory_mb, d.disk_mb), (8, 8192, 20480));
    }

    #[test]
    fn bad_values_name_the_flag() {
        for (args, flag) in [
            (&["--max-sandbox-cpus", "0"][..], "--max-sandbox-cpus"),
            (
                &["--max-sandbox-memory-mb", "64"],
                "--max-sandbox-memory-mb",
            ),
            (&["--build-team-count", "0"], "--build-team-count"),
            (
                &["--build-team-count", "50", "--build-total-count", "10"],
                "--build-total-count",
            ),
            (&["--build-start-ttl", "0s"], "--build-start-ttl"),
            (&["--build-log-max-bytes", "10"], "--build-log-max-bytes"),
            (&["--layer-gc-interval", "0s"], "--layer-gc-interval"),
        ] {
            let e = parse(args).unwrap_err().to_string();
            assert!(e.contains(flag), "{args:?}: {e}");
        }
    }
}
