//! `cargo xtask bench record`: what recording costs the traffic it records, and whether it
//! keeps every event.
//!
//! Each pair runs `tap-probe load` twice: (A) alone, (B) with `tap-probe record --wait`
//! attached before the load starts and stopped with SIGINT after it. The order alternates
//! (A, B, then B, A) so that drift does not favour one variant. Throughput is the load's
//! `delivered_pps`; B's counts come from the trace file's trailer. A B run counts only if
//! the file holds one enqueued or ring-full event for every packet the load sent.

use std::fmt;
use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;
use tap_probe_trace::{EventKind, TraceReader};

use super::{
    LOAD_NETNS_GLOB, Proc, create, default_out, load_args, median, round_order, runs_dir,
    tap_probe, write_json,
};

/// Seconds the load waits before sending; `record --wait` tracks its tap within one poll
/// (50 ms) of the tap appearing, well inside this.
const START_DELAY_S: u32 = 2;

/// What `tap-probe record --wait` prints once its programs are attached.
const ATTACHED_LINE: &str = "attached; waiting for a device";

/// How long `tap-probe record` may take to attach.
const RECORD_ATTACH_WAIT: Duration = Duration::from_secs(30);

/// The load's report field read as throughput.
const THROUGHPUT_FIELD: &str = "delivered_pps";

/// Goal: recording keeps at least this share of the unprobed throughput.
const GOAL_MIN_RATIO: f64 = 0.90;

/// The event rate the goal is stated at.
const GOAL_EVENTS_PER_S: f64 = 1e6;

/// `--pairs`, `--duration`, `--out`, as every host A/B benchmark takes them.
pub(crate) type Args = super::RoundArgs;

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    /// A: no probe.
    ProbeOff,
    /// B: `tap-probe record`.
    Record,
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(match self {
            Self::ProbeOff => "probe-off",
            Self::Record => "record",
        })
    }
}

/// The trace file's trailer, by counter name.
#[derive(Debug, Serialize)]
struct Trailer {
    events: u64,
    /// By kind name.
    per_kind: serde_json::Map<String, Value>,
    lost: u64,
    /// Enqueued + dropped (ring full): one per driver call that reached the ring.
    driver_calls: u64,
    file_bytes: u64,
}

#[derive(Debug, Serialize)]
struct Run {
    pair: u32,
    variant: Variant,
    delivered_pps: f64,
    sent: u64,
    elapsed_s: f64,
    /// B only: events in the file per second of the load's run.
    events_per_s: Option<f64>,
    /// B only.
    trailer: Option<Trailer>,
    /// The load's whole report.
    report: Value,
}

#[derive(Debug, Serialize)]
struct Results {
    bench: &'static str,
    kernel: String,
    config: Config,
    runs: Vec<Run>,
    medians: Medians,
    ratio_record_over_off: f64,
    lost_total: u64,
    goals: Goals,
}

#[derive(Debug, Serialize)]
struct Config {
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
}

#[derive(Debug, Serialize)]
struct Medians {
    probe_off_pps: f64,
    record_pps: f64,
    record_events_per_s: f64,
}

#[derive(Debug, Serialize)]
struct Goals {
    zero_lost: Goal,
    throughput: Goal,
    event_rate: Goal,
}

#[derive(Debug, Serialize)]
struct Goal {
    rule: String,
    value: f64,
    met: bool,
}

/// Runs `cargo xtask bench record`.
///
/// # Errors
/// If any run fails: a process exits non-zero, the load's report lacks its counts, the
/// trace file has no trailer, or the recording missed packets the load sent.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| default_out("record"));
    let dir = runs_dir(&out)?;
    let mut runs = Vec::new();
    for pair in 1..=args.pairs {
        for variant in round_order([Variant::ProbeOff, Variant::Record], pair - 1) {
            eprintln!("==> bench record: pair {pair}/{}: {variant}", args.pairs);
            let run = run_once(pair, variant, args.duration, &dir)
                .with_context(|| format!("pair {pair}, {variant}"))?;
            eprint!("    {THROUGHPUT_FIELD} = {:.0}", run.delivered_pps);
            if let (Some(rate), Some(t)) = (run.events_per_s, &run.trailer) {
                eprint!(", events/s = {rate:.0}, lost = {}", t.lost);
            }
            eprintln!();
            runs.push(run);
        }
    }
    let results = summarize(args, runs);
    print_table(&results);
    write_json(&out, &results)?;
    eprintln!(
        "xtask bench record: results in {} (raw output in {})",
        out.display(),
        dir.display()
    );
    Ok(())
}

