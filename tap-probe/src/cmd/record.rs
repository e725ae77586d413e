//! `tap-probe record -o FILE`: per-packet events from the eBPF programs, streamed to a trace
//! file (`docs/trace-format.md`) until Ctrl-C, SIGTERM or `--duration`.
//!
//! The programs write `TraceEvent`s into the `EVENTS` ring buffer; events that do not fit
//! are counted per CPU in `EVENTS_LOST`, and that count goes into the file (as it grows, and
//! in the trailer) and into the summary. [`Recorder`] orders them on their way to the file.

use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_common::EventKind;

use crate::bpf::probe::Probe;
use crate::host::discovery::Discovery;
use crate::host::recorder::{REORDER_WINDOW_NS, Recorder};
use crate::kernel::KernelInfo;
use crate::os::clock::monotonic_ns;
use crate::os::signals::Stop;
use crate::output::progress::{Progress, Status, bytes};
use tap_probe_trace::{DeviceInfo, Header, Trailer};

/// How long the loop sleeps when the ring buffer is empty.
const POLL_SLEEP: Duration = Duration::from_millis(2);
/// How often `--wait` looks for matching devices.
const WAIT_POLL: Duration = Duration::from_millis(50);
/// How often the lost-event counter is read.
const LOST_EVERY: Duration = Duration::from_millis(100);

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) devices: crate::cli::DeviceArgs,
    /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = crate::cli::duration)]
    pub(crate) duration: Option<Duration>,
    /// Start even if no device matches yet: attach, then wait for the first matching
    /// devices to appear and record those (devices that appear later are not added).
    #[arg(long)]
    pub(crate) wait: bool,
}

/// Runs `tap-probe record`.
///
/// # Errors
/// Missing privileges, no matching device, a failure to attach, or a write error. On a
/// signal the file is completed (trailer included) before returning.
#[expect(
    clippy::too_many_lines,
    reason = "set-up, the loop and the orderly end read best in one place"
)]
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    crate::kernel::privileges::check()?;
    let stop = Stop::install()?;
    let mut discovery = Discovery::new(&args.devices.filter())?;
    let mut devices = discovery.scan()?;
    if devices.is_empty() && !args.wait {
        bail!(
            "no tun, tap, veth or macvtap device matches the filter; `tap-probe watch` lists \
             what is there (or pass --wait)"
        );
    }
    // Attach before waiting: attaching is the slow part (BTF), so a device that appears
    // later is tracked within one poll, before its first packet in the usual case.
    let kernel = KernelInfo::load()?;
    let mut probe = Probe::attach_recording(&kernel)?;
    let mut progress = Progress::stderr();
    if devices.is_empty() {
        progress.note("attached; waiting for a device that matches the filter");
        while devices.is_empty() {
            if stop.sleep(WAIT_POLL) {
                bail!("stopped before any device matched the filter; nothing was recorded");
            }
            devices = discovery.scan()?;
        }
    }
    let header = Header {
        kernel_release: kernel.release.clone(),
        backend: probe.sources().hooks(),
        start_ns: monotonic_ns(),
        devices: devices
            .iter()
            .map(|d| DeviceInfo {
                netns: d.key.netns,
                ifindex: d.key.ifindex,
                queues: d.queues,
                ring_size: d.tx_queue_len,
                name: d.name.clone(),
            })
            .collect(),
    };
    let baseline: Vec<(u64, u64)> = devices
        .iter()
        .map(|d| (d.stats.tx_packets, d.stats.tx_dropped))
        .collect();
    let file = File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    let mut recorder = Recorder::new(BufWriter::with_capacity(1 << 20, file), &header)?;

    for d in &devices {
        probe.track(d.key, d.queues, d.slot_flags())?;
    }
    let mut ring = probe.take_events()?;
    for d in &devices {
        progress.note(&format!(
            "recording {} (netns {}, ring {} entries) to {}",
            d.name,
            d.netns,
            d.tx_queue_len,
            args.output.display()
        ));
    }
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut lost_seen = 0u64;
    let mut lost_checked = Instant::now();
    let mut taken = 0u64;
    loop {
        let mut n = 0usize;
        while let Some(item) = ring.next() {
            recorder.push_bytes(&item)?;
            n += 1;
            if n.is_multiple_of(4096) {
                recorder.flush_settled()?;
            }
        }
        taken += n as u64;
        recorder.flush_settled()?;
        probe.flush_log();
        if lost_checked.elapsed() >= LOST_EVERY {
            lost_checked = Instant::now();
            let lost = probe.events_lost()?;
            recorder.lost(monotonic_ns(), lost.saturating_sub(lost_seen))?;
            lost_seen = lost_seen.max(lost);
            // What reached the file so far (the writer's buffer not yet flushed aside).
            let written = std::fs::metadata(&args.output).map_or(0, |m| m.len());
            progress.update(&Status {
                what: "recording",
                left: deadline.map(|d| d.saturating_duration_since(Instant::now())),
                detail: &format!(
                    "{taken} events taken, {} written, {lost_seen} lost; Ctrl-C stops",
                    bytes(written)
                ),
                ..Status::default()
            });
        }
        if deadline.is_some_and(|d| Instant::now() >= d) {
            break;
        }
        if n == 0 && stop.sleep(POLL_SLEEP) {
            break;
        }
    }
    // What is left in the ring buffer, then the final lost count.
    while let Some(item) = ring.next() {
        recorder.push_bytes(&item)?;
    }
    let lost = probe.events_lost()?;
    recorder.lost(monotonic_ns(), lost.saturating_sub(lost_seen))?;
    let (foreign, malformed, late) = (recorder.foreign, recorder.malformed, recorder.late);
    let (mut out, trailer) = recorder.finish()?;
    out.flush()?;
    out.into_inner()
        .map_err(std::io::IntoInnerError::into_error)?
        .sync_all()
        .context("syncing the trace file")?;
    drop(probe);
    progress.finish();

    let after = discovery.scan().unwrap_or_default();
    eprint!("{}", summary(&header, &trailer, &baseline, &after));
    if foreign + malformed + late > 0 {
        eprintln!(
            "  ignored: {foreign} events of untracked devices, {malformed} malformed; {late} \
             written out of order (older than the {} ms window)",
            REORDER_WINDOW_NS / 1_000_000
        );
    }
    Ok(())
}

fn summary(
    header: &Header,
    t: &Trailer,
    baseline: &[(u64, u64)],
    after: &[crate::host::discovery::Device],
) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let counts: Vec<String> = EventKind::ALL
        .iter()
        .map(|&kind| {
            let name = kind.counter().map_or("?", |m| m.name);
            format!("{name} {}", t.count(kind))
        })
        .collect();
    let _ = writeln!(
        s,
        "recorded {} events: {}; lost {}",
        t.events,
        counts.join(", "),
        t.lost
    );
    for (d, (tx0, drop0)) in header.devices.iter().zip(baseline) {
        if let Some(now) = after
            .iter()
            .find(|a| a.key.netns == d.netns && a.key.ifindex == d.ifindex)
        {
            let _ = writeln!(
                s,
                "  {}: kernel tx_packets +{}, tx_dropped +{}",
                d.name,
                now.stats.tx_packets.saturating_sub(*tx0),
                now.stats.tx_dropped.saturating_sub(*drop0)
            );
        }
    }
    s
}
