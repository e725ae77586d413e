//! The names both sides use for maps, globals and programs: the loader finds by name what
//! the eBPF objects define.

/// The devices the programs know of: tracked, or left out.
pub const MAP_DEVICES: &str = "DEVICES";
/// Each tracked queue's slot.
pub const MAP_QUEUES: &str = "QUEUES";
/// The chunks of per-queue storage, an array of maps each: the per-CPU counters, and the
/// rest of what the programs keep per queue (`QueueShared`).
pub const MAP_PER_CPU_CHUNKS: &str = "PER_CPU_CHUNKS";
pub const MAP_SHARED_CHUNKS: &str = "SHARED_CHUNKS";
pub const MAP_DROP_REASONS: &str = "DROP_REASONS";
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
/// How the programs sample tun/tap rings (`ring_occupancy`, `RING_SAMPLES_*`); set by the
/// loader.
pub const GLOBAL_SAMPLE_RING: &str = "SAMPLE_RING";
/// 1 when the programs follow flows' order (`reordered`); set by the loader.
pub const GLOBAL_FOLLOW_FLOWS: &str = "FOLLOW_FLOWS";
/// The flows whose order the programs follow (an LRU hash).
pub const MAP_FLOWS: &str = "FLOWS";

/// The kprobe backend's programs.
pub const PROG_XMIT_ENTRY: &str = "xmit_entry";
pub const PROG_XMIT_RETURN: &str = "xmit_return";
pub const PROG_CONSUME_ENTRY: &str = "consume_entry";

/// Bumped by the loader after every change to `DEVICES` or `QUEUES`: invalidates the
/// programs' `QueueCache`s.
pub const MAP_GENERATION: &str = "GENERATION";

/// Switches the loader sets after attaching, indexed by `SETTING_*`.
pub const MAP_SETTINGS: &str = "SETTINGS";
/// `SETTINGS[SETTING_WAKE_EVENTS] = 1`: the wake kprobe records `QueueWake` events at the
/// wake itself, so the queue state observers record none.
pub const SETTING_WAKE_EVENTS: u32 = 0;
/// `SETTINGS[SETTING_REGISTER] = 1`: the programs register a device they meet that is not
/// in `DEVICES` (one created since attach). The queues of a device in `DEVICES` they
/// register whatever this says.
pub const SETTING_REGISTER: u32 = 1;
/// `SETTINGS[SETTING_DEQUEUE_PAIRS] = 1`: the dequeue program follows each dequeue to the
/// driver (the tracepoint source of `requeued_stopped`).
pub const SETTING_DEQUEUE_PAIRS: u32 = 2;
/// Entries of `SETTINGS`.
pub const SETTING_COUNT: u32 = 3;

/// Spare slots the programs take for new queues (a queue map of slots).
pub const MAP_SPARE_SLOTS: &str = "SPARE_SLOTS";
/// Per-CPU count of events of new queues that found no spare slot left (never silent).
pub const MAP_NO_ROOM: &str = "NO_ROOM";
/// Per-CPU count of the devices and queues the programs registered.
pub const MAP_REGISTERED: &str = "REGISTERED";
/// The ring sampler: a raw tracepoint program the loader runs (`BPF_PROG_TEST_RUN`) once per
/// refresh over a device's queues, a few at a time; attached nowhere.
pub const PROG_SAMPLE_RINGS: &str = "sample_rings";
/// `SAMPLE_RING` values: rings not sampled; sampled where the queue stops and wakes and once
/// per refresh; sampled at every driver call and reader take as well.
pub const RING_SAMPLES_OFF: u32 = 0;
pub const RING_SAMPLES_EVENTS: u32 = 1;
pub const RING_SAMPLES_EXACT: u32 = 2;

/// The kprobe source of `requeued_stopped`: entry and return of `sch_direct_xmit`.
pub const PROG_DIRECT_XMIT_ENTRY: &str = "direct_xmit_entry";
pub const PROG_DIRECT_XMIT_RETURN: &str = "direct_xmit_return";
/// Wakes by their caller: a kprobe on `netif_tx_wake_queue`.
pub const PROG_WAKE_ENTRY: &str = "wake_entry";
/// Queues one run of the ring sampler samples: its arguments after their count, of the 12
/// a raw tracepoint's test run passes.
pub const RING_SAMPLE_QUEUES: u32 = 11;
