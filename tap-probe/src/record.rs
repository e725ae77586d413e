//! `tap-probe record -o FILE`: per-packet events from the eBPF programs, streamed to a trace
//! file (`docs/trace-format.md`) until Ctrl-C, SIGTERM or `--duration`.
//!
//! The programs write [`TraceEvent`]s into the `EVENTS` ring buffer; events that do not fit
//! are counted per CPU in `EVENTS_LOST`, and that count goes into the file (as it grows, and
//! in the trailer) and into the summary. Events of different CPUs reach the ring buffer
//! slightly out of order: they are sorted within a bounded reorder window before writing,
//! so memory stays bounded however long the recording runs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_common::{DeviceKey, EventKind, TraceEvent};

use crate::discovery::Discovery;
use crate::kernel::KernelInfo;
use crate::probe::Probe;
use crate::signals::Stop;
use crate::trace_file::{DeviceInfo, Event, Header, TraceWriter, Trailer};
use crate::watch::monotonic_ns;

/// Events are written once they are this much older than the newest event seen.
pub(crate) const REORDER_WINDOW_NS: u64 = 10_000_000;
/// Events held for reordering at most; beyond this the oldest is written at once.
pub(crate) const REORDER_MAX: usize = 1 << 20;
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

/// Sorts events within a window and writes them.
pub(crate) struct Recorder<W: Write> {
    writer: TraceWriter<W>,
    devices: HashMap<DeviceKey, u16>,
    heap: BinaryHeap<Reverse<Pending>>,
    seq: u64,
    newest: u64,
    /// Events for devices not in the header (none expected: only tracked devices emit).
    pub(crate) foreign: u64,
    /// Records too short to be an event.
    pub(crate) malformed: u64,
    /// Events written after a later one had already been written (older than the window).
    pub(crate) late: u64,
    last_written: u64,
}

#[derive(PartialEq, Eq, PartialOrd, Ord)]
struct Pending {
    ts: u64,
    seq: u64,
    ev: EventBits,
}

/// `trace_file::Event` with an ordering, for the heap.
#[derive(PartialEq, Eq, PartialOrd, Ord, Clone, Copy)]
struct EventBits {
    device: u16,
    queue: u16,
    cpu: u16,
    kind: u32,
    reason: u32,
}

impl<W: Write> Recorder<W> {
    /// Writes the header.
    ///
    /// # Errors
    /// When the header cannot be written.
    pub(crate) fn new(out: W, header: &Header) -> anyhow::Result<Self> {
        let devices = header
            .devices
            .iter()
            .enumerate()
            .map(|(i, d)| {
                (
                    DeviceKey {
                        netns: d.netns,
                        ifindex: d.ifindex,
                    },
                    u16::try_from(i).unwrap_or(u16::MAX),
                )
            })
            .collect();
        Ok(Self {
            writer: TraceWriter::new(out, header).context("writing the trace header")?,
            devices,
            heap: BinaryHeap::new(),
            seq: 0,
            newest: 0,
            foreign: 0,
            malformed: 0,
            late: 0,
            last_written: 0,
        })
    }

    /// Takes one ring-buffer record.
    ///
    /// # Errors
    /// When writing fails.
    pub(crate) fn push_bytes(&mut self, bytes: &[u8]) -> anyhow::Result<()> {
        if bytes.len() < size_of::<TraceEvent>() {
            self.malformed += 1;
            return Ok(());
        }
        // SAFETY: `TraceEvent` is `repr(C)` plain integers (any bit pattern is valid), the
        // slice holds at least its size, and `read_unaligned` needs no alignment.
        let ev: TraceEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        self.push(&ev)
    }

    /// Takes one event.
    ///
    /// # Errors
    /// When writing fails.
    pub(crate) fn push(&mut self, ev: &TraceEvent) -> anyhow::Result<()> {
        let key = DeviceKey {
            netns: ev.netns,
            ifindex: ev.ifindex,
        };
        let Some(&device) = self.devices.get(&key) else {
            self.foreign += 1;
            return Ok(());
        };
        if EventKind::from_u32(ev.kind).is_none() {
            self.malformed += 1;
            return Ok(());
        }
        self.newest = self.newest.max(ev.ts_ns);
        self.seq += 1;
        self.heap.push(Reverse(Pending {
            ts: ev.ts_ns,
            seq: self.seq,
            ev: EventBits {
                device,
                queue: ev.queue,
                cpu: ev.cpu,
                kind: ev.kind,
                reason: ev.reason,
            },
        }));
        if self.heap.len() > REORDER_MAX {
            self.write_oldest()?;
        }
        Ok(())
    }

