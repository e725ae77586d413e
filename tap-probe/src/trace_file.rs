//! The trace file `tap-probe record` writes and `tap-probe replay` reads: a versioned
//! header, length-delimited records, a trailer with counts and a CRC-32. The layout is
//! documented byte by byte in `docs/trace-format.md`; this module is its only reader and
//! writer.
//!
//! Both directions stream: [`TraceWriter`] holds one fixed-size buffer, [`TraceReader`] one
//! record, so memory stays bounded whatever the length of the recording. Every error the
//! reader reports names what was wrong and the byte offset where it was found.

use std::fmt;
use std::io::{self, BufReader, Read, Write};

use tap_probe_common::EventKind;

/// The first eight bytes of every trace file.
pub(crate) const MAGIC: [u8; 8] = *b"TAPTRACE";
/// The format version this build writes and the only one it reads.
pub(crate) const FORMAT_VERSION: u16 = 1;
/// Record types (the byte before each record's length).
pub(crate) const REC_EVENT: u8 = 1;
pub(crate) const REC_LOST: u8 = 2;
pub(crate) const REC_TRAILER: u8 = 0xff;
/// Payload length of an event record.
pub(crate) const EVENT_LEN: usize = 20;
/// Payload length of a lost-records record.
pub(crate) const LOST_LEN: usize = 16;
/// Payload length of the trailer.
pub(crate) const TRAILER_LEN: usize = 8 + 8 * KIND_SLOTS + 8 + 4;
/// Per-kind counters in the trailer, indexed by the [`EventKind`] value (slot 0 unused).
pub(crate) const KIND_SLOTS: usize = 8;
/// Longest record payload a reader accepts; longer lengths mean a corrupt file.
pub(crate) const MAX_RECORD_LEN: u64 = 4096;
/// Longest header body a reader accepts.
pub(crate) const MAX_HEADER_LEN: u32 = 1 << 20;

// The known payloads are shorter than 128 bytes: their varint length is one byte.
const EVENT_LEN_BYTE: u8 = one_byte_len(EVENT_LEN);
const LOST_LEN_BYTE: u8 = one_byte_len(LOST_LEN);
const TRAILER_LEN_BYTE: u8 = one_byte_len(TRAILER_LEN);

const fn one_byte_len(n: usize) -> u8 {
    assert!(n < 128);
    #[expect(clippy::cast_possible_truncation, reason = "checked just above")]
    let b = n as u8;
    b
}

/// Size of the fixed part before the header body: magic, version, header length.
const PREAMBLE_LEN: u64 = 8 + 2 + 4;
/// The writer's buffer; flushed to the sink when it holds this much.
const WRITE_BUFFER: usize = 64 << 10;

/// One device of the recording.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct DeviceInfo {
    /// Inode of the device's network namespace.
    pub netns: u32,
    pub ifindex: u32,
    /// Transmit queues (`num_tx_queues`).
    pub queues: u32,
    /// Entries of each queue's `ptr_ring`: `tx_queue_len` for tun/tap.
    pub ring_size: u32,
    pub name: String,
}

/// What the file says about the recording before its first record.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Header {
    /// `uname -r` of the recording host.
    pub kernel_release: String,
    /// The probe backend that produced the events (e.g. `tracepoint`).
    pub backend: String,
    /// `CLOCK_MONOTONIC` ns when recording began.
    pub start_ns: u64,
    pub devices: Vec<DeviceInfo>,
}

/// One per-packet or per-queue event. `device` indexes [`Header::devices`].
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct Event {
    /// `CLOCK_MONOTONIC` ns.
    pub ts_ns: u64,
    pub device: u16,
    pub queue: u16,
    pub cpu: u16,
    pub kind: EventKind,
    /// `enum skb_drop_reason` for `DroppedOther`, 0 otherwise.
    pub reason: u32,
}

/// A record of the file body.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Record {
    Event(Event),
    /// `count` events did not fit in the kernel's ring buffer; noticed at `ts_ns`.
    Lost {
        ts_ns: u64,
        count: u64,
    },
}

