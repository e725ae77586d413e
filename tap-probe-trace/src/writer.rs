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
pub struct TraceWriter<W: Write> {
    out: W,
    buf: BytesMut,
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
        };
        w.flush_buf()?;
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
        self.buf
            .put_slice(&[REC_TRAILER, one_byte_len(TRAILER_LEN)]);
        TrailerCounts {
            events: self.trailer.events,
            counts: self.trailer.counts,
            lost: self.trailer.lost,
        }
        .put(&mut self.buf);
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
