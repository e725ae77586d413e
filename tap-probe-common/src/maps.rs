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
/// Address ranges of the kernel functions that free an skb after the tap reader copied it.
pub const MAX_READER_RANGES: usize = 8;

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