/// The end of the file: what the writer counted, and the checksum of everything before it.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub struct Trailer {
    /// Event records in the file.
    pub events: u64,
    /// Event records per [`EventKind`] value (index 0 unused).
    pub counts: [u64; KIND_SLOTS],
    /// Events lost in the kernel (ring buffer full), summed.
    pub lost: u64,
    /// CRC-32 (IEEE) of every byte from the start of the file to this field.
    pub checksum: u32,
}

impl Trailer {
    #[must_use]
    pub(crate) fn count(&self, kind: EventKind) -> u64 {
        self.counts[kind as usize]
    }
}

/// Why a trace file could not be read.
#[derive(Debug)]
pub enum TraceError {
    /// The file ended inside `what`, which started at byte `offset`.
    Truncated {
        offset: u64,
        what: &'static str,
    },
    /// The first bytes are not [`MAGIC`].
    BadMagic,
    UnsupportedVersion {
        found: u16,
    },
    /// `what` at byte `offset` is not valid.
    Corrupt {
        offset: u64,
        what: String,
    },
    ChecksumMismatch {
        offset: u64,
        stored: u32,
        computed: u32,
    },
    Io {
        offset: u64,
        source: io::Error,
    },
}

impl fmt::Display for TraceError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Truncated { offset, what } => {
                write!(f, "truncated {what} at byte {offset}")
            }
            Self::BadMagic => {
                f.write_str("not a tap-probe trace: bad magic at byte 0 (expected \"TAPTRACE\")")
            }
            Self::UnsupportedVersion { found } => write!(
                f,
                "unsupported format version {found} at byte 8 (this tap-probe reads \
                 {FORMAT_VERSION})"
            ),
            Self::Corrupt { offset, what } => write!(f, "corrupt trace at byte {offset}: {what}"),
            Self::ChecksumMismatch {
                offset,
                stored,
                computed,
            } => write!(
                f,
                "checksum mismatch at byte {offset}: the trailer says {stored:08x}, the \
                 content gives {computed:08x}"
            ),
            Self::Io { offset, source } => write!(f, "read error at byte {offset}: {source}"),
        }
    }
}

impl std::error::Error for TraceError {
    fn source(&self) -> Option<&(dyn std::error::Error + 'static)> {
        match self {
            Self::Io { source, .. } => Some(source),
            _ => None,
        }
    }
}

/// Streams records into `W`. Call [`TraceWriter::finish`] to write the trailer: a file
/// without one reads as truncated.
pub(crate) struct TraceWriter<W: Write> {
    out: W,
    buf: Vec<u8>,
    crc: crc32fast::Hasher,
    trailer: Trailer,
    devices: usize,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header.
    ///
    /// # Errors
    /// A header that does not fit the format (more than 65535 devices, names longer than
    /// 65535 bytes), or a write error.
    pub(crate) fn new(out: W, header: &Header) -> io::Result<Self> {
        let mut body = Vec::new();
        body.extend_from_slice(&header.start_ns.to_le_bytes());
        put_str(&mut body, &header.kernel_release)?;
        put_str(&mut body, &header.backend)?;
        let count = u16::try_from(header.devices.len())
            .map_err(|_| invalid("more than 65535 devices in one trace"))?;
        body.extend_from_slice(&count.to_le_bytes());
        for d in &header.devices {
            for v in [d.netns, d.ifindex, d.queues, d.ring_size] {
                body.extend_from_slice(&v.to_le_bytes());
            }
            put_str(&mut body, &d.name)?;
        }
        let body_len = u32::try_from(body.len())
            .ok()
            .filter(|&n| n <= MAX_HEADER_LEN)
            .ok_or_else(|| invalid("trace header too large"))?;
        let mut buf = Vec::with_capacity(WRITE_BUFFER + 64);
        buf.extend_from_slice(&MAGIC);
        buf.extend_from_slice(&FORMAT_VERSION.to_le_bytes());
        buf.extend_from_slice(&body_len.to_le_bytes());
        buf.extend_from_slice(&body);
        let mut w = Self {
            out,
            buf,
            crc: crc32fast::Hasher::new(),
            trailer: Trailer::default(),
            devices: header.devices.len(),
        };
        w.flush_buf()?;
        Ok(w)
    }