    /// Writes every event older than the window.
    ///
    /// # Errors
    /// When writing fails.
    pub(crate) fn flush_settled(&mut self) -> anyhow::Result<()> {
        let limit = self.newest.saturating_sub(REORDER_WINDOW_NS);
        while self.heap.peek().is_some_and(|p| p.0.ts <= limit) {
            self.write_oldest()?;
        }
        Ok(())
    }

    fn write_oldest(&mut self) -> anyhow::Result<()> {
        let Some(Reverse(p)) = self.heap.pop() else {
            return Ok(());
        };
        if p.ts < self.last_written {
            self.late += 1;
        }
        self.last_written = self.last_written.max(p.ts);
        let kind = EventKind::from_u32(p.ev.kind).unwrap_or(EventKind::DroppedOther);
        self.writer.event(&Event {
            ts_ns: p.ts,
            device: p.ev.device,
            queue: p.ev.queue,
            cpu: p.ev.cpu,
            kind,
            reason: p.ev.reason,
        })?;
        Ok(())
    }

    /// Notes `count` more events lost in the kernel.
    ///
    /// # Errors
    /// When writing fails.
    pub(crate) fn lost(&mut self, ts_ns: u64, count: u64) -> anyhow::Result<()> {
        if count > 0 {
            self.writer.lost(ts_ns, count)?;
        }
        Ok(())
    }

    /// Writes what is held and the trailer.
    ///
    /// # Errors
    /// When writing fails.
    pub(crate) fn finish(mut self) -> anyhow::Result<(W, Trailer)> {
        while !self.heap.is_empty() {
            self.write_oldest()?;
        }
        Ok(self.writer.finish()?)
    }
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
    crate::privileges::check()?;
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
    if devices.is_empty() {
        eprintln!("attached; waiting for a device that matches the filter");
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
        probe.track(d.key, d.queues)?;
    }
    let mut ring = probe.take_events()?;
    for d in &devices {
        eprintln!(
            "recording {} (netns {}, ring {} entries) to {}",
            d.name,
            d.netns,
            d.tx_queue_len,
            args.output.display()
        );
    }
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut lost_seen = 0u64;
    let mut lost_checked = Instant::now();
    loop {
        let mut n = 0usize;
        while let Some(item) = ring.next() {
            recorder.push_bytes(&item)?;
            n += 1;
            if n.is_multiple_of(4096) {
                recorder.flush_settled()?;
            }
        }
        recorder.flush_settled()?;
        if lost_checked.elapsed() >= LOST_EVERY {
            lost_checked = Instant::now();
            let lost = probe.events_lost()?;
            recorder.lost(monotonic_ns(), lost.saturating_sub(lost_seen))?;
            lost_seen = lost_seen.max(lost);
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
    after: &[crate::discovery::Device],
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

#[cfg(test)]
mod tests {
    use super::*;
    use crate::trace_file::{Record, TraceReader};

    fn header() -> Header {
        Header {
            kernel_release: "k".into(),
            backend: "tracepoint".into(),
            start_ns: 0,
            devices: vec![DeviceInfo {
                netns: 9,
                ifindex: 4,
                queues: 1,
                ring_size: 500,
                name: "tap0".into(),
            }],
        }
    }

    fn ev(ts_ns: u64, kind: EventKind) -> TraceEvent {
        TraceEvent {
            ts_ns,
            netns: 9,
            ifindex: 4,
            queue: 0,
            cpu: 1,
            kind: kind as u32,
            reason: 0,
            reserved: 0,
        }
    }

    #[test]
    fn events_are_sorted_within_the_window() {
        let mut r = Recorder::new(Vec::new(), &header()).unwrap();
        // CPU skew: 5 arrives after 7; a foreign device is ignored.
        for ts in [1_000, 7_000, 5_000, 3 * REORDER_WINDOW_NS] {
            r.push(&ev(ts, EventKind::Enqueued)).unwrap();
        }
        r.push(&TraceEvent {
            ifindex: 99,
            ..ev(1, EventKind::Consumed)
        })
        .unwrap();
        r.push_bytes(&[0; 8]).unwrap();
        r.flush_settled().unwrap();
        r.lost(10, 2).unwrap();
        assert_eq!((r.foreign, r.malformed, r.late), (1, 1, 0));
        let (bytes, t) = r.finish().unwrap();
        assert_eq!(t.events, 4);
        assert_eq!(t.lost, 2);
        let times: Vec<u64> = TraceReader::new(bytes.as_slice())
            .unwrap()
            .filter_map(|r| match r.unwrap() {
                Record::Event(e) => Some(e.ts_ns),
                Record::Lost { .. } => None,
            })
            .collect();
        assert_eq!(times, vec![1_000, 5_000, 7_000, 3 * REORDER_WINDOW_NS]);
    }
}
