//! "What would the patched kernel have done?": a userspace model of a tun/tap `ptr_ring`
//! and of the queue policies around it, fed with recorded or synthetic producer arrivals
//! and reader reads.
//!
//! - [`ring`]: the `ptr_ring` as `include/linux/ptr_ring.h` has it (batched zeroing);
//! - [`policy`]: tail-drop and the stop/wake variants of the "avoid tail-drop" series;
//! - [`qdisc`]: the `pfifo` that holds packets while the queue is stopped;
//! - [`sim`]: the discrete-event replay and its metrics;
//! - [`reference`]: a plain model the optimised one is checked against;
//! - [`workload`]: synthetic producer and reader processes;
//! - [`live`]: the same policies on a real two-thread ring;
//! - [`plot`]: occupancy over time as SVG.
//!
//! It depends on nothing of the observer: a recording reaches it as a trace file
//! (`tap-probe-trace`). The modules are public; an item in them is `pub` when the binary,
//! the fidelity test or the fuzz target uses it and `pub(crate)` otherwise, so the compiler
//! still finds dead code.

pub mod live;
pub mod plot;
pub mod policy;
pub mod qdisc;
#[cfg(test)]
mod reference;
pub mod ring;
pub mod sim;
pub mod workload;

use std::collections::HashMap;
use std::io::Read;

use tap_probe_common::EventKind;

use tap_probe_trace::{Record, TraceError, TraceReader, Trailer};

/// The operation code of an arrival; any other value `n` is a read of up to `n` entries.
pub(crate) const ARRIVAL: u32 = 0;

/// A stream of operations on one ring in time order, as two parallel arrays (the replay
/// walks them front to back).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub struct Ops {
    /// ns; non-decreasing.
    pub times: Vec<u64>,
    /// [`ARRIVAL`], or the most entries a read takes.
    pub ops: Vec<u32>,
}

impl Ops {
    pub fn push(&mut self, t: u64, op: u32) {
        self.times.push(t);
        self.ops.push(op);
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.times.len()
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.times.is_empty()
    }

    /// Arrivals and reads built from `(time, op)` pairs in any order: sorted by time, equal
    /// times keeping their order (a hand-made or salvaged list need not be in order).
    #[must_use]
    pub(crate) fn from_unordered(mut pairs: Vec<(u64, u32)>) -> Self {
        pairs.sort_by_key(|p| p.0);
        let (times, ops) = pairs.into_iter().unzip();
        Self { times, ops }
    }
}

/// The operations of one queue of one recorded device, with what the kernel reported.
#[derive(Debug, Clone)]
pub struct Stream {
    pub device: String,
    pub netns: u32,
    pub ifindex: u32,
    pub queue: u16,
    pub ring_size: u32,
    pub ops: Ops,
    /// Recorded events per [`EventKind`] value (index 0 unused).
    pub recorded: [u64; 8],
}

impl Stream {
    #[must_use]
    pub fn recorded(&self, kind: EventKind) -> u64 {
        self.recorded[kind as usize]
    }
}

/// A recording, read into replayable streams.
#[derive(Debug, Clone)]
pub struct Recording {
    pub header: tap_probe_trace::Header,
    /// The trailer's counts; all zero for a salvaged file, which has none.
    pub trailer: Trailer,
    pub streams: Vec<Stream>,
    /// Events lost in the kernel, summed over the file's lost notes (for a complete file,
    /// what the trailer says).
    pub lost: u64,
    /// For a file cut short and salvaged: where its last whole record ends, and the time of
    /// the last event before the cut.
    pub cut: Option<Cut>,
}

/// Where a salvaged recording was cut.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Cut {
    /// The byte offset at which the last whole record ends.
    pub offset: u64,
    /// `CLOCK_MONOTONIC` ns of the last event read (the header's start when there is none).
    pub last_ns: u64,
    /// Event records read before the cut.
    pub events: u64,
}

/// Reads a whole trace: every (device, queue) that saw an arrival or a read becomes a
/// stream. `Enqueued` and `DroppedFullRing` are arrivals (driver calls that tried to
/// produce), `Consumed` a read of one entry; busy returns, stops and wakes are what the
/// model recomputes, and other drops never reached the ring.
///
/// # Errors
/// Whatever the trace reader finds wrong with the file, a file cut short included.
pub fn load_recording<R: Read>(input: R) -> Result<Recording, TraceError> {
    read_recording(TraceReader::new(input)?)
}

