//! Running the guest: choosing an accelerator, starting QEMU, reading its serial console
//! line by line under a deadline, and deciding the outcome from the init's verdict line.

use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, Stdio};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::cmd;

pub const QEMU: &str = "qemu-system-x86_64";

/// The init's last line on success or failure (see `init_script` in `vm.rs`).
pub const SUCCESS: &str = "init: success";
pub const FAILURE: &str = "init: failure";
/// The kernel's panic banner (`panic()` in kernel/panic.c).
const PANIC: &str = "Kernel panic - not syncing";
/// After the verdict, the init powers off; QEMU gets this long to exit by itself.
const POWEROFF_GRACE: Duration = Duration::from_secs(30);
/// How long the KVM probe's QEMU has to fail before KVM counts as working.
const KVM_PROBE: Duration = Duration::from_secs(2);

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// `-cpu host` needs KVM; under TCG `max` enables everything QEMU can emulate.
    fn cpu(self) -> &'static str {
        match self {
            Self::Kvm => "host",
            Self::Tcg => "max",
        }
    }
}

/// Whether QEMU can use KVM, or why not. Opening `/dev/kvm` and the KVM ioctls can all
/// succeed on a machine where QEMU still aborts when it sets up the vCPU (seen here:
/// "failed to set MSR 0x10a"), so the probe is QEMU itself: a paused machine (`-S`) that
/// either dies at once or is still alive after a moment.
///
/// # Errors
/// Why KVM is unusable.
pub fn probe_kvm() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|err| format!("cannot open /dev/kvm: {err}"))?;
    let mut child = Command::new(QEMU)
        .args(["-accel", "kvm", "-cpu", Accel::Kvm.cpu(), "-m", "64", "-S"])
        .args(["-nodefaults", "-display", "none", "-monitor", "none"])
        .args(["-serial", "none", "-no-reboot"])
        .stdin(Stdio::null())
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .map_err(|err| format!("cannot run {QEMU}: {err}"))?;
    let started = Instant::now();
    while started.elapsed() < KVM_PROBE {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            let reason = stderr.lines().next().unwrap_or_default().to_owned();
            return Err(format!("{QEMU} -accel kvm exited ({status}): {reason}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    let _ = child.kill();
    let _ = child.wait();
    Ok(())
}

#[derive(Debug)]
pub struct Config<'a> {
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub append: &'a str,
    pub accel: Accel,
    pub cpus: u32,
    pub memory_mib: u32,
    pub timeout: Duration,
    /// Which console lines to print as they come.
    pub echo: fn(&str) -> bool,
    /// The whole console is also written here.
    pub log: PathBuf,
}

#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Verdict {
    Success,
    /// The init said `init: failure`.
    Failure,
    Panic,
    Timeout,
    /// QEMU exited without a verdict line.
    Silent,
}

#[derive(Debug)]
pub struct Outcome {
    pub verdict: Verdict,
    pub lines: Vec<String>,
    /// From QEMU's start to the init's first line.
    pub boot: Option<Duration>,
    pub elapsed: Duration,
}

