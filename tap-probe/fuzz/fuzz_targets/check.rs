//! What the check targets share: the names a measurement provides. Any list does for the
//! parser, which only checks expectations against it; these are those of the docs' examples
//! and of the counters that tell where packets went.

pub const KNOWN: &[&str] = &[
    "xmit_calls",
    "enqueued",
    "busy",
    "dropped_full_ring",
    "dropped_other",
    "consumed",
    "queue_stops",
    "stuck",
    "stopped",
    "attempted",
    "sent",
    "enobufs",
    "read_by_reader",
    "drained",
    "kernel_tx_packets",
    "kernel_tx_dropped",
    "qdisc_drops",
    "qdisc_requeues",
    "qdisc_backlog",
    "elapsed_secs",
    "sender_pps",
    "delivered_pps",
];
