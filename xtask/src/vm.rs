//! `cargo xtask vm`: the privileged tests inside a QEMU guest running Debian 12's cloud
//! kernel (6.1), which has kprobes and fentry; this host's kernel has neither.
//!
//! Modelled on aya's VM runner (aya-rs/aya `xtask/src/run.rs`, `test-distro/src/init.rs`):
//! static musl test binaries in a cpio initramfs written here, a small init that mounts
//! what the tests need, runs them and prints exactly one `init: success` / `init: failure`
//! line before powering off, and a host side that reads the serial console under a
//! deadline and treats a panic banner or a missing verdict as failure.
//!
//! The steps are reusable: [`GuestKernel::fetch`], [`build_release`] and [`boot`], which
//! takes a [`Payload`] (what the init runs after its set-up). The tests are one payload;
//! `cargo xtask bench backends` boots the same guest with a benchmark as another.
//!
//! Layout: the kernel package is cached (unpacked) in `<workspace>/.cache/vm/`; the
//! initramfs, stripped binaries and the console log go to `<target>/vm/`.

mod elf;
mod initramfs;
mod kernel;
mod qemu;

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Deserialize;

use crate::cmd;
use initramfs::Archive;
use qemu::{Accel, Verdict};

/// The guest's userspace target: static binaries need nothing from the guest.
const MUSL: &str = "x86_64-unknown-linux-musl";

/// Modules the tests need that the cloud kernel builds as modules (`=m` in its config):
/// the devices under test, and the qdiscs the host kernel has built in, so the guest offers
/// at least what the host does. Their dependencies (`vhost`, `vhost_iotlb`, ...) are added.
const GUEST_MODULES: &[&str] = &[
    "tun",
    "tap",
    "veth",
    "vhost_net",
    "sch_tbf",
    "sch_htb",
    "sch_ingress",
];

/// Busybox applets the init script and its payloads use; each becomes a symlink to
/// `/bin/busybox`.
const APPLETS: &[&str] = &[
    "sh", "mount", "mkdir", "insmod", "poweroff", "echo", "cat", "uname", "sleep", "ls", "dmesg",
    "grep", "sync", "true", "false", "test", "[", "kill", "timeout", "tr", "sed", "head", "tail",
];

/// Host tools (glibc, copied in with their libraries) the tests run: some lib tests check
/// the rtnetlink code against `ip -j` and `tc -j`, which busybox's applets cannot print;
/// `watch_cli` drops privileges with util-linux's `setpriv --reuid`, which busybox's lacks.
const HOST_TOOLS: &[&str] = &["/usr/sbin/ip", "/usr/sbin/tc", "/usr/bin/setpriv"];

const BUSYBOX: &str = "/bin/busybox";

#[derive(Debug, Clone, Copy, clap::ValueEnum)]
pub enum AccelChoice {
    /// KVM if QEMU can really use it here, else TCG.
    Auto,
    Kvm,
    Tcg,
}

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Give up on the guest (and kill QEMU) after this many seconds.
    #[arg(long, default_value_t = Args::DEFAULT_TIMEOUT)]
    timeout: u64,
    /// QEMU accelerator.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    accel: AccelChoice,
    /// Print the guest's console only if the run fails (it is always saved to
    /// `<target>/vm/console.log`).
    #[arg(long)]
    quiet: bool,
    /// Arguments for every test binary, after `--`: a name filter, `--exact`, `--skip X`.
    #[arg(last = true)]
    passthrough: Vec<String>,
}

impl Args {
    /// The suite takes about 10 minutes under TCG here; a third more for a slower machine.
    const DEFAULT_TIMEOUT: u64 = 20 * 60;
}

impl Default for Args {
    fn default() -> Self {
        Self {
            timeout: Self::DEFAULT_TIMEOUT,
            accel: AccelChoice::Auto,
            quiet: false,
            passthrough: Vec::new(),
        }
    }
}

