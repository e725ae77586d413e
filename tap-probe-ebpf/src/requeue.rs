//! `requeued_stopped`: packets the qdisc handed to `sch_direct_xmit` that went back into
//! it (`dev_requeue_skb`) without a driver call, because the queue was stopped
//! (`net/sched/sch_generic.c`). With `busy`, that is every requeue the qdisc counts.
//!
//! Two sources:
//! - kprobes (exact): at the entry of `sch_direct_xmit` the packets it was handed (a bulk
//!   dequeue chains them through `skb->next`) and this CPU's driver calls so far; at its
//!   return, `false` means the packets not yet given to the driver went back. The driver
//!   calls in between run on the same CPU (the qdisc path runs with bottom halves off).
//!   That includes the bypass path of an empty qdisc (`__dev_xmit_skb` in
//!   `net/core/dev.c`), whose packet never shows at a dequeue.
//! - the `qdisc:qdisc_dequeue` tracepoint: the packets of each dequeue are followed to the
//!   driver; those that did not reach it before the queue's next dequeue were put back.
//!   Exact for dequeued packets, blind to a bypass packet put back (it was never
//!   dequeued), so this count may be short by those. A packet segmented in software
//!   before the driver (GSO without the device's offload) reaches it as `gso_segs` new
//!   skbs, which are counted as its arrival; put back after some of its segments went, it
//!   counts once where the qdisc counts each segment it got back, so under software GSO
//!   `busy + requeued_stopped` can be below the qdisc's requeues, never above.

use aya_ebpf::{
    macros::{kprobe, kretprobe, map, raw_tracepoint},
    maps::{Array, PerCpuArray},
    programs::{ProbeContext, RawTracePointContext, RetProbeContext},
};
use tap_probe_common::{
    Dequeued, DirectXmit, DirectXmitFrame, MAX_BULK, MAX_DIRECT_XMIT_DEPTH, MAX_QUEUE_SLOTS,
};

use crate::counters::counters;
use crate::device::{locate_skb, locate_txq};
use crate::facts::{fact, read};

/// [`MAX_BULK`] as the kernel's `int packets` compares.
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const BULK: u32 = MAX_BULK as u32;

/// Per CPU: the `sch_direct_xmit` calls in progress and the driver calls begun.
#[map]
static DIRECT_XMIT: PerCpuArray<DirectXmit> = PerCpuArray::with_max_entries(1, 0);

/// Per queue slot: its last dequeue, followed to the driver (tracepoint source).
#[map]
static DEQUEUED: Array<Dequeued> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// A driver call of a tracked device begins on this CPU with `skb` on `slot`.
#[inline(always)]
pub(crate) fn driver_call(slot: u32, skb: u64) {
    if let Some(d) = DIRECT_XMIT.get_ptr_mut(0) {
        // SAFETY: per-CPU; the transmit path runs with bottom halves disabled.
        unsafe { (*d).calls += 1 };
    }
    let Some(q) = DEQUEUED.get_ptr_mut(slot) else {
        return;
    };
    // SAFETY: see DEQUEUED: a queue's dequeues and driver calls are serialised by its
    // qdisc's running state.
    let q = unsafe { &mut *q };
    let seen = q.seen as usize;
    if q.seen >= q.packets || seen >= MAX_BULK {
        return;
    }
    if q.skbs[seen] == skb {
        q.seen += 1;
        q.calls = 0;
        return;
    }
    // Another skb: a segment, if the packet is a GSO packet. Software GSO
    // (`validate_xmit_skb`) hands the driver new skbs, as many as the packet's `gso_segs`;
    // the next packet of the dequeue matches again. Any other skb is no packet of this
    // dequeue (it is not followed).
    let segs = u32::from(q.segs[seen]);
    if segs <= 1 {
        return;
    }
    if seen + 1 < MAX_BULK && q.seen + 1 < q.packets && q.skbs[seen + 1] == skb {
        q.seen += 2;
        q.calls = 0;
        return;
    }
    q.calls += 1;
    if q.calls >= segs {
        q.seen += 1;
        q.calls = 0;
    }
}

/// `skb_shinfo(skb)->gso_segs`: the segments software GSO would make of `skb`.
#[inline(always)]
fn gso_segs(skb: u64) -> u16 {
    let (Some(head), Some(end)) = (
        read::<u64>(skb, fact!(packet.skb_head)),
        read::<u32>(skb, fact!(packet.skb_end)),
    ) else {
        return 0;
    };
    read(head + u64::from(end), fact!(packet.shinfo_gso_segs)).unwrap_or(0)
}

