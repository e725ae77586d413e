//! Writing a trace.

use std::io::{self, Write};

use bytes::{BufMut as _, BytesMut};

use crate::wire::{EventRecord, LostRecord, TRAILER_LEN, TrailerCounts};
use crate::{
    Event, FORMAT_VERSION, Header, MAGIC, MAX_HEADER_LEN, REC_EVENT, REC_LOST, REC_TRAILER, Trailer,
};

/// The writer's buffer; flushed to the sink when it holds this much.
const WRITE_BUFFER: usize = 64 << 10;

/// The one-byte varint length of a known payload (all are shorter than 128 bytes).
const fn one_byte_len(n: usize) -> u8 {
    assert!(n < 128);
    #[expect(clippy::cast_possible_truncation, reason = "checked just above")]
    let b = n as u8;
    b
}

/// Streams records into `W`. Call [`TraceWriter::finish`] to write the trailer: a file
/// without one reads as truncated.
///
/// When a write fails (a full disk), [`TraceWriter::cut_back`] rewinds the writer to the end
/// of the last record that reached `W` whole, so that the caller can truncate the file there
/// and still finish it: what was lost in the cut is then a lost note, not a partial record.
pub struct TraceWriter<W: Write> {
    out: W,
    buf: BytesMut,
    /// Covers the bytes that reached `out` whole, up to `written`.
    crc: crc32fast::Hasher,
    trailer: Trailer,
    devices: usize,
    /// Bytes `out` took, counting partial writes.
    pub(crate) written: u64,
    /// Where the last record that reached `out` whole ends: the header's end at first.
    whole: u64,
}

impl<W: Write> TraceWriter<W> {
    /// Writes the header.
    ///
    /// # Errors
    /// A header that does not fit the format (more than 65535 devices, names longer than
    /// 65535 bytes), or a write error.
    pub fn new(out: W, header: &Header) -> io::Result<Self> {
        let mut body = BytesMut::new();
        body.put_u64_le(header.start_ns);
        put_str(&mut body, &header.kernel_release)?;
        put_str(&mut body, &header.backend)?;
        let count = u16::try_from(header.devices.len())
            .map_err(|_| invalid("more than 65535 devices in one trace"))?;
        body.put_u16_le(count);
        for d in &header.devices {
            for v in [d.netns, d.ifindex, d.queues, d.ring_size] {
                body.put_u32_le(v);
            }
            put_str(&mut body, &d.name)?;
        }
        let body_len = u32::try_from(body.len())
            .ok()
            .filter(|&n| n <= MAX_HEADER_LEN)
            .ok_or_else(|| invalid("trace header too large"))?;
        let mut buf = BytesMut::with_capacity(WRITE_BUFFER + 128);
        buf.put_slice(&MAGIC);
        buf.put_u16_le(FORMAT_VERSION);
        buf.put_u32_le(body_len);
        buf.put_slice(&body);
        let mut w = Self {
            out,
            buf,
            crc: crc32fast::Hasher::new(),
            trailer: Trailer::default(),
            devices: header.devices.len(),
            written: 0,
            whole: 0,
        };
        // The header counts as one record: a file cut inside it is no trace at all.
        w.out.write_all(&w.buf)?;
        w.crc.update(&w.buf);
        w.written = w.buf.len() as u64;
        w.whole = w.written;
        w.buf.clear();
        Ok(w)
    }

    /// Appends one event.
    ///
    /// # Errors
    /// An event for a device not in the header, or a write error.
    pub fn event(&mut self, e: &Event) -> io::Result<()> {
        if usize::from(e.device) >= self.devices {
            return Err(invalid("event for a device missing from the header"));
        }
        self.buf
            .put_slice(&[REC_EVENT, one_byte_len(EventRecord::LEN)]);
        EventRecord {
            ts_ns: e.ts_ns,
            device: e.device,
            queue: e.queue,
            cpu: e.cpu,
            kind: e.kind as u8,
            reserved: 0,
            reason: e.reason,
        }
        .put(&mut self.buf);
        self.trailer.events += 1;
        self.trailer.counts[e.kind as usize] += 1;
        self.maybe_flush()
    }

    /// Appends a note that `count` events were lost in the kernel by `ts_ns`.
    ///
    /// # Errors
    /// A write error.
    pub fn lost(&mut self, ts_ns: u64, count: u64) -> io::Result<()> {
        self.buf
            .put_slice(&[REC_LOST, one_byte_len(LostRecord::LEN)]);
        LostRecord { ts_ns, count }.put(&mut self.buf);
        self.trailer.lost += count;
        self.maybe_flush()
    }

    /// Writes the trailer, flushes, and hands back the sink and the trailer.
    ///
    /// # Errors
    /// A write error.
    pub fn finish(mut self) -> io::Result<(W, Trailer)> {
        let trailer = self.end()?;
        Ok((self.out, trailer))
    }

