//! Events from the ring buffer to the trace file: sorted within a bounded window, since
//! events of different CPUs reach the ring buffer slightly out of order, so memory stays
//! bounded however long the recording runs.

use std::cmp::Reverse;
use std::collections::{BinaryHeap, HashMap};
use std::io::Write;

use anyhow::Context as _;
use tap_probe_common::{DeviceKey, EventKind, TraceEvent};

use tap_probe_trace::{Event, Header, TraceWriter, Trailer};

/// Events are written once they are this much older than the newest event seen.
pub(crate) const REORDER_WINDOW_NS: u64 = 10_000_000;
/// Events held for reordering at most; beyond this the oldest is written at once.
pub(crate) const REORDER_MAX: usize = 1 << 20;
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

/// `tap_probe_trace::Event` with an ordering, for the heap.
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

#[cfg(test)]
mod tests {
    use super::*;
    use tap_probe_trace::{DeviceInfo, Record, TraceReader};

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