/// Runs `cargo xtask vm`.
///
/// # Errors
/// If the kernel cannot be fetched, the binaries cannot be built, QEMU cannot be run, or
/// the guest does not report success.
pub fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let out = cmd::target_dir().join("vm");
    let kernel = GuestKernel::fetch(&out)?;

    let step = Instant::now();
    let binaries = build()?;
    let build_time = step.elapsed();

    let payload = tests_payload(&binaries, &args.passthrough)?;
    let booted = boot(
        &kernel,
        &binaries.release_bin,
        &payload,
        &BootOptions {
            accel: args.accel,
            timeout: Duration::from_secs(args.timeout),
            echo: if args.quiet { |_| false } else { |_| true },
            dir: out,
        },
    )?;
    let outcome = &booted.outcome;
    if args.quiet && outcome.verdict != Verdict::Success {
        for line in &outcome.lines {
            println!("{line}");
        }
    }
    println!("{}", summary(&outcome.lines));
    eprintln!(
        "xtask vm: times: kernel {:.1} s, build {:.1} s, {}, all {:.1} s; console log {}",
        kernel.fetch_time.as_secs_f64(),
        build_time.as_secs_f64(),
        booted.times(),
        started.elapsed().as_secs_f64(),
        booted.log.display(),
    );
    check_verdict(outcome.verdict, args.timeout)
}

/// The guest's verdict as a result: only `init: success` is `Ok`.
///
/// # Errors
/// Any other verdict, described.
pub fn check_verdict(verdict: Verdict, timeout_s: u64) -> anyhow::Result<()> {
    match verdict {
        Verdict::Success => Ok(()),
        Verdict::Failure => bail!("the guest reported failure (see above)"),
        Verdict::Panic => bail!("the guest kernel panicked"),
        Verdict::Timeout => {
            bail!("the guest gave no verdict within {timeout_s} s (--timeout); QEMU was killed")
        }
        Verdict::Silent => bail!("QEMU exited without the init's verdict"),
    }
}

/// The guest kernel and the modules its init loads.
#[derive(Debug)]
pub struct GuestKernel {
    kernel: kernel::Kernel,
    modules: Vec<kernel::Module>,
    /// Fetching (or finding it in the cache) and unpacking the modules.
    pub fetch_time: Duration,
}

impl GuestKernel {
    /// Fetches Debian's cloud kernel into `<workspace>/.cache/vm` unless it is cached there,
    /// and unpacks the modules the init loads into `out/modules`.
    ///
    /// # Errors
    /// If no kernel is cached and none can be downloaded, or a module cannot be read.
    pub fn fetch(out: &Path) -> anyhow::Result<Self> {
        let cache = cmd::workspace_root().join(".cache/vm");
        std::fs::create_dir_all(out).with_context(|| format!("creating {}", out.display()))?;
        let step = Instant::now();
        let (kernel, source) = kernel::fetch(&cache)?;
        let modules = kernel.modules(GUEST_MODULES, &out.join("modules"))?;
        let fetch_time = step.elapsed();
        eprintln!(
            "xtask vm: kernel {} ({}, {:.1} s); modules: {}",
            kernel.release,
            match source {
                kernel::Source::Cached => "cached",
                kernel::Source::Downloaded => "downloaded",
            },
            fetch_time.as_secs_f64(),
            modules
                .iter()
                .map(|module| module.name.as_str())
                .collect::<Vec<_>>()
                .join(" ")
        );
        Ok(Self {
            kernel,
            modules,
            fetch_time,
        })
    }

    /// Its release, as the guest's `uname -r` prints it.
    pub fn release(&self) -> &str {
        &self.kernel.release
    }
}

/// What a guest runs beyond the common set-up (mounts, modules, `/bin/tap-probe`).
#[derive(Debug)]
pub struct Payload {
    /// Executables to add, as (path in the guest, path on the host); they go in without
    /// debug info.
    pub executables: Vec<(String, PathBuf)>,
    /// Shell commands the init runs after `tap-probe doctor`; they set `status=1` for the
    /// init to report failure.
    pub script: String,
}

/// How to boot a guest.
#[derive(Debug)]
pub struct BootOptions {
    pub accel: AccelChoice,
    /// QEMU is killed if the guest has given no verdict by then.
    pub timeout: Duration,
    /// Which console lines to print as they come (all are kept and logged).
    pub echo: fn(&str) -> bool,
    /// Where the initramfs, the stripped executables and `console.log` go.
    pub dir: PathBuf,
}