/// As [`load_recording`] for a file that may have been cut short (killed recorder, power
/// loss, full disk): the events up to the last whole record, and [`Recording::cut`] says
/// where the file ends.
///
/// # Errors
/// Whatever the trace reader finds wrong with the file other than its end.
pub fn salvage_recording<R: Read>(input: R) -> Result<Recording, TraceError> {
    read_recording(TraceReader::new(input)?.salvage())
}

fn read_recording<R: Read>(mut reader: TraceReader<R>) -> Result<Recording, TraceError> {
    let header = reader.header().clone();
    let mut index: HashMap<(u16, u16), usize> = HashMap::new();
    let mut pairs: Vec<Vec<(u64, u32)>> = Vec::new();
    let mut streams: Vec<Stream> = Vec::new();
    let mut lost = 0u64;
    let mut events = 0u64;
    let mut last_ns = header.start_ns;
    for rec in reader.by_ref() {
        let e = match rec? {
            Record::Event(e) => e,
            Record::Lost { count, .. } => {
                lost = lost.saturating_add(count);
                continue;
            }
        };
        events += 1;
        last_ns = last_ns.max(e.ts_ns);
        let i = *index.entry((e.device, e.queue)).or_insert_with(|| {
            let d = &header.devices[usize::from(e.device)];
            streams.push(Stream {
                device: d.name.clone(),
                netns: d.netns,
                ifindex: d.ifindex,
                queue: e.queue,
                ring_size: d.ring_size,
                ops: Ops::default(),
                recorded: [0; 8],
            });
            pairs.push(Vec::new());
            streams.len() - 1
        });
        streams[i].recorded[e.kind as usize] += 1;
        match e.kind {
            EventKind::Enqueued | EventKind::DroppedFullRing => pairs[i].push((e.ts_ns, ARRIVAL)),
            EventKind::Consumed => pairs[i].push((e.ts_ns, 1)),
            _ => {}
        }
    }
    // The iterator ends with an error (returned above), after the trailer, or (salvaging)
    // at the cut.
    let trailer = reader.trailer().copied().unwrap_or_default();
    let cut = reader.cut().map(|offset| Cut {
        offset,
        last_ns,
        events,
    });
    for (s, p) in streams.iter_mut().zip(pairs) {
        s.ops = Ops::from_unordered(p);
    }
    streams.sort_by(|a, b| (&a.device, a.queue).cmp(&(&b.device, b.queue)));
    Ok(Recording {
        header,
        trailer,
        streams,
        lost,
        cut,
    })
}

#[cfg(test)]
mod tests {
    use super::*;
    use tap_probe_trace::{DeviceInfo, Event, Header, TraceWriter};

    #[test]
    fn recording_becomes_sorted_streams() {
        let header = Header {
            kernel_release: "k".into(),
            backend: "b".into(),
            start_ns: 0,
            devices: vec![DeviceInfo {
                netns: 1,
                ifindex: 2,
                queues: 2,
                ring_size: 8,
                name: "tap0".into(),
            }],
        };
        let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
        let ev = |ts_ns, queue, kind| Event {
            ts_ns,
            device: 0,
            queue,
            cpu: 0,
            kind,
            reason: 0,
        };
        for e in [
            ev(20, 0, EventKind::Consumed),
            ev(10, 0, EventKind::Enqueued),
            ev(15, 1, EventKind::DroppedFullRing),
            ev(30, 0, EventKind::QueueWake),
        ] {
            w.event(&e).unwrap();
        }
        let bytes = w.finish().unwrap().0;
        let rec = load_recording(bytes.as_slice()).unwrap();
        assert_eq!(rec.streams.len(), 2);
        assert_eq!(rec.streams[0].ops.times, vec![10, 20]);
        assert_eq!(rec.streams[0].ops.ops, vec![ARRIVAL, 1]);
        assert_eq!(rec.streams[0].recorded(EventKind::QueueWake), 1);
        assert_eq!(rec.streams[1].ops.ops, vec![ARRIVAL]);
    }
}
