//! `cargo xtask vm`: the privileged tests inside QEMU guests, one per kernel of the matrix
//! (this host's kernel has neither kprobes nor the tail-drop fix; the guests have both).
//!
//! The guest machinery is `tap-probe-guest`'s, the same `tap-probe vm` uses: the test
//! binaries (built for this host; dynamic ones bring their libraries), `tap-probe` at the
//! path the integration tests baked in, and the host's `ip`, `tc` and `setpriv` go into the
//! initramfs; the init runs `tap-probe doctor` and then each test binary under a timeout.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_guest::image::sh_quote;
use tap_probe_guest::{AccelChoice, Image, Kernel, KernelSpec, Launcher, Series, Verdict, launch};

use crate::cmd;
use crate::skips::{self, Skip};

/// Host tools (copied in with their libraries) the tests run: some lib tests check the
/// rtnetlink code against `ip -j` and `tc -j`, which busybox's applets cannot print;
/// `watch_cli` drops privileges with util-linux's `setpriv --reuid`.
const HOST_TOOLS: &[&str] = &["/usr/sbin/ip", "/usr/sbin/tc", "/usr/bin/setpriv"];

/// Each test binary still running after this long is ended, so one hung test fails its
/// binary and the rest still run (the whole suite takes about 4 minutes under TCG here).
const BINARY_TIMEOUT_S: u32 = 8 * 60;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Kernels to run the tests on, one guest each: `debian-6.1`, `debian-6.12`,
    /// `debian-7.3`, a bzImage or a kernel .deb [default: the matrix `cargo xtask test`
    /// runs: debian-6.1, debian-6.12 with `cargo xtask seed-tun`'s tun.ko, debian-7.3].
    #[arg(long = "kernel")]
    kernels: Vec<KernelSpec>,
    /// A module that replaces (or adds to) the kernel's own in every guest of this run: a
    /// modified `tun.ko`.
    #[arg(long = "module")]
    modules: Vec<PathBuf>,
    /// With `--kernel PATH` to a bzImage: its modules (`INSTALL_MOD_PATH` of
    /// `make modules_install`, or a `lib/modules/RELEASE` directory, or a .deb).
    #[arg(long = "modules")]
    modules_dir: Option<PathBuf>,
    /// Give up on a guest (and kill QEMU) after this many seconds.
    #[arg(long, default_value_t = 20 * 60)]
    timeout: u64,
    /// QEMU accelerator; `auto` tries KVM and falls back to TCG when a guest does not boot
    /// under it.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    accel: AccelChoice,
    /// Print the guest's console only if the run fails (it is always saved to
    /// `<target>/vm/<kernel>/console.log`).
    #[arg(long)]
    quiet: bool,
    /// Arguments for every test binary, after `--`: a name filter, `--exact`, `--skip X`.
    #[arg(last = true)]
    passthrough: Vec<String>,
}

/// One guest of a test run: a kernel and the modules that replace its own.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    pub kernel: KernelSpec,
    pub modules: Vec<PathBuf>,
    /// With a bzImage: its modules.
    pub modules_dir: Option<PathBuf>,
}

/// Runs `cargo xtask vm`.
///
/// # Errors
/// If a kernel cannot be found, the binaries cannot be built, QEMU cannot be run, or a
/// guest does not report success.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let guests = if args.kernels.is_empty() {
        matrix()?
    } else {
        args.kernels
            .iter()
            .map(|kernel| Guest {
                kernel: kernel.clone(),
                modules: args.modules.clone(),
                modules_dir: args.modules_dir.clone(),
            })
            .collect()
    };
    let skipped = run_tests(
        &guests,
        &Options {
            accel: args.accel,
            timeout: Duration::from_secs(args.timeout),
            quiet: args.quiet,
            passthrough: args.passthrough.clone(),
        },
    )?;
    for (kernel, skips) in skipped {
        for skip in skips {
            println!("xtask vm: skipped on {kernel}: {skip}");
        }
    }
    Ok(())
}

