//! Orchestration for tap-probe: machine setup, the test pipeline, the demo and benchmarks.
//! Building is not done here: a plain `cargo build` builds the eBPF object through
//! `tap-probe-observer/build.rs`.

mod bench;
mod cmd;
mod demo;
mod deploy;
mod dist;
mod docs;
mod expected;
mod output;
mod seed_tun;
mod setup;
mod suite;
mod test;
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
    /// Run setup, fmt, one build, clippy, the unit tests, a fuzz smoke run, the privileged
    /// tests on this host and the kernel-dependent ones in three guests; check each kernel
    /// against `xtask/expected.toml`.
    Test(test::Args),
    /// Build tap-probe and run `tap-probe demo`.
    Demo(demo::Args),
    /// Build a static `tap-probe` (musl, the eBPF objects inside) and an archive with the
    /// service unit, the alert rules and the dashboard; prints their paths.
    Dist(dist::Args),
    /// Write the reference pages generated from the source (`docs/counters.md`'s table,
    /// `docs/cli.md`); `--check` fails when a committed one is stale.
    Docs(docs::Args),
    /// Build the tail-drop fix as posted to netdev (v8 4/4 + v9 1/4) as a tun.ko for Debian's
    /// newest 6.12 cloud kernel; prints the module's path last.
    SeedTun(seed_tun::Args),
    /// Run a benchmark and write its results as JSON.
    Bench(bench::Args),
    /// The guest side of a guest benchmark; `cargo xtask bench` runs it in the guest.
    #[command(hide = true)]
    BenchGuest(bench::GuestArgs),
    /// The other traffic of `bench overhead --traffic other`, in the namespace it makes.
    #[command(hide = true)]
    BenchStream(bench::stream::Args),
    /// Run the privileged tests in QEMU guests (kernels with kprobes and the tail-drop
    /// fix), after `--` arguments for the test binaries.
    Vm(vm::Args),
}

fn main() -> ExitCode {
    let result = match Cli::parse().command {
        Command::Setup(args) => setup::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Test(args) => test::run(&args).map(|()| ExitCode::SUCCESS),
        Command::Demo(args) => demo::run(&args),
        Command::Dist(args) => setup::run(&setup::Args {})
            .and_then(|()| dist::run(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Docs(args) => docs::run(&args).map(|()| ExitCode::SUCCESS),
        Command::SeedTun(args) => setup::run(&setup::Args {})
            .and_then(|()| seed_tun::run(&args))
            .map(|()| ExitCode::SUCCESS),
        Command::Bench(args) => bench::run(&args).map(|()| ExitCode::SUCCESS),
        Command::BenchGuest(args) => bench::guest(&args).map(|()| ExitCode::SUCCESS),
        Command::BenchStream(args) => bench::stream::stream(&args).map(|()| ExitCode::SUCCESS),
        Command::Vm(args) => setup::run(&setup::Args {})
            .and_then(|()| vm::run(&args))
            .map(|()| ExitCode::SUCCESS),
    };
    result.unwrap_or_else(|err| {
        eprintln!("xtask: error: {err:#}");
        ExitCode::FAILURE
    })
}
