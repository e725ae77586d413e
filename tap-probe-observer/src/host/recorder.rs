//! Events from the CPUs' ring buffers to the trace file, in time order: each CPU's events
//! come nearly in order, and the CPUs' streams are merged up to the time every ring has
//! been read to, so memory stays bounded however long the recording runs.

use std::collections::VecDeque;
use std::io::{self, Seek as _, Write};

use anyhow::Context as _;
use tap_probe_common::{DeviceKey, EventKind, TraceEvent};

use tap_probe_trace::{CutBack, Event, Header, TraceWriter, Trailer};

/// Where a trace goes: something that can also be cut back to a length (a file; a vector in
/// tests), so that a recording that ran out of disk still ends at a whole record.
pub trait Sink: Write {
    /// Drops everything from byte `len` on, and writes on from there.
    ///
    /// # Errors
    /// When the sink refuses.
    fn cut_to(&mut self, len: u64) -> io::Result<()>;
}

/// Bytes kept allocated past the end of a trace file: room for a lost note and the trailer
/// (104 bytes) once the disk is full, a page on most filesystems.
const RESERVE: u64 = 4096;

/// A trace file that keeps [`RESERVE`] bytes allocated past what it wrote
/// (`fallocate(FALLOC_FL_KEEP_SIZE)`): when the disk fills up, a write fails before the
/// reserve is touched, and the end of the file (a lost note, the trailer) still fits. On a
/// filesystem without `fallocate` it is a plain file.
pub struct TraceFile {
    file: std::fs::File,
    /// Where the next write goes.
    at: u64,
    /// Set once reserving failed: the writes from then on use the reserve.
    full: bool,
}

impl TraceFile {
    #[must_use]
    pub fn new(file: std::fs::File) -> Self {
        Self {
            file,
            at: 0,
            full: false,
        }
    }

    /// Flushes to the disk, dropping the reserve past the end.
    ///
    /// # Errors
    /// When the file cannot be synced.
    pub fn sync_all(&self) -> io::Result<()> {
        self.file.set_len(self.at)?;
        self.file.sync_all()
    }
}

impl Write for TraceFile {
    fn write(&mut self, buf: &[u8]) -> io::Result<usize> {
        if !self.full {
            let len = i64::try_from(buf.len() as u64 + RESERVE).unwrap_or(i64::MAX);
            let at = i64::try_from(self.at).unwrap_or(i64::MAX);
            match nix::fcntl::fallocate(
                &self.file,
                nix::fcntl::FallocateFlags::FALLOC_FL_KEEP_SIZE,
                at,
                len,
            ) {
                Ok(()) | Err(nix::errno::Errno::EOPNOTSUPP) => {}
                Err(nix::errno::Errno::ENOSPC) => {
                    self.full = true;
                    return Err(io::Error::from_raw_os_error(libc::ENOSPC));
                }
                Err(err) => return Err(err.into()),
            }
        }
        let n = self.file.write(buf)?;
        self.at += n as u64;
        Ok(n)
    }

    fn flush(&mut self) -> io::Result<()> {
        self.file.flush()
    }
}

impl Sink for TraceFile {
    fn cut_to(&mut self, len: u64) -> io::Result<()> {
        self.file.set_len(len)?;
        self.at = len;
        self.file.seek(io::SeekFrom::Start(len)).map(|_| ())
    }
}

impl Sink for Vec<u8> {
    fn cut_to(&mut self, len: u64) -> io::Result<()> {
        self.truncate(usize::try_from(len).unwrap_or(usize::MAX));
        Ok(())
    }
}

/// How [`Recorder::close`] ended the file.
pub struct Closed<W> {
    pub sink: W,
    /// What the trailer says; `None` when not even it could be written (the file then ends
    /// at its last whole record, for `replay --salvage`).
    pub trailer: Option<Trailer>,
    /// A write that failed, and what the cut back to a whole record dropped.
    pub failure: Option<Failure>,
}

/// A write that failed, and what that cost.
pub struct Failure {
    pub error: io::Error,
    /// Where the file was cut back to (its length).
    pub cut: CutBack,
    /// Events that never reached the file: the cut's, and those held for ordering.
    pub dropped: u64,
}

/// Events are written once every ring has been read this far past them: room for an
/// event stamped a while before it took its place in its ring (a program interrupted in
/// between).
pub const REORDER_WINDOW_NS: u64 = 10_000_000;
/// Events held for reordering at most; beyond this, everything held is written at once.
pub(crate) const REORDER_MAX: usize = 1 << 20;
/// Merges the CPUs' events in time order and writes them.
pub struct Recorder<W: Write> {
    writer: TraceWriter<W>,
    /// By counter slot: the device (its index in the header) and the queue it counts.
    slots: Vec<Option<(u16, u16)>>,
    /// One per ring, by the ring's index.
    lanes: Vec<Lane>,
    /// Events held over all lanes.
    held: usize,
    /// Reused for each batch written.
    batch: Vec<Pending>,
    /// Events for devices not in the header (none expected: only tracked devices emit).
    pub foreign: u64,
    /// Records too short to be an event.
    pub malformed: u64,
    /// Events written after a later one had already been written (older than the window).
    pub late: u64,
    last_written: u64,
}

