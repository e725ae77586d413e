//! `cargo xtask bench overhead`: what watching costs the traffic it watches, and the
//! traffic it does not.
//!
//! With `--traffic tap` (the default) each round runs `tap-probe load` six ways: (A) with
//! no probe, (F) with the floor (a program of each name the probe has on each hook `watch`
//! attaches, returning at its first instruction: what the hooks cost with nothing in them),
//! (B) with `tap-probe watch` attached, (B1k) the same with 1,000 other taps tracked, (B')
//! with `tap-probe watch --occupancy exact` (every driver call and take samples the ring),
//! (C) with a bpftrace one-liner that counts the same events, in the alternating order of
//! the A/B harness (A, F, B, B1k, B', C, then C, B', ...).
//! With `--traffic other` the traffic is a UDP stream over loopback in a private namespace
//! that the watch does not watch (`stream.rs`), run (A), (F) and (B) ways. Throughput is the
//! traffic's `delivered_pps`; the results are the medians, the ratios to A and to F, and
//! how B's loss compares with C's. A B run is valid only if the watch counted one driver call
//! per packet the load sent (none of the other traffic's).
//!
//! The verdicts are throughput ratios, with what each delivered packet costs by subtraction
//! (`1e9 / B - 1e9 / A` ns). After the rounds, one more run of B (and of B') with
//! `--program-stats` breaks the cost down as the kernel measures it: each program's runs per
//! packet sent and its mean. That accounting adds a clock pair to every run and cannot see
//! the dispatch, so it is a breakdown, never a verdict; with the other traffic it also shows
//! that the programs ran at least once per datagram sent.

use std::fmt;
use std::path::{Path, PathBuf};
use std::time::Duration;

use serde::Serialize;
use serde_json::Value;

use super::ab::{Goal, Results, Schedule, Status};
use super::probed::{self, BPFTRACE_PROGRAM, Probe, THROUGHPUT, Timing, Traffic};
use super::{default_out, runs_dir};

/// Seconds the load waits before sending, so that `tap-probe watch` (which polls for new
/// namespaces every interval) has found the load's tap by then.
const START_DELAY_S: u32 = 2;

/// How long `tap-probe watch` may take to attach.
const WATCH_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// Goal: tap-probe keeps at least this share of the throughput the hooks leave with nothing
/// in them (B/F), watched traffic or not.
const GOAL_MIN_FLOOR_RATIO: f64 = 0.98;

/// Goal: tap-probe loses at most this share of what bpftrace loses.
const GOAL_MAX_LOSS_RATIO: f64 = 1.0 / 3.0;

/// Goal: with 1,000 other taps tracked, tap-probe's ratio to probe-off is within this of
/// its ratio with the load's tap alone: the per-packet cost does not grow with the devices.
const GOAL_MAX_DENSE_DRIFT: f64 = 0.02;

/// The other taps of variant B1k.
const OTHER_TAPS: usize = 1_000;

/// The watch of variant B1k: it refreshes every 10 s, so that its work on the 1,000 devices
/// at each refresh (`cargo xtask bench serve` measures it) does not take a CPU from the load
/// on a 2-CPU machine; the load's tap is counted from its first packet all the same.
const DENSE_WATCH: &[&str] = &["--interval", "10"];

/// The load's start delay in variant B1k: past the watch's first refresh after attach
/// ([`DENSE_WATCH`]'s 10 s), so that a refresh finds the load's tap while it exists. A
/// device that comes and goes between two refreshes is counted but cannot be named any
/// more, and is not shown (its row would be the load's, with its counts); with the
/// default delay the load's tap lived 6 s of the watch's 10.
const DENSE_START_DELAY_S: u32 = 12;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    rounds: super::RoundArgs,
    /// The traffic: `tap`, the load's tap, watched; `other`, traffic the watch does not
    /// watch.
    #[arg(long, value_enum, default_value_t = Traffic::Tap)]
    traffic: Traffic,
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    /// A: no probe.
    ProbeOff,
    /// F: the floor.
    Floor,
    /// B: `tap-probe watch`.
    TapProbe,
    /// B1k: `tap-probe watch` with 1,000 other taps tracked.
    TapProbeDense,
    /// B': `tap-probe watch --occupancy exact`, what sampling the ring per packet costs.
    TapProbeExact,
    /// C: the bpftrace one-liner.
    Bpftrace,
}

