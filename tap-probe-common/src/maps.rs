//! The keys and values of the probe's maps, and how many of each it holds.

/// Queue slots in a chunk of the probe's per-queue storage. The loader creates chunks as
/// devices appear and drops them as they go, so the kernel memory the probe holds follows the
/// queues present: the per-CPU part of a chunk costs `CHUNK_SLOTS * size_of::<PerCpuCounters>()`
/// bytes times the host's CPUs.
pub const CHUNK_SLOTS: u32 = 128;
/// The flags of a chunk's shared array: `BPF_F_MMAPABLE`, so the loader reads it through a
/// mapping of its memory rather than a copy per read (Linux 5.5+).
pub const SHARED_CHUNK_FLAGS: u32 = 1 << 10;
/// Chunks at most: `MAX_QUEUE_SLOTS / CHUNK_SLOTS`.
pub const MAX_CHUNKS: u32 = 128;
/// Queues counted at once, over every device: a slot each. Sizes `QUEUES`, the one table
/// allocated for the most the probe can hold (about 1.4 MB, whatever the host's CPUs).
pub const MAX_QUEUE_SLOTS: u32 = CHUNK_SLOTS * MAX_CHUNKS;
/// Devices tracked or left out at once.
pub const MAX_DEVICES: u32 = 4096;
/// (queue slot, drop reason) pairs counted at once.
pub const MAX_DROP_KEYS: u32 = 8192;
/// Drivers whose devices the programs recognise by their transmit function: tun/tap, veth,
/// and macvlan for macvtap.
pub const MAX_DRIVERS: usize = 4;
/// Address ranges of the kernel functions that free an skb after the tap reader copied it.
pub const MAX_READER_RANGES: usize = 8;
/// Address ranges of the kernel functions that classify a queue wake.
pub const MAX_WAKE_RANGES: usize = 12;
/// Frames of a wake's stack the programs look at: the probed function, its caller and the
/// callers above, far enough to see vhost-net's `tun_wake_queue` above `__tun_wake_queue`.
pub const WAKE_STACK_DEPTH: usize = 6;
/// Packets of one dequeue the programs follow to the driver. A qdisc bulk-dequeues at most
/// 1 + 8 packets for a device without byte queue limits (`try_bulk_dequeue_skb_slow` in
/// `net/sched/sch_generic.c`; tun, tap and veth have none); beyond that the rest are not
/// followed (see `Dequeued::unfollowed`).
pub const MAX_BULK: usize = 9;
/// Nested `sch_direct_xmit` calls followed per CPU (a device stacked on a device).
pub const MAX_DIRECT_XMIT_DEPTH: usize = 4;
/// Buckets of the ring occupancy histogram: bucket 0 holds 0, bucket `k` holds
/// `2^(k-1) ..= 2^k - 1`, the last one everything from `2^(OCCUPANCY_BUCKETS - 2)` up.
pub const OCCUPANCY_BUCKETS: usize = 18;
/// Entries of each CPU's cache of the queues it looked up last (`QueueCache`): a CPU
/// that transmits on one queue and reads another (a vhost thread beside its sender) keeps
/// both.
pub const QUEUE_CACHE_ENTRIES: u32 = 4;

/// `DeviceEntry::flags`: the device is a tun/tap, whose `ptr_ring` the programs sample.
pub const DEVICE_TUN: u32 = 1;
/// `DeviceEntry::flags`: the programs registered the device themselves, at its first
/// packet (one created since attach).
pub const DEVICE_BY_PROBES: u32 = 2;
/// `DeviceEntry::flags`: the device is left out: the programs neither count it nor
/// register its queues.
pub const DEVICE_LEFT_OUT: u32 = 4;

/// Free slots the loader keeps ready, zeroed, for queues the programs meet before the
/// loader knows them (a tap created after attach, a queue attached since): each takes one
/// at its first packet, so nothing it does goes uncounted. The loader tops them up at every
/// refresh and as soon as it sees some taken.
pub const SPARE_SLOTS: u32 = 128;

/// `QueueShared::state` of a queue whose tracking began mid-life: its stop state is not
/// known until the programs first look at it (0 is running, `since_ns | 1` stopped).
pub const QUEUE_STATE_UNKNOWN: u64 = 2;

/// A network device as the kernel names it across namespaces: the inode number of its
/// network namespace (what `/proc/PID/ns/net` shows) and its ifindex there.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub netns_inode: u32,
    pub ifindex: u32,
}

/// A device the programs know of (`DEVICES`): tracked, or left out.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceEntry {
    /// `DEVICE_*` flags.
    pub flags: u32,
    pub reserved: u32,
}

/// One transmit queue of a device (`QUEUES`' key).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct QueueKey {
    pub device: DeviceKey,
    pub queue: u32,
}

/// Where a tracked queue is counted (`QUEUES`' value): its slot in the chunks, and its
/// device's flags.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueSlot {
    pub slot: u32,
    /// `DeviceEntry::flags` of its device.
    pub flags: u32,
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
    /// `QueueCache::flags` of the device.
    pub flags: u32,
    pub reserved: u32,
}