fn run_once(pair: u32, variant: Variant, duration: u32, dir: &Path) -> anyhow::Result<Run> {
    let tag = format!("pair{pair:02}-{variant}");
    let trace = dir.join(format!("{tag}.trace"));
    let recorder = match variant {
        Variant::ProbeOff => None,
        Variant::Record => Some(Recorder::start(
            &trace,
            &dir.join(format!("{tag}-record.txt")),
        )?),
    };
    let report_path = dir.join(format!("{tag}-load.json"));
    let mut load = tap_probe();
    load.args(load_args(duration, START_DELAY_S))
        .stdout(create(&report_path)?);
    // Generous: the load bounds itself; this only catches a hang.
    let timeout = Duration::from_secs(u64::from(duration + START_DELAY_S) + 60);
    Proc::spawn(&mut load)?.wait(timeout)?;
    if let Some(recorder) = recorder {
        recorder.stop()?;
    }
    let report = super::read_report(&report_path)?;
    let number = |name: &str| {
        report
            .get(name)
            .and_then(Value::as_f64)
            .with_context(|| format!("{} has no number `{name}`", report_path.display()))
    };
    let delivered_pps = number(THROUGHPUT_FIELD)?;
    let elapsed_s = number("elapsed_secs")?;
    let sent = report
        .get("sent")
        .and_then(Value::as_u64)
        .context("the load report has no `sent` count")?;
    let trailer = match variant {
        Variant::ProbeOff => None,
        Variant::Record => {
            let trailer = read_trailer(&trace)?;
            // A recorder that missed the start (or part) of the run would look cheaper
            // than it is. Lost events (a goal, not a failure) may be of any kind.
            let complete = if trailer.lost == 0 {
                trailer.driver_calls == sent
            } else {
                trailer.driver_calls <= sent && trailer.driver_calls + trailer.lost >= sent
            };
            if !complete {
                bail!(
                    "the recording holds {} enqueued + ring-full events ({} lost), the load \
                     sent {sent}: it did not record the whole run ({})",
                    trailer.driver_calls,
                    trailer.lost,
                    trace.display()
                );
            }
            // Keep the per-run files small: the counts are in the results.
            std::fs::remove_file(&trace)
                .with_context(|| format!("removing {}", trace.display()))?;
            Some(trailer)
        }
    };
    #[expect(clippy::cast_precision_loss, reason = "event counts far below 2^52")]
    let events_per_s = trailer
        .as_ref()
        .map(|t| t.events as f64 / elapsed_s.max(f64::MIN_POSITIVE));
    Ok(Run {
        pair,
        variant,
        delivered_pps,
        sent,
        elapsed_s,
        events_per_s,
        trailer,
        report,
    })
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
    fn start(trace: &Path, log: &Path) -> anyhow::Result<Self> {
        let mut record = tap_probe();
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

    /// SIGINT, then check it exited zero (after writing the trailer).
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

fn summarize(args: &Args, runs: Vec<Run>) -> Results {
    let median_of = |variant, value: &dyn Fn(&Run) -> Option<f64>| {
        let values: Vec<f64> = runs
            .iter()
            .filter(|run| run.variant == variant)
            .filter_map(value)
            .collect();
        median(&values)
    };
    let medians = Medians {
        probe_off_pps: median_of(Variant::ProbeOff, &|r| Some(r.delivered_pps)),
        record_pps: median_of(Variant::Record, &|r| Some(r.delivered_pps)),
        record_events_per_s: median_of(Variant::Record, &|r| r.events_per_s),
    };
    let ratio = medians.record_pps / medians.probe_off_pps;
    let lost_total: u64 = runs
        .iter()
        .filter_map(|r| r.trailer.as_ref())
        .map(|t| t.lost)
        .sum();
    #[expect(clippy::cast_precision_loss, reason = "a loss count far below 2^52")]
    let lost_value = lost_total as f64;
    let goals = Goals {
        zero_lost: Goal {
            rule: "events lost while recording == 0 (all runs)".to_owned(),
            value: lost_value,
            met: lost_total == 0,
        },
        throughput: Goal {
            rule: format!("record/probe-off >= {GOAL_MIN_RATIO}"),
            value: ratio,
            met: ratio >= GOAL_MIN_RATIO,
        },
        event_rate: Goal {
            rule: format!(
                "recorded events/s >= {GOAL_EVENTS_PER_S:.0} (the rate the goals are stated at)"
            ),
            value: medians.record_events_per_s,
            met: medians.record_events_per_s >= GOAL_EVENTS_PER_S,
        },
    };
    Results {
        bench: "record",
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        config: Config {
            pairs: args.pairs,
            duration_s: args.duration,
            start_delay_s: START_DELAY_S,
            throughput_field: THROUGHPUT_FIELD,
        },
        runs,
        medians,
        ratio_record_over_off: ratio,
        lost_total,
        goals,
    }
}

fn print_table(results: &Results) {
    println!(
        "{:>4}  {:<9}  {:>13}  {:>10}  {:>9}  {:>11}  {:>10}  {:>6}",
        "pair", "variant", "delivered_pps", "sent", "elapsed_s", "events", "events/s", "lost"
    );
    for run in &results.runs {
        let (events, rate, lost) = match (&run.trailer, run.events_per_s) {
            (Some(t), Some(rate)) => (
                t.events.to_string(),
                format!("{rate:.0}"),
                t.lost.to_string(),
            ),
            _ => ("-".to_owned(), "-".to_owned(), "-".to_owned()),
        };
        println!(
            "{:>4}  {:<9}  {:>13.0}  {:>10}  {:>9.2}  {:>11}  {:>10}  {:>6}",
            run.pair,
            run.variant.to_string(),
            run.delivered_pps,
            run.sent,
            run.elapsed_s,
            events,
            rate,
            lost,
        );
    }
    let m = &results.medians;
    println!();
    println!(
        "median delivered_pps: probe-off (A) {:.0}, record (B) {:.0}; B/A {:.4}; median \
         recorded events/s {:.0}; lost {}",
        m.probe_off_pps,
        m.record_pps,
        results.ratio_record_over_off,
        m.record_events_per_s,
        results.lost_total
    );
    let g = &results.goals;
    for goal in [&g.zero_lost, &g.throughput, &g.event_rate] {
        println!(
            "goal {}: {} ({:.4})",
            goal.rule,
            if goal.met { "met" } else { "NOT met" },
            goal.value
        );
    }
}
