//! `cargo xtask test`: the whole test pipeline, as CI runs it. Stages run in order and the
//! first failure stops the run; the summary at the end gives each stage's time, and per
//! kernel (the host, each guest) the tests that skipped themselves or ran again and the
//! checks they made against which oracle. The run fails where a kernel did otherwise than
//! `xtask/expected.toml` says.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::sync::mpsc;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_guest::{AccelChoice, KernelSpec, Series};

use crate::expected::{self, Expected};
use crate::output::Output;
use crate::suite::{self, Kind, Suite};
use crate::vm::{self, GuestRun};
use crate::{cmd, deploy, dist, docs, setup};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Skip the privileged tests (those need root: they create network namespaces and
    /// load eBPF programs).
    #[arg(long)]
    no_privileged: bool,
    /// Skip the privileged tests in QEMU guests (`cargo xtask vm`) and the static binary's
    /// run in a guest (`cargo xtask dist --check`).
    #[arg(long)]
    no_vm: bool,
}

/// What the host's test stages found, for the summary.
#[derive(Default)]
struct Host {
    /// What the tests said on this host.
    said: Output,
    /// Per host test binary: its label, how many of its tests passed and how long they ran.
    results: Vec<String>,
    /// Where stage `dist-build` hands the static binary to the guests' stage `dist`.
    static_binary: Option<mpsc::Sender<PathBuf>>,
}

/// One stage of the pipeline.
struct Stage<T> {
    name: &'static str,
    /// The flag that skips it, if one does.
    skipped_by: Option<fn(&Args) -> Option<&'static str>>,
    run: fn(&Suite, &mut T) -> anyhow::Result<()>,
}