    /// Appends one event.
    ///
    /// # Errors
    /// An event for a device not in the header, or a write error.
    pub(crate) fn event(&mut self, e: &Event) -> io::Result<()> {
        if usize::from(e.device) >= self.devices {
            return Err(invalid("event for a device missing from the header"));
        }
        let mut rec = [0u8; 2 + EVENT_LEN];
        rec[0] = REC_EVENT;
        rec[1] = EVENT_LEN_BYTE;
        rec[2..10].copy_from_slice(&e.ts_ns.to_le_bytes());
        rec[10..12].copy_from_slice(&e.device.to_le_bytes());
        rec[12..14].copy_from_slice(&e.queue.to_le_bytes());
        rec[14..16].copy_from_slice(&e.cpu.to_le_bytes());
        rec[16] = e.kind as u8;
        rec[18..22].copy_from_slice(&e.reason.to_le_bytes());
        self.buf.extend_from_slice(&rec);
        self.trailer.events += 1;
        self.trailer.counts[e.kind as usize] += 1;
        self.maybe_flush()
    }

    /// Appends a note that `count` events were lost in the kernel by `ts_ns`.
    ///
    /// # Errors
    /// A write error.
    pub(crate) fn lost(&mut self, ts_ns: u64, count: u64) -> io::Result<()> {
        self.buf.extend_from_slice(&[REC_LOST, LOST_LEN_BYTE]);
        self.buf.extend_from_slice(&ts_ns.to_le_bytes());
        self.buf.extend_from_slice(&count.to_le_bytes());
        self.trailer.lost += count;
        self.maybe_flush()
    }

    /// Writes the trailer, flushes, and hands back the sink and the trailer.
    ///
    /// # Errors
    /// A write error.
    pub(crate) fn finish(mut self) -> io::Result<(W, Trailer)> {
        self.buf.extend_from_slice(&[REC_TRAILER, TRAILER_LEN_BYTE]);
        self.buf
            .extend_from_slice(&self.trailer.events.to_le_bytes());
        for c in self.trailer.counts {
            self.buf.extend_from_slice(&c.to_le_bytes());
        }
        self.buf.extend_from_slice(&self.trailer.lost.to_le_bytes());
        self.flush_buf()?;
        self.trailer.checksum = self.crc.clone().finalize();
        self.out.write_all(&self.trailer.checksum.to_le_bytes())?;
        self.out.flush()?;
        Ok((self.out, self.trailer))
    }

    fn maybe_flush(&mut self) -> io::Result<()> {
        if self.buf.len() >= WRITE_BUFFER {
            self.flush_buf()?;
        }
        Ok(())
    }

    fn flush_buf(&mut self) -> io::Result<()> {
        self.crc.update(&self.buf);
        self.out.write_all(&self.buf)?;
        self.buf.clear();
        Ok(())
    }
}

fn put_str(out: &mut Vec<u8>, s: &str) -> io::Result<()> {
    let len = u16::try_from(s.len()).map_err(|_| invalid("string longer than 65535 bytes"))?;
    out.extend_from_slice(&len.to_le_bytes());
    out.extend_from_slice(s.as_bytes());
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_owned())
}