/// A guest that has run.
#[derive(Debug)]
pub struct Booted {
    pub outcome: qemu::Outcome,
    pub accel: Accel,
    /// Writing the initramfs.
    pub image_time: Duration,
    /// The whole console.
    pub log: PathBuf,
}

impl Booted {
    /// Where the guest's time went, for a closing line.
    pub fn times(&self) -> String {
        format!(
            "initramfs {:.1} s, boot to init {}, guest total {:.1} s ({})",
            self.image_time.as_secs_f64(),
            self.outcome.boot.map_or_else(
                || "-".to_owned(),
                |boot| format!("{:.1} s", boot.as_secs_f64())
            ),
            self.outcome.elapsed.as_secs_f64(),
            self.accel.name(),
        )
    }
}

/// Writes an initramfs with `tap_probe` (a static build) as `/bin/tap-probe` and `payload`,
/// boots it on `kernel`, and follows the console until the init's verdict.
///
/// # Errors
/// If the image cannot be written or QEMU cannot be run; the guest's verdict is in the
/// outcome, not an error.
pub fn boot(
    kernel: &GuestKernel,
    tap_probe: &Path,
    payload: &Payload,
    options: &BootOptions,
) -> anyhow::Result<Booted> {
    let dir = &options.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let step = Instant::now();
    let initrd = dir.join("initramfs.cpio");
    let size = image(kernel, tap_probe, payload, dir)?.write(&initrd)?;
    let image_time = step.elapsed();
    eprintln!(
        "xtask vm: {} ({} MiB, {:.1} s)",
        initrd.display(),
        size >> 20,
        image_time.as_secs_f64()
    );
    let accel = choose_accel(options.accel)?;
    let log = dir.join("console.log");
    let outcome = qemu::run(&qemu::Config {
        kernel: &kernel.kernel.vmlinuz,
        initrd: &initrd,
        // panic=-1: reboot at once on a panic, which -no-reboot turns into QEMU exiting.
        // loglevel=4: warnings and worse reach the console (an oops, a WARN from the code
        // under test), boot chatter does not. edd=off: no BIOS disk probing, nothing to probe.
        append: "console=ttyS0 panic=-1 loglevel=4 edd=off",
        accel,
        cpus: 2,
        memory_mib: 2048,
        timeout: options.timeout,
        echo: options.echo,
        log: log.clone(),
    })?;
    Ok(Booted {
        outcome,
        accel,
        image_time,
        log,
    })
}

fn choose_accel(choice: AccelChoice) -> anyhow::Result<Accel> {
    match choice {
        AccelChoice::Tcg => Ok(Accel::Tcg),
        AccelChoice::Kvm => qemu::probe_kvm()
            .map(|()| Accel::Kvm)
            .map_err(|reason| anyhow::anyhow!("--accel kvm: {reason}")),
        AccelChoice::Auto => Ok(match qemu::probe_kvm() {
            Ok(()) => Accel::Kvm,
            Err(reason) => {
                eprintln!("xtask vm: KVM unusable, emulating (TCG): {reason}");
                Accel::Tcg
            }
        }),
    }
}

/// What the guest runs, as built for it.
#[derive(Debug)]
struct Binaries {
    /// Test executables (the library's unit tests, the binary's, each `tests/*.rs`).
    tests: Vec<PathBuf>,
    /// The tap-probe binary the integration tests run: they bake its host path in with
    /// `env!("CARGO_BIN_EXE_tap-probe")`, so the guest has it at that same path.
    test_bin: PathBuf,
    /// The release binary, `/bin/tap-probe` in the guest.
    release_bin: PathBuf,
}

/// The parts of cargo's `--message-format=json` lines used here.
#[derive(Debug, Deserialize)]
struct Message {
    reason: String,
    target: Option<Target>,
    profile: Option<Profile>,
    executable: Option<PathBuf>,
}

#[derive(Debug, Deserialize)]
struct Target {
    name: String,
    kind: Vec<String>,
}

#[derive(Debug, Deserialize)]
struct Profile {
    test: bool,
}

