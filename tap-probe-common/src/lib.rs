//! Types shared by the eBPF programs and the userspace loader: the counter table
//! (`counters`), the maps' keys and values (`maps`), the kernel's facts (`facts`), the
//! per-packet events (`events`) and the names of maps, globals and programs (`names`).
//!
//! Everything here is `#[repr(C)]` with explicit padding so both sides agree on the layout
//! byte for byte; the `user` feature adds the `aya::Pod` impls the loader needs, the one
//! syntax of durations (`duration`) that every userspace crate parses, how their messages
//! quote what they were given (`echo`), and how every view writes a figure (`units`).
#![cfg_attr(not(test), no_std)]

// The duration syntax and the quoting of echoed values live here, the lowest crate every
// userspace crate depends on (the ring model, check's specs and the command line all parse
// durations and quote what they read), rather than in one of them: they need only `core` and
// `alloc` (`String` for their messages), so the eBPF side, which builds this crate without
// `user`, never sees them.
#[cfg(feature = "user")]
extern crate alloc;

mod counters;
#[cfg(feature = "user")]
pub mod duration;
#[cfg(feature = "user")]
pub mod echo;
mod events;
mod facts;
mod maps;
mod names;
#[cfg(feature = "user")]
pub mod units;

pub use counters::{
    DIRECTION, Export, Hook, KernelStat, Kind, METRICS, Metric, MetricId, PerCpuCounters,
    QueueCounters, Requires, SharedCounters, Source, Store, Unit,
};
pub use events::{
    EVENTS_PER_WAKEUP, EVENTS_RING_BYTES, EVENTS_RING_MIN_BYTES, EVENTS_RING_TEMPLATE_BYTES,
    EventKind, TraceEvent,
};
pub use facts::{
    DROP_REASON_BEFORE_RING, DROP_REASON_UNCLASSIFIED, Driver, DropClass, KernelFacts, PacketFacts,
    RingFacts, TextRange, WakeClass, WakeRange,
};
pub use maps::*;
pub use names::*;

#[cfg(feature = "user")]
mod pod {
    use super::{
        DeviceEntry, DeviceKey, DropKey, KernelFacts, PerCpuCounters, QueueKey, QueueShared,
        QueueSlot, TraceEvent,
    };

    // SAFETY: all are `#[repr(C)]`, made of integers, with no implicit padding.
    unsafe impl aya::Pod for DeviceKey {}
    unsafe impl aya::Pod for DeviceEntry {}
    unsafe impl aya::Pod for QueueKey {}
    unsafe impl aya::Pod for QueueSlot {}
    unsafe impl aya::Pod for PerCpuCounters {}
    unsafe impl aya::Pod for QueueShared {}
    unsafe impl aya::Pod for DropKey {}
    unsafe impl aya::Pod for KernelFacts {}
    unsafe impl aya::Pod for TraceEvent {}
}
