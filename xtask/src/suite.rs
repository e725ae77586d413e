//! The test suite, built once: one `cargo test --no-run` over the workspace with the
//! privileged tests' feature makes every test binary the host stages and the guests run,
//! and clippy checks the same crates with the same profile and features, so no crate is
//! compiled twice for the same purpose.
//!
//! The privileged tests are one binary (the test target that requires the
//! `privileged-tests` feature), a module per subject; the suite takes each subject for a
//! binary of its own, labelled by its module, which is what the summary, the guests' subsets
//! ([`SUBSETS`]), [`HOST_ONLY`] and `xtask/expected.toml` name.
//!
//! Which binaries run where:
//! - on the host, unprivileged: every unit test binary and every test target that needs no
//!   root, all tests in parallel, but the libs' `privileged_tests` modules;
//! - on the host, privileged, one test at a time: the `privileged_tests` of the libs of
//!   [`KERNEL_TEST_LIBS`] and every subject of the privileged tests;
//! - in each guest: only what depends on the kernel: the subjects of the privileged tests
//!   but those of [`HOST_ONLY`], and the `privileged_tests` and `kernel_tests` modules of
//!   the libs of [`KERNEL_TEST_LIBS`] (`kernel_tests` read the running kernel's BTF or
//!   kallsyms, which needs no root).

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};

use tap_probe_verdict::Verdict;

use crate::cmd;
use crate::output::{self, Output};

/// Cargo options of every test build, and of clippy: optimised, with the test profile's
/// debug assertions and overflow checks kept (under emulation unoptimised code made the
/// guest suite four times slower), and debug info reduced to line tables (a failure's
/// backtrace still names files and lines; full debug info took much of the build's time).
pub(crate) const TEST_PROFILE: &[&str] = &[
    "--config",
    "profile.dev.opt-level=2",
    "--config",
    "profile.dev.debug=\"line-tables-only\"",
];

/// What every build of the suite builds: the workspace but the eBPF crate (which builds only
/// for the BPF target, through `tap-probe-observer/build.rs`), with the privileged tests
/// (tap-probe's feature enables the observer's and the lab's own).
pub(crate) const SCOPE: &[&str] = &[
    "--workspace",
    "--exclude",
    "tap-probe-ebpf",
    "--features",
    "tap-probe/privileged-tests",
];

/// The feature the privileged tests' target requires.
const PRIVILEGED_FEATURE: &str = "privileged-tests";

/// Subjects of the privileged tests run on the host only:
/// - `stop` tests how runs end (signals, terminals, pipes, child processes, bad input that
///   ends one before it starts), which is tap-probe's own doing on every kernel, and boots a
///   guest itself, which a guest cannot;
/// - `record_robustness` (a recording's end under a flood it cannot keep up with, a
///   signal, a kill, a full disk) and `watch_tty` (the views on a pseudo-terminal) test
///   tap-probe's own files, signals and drawing too. What they read of the kernel (the
///   events and counters of either backend) the other subjects check exactly in every guest;
///   under emulation the two took some 80 s of each guest's 400;
/// - `fleet` and `service` check the deployment files (the systemd unit's capabilities and
///   system call filter, the alert rules and the dashboard against a Prometheus server)
///   with host tools a guest does not carry (`setpriv`, `strace`, `systemd-analyze`,
///   `prometheus`). What they see of the kernel, the other privileged subjects check in every
///   guest; the static binary's own run in a guest is stage `dist`;
/// - `dense` holds taps by the thousand (ten thousand files) against the probe's tables and
///   memory, which is the same on every kernel; under emulation creating them alone would
///   take minutes. Its exact counts are of a few taps, which the other subjects count in every
///   guest;
/// - `web` tests the metrics endpoint's TLS, basic auth and limits against a Prometheus
///   server and a thousand clients: the HTTP side, tap-probe's own doing on every kernel;
/// - `unsupported` hides the kernel's BTF or its tun/tap symbols from one command in a mount
///   namespace of its own: what a kernel lacking them gets is tap-probe's own doing;
/// - `vm_kernels` boots guests of its own (a kernel package, a kernel build, each from an
///   empty cache), which a guest cannot.
const HOST_ONLY: &[&str] = &[
    "stop",
    "record_robustness",
    "watch_tty",
    "fleet",
    "service",
    "dense",
    "web",
    "unsupported",
    "vm_kernels",
];

