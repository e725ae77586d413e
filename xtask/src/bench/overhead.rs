//! `cargo xtask bench overhead`: what watching costs the traffic it watches.
//!
//! Each round runs `tap-probe load` three ways: (A) with no probe, (B) with
//! `tap-probe watch` attached, (C) with a bpftrace one-liner that counts the same events.
//! The order alternates (A, B, C, then C, B, A) so that drift over time does not favour
//! one variant. Throughput is the load's `delivered_pps`; the results are the medians, the
//! ratios B/A and C/A, and how B's loss compares with C's.

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

use super::{
    Proc, WATCH_LOAD_ARGS, create, default_out, load_args, median, round_order, runs_dir,
    tap_probe, watched_xmit_calls, write_json,
};

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
const THROUGHPUT_FIELD: &str = "delivered_pps";

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

impl Variant {
    const ALL: [Self; 3] = [Self::ProbeOff, Self::TapProbe, Self::Bpftrace];
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
struct Run {
    round: u32,
    variant: Variant,
    delivered_pps: f64,
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
    ratios: Ratios,
    goals: Goals,
}

#[derive(Debug, Serialize)]
struct Config {
    pairs: u32,
    duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    bpftrace_program: &'static str,
}

#[derive(Debug, Serialize)]
struct Medians {
    probe_off: f64,
    tap_probe: f64,
    bpftrace: f64,
}

#[derive(Debug, Serialize)]
struct Ratios {
    /// B/A.
    tap_probe_over_off: f64,
    /// C/A.
    bpftrace_over_off: f64,
    /// (1 - B/A) / (1 - C/A); `null` when bpftrace lost nothing.
    loss_ratio: Option<f64>,
}

#[derive(Debug, Serialize)]
struct Goals {
    throughput: Goal,
    loss_vs_bpftrace: Goal,
}

#[derive(Debug, Serialize)]
struct Goal {
    rule: String,
    value: Option<f64>,
    met: bool,
}

/// Runs `cargo xtask bench overhead`.
///
/// # Errors
/// If any run fails: a process exits non-zero, or the load's report lacks its throughput.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let out = args.out.clone().unwrap_or_else(|| default_out("overhead"));
    let dir = runs_dir(&out)?;
    let mut runs = Vec::new();
    for round in 1..=args.pairs {
        for variant in round_order(Variant::ALL, round - 1) {
            eprintln!(
                "==> bench overhead: round {round}/{}: {variant}",
                args.pairs
            );
            let run = run_once(round, variant, args.duration, &dir)
                .with_context(|| format!("round {round}, {variant}"))?;
            eprintln!("    {THROUGHPUT_FIELD} = {:.0}", run.delivered_pps);
            runs.push(run);
        }
    }
    let results = summarize(args, runs);
    print_table(&results);
    write_json(&out, &results)?;
    eprintln!(
        "xtask bench overhead: results in {} (raw output in {})",
        out.display(),
        dir.display()
    );
    Ok(())
}

fn run_once(round: u32, variant: Variant, duration: u32, dir: &Path) -> anyhow::Result<Run> {
    let tag = format!("round{round:02}-{variant}");
    let observer = match variant {
        Variant::ProbeOff => None,
        Variant::TapProbe => Some(Observer::watch(&dir.join(format!("{tag}-watch.jsonl")))?),
        Variant::Bpftrace => Some(Observer::bpftrace(
            &dir.join(format!("{tag}-bpftrace.txt")),
        )?),
    };
    let report_path = dir.join(format!("{tag}-load.json"));
    let mut load = tap_probe();
    load.args(load_args(duration, START_DELAY_S))
        .stdout(create(&report_path)?);
    // Generous: the load bounds itself; this only catches a hang.
    let timeout = Duration::from_secs(u64::from(duration + START_DELAY_S) + 60);
    Proc::spawn(&mut load)?.wait(timeout)?;
    if let Some(observer) = observer {
        observer.stop()?;
    }
    let report = super::read_report(&report_path)?;
    if variant == Variant::TapProbe {
        check_watch_counted(&dir.join(format!("{tag}-watch.jsonl")), &report)?;
    }
    let delivered_pps = report
        .get(THROUGHPUT_FIELD)
        .and_then(Value::as_f64)
        .with_context(|| {
            format!(
                "{} has no number `{THROUGHPUT_FIELD}`",
                report_path.display()
            )
        })?;
    Ok(Run {
        round,
        variant,
        delivered_pps,
        report,
    })
}

/// A probe running beside the load.
struct Observer {
    proc: Proc,
    /// Copies bpftrace's piped stdout to its file.
    reader: Option<JoinHandle<std::io::Result<()>>>,
}