/// Boots the guest and follows its console until the verdict, a panic, QEMU's exit or the
/// deadline; QEMU is killed if it outlives that.
///
/// # Errors
/// If QEMU cannot be started or the log cannot be written.
pub fn run(config: &Config<'_>) -> anyhow::Result<Outcome> {
    let mut qemu = Command::new(QEMU);
    qemu.args(["-accel", config.accel.name(), "-cpu", config.accel.cpu()])
        .args(["-smp", &config.cpus.to_string()])
        .args(["-m", &config.memory_mib.to_string()])
        .args(["-nographic", "-no-reboot"])
        .arg("-kernel")
        .arg(config.kernel)
        .arg("-initrd")
        .arg(config.initrd)
        .args(["-append", config.append])
        // With -nographic stdio carries the serial console multiplexed with the monitor;
        // no stdin keeps QEMU from putting a terminal into raw mode.
        .stdin(Stdio::null())
        .stdout(Stdio::piped());
    cmd::echo(&qemu);
    let mut log =
        File::create(&config.log).with_context(|| format!("creating {}", config.log.display()))?;
    let started = Instant::now();
    let mut child = qemu.spawn().with_context(|| {
        format!("could not run {QEMU} (cargo xtask setup installs qemu-system-x86)")
    })?;
    let stdout = child.stdout.take().context("QEMU's stdout")?;
    let (lines_tx, lines_rx) = mpsc::channel();
    let reader = std::thread::spawn(move || {
        let mut reader = BufReader::new(stdout);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = strip_escapes(&String::from_utf8_lossy(&line));
                    let text = text.trim_end_matches(['\n', '\r']).to_owned();
                    if lines_tx.send(text).is_err() {
                        break;
                    }
                }
            }
        }
    });

    let mut lines = Vec::new();
    let mut boot = None;
    let mut verdict = None;
    let mut deadline = started + config.timeout;
    loop {
        let now = Instant::now();
        if now >= deadline {
            break;
        }
        match lines_rx.recv_timeout(deadline - now) {
            Ok(line) => {
                writeln!(log, "{line}")?;
                if (config.echo)(&line) {
                    println!("{line}");
                }
                if boot.is_none() && line.contains("init: ") {
                    boot = Some(started.elapsed());
                }
                let seen = if line.contains(PANIC) {
                    Some(Verdict::Panic)
                } else if line == SUCCESS {
                    Some(Verdict::Success)
                } else if line == FAILURE {
                    Some(Verdict::Failure)
                } else {
                    None
                };
                // The first verdict stands: a panic after `init: success` (at poweroff,
                // say) still fails the run, but nothing turns a failure into a success.
                match (verdict, seen) {
                    (_, Some(Verdict::Panic)) => verdict = Some(Verdict::Panic),
                    (None, Some(seen)) => {
                        verdict = Some(seen);
                        deadline = deadline.min(Instant::now() + POWEROFF_GRACE);
                    }
                    _ => {}
                }
                lines.push(line);
            }
            // QEMU closed its stdout: it is exiting.
            Err(RecvTimeoutError::Disconnected) => break,
            Err(RecvTimeoutError::Timeout) => {}
        }
    }
    // Past the deadline without a verdict, QEMU is killed at once; otherwise it is exiting
    // (or powering off) and gets a moment.
    let grace = if verdict.is_none() && Instant::now() >= deadline {
        Duration::ZERO
    } else {
        Duration::from_secs(5)
    };
    let exited = wait_or_kill(&mut child, grace)?;
    // The reader ends once QEMU's stdout closes, which killing QEMU ensures.
    let _ = reader.join();
    let verdict = match verdict {
        Some(verdict) => verdict,
        None if exited => Verdict::Silent,
        None => Verdict::Timeout,
    };
    Ok(Outcome {
        verdict,
        lines,
        boot,
        elapsed: started.elapsed(),
    })
}

/// `line` without terminal control sequences (the guest's BIOS clears the screen on the serial
/// console, which glues escape codes onto the kernel's first lines).
fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                // CSI (`ESC [ params final`) runs to a byte in @..~; other escapes are
                // `ESC x`.
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

/// Waits up to `grace` for `child` to exit, then kills it. Returns whether it exited by
/// itself.
fn wait_or_kill(child: &mut Child, grace: Duration) -> anyhow::Result<bool> {
    let until = Instant::now() + grace;
    loop {
        if child.try_wait()?.is_some() {
            return Ok(true);
        }
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    eprintln!("xtask vm: killing {QEMU} (pid {})", child.id());
    child.kill().context("killing QEMU")?;
    child.wait().context("waiting for QEMU")?;
    Ok(false)
}

#[cfg(test)]
mod tests {
    use super::strip_escapes;

    #[test]
    fn escapes_are_stripped() {
        assert_eq!(
            strip_escapes("ok\x1bc\x1b[?7l\x1b[2Jinit: kernel 6.1\r\n"),
            "okinit: kernel 6.1\n"
        );
        assert_eq!(strip_escapes("plain"), "plain");
    }
}
