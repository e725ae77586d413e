//! The queue's `__QUEUE_STATE_DRV_XOFF` bit: stops, wakes and time stopped, observed after
//! every driver call and at every qdisc dequeue.

use aya_ebpf::{macros::btf_tracepoint, programs::BtfTracePointContext};
use tap_probe_common::{EventKind, QUEUE_STATE_UNKNOWN, QueueShared, SETTING_DEQUEUE_PAIRS};

use crate::clock::Clock;
use crate::device::{At, locate, queue_index, setting};
use crate::events::record_at;
use crate::facts::{Mem, Typed, fact};
use crate::storage::{add, shared};

/// Compares the `DRV_XOFF` bit in `state`, the `netdev_queue.state` of `at`'s queue of the
/// device at `dev`, with what was last seen for it and counts the transition, if any. A
/// queue first seen stopped counts one stop then: it stopped before tracking began, and
/// counting it keeps `queue_stops = queue_wakes + stopped` true from the first look.
///
/// What was last seen (`QueueShared::state`: 0 while the queue runs, `since_ns | 1` while
/// it is stopped, `QUEUE_STATE_UNKNOWN` before the first look at a queue whose tracking
/// began mid-life) is shared between CPUs, yet read and written without atomics: a queue
/// only stops under a qdisc (tun's series and veth stop the queue only when a qdisc is
/// attached), and then every transmit and every dequeue of that queue runs under the
/// qdisc's running state (`qdisc_run_begin`, `net/sched/sch_generic.c`), which serialises
/// the observers.
#[inline(always)]
pub(crate) fn observe_queue(dev: u64, at: At, state: u64, clock: &mut Clock) {
    let Some(s) = shared(at.slot) else {
        return;
    };
    let stopped = state & u64::from(fact!(drv_xoff_mask)) != 0;
    let since = s.state;
    let unknown = since == QUEUE_STATE_UNKNOWN;
    if unknown && !stopped {
        s.state = 0;
        return;
    }
    if !unknown && stopped == (since != 0) {
        return;
    }
    if stopped {
        stop(dev, at, s, clock);
    } else {
        let now = clock.now();
        s.state = 0;
        add(&mut s.counters.queue_wakes, 1);
        add(&mut s.counters.stopped_ns, now.saturating_sub(since & !1));
        crate::ring::sample_event(dev, at, clock);
        // Where the wake kprobe runs, it records the wake itself, at the moment it happens.
        if !crate::wake::records_wakes() {
            record_at(at, EventKind::QueueWake, 0, clock);
        }
    }
}

/// `at`'s queue is seen stopped (its state `s` said running, or unknown): counts the stop,
/// from now.
#[inline(always)]
pub(crate) fn stop(dev: u64, at: At, s: &mut QueueShared, clock: &mut Clock) {
    s.state = clock.now() | 1;
    add(&mut s.counters.queue_stops, 1);
    crate::ring::sample_event(dev, at, clock);
    record_at(at, EventKind::QueueStop, 0, clock);
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
    let Some(queue) = queue_index::<Typed>(dev, txq) else {
        return 0;
    };
    // Every dequeue on the host comes here: a device not counted leaves at its driver.
    let Some(at) = locate::<Typed>(dev, queue) else {
        return 0;
    };
    if let Some(state) = Typed::read::<u64>(txq, fact!(txq_state)) {
        observe_queue(dev, at, state, &mut Clock::new());
    }
    if setting(SETTING_DEQUEUE_PAIRS) {
        let skb: u64 = ctx.arg(3);
        let packets: i32 = ctx.arg(2);
        crate::requeue::dequeued(dev, at, skb, packets);
    }
    0
}
