//! placeholder: being written.

/// Command-line / env / TOML configuration for `warren scheduler`.
#[derive(Debug, clap::Parser)]
#[command(name = "warren scheduler")]
pub struct Config {}

/// Runs `warren scheduler` until SIGTERM/Ctrl-C.
pub async fn main(_config: Config) -> anyhow::Result<()> {
    anyhow::bail!("warren scheduler is not implemented yet")
}
