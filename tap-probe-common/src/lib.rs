//! Types shared by the eBPF programs and the userspace loader.
//!
//! Everything here is `#[repr(C)]` with explicit padding so both sides agree on the layout
//! byte for byte; the `user` feature adds the `aya::Pod` impls the loader needs.
#![cfg_attr(not(test), no_std)]

mod counters;

pub use counters::{KernelStat, Kind, METRICS, Metric, QueueCounters, Source, Unit};

/// Queue slots the counter map holds. A device takes as many consecutive slots as it has
/// transmit queues; see [`DeviceSlot`].
pub const MAX_QUEUE_SLOTS: u32 = 16384;
/// Queues counted per device; a multi-queue tap allocates 256 (`MAX_TAP_QUEUES`) but uses as
/// many as it has readers.
pub const MAX_QUEUES_PER_DEVICE: u32 = 64;
/// Devices tracked at once.
pub const MAX_DEVICES: u32 = 1024;
/// (queue slot, drop reason) pairs counted at once.
pub const MAX_DROP_KEYS: u32 = 8192;
/// Address ranges of the kernel functions that free an skb after the tap reader copied it.
pub const MAX_READER_RANGES: usize = 8;

pub const MAP_DEVICES: &str = "DEVICES";
pub const MAP_COUNTERS: &str = "COUNTERS";
pub const MAP_DROP_REASONS: &str = "DROP_REASONS";
pub const MAP_QUEUE_STATE: &str = "QUEUE_STATE";
pub const MAP_IN_FLIGHT: &str = "IN_FLIGHT";
pub const MAP_READERS: &str = "READERS";
pub const GLOBAL_KERNEL: &str = "KERNEL";

/// The tracepoint programs of the host backend, with the tracepoint each attaches to.
pub const PROG_START_XMIT: (&str, &str) = ("net_dev_start_xmit", "net_dev_start_xmit");
pub const PROG_XMIT: (&str, &str) = ("net_dev_xmit", "net_dev_xmit");
pub const PROG_KFREE_SKB: (&str, &str) = ("kfree_skb", "kfree_skb");
pub const PROG_CONSUME_SKB: (&str, &str) = ("consume_skb", "consume_skb");
pub const PROG_QDISC_DEQUEUE: (&str, &str) = ("qdisc_dequeue", "qdisc_dequeue");
/// The XDP program that emulates a slow reader on a veth peer, and its hold time global.
pub const PROG_SLOW_CONSUMER: &str = "slow_consumer";
pub const GLOBAL_SLOW_CONSUMER_NS: &str = "SLOW_CONSUMER_NS";

/// A network device as the kernel names it across namespaces: the inode number of its
/// network namespace (what `/proc/PID/ns/net` shows) and its ifindex there.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub netns: u32,
    pub ifindex: u32,
}

/// Where a tracked device's counters live: slots `base .. base + queues` of `COUNTERS`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSlot {
    pub base: u32,
    pub queues: u32,
}

/// The last reader of a queue, at its last take: whose voluntary context switches to
/// compare at its next take. Shared across CPUs, since a reader thread migrates.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct ReaderState {
    /// The reader's `task_struct` address; 0 before the first take.
    pub task: u64,
    /// Its `task_struct.nvcsw` at that take.
    pub nvcsw: u64,
}

/// Pseudo drop reason for a driver return code that is neither `NETDEV_TX_OK` nor
/// `NETDEV_TX_BUSY` (the skb's fate is then the driver's business, but it was not taken).
pub const DROP_REASON_XMIT_ERROR: u32 = u32::MAX;

/// Key of the drop-reason breakdown: a queue slot and an `enum skb_drop_reason` value.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct DropKey {
    pub slot: u32,
    pub reason: u32,
}

/// A driver call in progress on this CPU, between `net_dev_start_xmit` and `net_dev_xmit`.
/// The transmit path runs with bottom halves disabled, so the pair cannot interleave with
/// another transmit on the same CPU except by nesting (a tracked device transmitting on a
/// tracked device), which no tun/tap/veth does.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct InFlight {
    pub skb: u64,
    pub dev: u64,
    pub key: DeviceKey,
    pub slot: u32,
    pub queue: u16,
    /// Set once `kfree_skb` saw this skb freed inside the driver.
    pub dropped: u16,
}

/// A half-open range `[start, end)` of kernel text.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TextRange {
    pub start: u64,
    pub end: u64,
}