impl Variant {
    /// The timing of its runs: B1k's load waits past the watch's first refresh (see
    /// [`DENSE_START_DELAY_S`]).
    fn timing(self, timing: Timing) -> Timing {
        match self {
            Self::TapProbeDense => Timing {
                start_delay: DENSE_START_DELAY_S,
                ..timing
            },
            _ => timing,
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProbeOff => "probe-off",
            Self::Floor => "floor",
            Self::TapProbe => "tap-probe",
            Self::TapProbeDense => "tap-probe-1k-taps",
            Self::TapProbeExact => "tap-probe-occupancy-exact",
            Self::Bpftrace => "bpftrace",
        })
    }
}

#[derive(Debug, Serialize)]
struct Config {
    traffic: Traffic,
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    bpftrace_program: &'static str,
    /// The run with `--program-stats`, after the rounds.
    program_costs: Option<Costs>,
    /// With the tap, one more with `--program-stats --occupancy exact`.
    program_costs_exact: Option<Costs>,
    /// Each probe against the floor.
    above_floor: Vec<AboveFloor>,
}

/// What a variant costs above the hooks' own dispatch.
#[derive(Debug, Serialize)]
struct AboveFloor {
    variant: Variant,
    /// Its median throughput over the floor's (B/F).
    ratio: Option<f64>,
    /// What each packet costs above the floor, by subtraction: `1e9/B - 1e9/F` ns.
    ns_each: Option<f64>,
}

/// What the programs cost in the run with `--program-stats`.
#[derive(Debug, Serialize)]
struct Costs {
    /// The watch's `programs`: runs and mean ns of each.
    programs: Value,
    /// Packets the traffic sent in that run.
    sent: u64,
    /// Program runs per packet sent, all programs together.
    runs_per_packet: Option<f64>,
    /// The kernel's accounting per packet sent: each program's runs times its mean,
    /// summed, over the packets (clock pairs included, dispatch not).
    accounted_ns_per_packet: Option<f64>,
    /// Runs of the most-run program per packet sent: at least 1 when the programs saw
    /// every packet (a stream that bypassed them would make its cost look nil).
    runs_per_sent: Option<f64>,
}

impl Costs {
    #[expect(
        clippy::cast_precision_loss,
        reason = "run counts and ns far below 2^52"
    )]
    fn new(programs: Value, sent: u64) -> Self {
        let each: Vec<(String, u64, u64)> = programs
            .as_array()
            .into_iter()
            .flatten()
            .filter_map(|p| {
                Some((
                    p["program"].as_str()?.to_owned(),
                    p["runs"].as_u64()?,
                    p["mean_ns"].as_u64()?,
                ))
            })
            .collect();
        let runs: u64 = each.iter().map(|&(_, runs, _)| runs).sum();
        let ns: u64 = each.iter().map(|&(_, runs, ns)| runs * ns).sum();
        let most = each.iter().map(|&(_, runs, _)| runs).max().unwrap_or(0);
        let per = |n: u64| (sent > 0).then(|| n as f64 / sent as f64);
        Self {
            programs,
            sent,
            runs_per_packet: per(runs),
            accounted_ns_per_packet: per(ns),
            runs_per_sent: per(most),
        }
    }
}

/// The benchmark's name, as its results are named: `overhead`, or `overhead-other` for
/// `--traffic other`.
fn name(args: &Args) -> &'static str {
    match args.traffic {
        Traffic::Tap => "overhead",
        Traffic::Other => "overhead-other",
    }
}

/// Where the results go: `--out`, or `target/bench/NAME.json`.
pub(crate) fn out(args: &Args) -> PathBuf {
    args.rounds
        .out
        .clone()
        .unwrap_or_else(|| default_out(name(args)))
}

