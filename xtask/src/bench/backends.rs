//! `cargo xtask bench backends`: what each probe backend costs per packet.
//!
//! The backends differ in the kernel hooks they attach to: kprobes on the drivers'
//! functions, the `net`/`skb` tracepoints, or `auto`'s pick per counter. This
//! host's kernel has no kprobes, so the comparison runs in a guest (Debian's 7.3 by
//! default, whose kernel runs both kprobes and every tracepoint tap-probe uses), booted once:
//! xtask itself runs there (`bench-guest backends`), schedules the same A/B harness as the
//! host benchmarks (an unmeasured warm-up round, then rounds in alternating order) and runs
//! `tap-probe load` with no probe and with `tap-probe watch --backend X` for each backend,
//! exactly as `bench overhead` runs its watch. Its runs come back as JSON over the guest's
//! standard output; the host summarises them: medians, ratios to probe-off, losses, the
//! nanoseconds each backend adds per packet, and the goal.
//!
//! A backend whose watch cannot attach on the guest's kernel (tracepoint on 6.1, whose
//! `consume_skb` has no location) is reported unavailable with the watch's own error. Under emulation (TCG)
//! absolute rates are far below a real machine's; the ratios are what the bench is for.

use std::fmt;
use std::path::{Path, PathBuf};
use std::str::FromStr;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use tap_probe_guest::image::STDOUT_TTY;
use tap_probe_guest::{AccelChoice, Image, KernelSpec, Launcher, Verdict, launch};

use super::ab::{Goal, Measure, Results, Run, Schedule, Status};
use super::probed::{self, Measured, Probe, THROUGHPUT, Timing, Traffic};
use super::{default_out, runs_dir};
use crate::{cmd, vm};

/// Seconds the load waits before sending: the watch finds the load's tap at its next
/// refresh (every half second), which takes longer in an emulated guest.
const START_DELAY_S: u32 = 3;

/// How long a watch may take to attach in the guest: parsing the kernel's BTF takes seconds
/// under emulation.
const ATTACH_WAIT: Duration = Duration::from_mins(2);

/// Seconds of traffic per run in the warm-up round (at most `--duration`).
const WARM_UP_S: u32 = 5;

/// Host timeout allowance per run beyond its traffic (start delay, attach, stop) and for
/// the boot and power-off.
const PER_RUN_ALLOWANCE_S: u64 = 180;
const BOOT_ALLOWANCE_S: u64 = 300;

/// Goal: the tracepoint backend loses at most this share of what kprobe loses (a raw
/// tracepoint costs about 5 ns an event, a kprobe about 18, by the kernel's trigger bench).
const GOAL_MAX_LOSS_RATIO: f64 = 0.5;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rounds; each runs every variant once.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(3..=50))]
    rounds: u32,
    /// Seconds of traffic per run (with the defaults the guest runs about 15 minutes under
    /// TCG).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=600))]
    duration: u32,
    /// The guest's kernel (`debian-6.1` has no `consume_skb` location, so its tracepoint
    /// backend is unavailable).
    #[arg(long, default_value = "debian-7.3")]
    kernel: KernelSpec,
    /// Where to write the JSON results [default: target/bench/backends.json].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// What the guest side takes.
#[derive(Debug, clap::Args)]
pub(crate) struct GuestArgs {
    #[arg(long)]
    rounds: u32,
    #[arg(long)]
    duration: u32,
    /// Where each run's raw output goes in the guest.
    #[arg(long)]
    dir: PathBuf,
    #[arg(long)]
    tap_probe: PathBuf,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    ProbeOff,
    Kprobe,
    Auto,
    Tracepoint,
}

impl Variant {
    /// The forward order; probe-off is the baseline.
    const ALL: [Self; 4] = [Self::ProbeOff, Self::Kprobe, Self::Auto, Self::Tracepoint];

    /// The probe of its runs: none for probe-off, else a watch with its `--backend`.
    fn probe(self) -> Probe<'static> {
        match self {
            Self::ProbeOff => Probe::None,
            Self::Kprobe => Probe::Watch(&["--backend", "kprobe"]),
            Self::Auto => Probe::Watch(&["--backend", "auto"]),
            Self::Tracepoint => Probe::Watch(&["--backend", "tracepoint"]),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProbeOff => "probe-off",
            Self::Kprobe => "kprobe",
            Self::Auto => "auto",
            Self::Tracepoint => "tracepoint",
        })
    }
}

