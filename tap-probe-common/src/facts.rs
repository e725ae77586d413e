//! What the programs need to know about the running kernel.

use crate::{MAX_DRIVERS, MAX_READER_RANGES, MAX_WAKE_RANGES};

/// A half-open range `[start, end)` of kernel text.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct TextRange {
    pub start: u64,
    pub end: u64,
}

/// Who calls `netif_tx_wake_queue`: the class of a kernel function found on the stack of a
/// wake (see [`WakeRange`]).
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum WakeClass {
    /// The reader's path: tun's `__tun_wake_queue` (from a read), veth's `veth_poll`.
    Reader = 1,
    /// vhost-net's batched take: `tun_wake_queue`.
    Vhost = 2,
    /// Attach, TUNSETIFF, resize: `tun_force_wake_queue`.
    Forced = 3,
    /// The driver's re-check right after it stopped the queue: `tun_net_xmit`.
    Recheck = 4,
    /// None of the above on the stack.
    Other = 5,
}

impl WakeClass {
    #[must_use]
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Reader,
            2 => Self::Vhost,
            3 => Self::Forced,
            4 => Self::Recheck,
            5 => Self::Other,
            _ => return None,
        })
    }
}

/// A kernel function that classifies the wakes it calls into (directly or further down).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct WakeRange {
    pub range: TextRange,
    /// A [`WakeClass`] value.
    pub class: u32,
    pub reserved: u32,
}

/// A driver whose devices the programs count: its `ndo_start_xmit`, where a device's
/// `netdev_ops` point (kernel text, from kallsyms), and what its devices are.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct Driver {
    pub start_xmit: u64,
    /// `DeviceEntry::flags` of its devices ([`crate::DEVICE_TUN`] for tun/tap).
    pub flags: u32,
    pub reserved: u32,
}

/// Where a tun/tap's `ptr_ring` is and how to read it: offsets from BTF (vmlinux, or the
/// tun module's split BTF where tun is a module).
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct RingFacts {
    /// 1 when every offset below was found; the programs sample nothing otherwise.
    pub known: u32,
    /// `netdev_priv(dev) - dev`: `offsetof(struct net_device, priv)` where the flexible
    /// array exists (6.12+), else `ALIGN(sizeof(struct net_device), NETDEV_ALIGN)`.
    pub dev_priv: u32,
    /// `offsetof(struct tun_struct, tfiles)` (an array of `struct tun_file *`).
    pub tun_tfiles: u32,
    /// `offsetof(struct tun_struct, dev)`: must point back at the device.
    pub tun_dev: u32,
    /// `offsetof(struct tun_file, tx_ring)`.
    pub tfile_tx_ring: u32,
    /// The part of `struct ptr_ring` read in one go: from `span_start` for `span_len`
    /// bytes, which covers the four fields below (offsets within the ring).
    pub span_start: u32,
    pub span_len: u32,
    pub producer: u32,
    pub consumer_head: u32,
    pub size: u32,
    pub queue: u32,
    pub reserved: u32,
}

/// Where a packet's headers are, for telling the order of its flow (`reordered`): offsets
/// from vmlinux's BTF.
#[repr(C)]
#[derive(Copy, Clone, Debug, Default, PartialEq, Eq)]
pub struct PacketFacts {
    /// `offsetof(struct sk_buff, protocol)` (a `__be16`).
    pub skb_protocol: u32,
    /// `offsetof(struct sk_buff, head)`.
    pub skb_head: u32,
    /// `offsetof(struct sk_buff, network_header)` (a `__u16` offset from `head`).
    pub skb_network_header: u32,
    /// `offsetof(struct sk_buff, end)`: where `struct skb_shared_info` starts, as an
    /// offset from `head` (`NET_SKBUFF_DATA_USES_OFFSET`, every 64-bit kernel).
    pub skb_end: u32,
    /// `offsetof(struct skb_shared_info, gso_segs)` (a `unsigned short`).
    pub shinfo_gso_segs: u32,
    pub reserved: u32,
}

