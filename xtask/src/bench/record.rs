//! `cargo xtask bench record`: what recording costs the traffic it records, and whether it
//! keeps every event.
//!
//! Each round runs `tap-probe load` three times, in the alternating order of the A/B harness:
//! (A) alone, (F) beside the floor (a program of each name the probe has on each hook it
//! attaches, returning at its first instruction), (B) with `tap-probe record --wait`
//! attached before the load starts and stopped with SIGINT after it. Throughput is the load's `delivered_pps`; B's counts come from the
//! trace, read whole by the trace crate. A B run is valid only if the trace holds one
//! enqueued or ring-full event for every packet the load sent.

use std::fmt;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::{Path, PathBuf};
use std::process::Stdio;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;
use tap_probe_spec::load::LoadNumber;
use tap_probe_trace::{EventKind, TraceReader};

use super::ab::{Goal, Measure, Results, Schedule, Status};
use super::{LOAD_NETNS_GLOB, Proc, create, default_out, load, load_numbers, runs_dir};
use crate::cmd;

/// Seconds the load waits before sending; `record --wait` tracks its tap within one poll
/// (50 ms) of the tap appearing, well inside this.
const START_DELAY_S: u32 = 2;

/// What `tap-probe record --wait` prints once its programs are attached.
const ATTACHED_LINE: &str = "attached; waiting for a device";

/// How long `tap-probe record` may take to attach.
const RECORD_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// The load's report field read as throughput.
const THROUGHPUT: &str = LoadNumber::DeliveredPps.name();

/// Goal: recording keeps at least this share of the throughput the hooks leave with nothing
/// in them (B/F).
const GOAL_MIN_FLOOR_RATIO: f64 = 0.95;

/// The event rate the goal is stated at.
const GOAL_EVENTS_PER_S: f64 = 1e6;

/// `--pairs`, `--duration`, `--out`, as every host A/B benchmark takes them.
pub(crate) type Args = super::RoundArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    /// A: no probe.
    ProbeOff,
    /// F: the floor.
    Floor,
    /// B: `tap-probe record`.
    Record,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProbeOff => "probe-off",
            Self::Floor => "floor",
            Self::Record => "record",
        })
    }
}

/// The trace's trailer, by counter name.
#[derive(Debug, Serialize)]
struct Trailer {
    events: u64,
    per_kind: serde_json::Map<String, Value>,
    lost: u64,
    /// Enqueued + dropped (ring full): one per driver call that reached the ring.
    driver_calls: u64,
    file_bytes: u64,
}

/// What one run measured.
#[derive(Debug, Serialize)]
struct Measured {
    delivered_pps: Option<f64>,
    sent: Option<u64>,
    elapsed_s: Option<f64>,
    /// B only: events in the trace per second of the load's run.
    events_per_s: Option<f64>,
    /// B only.
    trailer: Option<Trailer>,
    /// The load's whole report.
    report: Value,
}

#[derive(Debug, Serialize)]
struct Config {
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "event counts far below 2^52, as numbers for the table"
)]
fn measures() -> [Measure<Measured>; 5] {
    [
        Measure {
            name: THROUGHPUT,
            value: |m| m.delivered_pps,
            digits: 0,
        },
        Measure {
            name: "sent",
            value: |m| m.sent.map(|n| n as f64),
            digits: 0,
        },
        Measure {
            name: "elapsed_s",
            value: |m| m.elapsed_s,
            digits: 2,
        },
        Measure {
            name: "events_per_s",
            value: |m| m.events_per_s,
            digits: 0,
        },
        Measure {
            name: "lost",
            value: |m| m.trailer.as_ref().map(|t| t.lost as f64),
            digits: 0,
        },
    ]
}

/// Where the results go: `--out`, or `target/bench/record.json`.
pub(crate) fn out(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| default_out("record"))
}

