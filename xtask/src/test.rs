//! `cargo xtask test`: the whole test pipeline, as CI runs it. Stages run in order and the
//! first failure stops the run.

use anyhow::bail;

use crate::{cmd, setup};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Skip the privileged tests (those need root: they create network namespaces and
    /// load eBPF programs).
    #[arg(long)]
    no_privileged: bool,
}

/// One stage of the pipeline.
struct Stage {
    name: &'static str,
    run: fn() -> anyhow::Result<()>,
}

const STAGES: &[Stage] = &[
    Stage {
        name: "setup",
        run: || setup::run(&setup::Args {}),
    },
    Stage {
        name: "fmt",
        run: || cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"])),
    },
    Stage {
        name: "clippy",
        run: || {
            cmd::run(cmd::cargo().args([
                "clippy",
                "--workspace",
                "--exclude",
                "tap-probe-ebpf",
                "--all-targets",
                "--features",
                "tap-probe/privileged-tests",
                "--",
                "-D",
                "warnings",
            ]))
        },
    },
    Stage {
        // The eBPF crate is excluded above: it only builds for the BPF target, with
        // nightly's build-std.
        name: "clippy-ebpf",
        run: || {
            cmd::run(cmd::cargo().args([
                "+nightly",
                "clippy",
                "-p",
                "tap-probe-ebpf",
                "--target",
                "bpfel-unknown-none",
                "-Z",
                "build-std=core",
                "--release",
                "--",
                "-D",
                "warnings",
            ]))
        },
    },
    Stage {
        name: "unit-tests",
        run: || cmd::run(cmd::cargo().args(["test", "--workspace", "--exclude", "tap-probe-ebpf"])),
    },
    Stage {
        name: "privileged-tests",
        run: privileged_tests,
    },
];

fn privileged_tests() -> anyhow::Result<()> {
    if !cmd::is_root() {
        bail!(
            "the privileged tests create network namespaces and load eBPF programs: run as \
             root, or pass --no-privileged to skip them"
        );
    }
    // One at a time: they share the host's tracepoints and tracefs.
    cmd::run(cmd::cargo().args([
        "test",
        "-p",
        "tap-probe",
        "--features",
        "privileged-tests",
        "--",
        "--test-threads=1",
    ]))
}

/// Runs `cargo xtask test`.
///
/// # Errors
/// The first stage that fails.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let mut passed = Vec::new();
    for stage in STAGES {
        if args.no_privileged && stage.name == "privileged-tests" {
            continue;
        }
        eprintln!("==> xtask test: {}", stage.name);
        if let Err(err) = (stage.run)() {
            eprintln!("{}", summary(&passed, Some(stage.name), args.no_privileged));
            return Err(err.context(format!("stage `{}` failed", stage.name)));
        }
        passed.push(stage.name);
    }
    println!("{}", summary(&passed, None, args.no_privileged));
    Ok(())
}

fn summary(passed: &[&str], failed: Option<&str>, no_privileged: bool) -> String {
    let mut line = format!("xtask test: stages passed: {}", list(passed));
    if let Some(failed) = failed {
        line.push_str("; stage failed: ");
        line.push_str(failed);
    }
    if no_privileged {
        line.push_str("; privileged-tests skipped (--no-privileged)");
    }
    line
}

fn list(names: &[&str]) -> String {
    if names.is_empty() {
        "none".to_owned()
    } else {
        names.join(", ")
    }
}
