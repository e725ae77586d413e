//! `cargo xtask vm`: the kernel-dependent tests inside QEMU guests, one per kernel of the
//! matrix (this host's kernel has neither kprobes nor the tail-drop fix; the guests have
//! both), side by side as far as the host's CPUs go: each emulated guest runs on one host
//! thread.
//!
//! The guest machinery is `tap-probe-guest`'s, the same `tap-probe vm` uses: the test
//! binaries of the suite's one build (dynamic ones bring their libraries), `tap-probe` at
//! the path the integration tests baked in, and the host's `ip`, `tc` and `setpriv` go into
//! the initramfs; the init runs `tap-probe doctor` and then, binary by binary, the tests
//! whose outcome depends on the kernel (see [`crate::suite`]), each under a timeout.
//!
//! One module per job, as `tap-probe-guest` has them: the guest matrix and the command
//! (here), what a guest runs (`payload`), how many run at once (`slots`), the guests side
//! by side (`pool`), what a console says (`console`), and the accelerator's fallback
//! (`fallback`).

mod console;
mod fallback;
mod payload;
mod pool;
mod slots;

use std::path::PathBuf;
use std::time::Duration;

use anyhow::bail;
use tap_probe_guest::{AccelChoice, Kernel, KernelSpec, Series};

use crate::cmd;
use crate::expected::Expected;
use crate::suite::{self, Subset};

pub(crate) use fallback::check_fallback;
pub(crate) use pool::{GuestRun, Options, run_tests};
pub(crate) use slots::Slots;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Kernels to run the tests on, one guest each: `debian-5.10`, `debian-6.1`,
    /// `debian-6.12`, `debian-7.3`, a bzImage or a kernel .deb [default: the matrix `cargo
    /// xtask test` runs: debian-5.10, debian-6.1, debian-6.12 with `cargo xtask seed-tun`'s
    /// tun.ko, debian-7.3].
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
    /// Guests to run at once [default: as many as the host has CPUs; each emulated guest
    /// runs on one host thread].
    #[arg(long)]
    jobs: Option<usize>,
    /// Arguments for every test binary, after `--`: a name filter, `--exact`, `--skip X`.
    #[arg(last = true)]
    passthrough: Vec<String>,
}

/// One guest of a test run: a kernel and the modules that replace its own.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    /// What the summary calls it; for a guest of the matrix, also where its expectations
    /// are kept in `xtask/expected.toml`.
    pub name: String,
    pub kernel: KernelSpec,
    pub modules: Vec<PathBuf>,
    /// With a bzImage: its modules.
    pub modules_dir: Option<PathBuf>,
    /// For some guests of the matrix: the tests it runs, of those that depend on the
    /// kernel (all of them without).
    pub subset: Option<&'static Subset>,
}

/// Runs `cargo xtask vm`.
///
/// # Errors
/// If a kernel cannot be found, the binaries cannot be built, QEMU cannot be run, a guest
/// does not report success, or a run of the whole matrix is not as `expected.toml` says.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let whole_matrix = args.kernels.is_empty();
    let guests = if whole_matrix {
        matrix()?
    } else {
        args.kernels
            .iter()
            .map(|kernel| Guest {
                name: kernel.to_string(),
                kernel: kernel.clone(),
                modules: args.modules.clone(),
                modules_dir: args.modules_dir.clone(),
                subset: None,
            })
            .collect()
    };
    let suite = suite::build()?;
    let slots = Slots::new(args.jobs.unwrap_or_else(Slots::cpus));
    let (ran, result) = run_tests(
        &suite,
        &guests,
        &Options {
            accel: args.accel,
            timeout: Duration::from_secs(args.timeout),
            quiet: args.quiet,
            slots: &slots,
            passthrough: args.passthrough.clone(),
            last: None,
        },
    );
    let ran = ran.guests;
    for guest in &ran {
        println!("{}", guest.report());
    }
    result?;
    // Expectations hold for the whole suite on the matrix; a filter or another kernel only
    // reports.
    let expected = (whole_matrix && args.passthrough.is_empty())
        .then(Expected::load)
        .transpose()?;
    let mut problems = Vec::new();
    for guest in &ran {
        if let Some(expected) = &expected {
            let kernel = expected.of(&guest.name, &guest.release)?;
            for problem in kernel.problems(&guest.said) {
                problems.push(format!("{}: {problem}", guest.name));
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "not as {} expects:\n  {}",
            crate::expected::FILE,
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// The kernels the tests run on in CI: Debian 11's 5.10 (stock, and older than the drop
/// reasons and the programs' miss counts); Debian 12's own 6.1 (stock: tail-drop); 6.12 with
/// the tail-drop fix as posted (v8 4/4 + v9 1/4, built by `cargo xtask seed-tun`: stops the
/// queue, returns BUSY on a lost race); 7.3 with the fix as merged (opt-in per tap with
/// `IFF_BACKPRESSURE`, never BUSY).
///
/// # Errors
/// If the 6.12 module cannot be built.
pub(crate) fn matrix() -> anyhow::Result<Vec<Guest>> {
    let guest = |name: &str, series, modules| Guest {
        name: name.to_owned(),
        kernel: KernelSpec::Debian(series),
        modules,
        modules_dir: None,
        subset: Subset::of(name),
    };
    Ok(vec![
        guest("debian-5.10", Series::Debian5_10, Vec::new()),
        guest("debian-6.1", Series::Debian6_1, Vec::new()),
        guest(
            "debian-6.12+seed-tun",
            Series::Debian6_12,
            vec![crate::seed_tun::build()?],
        ),
        guest("debian-7.3", Series::Debian7_3, Vec::new()),
    ])
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

/// Where a guest's files go.
pub(crate) fn guest_dir(kernel: &Kernel) -> PathBuf {
    cmd::target_dir().join("vm").join(&kernel.release)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

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
