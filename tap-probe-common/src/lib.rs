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

pub use counters::{KernelStat, Kind, METRICS, Metric, QueueCounters, Source, Unit};
pub use events::{EVENTS_RING_BYTES, EventKind, TraceEvent};
pub use facts::{KernelFacts, TextRange};
pub use maps::{
    DROP_REASON_XMIT_ERROR, DeviceCache, DeviceKey, DeviceSlot, DropKey, InFlight, MAX_DEVICES,
    MAX_DROP_KEYS, MAX_QUEUE_SLOTS, MAX_QUEUES_PER_DEVICE, MAX_READER_RANGES, ReaderState,
};
pub use names::{
    GLOBAL_KERNEL, GLOBAL_RECORD_EVENTS, GLOBAL_SLOW_CONSUMER_NS, MAP_COUNTERS, MAP_DEVICES,
    MAP_DROP_REASONS, MAP_EVENTS, MAP_EVENTS_LOST, MAP_GENERATION, MAP_QUEUE_STATE, MAP_READERS,
    PROG_CONSUME_ENTRY, PROG_CONSUME_SKB, PROG_KFREE_SKB, PROG_QDISC_DEQUEUE, PROG_SLOW_CONSUMER,
    PROG_START_XMIT, PROG_XMIT, PROG_XMIT_ENTRY, PROG_XMIT_RETURN,
};

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
