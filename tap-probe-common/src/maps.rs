//! The keys and values of the probe's maps, and how many of each it holds.

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

/// `DeviceSlot::flags`: the device is a tun/tap, whose `ptr_ring` the programs sample.
pub const DEVICE_TUN: u32 = 1;
/// `DeviceSlot::flags`: the programs registered the device themselves, at its first packet,
/// in a spare range of slots (see [`SPARE_SINGLE_COUNT`]).
pub const DEVICE_BY_PROBES: u32 = 2;

/// Single slots the loader keeps ready for devices with one transmit queue that the
/// programs meet before the loader knows them (a tap created after attach): each new
/// device takes one at its first packet, so nothing it does goes uncounted.
pub const SPARE_SINGLE_COUNT: u32 = 256;
/// Ranges of [`MAX_QUEUES_PER_DEVICE`] slots kept ready for new multi-queue devices.
pub const SPARE_RANGE_COUNT: u32 = 16;

/// `QUEUE_STATE` of a queue whose tracking began mid-life: its stop state is not known
/// until the programs first look at it (0 is running, `since_ns | 1` stopped).
pub const QUEUE_STATE_UNKNOWN: u64 = 2;

/// A network device as the kernel names it across namespaces: the inode number of its
/// network namespace (what `/proc/PID/ns/net` shows) and its ifindex there.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub struct DeviceKey {
    pub netns_inode: u32,
    pub ifindex: u32,
}

/// Where a tracked device's counters live: slots `base .. base + queues` of `COUNTERS`.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceSlot {
    pub base: u32,
    pub queues: u32,
    /// [`DEVICE_TUN`] or 0.
    pub flags: u32,
    pub reserved: u32,
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
    /// `DeviceCache::flags` of the device.
    pub flags: u32,
    pub reserved: u32,
}

/// The last device a CPU looked up, so consecutive packets of one device skip the hash
/// lookup and the reads behind it. Valid while `generation` is current and the device at
/// `dev` still has `key.ifindex` (ifindexes are not reused at once).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default)]
pub struct DeviceCache {
    pub dev: u64,
    pub generation: u64,
    /// The device's namespace (`dev_net(dev)`) when the entry was filled: with `key.ifindex`,
    /// what tells the device from another one later allocated at the same address.
    pub net: u64,
    pub key: DeviceKey,
    pub base: u32,
    /// 0 when the device is not tracked (a negative entry).
    pub queues: u32,
    /// `DeviceSlot::flags`, with [`DEVICE_TUN`] cleared when the device's private area does
    /// not point back at it (checked once per fill).
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