/// How the programs tell a full ring from the driver's other drops ([`KernelFacts::drop_class`]).
#[repr(u32)]
#[derive(Copy, Clone, Debug, PartialEq, Eq)]
pub enum DropClass {
    /// The `reason` argument of `kfree_skb` (`enum skb_drop_reason`, Linux 5.17+) and its
    /// `SKB_DROP_REASON_FULL_RING`, which tun gives a full ring.
    Reason = 1,
    /// The driver call's path, where the kernel gives no full-ring reason: `tun_net_xmit`
    /// orphans the packet (`skb_orphan`: `destructor` cleared) and drops its conntrack
    /// reference (`nf_reset_ct`: `_nfct` cleared) after its last other reason to drop and
    /// right before `ptr_ring_produce`. A packet that lost either during the call was
    /// dropped by the ring; one that kept both was dropped before it; one that had neither
    /// when the call began cannot be told.
    Path = 2,
}

impl DropClass {
    #[must_use]
    pub const fn from_u32(v: u32) -> Option<Self> {
        Some(match v {
            1 => Self::Reason,
            2 => Self::Path,
            _ => return None,
        })
    }
}

/// Pseudo drop reason, [`DropClass::Path`]: the packet kept its owner or conntrack reference
/// through the driver call, so the driver dropped it before its ring (no queue attached, a
/// filter, no memory).
pub const DROP_REASON_BEFORE_RING: u32 = u32::MAX - 1;
/// Pseudo drop reason, [`DropClass::Path`]: the packet had neither an owner nor a conntrack
/// reference when the driver call began (forwarded, bridged), so where the driver dropped
/// it cannot be told.
pub const DROP_REASON_UNCLASSIFIED: u32 = u32::MAX - 2;

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
    /// `offsetof(struct net_device, netdev_ops)`.
    pub dev_netdev_ops: u32,
    /// `offsetof(struct net_device_ops, ndo_start_xmit)`.
    pub ops_start_xmit: u32,
    /// `offsetof(struct net_device, num_tx_queues)` (an `unsigned int`).
    pub dev_num_tx_queues: u32,
    /// `sizeof(struct netdev_queue)`.
    pub txq_size: u32,
    /// `offsetof(struct netdev_queue, state)`.
    pub txq_state: u32,
    /// `offsetof(struct netdev_queue, dev)`.
    pub txq_dev: u32,
    /// `SKB_DROP_REASON_FULL_RING`; 0 where drops are classified by their path.
    pub reason_full_ring: u32,
    /// `NETDEV_TX_BUSY`.
    pub tx_busy: u32,
    /// `1 << __QUEUE_STATE_DRV_XOFF`, as a mask of `netdev_queue.state`.
    pub drv_xoff_mask: u32,
    /// `offsetof(struct task_struct, nvcsw)` (an `unsigned long`).
    pub task_nvcsw: u32,
    /// `offsetof(struct sk_buff, next)`: how a bulk dequeue chains its packets.
    pub skb_next: u32,
    /// Number of valid entries in `drivers`.
    pub driver_count: u32,
    /// Number of valid entries in `wake_ranges`.
    pub wake_range_count: u32,
    /// A [`DropClass`] value.
    pub drop_class: u32,
    /// `offsetof(struct sk_buff, destructor)`: cleared by `skb_orphan` (see
    /// [`DropClass::Path`]).
    pub skb_destructor: u32,
    /// `offsetof(struct sk_buff, _nfct)`, cleared by `nf_reset_ct`; 0 where the kernel has
    /// no conntrack (offset 0 is `next`, never this field).
    pub skb_nfct: u32,
    /// 1 where the kernel has `bpf_get_current_task_btf` (Linux 5.11+), whose task the
    /// verifier types; 0: `bpf_get_current_task` and a probe read.
    pub task_btf: u32,
    pub reserved: u32,
    /// The drivers whose devices are counted, recognised by their transmit function.
    pub drivers: [Driver; MAX_DRIVERS],
    /// The functions that classify a wake, by where they are on its stack.
    pub wake_ranges: [WakeRange; MAX_WAKE_RANGES],
    pub ring: RingFacts,
    pub packet: PacketFacts,
    /// Number of valid entries in `reader_ranges`.
    pub reader_range_count: u32,
    pub reserved_end: u32,
    /// Kernel functions from which `consume_skb` means "the tap reader took this packet".
    pub reader_ranges: [TextRange; MAX_READER_RANGES],
}