/// Packets chained from `skb` through `skb->next`, at most `MAX_BULK`.
#[inline(always)]
fn chained(skb: u64) -> u32 {
    let mut n = 1;
    let mut p = skb;
    for _ in 1..MAX_BULK {
        match read::<u64>(p, fact!(skb_next)) {
            Some(next) if next != 0 => {
                n += 1;
                p = next;
            }
            _ => break,
        }
    }
    n
}

/// `sch_direct_xmit(skb, q, dev, txq, root_lock, validate)` begins: push a frame.
#[kprobe]
pub(crate) fn direct_xmit_entry(ctx: ProbeContext) -> u32 {
    let Some(d) = DIRECT_XMIT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU, bottom halves disabled.
    let d = unsafe { &mut *d };
    let mut frame = DirectXmitFrame {
        slot: u32::MAX,
        packets: 0,
        calls: d.calls,
    };
    if let (Some(skb), Some(dev), Some(txq)) =
        (ctx.arg::<u64>(0), ctx.arg::<u64>(2), ctx.arg::<u64>(3))
        && skb != 0
        && let Some(at) = locate_txq(dev, txq)
    {
        frame.slot = at.slot;
        frame.packets = chained(skb);
    }
    let depth = d.depth as usize;
    if depth < MAX_DIRECT_XMIT_DEPTH {
        d.frames[depth] = frame;
    }
    d.depth = d.depth.saturating_add(1);
    0
}

/// `sch_direct_xmit` returns `false`: what it was handed and did not give the driver went
/// back into the qdisc. Entry and return run on one CPU; a return probe that missed its
/// return leaves a stale frame below, which the next entry at that depth overwrites.
#[kretprobe]
pub(crate) fn direct_xmit_return(ctx: RetProbeContext) -> u32 {
    let Some(d) = DIRECT_XMIT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU, bottom halves disabled.
    let d = unsafe { &mut *d };
    if d.depth == 0 {
        return 0;
    }
    d.depth -= 1;
    let depth = d.depth as usize;
    if depth >= MAX_DIRECT_XMIT_DEPTH {
        return 0;
    }
    let frame = d.frames[depth];
    // A C bool in the low byte of the return register.
    if frame.slot == u32::MAX || ctx.ret::<u64>() & 0xff != 0 {
        return 0;
    }
    let given = d.calls.wrapping_sub(frame.calls);
    let back = u64::from(frame.packets).saturating_sub(given);
    if back > 0
        && let Some(c) = counters(frame.slot)
    {
        c.requeued_stopped += back;
    }
    0
}

/// `qdisc_dequeue(qdisc, txq, packets, skb)` with a packet: the queue's previous dequeue is
/// settled (its packets that did not reach the driver were put back) and this one is
/// followed. The queue is the packet's own (`skb->queue_mapping`): the root qdisc of a
/// multi-queue device reports its first queue as `txq`.
#[raw_tracepoint(tracepoint = "qdisc_dequeue")]
pub(crate) fn dequeue_pairs(ctx: RawTracePointContext) -> i32 {
    let skb: u64 = ctx.arg(3);
    if skb == 0 {
        return 0;
    }
    #[expect(clippy::cast_possible_truncation, reason = "an int")]
    let packets = ctx.arg::<u64>(2) as u32;
    let Some(dev) = read::<u64>(skb, fact!(skb_dev)) else {
        return 0;
    };
    let Some(at) = locate_skb(dev, skb) else {
        return 0;
    };
    let Some(q) = DEQUEUED.get_ptr_mut(at.slot) else {
        return 0;
    };
    // SAFETY: see DEQUEUED.
    let q = unsafe { &mut *q };
    if q.packets > q.seen
        && let Some(c) = counters(at.slot)
    {
        c.requeued_stopped += u64::from(q.packets - q.seen);
    }
    // Packets beyond MAX_BULK (only a device with byte queue limits dequeues that many at
    // once, and none of those is tracked) are not followed.
    let followed = packets.clamp(1, BULK);
    q.packets = followed;
    q.seen = 0;
    q.calls = 0;
    let mut p = skb;
    let mut n = 0;
    for (slot, segs) in q.skbs.iter_mut().zip(q.segs.iter_mut()) {
        *slot = p;
        *segs = gso_segs(p);
        n += 1;
        if n >= followed {
            break;
        }
        p = read::<u64>(p, fact!(skb_next)).unwrap_or(0);
        if p == 0 {
            break;
        }
    }
    q.packets = n;
    0
}