#[derive(Clone, Copy)]
struct Pending {
    ts: u64,
    ev: EventBits,
}

/// One ring's events not yet written.
#[derive(Default)]
struct Lane {
    /// The CPU whose events the ring holds.
    cpu: u16,
    /// In time order (events of one time in the order they came).
    held: VecDeque<Pending>,
    /// The ring holds nothing older than this that has not been read: the newest event
    /// read, or the time it was last read dry.
    read_to: u64,
}

/// `tap_probe_trace::Event` without its time.
#[derive(Clone, Copy)]
struct EventBits {
    device: u16,
    queue: u16,
    cpu: u16,
    kind: u32,
    reason: u32,
}

impl<W: Write> Recorder<W> {
    /// Writes the header; events will come from one ring per CPU of `cpus`, in that order,
    /// and name their device's queue by its slot: `slot(key, queue)` gives the slot of queue
    /// `queue` of the header's device `key`.
    ///
    /// # Errors
    /// When the header cannot be written.
    pub fn new(
        out: W,
        header: &Header,
        cpus: &[u32],
        slot: impl Fn(DeviceKey, u32) -> Option<u32>,
    ) -> anyhow::Result<Self> {
        let mut by_slot = Vec::new();
        for (i, d) in header.devices.iter().enumerate() {
            let key = DeviceKey {
                netns_inode: d.netns,
                ifindex: d.ifindex,
            };
            let Ok(device) = u16::try_from(i) else {
                continue;
            };
            for queue in 0..d.queues {
                let (Some(Ok(slot)), Ok(queue)) =
                    (slot(key, queue).map(usize::try_from), u16::try_from(queue))
                else {
                    continue;
                };
                if by_slot.len() <= slot {
                    by_slot.resize(slot + 1, None);
                }
                by_slot[slot] = Some((device, queue));
            }
        }
        let lanes = if cpus.is_empty() { &[0][..] } else { cpus };
        Ok(Self {
            writer: TraceWriter::new(out, header).context("writing the trace header")?,
            slots: by_slot,
            lanes: lanes
                .iter()
                .map(|&cpu| Lane {
                    cpu: u16::try_from(cpu).unwrap_or(u16::MAX),
                    ..Lane::default()
                })
                .collect(),
            held: 0,
            batch: Vec::new(),
            foreign: 0,
            malformed: 0,
            late: 0,
            last_written: 0,
        })
    }

    /// Takes one record of ring `ring`.
    ///
    /// # Errors
    /// When writing fails.
    pub fn push_bytes(&mut self, ring: usize, bytes: &[u8]) -> anyhow::Result<()> {
        if bytes.len() < size_of::<TraceEvent>() {
            self.malformed += 1;
            return Ok(());
        }
        // SAFETY: `TraceEvent` is `repr(C)` plain integers (any bit pattern is valid), the
        // slice holds at least its size, and `read_unaligned` needs no alignment.
        let ev: TraceEvent = unsafe { std::ptr::read_unaligned(bytes.as_ptr().cast()) };
        self.push(ring, &ev)
    }

    /// Takes one event of ring `ring`.
    ///
    /// # Errors
    /// When writing fails.
    pub fn push(&mut self, ring: usize, ev: &TraceEvent) -> anyhow::Result<()> {
        let Some(&Some((device, queue))) = self.slots.get(usize::from(ev.slot)) else {
            self.foreign += 1;
            return Ok(());
        };
        if EventKind::from_u32(u32::from(ev.kind)).is_none() {
            self.malformed += 1;
            return Ok(());
        }
        let Some(lane) = self.lanes.get_mut(ring) else {
            self.malformed += 1;
            return Ok(());
        };
        lane.read_to = lane.read_to.max(ev.ts_ns);
        let pending = Pending {
            ts: ev.ts_ns,
            ev: EventBits {
                device,
                queue,
                cpu: lane.cpu,
                kind: u32::from(ev.kind),
                reason: ev.reason,
            },
        };
        // A CPU's events come nearly in time order (a program stamps its event just before
        // it takes its place in the ring; only a program interrupted in between comes
        // late): an event's place is found from the back, where it nearly always is,
        // after those of the same time that came before it.
        let at = lane
            .held
            .iter()
            .rposition(|p| p.ts <= pending.ts)
            .map_or(0, |i| i + 1);
        lane.held.insert(at, pending);
        self.held += 1;
        if self.held > REORDER_MAX {
            self.write_until(u64::MAX)?;
        }
        Ok(())
    }

