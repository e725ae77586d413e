//! `cargo xtask test`: the whole test pipeline, as CI runs it. Stages run in order and the
//! first failure stops the run.

use std::fmt::Write as _;

use std::time::Duration;

use anyhow::bail;
use tap_probe_guest::{AccelChoice, KernelSpec, Series};

use crate::skips::{self, Skip};
use crate::{cmd, setup, vm};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Skip the privileged tests (those need root: they create network namespaces and
    /// load eBPF programs).
    #[arg(long)]
    no_privileged: bool,
    /// Skip the privileged tests in QEMU guests (`cargo xtask vm`).
    #[arg(long)]
    no_vm: bool,
}

impl Args {
    /// The stages these flags skip, each with the flag that skips it.
    fn skipped(&self) -> Vec<(&'static str, &'static str)> {
        let mut skipped = Vec::new();
        if self.no_privileged {
            skipped.push(("privileged-tests", "--no-privileged"));
        }
        if self.no_vm {
            skipped.push(("vm-fallback", "--no-vm"));
            skipped.push(("vm", "--no-vm"));
        }
        skipped
    }
}

/// Cargo options of every test build: optimised, with the test profile's debug assertions
/// and overflow checks kept. Under emulation unoptimised code made the guest suite four times
/// slower; the unit tests, the privileged tests and the guests' test binaries share this one
/// build.
pub(crate) const TEST_PROFILE: &[&str] = &["--config", "profile.dev.opt-level=2"];

/// One stage of the pipeline. It returns the tests that skipped themselves in it, by
/// where they ran (`host` or a guest's kernel).
struct Stage {
    name: &'static str,
    run: fn() -> anyhow::Result<Skipped>,
}

type Skipped = Vec<(String, Vec<Skip>)>;

/// A stage without tests of its own to skip.
fn none(ran: anyhow::Result<()>) -> anyhow::Result<Skipped> {
    ran.map(|()| Vec::new())
}

/// Runs a `cargo test` command, with each passed test's output shown so that the tests that
/// skipped themselves can be read from it.
fn cargo_test(command: &mut std::process::Command) -> anyhow::Result<Skipped> {
    let lines = cmd::run_collecting(command.arg("--show-output"))?;
    Ok(vec![("host".to_owned(), skips::read(&lines))])
}

const STAGES: &[Stage] = &[
    Stage {
        name: "setup",
        run: || none(setup::run(&setup::Args {})),
    },
    Stage {
        name: "fmt",
        run: || {
            none(cmd::run(
                cmd::cargo().args(["fmt", "--all", "--", "--check"]),
            ))
        },
    },
    Stage {
        name: "clippy",
        run: || {
            none(cmd::run(cmd::cargo().args([
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
            ])))
        },
    },
    Stage {
        // The eBPF crate is excluded above: it only builds for the BPF target, with
        // nightly's build-std.
        name: "clippy-ebpf",
        run: || {
            none(cmd::run(cmd::cargo().args([
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
            ])))
        },
    },
    Stage {
        name: "unit-tests",
        run: || {
            cargo_test(cmd::cargo().arg("test").args(TEST_PROFILE).args([
                "--workspace",
                "--exclude",
                "tap-probe-ebpf",
                "--",
            ]))
        },
    },
    Stage {
        name: "fuzz-smoke",
        run: || none(fuzz_smoke()),
    },
    Stage {
        name: "privileged-tests",
        run: privileged_tests,
    },
    Stage {
        // A guest whose first boot is broken on purpose must come up under TCG: the path
        // every machine where KVM half-works takes, checked on every machine.
        name: "vm-fallback",
        run: || {
            none(vm::check_fallback(&vm::Guest {
                kernel: KernelSpec::Debian(Series::Debian6_1),
                modules: Vec::new(),
                modules_dir: None,
            }))
        },
    },
    Stage {
        // The same tests in guests whose kernels have kprobes and the tail-drop fix (this
        // host's has neither): Debian 12's 6.1, 6.12 with the fix as posted (`cargo xtask
        // seed-tun`) and 7.3 with the fix as merged. Needs no root on the host.
        name: "vm",
        run: || {
            vm::run_tests(
                &vm::matrix()?,
                &vm::Options {
                    accel: AccelChoice::Auto,
                    timeout: Duration::from_mins(20),
                    quiet: false,
                    passthrough: Vec::new(),
                },
            )
        },
    },
];

/// Seconds the trace reader's fuzz target runs in the pipeline.
const FUZZ_SMOKE_SECS: u32 = 20;

/// A short run of the trace reader's fuzz target (`tap-probe/fuzz`): libFuzzer needs
/// nightly and cargo-fuzz, installed here when missing. The committed seeds are a starting
/// corpus; what the run finds stays in the (ignored) `corpus/` directory.
fn fuzz_smoke() -> anyhow::Result<()> {
    if cmd::probe(cmd::cargo().args(["fuzz", "--version"])).is_none() {
        cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = cmd::workspace_root().join("tap-probe/fuzz");
    let corpus = dir.join("corpus/trace_reader");
    std::fs::create_dir_all(&corpus)?;
    cmd::run(
        cmd::cargo()
            .env("AYA_BUILD_SKIP", "1")
            .args(["+nightly", "fuzz", "run", "--fuzz-dir"])
            .arg(&dir)
            .arg("trace_reader")
            .arg(&corpus)
            .arg(dir.join("seeds"))
            .arg("--")
            .arg(format!("-max_total_time={FUZZ_SMOKE_SECS}")),
    )
}

fn privileged_tests() -> anyhow::Result<Skipped> {
    if !cmd::is_root() {
        bail!(
            "the privileged tests create network namespaces and load eBPF programs: run as \
             root, or pass --no-privileged to skip them"
        );
    }
    // One at a time: they share the host's tracepoints and tracefs.
    cargo_test(cmd::cargo().arg("test").args(TEST_PROFILE).args([
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
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let skipped = args.skipped();
    let mut passed = Vec::new();
    let mut tests_skipped = Vec::new();
    for stage in STAGES {
        if skipped.iter().any(|(name, _)| *name == stage.name) {
            continue;
        }
        eprintln!("==> xtask test: {}", stage.name);
        match (stage.run)() {
            Ok(skips) => tests_skipped.extend(
                skips
                    .into_iter()
                    .map(|(place, skips)| (stage.name, place, skips)),
            ),
            Err(err) => {
                eprintln!(
                    "{}",
                    summary(&passed, Some(stage.name), &skipped, &tests_skipped)
                );
                return Err(err.context(format!("stage `{}` failed", stage.name)));
            }
        }
        passed.push(stage.name);
    }
    println!("{}", summary(&passed, None, &skipped, &tests_skipped));
    Ok(())
}

fn summary(
    passed: &[&str],
    failed: Option<&str>,
    skipped: &[(&str, &str)],
    tests_skipped: &[(&str, String, Vec<Skip>)],
) -> String {
    let mut line = format!("xtask test: stages passed: {}", list(passed));
    if let Some(failed) = failed {
        line.push_str("; stage failed: ");
        line.push_str(failed);
    }
    for (name, flag) in skipped {
        let _ = write!(line, "; {name} skipped ({flag})");
    }
    let count: usize = tests_skipped.iter().map(|(_, _, s)| s.len()).sum();
    let _ = write!(
        line,
        "\nxtask test: tests that skipped (part of) themselves: {count}"
    );
    for (stage, place, skips) in tests_skipped {
        for skip in skips {
            let _ = write!(line, "\n  {stage} on {place}: {skip}");
        }
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
