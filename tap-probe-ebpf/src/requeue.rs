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
    macros::{kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{ProbeContext, RetProbeContext},
};
use tap_probe_common::{DirectXmit, DirectXmitFrame, MAX_BULK, MAX_DIRECT_XMIT_DEPTH};

use crate::device::{At, locate, queue_index};
use crate::facts::{Mem, Probed, Typed, fact, read};
use crate::storage::{add, shared};

/// [`MAX_BULK`] as the kernel's `int packets` compares.
#[expect(clippy::cast_possible_truncation, reason = "a small constant")]
const BULK: u32 = MAX_BULK as u32;

/// Per CPU: the `sch_direct_xmit` calls in progress and the driver calls begun.
#[map]
static DIRECT_XMIT: PerCpuArray<DirectXmit> = PerCpuArray::with_max_entries(1, 0);

/// A driver call of a tracked device begins on this CPU with `skb` on `slot`.
#[inline(always)]
pub(crate) fn driver_call(slot: u32, skb: u64) {
    if let Some(d) = DIRECT_XMIT.get_ptr_mut(0) {
        // SAFETY: per-CPU; the transmit path runs with bottom halves disabled.
        unsafe { (*d).calls += 1 };
    }
    let Some(s) = shared(slot) else {
        return;
    };
    // A queue's dequeues and driver calls are serialised by its qdisc's running state: the
    // follower (`QueueShared::dequeued`) needs no atomics.
    let q = &mut s.dequeued;
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

/// `skb_shinfo(skb)->gso_segs`: the segments software GSO would make of `skb` (a packet
/// of a dequeue, whose pointer the verifier knows). The shared info is found through
/// `skb->head`, a plain address to the verifier: read with the probe helper.
#[inline(always)]
fn gso_segs(skb: u64) -> u16 {
    let (Some(head), Some(end)) = (
        Typed::read::<u64>(skb, fact!(packet.skb_head)),
        Typed::read::<u32>(skb, fact!(packet.skb_end)),
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
        match Probed::read::<u64>(p, fact!(skb_next)) {
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
#[inline(always)]
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
        && let Some(queue) = queue_index::<Probed>(dev, txq)
        && let Some(at) = locate::<Probed>(dev, queue)
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
#[inline(always)]
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
        && let Some(s) = shared(frame.slot)
    {
        add(&mut s.counters.requeued_stopped, back);
    }
    0
}

/// A dequeue of `packets` packets from `skb` on (chained through `skb->next`) of the counted
/// device at `dev`, whose `txq` is `txq_at` (the tracepoint `qdisc_dequeue`, whose `skb` the
/// verifier knows): the queue's previous dequeue is settled (its packets that did not reach
/// the driver were put back) and this one is followed. The queue is the packet's own
/// (`skb->queue_mapping`): the root qdisc of a multi-queue device reports its first queue
/// as `txq`.
#[inline(always)]
pub(crate) fn dequeued(dev: u64, txq_at: At, skb: u64, packets: i32) {
    if skb == 0 {
        return;
    }
    let Some(queue) = Typed::read::<u16>(skb, fact!(skb_queue_mapping)) else {
        return;
    };
    let at = if queue == txq_at.queue {
        txq_at
    } else {
        let Some(at) = locate::<Typed>(dev, queue) else {
            return;
        };
        at
    };
    let Some(s) = shared(at.slot) else {
        return;
    };
    // See `driver_call`.
    let q = &mut s.dequeued;
    if q.packets > q.seen {
        add(
            &mut s.counters.requeued_stopped,
            u64::from(q.packets - q.seen),
        );
    }
    // Packets beyond MAX_BULK (only a device with byte queue limits dequeues that many at
    // once, and none of those is counted) are not followed.
    #[expect(clippy::cast_sign_loss, reason = "clamped to a positive range first")]
    let followed = packets.clamp(1, BULK.cast_signed()) as u32;
    q.packets = followed;
    q.seen = 0;
    q.calls = 0;
    // The first packet is the tracepoint's, typed; those chained behind it are read with
    // the probe helper (a pointer loaded in a loop is no longer known to the verifier).
    q.skbs[0] = skb;
    q.segs[0] = gso_segs(skb);
    let mut p = skb;
    let mut n = 1;
    for i in 1..MAX_BULK {
        if n >= followed {
            break;
        }
        p = Probed::read::<u64>(p, fact!(skb_next)).unwrap_or(0);
        if p == 0 {
            break;
        }
        q.skbs[i] = p;
        q.segs[i] = gso_segs_probed(p);
        n += 1;
    }
    q.packets = n;
}

/// [`gso_segs`] of a packet the verifier knows only as an address.
#[inline(always)]
fn gso_segs_probed(skb: u64) -> u16 {
    let (Some(head), Some(end)) = (
        read::<u64>(skb, fact!(packet.skb_head)),
        read::<u32>(skb, fact!(packet.skb_end)),
    ) else {
        return 0;
    };
    read(head + u64::from(end), fact!(packet.shinfo_gso_segs)).unwrap_or(0)
}
