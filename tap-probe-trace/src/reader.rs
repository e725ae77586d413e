//! Reading a trace.

use std::io::{self, BufReader, Read};

use bytes::Buf as _;

use crate::wire::{EventRecord, LostRecord, TRAILER_LEN, TrailerCounts};
use crate::{
    DeviceInfo, Event, EventKind, FORMAT_VERSION, Header, MAGIC, MAX_HEADER_LEN, MAX_RECORD_LEN,
    PREAMBLE_LEN, REC_EVENT, REC_LOST, REC_TRAILER, Record, RingSize, TraceError, Trailer,
};

/// Reads a trace: the header on [`TraceReader::new`], then records as an iterator. The
/// iterator ends after a valid trailer ([`TraceReader::trailer`]); an error ends it too.
///
/// A file cut short (the recorder was killed, the machine lost power, the disk filled up)
/// has no trailer and ends inside or after its last record. By default that is an error;
/// [`TraceReader::salvage`] makes the iterator end quietly at the last whole record instead,
/// and [`TraceReader::cut`] then says where the file was cut.
pub struct TraceReader<R: Read> {
    src: Source<R>,
    header: Header,
    trailer: Option<Trailer>,
    /// Set once the iterator returned `None` or an error.
    done: bool,
    salvage: bool,
    cut: Option<u64>,
}

impl<R: Read> TraceReader<R> {
    /// Reads and checks the header.
    ///
    /// # Errors
    /// A file that is not a trace, of another version, or whose header is cut or corrupt.
    pub fn new(inner: R) -> Result<Self, TraceError> {
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
            salvage: false,
            cut: None,
        })
    }

    /// Reads a file that may have been cut short: the records up to the last whole one,
    /// then the end, with [`TraceReader::cut`] saying where the cut is. Every other error
    /// (corruption, a bad checksum) is still an error.
    #[must_use]
    pub fn salvage(mut self) -> Self {
        self.salvage = true;
        self
    }

    /// Where a file read with [`TraceReader::salvage`] was cut: the byte offset at which
    /// its last whole record ends (what follows is a partial record or nothing). `None` for
    /// a complete file, or before the iterator reached the end.
    #[must_use]
    pub fn cut(&self) -> Option<u64> {
        self.cut
    }

    #[must_use]
    pub fn header(&self) -> &Header {
        &self.header
    }

    /// The trailer, once the iterator has reached it (and the checksum matched).
    #[must_use]
    pub fn trailer(&self) -> Option<&Trailer> {
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
                REC_EVENT => Some(EventRecord::LEN),
                REC_LOST => Some(LostRecord::LEN),
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
                    let record = EventRecord::get(&mut &payload[..]);
                    return self.event(&record, start).map(|e| Some(Record::Event(e)));
                }
                REC_LOST => {
                    self.src.exact(payload, start, "record")?;
                    let LostRecord { ts_ns, count } = LostRecord::get(&mut &payload[..]);
                    return Ok(Some(Record::Lost { ts_ns, count }));
                }
                REC_TRAILER => {
                    // The checksum covers everything before its own four bytes.
                    let body = &mut payload[..TrailerCounts::LEN];
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
                    let counts = TrailerCounts::get(&mut &body[..]);
                    let end = self.src.offset;
                    if self.src.more()? {
                        return Err(TraceError::Corrupt {
                            offset: end,
                            what: "data after the trailer".to_owned(),
                        });
                    }
                    self.trailer = Some(Trailer {
                        events: counts.events,
                        counts: counts.counts,
                        lost: counts.lost,
                        checksum: stored,
                    });
                    return Ok(None);
                }
                // A record type this version does not know: its length lets us skip it.
                _ => self.src.skip(len, start)?,
            }
        }
    }

    fn event(&self, r: &EventRecord, start: u64) -> Result<Event, TraceError> {
        if usize::from(r.device) >= self.header.devices.len() {
            return Err(TraceError::Corrupt {
                offset: start,
                what: format!(
                    "event for device {}, but the header lists {}",
                    r.device,
                    self.header.devices.len()
                ),
            });
        }
        let kind = EventKind::from_u32(u32::from(r.kind)).ok_or_else(|| TraceError::Corrupt {
            offset: start,
            what: format!("unknown event kind {}", r.kind),
        })?;
        Ok(Event {
            ts_ns: r.ts_ns,
            device: r.device,
            queue: r.queue,
            cpu: r.cpu,
            kind,
            reason: r.reason,
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
            Err(TraceError::Truncated { offset, .. }) if self.salvage => {
                self.done = true;
                self.cut = Some(offset);
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
        let ring_at = c.file_offset();
        let ring_size = c.u32("device ring size")?;
        // The kernel allocates a tun ring with kmalloc (`__ptr_ring_init_queue_alloc`,
        // include/linux/ptr_ring.h), which bounds it far below the most a model takes; a
        // reader that sized a model by a larger value would exhaust memory.
        RingSize::new(u64::from(ring_size)).map_err(|why| TraceError::Corrupt {
            offset: ring_at,
            what: format!("device {why}"),
        })?;
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

/// The header body, read field by field with the offset of each failure.
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
        Ok(self.take(2, what)?.get_u16_le())
    }

    fn u32(&mut self, what: &str) -> Result<u32, TraceError> {
        Ok(self.take(4, what)?.get_u32_le())
    }

    fn u64(&mut self, what: &str) -> Result<u64, TraceError> {
        Ok(self.take(8, what)?.get_u64_le())
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
