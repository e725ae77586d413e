//! `tap-probe replay FILE | --synthetic SPEC`: what each queue policy would have done with a
//! recorded (or synthetic) stream of arrivals and reads.

use std::fmt::Write as _;
use std::fs::File;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_common::EventKind;
use tap_probe_trace::{MAX_RING_SIZE, RingSize, TraceError};

use crate::output::Format;
use crate::output::table::{Align, Table};
use tap_probe_replay::live::{self, LiveConfig, LiveResult};
use tap_probe_replay::plot::{self, Panel};
use tap_probe_replay::policy::Policy;
use tap_probe_replay::ring::X86_64_BATCH;
use tap_probe_replay::sim::{Metrics, SimConfig, simulate};
use tap_probe_replay::workload::Workload;
use tap_probe_replay::{Cut, Ops, Stream, load_recording, salvage_recording};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// A trace written by `tap-probe record`.
    #[arg(value_name = "FILE", conflicts_with = "synthetic")]
    pub(crate) file: Option<PathBuf>,
    /// Replay a synthetic workload instead, e.g.
    /// `producer=const:200k,consumer=poisson:150k,duration=2s,ring=256` (grammar in
    /// docs/record-replay.md).
    #[arg(long, value_name = "SPEC")]
    pub(crate) synthetic: Option<String>,
    /// A policy to replay (repeatable): tail-drop, stop-wake:F (F a share of the ring, e.g.
    /// 0.5 or 1/2), wake-every, wake-empty [default: all four, with stop-wake:0.5].
    #[arg(long = "policy", value_name = "POLICY", value_parser = parse_policy)]
    pub(crate) policies: Vec<Policy>,
    /// Ring entries to model instead of the recorded (or spec's) size.
    #[arg(long, value_name = "N")]
    pub(crate) ring_size: Option<RingSize>,
    /// Packets the modelled pfifo qdisc holds [default: the ring size, as the kernel's
    /// pfifo defaults to `tx_queue_len`].
    #[arg(long, value_name = "N", value_parser = clap::value_parser!(u32).range(0..=i64::from(MAX_QDISC_LIMIT)))]
    pub(crate) qdisc_limit: Option<u32>,
    /// Replay a trace that was cut short (the recorder was killed, the machine lost power,
    /// the disk filled up) up to its last whole record, saying what is missing.
    #[arg(long, requires = "file")]
    pub(crate) salvage: bool,
    #[arg(long, value_enum, default_value_t)]
    pub(crate) format: Format,
    /// Also draw ring occupancy over time, one panel per policy, to this SVG file.
    #[arg(long, value_name = "FILE.svg")]
    pub(crate) plot: Option<PathBuf>,
    /// Run the policies on a real ring between two pinned threads and report items/s.
    #[arg(long)]
    pub(crate) live: bool,
    /// How long each policy runs for `--live` (seconds, or with a unit: 500ms, 2m).
    #[arg(long, default_value = "1", value_name = "DURATION", value_parser = crate::cli::duration)]
    pub(crate) live_duration: Duration,
    /// Busy work per item the `--live` reader does (loop rounds), to make it the slower side.
    #[arg(long, default_value_t = 0, value_name = "ROUNDS")]
    pub(crate) live_work: u32,
}

/// The most packets the modelled qdisc may hold: the model allocates room for all of them up
/// front, and no qdisc in front of a tap holds more than the largest ring.
const MAX_QDISC_LIMIT: u32 = MAX_RING_SIZE;

fn parse_policy(s: &str) -> Result<Policy, String> {
    s.parse()
}

/// One policy's result with how long the replay took.
#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct Timed {
    #[serde(flatten)]
    pub(crate) metrics: Metrics,
    /// Wall time of the replay itself (not loading), ns.
    pub(crate) replay_ns: u64,
    /// Operations replayed per second of that time.
    pub(crate) events_per_s: f64,
}

#[derive(Debug, Clone, serde::Serialize)]
pub(crate) struct StreamReport {
    pub(crate) device: String,
    pub(crate) netns: u32,
    pub(crate) ifindex: u32,
    pub(crate) queue: u16,
    pub(crate) recorded_ring_size: u32,
    pub(crate) events: usize,
    /// What the recording saw (absent for synthetic workloads).
    pub(crate) recorded: Option<RecordedCounts>,
    pub(crate) results: Vec<Timed>,
}

#[derive(Debug, Clone, Copy, serde::Serialize)]
pub(crate) struct RecordedCounts {
    pub(crate) enqueued: u64,
    pub(crate) dropped_full_ring: u64,
    pub(crate) busy: u64,
    pub(crate) consumed: u64,
    pub(crate) queue_stops: u64,
    pub(crate) queue_wakes: u64,
}

