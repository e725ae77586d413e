//! Command-line interface: the top-level command and its dispatch. Each subcommand's
//! arguments live in its own module.

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "tap-probe",
    version,
    about = "Count what happens to packets on the transmit path of tun/tap devices"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    pub(crate) command: Command,
}

#[derive(Debug, Subcommand)]
pub(crate) enum Command {
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

/// The whole program: logging to stderr (`RUST_LOG`, warnings by default), the command
/// line, the subcommand, and an exit code.
#[must_use]
pub fn main() -> std::process::ExitCode {
    env_logger::Builder::from_env(env_logger::Env::default().default_filter_or("warn")).init();
    let cli = <Cli as clap::Parser>::parse();
    match run(cli) {
        Ok(()) => std::process::ExitCode::SUCCESS,
        Err(err) => {
            eprintln!("tap-probe: error: {err:#}");
            std::process::ExitCode::FAILURE
        }
    }
}

/// Runs the chosen subcommand.
///
/// # Errors
/// Whatever the subcommand reports.
fn run(cli: Cli) -> anyhow::Result<()> {
    match cli.command {
        Command::Watch(args) => crate::watch::run(&args),
        Command::Demo(args) => crate::demo::run(&args),
        Command::Doctor(args) => crate::doctor::run(&args),
        Command::Load(args) => crate::load::run(&args),
        Command::Record(args) => crate::record::run(&args),
        Command::Replay(args) => crate::replay_cmd::run(&args),
    }
}
