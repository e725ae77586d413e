//! Choosing the accelerator by booting. On machines of this kind `/dev/kvm` may be missing,
//! may make QEMU abort at once, or may start a guest that then hangs in early boot or dies
//! with `KVM internal error` while QEMU keeps it paused. Only a boot tells, so `auto` tries
//! KVM (when QEMU starts with it at all) and, if that guest does not reach its init, runs the
//! same guest again under TCG, which works everywhere. The decision then holds for every
//! later boot of the same [`Launcher`].

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use crate::qemu::{self, Accel, Config, Machine, Outcome, Verdict};

/// Set (to anything) to make the first boot of a [`Launcher`] use a CPU model the guest
/// kernel refuses (no long mode), so the fallback to TCG can be exercised on any machine.
pub const BREAK_FIRST_BOOT_ENV: &str = "TAP_PROBE_VM_BREAK_FIRST_BOOT";

/// Which accelerator to use.
#[derive(Debug, Clone, Copy, PartialEq, Eq, clap::ValueEnum)]
pub enum AccelChoice {
    /// KVM if a guest boots under it here, else TCG (decided by the first boot).
    Auto,
    Kvm,
    Tcg,
}

/// Boots guests, keeping the accelerator decision across boots.
#[derive(Debug)]
pub struct Launcher {
    choice: AccelChoice,
    /// `auto`'s decision, once a boot made it.
    decided: Option<Accel>,
    /// The next boot uses a CPU model the kernel refuses ([`BREAK_FIRST_BOOT_ENV`]).
    break_next: bool,
    /// Prefix of the lines this prints on stderr (`tap-probe vm`, `xtask vm`).
    name: &'static str,
    /// Set when the host wants the guest stopped (a signal): QEMU is killed.
    stop: Option<Arc<AtomicBool>>,
}

/// A guest that has run.
#[derive(Debug)]
pub struct Booted {
    pub outcome: Outcome,
    /// The accelerator of the run that counts.
    pub accel: Accel,
    /// Why an earlier attempt under another accelerator was abandoned, and how long it took.
    pub fallback: Option<(String, Duration)>,
}

impl Booted {
    /// Where the guest's time went, for a closing line.
    #[must_use]
    pub fn times(&self) -> String {
        let fallback = self
            .fallback
            .as_ref()
            .map_or_else(String::new, |(_, took)| {
                format!(" after a failed KVM attempt of {:.1} s", took.as_secs_f64())
            });
        format!(
            "boot to init {}, guest total {:.1} s ({}{fallback})",
            self.outcome.boot.map_or_else(
                || "-".to_owned(),
                |boot| format!("{:.1} s", boot.as_secs_f64())
            ),
            self.outcome.elapsed.as_secs_f64(),
            self.accel.name(),
        )
    }
}

impl Launcher {
    #[must_use]
    pub fn new(choice: AccelChoice, name: &'static str) -> Self {
        Self {
            choice,
            decided: None,
            break_next: std::env::var_os(BREAK_FIRST_BOOT_ENV).is_some(),
            name,
            stop: None,
        }
    }

    /// Stops every guest of this launcher, QEMU killed, once `stop` is set.
    #[must_use]
    pub fn stop_on(self, stop: Arc<AtomicBool>) -> Self {
        Self {
            stop: Some(stop),
            ..self
        }
    }

    /// Makes the next boot use a CPU model the kernel refuses, as [`BREAK_FIRST_BOOT_ENV`]
    /// does for the first.
    pub fn break_next_boot(&mut self) {
        self.break_next = true;
    }

    /// The accelerator the next boot starts with.
    fn first_try(&mut self) -> anyhow::Result<Accel> {
        Ok(match (self.choice, self.decided) {
            (AccelChoice::Tcg, _) => Accel::Tcg,
            (AccelChoice::Kvm, _) => {
                qemu::probe_kvm().map_err(|reason| anyhow::anyhow!("--accel kvm: {reason}"))?;
                Accel::Kvm
            }
            (AccelChoice::Auto, Some(accel)) => accel,
            (AccelChoice::Auto, None) => match qemu::probe_kvm() {
                Ok(()) => Accel::Kvm,
                Err(reason) => {
                    eprintln!("{}: KVM unusable, emulating (TCG): {reason}", self.name);
                    self.decided = Some(Accel::Tcg);
                    Accel::Tcg
                }
            },
        })
    }

    /// Boots the guest `config` describes and follows it to its verdict; under `auto`, a
    /// guest that does not boot under KVM runs again under TCG.
    ///
    /// # Errors
    /// If QEMU cannot be run, or `--accel kvm` was asked for and QEMU cannot start with it.
    pub fn boot(&mut self, config: &mut Config<'_>) -> anyhow::Result<Booted> {
        let accel = self.first_try()?;
        let broken = std::mem::take(&mut self.break_next);
        let mut machine = Machine::of(accel);
        if broken {
            // x86-64 kernels refuse a CPU without long mode in their boot stub.
            machine.cpu.push_str(",lm=off");
            eprintln!(
                "{}: {BREAK_FIRST_BOOT_ENV} is set: this boot uses CPU model `{}`",
                self.name, machine.cpu
            );
        }
        let first = qemu::run(config, &machine, self.stop.as_deref())?;
        let retry = self.choice == AccelChoice::Auto
            && first.verdict.is_boot_failure()
            && (accel == Accel::Kvm || broken);
        if !retry {
            if self.choice == AccelChoice::Auto && first.boot.is_some() {
                self.decided.get_or_insert(accel);
            }
            return Ok(Booted {
                outcome: first,
                accel,
                fallback: None,
            });
        }
        let why = describe(&first.verdict);
        let tail = first.tail(8);
        eprintln!(
            "{}: the guest did not boot under {}: {why}; running it again under TCG, which \
             the rest of this run keeps using. {}",
            self.name,
            accel.name(),
            if tail.is_empty() {
                "It printed nothing."
            } else {
                "Its last lines:"
            }
        );
        for line in tail {
            eprintln!("    {line}");
        }
        self.decided = Some(Accel::Tcg);
        let outcome = qemu::run(config, &Machine::of(Accel::Tcg), self.stop.as_deref())?;
        Ok(Booted {
            outcome,
            accel: Accel::Tcg,
            fallback: Some((why, first.elapsed)),
        })
    }
}

/// A verdict in words, for messages.
#[must_use]
pub fn describe(verdict: &Verdict) -> String {
    match verdict {
        Verdict::Success => "the init reported success".to_owned(),
        Verdict::Failure(None) => "the guest reported failure".to_owned(),
        Verdict::Failure(Some(code)) => format!("the guest reported failure (exit {code})"),
        Verdict::Panic => "the guest kernel panicked".to_owned(),
        Verdict::Oops => "the guest kernel oopsed".to_owned(),
        Verdict::Kvm(line) => format!("KVM could not run it ({line})"),
        Verdict::NoBoot(why) => why.clone(),
        Verdict::Timeout => "no verdict within the timeout; QEMU was killed".to_owned(),
        Verdict::Silent => "QEMU exited without the init's verdict".to_owned(),
        Verdict::Interrupted => {
            "stopped on the host before the guest's verdict; QEMU was killed".to_owned()
        }
    }
}