/// Runs `cargo xtask bench overhead` with the release `tap_probe`.
///
/// # Errors
/// If any run fails or is invalid; the results are written first.
pub(crate) fn run(args: &Args, out: &Path, tap_probe: &Path, floor: &Path) -> anyhow::Result<()> {
    let rounds = &args.rounds;
    let name = name(args);
    let dir = runs_dir(out)?;
    let variants = match args.traffic {
        Traffic::Tap => vec![
            Variant::ProbeOff,
            Variant::Floor,
            Variant::TapProbe,
            Variant::TapProbeDense,
            Variant::TapProbeExact,
            Variant::Bpftrace,
        ],
        Traffic::Other => vec![Variant::ProbeOff, Variant::Floor, Variant::TapProbe],
    };
    let schedule = Schedule {
        variants,
        rounds: rounds.pairs,
        warm_up: false,
    };
    let timing = Timing {
        duration: rounds.duration,
        start_delay: START_DELAY_S,
        attach_wait: WATCH_ATTACH_WAIT,
    };
    let runs = super::ab::run_on_host(name, &schedule, |round, variant| {
        let tag = format!("round{:02}-{variant}", round.map_or(0, |r| r + 1));
        let probe = match variant {
            Variant::ProbeOff => Probe::None,
            Variant::Floor => Probe::Floor(floor),
            Variant::TapProbe => Probe::Watch(&[]),
            Variant::TapProbeDense => Probe::Watch(DENSE_WATCH),
            Variant::TapProbeExact => Probe::Watch(&["--occupancy", "exact"]),
            Variant::Bpftrace => Probe::Bpftrace,
        };
        // The other taps exist for their run alone: the other variants' watches do not see
        // them.
        let _others = (variant == Variant::TapProbeDense)
            .then(|| super::OtherTaps::create(OTHER_TAPS))
            .transpose()?;
        let timing = variant.timing(timing);
        probed::run(tap_probe, &tag, probe, args.traffic, timing, &dir)
    })?;
    let program_costs = costs(
        tap_probe,
        "costs-tap-probe",
        &["--program-stats"],
        args,
        timing,
        &dir,
    )?;
    let program_costs_exact = match args.traffic {
        Traffic::Tap => costs(
            tap_probe,
            "costs-tap-probe-occupancy-exact",
            &["--program-stats", "--occupancy", "exact"],
            args,
            timing,
            &dir,
        )?,
        Traffic::Other => None,
    };
    let config = Config {
        traffic: args.traffic,
        pairs: rounds.pairs,
        duration_s: rounds.duration,
        start_delay_s: START_DELAY_S,
        throughput_field: THROUGHPUT,
        bpftrace_program: BPFTRACE_PROGRAM,
        program_costs,
        program_costs_exact,
        above_floor: Vec::new(),
    };
    let measures = probed::measures();
    let mut results = Results::new(name, config, &schedule, runs, &measures, THROUGHPUT);
    let ratio = |v| results.variant(v).and_then(|s| s.ratio);
    let (tap_probe_ratio, bpftrace_ratio) = (ratio(Variant::TapProbe), ratio(Variant::Bpftrace));
    let dense_ratio = ratio(Variant::TapProbeDense);
    let above_floor = above_floor(&results, &schedule.variants);
    let floor_ratio = above_floor
        .iter()
        .find(|a| a.variant == Variant::TapProbe)
        .and_then(|a| a.ratio);
    results.config.above_floor = above_floor;
    print_breakdowns(&results.config);
    let costs = results.config.program_costs.as_ref();
    results.goals = goals(
        args.traffic,
        Ratios {
            tap_probe: tap_probe_ratio,
            floor: floor_ratio,
            dense: dense_ratio,
            bpftrace: bpftrace_ratio,
        },
        costs,
    );
    eprintln!("raw output of every run in {}", dir.display());
    results.finish(&measures, out)
}

/// One more run of tap-probe, with `args` (`--program-stats` among them): what its programs
/// cost, if the run was valid.
fn costs(
    tap_probe: &Path,
    tag: &str,
    watch: &'static [&'static str],
    args: &Args,
    timing: Timing,
    dir: &Path,
) -> anyhow::Result<Option<Costs>> {
    eprintln!(
        "program costs: one more run of tap-probe watch {}",
        watch.join(" ")
    );
    let (status, measured) = probed::run(
        tap_probe,
        tag,
        Probe::Watch(watch),
        args.traffic,
        timing,
        dir,
    )?;
    Ok(match (status, measured.programs, measured.sent) {
        (Status::Valid, Some(programs), Some(sent)) => Some(Costs::new(programs, sent)),
        (status, ..) => {
            eprintln!("the run with --program-stats gave no costs: {status:?}");
            None
        }
    })
}

