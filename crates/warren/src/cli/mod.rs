//! Operator commands, talking to a gateway's public API like any client would.
//!
//! # Layout
//! - `mod.rs`: dispatch, the shared `--api-url`/`--api-key` flags, and [`Api`],
//!   a tiny JSON-over-HTTP client for the gateway.
//! - `sandbox.rs`: `warren sandbox ls | create | exec | rm`.
//! - `node.rs`: `warren node ls`.
//! - `route.rs`: `warren route <id>`, a gateway's cached route against the scheduler's.
//! - `chaos.rs`: `warren chaos failover`, the failover experiment (`warren-chaos`).
//!
//! Exit codes: 0 success, 1 the operation failed (the message says why), 64
//! bad usage; `sandbox exec` exits with the command's own exit code.

pub mod chaos;
mod node;
mod route;
mod sandbox;
pub mod template;

use bytes::Bytes;
use http::{Method, Request, StatusCode};
use http_body_util::{BodyExt, Full};
use hyper_util::client::legacy::Client;
use hyper_util::rt::TokioExecutor;
use std::ffi::OsString;
use std::process::ExitCode;
use std::time::Duration;
use warren_core::config::{self, ConfigError, EX_CONFIG};
use warren_core::logging::{self, LogFormat};

/// Where the gateway is and how to authenticate, shared by every operator command.
#[derive(Debug, Clone, clap::Args)]
pub struct ApiArgs {
    /// The gateway's URL (what the e2b SDK calls E2B_API_URL).
    #[arg(
        long,
        global = true,
        env = "E2B_API_URL",
        default_value = "http://127.0.0.1:3000"
    )]
    pub api_url: String,
    /// API key (X-API-Key); `warren dev` prints one.
    #[arg(long, global = true, env = "E2B_API_KEY", hide_env_values = true)]
    pub api_key: Option<String>,
    /// Where sandbox traffic goes (E2B_SANDBOX_URL); defaults to --api-url.
    #[arg(long, global = true, env = "E2B_SANDBOX_URL")]
    pub sandbox_url: Option<String>,
    /// Per-request timeout for control-plane calls.
    #[arg(long, global = true, default_value = "30s", value_parser = config::parse_duration)]
    pub timeout: Duration,
}

/// Runs `warren <sub> ...` for the operator subcommands.
pub fn run(sub: &str, args: Vec<OsString>, log_format: LogFormat) -> ExitCode {
    logging::init(log_format);
    let rt = match tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
    {
        Ok(rt) => rt,
        Err(e) => {
            eprintln!("warren: cannot start the async runtime: {e}");
            return ExitCode::FAILURE;
        }
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

/// A minimal JSON client for the gateway's control plane.
pub struct Api {
    base: String,
    key: Option<String>,
    timeout: Duration,
    client: Client<hyper_util::client::legacy::connect::HttpConnector, Full<Bytes>>,
}

impl Api {
    pub fn new(args: &ApiArgs) -> Self {
        Api {
            base: args.api_url.trim_end_matches('/').to_string(),
            key: args.api_key.clone(),
            timeout: args.timeout,
            client: Client::builder(TokioExecutor::new()).build_http(),
        }
    }

    /// Sends a request; returns the status and the parsed JSON body (Null when empty).
    pub async fn call(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<(StatusCode, serde_json::Value)> {
        let url = format!("{}{}", self.base, path);
        let mut req = Request::builder().method(method.clone()).uri(&url);
        if let Some(key) = &self.key {
            req = req.header(warren_core::headers::API_KEY, key);
        }
        for (name, value) in headers {
            req = req.header(*name, *value);
        }
        let body = match body {
            Some(v) => {
                req = req.header(http::header::CONTENT_TYPE, "application/json");
                Full::new(Bytes::from(serde_json::to_vec(&v)?))
            }
            None => Full::new(Bytes::new()),
        };
        let req = req.body(body)?;
        let resp = tokio::time::timeout(self.timeout, self.client.request(req))
            .await
            .map_err(|_| anyhow::anyhow!("{method} {url}: no answer within {:?}", self.timeout))?
            .map_err(|e| anyhow::anyhow!("{method} {url}: cannot reach the gateway: {e}"))?;
        let status = resp.status();
        let bytes = resp.into_body().collect().await?.to_bytes();
        let json = if bytes.is_empty() {
            serde_json::Value::Null
        } else {
            serde_json::from_slice(&bytes).unwrap_or_else(|_| {
                serde_json::Value::String(String::from_utf8_lossy(&bytes).into_owned())
            })
        };
        Ok((status, json))
    }

    /// Like [`Api::call`], but a non-2xx status is an error carrying the gateway's message.
    pub async fn ok(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
    ) -> anyhow::Result<serde_json::Value> {
        self.ok_with_headers(method, path, body, &[]).await
    }

    /// [`Api::ok`] with extra request headers.
    pub async fn ok_with_headers(
        &self,
        method: Method,
        path: &str,
        body: Option<serde_json::Value>,
        headers: &[(&str, &str)],
    ) -> anyhow::Result<serde_json::Value> {
        let (status, json) = self.call(method.clone(), path, body, headers).await?;
        if status.is_success() {
            return Ok(json);
        }
        let msg = json
            .get("message")
            .and_then(|m| m.as_str())
            .map(str::to_string)
            .unwrap_or_else(|| json.to_string());
        anyhow::bail!("{method} {path}: {status}: {msg}")
    }
}