/// A guest of the matrix that runs some of the kernel-dependent tests, not all of them: one
/// of the matrix's two middle kernels, each like the kernel at one end of it (which runs
/// them all) but for what `differs`. It runs the tests whose outcome depends on that
/// difference, and those its kernel must make an exact check against every oracle with (see
/// `expected.rs`); the others would show nothing there that the kernel at the end does not
/// show, and the emulated guests are what a test run waits for. `cargo xtask vm --kernel`
/// runs every test on any kernel.
#[derive(Debug)]
pub(crate) struct Subset {
    /// The guest's name in the matrix.
    pub(crate) guest: &'static str,
    /// The guest that runs every test, whose kernel this one's is like.
    pub(crate) like: &'static str,
    /// What this kernel has otherwise than `like`'s.
    pub(crate) differs: &'static str,
    /// The tests it runs: `LABEL` (all of a subject's or a lib's kernel-dependent tests)
    /// or `LABEL::TEST`.
    pub(crate) runs: &'static [&'static str],
}

/// The matrix's guests that run a subset (see [`Subset`]). What neither runs, `churn` (the
/// probe's tables under device churn), most of `watch_cli` (the command line: its errors,
/// capabilities, views and outputs) and `multiqueue`, is tap-probe's own doing but for the
/// backends, which 5.10 (kprobes alone) and 7.3 (both) cover; they took some 4 of each
/// guest's 8 to 13 minutes under emulation here.
pub(crate) const SUBSETS: &[Subset] = &[
    Subset {
        guest: "debian-6.1",
        like: "debian-5.10",
        differs: "a full ring told by its drop reason, the ring sampled (tun's BTF), the \
                  programs' misses counted, and a veth's ring that fills and tail-drops \
                  (threaded NAPI)",
        runs: &[
            "alerts",
            "backpressure",
            "check",
            "exactness",
            "from_birth",
            "live_attach",
            "misses",
            "record_replay",
            "reorder::requeue_reordering_shows_at_the_receiver",
            "reorder::without_a_qdisc_nothing_is_reordered",
            "ring",
            "tap_probe_lab-lib",
            "tap_probe_observer-lib",
            "watch_cli::json_lines_carry_every_field",
            "watch_cli::what_the_kernel_skipped_is_read_for_every_program",
            "watch_cli::without_occupancy_the_ring_is_left_unread_and_the_counts_stay_exact",
        ],
    },
    Subset {
        guest: "debian-6.12+seed-tun",
        like: "debian-7.3",
        differs: "the tail-drop fix as posted: every tap under a qdisc stops its queue, \
                  without IFF_BACKPRESSURE, busy on a lost race, a vhost-net reader that \
                  never wakes it, a ring of size 0 that stalls it",
        runs: &[
            "alerts",
            "check",
            "exactness",
            "from_birth",
            "live_attach",
            "misses",
            "record_replay",
            // The one kind of check against the TCP stack; veth is 7.3's here.
            "reorder::a_fast_peer_reorders_nothing",
            "ring",
            "tap_probe_lab-lib",
            "tap_probe_observer-lib",
            "watch_cli::demo_json_ends_with_the_rows_and_the_load_report",
            "watch_cli::demo_with_backpressure_stops_the_queue_or_refuses",
            "watch_cli::json_lines_carry_every_field",
            "watch_cli::what_the_kernel_skipped_is_read_for_every_program",
        ],
    },
];

impl Subset {
    /// The subset of the matrix's guest called `guest`, if it runs one.
    pub(crate) fn of(guest: &str) -> Option<&'static Self> {
        SUBSETS.iter().find(|subset| subset.guest == guest)
    }

    /// Whether it runs `test` of the binary labelled `label`.
    pub(crate) fn runs(&self, label: &str, test: &str) -> bool {
        self.runs.iter().any(|run| match run.split_once("::") {
            Some((target, name)) => target == label && name == test,
            None => *run == label,
        })
    }
}

/// The libraries whose unit tests hold `privileged_tests` and `kernel_tests` modules, by
/// target name: cargo names a lib target after its crate, with underscores (the label of
/// its unit tests is then `tap_probe_observer-lib`).
const KERNEL_TEST_LIBS: &[&str] = &["tap_probe_observer", "tap_probe_lab"];

/// Unit test modules whose tests need root (and, so, the kernel).
pub(crate) const PRIVILEGED_MODULES: &str = "privileged_tests::";
/// Unit test modules whose tests read the running kernel without needing root.
pub(crate) const KERNEL_MODULES: &str = "kernel_tests::";

/// Where a test binary runs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Kind {
    /// A package's unit tests: its lib or its bin.
    Unit,
    /// A test target that needs no root.
    Plain,
    /// A subject of the privileged tests: needs root, real devices and the kernel's
    /// programs.
    Privileged,
}