/// Reads a trace: the header on [`TraceReader::new`], then records as an iterator. The
/// iterator ends after a valid trailer ([`TraceReader::trailer`]); an error ends it too.
pub struct TraceReader<R: Read> {
    src: Source<R>,
    header: Header,
    trailer: Option<Trailer>,
    /// Set once the iterator returned `None` or an error.
    done: bool,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header.
    ///
    /// # Errors
    /// A file that is not a trace, of another version, or whose header is cut or corrupt.
    pub(crate) fn new(inner: R) -> Result<Self, TraceError> {
        let mut src = Source {
            inner: BufReader::with_capacity(64 << 10, inner),
            offset: 0,
            crc: crc32fast::Hasher::new(),
        };
        let mut magic = [0u8; 8];
        src.exact(&mut magic, 0, "header (magic)")?;
        if magic != MAGIC {
            return Err(TraceError::BadMagic);
        }
        let mut v = [0u8; 2];
        src.exact(&mut v, 8, "header (version)")?;
        let version = u16::from_le_bytes(v);
        if version != FORMAT_VERSION {
            return Err(TraceError::UnsupportedVersion { found: version });
        }
        let mut l = [0u8; 4];
        src.exact(&mut l, 10, "header (length)")?;
        let body_len = u32::from_le_bytes(l);
        if body_len > MAX_HEADER_LEN {
            return Err(TraceError::Corrupt {
                offset: 10,
                what: format!("header length {body_len} exceeds {MAX_HEADER_LEN}"),
            });
        }
        let mut body = vec![0u8; body_len as usize];
        src.exact(&mut body, PREAMBLE_LEN, "header")?;
        let header = parse_header(&body)?;
        Ok(Self {
            src,
            header,
            trailer: None,
            done: false,
        })
    }

    #[must_use]
    pub(crate) fn header(&self) -> &Header {
        &self.header
    }

    /// The trailer, once the iterator has reached it (and the checksum matched).
    #[must_use]
    pub(crate) fn trailer(&self) -> Option<&Trailer> {
        self.trailer.as_ref()
    }

    fn next_record(&mut self) -> Result<Option<Record>, TraceError> {
        loop {
            let start = self.src.offset;
            let mut kind = [0u8; 1];
            self.src
                .exact(&mut kind, start, "file (it ends without a trailer)")?;
            let len = self.src.varint(start)?;
            if len > MAX_RECORD_LEN {
                return Err(TraceError::Corrupt {
                    offset: start,
                    what: format!("record length {len} exceeds {MAX_RECORD_LEN}"),
                });
            }
            let len = usize::try_from(len).unwrap_or(usize::MAX);
            let fixed = match kind[0] {
                REC_EVENT => Some(EVENT_LEN),
                REC_LOST => Some(LOST_LEN),
                REC_TRAILER => Some(TRAILER_LEN),
                _ => None,
            };
            if let Some(fixed) = fixed
                && fixed != len
            {
                return Err(TraceError::Corrupt {
                    offset: start,
                    what: format!(
                        "record of type {} has length {len}, expected {fixed}",
                        kind[0]
                    ),
                });
            }
            // The longest known payload; unknown ones are skipped in chunks.
            let mut buf = [0u8; TRAILER_LEN];
            let payload = &mut buf[..len.min(TRAILER_LEN)];
            match kind[0] {
                REC_EVENT => {
                    self.src.exact(payload, start, "record")?;
                    return self.event(payload, start).map(|e| Some(Record::Event(e)));
                }
                REC_LOST => {
                    self.src.exact(payload, start, "record")?;
                    return Ok(Some(Record::Lost {
                        ts_ns: le_u64(&payload[0..8]),
                        count: le_u64(&payload[8..16]),
                    }));
                }
                REC_TRAILER => {
                    // The checksum covers everything before its own four bytes.
                    let body = &mut payload[..TRAILER_LEN - 4];
                    self.src.exact(body, start, "trailer")?;
                    let computed = self.src.crc.clone().finalize();
                    let crc_at = self.src.offset;
                    let mut stored = [0u8; 4];
                    self.src.exact(&mut stored, start, "trailer")?;
                    let stored = u32::from_le_bytes(stored);
                    if stored != computed {
                        return Err(TraceError::ChecksumMismatch {
                            offset: crc_at,
                            stored,
                            computed,
                        });
                    }
                    let mut t = Trailer {
                        events: le_u64(&body[0..8]),
                        lost: le_u64(&body[8 + 8 * KIND_SLOTS..16 + 8 * KIND_SLOTS]),
                        checksum: stored,
                        ..Trailer::default()
                    };
                    for (i, c) in t.counts.iter_mut().enumerate() {
                        *c = le_u64(&body[8 + 8 * i..16 + 8 * i]);
                    }
                    let end = self.src.offset;
                    if self.src.more()? {
                        return Err(TraceError::Corrupt {
                            offset: end,
                            what: "data after the trailer".to_owned(),
                        });
                    }
                    self.trailer = Some(t);
                    return Ok(None);
                }
                // A record type this version does not know: its length lets us skip it.
                _ => self.src.skip(len, start)?,
            }
        }
    }

