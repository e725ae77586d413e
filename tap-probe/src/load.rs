//! `tap-probe load` (stub, being written).

#[derive(Debug, clap::Args)]
pub struct Args {}

/// Runs `tap-probe load`.
///
/// # Errors
/// Not yet implemented.
pub fn run(_args: &Args) -> anyhow::Result<()> {
    anyhow::bail!("not yet implemented")
}