/// Runs `cargo xtask bench record` with the release `tap_probe`.
///
/// # Errors
/// If any run fails or is invalid (a recording that missed packets the load sent); the
/// results are written first.
pub(crate) fn run(args: &Args, out: &Path, tap_probe: &Path, floor: &Path) -> anyhow::Result<()> {
    let dir = runs_dir(out)?;
    let schedule = Schedule {
        variants: vec![Variant::ProbeOff, Variant::Floor, Variant::Record],
        rounds: args.pairs,
        warm_up: false,
    };
    let runs = super::ab::run_on_host("record", &schedule, |round, variant| {
        let tag = format!("pair{:02}-{variant}", round.map_or(0, |r| r + 1));
        run_once(tap_probe, floor, &tag, variant, args.duration, &dir)
    })?;
    let config = Config {
        pairs: args.pairs,
        duration_s: args.duration,
        start_delay_s: START_DELAY_S,
        throughput_field: THROUGHPUT,
    };
    let measures = measures();
    let mut results = Results::new("record", config, &schedule, runs, &measures, THROUGHPUT);
    let lost: u64 = results
        .runs
        .iter()
        .filter_map(|r| r.data.trailer.as_ref())
        .map(|t| t.lost)
        .sum();
    let recorded = results.variant(Variant::Record);
    let median = |v| {
        results
            .variant(v)
            .and_then(|s| s.medians.get(THROUGHPUT).copied())
            .filter(|&m| m > 0.0)
    };
    let above_floor = median(Variant::Record).zip(median(Variant::Floor));
    let floor_ratio = above_floor.map(|(b, f)| b / f);
    if let Some((b, f)) = above_floor {
        eprintln!(
            "record against the floor: record/floor {:.3}, {:.0} ns a packet above it",
            b / f,
            1e9 / b - 1e9 / f
        );
    }
    let events_per_s = recorded.and_then(|v| v.medians.get("events_per_s").copied());
    #[expect(clippy::cast_precision_loss, reason = "a loss count far below 2^52")]
    let lost = lost as f64;
    results.goals = vec![
        Goal::at_most(
            "events lost while recording == 0 (all runs)",
            Some(lost),
            0.0,
        ),
        Goal::at_least(
            format!("record/floor >= {GOAL_MIN_FLOOR_RATIO}"),
            floor_ratio,
            GOAL_MIN_FLOOR_RATIO,
        ),
        Goal::at_least(
            format!(
                "recorded events/s >= {GOAL_EVENTS_PER_S:.0} (the rate the goals are stated at)"
            ),
            events_per_s,
            GOAL_EVENTS_PER_S,
        ),
    ];
    eprintln!("raw output of every run in {}", dir.display());
    results.finish(&measures, out)
}

fn run_once(
    tap_probe: &Path,
    floor: &Path,
    tag: &str,
    variant: Variant,
    duration: u32,
    dir: &Path,
) -> anyhow::Result<(Status, Measured)> {
    let trace = dir.join(format!("{tag}.trace"));
    let recorder = match variant {
        Variant::ProbeOff | Variant::Floor => None,
        Variant::Record => Some(Recorder::start(
            tap_probe,
            &trace,
            &dir.join(format!("{tag}-record.txt")),
        )?),
    };
    let floor = match variant {
        Variant::Floor => Some(super::probed::Observer::floor(
            floor,
            &dir.join(format!("{tag}-floor.txt")),
            RECORD_ATTACH_WAIT,
        )?),
        Variant::ProbeOff | Variant::Record => None,
    };
    let report = load(tap_probe, dir, tag, duration, START_DELAY_S)?;
    if let Some(recorder) = recorder {
        recorder.stop()?;
    }
    if let Some(floor) = floor {
        floor.stop()?;
    }
    let numbers = load_numbers(&report);
    let trailer = match variant {
        Variant::ProbeOff | Variant::Floor => None,
        Variant::Record => {
            let trailer = read_trailer(&trace)?;
            // Keep the per-run files small: the counts are in the results.
            std::fs::remove_file(&trace)
                .with_context(|| format!("removing {}", trace.display()))?;
            Some(trailer)
        }
    };
    let status = match (&numbers, &trailer) {
        (Err(err), _) => Status::Failed(format!("the load's report: {err}")),
        (Ok(n), Some(t)) if !complete(t, n.sent) => Status::Invalid(format!(
            "the recording holds {} enqueued + ring-full events ({} lost), the load sent \
             {}: it did not record the whole run",
            t.driver_calls, t.lost, n.sent
        )),
        _ => Status::Valid,
    };
    let numbers = numbers.ok();
    #[expect(clippy::cast_precision_loss, reason = "event counts far below 2^52")]
    let events_per_s = trailer
        .as_ref()
        .zip(numbers)
        .map(|(t, n)| t.events as f64 / n.elapsed_secs.max(f64::MIN_POSITIVE));
    Ok((
        status,
        Measured {
            delivered_pps: numbers.map(|n| n.delivered_pps),
            sent: numbers.map(|n| n.sent),
            elapsed_s: numbers.map(|n| n.elapsed_secs),
            events_per_s,
            trailer,
            report,
        },
    ))
}