    /// Notes that ring `ring` was read dry at a time no earlier than `ts_ns`: it holds
    /// nothing older that is still to come (but late stamps, which the window covers).
    pub fn read_dry(&mut self, ring: usize, ts_ns: u64) {
        if let Some(lane) = self.lanes.get_mut(ring) {
            lane.read_to = lane.read_to.max(ts_ns);
        }
    }

    /// Writes every event that every ring has been read past by more than the window.
    ///
    /// # Errors
    /// When writing fails.
    pub fn flush_settled(&mut self) -> anyhow::Result<()> {
        let read_to = self.lanes.iter().map(|l| l.read_to).min().unwrap_or(0);
        self.write_until(read_to.saturating_sub(REORDER_WINDOW_NS))?;
        Ok(())
    }

    /// Writes the events of every lane up to `limit`, merged in time order.
    fn write_until(&mut self, limit: u64) -> io::Result<()> {
        let mut batch = std::mem::take(&mut self.batch);
        for lane in &mut self.lanes {
            while let Some(p) = lane.held.pop_front_if(|p| p.ts <= limit) {
                batch.push(p);
            }
        }
        self.held -= batch.len();
        // The batch is a run per lane, each in order: a stable sort merges the runs, and
        // keeps the order of events of one time.
        batch.sort_by_key(|p| p.ts);
        let mut result = Ok(());
        for (i, p) in batch.iter().enumerate() {
            if let Err(err) = self.write(p) {
                // The event that failed is the writer's to count (it cuts it back); those
                // after it are held again, in order before anything held (all later).
                let rest = &batch[i + 1..];
                self.held += rest.len();
                let lane = &mut self.lanes[0].held;
                rest.iter().rev().for_each(|p| lane.push_front(*p));
                result = Err(err);
                break;
            }
        }
        batch.clear();
        self.batch = batch;
        result
    }

    fn write(&mut self, p: &Pending) -> io::Result<()> {
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
        })
    }

    /// Notes `count` more events lost in the kernel.
    ///
    /// # Errors
    /// When writing fails.
    pub fn lost(&mut self, ts_ns: u64, count: u64) -> anyhow::Result<()> {
        if count > 0 {
            self.writer.lost(ts_ns, count)?;
        }
        Ok(())
    }

    /// Writes what is held and the trailer.
    ///
    /// # Errors
    /// When writing fails.
    #[cfg(test)]
    pub(crate) fn finish(mut self) -> anyhow::Result<(W, Trailer)> {
        self.write_until(u64::MAX)?;
        Ok(self.writer.finish()?)
    }
}

impl<W: Sink> Recorder<W> {
    /// Ends the file: a lost note of `lost` more events at `ts_ns`, what is held, and the
    /// trailer. When a write fails here, or `failed` already did: the file is cut back to its
    /// last whole record and ended there, with the events that did not make it counted in
    /// the lost note; when even that cannot be written, it is left ending at that record.
    pub fn close(mut self, ts_ns: u64, lost: u64, failed: Option<io::Error>) -> Closed<W> {
        let error = match failed {
            Some(error) => error,
            None => match self.end_normally(ts_ns, lost) {
                Ok(trailer) => {
                    return Closed {
                        sink: self.writer.into_inner(),
                        trailer: Some(trailer),
                        failure: None,
                    };
                }
                Err(error) => error,
            },
        };
        let held = self.held as u64;
        self.lanes.iter_mut().for_each(|l| l.held.clear());
        self.held = 0;
        let mut cut = self.writer.cut_back();
        let dropped = held + cut.events;
        let trailer = match self.writer.get_mut().cut_to(cut.offset) {
            Ok(()) => self
                .writer
                .lost(ts_ns, lost + dropped)
                .and_then(|()| self.writer.end())
                .ok(),
            Err(_) => None,
        };
        if trailer.is_none() {
            // Not even the note and the trailer fit: end at the last whole record.
            cut = self.writer.cut_back();
            let _ = self.writer.get_mut().cut_to(cut.offset);
        }
        Closed {
            sink: self.writer.into_inner(),
            trailer,
            failure: Some(Failure {
                error,
                cut,
                dropped,
            }),
        }
    }

