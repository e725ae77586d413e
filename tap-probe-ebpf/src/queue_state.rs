//! The queue's `__QUEUE_STATE_DRV_XOFF` bit: stops, wakes and time stopped, observed after
//! every driver call and at every qdisc dequeue.

use aya_ebpf::{
    macros::{btf_tracepoint, map},
    maps::Array,
    programs::BtfTracePointContext,
};
use tap_probe_common::{EventKind, MAX_QUEUE_SLOTS, QUEUE_STATE_UNKNOWN, SETTING_DEQUEUE_PAIRS};

use crate::clock::Clock;
use crate::counters::counters;
use crate::device::{At, device, queue_index, setting};
use crate::events::record_at;
use crate::facts::{Mem, Typed, fact};

/// Per queue slot: 0 while the queue runs, `since_ns | 1` while it is stopped,
/// `QUEUE_STATE_UNKNOWN` before the first look at a queue whose tracking began mid-life
/// (the loader's; a device the programs registered at its first packet starts running).
///
/// Shared between CPUs, yet read and written without atomics: a queue only stops under a
/// qdisc (tun's series and veth stop the queue only when a qdisc is attached), and then every
/// transmit and every dequeue of that queue runs under the qdisc's running state
/// (`qdisc_run_begin`, `net/sched/sch_generic.c`), which serialises the observers below.
#[map]
static QUEUE_STATE: Array<u64> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// Compares the `DRV_XOFF` bit in `state`, the `netdev_queue.state` of `at`'s queue of the
/// device at `dev`, with what was last seen for it and counts the transition, if any. A
/// queue first seen stopped counts one stop then: it stopped before tracking began, and
/// counting it keeps `queue_stops = queue_wakes + stopped` true from the first look.
#[inline(always)]
pub(crate) fn observe_queue(dev: u64, at: At, state: u64, clock: &mut Clock) {
    let Some(seen) = QUEUE_STATE.get_ptr_mut(at.slot) else {
        return;
    };
    let stopped = state & u64::from(fact!(drv_xoff_mask)) != 0;
    // SAFETY: see QUEUE_STATE: the observers of one queue are serialised by its qdisc.
    let since = unsafe { *seen };
    let unknown = since == QUEUE_STATE_UNKNOWN;
    if unknown && !stopped {
        unsafe { *seen = 0 };
        return;
    }
    if !unknown && stopped == (since != 0) {
        return;
    }
    if stopped {
        stop(dev, at, seen, clock);
    } else {
        let Some(c) = counters(at.slot) else { return };
        let now = clock.now();
        unsafe { *seen = 0 };
        c.queue_wakes += 1;
        c.stopped_ns += now.saturating_sub(since & !1);
        crate::ring::sample_event(dev, at, clock);
        // Where the wake kprobe runs, it records the wake itself, at the moment it happens.
        if !crate::wake::records_wakes() {
            record_at(at, EventKind::QueueWake, 0, clock);
        }
    }
}

/// `at`'s queue is seen stopped (its `QUEUE_STATE` at `seen` said running, or unknown):
/// counts the stop, from now.
#[inline(always)]
pub(crate) fn stop(dev: u64, at: At, seen: *mut u64, clock: &mut Clock) {
    let Some(c) = counters(at.slot) else { return };
    // SAFETY: see QUEUE_STATE.
    unsafe { *seen = clock.now() | 1 };
    c.queue_stops += 1;
    crate::ring::sample_event(dev, at, clock);
    record_at(at, EventKind::QueueStop, 0, clock);
}

/// The `QUEUE_STATE` of slot `slot`.
#[inline(always)]
pub(crate) fn state_of(slot: u32) -> Option<*mut u64> {
    QUEUE_STATE.get_ptr_mut(slot)
}

/// `qdisc_dequeue(qdisc, txq, packets, skb)`: the qdisc looks at the queue; a wake shows
/// here first, since `netif_tx_wake_queue` reschedules the qdisc. Where kprobes are missing,
/// a dequeue of a counted device is also followed to the driver (`requeue.rs`).
#[btf_tracepoint(function = "qdisc_dequeue")]
#[inline(always)]
pub(crate) fn qdisc_dequeue(ctx: BtfTracePointContext) -> i32 {
    let txq: u64 = ctx.arg(1);
    let Some(dev) = Typed::read::<u64>(txq, fact!(txq_dev)) else {
        return 0;
    };
    let Some(d) = device::<Typed>(dev) else {
        return 0;
    };
    if let Some(queue) = queue_index::<Typed>(dev, txq)
        && let Some(at) = crate::device::at(&d, queue)
        && let Some(state) = Typed::read::<u64>(txq, fact!(txq_state))
    {
        observe_queue(dev, at, state, &mut Clock::new());
    }
    if setting(SETTING_DEQUEUE_PAIRS) {
        let skb: u64 = ctx.arg(3);
        let packets: i32 = ctx.arg(2);
        crate::requeue::dequeued(&d, skb, packets);
    }
    0
}
