//! `cargo xtask bench overhead`: what watching costs the traffic it watches.
//!
//! Each round runs `tap-probe load` three ways: (A) with no probe, (B) with
//! `tap-probe watch` attached, (C) with a bpftrace one-liner that counts the same events,
//! in the alternating order of the A/B harness (A, B, C, then C, B, A). Throughput is the
//! load's `delivered_pps`; the results are the medians, the ratios B/A and C/A, and how B's
//! loss compares with C's. A B run is valid only if the watch counted one driver call per
//! packet the load sent.

use std::fmt;
use std::path::Path;
use std::time::Duration;

use serde::Serialize;

use super::ab::{Goal, Results, Schedule};
use super::probed::{self, BPFTRACE_PROGRAM, Probe, THROUGHPUT, Timing};
use super::{default_out, runs_dir};

/// Seconds the load waits before sending, so that `tap-probe watch` (which polls for new
/// namespaces every interval) has found the load's tap by then.
const START_DELAY_S: u32 = 2;

/// How long `tap-probe watch` may take to attach.
const WATCH_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// Goal: tap-probe keeps at least this share of the unprobed throughput.
const GOAL_MIN_RATIO: f64 = 0.97;

/// Goal: tap-probe loses at most this share of what bpftrace loses.
const GOAL_MAX_LOSS_RATIO: f64 = 1.0 / 3.0;

/// `--pairs`, `--duration`, `--out`, as every host A/B benchmark takes them.
pub(crate) type Args = super::RoundArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    /// A: no probe.
    ProbeOff,
    /// B: `tap-probe watch`.
    TapProbe,
    /// C: the bpftrace one-liner.
    Bpftrace,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProbeOff => "probe-off",
            Self::TapProbe => "tap-probe",
            Self::Bpftrace => "bpftrace",
        })
    }
}

#[derive(Debug, Serialize)]
struct Config {
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    bpftrace_program: &'static str,
}

/// Runs `cargo xtask bench overhead` with the release `tap_probe`.
///
/// # Errors
/// If any run fails or is invalid; the results are written first.
pub(crate) fn run(args: &Args, tap_probe: &Path) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| default_out("overhead"));
    let dir = runs_dir(&out)?;
    let schedule = Schedule {
        variants: vec![Variant::ProbeOff, Variant::TapProbe, Variant::Bpftrace],
        rounds: args.pairs,
        warm_up: false,
    };
    let runs = super::ab::run_on_host("overhead", &schedule, |round, variant| {
        let tag = format!("round{:02}-{variant}", round.map_or(0, |r| r + 1));
        let probe = match variant {
            Variant::ProbeOff => Probe::None,
            Variant::TapProbe => Probe::Watch(None),
            Variant::Bpftrace => Probe::Bpftrace,
        };
        let timing = Timing {
            duration: args.duration,
            start_delay: START_DELAY_S,
            attach_wait: WATCH_ATTACH_WAIT,
        };
        probed::run(tap_probe, &tag, probe, timing, &dir)
    })?;
    let config = Config {
        pairs: args.pairs,
        duration_s: args.duration,
        start_delay_s: START_DELAY_S,
        throughput_field: THROUGHPUT,
        bpftrace_program: BPFTRACE_PROGRAM,
    };
    let measures = probed::measures();
    let mut results = Results::new("overhead", config, &schedule, runs, &measures, THROUGHPUT);
    let ratio = |v| results.variant(v).and_then(|s| s.ratio);
    let (tap_probe_ratio, bpftrace_ratio) = (ratio(Variant::TapProbe), ratio(Variant::Bpftrace));
    let loss_ratio = tap_probe_ratio
        .zip(bpftrace_ratio)
        .filter(|&(_, c)| c < 1.0)
        .map(|(b, c)| (1.0 - b) / (1.0 - c));
    results.goals = vec![
        Goal::at_least(
            format!("tap-probe/probe-off >= {GOAL_MIN_RATIO}"),
            tap_probe_ratio,
            GOAL_MIN_RATIO,
        ),
        Goal::at_most(
            "loss(tap-probe) <= loss(bpftrace)/3, loss(X) = 1 - X/probe-off",
            loss_ratio,
            GOAL_MAX_LOSS_RATIO,
        ),
    ];
    eprintln!("raw output of every run in {}", dir.display());
    results.finish(&measures, &out)
}
