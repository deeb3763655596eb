//! placeholder: being written.

/// Command-line / env / TOML configuration for `warren envd`.
#[derive(Debug, clap::Parser)]
#[command(name = "warren envd")]
pub struct Config {}

/// Runs `warren envd` until SIGTERM/Ctrl-C.
pub async fn main(_config: Config) -> anyhow::Result<()> {
    anyhow::bail!("warren envd is not implemented yet")
}
