//! `tap-probe vm`: boots a kernel in a QEMU guest with tap-probe inside and runs
//! `tap-probe ARGS` there. Its standard output is this command's (over a serial port of its
//! own, byte for byte), its standard error and the kernel's warnings reach this command's
//! standard error, and its exit status is this command's. The guest's QEMU is this
//! command's: stopped with it, whatever stops it (see `tap_probe_guest::qemu`).

use std::io::Write;
use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::sync::{Arc, Mutex};
use std::time::Duration;

use anyhow::{Context as _, bail};
use tap_probe_guest::console::{self, Signal};
use tap_probe_guest::image::{STDOUT_TTY, sh_quote};
use tap_probe_guest::{AccelChoice, Image, KernelSpec, Launcher, Outcome, Verdict, launch};

use tap_probe_observer::os::signals::Stop;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The guest's kernel: `debian-5.10`, `debian-6.1`, `debian-6.12` or `debian-7.3`
    /// (Debian's cloud kernels, fetched with apt into ~/.cache/tap-probe, the newest of the
    /// series), a bzImage (with --modules) or a kernel package (.deb).
    #[arg(long, value_name = "KERNEL", default_value = "debian-7.3")]
    kernel: KernelSpec,
    /// The kernel's modules, for a bzImage: a directory holding `lib/modules/RELEASE`
    /// (`make modules_install INSTALL_MOD_PATH=DIR`), the release directory itself, or a
    /// modules .deb.
    #[arg(long, value_name = "DIR")]
    modules: Option<PathBuf>,
    /// A module that replaces the kernel's own of the same name (a modified `tun.ko`), or is
    /// added; repeatable. It must have been built for the guest's kernel.
    #[arg(long = "module", value_name = "FILE.ko")]
    replacements: Vec<PathBuf>,
    /// QEMU accelerator; `auto` uses KVM when a guest boots under it and TCG otherwise.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    accel: AccelChoice,
    /// Guest CPUs.
    #[arg(long, default_value_t = 2, value_parser = clap::value_parser!(u32).range(1..=64))]
    cpus: u32,
    /// Guest memory in MiB.
    #[arg(long, value_name = "MIB", default_value_t = 2048, value_parser = clap::value_parser!(u32).range(256..=65536))]
    memory: u32,
    /// Give up on the guest (and kill QEMU) after this long (seconds, or with a unit: 90m;
    /// 10s to 24h).
    #[arg(long, value_name = "DURATION", default_value = "3600", value_parser = timeout)]
    timeout: Duration,
    /// A directory the command writes results into (`--junit out/junit.xml`): it exists in
    /// the guest at the same path and its contents come back here afterwards.
    #[arg(long, value_name = "DIR")]
    out: Option<PathBuf>,
    /// Also show the guest's boot messages and its init's progress.
    #[arg(long)]
    verbose: bool,
    /// What to run in the guest: `tap-probe ARGS`, after `--`.
    #[arg(last = true, required = true, value_name = "ARGS")]
    command: Vec<String>,
}

/// `--timeout`: long enough for a guest to boot under emulation, at most a day.
fn timeout(text: &str) -> Result<Duration, String> {
    tap_probe_common::duration::within(text, &(Duration::from_secs(10)..=Duration::from_hours(24)))
}

/// Runs `tap-probe vm`.
///
/// # Errors
/// If the kernel cannot be had, the guest cannot be built or run, or it fails before the
/// command could give its own exit status.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    // Caught from the start: a stop while the kernel is fetched or the image written ends
    // the command before QEMU starts; one while the guest runs kills QEMU.
    let stop = Stop::install()?;
    // Before a kernel is fetched or a guest booted: a directory the results cannot come back
    // into costs one line (exit status 2).
    if let Some(out) = &args.out {
        tap_probe_observer::os::files::check_output_dir(out, "--out")?;
    }
    let cache = tap_probe_guest::cache_dir()?;
    let kernel = tap_probe_guest::kernel::resolve(&args.kernel, args.modules.as_deref(), &cache)?;
    let work = cache.join("vm").join(format!("run-{}", std::process::id()));
    let _cleanup = RemoveOnDrop(work.clone());
    let modules = kernel.modules(
        tap_probe_guest::MODULES,
        &args.replacements,
        &work.join("modules"),
    )?;
    if !modules.missing.is_empty() {
        eprintln!(
            "tap-probe vm: {} has no {}; commands that need them will say so",
            kernel.release,
            modules.missing.join(", ")
        );
    }
    let cwd = std::env::current_dir().context("the current directory")?;
    let cwd_text = cwd.to_str().context("the current directory is not UTF-8")?;
    let mut image = Image::new(&kernel.release, modules.load, &work.join("scratch"))?;
    let exe = std::env::current_exe().context("finding tap-probe's own executable")?;
    image.executable("/bin/tap-probe", &exe)?;
    for (guest, host) in input_files(&args.command, &cwd) {
        image.file(&guest, &host, 0o644);
    }
    image.working_dir(cwd_text);
    let out = args.out.as_ref().map(|out| cwd.join(out));
    if let Some(out) = &out {
        image.collect(out.to_str().context("--out is not UTF-8")?);
    }
    let command: Vec<String> = args.command.iter().map(|arg| sh_quote(arg)).collect();
    // Tables fit the terminal the output ends up on: this one's width, when it is one.
    if let Some((columns, _)) = crate::output::term::size(&std::io::stdout()) {
        image.script(&format!("export COLUMNS={columns}\n"));
    }
    image.script(&format!(
        "/bin/tap-probe {} > {STDOUT_TTY}\nstatus=$?\n",
        command.join(" ")
    ));

    if stop.stopped() {
        bail!("stopped before the guest was booted");
    }
    eprintln!(
        "tap-probe vm: booting {} ({}); running tap-probe {}",
        kernel.release,
        kernel.origin,
        args.command.join(" ")
    );
    // Boot messages and the init's own lines only with --verbose; what the guest prints
    // between the init's first line and its verdict (the command's stderr, kernel warnings)
    // always; nothing of the power-off after the verdict.
    let verbose = args.verbose;
    let (mut started, mut ended) = (false, false);
    let mut echo = |line: &str| {
        let signal = console::classify(line);
        let (init, verdict) = match signal {
            Some(Signal::Init) => (true, false),
            Some(Signal::Success | Signal::Failure(_)) => (false, true),
            _ => (false, false),
        };
        started |= init;
        if verbose || (started && !ended && !init && !verdict) {
            eprintln!("{line}");
        }
        ended |= verdict;
    };
    let stdout: tap_probe_guest::Sink = Arc::new(Mutex::new(GuestStdout));
    let ran = tap_probe_guest::boot(
        &mut Launcher::new(args.accel, "tap-probe vm").stop_on(stop.flag()),
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &work,
            cpus: args.cpus,
            memory_mib: args.memory,
            timeout: args.timeout,
            echo: &mut echo,
            stdout: Some(stdout),
            collect_into: out.as_deref(),
        },
    )?;
    if verbose {
        eprintln!("tap-probe vm: {}", ran.booted.times());
    }
    exit_code(&ran.booted.outcome, &kernel.release, verbose)
}