fn build() -> anyhow::Result<Binaries> {
    let tests = cargo_json(&[
        "test",
        // Optimised, with the test profile's debug assertions and overflow checks kept:
        // under emulation unoptimised code is what makes the suite slow.
        "--config",
        "profile.dev.opt-level=2",
        "-p",
        "tap-probe",
        "--features",
        "privileged-tests",
        "--no-run",
    ])?;
    let mut test_exes: Vec<PathBuf> = tests
        .iter()
        .filter(|m| m.profile.as_ref().is_some_and(|p| p.test))
        .filter_map(|m| m.executable.clone())
        .collect();
    // Cargo reports them in build order, which varies; run them in a fixed order.
    test_exes.sort_by(|a, b| a.file_name().cmp(&b.file_name()));
    test_exes.dedup();
    if test_exes.is_empty() {
        bail!("cargo test --no-run built no test executables");
    }
    let test_bin = tap_probe_bin(&tests).context("cargo test built no tap-probe binary")?;
    Ok(Binaries {
        tests: test_exes,
        test_bin,
        release_bin: build_release()?,
    })
}

/// Builds the release tap-probe for the guest (static, musl) and returns its path.
///
/// # Errors
/// If the build fails.
pub fn build_release() -> anyhow::Result<PathBuf> {
    let release = cargo_json(&["build", "--release", "-p", "tap-probe"])?;
    tap_probe_bin(&release).context("cargo build built no tap-probe binary")
}

fn tap_probe_bin(messages: &[Message]) -> Option<PathBuf> {
    messages
        .iter()
        .filter(|m| m.profile.as_ref().is_some_and(|p| !p.test))
        .filter(|m| {
            m.target
                .as_ref()
                .is_some_and(|t| t.name == "tap-probe" && t.kind.iter().any(|k| k == "bin"))
        })
        .find_map(|m| m.executable.clone())
}

/// Runs `cargo ARGS --target musl --message-format=json` and returns its artifacts.
fn cargo_json(args: &[&str]) -> anyhow::Result<Vec<Message>> {
    let mut cargo = cmd::cargo();
    cargo
        .args(args)
        .args(["--target", MUSL, "--message-format=json-render-diagnostics"])
        .stdout(Stdio::piped());
    cmd::echo(&cargo);
    let output = cargo
        .spawn()
        .and_then(std::process::Child::wait_with_output)
        .with_context(|| format!("could not run `{}`", cmd::display(&cargo)))?;
    cmd::check(&cargo, output.status)
        .context("building for the guest failed; `cargo xtask setup` adds the musl target")?;
    Ok(String::from_utf8_lossy(&output.stdout)
        .lines()
        .filter_map(|line| serde_json::from_str::<Message>(line).ok())
        .filter(|m| m.reason == "compiler-artifact")
        .collect())
}

/// The guest's tests: each test executable, and the test build of tap-probe at its host
/// path (the integration tests bake that path in with `env!("CARGO_BIN_EXE_tap-probe")`).
fn tests_payload(binaries: &Binaries, test_args: &[String]) -> anyhow::Result<Payload> {
    let test_bin = binaries
        .test_bin
        .to_str()
        .context("non-UTF-8 target path")?;
    let mut executables = vec![(test_bin.to_owned(), binaries.test_bin.clone())];
    let mut tests = Vec::new();
    for test in &binaries.tests {
        let name = test
            .file_name()
            .and_then(|n| n.to_str())
            .context("test executable without a name")?;
        let guest = format!("/tests/{name}");
        executables.push((guest.clone(), test.clone()));
        tests.push(guest);
    }
    Ok(Payload {
        executables,
        script: tests_script(&tests, test_args),
    })
}

