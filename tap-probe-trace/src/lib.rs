//! The trace file `tap-probe record` writes and `tap-probe replay` reads: a versioned
//! header, length-delimited records, a trailer with counts and a CRC-32. The layout is
//! documented byte by byte in `docs/trace-format.md`; the records' fields are declared once
//! (`wire`), for the writer and the reader alike.
//!
//! Both directions stream: [`TraceWriter`] holds one buffer, [`TraceReader`] one record, so
//! memory stays bounded whatever the length of the recording. Every error the reader
//! reports names what was wrong and the byte offset where it was found.

mod error;
mod reader;
mod ring;
mod wire;
mod writer;

pub use error::TraceError;
pub use reader::TraceReader;
pub use ring::{MAX_RING_SIZE, RingSize};
pub use tap_probe_common::EventKind;
pub use wire::KIND_SLOTS;
pub use writer::{CutBack, TraceWriter};

/// The first eight bytes of every trace file.
pub const MAGIC: [u8; 8] = *b"TAPTRACE";
/// The format version this build writes and the only one it reads.
pub const FORMAT_VERSION: u16 = 1;
/// Record types (the byte before each record's length).
const REC_EVENT: u8 = 1;
const REC_LOST: u8 = 2;
const REC_TRAILER: u8 = 0xff;
/// Longest record payload a reader accepts; longer lengths mean a corrupt file.
const MAX_RECORD_LEN: u64 = 4096;
/// Longest header body a reader accepts.
const MAX_HEADER_LEN: u32 = 1 << 20;
/// Size of the fixed part before the header body: magic, version, header length.
const PREAMBLE_LEN: u64 = 8 + 2 + 4;

/// One device of the recording.
#[derive(Debug, Clone, PartialEq, Eq)]
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
#[derive(Debug, Clone, PartialEq, Eq)]
pub struct Header {
    /// `uname -r` of the recording host.
    pub kernel_release: String,
    /// The hooks that produced the events, per group of counters.
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
    /// The event records of `kind`.
    #[must_use]
    pub fn count(&self, kind: EventKind) -> u64 {
        self.counts[kind as usize]
    }
}

// Every event kind has its slot in the trailer (the format's version 1 has eight).
const _: () = {
    let mut i = 0;
    while i < EventKind::ALL.len() {
        assert!((EventKind::ALL[i] as usize) < KIND_SLOTS);
        i += 1;
    }
};

#[cfg(test)]
mod tests;