/// The command's exit code from the guest's verdict: the guest command's own, or an error
/// that says what became of the guest, with its console's last lines.
fn exit_code(outcome: &Outcome, release: &str, verbose: bool) -> anyhow::Result<ExitCode> {
    let tail = |n: usize| {
        if !verbose {
            eprintln!("tap-probe vm: the guest console's last lines:");
            for line in outcome.tail(n) {
                eprintln!("    {line}");
            }
        }
    };
    match &outcome.verdict {
        Verdict::Success => Ok(ExitCode::SUCCESS),
        Verdict::Failure(Some(code)) => Ok(ExitCode::from(u8::try_from(*code).unwrap_or(1))),
        Verdict::Interrupted => {
            tail(5);
            bail!(
                "the guest on {release} was stopped after {:.1} s, before its command ended, \
                 and its QEMU killed; what the command wrote until then is above",
                outcome.elapsed.as_secs_f64()
            )
        }
        other => {
            tail(20);
            bail!("the guest on {release} failed: {}", launch::describe(other))
        }
    }
}

/// Host files the command names, as (guest path, host path): every argument, or the value
/// of a `--flag=value` argument, that is an existing file (relative ones against `cwd`). They
/// are copied to the same absolute path in the guest, whose working directory is `cwd` too.
fn input_files(args: &[String], cwd: &Path) -> Vec<(String, PathBuf)> {
    args.iter()
        .map(|arg| arg.split_once('=').map_or(arg.as_str(), |(_, value)| value))
        .map(|value| cwd.join(value))
        .filter(|path| path.is_file())
        .filter_map(|path| Some((path.to_str()?.to_owned(), path)))
        .collect()
}

/// The guest's standard output on ours. A reader or terminal of ours that went away stops
/// the run, QEMU included, as it stops every other command.
struct GuestStdout;

impl Write for GuestStdout {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        std::io::stdout().write(buf).inspect_err(stop_if_gone)
    }

    fn flush(&mut self) -> std::io::Result<()> {
        std::io::stdout().flush().inspect_err(stop_if_gone)
    }
}

fn stop_if_gone(err: &std::io::Error) {
    if let Some(code) = err.raw_os_error() {
        // Stops the run when the error says stdout's other end is gone; any other error
        // stops the copying only (the guest's output stays in its file until the end).
        drop(crate::output::stdout_failed(
            std::io::Error::from_raw_os_error(code),
        ));
    }
}

/// The guest's working files (initramfs, console log) go when the command ends.
struct RemoveOnDrop(PathBuf);

impl Drop for RemoveOnDrop {
    fn drop(&mut self) {
        let _ = std::fs::remove_dir_all(&self.0);
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn named_files_are_found_relative_to_the_working_directory() {
        let dir = tempfile::tempdir().expect("temp dir");
        std::fs::write(dir.path().join("lab.toml"), "").expect("writing");
        let args: Vec<String> = [
            "check",
            "lab.toml",
            "--junit=out/junit.xml",
            "--baseline=lab.toml",
        ]
        .map(str::to_owned)
        .to_vec();
        let files = input_files(&args, dir.path());
        let expected = dir.path().join("lab.toml");
        assert_eq!(files.len(), 2, "{files:?}");
        assert!(
            files.iter().all(
                |(guest, host)| *host == expected && guest == expected.to_str().expect("UTF-8")
            )
        );
    }
}
