//! One run of `tap-probe load` with a probe beside it, as the overhead benchmark (on this
//! host) and the backends benchmark (in a guest) run it: the probe starts first and the load
//! only once the probe has attached; a run with `tap-probe watch` is valid only if the watch
//! counted one driver call per packet the load sent (a probe that missed part of the run
//! would look cheaper than it is).

use std::io::{BufRead as _, BufReader, Write as _};
use std::path::Path;
use std::process::Stdio;
use std::sync::mpsc;
use std::thread::JoinHandle;
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::{Deserialize, Serialize};
use serde_json::Value;
use tap_probe_spec::load::{LoadNumber, LoadNumbers};

use super::ab::{Measure, Status};
use super::stream::StreamReport;
use super::{
    Proc, WATCH_INTERVAL, WATCH_LOAD_ARGS, create, load, load_numbers, watched_xmit_calls,
};
use crate::cmd;
use tap_probe_common::MetricId;

/// The events tap-probe's host backend counts, counted the simplest way bpftrace can.
pub(crate) const BPFTRACE_PROGRAM: &str = "tracepoint:net:net_dev_start_xmit, \
     tracepoint:net:net_dev_xmit, tracepoint:skb:kfree_skb, tracepoint:skb:consume_skb, \
     tracepoint:qdisc:qdisc_dequeue { @[probe] = count(); }";

/// How long bpftrace gets to print "Attaching" before the load starts anyway.
const BPFTRACE_ATTACH_WAIT: Duration = Duration::from_secs(10);

/// The load's report field read as throughput.
pub(crate) const THROUGHPUT: &str = LoadNumber::DeliveredPps.name();

/// What runs beside the load.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Probe<'a> {
    None,
    /// `tap-probe watch` with these arguments besides the load's filter: `--backend`,
    /// `--no-occupancy`, or `--program-stats` (what each program costs, as the kernel
    /// measures it; the measuring itself costs, so such runs are not compared with others).
    Watch(&'static [&'static str]),
    /// The floor (`tap-probe-observer`'s example `floor`, at this path): a program of each
    /// name the probe has on each hook it attaches, returning at its first instruction.
    Floor(&'a Path),
    /// The bpftrace one-liner.
    Bpftrace,
}

/// What traffic a run drives.
#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, clap::ValueEnum)]
#[serde(rename_all = "kebab-case")]
pub(crate) enum Traffic {
    /// `tap-probe load`: a flooded tap, watched.
    Tap,
    /// A UDP stream over loopback in a private namespace, not watched (`stream.rs`).
    Other,
}

/// How a run is timed.
#[derive(Clone, Copy, Debug)]
pub(crate) struct Timing {
    /// Seconds of traffic.
    pub(crate) duration: u32,
    /// Seconds the load waits before sending, so that a watch (which looks for new
    /// namespaces every refresh) has found the load's tap by then.
    pub(crate) start_delay: u32,
    /// How long `tap-probe watch` may take to attach (BTF parsing is slow under emulation).
    pub(crate) attach_wait: Duration,
}

/// What one run measured.
#[derive(Debug, Default, Serialize, Deserialize)]
pub(crate) struct Measured {
    pub(crate) delivered_pps: Option<f64>,
    pub(crate) sender_pps: Option<f64>,
    pub(crate) sent: Option<u64>,
    pub(crate) elapsed_s: Option<f64>,
    /// With a watch: driver calls the watch counted on the load's tap.
    pub(crate) xmit_calls: Option<u64>,
    /// With `--program-stats`: the watch's `programs` (runs and mean ns of each program).
    pub(crate) programs: Option<Value>,
    /// The load's whole report.
    pub(crate) report: Value,
}

