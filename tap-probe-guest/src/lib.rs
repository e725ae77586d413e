//! Booting a Linux guest under QEMU and reading its verdict: the one guest machinery behind
//! `tap-probe vm`, the test suite's guest runs and the benchmarks that run in a guest.
//!
//! Modelled on aya's VM runner (aya-rs/aya `xtask/src/run.rs`, `test-distro/src/init.rs`):
//! the payload's executables in a newc initramfs written here, a busybox init that mounts
//! what tap-probe needs, loads the modules, runs the payload and prints exactly one
//! `init: success` / `init: failure (exit N)` line before powering off, and a host side that
//! follows the serial console under a boot deadline and a timeout, classifies what it
//! prints (panic, oops, KVM errors) and decides the accelerator by booting.
//!
//! The steps: [`kernel::resolve`] finds a kernel (a Debian series fetched into the cache, a
//! package, or a build), [`image::Image`] lays out the root filesystem, and [`boot`] writes it
//! and runs it through a [`launch::Launcher`], which keeps its accelerator decision across
//! boots.

pub mod apt;
pub mod cmd;
pub mod console;
pub mod elf;
pub mod image;
pub mod kernel;
pub mod launch;
pub mod qemu;

mod initramfs;
mod owned;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::Duration;

use anyhow::{Context as _, bail};

pub use image::Image;
pub use kernel::{Kernel, KernelSpec, Module, Series};
pub use launch::{AccelChoice, Booted, Launcher};
pub use qemu::{Outcome, Sink, Verdict};

/// Modules a guest loads where its kernel builds them as modules: the devices tap-probe
/// measures (macvtap too, which it watches on request), vhost-net (a tap's in-kernel reader) and the qdiscs tap-probe's scenarios and
/// tests put in front of them. Their dependencies (`vhost`, `vhost_iotlb`, ...) come along;
/// those built into the kernel are skipped, and those a kernel lacks are reported.
pub const MODULES: &[&str] = &[
    "tun",
    "tap",
    "veth",
    "macvtap",
    "vhost_net",
    "sch_fq_codel",
    "sch_tbf",
    "sch_htb",
    "sch_ingress",
    "sch_netem",
];

/// Where downloaded kernels and apt's private state are kept: `$XDG_CACHE_HOME/tap-probe`,
/// else `~/.cache/tap-probe`; never inside a checkout.
///
/// # Errors
/// If neither variable is set.
pub fn cache_dir() -> anyhow::Result<PathBuf> {
    if let Some(dir) = std::env::var_os("XDG_CACHE_HOME").filter(|dir| !dir.is_empty()) {
        return Ok(PathBuf::from(dir).join("tap-probe"));
    }
    let home = std::env::var_os("HOME")
        .filter(|home| !home.is_empty())
        .context("neither XDG_CACHE_HOME nor HOME is set: no place for the kernel cache")?;
    Ok(PathBuf::from(home).join(".cache/tap-probe"))
}

/// One guest run.
pub struct Boot<'a> {
    pub kernel: &'a Kernel,
    /// Its root filesystem.
    pub image: Image,
    /// Where the initramfs, the console log and the serial ports' files go.
    pub dir: &'a Path,
    pub cpus: u32,
    pub memory_mib: u32,
    /// The guest must give its verdict by then; QEMU is killed otherwise.
    pub timeout: Duration,
    /// Called with every console line as it comes (all are kept in the outcome and logged).
    pub echo: &'a mut dyn FnMut(&str),
    /// Where the payload's standard output ([`image::STDOUT_TTY`]) goes as it comes.
    pub stdout: Option<Sink>,
    /// Where the directory the image collects ([`Image::collect`]) is unpacked afterwards.
    pub collect_into: Option<&'a Path>,
}

/// A guest that ran, with where its console was logged.
#[derive(Debug)]
pub struct Ran {
    pub booted: Booted,
    pub log: PathBuf,
    /// The initramfs's size in bytes.
    pub image_bytes: u64,
}

/// Writes the image and boots it through `launcher`; the guest's verdict is in the result,
/// not an error.
///
/// # Errors
/// If the image cannot be written, QEMU cannot be run, or the collected directory cannot be
/// unpacked.
pub fn boot(launcher: &mut Launcher, boot: Boot<'_>) -> anyhow::Result<Ran> {
    let dir = boot.dir;
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    let initrd = dir.join("initramfs.cpio");
    let image_bytes = boot.image.write(&initrd)?;
    let log = dir.join("console.log");
    let stdout_file = dir.join("stdout");
    let out_tar = dir.join("out.tar");
    let mut config = qemu::Config {
        program: Path::new(qemu::QEMU),
        kernel: &boot.kernel.vmlinuz,
        initrd: &initrd,
        // panic=-1: reboot at once on a panic, which -no-reboot turns into QEMU exiting.
        // loglevel=4: warnings and worse reach the console (an oops, a WARN from the code
        // under test), boot chatter does not. edd=off: no BIOS disk probing, nothing to probe.
        // earlyprintk: the boot stub writes to the serial port too, so that its refusal of
        // the CPU (arch/x86/boot/cpu.c) reaches the console at once instead of the boot
        // deadline running out on a silent guest.
        append: "console=ttyS0 earlyprintk=serial,ttyS0,115200 panic=-1 loglevel=4 edd=off",
        cpus: boot.cpus,
        memory_mib: boot.memory_mib,
        timeout: boot.timeout,
        echo: boot.echo,
        log: &log,
        serials: vec![
            qemu::Serial {
                path: stdout_file,
                sink: boot.stdout,
            },
            qemu::Serial {
                path: out_tar.clone(),
                sink: None,
            },
        ],
    };
    let booted = launcher.boot(&mut config)?;
    // A guest stopped midway may have sent half an archive.
    if let Some(into) = boot.collect_into
        && booted.outcome.verdict != Verdict::Interrupted
    {
        unpack_collected(&out_tar, into)?;
    }
    Ok(Ran {
        booted,
        log,
        image_bytes,
    })
}

/// Unpacks the tar archive the guest sent back, if it sent one.
fn unpack_collected(tar: &Path, into: &Path) -> anyhow::Result<()> {
    if std::fs::metadata(tar).map_or(0, |meta| meta.len()) == 0 {
        return Ok(());
    }
    std::fs::create_dir_all(into).with_context(|| format!("creating {}", into.display()))?;
    let output = Command::new("tar")
        .arg("-x")
        .arg("-f")
        .arg(tar)
        .arg("-C")
        .arg(into)
        .output()
        .context("running tar")?;
    if !output.status.success() {
        bail!(
            "unpacking the guest's files into {} failed: {}",
            into.display(),
            String::from_utf8_lossy(&output.stderr).trim()
        );
    }
    Ok(())
}