/// What `replay --format json` prints: where the streams came from and each one's replays.
#[derive(Debug, serde::Serialize)]
struct ReplayOutput<'a> {
    source: String,
    /// Events lost while recording (then the prediction lacks them).
    lost: u64,
    streams: &'a [StreamReport],
}

/// Runs `tap-probe replay`.
///
/// # Errors
/// A bad trace (with the byte offset), an impossible spec, or an output that cannot be
/// written.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    if let Some(path) = &args.plot {
        tap_probe_observer::os::files::check_output(path, "--plot")?;
    }
    let policies = if args.policies.is_empty() {
        Policy::DEFAULTS.to_vec()
    } else {
        args.policies.clone()
    };
    let (source, lost, streams) = load(args)?;
    if args.live {
        return run_live(args, &policies, &streams);
    }
    let reports = replay_streams(
        &streams,
        &policies,
        args.ring_size.map(RingSize::get),
        args.qdisc_limit,
        0,
    );
    if let Some(path) = &args.plot {
        let first = streams
            .first()
            .context("nothing to plot: the trace has no stream")?;
        let plotted = replay_streams(
            std::slice::from_ref(first),
            &policies,
            args.ring_size.map(RingSize::get),
            args.qdisc_limit,
            1000,
        );
        let panels: Vec<Panel<'_>> = plotted[0]
            .results
            .iter()
            .map(|t| Panel {
                title: format!("{} ({} entries)", t.metrics.policy, t.metrics.ring_size),
                series: &t.metrics.occupancy_series,
                ring_size: t.metrics.ring_size,
                span_ns: t.metrics.span_ns,
            })
            .collect();
        plot::occupancy_svg(path, &panels)
            .with_context(|| format!("writing {}", path.display()))?;
        if streams.len() > 1 {
            eprintln!(
                "tap-probe: the plot shows the first stream ({} queue {}) of {}",
                first.device,
                first.queue,
                streams.len()
            );
        }
    }
    crate::output::stdout(&match args.format {
        Format::Json => {
            let output = ReplayOutput {
                source,
                lost,
                streams: &reports,
            };
            serde_json::to_string(&output)? + "\n"
        }
        Format::Table => table(&source, lost, &reports),
    })?;
    if lost > 0 {
        eprintln!(
            "tap-probe: warning: {lost} events were lost while recording; the replay lacks them"
        );
    }
    Ok(())
}

/// The streams to replay: one per recorded (device, queue), or the synthetic one.
fn load(args: &Args) -> anyhow::Result<(String, u64, Vec<Stream>)> {
    if let Some(spec) = &args.synthetic {
        let w = Workload::parse(spec).map_err(|e| anyhow::anyhow!("--synthetic: {e}"))?;
        let ops = w.generate();
        return Ok((
            format!("synthetic {spec}"),
            0,
            vec![Stream {
                device: "synthetic".into(),
                netns: 0,
                ifindex: 0,
                queue: 0,
                ring_size: w.ring,
                ops,
                recorded: [0; 8],
            }],
        ));
    }
    if let Some(path) = &args.file {
        let file = File::open(path).with_context(|| format!("opening {}", path.display()))?;
        let rec = if args.salvage {
            salvage_recording(file)
        } else {
            load_recording(file)
        };
        let rec = rec.map_err(|err| {
            let cut =
                matches!(&err, TraceError::Truncated { what, .. } if !what.starts_with("header"));
            let hint = if cut {
                " (the file was cut short: `tap-probe replay --salvage` replays it up to its \
                 last whole record)"
            } else {
                ""
            };
            anyhow::anyhow!("{err}{hint}").context(format!("reading {}", path.display()))
        })?;
        if let Some(cut) = rec.cut {
            eprintln!(
                "tap-probe: warning: {}",
                cut_warning(path, &rec.header, cut)
            );
        }
        let source = format!(
            "{} (kernel {}, backend {})",
            path.display(),
            rec.header.kernel_release,
            rec.header.backend
        );
        return Ok((source, rec.lost, rec.streams));
    }
    if args.live {
        return Ok(("live".into(), 0, Vec::new()));
    }
    bail!("nothing to replay: give a trace FILE or --synthetic SPEC (or --live)")
}