impl FromStr for Variant {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        Self::ALL
            .into_iter()
            .find(|variant| variant.to_string() == text)
            .ok_or_else(|| format!("unknown variant {text}"))
    }
}

fn schedule(rounds: u32) -> Schedule<Variant> {
    Schedule {
        variants: Variant::ALL.to_vec(),
        rounds,
        warm_up: true,
    }
}

#[derive(Debug, Serialize)]
struct Config {
    rounds: u32,
    duration_s: u32,
    warm_up_duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    guest_kernel: String,
    accel: &'static str,
    guest_elapsed_s: f64,
}

/// Nanoseconds of the sender's wall clock per packet: what a probe adds shows as the
/// difference to probe-off's.
#[expect(
    clippy::cast_precision_loss,
    reason = "packet counts far below 2^52, as numbers for the table"
)]
fn measures() -> Vec<Measure<Measured>> {
    let mut measures: Vec<Measure<Measured>> = probed::measures().into();
    measures.push(Measure {
        name: "ns_per_packet",
        value: |m| {
            m.elapsed_s
                .zip(m.sent)
                .filter(|&(_, sent)| sent > 0)
                .map(|(elapsed, sent)| elapsed * 1e9 / sent as f64)
        },
        digits: 0,
    });
    measures
}

/// Where the results go: `--out`, or `target/bench/backends.json`.
pub(crate) fn out(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| default_out("backends"))
}

/// Runs `cargo xtask bench backends`: builds tap-probe, boots the guest with this xtask in
/// it, and summarises what the guest measured.
///
/// # Errors
/// If the build or the guest fails, or any run fails or counts wrong; the results are
/// written first.
pub(crate) fn run(args: &Args, out: &Path) -> anyhow::Result<()> {
    let started = Instant::now();
    let dir = runs_dir(out)?;
    let tap_probe = cmd::build_release_bin("tap-probe", "tap-probe")?;
    let xtask = std::env::current_exe().context("finding xtask's own executable")?;
    let (kernel, modules) = vm::prepare(&vm::Guest {
        name: args.kernel.to_string(),
        kernel: args.kernel.clone(),
        modules: Vec::new(),
        modules_dir: None,
        subset: None,
    })?;
    let runs = Variant::ALL.len() as u64 * u64::from(args.rounds + 1);
    let timeout = BOOT_ALLOWANCE_S + runs * (u64::from(args.duration) + PER_RUN_ALLOWANCE_S);
    let mut image = Image::new(&kernel.release, modules, &dir.join("scratch"))?;
    image.executable("/bin/tap-probe", &tap_probe)?;
    image.executable("/bin/xtask", &xtask)?;
    // Commands xtask runs start in the workspace root.
    let root = cmd::workspace_root();
    image.dir(root.to_str().context("the workspace path is not UTF-8")?);
    image.script(&format!(
        "/bin/xtask bench-guest backends --rounds {} --duration {} --dir /tmp/bench \
         --tap-probe /bin/tap-probe > {STDOUT_TTY}\nstatus=$?\n",
        args.rounds, args.duration
    ));
    eprintln!(
        "==> bench backends: {} rounds of {} s runs in a guest on {} (timeout {timeout} s)",
        args.rounds, args.duration, kernel.release
    );
    let mut echo = |line: &str| println!("{line}");
    let ran = tap_probe_guest::boot(
        &mut Launcher::new(AccelChoice::Auto, "xtask bench"),
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 2048,
            timeout: Duration::from_secs(timeout),
            echo: &mut echo,
            stdout: None,
            collect_into: None,
        },
    )?;
    let booted = &ran.booted;
    if booted.outcome.verdict != Verdict::Success {
        bail!(
            "the guest failed: {} (console log {})",
            launch::describe(&booted.outcome.verdict),
            ran.log.display()
        );
    }
    let stdout = dir.join("stdout");
    let runs: Vec<Run<Variant, Measured>> = serde_json::from_slice(
        &std::fs::read(&stdout).with_context(|| format!("reading {}", stdout.display()))?,
    )
    .with_context(|| format!("the guest's runs in {}", stdout.display()))?;
    let config = Config {
        rounds: args.rounds,
        duration_s: args.duration,
        warm_up_duration_s: args.duration.min(WARM_UP_S),
        start_delay_s: START_DELAY_S,
        throughput_field: THROUGHPUT,
        guest_kernel: kernel.release.clone(),
        accel: booted.accel.name(),
        guest_elapsed_s: booted.outcome.elapsed.as_secs_f64(),
    };
    let measures = measures();
    let mut results = Results::new(
        "backends",
        config,
        &schedule(args.rounds),
        runs,
        &measures,
        THROUGHPUT,
    );
    results.goals = vec![goal(&results)];
    eprintln!(
        "xtask bench backends: console log {}; {}, all {:.1} s",
        ran.log.display(),
        booted.times(),
        started.elapsed().as_secs_f64()
    );
    results.finish(&measures, out)
}