/// The kernels the tests run on in CI: Debian 12's own 6.1 (stock: tail-drop); 6.12 with
/// the tail-drop fix as posted (v8 4/4 + v9 1/4, built by `cargo xtask seed-tun`: stops the
/// queue, returns BUSY on a lost race); 7.3 with the fix as merged (opt-in per tap with
/// `IFF_BACKPRESSURE`, never BUSY).
///
/// # Errors
/// If the 6.12 module cannot be built.
pub(crate) fn matrix() -> anyhow::Result<Vec<Guest>> {
    let guest = |series, modules| Guest {
        kernel: KernelSpec::Debian(series),
        modules,
        modules_dir: None,
    };
    Ok(vec![
        guest(Series::Debian6_1, Vec::new()),
        guest(Series::Debian6_12, vec![crate::seed_tun::build()?]),
        guest(Series::Debian7_3, Vec::new()),
    ])
}

/// How to run the tests in guests.
#[derive(Debug)]
pub(crate) struct Options {
    pub accel: AccelChoice,
    pub timeout: Duration,
    pub quiet: bool,
    pub passthrough: Vec<String>,
}

/// Runs the privileged tests in one guest per entry of `guests`, in turn, and fails if any
/// guest does not report success (after running them all). Returns, per guest kernel, the
/// tests that skipped themselves.
///
/// # Errors
/// If the build fails, a kernel cannot be had, or a guest fails.
pub(crate) fn run_tests(
    guests: &[Guest],
    options: &Options,
) -> anyhow::Result<Vec<(String, Vec<Skip>)>> {
    let started = Instant::now();
    let step = Instant::now();
    let binaries = build_tests()?;
    let build_time = step.elapsed();
    let mut launcher = Launcher::new(options.accel, "xtask vm");
    let mut failures = Vec::new();
    let mut times = Vec::new();
    let mut skipped = Vec::new();
    for guest in guests {
        let step = Instant::now();
        let (kernel, modules) = prepare(guest)?;
        let name = kernel.release.clone();
        let dir = guest_dir(&kernel);
        let mut image = Image::new(&kernel.release, modules, &dir.join("scratch"))?;
        tests_payload(&mut image, &binaries, &options.passthrough)?;
        let prepare_time = step.elapsed();
        let quiet = options.quiet;
        let mut echo = |line: &str| {
            if !quiet {
                println!("{line}");
            }
        };
        eprintln!(
            "==> xtask vm: tests on {} ({})",
            kernel.release, kernel.origin
        );
        let ran = tap_probe_guest::boot(
            &mut launcher,
            tap_probe_guest::Boot {
                kernel: &kernel,
                image,
                dir: &dir,
                cpus: 2,
                memory_mib: 2048,
                timeout: options.timeout,
                echo: &mut echo,
                stdout: None,
                collect_into: None,
            },
        )?;
        let outcome = &ran.booted.outcome;
        if quiet && outcome.verdict != Verdict::Success {
            for line in &outcome.lines {
                println!("{line}");
            }
        }
        println!("{}", summary(&name, &outcome.lines));
        skipped.push((name.clone(), skips::read(&outcome.lines)));
        let line = format!(
            "{name}: prepare {:.1} s, image {} MiB, {}; console log {}",
            prepare_time.as_secs_f64(),
            ran.image_bytes >> 20,
            ran.booted.times(),
            ran.log.display()
        );
        eprintln!("xtask vm: {line}");
        times.push(line);
        if outcome.verdict != Verdict::Success {
            failures.push(format!("{name}: {}", launch::describe(&outcome.verdict)));
        }
    }
    eprintln!(
        "xtask vm: times: build {:.1} s; {}; all {:.1} s",
        build_time.as_secs_f64(),
        times.join("; "),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        bail!("guests failed: {}", failures.join("; "));
    }
    Ok(skipped)
}