    fn end_normally(&mut self, ts_ns: u64, lost: u64) -> io::Result<Trailer> {
        if lost > 0 {
            self.writer.lost(ts_ns, lost)?;
        }
        self.write_until(u64::MAX)?;
        self.writer.end()
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

    /// The header's device counts its queue 0 in slot 7.
    const SLOT: u16 = 7;

    fn recorder(cpus: &[u32]) -> Recorder<Vec<u8>> {
        Recorder::new(Vec::new(), &header(), cpus, |key, queue| {
            (key == DeviceKey {
                netns_inode: 9,
                ifindex: 4,
            } && queue == 0)
                .then_some(u32::from(SLOT))
        })
        .unwrap()
    }

    fn ev(ts_ns: u64, kind: EventKind) -> TraceEvent {
        TraceEvent {
            ts_ns,
            slot: SLOT,
            kind: kind as u16,
            reason: 0,
        }
    }

    /// The time and kind of every event in a trace, in file order.
    fn events_in(trace: &[u8]) -> Vec<(u64, EventKind)> {
        TraceReader::new(trace)
            .unwrap()
            .filter_map(|r| match r.unwrap() {
                Record::Event(e) => Some((e.ts_ns, e.kind)),
                Record::Lost { .. } => None,
            })
            .collect()
    }

    #[test]
    fn events_are_sorted_within_the_window() {
        let mut r = recorder(&[1]);
        // CPU skew: 5 arrives after 7; a foreign device is ignored.
        for ts in [1_000, 7_000, 5_000, 3 * REORDER_WINDOW_NS] {
            r.push(0, &ev(ts, EventKind::Enqueued)).unwrap();
        }
        r.push(
            0,
            &TraceEvent {
                slot: SLOT + 1,
                ..ev(1, EventKind::Consumed)
            },
        )
        .unwrap();
        r.push_bytes(0, &[0; 8]).unwrap();
        r.flush_settled().unwrap();
        r.lost(10, 2).unwrap();
        assert_eq!((r.foreign, r.malformed, r.late), (1, 1, 0));
        let (bytes, t) = r.finish().unwrap();
        assert_eq!(t.events, 4);
        assert_eq!(t.lost, 2);
        let times: Vec<u64> = events_in(&bytes).iter().map(|e| e.0).collect();
        assert_eq!(times, vec![1_000, 5_000, 7_000, 3 * REORDER_WINDOW_NS]);
    }

    #[test]
    fn events_of_one_time_keep_the_order_they_came_in() {
        let mut r = recorder(&[1]);
        let came = [
            (5_000, EventKind::Enqueued),
            (5_000, EventKind::Consumed),
            (3_000, EventKind::QueueStop),
            (5_000, EventKind::Busy),
            (1_000, EventKind::DroppedFullRing),
        ];
        for (ts, kind) in came {
            r.push(0, &ev(ts, kind)).unwrap();
        }
        let (bytes, _) = r.finish().unwrap();
        let written = events_in(&bytes);
        assert_eq!(
            written,
            vec![
                (1_000, EventKind::DroppedFullRing),
                (3_000, EventKind::QueueStop),
                (5_000, EventKind::Enqueued),
                (5_000, EventKind::Consumed),
                (5_000, EventKind::Busy),
            ]
        );
    }

    #[test]
    fn rings_are_merged_up_to_the_time_every_ring_was_read_to() {
        let w = REORDER_WINDOW_NS;
        let mut r = recorder(&[0, 1]);
        for ts in [1_000, 4_000, 5 * w] {
            r.push(0, &ev(ts, EventKind::Enqueued)).unwrap();
        }
        r.flush_settled().unwrap();
        assert_eq!(r.held, 3, "ring 1 was not read yet: it may hold anything");
        for ts in [2_000, 3_000] {
            r.push(1, &ev(ts, EventKind::Consumed)).unwrap();
        }
        r.flush_settled().unwrap();
        assert_eq!(r.held, 5, "ring 1 was read to 3,000 only");
        r.read_dry(1, 4 * w);
        r.flush_settled().unwrap();
        assert_eq!(r.held, 1, "both rings were read past 3 windows");
        assert_eq!(r.late, 0);
        let (bytes, t) = r.finish().unwrap();
        assert_eq!(t.events, 5);
        // Each event carries the CPU of the ring it came from.
        let cpus: Vec<u16> = TraceReader::new(&bytes[..])
            .unwrap()
            .filter_map(|r| match r.unwrap() {
                Record::Event(e) => Some(e.cpu),
                Record::Lost { .. } => None,
            })
            .collect();
        assert_eq!(cpus, [0, 1, 1, 0, 0]);
        let written = events_in(&bytes);
        assert_eq!(
            written,
            vec![
                (1_000, EventKind::Enqueued),
                (2_000, EventKind::Consumed),
                (3_000, EventKind::Consumed),
                (4_000, EventKind::Enqueued),
                (5 * w, EventKind::Enqueued),
            ]
        );
    }
}
