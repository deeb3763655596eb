//! Operator commands, talking to a gateway's public API like any client would.
//!
//! # Layout
//! - `mod.rs`: dispatch and the shared `--api-url` and API-key settings, which
//!   build a `warren-client` (retried reads, idempotent creates, resumable
//!   command streams): the CLI has no HTTP client of its own.
//! - `sandbox.rs`: `warren sandbox ls | create | exec | rm`.
//! - `node.rs`: `warren node ls`.
//! - `route.rs`: `warren route <id>`, a gateway's cached route against the scheduler's.
//! - `chaos.rs`: `warren chaos failover`, the failover experiment (`warren-chaos`).
//! - `template.rs`, `certs.rs`: local commands (the template store, the
//!   cluster's certificates), parsed with [`parse_or_exit`].
//!
//! Exit codes: 0 success, 1 the operation failed (the message says why), 64
//! bad usage; `sandbox exec` exits with the command's own exit code.

pub mod certs;
pub mod chaos;
mod node;
mod route;
mod sandbox;
pub mod template;

use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;
use warren_core::config::{self, ConfigError, EX_CONFIG};
use warren_core::logging::{self, LogFormat};

/// Parses a local command's arguments; on `--help` (exit 0) or bad usage
/// (exit 64) prints clap's text and returns the exit code instead.
pub fn parse_or_exit<C: clap::Parser>(args: Vec<OsString>) -> Result<C, ExitCode> {
    C::try_parse_from(args).map_err(|e| {
        let _ = e.print();
        if e.use_stderr() {
            ExitCode::from(EX_CONFIG as u8)
        } else {
            ExitCode::SUCCESS
        }
    })
}

/// Where the gateway is and how to authenticate, shared by every operator command.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The gateway's URL (what the e2b SDK calls E2B_API_URL); several,
    /// comma-separated, are tried in turn.
    #[arg(
        long,
        global = true,
        env = "E2B_API_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    pub api_url: String,
    /// API key (X-API-Key), from the environment only: E2B_API_KEY, as the
    /// e2b SDK and CLI read it (`warren dev` prints one). `--api-key` on
    /// the command line is refused: every account on the host can read a
    /// process's arguments.
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// A file holding the API key (readable by its owner only), instead of
    /// E2B_API_KEY.
    #[arg(long, global = true, env = "WARREN_API_KEY_FILE")]
    pub api_key_file: Option<std::path::PathBuf>,
    /// Where sandbox traffic goes (E2B_SANDBOX_URL); defaults to --api-url.
    #[arg(long, global = true, env = "E2B_SANDBOX_URL")]
    pub sandbox_url: Option<String>,
    /// Per-request timeout for calls to the gateway (not a sandbox's
    /// lifetime: that is `sandbox create --timeout`).
    #[arg(long, global = true, default_value = "30s", value_parser = config::parse_duration)]
    pub request_timeout: Duration,
}

impl ApiArgs {
    /// A `warren-client` for the control plane (`--api-url`).
    pub fn client(&self) -> Result<warren_client::Client, ConfigError> {
        self.client_for(&self.api_url, "--api-url")
    }

    /// A `warren-client` for sandbox traffic (`--sandbox-url`, else `--api-url`).
    pub fn sandbox_client(&self) -> Result<warren_client::Client, ConfigError> {
        match &self.sandbox_url {
            Some(url) => self.client_for(url, "--sandbox-url"),
            None => self.client(),
        }
    }

    /// The API key: E2B_API_KEY or the contents of `--api-key-file`.
    fn key(&self) -> Result<Option<String>, ConfigError> {
        let Some(path) = &self.api_key_file else {
            return Ok(self.api_key.clone());
        };
        if self.api_key.is_some() {
            return Err(ConfigError::Invalid(
                "--api-key-file and E2B_API_KEY both give an API key: give one".into(),
            ));
        }
        let text = warren_gateway::config::read_private(path, "--api-key-file")?;
        match text.trim() {
            "" => Err(ConfigError::Invalid(format!(
                "--api-key-file {}: the file is empty",
                path.display()
            ))),
            key => Ok(Some(key.to_string())),
        }
    }

    fn client_for(&self, urls: &str, flag: &str) -> Result<warren_client::Client, ConfigError> {
        let entries: Vec<&str> = urls
            .split(',')
            .map(str::trim)
            .filter(|s| !s.is_empty())
            .collect();
        let mut builder = warren_client::ClientBuilder::new(&entries).timeout(self.request_timeout);
        if let Some(key) = self.key()? {
            builder = builder.api_key(key);
        }
        builder
            .build()
            .map_err(|e| ConfigError::Invalid(format!("{flag}: {e}")))
    }
}

/// Why `--api-key` is refused wherever an operator command takes a key.
pub const API_KEY_REFUSED: &str = "--api-key on the command line: every account on this host \
     can read a process's arguments (ps, /proc/<pid>/cmdline), so the key is never taken there. \
     Set E2B_API_KEY (as for the e2b SDK and CLI) or give --api-key-file FILE (mode 0600)";

/// Whether `args` give `--api-key` (see [`API_KEY_REFUSED`]).
pub fn names_api_key(args: &[OsString]) -> bool {
    config::names_flag(args, "--api-key")
}

/// Runs `warren <sub> ...` for the operator subcommands.
pub fn run(sub: &str, args: Vec<OsString>, log_format: LogFormat) -> ExitCode {
    logging::init(log_format);
    if names_api_key(&args) {
        eprintln!("warren: {API_KEY_REFUSED}");
        return ExitCode::from(EX_CONFIG as u8);
    }
    let rt = match crate::runtime(false) {
        Ok(rt) => rt,
        Err(code) => return code,
    };
    let result = rt.block_on(async move {
        match sub {
            "sandbox" => sandbox::run(args).await,
            "node" => node::run(args).await,
            "route" => route::run(args).await,
            other => Err(ConfigError::Invalid(format!("unknown command {other:?}")).into()),
        }
    });
    match result {
        Ok(code) => code,
        Err(e) => match e.downcast_ref::<ConfigError>() {
            Some(ConfigError::Help(text)) => {
                print!("{text}");
                ExitCode::SUCCESS
            }
            Some(err) => {
                eprintln!("warren: {err}");
                ExitCode::from(EX_CONFIG as u8)
            }
            None => {
                eprintln!("warren: {e:#}");
                ExitCode::FAILURE
            }
        },
    }
}

/// Parses an operator command's flags (no TOML file for these).
pub fn parse<T: clap::CommandFactory + clap::FromArgMatches>(
    args: Vec<OsString>,
) -> Result<T, ConfigError> {
    config::load_from(args, None)
}