/// Lays out the guest's root filesystem.
fn image(
    kernel: &GuestKernel,
    tap_probe: &Path,
    payload: &Payload,
    out: &Path,
) -> anyhow::Result<Archive> {
    let mut archive = Archive::default();
    for dir in ["/proc", "/sys", "/dev", "/run", "/tmp", "/root", "/etc"] {
        archive.dir(dir);
    }
    archive.bytes("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);

    let busybox = std::fs::read(BUSYBOX).with_context(|| {
        format!("reading {BUSYBOX} (cargo xtask setup installs busybox-static)")
    })?;
    if !elf::is_static(&busybox)? {
        bail!("{BUSYBOX} is dynamically linked: install busybox-static (cargo xtask setup)");
    }
    archive.bytes(BUSYBOX, busybox, 0o755);
    for applet in APPLETS {
        archive.symlink(&format!("/bin/{applet}"), "busybox");
    }
    for tool in HOST_TOOLS {
        add_dynamic(&mut archive, Path::new(tool))?;
    }

    let stripped = out.join("bin");
    std::fs::create_dir_all(&stripped)?;
    let strip = |path: &Path| strip_debug(path, &stripped);
    archive.host_file("/bin/tap-probe", &strip(tap_probe)?, 0o755);
    for (guest, host) in &payload.executables {
        archive.host_file(guest, &strip(host)?, 0o755);
    }
    for module in &kernel.modules {
        archive.host_file(&module.guest_path, &module.host_path, 0o644);
    }
    archive.bytes(
        "/init",
        init_script(&kernel.kernel.release, &kernel.modules, &payload.script),
        0o755,
    );
    Ok(archive)
}

/// A copy of `binary` without debug info in `dir` (test binaries shrink from about 85 to
/// 17 MiB, which the guest unpacks into RAM); symbols stay, so backtraces name functions.
fn strip_debug(binary: &Path, dir: &Path) -> anyhow::Result<PathBuf> {
    let name = binary.file_name().context("binary without a name")?;
    let stripped = dir.join(name);
    let mut strip = cmd::new("strip");
    strip
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(binary);
    match strip.output() {
        Ok(output) if output.status.success() => Ok(stripped),
        _ => {
            eprintln!(
                "xtask vm: could not strip {}; using it as is",
                binary.display()
            );
            Ok(binary.to_path_buf())
        }
    }
}

/// A dynamically linked host binary and the libraries `ldd` finds for it, at the same
/// paths in the guest.
fn add_dynamic(archive: &mut Archive, binary: &Path) -> anyhow::Result<()> {
    let path = binary.to_str().context("non-UTF-8 path")?;
    if !binary.exists() {
        bail!("{path} is missing (cargo xtask setup installs iproute2; util-linux is essential)");
    }
    archive.host_file(path, binary, 0o755);
    let ldd =
        cmd::probe(cmd::new("ldd").arg(binary)).with_context(|| format!("ldd {path} failed"))?;
    for library in ldd_paths(&ldd) {
        archive.host_file(library, Path::new(library), 0o755);
    }
    Ok(())
}

/// The library paths in `ldd` output: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x..)`
/// and the loader's own `/lib64/ld-linux-x86-64.so.2 (0x..)`; not the vDSO.
fn ldd_paths(ldd: &str) -> Vec<&str> {
    ldd.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = line.split_once("=>").map_or(line, |(_, path)| path.trim());
            path.split_whitespace().next()
        })
        .filter(|path| path.starts_with('/'))
        .collect()
}

/// Quotes `word` for the init's shell.
pub fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The guest's `/init`: busybox sh as PID 1. It sets up, runs `tap-probe doctor` and then
/// `payload`, prints one verdict line and powers off.
fn init_script(release: &str, modules: &[kernel::Module], payload: &str) -> String {
    let mut script = String::from(
        r#"#!/bin/sh
# Generated by xtask (xtask/src/vm.rs): mounts what tap-probe needs, loads the modules,
# runs `tap-probe doctor` and the payload, prints one verdict line, powers off.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp RUST_BACKTRACE=1
status=0
must() { "$@" || { echo "init: '$*' failed"; status=1; }; }
must mount -t proc proc /proc
must mount -t sysfs sysfs /sys
must mount -t devtmpfs devtmpfs /dev
must mount -t tmpfs tmpfs /run
# No tmpfs on /tmp: the initramfs root is in memory already, and the test binaries expect
# tap-probe at its host path, which may lie under /tmp.
must mount -t tracefs tracefs /sys/kernel/tracing
must mount -t debugfs debugfs /sys/kernel/debug
must mount -t bpf bpf /sys/fs/bpf
must mkdir -p /run/netns
# An oops in the kernel code under test ends the run instead of hanging it until the host
# gives up: panic_on_oops makes it a panic, panic=-1 a reboot, QEMU's -no-reboot an exit.
echo 1 > /proc/sys/kernel/panic_on_oops
must ip link set lo up
"#,
    );
    let _ = writeln!(
        script,
        "echo \"init: kernel $(uname -r), expected {release}\""
    );
    for module in modules {
        let _ = writeln!(script, "must insmod {}", module.guest_path);
    }
    script.push_str(
        r#"echo "init: tap-probe doctor"
/bin/tap-probe doctor
echo "init: tap-probe doctor exited $?"
"#,
    );
    script.push_str(payload);
    script.push_str(
        r#"if [ "$status" -eq 0 ]; then echo "init: success"; else echo "init: failure"; fi
sync
poweroff -f
"#,
    );
    script
}

