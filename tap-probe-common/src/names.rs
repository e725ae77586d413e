//! The names both sides use for maps, globals and programs: the loader finds by name what
//! the eBPF objects define.

pub const MAP_DEVICES: &str = "DEVICES";
pub const MAP_COUNTERS: &str = "COUNTERS";
pub const MAP_DROP_REASONS: &str = "DROP_REASONS";
pub const MAP_QUEUE_STATE: &str = "QUEUE_STATE";
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

/// Per-packet events for `tap-probe record`: an array of per-CPU ring buffers, written when
/// the loader sets `RECORD_EVENTS` to 1.
pub const MAP_EVENTS: &str = "EVENTS";
/// Per-CPU count of events that found no room in `EVENTS` (never silent).
pub const MAP_EVENTS_LOST: &str = "EVENTS_LOST";
pub const GLOBAL_RECORD_EVENTS: &str = "RECORD_EVENTS";
/// 1 when the programs sample tun/tap rings (`ring_occupancy`); set by the loader.
pub const GLOBAL_SAMPLE_RING: &str = "SAMPLE_RING";
/// 1 when the programs follow flows' order (`reordered`); set by the loader.
pub const GLOBAL_FOLLOW_FLOWS: &str = "FOLLOW_FLOWS";

/// The kprobe backend's programs.
pub const PROG_XMIT_ENTRY: &str = "xmit_entry";
pub const PROG_XMIT_RETURN: &str = "xmit_return";
pub const PROG_CONSUME_ENTRY: &str = "consume_entry";

/// Bumped by the loader after every change to `DEVICES`: invalidates `DeviceCache`s.
pub const MAP_GENERATION: &str = "GENERATION";

/// Ring occupancy samples per queue slot, per CPU.
pub const MAP_OCCUPANCY: &str = "OCCUPANCY";
/// Each queue's last dequeue, followed to the driver (the tracepoint source of
/// `requeued_stopped`).
pub const MAP_DEQUEUED: &str = "DEQUEUED";
/// Switches the loader sets after attaching, indexed by `SETTING_*`.
pub const MAP_SETTINGS: &str = "SETTINGS";
/// `SETTINGS[SETTING_WAKE_EVENTS] = 1`: the wake kprobe records `QueueWake` events at the
/// wake itself, so the queue state observers record none.
pub const SETTING_WAKE_EVENTS: u32 = 0;
/// Entries of `SETTINGS`.
pub const SETTING_COUNT: u32 = 1;

/// The kprobe source of `requeued_stopped`: entry and return of `sch_direct_xmit`.
pub const PROG_DIRECT_XMIT_ENTRY: &str = "direct_xmit_entry";
pub const PROG_DIRECT_XMIT_RETURN: &str = "direct_xmit_return";
/// The tracepoint source of `requeued_stopped`: each queue's dequeues, followed to the
/// driver.
pub const PROG_DEQUEUE_PAIRS: (&str, &str) = ("dequeue_pairs", "qdisc_dequeue");
/// Wakes by their caller: a kprobe on `netif_tx_wake_queue`.
pub const PROG_WAKE_ENTRY: &str = "wake_entry";