/// What a salvaged file lacks, in one sentence.
fn cut_warning(path: &std::path::Path, header: &tap_probe_trace::Header, cut: Cut) -> String {
    let size = std::fs::metadata(path).map_or(cut.offset, |m| m.len());
    #[expect(clippy::cast_precision_loss, reason = "seconds for display")]
    let seconds = cut.last_ns.saturating_sub(header.start_ns) as f64 / 1e9;
    format!(
        "{} was cut short (no trailer: the recorder was killed, the machine lost power or the \
         disk filled up): replaying its {} events up to {seconds:.3} s into the recording, \
         which end at byte {}; {} bytes after that are a partial record and are ignored. \
         Whatever happened after the cut is missing and its amount is unknown, and without \
         the trailer the file's checksum cannot be verified",
        path.display(),
        cut.events,
        cut.offset,
        size.saturating_sub(cut.offset),
    )
}

/// Replays every stream under every policy.
#[must_use]
pub(crate) fn replay_streams(
    streams: &[Stream],
    policies: &[Policy],
    ring_size: Option<u32>,
    qdisc_limit: Option<u32>,
    plot_points: usize,
) -> Vec<StreamReport> {
    streams
        .iter()
        .map(|s| {
            let ring = ring_size.unwrap_or(s.ring_size);
            let cfg = SimConfig {
                ring_size: ring,
                cache_batch: X86_64_BATCH,
                qdisc_limit: qdisc_limit.unwrap_or(ring),
                plot_points,
            };
            let results = policies.iter().map(|&p| timed(&s.ops, &cfg, p)).collect();
            let synthetic = s.recorded.iter().all(|&c| c == 0);
            StreamReport {
                device: s.device.clone(),
                netns: s.netns,
                ifindex: s.ifindex,
                queue: s.queue,
                recorded_ring_size: s.ring_size,
                events: s.ops.len(),
                recorded: (!synthetic).then(|| RecordedCounts {
                    enqueued: s.recorded(EventKind::Enqueued),
                    dropped_full_ring: s.recorded(EventKind::DroppedFullRing),
                    busy: s.recorded(EventKind::Busy),
                    consumed: s.recorded(EventKind::Consumed),
                    queue_stops: s.recorded(EventKind::QueueStop),
                    queue_wakes: s.recorded(EventKind::QueueWake),
                }),
                results,
            }
        })
        .collect()
}

fn timed(ops: &Ops, cfg: &SimConfig, policy: Policy) -> Timed {
    let start = Instant::now();
    let metrics = simulate(ops, cfg, policy);
    let elapsed = start.elapsed();
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    let events_per_s = ops.len() as f64 / elapsed.as_secs_f64().max(1e-9);
    Timed {
        metrics,
        replay_ns: u64::try_from(elapsed.as_nanos()).unwrap_or(u64::MAX),
        events_per_s,
    }
}

/// The results as a text table, one block per stream.
#[must_use]
pub(crate) fn table(source: &str, lost: u64, reports: &[StreamReport]) -> String {
    let mut out = String::new();
    let _ = writeln!(out, "replay of {source}");
    if lost > 0 {
        let _ = writeln!(out, "events lost while recording: {lost}");
    }
    for r in reports {
        let _ = writeln!(
            out,
            "\n{} queue {}: {} events, recorded ring {} entries",
            r.device, r.queue, r.events, r.recorded_ring_size
        );
        if let Some(c) = &r.recorded {
            let _ = writeln!(
                out,
                "  recorded: enqueued {}, dropped (ring full) {}, busy {}, consumed {}, stops {}, \
                 wakes {}",
                c.enqueued, c.dropped_full_ring, c.busy, c.consumed, c.queue_stops, c.queue_wakes
            );
        }
        let mut align = [Align::Right; 13];
        align[0] = Align::Left;
        let mut t = Table::new(&align).indent("  ");
        t.row(
            [
                "policy",
                "ring",
                "delivered",
                "ring-drop",
                "qdisc-drop",
                "busy",
                "stops",
                "wakes",
                "stopped-ms",
                "occ-mean",
                "occ-max",
                "p50-us",
                "p99-us",
            ]
            .map(str::to_owned)
            .to_vec(),
        );
        for timed in &r.results {
            let m = &timed.metrics;
            #[expect(clippy::cast_precision_loss, reason = "display")]
            let (stopped_ms, p50, p99) = (
                m.stopped_ns as f64 / 1e6,
                m.delay_p50_ns as f64 / 1e3,
                m.delay_p99_ns as f64 / 1e3,
            );
            t.row(vec![
                m.policy.clone(),
                m.ring_size.to_string(),
                m.delivered.to_string(),
                m.ring_full_drops.to_string(),
                m.qdisc_drops.to_string(),
                m.busy.to_string(),
                m.stops.to_string(),
                m.wakes.to_string(),
                format!("{stopped_ms:.3}"),
                format!("{:.1}", m.mean_occupancy),
                m.max_occupancy.to_string(),
                format!("{p50:.1}"),
                format!("{p99:.1}"),
            ]);
        }
        out.push_str(&t.render());
    }
    out
}