#[expect(
    clippy::cast_precision_loss,
    reason = "packet counts far below 2^52, as numbers for the table"
)]
pub(crate) fn measures() -> [Measure<Measured>; 5] {
    [
        Measure {
            name: THROUGHPUT,
            value: |m| m.delivered_pps,
            digits: 0,
        },
        Measure {
            name: LoadNumber::SenderPps.name(),
            value: |m| m.sender_pps,
            digits: 0,
        },
        Measure {
            name: LoadNumber::Sent.name(),
            value: |m| m.sent.map(|n| n as f64),
            digits: 0,
        },
        Measure {
            name: MetricId::XmitCalls.metric().name,
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

/// Runs `traffic` with `probe` beside it; `tag` names the run's files in `dir`. A watch
/// that exits before attaching makes the run [`Status::Unavailable`] (a backend the kernel
/// cannot run); any other error fails it.
///
/// # Errors
/// If the traffic or the probe cannot be run or fails.
pub(crate) fn run(
    tap_probe: &Path,
    tag: &str,
    probe: Probe<'_>,
    traffic: Traffic,
    timing: Timing,
    dir: &Path,
) -> anyhow::Result<(Status, Measured)> {
    let watch_out = dir.join(format!("{tag}-watch.jsonl"));
    let observer = match probe {
        Probe::None => None,
        Probe::Watch(args) => {
            match Observer::watch(tap_probe, args, &watch_out, timing.attach_wait)? {
                Ok(observer) => Some(observer),
                Err(why) => return Ok((Status::Unavailable(why), Measured::default())),
            }
        }
        Probe::Floor(floor) => Some(Observer::floor(
            floor,
            &dir.join(format!("{tag}-floor.txt")),
            timing.attach_wait,
        )?),
        Probe::Bpftrace => Some(Observer::bpftrace(
            &dir.join(format!("{tag}-bpftrace.txt")),
        )?),
    };
    let report = match traffic {
        Traffic::Tap => load(tap_probe, dir, tag, timing.duration, timing.start_delay)?,
        Traffic::Other => super::stream::run(dir, tag, timing.duration)?,
    };
    if let Some(observer) = observer {
        observer.stop()?;
    }
    let throughput = match traffic {
        Traffic::Tap => load_numbers(&report).map(Throughput::from),
        Traffic::Other => StreamReport::deserialize(&report).map(Throughput::from),
    };
    let watched = matches!(probe, Probe::Watch(_));
    let lines = watched.then(|| watch_lines(&watch_out)).transpose()?;
    let xmit_calls = lines.as_deref().map(watched_xmit_calls);
    let programs = lines
        .iter()
        .flatten()
        .rev()
        .find_map(|line| line.get("programs"))
        .cloned();
    let status = match (&throughput, xmit_calls) {
        (Err(err), _) => Status::Failed(format!("the traffic's report: {err}")),
        (Ok(t), Some(counted)) => {
            // The load's tap is watched and every driver call on it must be counted (a
            // probe that counted less would look cheaper than it is); the other traffic is
            // not watched.
            let expected = match traffic {
                Traffic::Tap => t.sent,
                Traffic::Other => 0,
            };
            if counted == expected {
                Status::Valid
            } else {
                Status::Invalid(format!(
                    "tap-probe watch counted {counted} driver calls on the load's tap \
                     ({expected} expected; {} sent): the probe did not watch the run as it \
                     should ({})",
                    t.sent,
                    watch_out.display()
                ))
            }
        }
        (Ok(_), None) => Status::Valid,
    };
    let throughput = throughput.ok();
    Ok((
        status,
        Measured {
            delivered_pps: throughput.map(|t| t.delivered_pps),
            sender_pps: throughput.map(|t| t.sender_pps),
            sent: throughput.map(|t| t.sent),
            elapsed_s: throughput.map(|t| t.elapsed_secs),
            xmit_calls,
            programs,
            report,
        },
    ))
}

/// What a run's traffic did, from its report: a `tap-probe load`'s numbers or the other
/// traffic's stream.
#[derive(Clone, Copy, Debug)]
struct Throughput {
    sent: u64,
    elapsed_secs: f64,
    sender_pps: f64,
    delivered_pps: f64,
}

impl From<LoadNumbers> for Throughput {
    fn from(n: LoadNumbers) -> Self {
        Self {
            sent: n.sent,
            elapsed_secs: n.elapsed_secs,
            sender_pps: n.sender_pps,
            delivered_pps: n.delivered_pps,
        }
    }
}

impl From<StreamReport> for Throughput {
    fn from(s: StreamReport) -> Self {
        Self {
            sent: s.sent,
            elapsed_secs: s.elapsed_secs,
            sender_pps: s.sender_pps,
            delivered_pps: s.delivered_pps,
        }
    }
}

/// The watch's JSON lines.
fn watch_lines(watch_out: &Path) -> anyhow::Result<Vec<Value>> {
    let text = std::fs::read_to_string(watch_out)
        .with_context(|| format!("reading {}", watch_out.display()))?;
    Ok(text
        .lines()
        .filter_map(|line| serde_json::from_str(line).ok())
        .collect())
}

/// A probe running beside the load.
pub(crate) struct Observer {
    proc: Proc,
    /// Copies bpftrace's piped stdout to its file.
    reader: Option<JoinHandle<std::io::Result<()>>>,
}

impl Observer {
    /// Starts `tap-probe watch` and waits until it has attached (its first report). The inner
    /// error is the watch's own account of why it exited before attaching.
    fn watch(
        tap_probe: &Path,
        args: &[&str],
        out: &Path,
        attach_wait: Duration,
    ) -> anyhow::Result<Result<Self, String>> {
        let err_out = out.with_extension("err");
        let mut watch = cmd::new(tap_probe);
        watch
            .args(WATCH_LOAD_ARGS)
            .args(if args.contains(&WATCH_INTERVAL[0]) {
                &[][..]
            } else {
                &WATCH_INTERVAL[..]
            })
            .args(args)
            .stdout(create(out)?)
            .stderr(create(&err_out)?);
        let mut proc = Proc::spawn(&mut watch)?;
        // Its first report means the probes are attached; only then may traffic start, or a
        // slow start (BTF parsing on a busy machine) would miss the beginning of the run.
        let deadline = std::time::Instant::now() + attach_wait;
        loop {
            if let Some(status) = proc.exited()? {
                let stderr = std::fs::read_to_string(&err_out).unwrap_or_default();
                return Ok(Err(format!(
                    "tap-probe watch exited ({status}): {}",
                    stderr.trim()
                )));
            }
            if std::fs::read_to_string(out).is_ok_and(|text| text.contains('\n')) {
                break;
            }
            if std::time::Instant::now() > deadline {
                proc.stop()?;
                bail!(
                    "tap-probe watch printed nothing within {} s",
                    attach_wait.as_secs()
                );
            }
            std::thread::sleep(Duration::from_millis(50));
        }
        Ok(Ok(Self { proc, reader: None }))
    }

    /// Starts the floor and waits until it says it attached.
    pub(crate) fn floor(floor: &Path, out: &Path, attach_wait: Duration) -> anyhow::Result<Self> {
        let mut command = cmd::new(floor);
        command.stdout(create(out)?);
        let mut proc = Proc::spawn(&mut command)?;
        let deadline = std::time::Instant::now() + attach_wait;
        while !std::fs::read_to_string(out).is_ok_and(|text| text.contains("attached")) {
            if let Some(status) = proc.exited()? {
                bail!("the floor exited before attaching ({status})");
            }
            if std::time::Instant::now() > deadline {
                proc.stop()?;
                bail!(
                    "the floor did not attach within {} s",
                    attach_wait.as_secs()
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

    /// SIGINT, then check it stopped in order.
    pub(crate) fn stop(self) -> anyhow::Result<()> {
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
