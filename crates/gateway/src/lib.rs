//! placeholder: being written.

/// Command-line / env / TOML configuration for `warren gateway`.
#[derive(Debug, clap::Parser)]
#[command(name = "warren gateway")]
pub struct Config {}

/// Runs `warren gateway` until SIGTERM/Ctrl-C.
pub async fn main(_config: Config) -> anyhow::Result<()> {
    anyhow::bail!("warren gateway is not implemented yet")
}
