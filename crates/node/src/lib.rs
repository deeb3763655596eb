//! placeholder: being written.

/// Command-line / env / TOML configuration for `warren node`.
#[derive(Debug, clap::Parser)]
#[command(name = "warren node")]
pub struct Config {}

/// Runs `warren node` until SIGTERM/Ctrl-C.
pub async fn main(_config: Config) -> anyhow::Result<()> {
    anyhow::bail!("warren node is not implemented yet")
}