    fn event(&self, p: &[u8], start: u64) -> Result<Event, TraceError> {
        let device = u16::from_le_bytes([p[8], p[9]]);
        if usize::from(device) >= self.header.devices.len() {
            return Err(TraceError::Corrupt {
                offset: start,
                what: format!(
                    "event for device {device}, but the header lists {}",
                    self.header.devices.len()
                ),
            });
        }
        let kind = EventKind::from_u32(u32::from(p[14])).ok_or_else(|| TraceError::Corrupt {
            offset: start,
            what: format!("unknown event kind {}", p[14]),
        })?;
        Ok(Event {
            ts_ns: le_u64(&p[0..8]),
            device,
            queue: u16::from_le_bytes([p[10], p[11]]),
            cpu: u16::from_le_bytes([p[12], p[13]]),
            kind,
            reason: u32::from_le_bytes([p[16], p[17], p[18], p[19]]),
        })
    }
}

impl<R: Read> Iterator for TraceReader<R> {
    type Item = Result<Record, TraceError>;

    fn next(&mut self) -> Option<Self::Item> {
        if self.done {
            return None;
        }
        match self.next_record() {
            Ok(Some(r)) => Some(Ok(r)),
            Ok(None) => {
                self.done = true;
                None
            }
            Err(e) => {
                self.done = true;
                Some(Err(e))
            }
        }
    }
}

/// A byte source that knows its offset and checksums what it hands out.
struct Source<R: Read> {
    inner: BufReader<R>,
    offset: u64,
    crc: crc32fast::Hasher,
}

impl<R: Read> Source<R> {
    /// Fills `buf`; a short read is "truncated `what` at byte `start`".
    fn exact(&mut self, buf: &mut [u8], start: u64, what: &'static str) -> Result<(), TraceError> {
        match self.inner.read_exact(buf) {
            Ok(()) => {
                self.crc.update(buf);
                self.offset += buf.len() as u64;
                Ok(())
            }
            Err(e) if e.kind() == io::ErrorKind::UnexpectedEof => Err(TraceError::Truncated {
                offset: start,
                what,
            }),
            Err(source) => Err(TraceError::Io {
                offset: self.offset,
                source,
            }),
        }
    }

    /// Reads and drops `len` bytes (a record of an unknown type).
    fn skip(&mut self, mut len: usize, start: u64) -> Result<(), TraceError> {
        let mut chunk = [0u8; 256];
        while len > 0 {
            let n = len.min(chunk.len());
            self.exact(&mut chunk[..n], start, "record")?;
            len -= n;
        }
        Ok(())
    }

    /// An unsigned LEB128 length of at most 10 bytes.
    fn varint(&mut self, start: u64) -> Result<u64, TraceError> {
        let mut value = 0u64;
        for i in 0..10 {
            let mut b = [0u8; 1];
            self.exact(&mut b, start, "record")?;
            let bits = u64::from(b[0] & 0x7f);
            if i == 9 && b[0] > 1 {
                break;
            }
            value |= bits << (7 * i);
            if b[0] & 0x80 == 0 {
                return Ok(value);
            }
        }
        Err(TraceError::Corrupt {
            offset: start,
            what: "record length is not a valid varint".to_owned(),
        })
    }

