//! Per-packet events for `tap-probe record`: what the programs write into the event ring,
//! and the kinds the trace file keeps.

/// Bytes of event ring buffers a recording gets, shared among the CPUs' rings (each at
/// least [`EVENTS_RING_MIN_BYTES`]).
pub const EVENTS_RING_BYTES: u32 = 16 << 20;
/// The smallest ring a CPU gets: about 30 ms of one CPU's events at full rate.
pub const EVENTS_RING_MIN_BYTES: u32 = 1 << 20;
/// Events of one CPU per wakeup of the recorder (a 1 MiB ring holds 43,690): it sleeps
/// between batches instead of polling.
pub const EVENTS_PER_WAKEUP: u64 = 4096;
/// The size of the ring the object declares as the template of `EVENTS`' rings: the
/// loader creates it and frees it, and the kernel does not compare the sizes of the rings
/// put into the array with it. 64 KiB is a multiple of every page size.
pub const EVENTS_RING_TEMPLATE_BYTES: usize = 64 << 10;

/// What happened to a packet or a queue.
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum EventKind {
    /// The driver took the packet into its ring.
    Enqueued = 1,
    /// Freed inside the driver because the ring was full.
    DroppedFullRing = 2,
    /// The driver returned `NETDEV_TX_BUSY`.
    Busy = 3,
    /// The reader took the packet out of the ring.
    Consumed = 4,
    QueueStop = 5,
    QueueWake = 6,
    /// Freed inside the driver for another reason (`TraceEvent::reason`).
    DroppedOther = 7,
}

impl EventKind {
    /// Every kind, by value.
    pub const ALL: [Self; 7] = [
        Self::Enqueued,
        Self::DroppedFullRing,
        Self::Busy,
        Self::Consumed,
        Self::QueueStop,
        Self::QueueWake,
        Self::DroppedOther,
    ];

    #[must_use]
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Enqueued,
            2 => Self::DroppedFullRing,
            3 => Self::Busy,
            4 => Self::Consumed,
            5 => Self::QueueStop,
            6 => Self::QueueWake,
            7 => Self::DroppedOther,
            _ => return None,
        })
    }
}

// An event names its counter slot in 16 bits.
const _: () = assert!(crate::MAX_QUEUE_SLOTS <= 1 << 16);

/// One event, as the eBPF side writes it (16 bytes, 24 in the ring with its header). The CPU
/// is the ring's; the device and queue are the counter slot's, which the recorder knows.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    /// The counter slot of the device's queue (below `MAX_QUEUE_SLOTS`).
    pub slot: u16,
    /// An [`EventKind`].
    pub kind: u16,
    /// `enum skb_drop_reason` for `DroppedOther`, 0 otherwise.
    pub reason: u32,
}
