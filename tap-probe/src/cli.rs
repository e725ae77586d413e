//! Command-line interface: the top-level command and its dispatch. Each subcommand's
//! arguments live in its own module.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tap-probe",
    version,
    about = "Count what happens to packets on the transmit path of tun/tap devices"
)]
pub struct Cli {
    #[command(subcommand)]
    pub command: Command,
}

#[derive(Debug, Subcommand)]
pub enum Command {
    /// Attach to the running host and show per-device, per-queue transmit counters.
    Watch(crate::watch::Args),
    /// Run a self-contained demonstration in a private network namespace.
    Demo(crate::demo::Args),
    /// Report what this kernel allows and which probe backend would be used.
    Doctor(crate::doctor::Args),
    /// Drive bounded traffic through a fresh tap in a private namespace and report rates.
    Load(crate::load::Args),
    /// Record per-packet transmit events of tun/tap devices to a trace file.
    Record(crate::record::Args),
    /// Replay a trace (or a synthetic workload) under each queue policy: what would the
    /// patched kernel have done?
    Replay(crate::replay_cmd::Args),
}

/// Runs the chosen subcommand.
///
/// # Errors
/// Whatever the subcommand reports.
pub fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Watch(args) => crate::watch::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
        Command::Doctor(args) => crate::doctor::run(&args),
        Command::Load(args) => crate::load::run(&args),
        Command::Record(args) => crate::record::run(&args),
        Command::Replay(args) => crate::replay_cmd::run(&args),
    }
}