    /// Whether any byte is left.
    fn more(&mut self) -> Result<bool, TraceError> {
        let mut b = [0u8; 1];
        loop {
            match self.inner.read(&mut b) {
                Ok(n) => return Ok(n > 0),
                Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
                Err(source) => {
                    return Err(TraceError::Io {
                        offset: self.offset,
                        source,
                    });
                }
            }
        }
    }
}

fn le_u64(b: &[u8]) -> u64 {
    let mut a = [0u8; 8];
    a.copy_from_slice(&b[..8]);
    u64::from_le_bytes(a)
}

/// Parses the header body; offsets in errors are file offsets.
fn parse_header(body: &[u8]) -> Result<Header, TraceError> {
    let mut c = Cursor { body, at: 0 };
    let start_ns = c.u64("start time")?;
    let kernel_release = c.str("kernel release")?;
    let backend = c.str("backend name")?;
    let count = c.u16("device count")?;
    let mut devices = Vec::with_capacity(usize::from(count).min(1024));
    for _ in 0..count {
        let netns = c.u32("device netns")?;
        let ifindex = c.u32("device ifindex")?;
        let queues = c.u32("device queue count")?;
        let ring_size = c.u32("device ring size")?;
        let name = c.str("device name")?;
        devices.push(DeviceInfo {
            netns,
            ifindex,
            queues,
            ring_size,
            name,
        });
    }
    if c.at != body.len() {
        return Err(TraceError::Corrupt {
            offset: c.file_offset(),
            what: format!(
                "{} unexplained bytes at the end of the header",
                body.len() - c.at
            ),
        });
    }
    Ok(Header {
        kernel_release,
        backend,
        start_ns,
        devices,
    })
}

struct Cursor<'a> {
    body: &'a [u8],
    at: usize,
}

