//! `warren certs init | issue`: the cluster CA and the certificates every
//! part presents to the others (docs/security.md, "Internal trust").
//!
//! ```sh
//! warren certs init  --dir /etc/warren/certs                 # ca.pem, ca.key
//! warren certs issue --dir /etc/warren/certs --role node --name node-1 --host 10.0.0.11
//! # → node-node-1.pem, node-node-1.key: start the node with
//! #   --tls-ca ca.pem --tls-cert node-node-1.pem --tls-key node-node-1.key
//! ```

use clap::{Parser, Subcommand};
use std::ffi::OsString;
use std::path::PathBuf;
use std::process::ExitCode;
use warren_core::config::EX_CONFIG;
use warren_trust::issue::{file_base, Ca, Validity, CA_CERT};
use warren_trust::{Identity, Role};

#[derive(Debug, Parser)]
#[command(
    name = "warren certs",
    about = "Make the cluster CA and the certificates of schedulers, gateways and nodes"
)]
struct Cli {
    /// The certificate directory: the CA (`ca.pem`, `ca.key`) and, by
    /// default, the certificates issued.
    #[arg(
        long,
        global = true,
        env = "WARREN_CERTS_DIR",
        default_value = "/etc/warren/certs"
    )]
    dir: PathBuf,
    #[command(subcommand)]
    cmd: Cmd,
}

#[derive(Debug, Subcommand)]
enum Cmd {
    /// Makes a new cluster CA in --dir (refuses to replace one).
    Init {
        /// How long the CA is valid.
        #[arg(long, default_value_t = 3650)]
        days: u32,
    },
    /// Issues a certificate for one part, signed by the CA in --dir.
    Issue {
        /// scheduler, gateway or node.
        #[arg(long)]
        role: String,
        /// The part's name; for a node, its --node-id.
        #[arg(long)]
        name: String,
        /// A DNS name or IP address the part is reached at (repeatable;
        /// a node's --advertise host, a scheduler's URL host).
        #[arg(long = "host")]
        hosts: Vec<String>,
        /// How long the certificate is valid; renew before it ends (parts
        /// re-read a changed certificate file without a restart).
        #[arg(long, default_value_t = 90)]
        days: u32,
        /// Where to write `<role>-<name>.pem` and `.key` (default: --dir).
        #[arg(long)]
        out: Option<PathBuf>,
    },
}

/// Runs `warren certs ...`; `args[0]` is the program name.
pub fn run(args: Vec<OsString>) -> ExitCode {
    let cli: Cli = match super::parse_or_exit(args) {
        Ok(c) => c,
        Err(code) => return code,
    };
    match execute(cli) {
        Ok(()) => ExitCode::SUCCESS,
        Err(Failure::Usage(e)) => {
            eprintln!("warren certs: {e}");
            ExitCode::from(EX_CONFIG as u8)
        }
        Err(Failure::Failed(e)) => {
            eprintln!("warren certs: {e}");
            ExitCode::FAILURE
        }
    }
}

enum Failure {
    Usage(String),
    Failed(String),
}

fn execute(cli: Cli) -> Result<(), Failure> {
    let failed = |e: warren_trust::issue::IssueError| Failure::Failed(e.to_string());
    match cli.cmd {
        Cmd::Init { days } => {
            if cli.dir.join(CA_CERT).exists() {
                return Err(Failure::Usage(format!(
                    "{} already holds a CA; remove it first to make a new one",
                    cli.dir.display()
                )));
            }
            Ca::generate(Validity::days(days))
                .and_then(|ca| ca.save(&cli.dir))
                .map_err(failed)?;
            println!("{}", cli.dir.join(CA_CERT).display());
        }
        Cmd::Issue {
            role,
            name,
            hosts,
            days,
            out,
        } => {
            let role = Role::parse(&role).ok_or_else(|| {
                Failure::Usage(format!(
                    "--role {role:?}: expected scheduler, gateway or node"
                ))
            })?;
            let id =
                Identity::new(role, &name).map_err(|e| Failure::Usage(format!("--name: {e}")))?;
            if hosts.is_empty() && role != Role::Gateway {
                return Err(Failure::Usage(format!(
                    "a {role} is dialed by the other parts: give the --host (DNS name or IP) they reach it at"
                )));
            }
            let ca = Ca::load(&cli.dir).map_err(failed)?;
            let issued = ca
                .issue(&id, &hosts, Validity::days(days))
                .map_err(failed)?;
            let (cert, key) = issued
                .save(out.as_deref().unwrap_or(&cli.dir), &file_base(&id))
                .map_err(failed)?;
            println!("{}\n{}", cert.display(), key.display());
        }
    }
    Ok(())
}