/// One test executable, or one subject of the privileged tests' binary.
#[derive(Clone, Debug)]
pub(crate) struct Binary {
    /// How the summary names it: a test target by its name, unit tests as `PACKAGE-lib` or
    /// `PACKAGE-bin`, a subject of the privileged tests by its module (`exactness`).
    pub(crate) label: String,
    pub(crate) path: PathBuf,
    /// Its package's directory, where cargo runs tests from.
    pub(crate) dir: PathBuf,
    pub(crate) kind: Kind,
    /// For a subject of the privileged tests' binary, its module: its tests are those whose
    /// path starts with it, and they are named without it.
    pub(crate) module: Option<String>,
}

impl Binary {
    /// The name `--exact` takes for its test `test`.
    pub(crate) fn exact(&self, test: &str) -> String {
        match &self.module {
            Some(module) => format!("{module}::{test}"),
            None => test.to_owned(),
        }
    }

    /// Whether its tests depend on the running kernel, as a whole (subjects of the
    /// privileged tests but those of [`HOST_ONLY`]) or in part (the libs of [`KERNEL_TEST_LIBS`]).
    pub(crate) fn for_guests(&self) -> bool {
        (self.kind == Kind::Privileged && !HOST_ONLY.contains(&self.label.as_str()))
            || (self.kind == Kind::Unit
                && KERNEL_TEST_LIBS
                    .iter()
                    .any(|&lib| self.label.strip_suffix("-lib") == Some(lib)))
    }
}

/// The built suite.
#[derive(Debug)]
pub(crate) struct Suite {
    /// In a fixed order: by label.
    pub(crate) binaries: Vec<Binary>,
    /// The tap-probe binary the integration tests run (`CARGO_BIN_EXE_tap-probe`).
    pub(crate) tap_probe: PathBuf,
}

/// Builds every test binary of the suite.
///
/// # Errors
/// If the build fails or makes no test binary.
pub(crate) fn build() -> anyhow::Result<Suite> {
    let artifacts = cmd::cargo_artifacts(
        cmd::cargo()
            .arg("test")
            .args(TEST_PROFILE)
            .args(SCOPE)
            .arg("--no-run"),
    )?;
    let mut binaries = Vec::new();
    for artifact in &artifacts {
        let Some(path) = artifact.executable.clone() else {
            continue;
        };
        if !artifact.profile.test {
            continue;
        }
        let target = &artifact.target;
        let (label, kind) = if target.is_kind(cargo_metadata::TargetKind::Test) {
            let privileged = target
                .required_features
                .iter()
                .any(|f| f == PRIVILEGED_FEATURE);
            (
                target.name.clone(),
                if privileged {
                    Kind::Privileged
                } else {
                    Kind::Plain
                },
            )
        } else if target.is_kind(cargo_metadata::TargetKind::Bin) {
            (format!("{}-bin", target.name), Kind::Unit)
        } else {
            (format!("{}-lib", target.name), Kind::Unit)
        };
        let dir = artifact
            .manifest_path
            .parent()
            .context("a manifest path without a directory")?
            .as_std_path()
            .to_path_buf();
        let binary = Binary {
            label,
            path: path.into_std_path_buf(),
            dir,
            kind,
            module: None,
        };
        if kind == Kind::Privileged {
            binaries.extend(subjects(&binary)?);
        } else {
            binaries.push(binary);
        }
    }
    binaries.sort_by(|a, b| a.label.cmp(&b.label));
    binaries.dedup_by(|a, b| a.label == b.label);
    if binaries.is_empty() {
        bail!("cargo test --no-run built no test executables");
    }
    check_names(&binaries)?;
    let tap_probe = artifacts
        .iter()
        .filter(|artifact| !artifact.profile.test && artifact.target.name == "tap-probe")
        .find_map(|artifact| artifact.executable.clone())
        .context("cargo test built no tap-probe binary")?
        .into_std_path_buf();
    Ok(Suite {
        binaries,
        tap_probe,
    })
}

/// The subjects of a privileged test binary: one per module its tests are in, labelled by
/// it, so that where a subject runs and what it is expected to show is keyed by its module
/// (aya's integration tests are one binary, a module per subject, too).
fn subjects(binary: &Binary) -> anyhow::Result<Vec<Binary>> {
    let mut modules: Vec<String> = list(binary, &[])?
        .iter()
        .map(|test| match test.split_once("::") {
            Some((module, _)) => Ok(module.to_owned()),
            None => Err(anyhow::anyhow!(
                "{}: test `{test}` is in no module: each subject of the privileged tests is a \
                 module",
                binary.label
            )),
        })
        .collect::<anyhow::Result<_>>()?;
    modules.sort();
    modules.dedup();
    Ok(modules
        .into_iter()
        .map(|module| Binary {
            label: module.clone(),
            module: Some(module),
            ..binary.clone()
        })
        .collect())
}

