//! `warren sandbox ls | create | exec | rm`.

use super::{parse, Api, ApiArgs};
use anyhow::Context;
use http::Method;
use std::collections::BTreeMap;
use std::ffi::OsString;
use std::io::Write;
use std::process::ExitCode;
use warren_client::StreamEvent;
use warren_core::config::ConfigError;

#[derive(Debug, clap::Parser)]
#[command(
    name = "warren sandbox",
    about = "List, create, run commands in, and remove sandboxes"
)]
struct Cmd {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// List your team's sandboxes.
    Ls {
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
    /// Create a sandbox and print its id.
    Create {
        /// Template to start from.
        #[arg(long, default_value = "base")]
        template: String,
        /// Seconds until the sandbox is killed (E2B's timeout).
        #[arg(long, default_value_t = 300)]
        timeout: u64,
        /// Metadata, repeatable: --metadata key=value.
        #[arg(long = "metadata", value_parser = key_value)]
        metadata: Vec<(String, String)>,
        /// Makes retries of this create return the same sandbox.
        #[arg(long)]
        idempotency_key: Option<String>,
    },
    /// Run a command in a sandbox, streaming its output; exits with its exit code.
    Exec {
        /// The sandbox.
        sandbox_id: String,
        /// The command line, run with `/bin/sh -c`.
        #[arg(required = true, trailing_var_arg = true, allow_hyphen_values = true)]
        command: Vec<String>,
    },
    /// Kill sandboxes.
    Rm {
        #[arg(required = true)]
        sandbox_ids: Vec<String>,
    },
}

fn key_value(s: &str) -> Result<(String, String), String> {
    s.split_once('=')
        .map(|(k, v)| (k.to_string(), v.to_string()))
        .ok_or_else(|| format!("{s:?} is not key=value"))
}

pub async fn run(args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let cmd: Cmd = parse(args)?;
    let api = Api::new(&cmd.api);
    match cmd.action {
        Action::Ls { json } => {
            let list = api.ok(Method::GET, "/sandboxes", None).await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<22} {:<10} {:<8} {:<26} {:<26} METADATA",
                "SANDBOX ID", "TEMPLATE", "STATE", "STARTED", "ENDS"
            );
            for s in list.as_array().into_iter().flatten() {
                let field = |k: &str| s.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
                let meta = s
                    .get("metadata")
                    .and_then(|m| m.as_object())
                    .map(|m| {
                        m.iter()
                            .map(|(k, v)| format!("{k}={}", v.as_str().unwrap_or_default()))
                            .collect::<Vec<_>>()
                            .join(",")
                    })
                    .unwrap_or_default();
                println!(
                    "{:<22} {:<10} {:<8} {:<26} {:<26} {}",
                    field("sandboxID"),
                    field("templateID"),
                    field("state"),
                    field("startedAt"),
                    field("endAt"),
                    meta
                );
            }
            Ok(ExitCode::SUCCESS)
        }
        Action::Create {
            template,
            timeout,
            metadata,
            idempotency_key,
        } => {
            let metadata: BTreeMap<_, _> = metadata.into_iter().collect();
            let body = serde_json::json!({
                "templateID": template,
                "timeout": timeout,
                "metadata": metadata,
            });
            let created = match idempotency_key {
                None => api.ok(Method::POST, "/sandboxes", Some(body)).await?,
                Some(key) => api.ok_with_idempotency(&key, body).await?,
            };
            let id = created
                .get("sandboxID")
                .and_then(|v| v.as_str())
                .context("the gateway's answer has no sandboxID")?;
            println!("{id}");
            Ok(ExitCode::SUCCESS)
        }
        Action::Exec {
            sandbox_id,
            command,
        } => exec(&api, &cmd.api, &sandbox_id, &command.join(" ")).await,
        Action::Rm { sandbox_ids } => {
            let mut failed = false;
            for id in sandbox_ids {
                match api
                    .ok(Method::DELETE, &format!("/sandboxes/{id}"), None)
                    .await
                {
                    Ok(_) => println!("{id} removed"),
                    Err(e) => {
                        eprintln!("warren: {e:#}");
                        failed = true;
                    }
                }
            }
            Ok(if failed {
                ExitCode::FAILURE
            } else {
                ExitCode::SUCCESS
            })
        }
    }
}

impl Api {
    async fn ok_with_idempotency(
        &self,
        key: &str,
        body: serde_json::Value,
    ) -> anyhow::Result<serde_json::Value> {
        self.ok_with_headers(
            Method::POST,
            "/sandboxes",
            Some(body),
            &[(warren_core::headers::IDEMPOTENCY_KEY, key)],
        )
        .await
    }
}

/// Runs `command` through envd's `process.Process/Start`, over the sandbox
/// traffic path (E2b-Sandbox-Id / E2b-Sandbox-Port headers), streaming
/// output. `--sandbox-url` may name several entry points (comma-separated):
/// when the stream is cut, `warren-client` resumes it through the next one
/// from the last byte received, so nothing is lost or printed twice.
async fn exec(
    api: &Api,
    args: &ApiArgs,
    sandbox_id: &str,
    command: &str,
) -> anyhow::Result<ExitCode> {
    warren_core::id::validate_sandbox_id(sandbox_id)
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let info = api
        .ok(Method::GET, &format!("/sandboxes/{sandbox_id}"), None)
        .await?;
    let sandbox = warren_client::Sandbox {
        sandbox_id: sandbox_id.to_string(),
        envd_access_token: info
            .get("envdAccessToken")
            .and_then(|v| v.as_str())
            .map(str::to_string),
        ..Default::default()
    };
    let base = args
        .sandbox_url
        .clone()
        .unwrap_or_else(|| args.api_url.clone());
    let entries: Vec<&str> = base.split(',').map(str::trim).collect();
    let client = warren_client::ClientBuilder::new(&entries)
        .timeout(args.timeout)
        .build()
        .map_err(|e| ConfigError::Invalid(format!("--sandbox-url: {e}")))?;
    let mut stream = client
        .run(&sandbox, warren_client::Command::shell(command))
        .await
        .map_err(|e| anyhow::anyhow!("starting the command: {e}"))?;
    let mut exit = 1u8;
    while let Some(event) = stream
        .next()
        .await
        .map_err(|e| anyhow::anyhow!("command stream: {e}"))?
    {
        match event {
            StreamEvent::Stdout(b) => {
                let mut out = std::io::stdout().lock();
                out.write_all(&b)?;
                out.flush()?;
            }
            StreamEvent::Stderr(b) => {
                let mut err = std::io::stderr().lock();
                err.write_all(&b)?;
                err.flush()?;
            }
            StreamEvent::Resumed { entry, offset } => {
                tracing::info!(%entry, offset, "command stream cut; resumed");
            }
            StreamEvent::End(end) => {
                if let Some(e) = end.error.as_deref() {
                    eprintln!("warren: {e}");
                }
                exit = u8::try_from(end.exit_code.clamp(0, 255)).unwrap_or(1);
            }
            StreamEvent::Started { .. } => {}
        }
    }
    Ok(ExitCode::from(exit))
}
