//! Types shared by the eBPF programs and the userspace loader: the counter table
//! (`counters`), the maps' keys and values (`maps`), the kernel's facts (`facts`), the
//! per-packet events (`events`) and the names of maps, globals and programs (`names`).
//!
//! Everything here is `#[repr(C)]` with explicit padding so both sides agree on the layout
//! byte for byte; the `user` feature adds the `aya::Pod` impls the loader needs.
#![cfg_attr(not(test), no_std)]

mod counters;
mod events;
mod facts;
mod maps;
mod names;

pub use counters::{KernelStat, Kind, METRICS, Metric, QueueCounters, Requires, Source, Unit};
pub use events::{
    EVENTS_RING_BYTES, EVENTS_RING_MIN_BYTES, EVENTS_RING_TEMPLATE_BYTES, EventKind, TraceEvent,
};
pub use facts::{KernelFacts, PacketFacts, RingFacts, TextRange, WakeClass, WakeRange};
pub use maps::{
    DEVICE_TUN, DROP_REASON_XMIT_ERROR, Dequeued, DeviceCache, DeviceKey, DeviceSlot, DirectXmit,
    DirectXmitFrame, DropKey, FRAME_MAGIC, FlowKey, FlowState, InFlight, MAX_BULK, MAX_DEVICES,
    MAX_DIRECT_XMIT_DEPTH, MAX_DROP_KEYS, MAX_FLOWS, MAX_QUEUE_SLOTS, MAX_QUEUES_PER_DEVICE,
    MAX_READER_RANGES, MAX_WAKE_RANGES, OCCUPANCY_BUCKETS, ReaderState, RingSamples,
    WAKE_STACK_DEPTH,
};
pub use names::{
    GLOBAL_FOLLOW_FLOWS, GLOBAL_KERNEL, GLOBAL_RECORD_EVENTS, GLOBAL_SAMPLE_RING,
    GLOBAL_SLOW_CONSUMER_NS, MAP_COUNTERS, MAP_DEQUEUED, MAP_DEVICES, MAP_DROP_REASONS, MAP_EVENTS,
    MAP_EVENTS_LOST, MAP_GENERATION, MAP_OCCUPANCY, MAP_QUEUE_STATE, MAP_READERS, MAP_SETTINGS,
    PROG_CONSUME_ENTRY, PROG_CONSUME_SKB, PROG_DEQUEUE_PAIRS, PROG_DIRECT_XMIT_ENTRY,
    PROG_DIRECT_XMIT_RETURN, PROG_KFREE_SKB, PROG_QDISC_DEQUEUE, PROG_SLOW_CONSUMER,
    PROG_START_XMIT, PROG_WAKE_ENTRY, PROG_XMIT, PROG_XMIT_ENTRY, PROG_XMIT_RETURN, SETTING_COUNT,
    SETTING_WAKE_EVENTS,
};

#[cfg(feature = "user")]
mod pod {
    use super::{
        Dequeued, DeviceKey, DeviceSlot, DropKey, InFlight, KernelFacts, QueueCounters,
        ReaderState, RingSamples, TraceEvent,
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
    unsafe impl aya::Pod for RingSamples {}
    unsafe impl aya::Pod for Dequeued {}
}
