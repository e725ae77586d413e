//! What the programs need to know about the running kernel.

use crate::MAX_READER_RANGES;

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
