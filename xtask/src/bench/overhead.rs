//! `cargo xtask bench overhead`: what watching costs the traffic it watches.
//!
//! Each round runs `tap-probe load` three ways: (A) with no probe, (B) with
//! `tap-probe watch` attached, (C) with a bpftrace one-liner that counts the same events,
//! in the alternating order of the A/B harness (A, B, C, then C, B, A). Throughput is the
//! load's `delivered_pps`; the results are the medians, the ratios B/A and C/A, and how B's
//! loss compares with C's. A B run is valid only if the watch counted one driver call per
//! packet the load sent.

use std::fmt;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;

use super::ab::{Goal, Measure, Results, Schedule, Status};
use super::{
    Proc, WATCH_LOAD_ARGS, create, default_out, load, number, runs_dir, watched_xmit_calls,
};
use crate::cmd;

/// Seconds the load waits before sending, so that `tap-probe watch` (which polls for new
/// namespaces every interval) has found the load's tap by then.
const START_DELAY_S: u32 = 2;

/// The events tap-probe's host backend counts, counted the simplest way bpftrace can.
const BPFTRACE_PROGRAM: &str = "tracepoint:net:net_dev_start_xmit, tracepoint:net:net_dev_xmit, \
     tracepoint:skb:kfree_skb, tracepoint:skb:consume_skb, tracepoint:qdisc:qdisc_dequeue \
     { @[probe] = count(); }";

/// How long bpftrace gets to print "Attaching" before the load starts anyway.
const BPFTRACE_ATTACH_WAIT: Duration = Duration::from_secs(10);
/// How long `tap-probe watch` may take to attach.
const WATCH_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// The load's report field read as throughput.
const THROUGHPUT: &str = "delivered_pps";

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

/// What one run measured.
#[derive(Debug, Serialize)]
struct Measured {
    delivered_pps: Option<f64>,
    sender_pps: Option<f64>,
    sent: Option<u64>,
    elapsed_s: Option<f64>,
    /// B only: driver calls the watch counted on the load's tap.
    xmit_calls: Option<u64>,
    /// The load's whole report.
    report: Value,
}

#[derive(Debug, Serialize)]
struct Config {
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    bpftrace_program: &'static str,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "packet counts far below 2^52, as numbers for the table"
)]
fn measures() -> [Measure<Measured>; 5] {
    [
        Measure {
            name: THROUGHPUT,
            value: |m| m.delivered_pps,
            digits: 0,
        },
        Measure {
            name: "sender_pps",
            value: |m| m.sender_pps,
            digits: 0,
        },
        Measure {
            name: "sent",
            value: |m| m.sent.map(|n| n as f64),
            digits: 0,
        },
        Measure {
            name: "xmit_calls",
            value: |m| m.xmit_calls.map(|n| n as f64),
            digits: 0,
        },
        Measure {
            name: "elapsed_s",
            value: |m| m.elapsed_s,
            digits: 2,
        },
    ]
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
        run_once(tap_probe, &tag, variant, args.duration, &dir)
    })?;
    let config = Config {
        pairs: args.pairs,
        duration_s: args.duration,
        start_delay_s: START_DELAY_S,
        throughput_field: THROUGHPUT,
        bpftrace_program: BPFTRACE_PROGRAM,
    };
    let measures = measures();
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

