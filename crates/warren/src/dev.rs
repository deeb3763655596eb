//! `warren dev`: placeholder, being written.

/// Flags for `warren dev`.
#[derive(Debug, clap::Parser)]
#[command(name = "warren dev")]
pub struct Config {}

pub async fn main(_config: Config) -> anyhow::Result<()> {
    anyhow::bail!("warren dev is not implemented yet")
}