/// Every subject [`HOST_ONLY`] and [`SUBSETS`] name is one the build made, and every test a
/// subset names is one of its subject's: a module or a test renamed fails the build's
/// stage, not a guest's run, which would miss it without a word.
fn check_names(binaries: &[Binary]) -> anyhow::Result<()> {
    let find = |label: &str| binaries.iter().find(|binary| binary.label == label);
    for &label in HOST_ONLY {
        if find(label).is_none_or(|binary| binary.kind != Kind::Privileged) {
            bail!(
                "suite.rs: HOST_ONLY names `{label}`, which is no subject of the privileged tests"
            );
        }
    }
    for subset in SUBSETS {
        for run in subset.runs {
            let (label, test) = run
                .split_once("::")
                .map_or((*run, None), |(l, t)| (l, Some(t)));
            let Some(binary) = find(label) else {
                bail!(
                    "suite.rs: {}'s subset names `{label}`, which the build did not make",
                    subset.guest
                );
            };
            if let Some(test) = test
                && !list(binary, &[])?.iter().any(|listed| listed == test)
            {
                bail!(
                    "suite.rs: {}'s subset names `{run}`, which is no test",
                    subset.guest
                );
            }
        }
    }
    Ok(())
}

/// What one binary's run took and said.
#[derive(Debug)]
pub(crate) struct Ran {
    pub(crate) label: String,
    pub(crate) took: Duration,
    /// How many tests it ran.
    pub(crate) tests: usize,
    pub(crate) said: Output,
}

/// Runs the tests of `binary` that `args` select in one process, in parallel as libtest
/// runs them, from its package's directory as cargo would: for the unit tests, which say
/// nothing the summary keeps. They passed when it exits 0; its output was echoed as it
/// came, for a reader, and nothing of it is read.
///
/// # Errors
/// If it cannot be run or a test fails.
pub(crate) fn run_all(binary: &Binary, args: &[&str]) -> anyhow::Result<Ran> {
    let owned: Vec<String> = args.iter().map(|&arg| arg.to_owned()).collect();
    let tests = list(binary, &owned)?.len();
    let started = Instant::now();
    let mut command = command(binary);
    command.args(args);
    eprintln!("==> {} ({})", binary.label, short(&binary.path));
    let status = cmd::status(&mut command)?;
    if !status.success() {
        bail!("`{}` failed ({status})", cmd::display(&command));
    }
    Ok(Ran {
        label: binary.label.clone(),
        took: started.elapsed(),
        tests,
        said: Output::default(),
    })
}

/// Runs each of `tests` of `binary` as a process of its own, one after another (the
/// privileged tests share the host's tracepoints): everything a test prints is its own,
/// and how its process ends is its [`Verdict`], with its times since `since`. Fails, once
/// all have run, if one did not pass, naming each and where it panicked.
///
/// # Errors
/// If a test cannot be run or one fails.
pub(crate) fn run_each(binary: &Binary, tests: &[String], since: Instant) -> anyhow::Result<Ran> {
    use std::os::unix::process::ExitStatusExt as _;
    let started = Instant::now();
    eprintln!(
        "==> {} ({}, {} tests)",
        binary.label,
        short(&binary.path),
        tests.len()
    );
    let mut said = Output::default();
    let mut verdicts = Vec::new();
    for test in tests {
        let mut command = command(binary);
        command
            .args(["--exact", &binary.exact(test)])
            .args(["--test-threads=1", "--show-output"]);
        let started_s = since.elapsed().as_secs_f64();
        let (lines, status) = cmd::run_collecting(&mut command)?;
        said.extend(output::read(&format!("{}::{test}", binary.label), &lines));
        verdicts.push(Verdict {
            binary: binary.label.clone(),
            test: test.clone(),
            exit: status
                .code()
                .or_else(|| status.signal().map(|signal| 128 + signal))
                .unwrap_or(-1),
            timed_out: false,
            started_s,
            ended_s: since.elapsed().as_secs_f64(),
        });
    }
    let failed: Vec<String> = verdicts
        .iter()
        .filter(|v| !v.passed())
        .map(|v| format!("{}::{} exited {}", v.binary, v.test, v.exit))
        .collect();
    if !failed.is_empty() {
        let mut why = failed;
        why.extend((!said.panics.is_empty()).then(|| said.failures()));
        bail!("{}", why.join("; "));
    }
    Ok(Ran {
        label: binary.label.clone(),
        took: started.elapsed(),
        tests: tests.len(),
        said,
    })
}