/// What the programs need to know about the running kernel, read from its BTF and kallsyms
/// by the loader and written into the object's `.rodata` before load. Nothing here is a
/// constant of one kernel version.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct KernelFacts {
    /// `offsetof(struct sk_buff, dev)`.
    pub skb_dev: u32,
    /// `offsetof(struct sk_buff, queue_mapping)` (a `__u16`).
    pub skb_queue_mapping: u32,
    /// `offsetof(struct net_device, ifindex)`.
    pub dev_ifindex: u32,
    /// `offsetof(struct net_device, nd_net) + offsetof(possible_net_t, net)`.
    pub dev_net: u32,
    /// `offsetof(struct net, ns) + offsetof(struct ns_common, inum)`.
    pub net_inum: u32,
    /// `offsetof(struct net_device, _tx)`.
    pub dev_tx: u32,
    /// `sizeof(struct netdev_queue)`.
    pub txq_size: u32,
    /// `offsetof(struct netdev_queue, state)`.
    pub txq_state: u32,
    /// `offsetof(struct netdev_queue, dev)`.
    pub txq_dev: u32,
    /// `SKB_DROP_REASON_FULL_RING`.
    pub reason_full_ring: u32,
    /// `NETDEV_TX_BUSY`.
    pub tx_busy: u32,
    /// `1 << __QUEUE_STATE_DRV_XOFF`, as a mask of `netdev_queue.state`.
    pub drv_xoff_mask: u32,
    /// `offsetof(struct task_struct, nvcsw)` (an `unsigned long`).
    pub task_nvcsw: u32,
    /// Number of valid entries in `reader_ranges`.
    pub reader_range_count: u32,
    /// Kernel functions from which `consume_skb` means "the tap reader took this packet".
    pub reader_ranges: [TextRange; MAX_READER_RANGES],
}

#[cfg(feature = "user")]
mod pod {
    use super::{
        DeviceKey, DeviceSlot, DropKey, InFlight, KernelFacts, QueueCounters, ReaderState,
        TraceEvent,
    };

    // SAFETY: all are `#[repr(C)]`, made of integers, with no implicit padding.
    unsafe impl aya::Pod for DeviceKey {}
    unsafe impl aya::Pod for DeviceSlot {}
    unsafe impl aya::Pod for QueueCounters {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for InFlight {}
    unsafe impl aya::Pod for ReaderState {}
    unsafe impl aya::Pod for KernelFacts {}
    unsafe impl aya::Pod for TraceEvent {}
}

/// Per-packet events for `tap-probe record`, written to the `EVENTS` ring buffer when the
/// loader sets `RECORD_EVENTS` to 1.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU count of events that did not fit in `EVENTS` (never silent).
pub const MAP_EVENTS_LOST: &str = "EVENTS_LOST";
pub const GLOBAL_RECORD_EVENTS: &str = "RECORD_EVENTS";
/// Size of the `EVENTS` ring buffer in bytes (a power of two, a multiple of the page size).
pub const EVENTS_RING_BYTES: u32 = 16 << 20;

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

/// One event, as the eBPF side writes it (32 bytes).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TraceEvent {
    /// `CLOCK_MONOTONIC` nanoseconds (`bpf_ktime_get_ns`).
    pub ts_ns: u64,
    pub netns: u32,
    pub ifindex: u32,
    pub queue: u16,
    pub cpu: u16,
    /// An [`EventKind`].
    pub kind: u32,
    /// `enum skb_drop_reason` for `DroppedOther`, 0 otherwise.
    pub reason: u32,
    pub reserved: u32,
}

/// The kprobe backend's programs.
pub const PROG_XMIT_ENTRY: &str = "xmit_entry";
pub const PROG_XMIT_RETURN: &str = "xmit_return";
pub const PROG_CONSUME_ENTRY: &str = "consume_entry";

/// Bumped by the loader after every change to `DEVICES`: invalidates `DeviceCache`s.
pub const MAP_GENERATION: &str = "GENERATION";

/// The last device a CPU looked up, so consecutive packets of one device skip the hash
/// lookup and two of the three reads behind it. Valid while `generation` is current and
/// the device at `dev` still has `key.ifindex` (ifindexes are not reused at once).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct DeviceCache {
    pub dev: u64,
    pub generation: u64,
    pub key: DeviceKey,
    pub base: u32,
    /// 0 when the device is not tracked (a negative entry).
    pub queues: u32,
}