/// Whether the recording saw every packet the load sent reach the driver. A recorder that
/// missed the start (or part) of the run would look cheaper than it is; lost events (a
/// goal, not a failure) may be of any kind.
fn complete(t: &Trailer, sent: u64) -> bool {
    if t.lost == 0 {
        t.driver_calls == sent
    } else {
        t.driver_calls <= sent && t.driver_calls + t.lost >= sent
    }
}

/// `tap-probe record --wait` running beside the load.
struct Recorder {
    proc: Proc,
    /// Copies its stderr (progress and the summary) to a file.
    reader: JoinHandle<std::io::Result<()>>,
}

impl Recorder {
    /// Starts it and waits until its programs are attached, so the load (which creates
    /// the device afterwards) is recorded from its first packet.
    fn start(tap_probe: &Path, trace: &Path, log: &Path) -> anyhow::Result<Self> {
        let mut record = cmd::new(tap_probe);
        record
            .arg("record")
            .arg("-o")
            .arg(trace)
            .args(["--netns", LOAD_NETNS_GLOB, "--wait"])
            .stdout(Stdio::null())
            .stderr(Stdio::piped());
        let mut proc = Proc::spawn(&mut record)?;
        let stderr = proc
            .child
            .stderr
            .take()
            .context("tap-probe record stderr")?;
        let mut file = create(log)?;
        let (attaching, attached) = mpsc::channel();
        let reader = std::thread::spawn(move || {
            for line in BufReader::new(stderr).lines() {
                let line = line?;
                writeln!(file, "{line}")?;
                if line.contains(ATTACHED_LINE) {
                    let _ = attaching.send(());
                }
            }
            Ok(())
        });
        match attached.recv_timeout(RECORD_ATTACH_WAIT) {
            Ok(()) => Ok(Self { proc, reader }),
            Err(mpsc::RecvTimeoutError::Timeout) => {
                let _ = proc.stop();
                bail!(
                    "tap-probe record did not attach within {} s ({})",
                    RECORD_ATTACH_WAIT.as_secs(),
                    log.display()
                )
            }
            Err(mpsc::RecvTimeoutError::Disconnected) => {
                // Its stderr closed first: it has exited.
                let status = proc.stop()?;
                bail!(
                    "tap-probe record exited before attaching ({status}; {})",
                    log.display()
                )
            }
        }
    }

    /// SIGINT, then check it stopped in order (after writing the trailer).
    fn stop(self) -> anyhow::Result<()> {
        let started = Instant::now();
        self.proc.interrupt()?;
        self.reader
            .join()
            .map_err(|_| anyhow::anyhow!("tap-probe record output reader panicked"))?
            .context("copying tap-probe record output")?;
        eprintln!(
            "    record finished {:.1} s after SIGINT",
            started.elapsed().as_secs_f64()
        );
        Ok(())
    }
}

/// Reads a whole trace with the trace crate's reader, which checks it down to its checksum,
/// and returns its trailer's counts.
fn read_trailer(path: &Path) -> anyhow::Result<Trailer> {
    let file = std::fs::File::open(path).with_context(|| format!("opening {}", path.display()))?;
    let file_bytes = file.metadata()?.len();
    let mut reader =
        TraceReader::new(file).with_context(|| format!("reading {}", path.display()))?;
    for record in reader.by_ref() {
        record.with_context(|| format!("reading {}", path.display()))?;
    }
    let trailer = reader
        .trailer()
        .copied()
        .with_context(|| format!("{} has no trailer", path.display()))?;
    Ok(Trailer {
        events: trailer.events,
        per_kind: EventKind::ALL
            .iter()
            .map(|&kind| {
                let name = kind.counter().map_or("?", |counter| counter.name);
                (name.to_owned(), Value::from(trailer.count(kind)))
            })
            .collect(),
        lost: trailer.lost,
        driver_calls: trailer.count(EventKind::Enqueued)
            + trailer.count(EventKind::DroppedFullRing),
        file_bytes,
    })
}