impl Cursor<'_> {
    fn file_offset(&self) -> u64 {
        PREAMBLE_LEN + self.at as u64
    }

    fn take(&mut self, n: usize, what: &str) -> Result<&[u8], TraceError> {
        if self.body.len() - self.at < n {
            return Err(TraceError::Corrupt {
                offset: self.file_offset(),
                what: format!("the header ends inside the {what}"),
            });
        }
        let s = &self.body[self.at..self.at + n];
        self.at += n;
        Ok(s)
    }

    fn u16(&mut self, what: &str) -> Result<u16, TraceError> {
        let b = self.take(2, what)?;
        Ok(u16::from_le_bytes([b[0], b[1]]))
    }

    fn u32(&mut self, what: &str) -> Result<u32, TraceError> {
        let b = self.take(4, what)?;
        Ok(u32::from_le_bytes([b[0], b[1], b[2], b[3]]))
    }

    fn u64(&mut self, what: &str) -> Result<u64, TraceError> {
        Ok(le_u64(self.take(8, what)?))
    }

    fn str(&mut self, what: &str) -> Result<String, TraceError> {
        let at = self.file_offset();
        let len = self.u16(what)?;
        let bytes = self.take(usize::from(len), what)?;
        String::from_utf8(bytes.to_vec()).map_err(|_| TraceError::Corrupt {
            offset: at,
            what: format!("the {what} is not UTF-8"),
        })
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn header() -> Header {
        Header {
            kernel_release: "6.18.0-test".to_owned(),
            backend: "tracepoint".to_owned(),
            start_ns: 42,
            devices: vec![
                DeviceInfo {
                    netns: 4_026_531_840,
                    ifindex: 7,
                    queues: 1,
                    ring_size: 500,
                    name: "tap0".to_owned(),
                },
                DeviceInfo {
                    netns: 4_026_532_000,
                    ifindex: 3,
                    queues: 4,
                    ring_size: 1000,
                    name: "vnet1".to_owned(),
                },
            ],
        }
    }

    const KINDS: [EventKind; 7] = [
        EventKind::Enqueued,
        EventKind::DroppedFullRing,
        EventKind::Busy,
        EventKind::Consumed,
        EventKind::QueueStop,
        EventKind::QueueWake,
        EventKind::DroppedOther,
    ];

    fn events(n: u64) -> Vec<Event> {
        (0..n)
            .map(|i| Event {
                ts_ns: 1000 + i * 7,
                device: u16::try_from(i % 2).unwrap(),
                queue: u16::try_from(i % 3).unwrap(),
                cpu: u16::try_from(i % 2).unwrap(),
                kind: KINDS[usize::try_from(i).unwrap() % KINDS.len()],
                reason: u32::try_from(i % 5).unwrap(),
            })
            .collect()
    }

    /// A valid file with `n` events and one lost note after the first.
    pub(crate) fn sample(n: u64) -> Vec<u8> {
        let mut w = TraceWriter::new(Vec::new(), &header()).unwrap();
        for (i, e) in events(n).iter().enumerate() {
            w.event(e).unwrap();
            if i == 0 {
                w.lost(e.ts_ns, 3).unwrap();
            }
        }
        w.finish().unwrap().0
    }

    fn read_all(bytes: &[u8]) -> Result<(Header, Vec<Record>, Trailer), TraceError> {
        let mut r = TraceReader::new(bytes)?;
        let mut recs = Vec::new();
        for rec in r.by_ref() {
            recs.push(rec?);
        }
        let t = *r.trailer().expect("iterator ended without a trailer");
        Ok((r.header().clone(), recs, t))
    }

    #[test]
    fn round_trip() {
        let bytes = sample(100_000);
        let (h, recs, t) = read_all(&bytes).unwrap();
        assert_eq!(h, header());
        let evs: Vec<Event> = recs
            .iter()
            .filter_map(|r| match r {
                Record::Event(e) => Some(*e),
                Record::Lost { .. } => None,
            })
            .collect();
        assert_eq!(evs, events(100_000));
        assert_eq!(
            recs[1],
            Record::Lost {
                ts_ns: 1000,
                count: 3
            }
        );
        assert_eq!(t.events, 100_000);
        assert_eq!(t.lost, 3);
        assert_eq!(t.counts.iter().sum::<u64>(), 100_000);
        assert_eq!(t.count(EventKind::Enqueued), 100_000 / 7 + 1);
    }

    /// The fuzzing seed was written by a separate script from `docs/trace-format.md` alone.
    #[test]
    fn independently_written_seed_parses() {
        let (h, recs, t) = read_all(include_bytes!("../fuzz/seeds/small.trace")).unwrap();
        assert_eq!(h.kernel_release, "6.18.0");
        assert_eq!(h.devices[0].name, "tap0");
        assert_eq!(h.devices[0].ring_size, 500);
        assert_eq!(recs.len(), 10);
        assert_eq!(
            recs[3],
            Record::Lost {
                ts_ns: 2025,
                count: 4
            }
        );
        assert_eq!((t.events, t.lost), (9, 4));
        assert_eq!(t.count(EventKind::Consumed), 2);
    }

    #[test]
    fn empty_recording_round_trips() {
        let bytes = sample(0);
        let (_, recs, t) = read_all(&bytes).unwrap();
        assert!(recs.is_empty());
        assert_eq!(t.events, 0);
    }

    fn err(bytes: &[u8]) -> String {
        read_all(bytes).unwrap_err().to_string()
    }

    #[test]
    fn truncated_files_name_the_offset() {
        let bytes = sample(10);
        // Cut inside the third event record: the header is 14 + body bytes.
        let body = u32::from_le_bytes(bytes[10..14].try_into().unwrap()) as usize;
        let first = 14 + body;
        let third = first + 22 + 18 + 22;
        let e = err(&bytes[..third + 5]);
        assert_eq!(e, format!("truncated record at byte {third}"));
        // Cut right after a record: no trailer.
        let e = err(&bytes[..third]);
        assert!(e.contains(&format!("at byte {third}")), "{e}");
        assert!(e.contains("without a trailer"), "{e}");
        // Cut inside the header and inside the checksum.
        assert!(err(&bytes[..9]).starts_with("truncated header (version) at byte 8"));
        assert!(err(&bytes[..20]).starts_with("truncated header at byte 14"));
        assert!(err(&bytes[..bytes.len() - 2]).starts_with("truncated trailer"));
        // Every prefix fails cleanly.
        for cut in 0..bytes.len() {
            assert!(
                read_all(&bytes[..cut]).is_err(),
                "prefix {cut} read as valid"
            );
        }
    }

    #[test]
    fn newer_version_and_bad_magic() {
        let mut bytes = sample(3);
        bytes[8] = 9;
        assert_eq!(
            err(&bytes),
            "unsupported format version 9 at byte 8 (this tap-probe reads 1)"
        );
        bytes[0] = b'X';
        assert!(err(&bytes).contains("bad magic at byte 0"));
    }

    #[test]
    fn corruption_is_detected() {
        let clean = sample(50);
        let body = u32::from_le_bytes(clean[10..14].try_into().unwrap()) as usize;
        let first = 14 + body;
        // A flipped timestamp bit passes every structural check but not the checksum.
        let mut bytes = clean.clone();
        bytes[first + 3] ^= 0x10;
        let e = err(&bytes);
        assert!(e.starts_with("checksum mismatch at byte"), "{e}");
        // An unknown event kind.
        let mut bytes = clean.clone();
        bytes[first + 2 + 14] = 99;
        assert_eq!(
            err(&bytes),
            format!("corrupt trace at byte {first}: unknown event kind 99")
        );
        // A device index outside the table.
        let mut bytes = clean.clone();
        bytes[first + 2 + 8] = 5;
        assert!(err(&bytes).contains("event for device 5"));
        // A wrong record length.
        let mut bytes = clean.clone();
        bytes[first + 1] = 21;
        assert!(err(&bytes).contains("has length 21, expected 20"));
        // Garbage after the trailer.
        let mut bytes = clean;
        let end = bytes.len() as u64;
        bytes.push(0);
        assert_eq!(
            err(&bytes),
            format!("corrupt trace at byte {end}: data after the trailer")
        );
    }

    #[test]
    fn unknown_record_types_are_skipped() {
        let clean = sample(4);
        let body = u32::from_le_bytes(clean[10..14].try_into().unwrap()) as usize;
        let first = 14 + body;
        // Rebuild the file with an unknown record (type 9, 3 bytes) and a fresh checksum.
        let mut bytes = clean[..first].to_vec();
        bytes.extend_from_slice(&[9, 3, 1, 2, 3]);
        bytes.extend_from_slice(&clean[first..clean.len() - 4]);
        let crc = crc32fast::hash(&bytes);
        bytes.extend_from_slice(&crc.to_le_bytes());
        let (_, recs, _) = read_all(&bytes).unwrap();
        assert_eq!(recs.len(), 5);
    }

    /// Deterministic mutations of a valid file (bit flips, cuts, splices, length bytes):
    /// the reader returns an error or records, never panics, and stays bounded.
    #[test]
    fn mutated_files_never_panic() {
        let clean = sample(40);
        let mut rng = 0x9e37_79b9_7f4a_7c15_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        let pick = |r: u64, n: usize| usize::try_from(r % n as u64).unwrap();
        for _ in 0..20_000 {
            let mut bytes = clean.clone();
            for _ in 0..=(next() % 4) {
                let at = pick(next(), bytes.len());
                match next() % 5 {
                    0 => bytes[at] ^= 1 << (next() % 8),
                    1 => bytes[at] = u8::try_from(next() & 0xff).unwrap(),
                    2 => bytes.truncate(at),
                    3 => {
                        let n = pick(next(), 16);
                        let src: Vec<u8> = bytes[at..(at + n).min(bytes.len())].to_vec();
                        bytes.splice(at..at, src);
                    }
                    _ => bytes[at] = 0xff,
                }
                if bytes.is_empty() {
                    break;
                }
            }
            let _ = read_all(&bytes);
        }
    }
}
