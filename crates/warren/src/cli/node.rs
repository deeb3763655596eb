//! `warren node ls`: the nodes the scheduler knows, through the gateway's
//! `GET /nodes` (E2B's admin nodes endpoint shape).

use super::{parse, ApiArgs};
use std::ffi::OsString;
use std::process::ExitCode;

#[derive(Debug, clap::Parser)]
#[command(name = "warren node", about = "List nodes")]
struct Cmd {
    #[command(flatten)]
    api: ApiArgs,
    #[command(subcommand)]
    action: Action,
}

#[derive(Debug, clap::Subcommand)]
enum Action {
    /// List nodes with their state and sandbox count.
    Ls {
        /// Print the raw JSON instead of a table.
        #[arg(long)]
        json: bool,
    },
}

pub async fn run(args: Vec<OsString>) -> anyhow::Result<ExitCode> {
    let cmd: Cmd = parse(args)?;
    let client = cmd.api.client()?;
    let Action::Ls { json } = cmd.action;
    let nodes = client.get_json("/nodes").await?;
    if json {
        println!("{}", serde_json::to_string_pretty(&nodes)?);
        return Ok(ExitCode::SUCCESS);
    }
    println!(
        "{:<16} {:<8} {:<24} {:>9} {:>9}",
        "NODE ID", "STATE", "ENDPOINT", "SANDBOXES", "CAPACITY"
    );
    for n in nodes.as_array().into_iter().flatten() {
        let s = |k: &str| n.get(k).and_then(|v| v.as_str()).unwrap_or("-").to_string();
        let num = |k: &str| {
            n.get(k)
                .and_then(|v| v.as_u64())
                .map(|v| v.to_string())
                .unwrap_or_else(|| "-".into())
        };
        println!(
            "{:<16} {:<8} {:<24} {:>9} {:>9}",
            s("nodeID"),
            s("status"),
            s("endpoint"),
            num("sandboxCount"),
            num("capacity")
        );
    }
    Ok(ExitCode::SUCCESS)
}
