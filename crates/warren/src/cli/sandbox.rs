//! `warren sandbox ls | create | exec | rm`.

use super::{parse, ApiArgs};
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
        /// One argument: a shell command line, run with `/bin/sh -c`.
        /// Several: the program and its arguments, passed exactly as given
        /// (`-- sh -c 'echo hi; id -un'` runs `sh` with those two arguments).
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
    let client = cmd.api.client()?;
    match cmd.action {
        Action::Ls { json } => {
            let list = client.list().await?;
            if json {
                println!("{}", serde_json::to_string_pretty(&list)?);
                return Ok(ExitCode::SUCCESS);
            }
            println!(
                "{:<22} {:<10} {:<8} {:<26} {:<26} METADATA",
                "SANDBOX ID", "TEMPLATE", "STATE", "STARTED", "ENDS"
            );
            let or_dash = |v: &Option<String>| v.clone().unwrap_or_else(|| "-".into());
            for s in list {
                let meta: BTreeMap<_, _> = s.metadata.iter().collect();
                let meta: Vec<String> = meta.iter().map(|(k, v)| format!("{k}={v}")).collect();
                println!(
                    "{:<22} {:<10} {:<8} {:<26} {:<26} {}",
                    s.sandbox_id,
                    s.template_id,
                    or_dash(&s.state),
                    or_dash(&s.started_at),
                    or_dash(&s.end_at),
                    meta.join(",")
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
            let new = warren_client::NewSandbox {
                template_id: template,
                timeout,
                metadata: metadata.into_iter().collect(),
                ..Default::default()
            };
            // Always a key, so a retry through another entry point (or after
            // a lost answer) never makes a second sandbox.
            let key = idempotency_key.unwrap_or_else(|| warren_core::id::random_token(32));
            let created = client.create(&new, &key).await?;
            println!("{}", created.sandbox.sandbox_id);
            Ok(ExitCode::SUCCESS)
        }
        Action::Exec {
            sandbox_id,
            command,
        } => exec(&client, &cmd.api, &sandbox_id, command).await,
        Action::Rm { sandbox_ids } => {
            let mut failed = false;
            for id in sandbox_ids {
                match client.kill(&id).await {
                    Ok(_) => println!("{id} removed"),
                    Err(e) => {
                        eprintln!("warren: {id}: {e}");
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

/// Runs `argv` (one argument: a `/bin/sh -c` line; several: exactly as
/// given, never re-joined into one line) through envd's
/// `process.Process/Start`, over the sandbox traffic path (E2b-Sandbox-Id /
/// E2b-Sandbox-Port headers), streaming output. `--sandbox-url` may name
/// several entry points (comma-separated): when the stream is cut,
/// `warren-client` resumes it through the next one from the last byte
/// received, so nothing is lost or printed twice.
async fn exec(
    client: &warren_client::Client,
    args: &ApiArgs,
    sandbox_id: &str,
    mut argv: Vec<String>,
) -> anyhow::Result<ExitCode> {
    warren_core::id::validate_sandbox_id(sandbox_id)
        .map_err(|e| ConfigError::Invalid(e.to_string()))?;
    let sandbox = client.get(sandbox_id).await?;
    let data = args.sandbox_client()?;
    let command = if argv.len() == 1 {
        warren_client::Command::shell(argv.remove(0))
    } else {
        let cmd = argv.remove(0);
        warren_client::Command {
            cmd,
            args: argv,
            ..Default::default()
        }
    };
    let mut stream = data
        .run(&sandbox, command)
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
