//! Wakes by source: a kprobe on `netif_tx_wake_queue` (every wake of a transmit queue goes
//! through it: `netif_wake_subqueue` and tun's wakers call it), classified by the kernel
//! functions on its stack.
//!
//! It is also called where nothing is stopped (the seeds' `__tun_wake_queue` on every read
//! that empties the ring, drivers on every transmit completion), so it bails out unless the
//! queue's `DRV_XOFF` bit is set: only then does the call clear it and wake the queue.

use aya_ebpf::{
    EbpfContext, helpers::generated::bpf_get_stack, macros::kprobe, programs::ProbeContext,
};
use tap_probe_common::{
    EventKind, MAX_WAKE_RANGES, QUEUE_STATE_UNKNOWN, SETTING_WAKE_EVENTS, WAKE_STACK_DEPTH,
    WakeClass,
};

use crate::clock::Clock;
use crate::device::{locate, queue_index, setting};
use crate::events::record;
use crate::facts::{KERNEL, Mem, Probed, fact};
use crate::queue_state::stop;
use crate::storage::{add, shared};

/// Whether this probe records the `QueueWake` events (it is attached and recording).
#[inline(always)]
pub(crate) fn records_wakes() -> bool {
    setting(SETTING_WAKE_EVENTS)
}

/// The bytes of the stack frames read.
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const STACK_BYTES: u32 = (WAKE_STACK_DEPTH * 8) as u32;

/// `netif_tx_wake_queue(dev_queue)`.
#[kprobe]
#[inline(always)]
pub(crate) fn wake_entry(ctx: ProbeContext) -> u32 {
    let Some(txq) = ctx.arg::<u64>(0) else {
        return 0;
    };
    let Some(state) = Probed::read::<u64>(txq, fact!(txq_state)) else {
        return 0;
    };
    if state & u64::from(fact!(drv_xoff_mask)) == 0 {
        return 0;
    }
    let Some(dev) = Probed::read::<u64>(txq, fact!(txq_dev)) else {
        return 0;
    };
    let Some(at) = queue_index::<Probed>(dev, txq).and_then(|q| locate::<Probed>(dev, q)) else {
        return 0;
    };
    let Some(s) = shared(at.slot) else {
        return 0;
    };
    // A queue stopped before its tracking began, not looked at since: it is seen stopped
    // now, before this wake, so the wake that follows has its stop.
    if s.state == QUEUE_STATE_UNKNOWN {
        stop(dev, at, s, &mut Clock::new());
    }
    let class = classify(&ctx);
    let c = &mut s.counters;
    add(
        match class {
            WakeClass::Reader => &mut c.wakes_reader,
            WakeClass::Vhost => &mut c.wakes_vhost,
            WakeClass::Forced => &mut c.wakes_forced,
            WakeClass::Recheck => &mut c.wakes_recheck,
            WakeClass::Other => &mut c.wakes_other,
        },
        1,
    );
    // A re-check undoes a stop of the same driver call, which the queue state observers
    // never saw: no wake event for it.
    if class != WakeClass::Recheck {
        record(at, EventKind::QueueWake, class as u32);
    }
    0
}

/// The class of the outermost known function on the wake's stack, above the probed
/// function itself: vhost-net's `tun_wake_queue` calls `__tun_wake_queue`, which calls
/// `netif_tx_wake_queue`; the caller of the caller decides.
#[inline(always)]
fn classify(ctx: &ProbeContext) -> WakeClass {
    let mut frames = [0u64; WAKE_STACK_DEPTH];
    // SAFETY: `frames` is STACK_BYTES bytes on this program's stack.
    let bytes = unsafe { bpf_get_stack(ctx.as_ptr(), frames.as_mut_ptr().cast(), STACK_BYTES, 0) };
    let Ok(bytes) = usize::try_from(bytes) else {
        return WakeClass::Other;
    };
    let n = bytes / 8;
    let ranges = fact!(wake_range_count) as usize;
    let mut found = WakeClass::Other;
    // Frame 0 is the probed function itself.
    for (f, &ip) in frames.iter().enumerate().skip(1) {
        if f >= n {
            break;
        }
        for r in 0..MAX_WAKE_RANGES {
            if r >= ranges {
                break;
            }
            let range = unsafe { core::ptr::read_volatile(&raw const KERNEL.wake_ranges[r]) };
            if ip >= range.range.start
                && ip < range.range.end
                && let Some(class) = WakeClass::from_u32(range.class)
            {
                // The driver's re-check calls the wake directly: only the first frame.
                if class != WakeClass::Recheck || f == 1 {
                    found = class;
                }
            }
        }
    }
    found
}