impl Observer {
    fn watch(out: &Path) -> anyhow::Result<Self> {
        let mut watch = tap_probe();
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
        let mut bpftrace = crate::cmd::new("bpftrace");
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

/// A probe that counted nothing would make variant B look free: the watch must have seen
/// every packet the load handed to the stack as a driver call on the load's tap.
fn check_watch_counted(watch_out: &Path, report: &Value) -> anyhow::Result<()> {
    let sent = report
        .get("sent")
        .and_then(Value::as_u64)
        .context("the load report has no `sent` count")?;
    let text = std::fs::read_to_string(watch_out)
        .with_context(|| format!("reading {}", watch_out.display()))?;
    let lines: Vec<Value> = text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect();
    let counted = watched_xmit_calls(&lines);
    if counted != sent {
        bail!(
            "tap-probe watch counted {counted} driver calls on the load's tap, the load sent \
             {sent}: the probe did not watch the whole run ({})",
            watch_out.display()
        );
    }
    Ok(())
}

fn summarize(args: &Args, runs: Vec<Run>) -> Results {
    let median_of = |variant| {
        let values: Vec<f64> = runs
            .iter()
            .filter(|run| run.variant == variant)
            .map(|run| run.delivered_pps)
            .collect();
        median(&values)
    };
    let medians = Medians {
        probe_off: median_of(Variant::ProbeOff),
        tap_probe: median_of(Variant::TapProbe),
        bpftrace: median_of(Variant::Bpftrace),
    };
    let tap_probe_over_off = medians.tap_probe / medians.probe_off;
    let bpftrace_over_off = medians.bpftrace / medians.probe_off;
    let (loss_tap_probe, loss_bpftrace) = (1.0 - tap_probe_over_off, 1.0 - bpftrace_over_off);
    let loss_ratio = (loss_bpftrace > 0.0).then(|| loss_tap_probe / loss_bpftrace);
    let goals = Goals {
        throughput: Goal {
            rule: format!("tap-probe/probe-off >= {GOAL_MIN_RATIO}"),
            value: Some(tap_probe_over_off),
            met: tap_probe_over_off >= GOAL_MIN_RATIO,
        },
        loss_vs_bpftrace: Goal {
            rule: "loss(tap-probe) <= loss(bpftrace)/3, loss(X) = 1 - X/probe-off".to_owned(),
            value: loss_ratio,
            met: loss_tap_probe <= loss_bpftrace * GOAL_MAX_LOSS_RATIO,
        },
    };
    Results {
        bench: "overhead",
        kernel: std::fs::read_to_string("/proc/sys/kernel/osrelease")
            .map(|s| s.trim().to_owned())
            .unwrap_or_default(),
        config: Config {
            pairs: args.pairs,
            duration_s: args.duration,
            start_delay_s: START_DELAY_S,
            throughput_field: THROUGHPUT_FIELD,
            bpftrace_program: BPFTRACE_PROGRAM,
        },
        runs,
        medians,
        ratios: Ratios {
            tap_probe_over_off,
            bpftrace_over_off,
            loss_ratio,
        },
        goals,
    }
}

fn print_table(results: &Results) {
    let field = |report: &Value, name: &str| {
        report
            .get(name)
            .and_then(Value::as_f64)
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.0}"))
    };
    println!(
        "{:>5}  {:<10}  {:>14}  {:>14}  {:>12}  {:>12}  {:>9}",
        "round", "variant", "delivered_pps", "sender_pps", "sent", "read", "elapsed_s"
    );
    for run in &results.runs {
        let elapsed = run
            .report
            .get("elapsed_s")
            .and_then(Value::as_f64)
            .map_or_else(|| "-".to_owned(), |v| format!("{v:.2}"));
        println!(
            "{:>5}  {:<10}  {:>14.0}  {:>14}  {:>12}  {:>12}  {:>9}",
            run.round,
            run.variant.to_string(),
            run.delivered_pps,
            field(&run.report, "sender_pps"),
            field(&run.report, "sent"),
            field(&run.report, "read"),
            elapsed,
        );
    }
    let m = &results.medians;
    println!();
    println!(
        "median delivered_pps: probe-off (A) {:.0}, tap-probe (B) {:.0}, bpftrace (C) {:.0}",
        m.probe_off, m.tap_probe, m.bpftrace
    );
    let r = &results.ratios;
    println!(
        "B/A {:.4}, C/A {:.4}, loss ratio (1-B/A)/(1-C/A) {}",
        r.tap_probe_over_off,
        r.bpftrace_over_off,
        r.loss_ratio.map_or_else(
            || "n/a (bpftrace lost nothing)".to_owned(),
            |v| format!("{v:.3}")
        )
    );
    for goal in [&results.goals.throughput, &results.goals.loss_vs_bpftrace] {
        println!(
            "goal {}: {}",
            goal.rule,
            if goal.met { "met" } else { "NOT met" }
        );
    }
}