/// The tracepoint backend's loss at most half of kprobe's; not measurable when either is
/// unavailable.
fn goal(results: &Results<Variant, Measured, Config>) -> Goal {
    let loss = |variant| results.variant(variant).and_then(|v| v.loss);
    let value = loss(Variant::Tracepoint)
        .zip(loss(Variant::Kprobe))
        .filter(|&(_, kprobe)| kprobe > 0.0)
        .map(|(tracepoint, kprobe)| tracepoint / kprobe);
    Goal::at_most(
        "loss(tracepoint) <= loss(kprobe)/2, loss(X) = 1 - X/probe-off",
        value,
        GOAL_MAX_LOSS_RATIO,
    )
}

/// The guest side: every run of the schedule, in order, printed as one JSON array on
/// stdout. A backend found unavailable in one run is not tried again.
///
/// # Errors
/// If a run fails to run at all.
pub(crate) fn guest(args: &GuestArgs) -> anyhow::Result<()> {
    std::fs::create_dir_all(&args.dir)
        .with_context(|| format!("creating {}", args.dir.display()))?;
    let schedule = schedule(args.rounds);
    let mut unavailable: Vec<(Variant, String)> = Vec::new();
    let mut runs = Vec::new();
    for (round, variant) in schedule.runs() {
        if let Some((_, why)) = unavailable.iter().find(|(v, _)| *v == variant) {
            runs.push(Run {
                round,
                variant,
                status: Status::Unavailable(why.clone()),
                data: Measured::default(),
            });
            continue;
        }
        let label = round.map_or_else(|| "warm-up".to_owned(), |r| format!("round {}", r + 1));
        eprintln!("init: bench {label}: {variant}");
        let timing = Timing {
            duration: if round.is_none() {
                args.duration.min(WARM_UP_S)
            } else {
                args.duration
            },
            start_delay: START_DELAY_S,
            attach_wait: ATTACH_WAIT,
        };
        let tag = format!("{label}-{variant}").replace(' ', "");
        let (status, data) = match probed::run(
            &args.tap_probe,
            &tag,
            variant.probe(),
            Traffic::Tap,
            timing,
            &args.dir,
        ) {
            Ok(run) => run,
            Err(err) => (Status::Failed(format!("{err:#}")), Measured::default()),
        };
        if let Status::Unavailable(why) = &status {
            unavailable.push((variant, why.clone()));
        }
        runs.push(Run {
            round,
            variant,
            status,
            data,
        });
    }
    println!("{}", serde_json::to_string(&runs)?);
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn variants_name_their_backend() {
        assert_eq!(Variant::ProbeOff.to_string(), "probe-off");
        assert_eq!("tracepoint".parse::<Variant>(), Ok(Variant::Tracepoint));
        assert!("x".parse::<Variant>().is_err());
    }

    #[test]
    fn runs_round_trip_through_json() {
        let runs = vec![Run {
            round: Some(0),
            variant: Variant::Kprobe,
            status: super::Status::Unavailable("no kprobes".to_owned()),
            data: Measured::default(),
        }];
        let text = serde_json::to_string(&runs).expect("serialises");
        let back: Vec<Run<Variant, Measured>> = serde_json::from_str(&text).expect("parses");
        assert_eq!(back[0].variant, Variant::Kprobe);
        assert_eq!(
            back[0].status,
            super::Status::Unavailable("no kprobes".to_owned())
        );
    }
}