/// The guest's kernel and the modules to load in it.
///
/// # Errors
/// If the kernel cannot be had or a module is unusable.
pub(crate) fn prepare(guest: &Guest) -> anyhow::Result<(Kernel, Vec<tap_probe_guest::Module>)> {
    let cache = tap_probe_guest::cache_dir()?;
    let kernel =
        tap_probe_guest::kernel::resolve(&guest.kernel, guest.modules_dir.as_deref(), &cache)?;
    let scratch = guest_dir(&kernel).join("modules");
    let set = kernel.modules(tap_probe_guest::MODULES, &guest.modules, &scratch)?;
    eprintln!(
        "xtask vm: kernel {} from {}; modules: {}{}",
        kernel.release,
        kernel.origin,
        set.load
            .iter()
            .map(|module| module.name.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        if set.missing.is_empty() {
            String::new()
        } else {
            format!(" (not available: {})", set.missing.join(" "))
        }
    );
    Ok((kernel, set.load))
}

/// What the guest runs, as built for it.
#[derive(Debug)]
pub(crate) struct TestBinaries {
    /// Test executables (the library's unit tests, the binary's, each `tests/*.rs`).
    tests: Vec<PathBuf>,
    /// The tap-probe binary the integration tests run: they bake its host path in with
    /// `env!("CARGO_BIN_EXE_tap-probe")`, so the guest has it at that same path (and as
    /// `/bin/tap-probe`).
    tap_probe: PathBuf,
}

/// Builds the privileged tests the way the host's privileged stage does, so the build is
/// shared ([`crate::test::TEST_PROFILE`]).
fn build_tests() -> anyhow::Result<TestBinaries> {
    let artifacts = cmd::cargo_artifacts(
        cmd::cargo()
            .arg("test")
            .args(crate::test::TEST_PROFILE)
            .args([
                "-p",
                "tap-probe",
                "--features",
                "privileged-tests",
                "--no-run",
            ]),
    )?;
    let mut tests: Vec<PathBuf> = artifacts
        .iter()
        .filter(|artifact| artifact.profile.test)
        .filter_map(|artifact| artifact.executable.clone().map(Into::into))
        .collect();
    // Cargo reports them in build order, which varies; run them in a fixed order.
    tests.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    tests.dedup();
    if tests.is_empty() {
        bail!("cargo test --no-run built no test executables");
    }
    let tap_probe = artifacts
        .iter()
        .filter(|artifact| !artifact.profile.test && artifact.target.name == "tap-probe")
        .find_map(|artifact| artifact.executable.clone())
        .context("cargo test built no tap-probe binary")?
        .into();
    Ok(TestBinaries { tests, tap_probe })
}

/// The tests' part of the guest: the binaries, the host tools, and a script that runs
/// `tap-probe doctor` and then each test binary in turn, one at a time (they share the
/// guest's tracepoints), with `test_args`.
fn tests_payload(
    image: &mut Image,
    binaries: &TestBinaries,
    test_args: &[String],
) -> anyhow::Result<()> {
    for tool in HOST_TOOLS {
        image.host_tool(tool)?;
    }
    let tap_probe = binaries
        .tap_probe
        .to_str()
        .context("non-UTF-8 target path")?;
    image.executable(tap_probe, &binaries.tap_probe)?;
    image.executable("/bin/tap-probe", &binaries.tap_probe)?;
    let mut script = format!(
        r#"echo "init: tap-probe doctor"
/bin/tap-probe doctor
echo "init: tap-probe doctor exited $?"
run() {{
    read -r up _ < /proc/uptime
    echo "init: running $1 (uptime $up s)"
    timeout {BINARY_TIMEOUT_S} "$@" --test-threads=1 --show-output"#
    );
    for arg in test_args {
        script.push(' ');
        script.push_str(&sh_quote(arg));
    }
    let _ = write!(
        script,
        r#"
    rc=$?
    read -r up _ < /proc/uptime
    # busybox timeout ends the binary with SIGTERM: exit status 128 + 15.
    [ "$rc" -eq 143 ] && echo "init: $1 timed out after {BINARY_TIMEOUT_S} s"
    echo "init: $1 exited $rc (uptime $up s)"
    [ "$rc" -eq 0 ] || status=1
}}
"#
    );
    for test in &binaries.tests {
        let name = test
            .file_name()
            .and_then(|n| n.to_str())
            .context("test executable without a name")?;
        let guest = format!("/tests/{name}");
        image.executable(&guest, test)?;
        let _ = writeln!(script, "run {guest}");
    }
    image.script(&script);
    Ok(())
}

/// Per test binary, the counts from libtest's `test result:` line, the tests that skipped
/// themselves and the failed tests' names, read from the console.
fn summary(kernel: &str, lines: &[String]) -> String {
    let mut out = format!("xtask vm: guest test results on {kernel}:");
    let mut binary: Option<&str> = None;
    let mut failed: Vec<&str> = Vec::new();
    let mut output: Vec<&str> = Vec::new();
    for line in lines {
        if let Some(path) = line.strip_prefix("init: running ") {
            binary = path
                .split(' ')
                .next()
                .and_then(|path| path.rsplit('/').next());
            failed.clear();
            output.clear();
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            failed.push(name);
        } else if let (Some(name), Some(result)) = (binary, line.strip_prefix("test result: ")) {
            let _ = write!(out, "\n  {name}: {result}");
            for skip in skips::read(&output) {
                let _ = write!(out, "\n    skipped: {skip}");
            }
            if !failed.is_empty() {
                let _ = write!(out, "\n    failed: {}", failed.join(", "));
            }
        } else if line
            .strip_prefix("init: ")
            .is_some_and(|rest| rest.ends_with("failed") || failed_exit(rest))
        {
            let _ = write!(out, "\n  {line}");
        }
        output.push(line);
    }
    out
}

/// Whether an init line reports a non-zero exit: `PATH exited RC (uptime ...)`.
fn failed_exit(line: &str) -> bool {
    line.split_once(" exited ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .is_some_and(|rc| rc != "0")
}

/// Boots `guest`'s kernel with a trivial payload and a first boot that cannot succeed (as
/// `TAP_PROBE_VM_BREAK_FIRST_BOOT` makes it): the launcher must fall back to TCG and the
/// second boot must pass. Exercises on every machine the path machines with a half-working
/// KVM take.
///
/// # Errors
/// If the fallback does not happen or its run fails.
pub(crate) fn check_fallback(guest: &Guest) -> anyhow::Result<()> {
    let (kernel, _) = prepare(guest)?;
    let dir = cmd::target_dir().join("vm").join("fallback");
    let mut image = Image::new(&kernel.release, Vec::new(), &dir.join("scratch"))?;
    image.script("echo \"init: payload ran on $(uname -r)\"\n");
    let mut launcher = Launcher::new(AccelChoice::Auto, "xtask vm");
    launcher.break_next_boot();
    let mut echo = |_: &str| {};
    let ran = tap_probe_guest::boot(
        &mut launcher,
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 512,
            timeout: Duration::from_mins(5),
            echo: &mut echo,
            stdout: None,
            collect_into: None,
        },
    )?;
    let booted = &ran.booted;
    let Some((why, took)) = &booted.fallback else {
        bail!("the first boot was broken on purpose, yet no fallback happened");
    };
    if booted.outcome.verdict != Verdict::Success {
        bail!(
            "the fallback run failed: {} (console log {})",
            launch::describe(&booted.outcome.verdict),
            ran.log.display()
        );
    }
    eprintln!(
        "xtask vm: fallback checked: the broken first boot failed after {:.1} s ({why}); the \
         TCG run passed: {}",
        took.as_secs_f64(),
        booted.times()
    );
    Ok(())
}

/// Where a guest's files go.
pub(crate) fn guest_dir(kernel: &Kernel) -> PathBuf {
    cmd::target_dir().join("vm").join(&kernel.release)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn summary_reports_each_binary_and_its_skips() {
        let lines: Vec<String> = [
            "init: running /tests/exactness-01 (uptime 9.50 s)",
            "test a ... ok",
            "test b ... FAILED",
            "successes:",
            "---- a stdout ----",
            "skipping test - no kprobes",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "init: /tests/exactness-01 exited 101 (uptime 12.00 s)",
            "init: /tests/other exited 0 (uptime 13.00 s)",
        ]
        .map(str::to_owned)
        .to_vec();
        let summary = summary("6.1.0-57-cloud-amd64", &lines);
        assert!(summary.contains("on 6.1.0-57-cloud-amd64"));
        assert!(summary.contains("exactness-01: FAILED. 1 passed; 1 failed"));
        assert!(summary.contains("skipped: a: skipping test - no kprobes"));
        assert!(summary.contains("failed: b"));
        assert!(summary.contains("exited 101"));
        assert!(!summary.contains("exited 0"));
    }

    #[test]
    fn guest_dirs_are_per_release() {
        let kernel = Kernel {
            release: "7.3-cloud-amd64".to_owned(),
            vmlinuz: Path::new("/x").to_path_buf(),
            modules_dir: None,
            origin: String::new(),
        };
        assert!(guest_dir(&kernel).ends_with("vm/7.3-cloud-amd64"));
    }
}
