//! The queue's `__QUEUE_STATE_DRV_XOFF` bit: stops, wakes and time stopped, observed after
//! every driver call and at every qdisc dequeue.

use aya_ebpf::{
    macros::{map, raw_tracepoint},
    maps::Array,
    programs::RawTracePointContext,
};
use tap_probe_common::{EventKind, MAX_QUEUE_SLOTS};

use crate::clock::Clock;
use crate::counters::counters;
use crate::device::{At, locate_txq};
use crate::events::record_at;
use crate::facts::{fact, read};

/// Per queue slot: 0 while the queue runs, `since_ns | 1` while it is stopped.
///
/// Shared between CPUs, yet read and written without atomics: a queue only stops under a
/// qdisc (tun's series and veth stop the queue only when a qdisc is attached), and then every
/// transmit and every dequeue of that queue runs under the qdisc's running state
/// (`qdisc_run_begin`, `net/sched/sch_generic.c`), which serialises the observers below.
#[map]
static QUEUE_STATE: Array<u64> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// Compares the `DRV_XOFF` bit of `at`'s queue with what was last seen for it and counts
/// the transition, if any.
#[inline(always)]
pub(crate) fn observe_queue(at: At, clock: &mut Clock) {
    let Some(state) = read::<u64>(at.txq, fact!(txq_state)) else {
        return;
    };
    let Some(seen) = QUEUE_STATE.get_ptr_mut(at.slot) else {
        return;
    };
    let stopped = state & u64::from(fact!(drv_xoff_mask)) != 0;
    // SAFETY: see QUEUE_STATE: the observers of one queue are serialised by its qdisc.
    let since = unsafe { *seen };
    if stopped == (since != 0) {
        return;
    }
    let Some(c) = counters(at.slot) else { return };
    let now = clock.now();
    if stopped {
        unsafe { *seen = now | 1 };
        c.queue_stops += 1;
        record_at(at, EventKind::QueueStop, 0, clock);
    } else {
        unsafe { *seen = 0 };
        c.queue_wakes += 1;
        c.stopped_ns += now.saturating_sub(since & !1);
        // Where the wake kprobe runs, it records the wake itself, at the moment it happens.
        if !crate::wake::records_wakes() {
            record_at(at, EventKind::QueueWake, 0, clock);
        }
    }
}

/// `qdisc_dequeue(qdisc, txq, packets, skb)`: the qdisc looks at the queue; a wake shows
/// here first, since `netif_tx_wake_queue` reschedules the qdisc.
#[raw_tracepoint(tracepoint = "qdisc_dequeue")]
pub(crate) fn qdisc_dequeue(ctx: RawTracePointContext) -> i32 {
    let txq: u64 = ctx.arg(1);
    let Some(dev) = read::<u64>(txq, fact!(txq_dev)) else {
        return 0;
    };
    if let Some(at) = locate_txq(dev, txq) {
        observe_queue(at, &mut Clock::new());
    }
    0
}