/// How long each stage took, or why it did not run.
type Times = Vec<(&'static str, String)>;

/// Runs `stages` in order until one fails.
fn run_stages<T>(
    stages: &[Stage<T>],
    args: &Args,
    suite: &Suite,
    state: &mut T,
    times: &mut Times,
) -> anyhow::Result<()> {
    for stage in stages {
        if let Some(flag) = stage.skipped_by.and_then(|by| by(args)) {
            times.push((stage.name, format!("skipped ({flag})")));
            continue;
        }
        eprintln!("==> xtask test: {}", stage.name);
        let step = Instant::now();
        let ran = (stage.run)(suite, state);
        times.push((stage.name, secs(step.elapsed())));
        ran.map_err(|err| err.context(format!("stage `{}` failed", stage.name)))?;
    }
    Ok(())
}

/// Before anything else: the machine, the formatting.
fn prepare() -> anyhow::Result<()> {
    setup::run(&setup::Args {})?;
    cmd::run(cmd::cargo().args(["fmt", "--all", "--", "--check"]))
}

/// The host's stages, run beside the guests once the build is there.
const HOST_STAGES: &[Stage<Host>] = &[
    Stage {
        // The generated reference pages (`cargo xtask docs`) match the source.
        name: "docs",
        skipped_by: None,
        run: |suite, _| docs::check(&suite.tap_probe),
    },
    Stage {
        // Before the lints: their build script runs (without eBPF objects) would make the
        // doc tests' build compile the observer and what uses it again.
        name: "unit-tests",
        skipped_by: None,
        run: unit_tests,
    },
    Stage {
        // Same profile and features as the build, so the dependencies' build scripts and
        // proc macros it compiled serve here too; linting needs no eBPF objects, and
        // building them again for clippy's own build script run would take longer than
        // all the rest.
        name: "clippy",
        skipped_by: None,
        run: |_, _| {
            cmd::run(
                cmd::cargo()
                    .env("AYA_BUILD_SKIP", "1")
                    .arg("clippy")
                    .args(suite::TEST_PROFILE)
                    .args(suite::SCOPE)
                    .args(["--all-targets", "--", "-D", "warnings"]),
            )
        },
    },
    Stage {
        // The API documentation: every link in it resolves, to private items too (the
        // crates are read as source more than as a published API).
        name: "rustdoc",
        skipped_by: None,
        run: |_, _| {
            cmd::run(
                cmd::cargo()
                    .env("AYA_BUILD_SKIP", "1")
                    .env(
                        "RUSTDOCFLAGS",
                        "-D warnings --document-private-items -A rustdoc::private_intra_doc_links",
                    )
                    .arg("doc")
                    .args(suite::TEST_PROFILE)
                    .args(suite::SCOPE)
                    .arg("--no-deps"),
            )
        },
    },
    Stage {
        // The eBPF crate is excluded above: it only builds for the BPF target, with
        // nightly's build-std.
        name: "clippy-ebpf",
        skipped_by: None,
        run: |_, _| {
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
        name: "fuzz-smoke",
        skipped_by: None,
        run: |_, _| fuzz_smoke(),
    },
    Stage {
        // The alert rules' unit tests (promtool) and the systemd unit's syntax.
        name: "deploy-files",
        skipped_by: None,
        run: |_, _| deploy::check(),
    },
    Stage {
        name: "privileged-tests",
        skipped_by: Some(|args| args.no_privileged.then_some("--no-privileged")),
        run: privileged_tests,
    },
    Stage {
        // The static binary for the guests' stage `dist`: a whole release build for musl,
        // here rather than in the guests' lane, whose stages are the run's longest.
        name: "dist-build",
        skipped_by: Some(|args| args.no_vm.then_some("--no-vm")),
        run: |_, host| {
            let binary = dist::build_stage()?;
            if let Some(to_guests) = host.static_binary.take() {
                // The guests' lane may have ended already (a guest failed): nothing waits.
                let _ = to_guests.send(binary);
            }
            Ok(())
        },
    },
];

/// The guests' stages: they need the build and no root.
struct Guests<'a> {
    slots: &'a vm::Slots,
    runs: Vec<GuestRun>,
    /// The static binary, from the host's stage `dist-build`.
    static_binary: Option<mpsc::Receiver<PathBuf>>,
    /// How long the static binary's guest took, beside the others.
    dist_time: Option<Duration>,
}

/// The guests' stages (a function: they borrow the run's slots).
fn guest_stages<'a>() -> [Stage<Guests<'a>>; 2] {
    [
        Stage {
            // A guest whose first boot is broken on purpose must come up under TCG: the path
            // every machine where KVM half-works takes, checked on every machine.
            name: "vm-fallback",
            skipped_by: Some(|args| args.no_vm.then_some("--no-vm")),
            run: |_, _| {
                vm::check_fallback(&vm::Guest {
                    name: "fallback".to_owned(),
                    kernel: KernelSpec::Debian(Series::Debian6_1),
                    modules: Vec::new(),
                    modules_dir: None,
                    subset: None,
                })
            },
        },
        Stage {
            // The kernel-dependent tests in guests whose kernels have kprobes, the tail-drop
            // fix, or lack what newer ones have (this host's has the first two missing):
            // Debian 11's 5.10, Debian 12's 6.1, 6.12 with the fix as posted (`cargo xtask
            // seed-tun`) and 7.3 with the fix as merged. Beside them, in a slot of their
            // own once one is free, the static binary alone in a guest on Debian 12's own
            // kernel (`dist`): a short guest that fills a CPU the last long one leaves idle.
            name: "vm",
            skipped_by: Some(|args| args.no_vm.then_some("--no-vm")),
            run: |suite, guests| {
                let binary = guests
                    .static_binary
                    .take()
                    .context("the static binary was asked for twice")?;
                let dist = move || {
                    let binary = binary
                        .recv()
                        .context("no static binary: the host's lane ended before `dist-build`")?;
                    let started = Instant::now();
                    dist::check_stage(&binary)
                        .context("the static binary's guest (`dist`) failed")?;
                    Ok(started.elapsed())
                };
                let (runs, ran) = vm::run_tests(
                    suite,
                    &vm::matrix()?,
                    &vm::Options {
                        accel: AccelChoice::Auto,
                        timeout: Duration::from_mins(20),
                        quiet: true,
                        slots: guests.slots,
                        passthrough: Vec::new(),
                        last: Some(std::sync::Mutex::new(Some(Box::new(dist)))),
                    },
                );
                guests.runs = runs.guests;
                guests.dist_time = runs.last;
                ran
            },
        },
    ]
}

/// The fuzz targets (`tap-probe/fuzz`) and the seconds each runs in the pipeline: 20 in
/// all, most for the trace reader, whose input is the largest, then check's spec, whose
/// TOML holds the expressions the third target fuzzes alone, then the baseline.
const FUZZ_SMOKE: [(&str, u32); 4] = [
    ("trace_reader", 8),
    ("check_spec", 6),
    ("check_expression", 3),
    ("check_baseline", 3),
];