    /// Writes the trailer and flushes, keeping the writer: when this fails (a full disk),
    /// [`TraceWriter::cut_back`] can still drop what did not make it. Nothing may be written
    /// after a trailer.
    ///
    /// # Errors
    /// A write error.
    pub fn end(&mut self) -> io::Result<Trailer> {
        self.flush_buf()?;
        let mut tail = BytesMut::with_capacity(2 + TRAILER_LEN);
        tail.put_slice(&[REC_TRAILER, one_byte_len(TRAILER_LEN)]);
        TrailerCounts {
            events: self.trailer.events,
            counts: self.trailer.counts,
            lost: self.trailer.lost,
        }
        .put(&mut tail);
        let mut crc = self.crc.clone();
        crc.update(&tail);
        let checksum = crc.clone().finalize();
        tail.put_slice(&checksum.to_le_bytes());
        let (done, result) = write_counted(&mut self.out, &tail);
        self.written += done as u64;
        result?;
        self.out.flush()?;
        // Only a trailer that reached the sink whole counts as written.
        self.whole = self.written;
        crc.update(&checksum.to_le_bytes());
        self.crc = crc;
        self.trailer.checksum = checksum;
        Ok(self.trailer)
    }

    /// The sink.
    pub fn into_inner(self) -> W {
        self.out
    }

    fn maybe_flush(&mut self) -> io::Result<()> {
        if self.buf.len() >= WRITE_BUFFER {
            self.flush_buf()?;
        }
        Ok(())
    }

    /// Writes the buffer (whole records, back to back) out, keeping count of what `out`
    /// took: on an error, the records it took whole are dropped from the buffer (and
    /// checksummed), the rest stay for [`TraceWriter::cut_back`].
    fn flush_buf(&mut self) -> io::Result<()> {
        let (done, result) = write_counted(&mut self.out, &self.buf);
        self.written += done as u64;
        let whole = if result.is_ok() {
            done
        } else {
            whole_records(&self.buf, done)
        };
        self.crc.update(&self.buf[..whole]);
        self.whole += whole as u64;
        let _ = self.buf.split_to(whole);
        result
    }

    /// After a failed write: forgets every record that did not reach the sink whole, as if
    /// it had never been written, and returns where the file must be truncated (the end of
    /// the last whole record) and how many events were dropped. The sink's position is then
    /// past that point; the caller truncates and seeks back to it (see [`TraceWriter::get_mut`])
    /// before writing on.
    pub fn cut_back(&mut self) -> CutBack {
        let mut events = 0;
        let mut at = 0;
        while at + 2 <= self.buf.len() {
            let (kind, len) = (self.buf[at], usize::from(self.buf[at + 1]));
            let payload =
                &self.buf[(at + 2).min(self.buf.len())..(at + 2 + len).min(self.buf.len())];
            match kind {
                REC_EVENT if payload.len() == EventRecord::LEN => {
                    let e = EventRecord::get(&mut &payload[..]);
                    self.trailer.events -= 1;
                    self.trailer.counts[usize::from(e.kind)] -= 1;
                    events += 1;
                }
                REC_LOST if payload.len() == LostRecord::LEN => {
                    self.trailer.lost -= LostRecord::get(&mut &payload[..]).count;
                }
                _ => {}
            }
            at += 2 + len;
        }
        self.buf.clear();
        self.written = self.whole;
        CutBack {
            offset: self.whole,
            events,
        }
    }

    /// The sink, to truncate and seek it after [`TraceWriter::cut_back`].
    pub fn get_mut(&mut self) -> &mut W {
        &mut self.out
    }
}

/// What [`TraceWriter::cut_back`] dropped.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct CutBack {
    /// Where the last whole record ends: the file's length from now on.
    pub offset: u64,
    /// Event records that were buffered or partly written, and are gone.
    pub events: u64,
}

/// Writes `bytes` to `out`, returning how many it took even when it then failed.
fn write_counted(out: &mut impl Write, bytes: &[u8]) -> (usize, io::Result<()>) {
    let mut done = 0;
    while done < bytes.len() {
        match out.write(&bytes[done..]) {
            Ok(0) => return (done, Err(io::Error::from(io::ErrorKind::WriteZero))),
            Ok(n) => done += n,
            Err(e) if e.kind() == io::ErrorKind::Interrupted => {}
            Err(e) => return (done, Err(e)),
        }
    }
    (done, Ok(()))
}

/// The length of the whole records at the start of `buf` that fit in its first `len` bytes.
fn whole_records(buf: &[u8], len: usize) -> usize {
    let mut at = 0;
    // Every record this writer makes has a one-byte length (see `one_byte_len`).
    while at + 2 <= len {
        let next = at + 2 + usize::from(buf[at + 1]);
        if next > len {
            break;
        }
        at = next;
    }
    at
}

/// A str16: a `u16` length, then the bytes.
fn put_str(out: &mut BytesMut, s: &str) -> io::Result<()> {
    let len = u16::try_from(s.len()).map_err(|_| invalid("string longer than 65535 bytes"))?;
    out.put_u16_le(len);
    out.put_slice(s.as_bytes());
    Ok(())
}

fn invalid(what: &str) -> io::Error {
    io::Error::new(io::ErrorKind::InvalidInput, what.to_owned())
}