fn run_live(args: &Args, policies: &[Policy], streams: &[Stream]) -> anyhow::Result<()> {
    let ring_size = args
        .ring_size
        .map(RingSize::get)
        .or_else(|| streams.first().map(|s| s.ring_size))
        .unwrap_or(500);
    let cfg = LiveConfig {
        ring_size,
        cache_batch: X86_64_BATCH,
        duration: args.live_duration,
        consumer_work: args.live_work,
    };
    let mut results: Vec<LiveResult> = Vec::new();
    for &p in policies {
        results.push(live::run(&cfg, p)?);
    }
    let text = match args.format {
        Format::Json => serde_json::to_string(&results)? + "\n",
        Format::Table => {
            let pinned = results.first().and_then(|r| r.cpus).map_or_else(
                || "not pinned".to_owned(),
                |(a, b)| format!("CPUs {a} -> {b}"),
            );
            let mut out = format!(
                "live ring of {ring_size} entries, {pinned}, {} s per policy\n",
                args.live_duration.as_secs_f64()
            );
            let mut align = [Align::Right; 7];
            align[0] = Align::Left;
            let mut t = Table::new(&align).indent("  ");
            t.row(
                [
                    "policy",
                    "items/s",
                    "delivered",
                    "dropped",
                    "busy",
                    "stops",
                    "wakes",
                ]
                .map(str::to_owned)
                .to_vec(),
            );
            for r in &results {
                t.row(vec![
                    r.policy.clone(),
                    format!("{:.0}", r.items_per_s),
                    r.delivered.to_string(),
                    r.dropped.to_string(),
                    r.busy.to_string(),
                    r.stops.to_string(),
                    r.wakes.to_string(),
                ]);
            }
            out.push_str(&t.render());
            out
        }
    };
    crate::output::stdout(&text)
}

#[cfg(test)]
mod tests {
    use super::*;
    use clap::Parser as _;

    /// `replay`'s arguments as a command of their own.
    #[derive(clap::Parser)]
    struct ReplayCli {
        #[command(flatten)]
        args: Args,
    }

    fn parse(argv: &[&str]) -> Result<Args, clap::Error> {
        ReplayCli::try_parse_from(std::iter::once("replay").chain(argv.iter().copied()))
            .map(|c| c.args)
    }

    #[test]
    fn arguments() {
        let a = parse(&[
            "t.trace",
            "--policy",
            "stop-wake:1/2",
            "--policy",
            "tail-drop",
        ])
        .unwrap();
        assert_eq!(a.policies, vec![Policy::StopWake(0.5), Policy::TailDrop]);
        assert!(parse(&["t.trace", "--synthetic", "x"]).is_err());
        assert!(parse(&["--policy", "nope"]).is_err());
        assert!(parse(&["--ring-size", "0"]).is_err());
    }

    #[test]
    fn synthetic_replay_runs_every_policy() {
        let args = parse(&[
            "--synthetic",
            "producer=const:200k,consumer=poisson:150k,duration=100ms,ring=256",
        ])
        .unwrap();
        let (_, _, streams) = load(&args).unwrap();
        let reports = replay_streams(&streams, &Policy::DEFAULTS, None, None, 0);
        let r = &reports[0].results;
        assert_eq!(r.len(), 4);
        assert!(r[0].metrics.ring_full_drops > 0, "{:?}", r[0].metrics);
        assert_eq!(r[0].metrics.stops, 0);
        for t in &r[1..] {
            assert_eq!(t.metrics.ring_full_drops, 0);
            assert!(t.metrics.stops > 0);
        }
        let text = table("x", 0, &reports);
        assert!(text.contains("stop-wake:0.5"));
        serde_json::to_string(&reports).unwrap();
    }

    #[test]
    fn bad_inputs_are_errors() {
        let args = parse(&["--synthetic", "producer=const:0,consumer=const:1"]).unwrap();
        let e = format!("{:#}", run(&args).unwrap_err());
        assert!(e.contains("must be above 0"), "{e}");
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("cut.trace");
        std::fs::write(&path, b"TAPTRACE\x01\x00").unwrap();
        let args = parse(&[path.to_str().unwrap()]).unwrap();
        let e = format!("{:#}", run(&args).unwrap_err());
        assert!(e.contains("truncated header (length) at byte 10"), "{e}");
        let args = parse(&[]).unwrap();
        assert!(run(&args).is_err());
    }
}