/// Every unit test and every test that needs no root, all tests of a binary in parallel;
/// the libs' privileged ones wait for their stage. Then the doc tests, which only cargo
/// builds.
fn unit_tests(suite: &Suite, host: &mut Host) -> anyhow::Result<()> {
    let mut ran = Vec::new();
    for binary in &suite.binaries {
        match binary.kind {
            Kind::Privileged => {}
            Kind::Plain => ran.push(suite::run_all(binary, &[])?),
            Kind::Unit => ran.push(suite::run_all(
                binary,
                &["--skip", suite::PRIVILEGED_MODULES],
            )?),
        }
    }
    cmd::run(
        cmd::cargo()
            .arg("test")
            .args(suite::TEST_PROFILE)
            .args(suite::SCOPE)
            .arg("--doc"),
    )?;
    record(host, ran);
    Ok(())
}

/// The privileged tests on this host, one at a time: they share the host's tracepoints
/// and tracefs.
fn privileged_tests(suite: &Suite, host: &mut Host) -> anyhow::Result<()> {
    if !cmd::is_root() {
        bail!(
            "the privileged tests create network namespaces and load eBPF programs: run as \
             root, or pass --no-privileged to skip them"
        );
    }
    let mut ran = Vec::new();
    let since = std::time::Instant::now();
    for binary in &suite.binaries {
        let filter = match binary.kind {
            Kind::Privileged => Vec::new(),
            Kind::Unit if binary.for_guests() => vec![suite::PRIVILEGED_MODULES.to_owned()],
            Kind::Unit | Kind::Plain => continue,
        };
        let tests = suite::list(binary, &filter)?;
        ran.push(suite::run_each(binary, &tests, since)?);
    }
    record(host, ran);
    Ok(())
}

fn record(host: &mut Host, ran: Vec<suite::Ran>) {
    for binary in ran {
        host.results.push(format!(
            "{}: {} passed ({:.1} s)",
            binary.label,
            binary.tests,
            binary.took.as_secs_f64()
        ));
        host.said.extend(binary.said);
    }
}

/// A short run of each fuzz target (`tap-probe/fuzz`, [`FUZZ_SMOKE`]): libFuzzer needs
/// nightly and cargo-fuzz, installed here when missing. The committed seeds (the docs'
/// examples, and every input that once failed) start each target's corpus; what the run
/// finds stays in the (ignored) `corpus/` directory.
fn fuzz_smoke() -> anyhow::Result<()> {
    if cmd::probe(cmd::cargo().args(["fuzz", "--version"])).is_none() {
        cmd::run(cmd::cargo().args(["install", "cargo-fuzz", "--locked"]))?;
    }
    let dir = cmd::workspace_root().join("tap-probe/fuzz");
    // One build of every target, which shares the compiling of what they have in common.
    cmd::run(
        cmd::cargo()
            .args(["+nightly", "fuzz", "build", "--fuzz-dir"])
            .arg(&dir),
    )?;
    for (target, secs) in FUZZ_SMOKE {
        let corpus = dir.join("corpus").join(target);
        std::fs::create_dir_all(&corpus)?;
        cmd::run(
            cmd::cargo()
                .args(["+nightly", "fuzz", "run", "--fuzz-dir"])
                .arg(&dir)
                .arg(target)
                .arg(&corpus)
                .arg(dir.join("seeds").join(target))
                .arg("--")
                .arg(format!("-max_total_time={secs}")),
        )?;
    }
    Ok(())
}