/// A queue a CPU looked up lately (`QUEUE_CACHE_ENTRIES` per CPU), so consecutive packets
/// of one queue skip the hash lookups and the reads behind them. Valid while `generation`
/// is current and the device at `dev` still has `key.ifindex` (ifindexes are not reused at
/// once).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct QueueCache {
    pub dev: u64,
    pub generation: u64,
    /// The device's namespace (`dev_net(dev)`) when the entry was filled: with `key.ifindex`,
    /// what tells the device from another one later allocated at the same address.
    pub net: u64,
    pub key: DeviceKey,
    pub queue: u32,
    pub slot: u32,
    /// `DeviceEntry::flags` of the device, with [`DEVICE_TUN`] cleared when the device's
    /// private area does not point back at it (checked once per fill); `DEVICE_LEFT_OUT`
    /// for a device not counted (a negative entry).
    pub flags: u32,
    pub reserved: u32,
    /// `dev` and `generation` again, written last: an entry whose seal does not match them
    /// was torn by a program that interrupted its update, and is refilled.
    pub sealed_dev: u64,
    pub sealed_generation: u64,
}

/// Samples of one queue's ring occupancy on one CPU, since tracking began.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RingSamples {
    /// When the latest sample was taken (`bpf_ktime_get_ns`); 0 before the first.
    pub ts_ns: u64,
    /// The latest sample.
    pub current: u64,
    /// The highest sample, or the ring's size once it tail-dropped (then it was full).
    pub max: u64,
    /// The ring's size, as the latest read found it; 0 before the first.
    pub size: u64,
    pub count: u64,
    pub sum: u64,
    /// See [`OCCUPANCY_BUCKETS`].
    pub buckets: [u64; OCCUPANCY_BUCKETS],
}

/// The packets of a queue's last dequeue (`qdisc:qdisc_dequeue`), followed to the driver:
/// those that never reached it before the queue's next dequeue were put back. Shared
/// between CPUs without atomics: a queue's dequeues and driver calls run under its qdisc's
/// running state.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Dequeued {
    /// Packets dequeued together; 0 when none is being followed.
    pub packets: u32,
    /// How many of `skbs`, in order, reached a driver call.
    pub seen: u32,
    pub skbs: [u64; MAX_BULK],
    /// Per packet, the segments software GSO makes of it before the driver
    /// (`skb_shinfo(skb)->gso_segs`; 0 or 1 for a packet that is no GSO packet).
    pub segs: [u16; MAX_BULK],
    pub reserved: u16,
    /// Driver calls with other skbs since `skbs[seen]` became the next one: its segments.
    pub calls: u32,
}

/// Everything the programs keep of one queue besides its [`PerCpuCounters`]: one copy per
/// slot in the shared chunks, written by whichever CPU handles the queue. What the transmit
/// side writes at every packet comes first, the reader's own next, the rare rest last, so
/// that the sender's and the reader's CPUs do not pull one cache line between them.
///
/// [`PerCpuCounters`]: crate::PerCpuCounters
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct QueueShared {
    /// 0 while the queue runs, `since_ns | 1` while it is stopped, [`QUEUE_STATE_UNKNOWN`]
    /// before the first look at a queue whose tracking began mid-life.
    pub state: u64,
    /// The `net_device` the slot counts, written when the queue is looked up, for the ring
    /// sampler the loader runs.
    pub dev: u64,
    /// Its last dequeue, followed to the driver (the tracepoint source of
    /// `requeued_stopped`).
    pub dequeued: Dequeued,
    /// Its reader at the last take.
    pub reader: ReaderState,
    /// The counters of [`crate::Store::Shared`], added to atomically.
    pub counters: crate::SharedCounters,
    /// Its ring's occupancy samples.
    pub occupancy: RingSamples,
}

/// An `sch_direct_xmit` in progress on a CPU: where its packets go, how many it was handed,
/// and this CPU's driver calls when it began.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DirectXmitFrame {
    /// `u32::MAX` when the device is not tracked.
    pub slot: u32,
    pub packets: u32,
    pub calls: u64,
}

/// A CPU's `sch_direct_xmit` calls in progress, innermost last, and its driver calls.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DirectXmit {
    /// Driver calls of tracked devices begun on this CPU.
    pub calls: u64,
    pub depth: u32,
    pub reserved: u32,
    pub frames: [DirectXmitFrame; MAX_DIRECT_XMIT_DEPTH],
}

/// Flows whose order the programs follow at once (`FLOWS`, an LRU hash: the least recently
/// seen flow makes room for a new one, and its order is forgotten).
pub const MAX_FLOWS: u32 = 8192;

/// The project's own UDP frames (`tap-probe load`, the tests) carry, after their 64-bit
/// sequence number, this magic and a 32-bit flow id, all big-endian: how the programs tell
/// them from other UDP traffic, whose order they cannot know.
pub const FRAME_MAGIC: u32 = 0x7470_7271;

/// A flow whose order the programs follow: its device, IPv4 5-tuple and, for the project's
/// frames, the flow id they carry. Addresses and ports as on the wire (big-endian).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash)]
pub struct FlowKey {
    pub device: DeviceKey,
    pub saddr: u32,
    pub daddr: u32,
    pub sport: u16,
    pub dport: u16,
    /// `IPPROTO_TCP` or `IPPROTO_UDP`.
    pub proto: u32,
    /// The frame's flow id; 0 for TCP.
    pub flow: u32,
    pub reserved: u32,
}

/// A flow's order so far: the next number the flow would hand over in order.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct FlowState {
    /// TCP: the IPv4 ID after the last segment taken in order (16 bits, serial arithmetic);
    /// frames: the sequence number after the last frame taken in order.
    pub next: u64,
}
