//! Per-packet events for `tap-probe record`, written to the calling CPU's ring buffer in
//! `EVENTS` when the loader sets `RECORD_EVENTS`. An event that does not fit is counted,
//! never dropped silently.

use aya_ebpf::{
    bindings::{BPF_RB_FORCE_WAKEUP, BPF_RB_NO_WAKEUP},
    btf_maps::{ArrayOfMaps, RingBuf},
    helpers::bpf_get_smp_processor_id,
    macros::{btf_map, map},
    maps::PerCpuArray,
};
use tap_probe_common::{EVENTS_PER_WAKEUP, EVENTS_RING_TEMPLATE_BYTES, EventKind, TraceEvent};

use crate::clock::Clock;
use crate::device::At;

/// 1 when `tap-probe record` wants per-packet events; set by the loader.
#[unsafe(no_mangle)]
static RECORD_EVENTS: u32 = 0;

/// One ring buffer per CPU, indexed by CPU id, put in by the recorder (the loader sizes
/// the array to the possible CPUs). One shared ring made every event take a lock that the
/// other CPUs' events took too, and its cache line moved between them each time; a CPU's
/// own ring has one writer.
#[btf_map]
static EVENTS: ArrayOfMaps<RingBuf<TraceEvent, { EVENTS_RING_TEMPLATE_BYTES }>, 1> =
    ArrayOfMaps::new();

/// Events that found their ring full, or no ring for their CPU, per CPU.
#[map]
static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Events written, per CPU: every `EVENTS_PER_WAKEUP`th wakes the recorder.
#[map]
static EVENTS_WRITTEN: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

/// Emits a per-packet event when recording.
#[inline(always)]
pub(crate) fn record(at: At, kind: EventKind, reason: u32) {
    record_at(at, kind, reason, &mut Clock::new());
}

/// Emits a per-packet event when recording, at the time `clock` tells.
#[inline(always)]
pub(crate) fn record_at(at: At, kind: EventKind, reason: u32, clock: &mut Clock) {
    if unsafe { core::ptr::read_volatile(&raw const RECORD_EVENTS) } == 0 {
        return;
    }
    let cpu = unsafe { bpf_get_smp_processor_id() };
    #[expect(
        clippy::cast_possible_truncation,
        reason = "slots are below MAX_QUEUE_SLOTS, kinds below 256"
    )]
    let event = TraceEvent {
        ts_ns: clock.now(),
        slot: at.slot as u16,
        kind: kind as u16,
        reason,
    };
    // Wakeups in batches: one every EVENTS_PER_WAKEUP events of this CPU. A wakeup each
    // time the ring was empty (the default) costs an interrupt on the sending CPU
    // (`bpf_ringbuf_output`, `kernel/bpf/ringbuf.c`) for every event of a recorder that
    // keeps up; the recorder waits on the rings between passes, and at most `RING_WAIT`
    // (`cmd/record.rs`) for a batch that does not fill.
    let flags = match EVENTS_WRITTEN.get_ptr_mut(0) {
        Some(n) => {
            // SAFETY: per-CPU.
            let n = unsafe {
                *n += 1;
                *n
            };
            if n % EVENTS_PER_WAKEUP == 0 {
                BPF_RB_FORCE_WAKEUP
            } else {
                BPF_RB_NO_WAKEUP
            }
        }
        None => BPF_RB_NO_WAKEUP,
    };
    let written = EVENTS
        .get(cpu)
        .is_some_and(|ring| ring.output(event, u64::from(flags)).is_ok());
    if !written && let Some(lost) = EVENTS_LOST.get_ptr_mut(0) {
        // SAFETY: per-CPU.
        unsafe { *lost += 1 };
    }
}