/// Runs `cargo xtask test`.
///
/// # Errors
/// The first stage that fails, or a kernel that did otherwise than expected.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut times: Times = Vec::new();
    let step = Instant::now();
    eprintln!("==> xtask test: setup, fmt");
    prepare()?;
    times.push(("setup+fmt", secs(step.elapsed())));
    eprintln!("==> xtask test: build");
    let step = Instant::now();
    let suite = suite::build().context("stage `build` failed")?;
    times.push(("build", secs(step.elapsed())));

    // The guests start as soon as the build is there, one at a time while the host's
    // stages run (a guest's emulation takes one CPU whole, and the privileged tests time
    // traffic on the host), then as many as there are CPUs.
    let slots = vm::Slots::new(1);
    let (to_guests, static_binary) = mpsc::channel();
    let mut host = Host {
        static_binary: Some(to_guests),
        ..Host::default()
    };
    let mut guests = Guests {
        slots: &slots,
        runs: Vec::new(),
        static_binary: Some(static_binary),
        dist_time: None,
    };
    let mut host_times = Times::new();
    let mut guest_times = Times::new();
    let (host_ran, guests_ran) = std::thread::scope(|scope| {
        let guest_lane = scope.spawn(|| {
            let lane = Instant::now();
            let ran = run_stages(&guest_stages(), args, &suite, &mut guests, &mut guest_times);
            guest_times.push(("guests (in all)", secs(lane.elapsed())));
            ran
        });
        let lane = Instant::now();
        let host_ran = run_stages(HOST_STAGES, args, &suite, &mut host, &mut host_times);
        host_times.push(("host (in all)", secs(lane.elapsed())));
        // A lane that failed before `dist-build` sent nothing: the guests' `dist` then
        // hears so instead of waiting.
        host.static_binary = None;
        if host_ran.is_err() {
            slots.close();
        } else {
            slots.allow(vm::Slots::cpus());
        }
        let guests_ran = guest_lane.join().expect("the guests' lane panicked");
        (host_ran, guests_ran)
    });
    times.extend(host_times);
    times.extend(guest_times);
    if let Some(took) = guests.dist_time {
        times.push(("dist (beside the guests)", secs(took)));
    }
    let report = Report {
        host: &host,
        guests: &guests.runs,
        times: &times,
        took: started.elapsed(),
    };
    if let Err(err) = host_ran.and(guests_ran) {
        eprintln!("{}", report.summary(&[]));
        return Err(err);
    }
    let problems = check_expectations(args, &host, &guests.runs)?;
    println!("{}", report.summary(&problems));
    if !problems.is_empty() {
        bail!(
            "{} thing(s) not as {} expects (see above)",
            problems.len(),
            expected::FILE
        );
    }
    Ok(())
}

/// What each kernel did otherwise than expected: the host (where its privileged tests ran:
/// its unit tests alone show nothing of the kernel) and every guest.
fn check_expectations(
    args: &Args,
    host: &Host,
    guests: &[GuestRun],
) -> anyhow::Result<Vec<String>> {
    let expected = Expected::load()?;
    let mut problems = Vec::new();
    if !args.no_privileged {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease")?;
        let kernel = expected.of(expected::HOST, release.trim())?;
        for problem in kernel.problems(&host.said) {
            problems.push(format!("host: {problem}"));
        }
    }
    for guest in guests {
        let kernel = expected.of(&guest.name, &guest.release)?;
        for problem in kernel.problems(&guest.said) {
            problems.push(format!("{}: {problem}", guest.name));
        }
    }
    Ok(problems)
}

fn secs(took: Duration) -> String {
    format!("{:.0} s", took.as_secs_f64())
}

/// What the summary at the end is made of.
struct Report<'a> {
    host: &'a Host,
    guests: &'a [GuestRun],
    times: &'a Times,
    took: Duration,
}

impl Report<'_> {
    fn summary(&self, problems: &[String]) -> String {
        let mut out = String::from("xtask test: host test binaries:");
        for line in &self.host.results {
            let _ = write!(out, "\n  {line}");
        }
        let _ = write!(out, "\nxtask test: on the host:");
        for skip in &self.host.said.skips {
            let _ = write!(out, "\n    skipped: {skip}");
        }
        for retry in &self.host.said.retries {
            let _ = write!(out, "\n    retried: {retry}");
        }
        out.push_str(&expected::tally_lines(&self.host.said));
        for guest in self.guests {
            let _ = write!(out, "\n{}", guest.report());
        }
        if !problems.is_empty() {
            let _ = write!(out, "\nxtask test: not as {} expects:", expected::FILE);
            for problem in problems {
                let _ = write!(out, "\n  {problem}");
            }
        }
        let stages: Vec<String> = self
            .times
            .iter()
            .map(|(name, time)| format!("{name} {time}"))
            .collect();
        let guests: Vec<String> = self
            .guests
            .iter()
            .map(|g| format!("{} {}", g.name, secs(g.took)))
            .collect();
        let _ = write!(
            out,
            "\nxtask test: stage times (host and guest stages run side by side): {}",
            stages.join(", ")
        );
        if !guests.is_empty() {
            let _ = write!(out, "\nxtask test: guest times: {}", guests.join(", "));
        }
        let _ = write!(out, "\nxtask test: total {}", secs(self.took));
        out
    }
}
