//! The path machines with a half-working KVM take, exercised on every machine: a first boot
//! broken on purpose, the fall back to TCG, and a second boot that passes.

use std::time::Duration;

use anyhow::bail;
use tap_probe_guest::{AccelChoice, Image, Launcher, Verdict, launch};

use super::{Guest, prepare};
use crate::cmd;

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
