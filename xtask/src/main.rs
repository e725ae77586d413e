//! Orchestration for tap-probe: machine setup, the test pipeline, the demo and benchmarks.
//! Building is not done here: a plain `cargo build` builds the eBPF object through
//! `tap-probe/build.rs`.

mod bench;
mod cmd;
mod demo;
mod setup;
#[expect(
    unreachable_pub,
    reason = "the test pipeline's stages are its interface; kept as they are for now"
)]
mod test;
#[expect(
    unreachable_pub,
    reason = "the guest machinery's items are its interface for the benchmarks and tests"
)]
mod vm;

use std::process::ExitCode;

use clap::{Parser, Subcommand};

#[derive(Debug, Parser)]
#[command(
    name = "cargo xtask",
    about = "Set up, test, demonstrate and benchmark tap-probe"
)]
struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Install what building and testing need (idempotent; quick when all is present).
    Setup(setup::Args),
    /// Run setup, then fmt, clippy, unit tests and the privileged tests (on the host, then
    /// in a VM).
    Test(test::Args),
    /// Build tap-probe and run `tap-probe demo`.
    Demo(demo::Args),
    /// Run a benchmark and write its results as JSON.
    Bench(bench::Args),
    /// Run the privileged tests in a QEMU guest with Debian 12's cloud kernel (kprobes,
    /// fentry), after `--` arguments for the test binaries.
    Vm(vm::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Setup(args) => setup::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Test(args) => test::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => demo::run(&args),
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Vm(args) => setup::run(&setup::Args {})
            .and_then(|()| vm::run(&args))
            .map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|err| {
        eprintln!("xtask: error: {err:#}");
        ExitCode::FAILURE
    })
}