/// Each probe of `variants` against the floor: its median throughput over the floor's, and
/// what each packet costs above it.
fn above_floor(
    results: &Results<Variant, probed::Measured, Config>,
    variants: &[Variant],
) -> Vec<AboveFloor> {
    let median = |variant| {
        results
            .variant(variant)
            .and_then(|s| s.medians.get(THROUGHPUT).copied())
            .filter(|&m| m > 0.0)
    };
    let above: Vec<AboveFloor> = variants
        .iter()
        .filter(|&&v| !matches!(v, Variant::ProbeOff | Variant::Floor))
        .map(|&variant| {
            let pair = median(variant).zip(median(Variant::Floor));
            AboveFloor {
                variant,
                ratio: pair.map(|(b, f)| b / f),
                ns_each: pair.map(|(b, f)| 1e9 / b - 1e9 / f),
            }
        })
        .collect();
    for a in &above {
        eprintln!(
            "{} against the floor: {}/floor {}, {} ns a packet above it",
            a.variant,
            a.variant,
            a.ratio
                .map_or_else(|| "-".to_owned(), |r| format!("{r:.3}")),
            a.ns_each
                .map_or_else(|| "-".to_owned(), |n| format!("{n:.0}")),
        );
    }
    above
}

/// The kernel's accounting of the runs with `--program-stats`.
fn print_breakdowns(config: &Config) {
    for (what, c) in [
        ("watch", &config.program_costs),
        ("watch --occupancy exact", &config.program_costs_exact),
    ] {
        if let Some(c) = c {
            eprintln!(
                "breakdown of {what}, by the kernel's accounting (clock pairs included, \
                 dispatch not): {:.2} program runs per packet sent, {:.0} ns per packet; \
                 each (runs, mean ns): {}",
                c.runs_per_packet.unwrap_or(0.0),
                c.accounted_ns_per_packet.unwrap_or(0.0),
                c.programs
            );
        }
    }
}

/// The medians' ratios the goals are about: to probe-off (B/A, B1k/A, C/A) and to the
/// floor (B/F).
#[derive(Clone, Copy)]
struct Ratios {
    tap_probe: Option<f64>,
    floor: Option<f64>,
    dense: Option<f64>,
    bpftrace: Option<f64>,
}

/// The goals of `traffic`'s benchmark.
fn goals(traffic: Traffic, ratios: Ratios, costs: Option<&Costs>) -> Vec<Goal> {
    let above_floor = Goal::at_least(
        format!("tap-probe/floor >= {GOAL_MIN_FLOOR_RATIO}"),
        ratios.floor,
        GOAL_MIN_FLOOR_RATIO,
    );
    match traffic {
        Traffic::Tap => {
            let loss_ratio = ratios
                .tap_probe
                .zip(ratios.bpftrace)
                .filter(|&(_, c)| c < 1.0)
                .map(|(b, c)| (1.0 - b) / (1.0 - c));
            let drift = ratios
                .tap_probe
                .zip(ratios.dense)
                .map(|(b, dense)| (b - dense).abs());
            vec![
                above_floor,
                Goal::at_most(
                    format!(
                        "|tap-probe-1k-taps/probe-off - tap-probe/probe-off| <= \
                         {GOAL_MAX_DENSE_DRIFT} (1,000 other taps tracked)"
                    ),
                    drift,
                    GOAL_MAX_DENSE_DRIFT,
                ),
                Goal::at_most(
                    "loss(tap-probe) <= loss(bpftrace)/3, loss(X) = 1 - X/probe-off",
                    loss_ratio,
                    GOAL_MAX_LOSS_RATIO,
                ),
            ]
        }
        Traffic::Other => vec![
            Goal::at_least(
                "the programs ran on every datagram: runs of the most-run program / sent >= 1",
                costs.and_then(|c| c.runs_per_sent),
                1.0,
            ),
            above_floor,
        ],
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::Costs;

    #[test]
    fn costs_are_per_packet_sent_over_every_program() {
        let programs = json!([
            {"program": "net_dev_start_xmit", "runs": 1000, "mean_ns": 50},
            {"program": "net_dev_xmit", "runs": 1000, "mean_ns": 100},
            {"program": "consume_skb", "runs": 900, "mean_ns": 150},
            {"program": "qdisc_dequeue", "runs": 9, "mean_ns": 2000},
        ]);
        let costs = Costs::new(programs, 1000);
        assert_eq!(costs.runs_per_packet, Some(2.909));
        let ns = costs.accounted_ns_per_packet.unwrap();
        let expected = (50_000.0 + 100_000.0 + 135_000.0 + 18_000.0) / 1000.0;
        assert!((ns - expected).abs() < 1e-9, "{ns} != {expected}");
        assert_eq!(costs.runs_per_sent, Some(1.0));
    }

    #[test]
    fn costs_of_nothing_sent_are_not_measured() {
        let costs = Costs::new(json!([]), 0);
        assert_eq!(costs.runs_per_packet, None);
        assert_eq!(costs.accounted_ns_per_packet, None);
        assert_eq!(costs.runs_per_sent, None);
    }
}