fn run_once(
    tap_probe: &Path,
    tag: &str,
    variant: Variant,
    duration: u32,
    dir: &Path,
) -> anyhow::Result<(Status, Measured)> {
    let watch_out = dir.join(format!("{tag}-watch.jsonl"));
    let observer = match variant {
        Variant::ProbeOff => None,
        Variant::TapProbe => Some(Observer::watch(tap_probe, &watch_out)?),
        Variant::Bpftrace => Some(Observer::bpftrace(
            &dir.join(format!("{tag}-bpftrace.txt")),
        )?),
    };
    let report = load(tap_probe, dir, tag, duration, START_DELAY_S)?;
    if let Some(observer) = observer {
        observer.stop()?;
    }
    let sent = report.get("sent").and_then(Value::as_u64);
    let xmit_calls = (variant == Variant::TapProbe)
        .then(|| counted_xmit_calls(&watch_out))
        .transpose()?;
    let status = match (number(&report, THROUGHPUT), sent, xmit_calls) {
        (None, _, _) | (_, None, _) => {
            Status::Failed(format!("the load's report has no `{THROUGHPUT}` or `sent`"))
        }
        // A probe that counted less than it should would look cheaper than it is.
        (_, Some(sent), Some(counted)) if counted != sent => Status::Invalid(format!(
            "tap-probe watch counted {counted} driver calls on the load's tap, the load sent \
             {sent}: the probe did not watch the whole run ({})",
            watch_out.display()
        )),
        _ => Status::Valid,
    };
    Ok((
        status,
        Measured {
            delivered_pps: number(&report, THROUGHPUT),
            sender_pps: number(&report, "sender_pps"),
            sent,
            elapsed_s: number(&report, "elapsed_secs"),
            xmit_calls,
            report,
        },
    ))
}

/// The driver calls the watch's JSON lines show on the load's tap.
fn counted_xmit_calls(watch_out: &Path) -> anyhow::Result<u64> {
    let text = std::fs::read_to_string(watch_out)
        .with_context(|| format!("reading {}", watch_out.display()))?;
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    Ok(watched_xmit_calls(&lines))
}

/// A probe running beside the load.
struct Observer {
    proc: Proc,
    /// Copies bpftrace's piped stdout to its file.
    reader: Option<JoinHandle<std::io::Result<()>>>,
}

impl Observer {
    fn watch(tap_probe: &Path, out: &Path) -> anyhow::Result<Self> {
        let mut watch = cmd::new(tap_probe);
        watch.args(WATCH_LOAD_ARGS).stdout(create(out)?);
        let mut proc = Proc::spawn(&mut watch)?;
        // Its first report means the probes are attached; only then may traffic start, or a
        // slow start (BTF parsing on a busy machine) would miss the beginning of the run.
        let deadline = std::time::Instant::now() + WATCH_ATTACH_WAIT;
        loop {
            if let Some(status) = proc.exited()? {
                bail!("tap-probe watch exited before attaching ({status})");
            }
            if std::fs::read_to_string(out).is_ok_and(|text| text.contains('\n')) {
                break;
            }
            if std::time::Instant::now() > deadline {
                proc.stop()?;
                bail!(
                    "tap-probe watch printed nothing within {} s",
                    WATCH_ATTACH_WAIT.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Self { proc, reader: None })
    }

    fn bpftrace(out: &Path) -> anyhow::Result<Self> {
        let mut bpftrace = cmd::new("bpftrace");
        bpftrace
            .args(["-e", BPFTRACE_PROGRAM])
            .stdout(Stdio::piped());
        let mut proc = Proc::spawn(&mut bpftrace)?;
        let stdout = proc.child.stdout.take().context("bpftrace stdout")?;
        let mut file = create(out)?;
        let (attaching, attached) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stdout).lines() {
                let line = line?;
                writeln!(file, "{line}")?;
                if line.contains("Attaching") {
                    let _ = attaching.send(());
                }
            }
            Ok(())
        });
        match attached.recv_timeout(BPFTRACE_ATTACH_WAIT) {
            Ok(()) => {}
            Err(mpsc::RecvTimeoutError::Timeout) => eprintln!(
                "    bpftrace printed no \"Attaching\" within {} s; starting the load anyway",
                BPFTRACE_ATTACH_WAIT.as_secs()
            ),
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Its stdout closed first: it has exited.
                let status = proc.stop()?;
                bail!("bpftrace exited before attaching ({status})");
            }
        }
        Ok(Self {
            proc,
            reader: Some(reader),
        })
    }

    /// SIGINT, then check it exited zero.
    fn stop(self) -> anyhow::Result<()> {
        self.proc.interrupt()?;
        if let Some(reader) = self.reader {
            reader
                .join()
                .map_err(|_| anyhow::anyhow!("bpftrace output reader panicked"))?
                .context("copying bpftrace output")?;
        }
        Ok(())
    }
}