/// A test binary still running after this long is ended, so one hung test fails its binary
/// and the rest still run (the whole suite takes about 4 minutes under TCG here).
const BINARY_TIMEOUT_S: u32 = 8 * 60;

/// The tests' part of the init: each test binary in turn, one at a time (they share the
/// guest's tracepoints and tracefs), with `test_args`.
fn tests_script(tests: &[String], test_args: &[String]) -> String {
    let mut script = format!(
        r#"run() {{
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
    for test in tests {
        let _ = writeln!(script, "run {test}");
    }
    script
}

/// Per test binary, the counts from libtest's `test result:` line and the failed tests'
/// names, read from the console.
fn summary(lines: &[String]) -> String {
    let mut out = String::from("xtask vm: guest test results:");
    let mut binary: Option<&str> = None;
    let mut failed: Vec<&str> = Vec::new();
    let mut skipped = 0;
    for line in lines {
        if let Some(path) = line.strip_prefix("init: running ") {
            binary = path
                .split(' ')
                .next()
                .and_then(|path| path.rsplit('/').next());
            failed.clear();
            skipped = 0;
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            failed.push(name);
        } else if line.starts_with("skipping test - ") {
            skipped += 1;
        } else if let (Some(name), Some(result)) = (binary, line.strip_prefix("test result: ")) {
            let _ = write!(out, "\n  {name}: {result}");
            if skipped > 0 {
                let _ = write!(out, "; {skipped} skipped themselves");
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
    }
    out
}

/// Whether an init line reports a non-zero exit: `PATH exited RC (uptime ...)`.
fn failed_exit(line: &str) -> bool {
    line.split_once(" exited ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .is_some_and(|rc| rc != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_yields_library_paths() {
        let ldd = "\tlinux-vdso.so.1 (0x00007f1d71c2e000)\n\
                   \tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007f1d71ace000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f1d71c30000)\n";
        assert_eq!(
            ldd_paths(ldd),
            [
                "/lib/x86_64-linux-gnu/libbpf.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }

    #[test]
    fn init_script_quotes_test_arguments() {
        let tests = tests_script(&["/tests/exactness-0123".to_owned()], &["it's".to_owned()]);
        let script = init_script("6.1.0-57-cloud-amd64", &[], &tests);
        assert!(script.contains(r"--show-output 'it'\''s'"));
        assert!(script.contains("run /tests/exactness-0123\n"));
        assert_eq!(script.matches("init: success").count(), 1);
    }

    #[test]
    fn summary_reports_each_binary() {
        let lines: Vec<String> = [
            "init: running /tests/exactness-01 (uptime 9.50 s)",
            "test a ... ok",
            "test b ... FAILED",
            "skipping test - no kprobes",
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "init: /tests/exactness-01 exited 101 (uptime 12.00 s)",
            "init: /tests/other exited 0 (uptime 13.00 s)",
        ]
        .map(str::to_owned)
        .to_vec();
        let summary = summary(&lines);
        assert!(summary.contains("exactness-01: FAILED. 1 passed; 1 failed"));
        assert!(summary.contains("1 skipped themselves"));
        assert!(summary.contains("failed: b"));
        assert!(summary.contains("exited 101"));
        assert!(!summary.contains("exited 0"));
    }
}