/// `binary` as cargo runs it: from its package's directory.
fn command(binary: &Binary) -> Command {
    let mut command = Command::new(&binary.path);
    command
        .current_dir(&binary.dir)
        .env("CARGO_MANIFEST_DIR", &binary.dir);
    command
}

/// Per binary, in the order they ran, how many of its tests passed and failed and how long
/// they took: a line each for a summary.
pub(crate) fn binary_lines(verdicts: &[Verdict]) -> String {
    let mut out = String::new();
    let mut rest = verdicts;
    while let Some(first) = rest.first() {
        let n = rest.iter().take_while(|v| v.binary == first.binary).count();
        let (these, after) = rest.split_at(n);
        let passed = these.iter().filter(|v| v.passed()).count();
        let secs: f64 = these.iter().map(Verdict::secs).sum();
        let _ = write!(out, "\n  {}: {passed} passed", first.binary);
        if passed < n {
            let _ = write!(out, ", {} failed", n - passed);
        }
        let _ = write!(out, " ({secs:.1} s)");
        rest = after;
    }
    out
}

fn short(path: &Path) -> String {
    path.file_name().map_or_else(
        || path.display().to_string(),
        |n| n.to_string_lossy().into_owned(),
    )
}

/// The tests of `binary` that `args` (a filter, `--skip`, `--exact`, as libtest takes them,
/// on the whole path) select, as `binary --list` names them (a subject's without its
/// module).
///
/// # Errors
/// If the binary cannot list its tests.
pub(crate) fn list(binary: &Binary, args: &[String]) -> anyhow::Result<Vec<String>> {
    let out = cmd::new(&binary.path)
        .args(["--list", "--format", "terse"])
        .args(args)
        .output()
        .with_context(|| format!("listing the tests of {}", binary.path.display()))?;
    if !out.status.success() {
        bail!(
            "{} --list failed: {}",
            binary.path.display(),
            String::from_utf8_lossy(&out.stderr)
        );
    }
    let listed = String::from_utf8_lossy(&out.stdout);
    let tests = listed
        .lines()
        .filter_map(|line| line.strip_suffix(": test"));
    Ok(match &binary.module {
        Some(module) => tests
            .filter_map(|test| test.strip_prefix(module.as_str())?.strip_prefix("::"))
            .map(str::to_owned)
            .collect(),
        None => tests.map(str::to_owned).collect(),
    })
}

/// The tests of `binary` a guest runs, of those `args` select: all of a subject of the
/// privileged tests; of a lib, those in `privileged_tests` and `kernel_tests` modules.
///
/// # Errors
/// If the binary cannot list its tests.
pub(crate) fn for_guests(binary: &Binary, args: &[String]) -> anyhow::Result<Vec<String>> {
    let tests = list(binary, args)?;
    Ok(match binary.kind {
        Kind::Privileged => tests,
        Kind::Unit | Kind::Plain => tests
            .into_iter()
            .filter(|t| t.contains(PRIVILEGED_MODULES) || t.contains(KERNEL_MODULES))
            .collect(),
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    fn unit(label: &str) -> Binary {
        Binary {
            label: label.to_owned(),
            path: PathBuf::new(),
            dir: PathBuf::new(),
            kind: Kind::Unit,
            module: None,
        }
    }

    /// A subset names subjects whole or tests of them; other guests run everything.
    #[test]
    fn a_subset_runs_what_it_names() {
        let subset = Subset::of("debian-6.1").expect("6.1 runs a subset");
        assert!(subset.runs("exactness", "tap_noqueue_counters_match_kernel"));
        assert!(!subset.runs(
            "churn",
            "watch_survives_churn_beyond_its_tables_and_stays_exact"
        ));
        assert!(subset.runs("watch_cli", "json_lines_carry_every_field"));
        assert!(!subset.runs("watch_cli", "unmatched_glob_is_an_error_that_lists_devices"));
        assert!(Subset::of("debian-5.10").is_none());
        for subset in SUBSETS {
            assert_ne!(subset.guest, subset.like);
            assert!(
                Subset::of(subset.like).is_none(),
                "{} runs all",
                subset.like
            );
        }
    }

    /// The unit tests of the libs that hold kernel-dependent modules run in the guests, as
    /// cargo labels them; other unit tests do not.
    #[test]
    fn the_libs_with_kernel_tests_run_in_guests() {
        assert!(unit("tap_probe_observer-lib").for_guests());
        assert!(unit("tap_probe_lab-lib").for_guests());
        assert!(!unit("tap_probe_replay-lib").for_guests());
        assert!(!unit("tap-probe-bin").for_guests());
    }
}
