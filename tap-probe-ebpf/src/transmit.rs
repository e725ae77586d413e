//! Driver calls: the start and end of each `ndo_start_xmit` on a counted device, what the
//! driver did with the packet, and the drops that happen inside the call.

use aya_ebpf::{
    EbpfContext,
    macros::{btf_tracepoint, kprobe, kretprobe, map},
    maps::PerCpuArray,
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};
use aya_log_ebpf::debug;
use tap_probe_common::{
    DEVICE_TUN, DROP_REASON_BEFORE_RING, DROP_REASON_UNCLASSIFIED, DROP_REASON_XMIT_ERROR,
    DropClass, EventKind, InFlight,
};

use crate::clock::Clock;
use crate::device::{At, driver, locate_skb, txq_state};
use crate::events::{record, record_at};
use crate::facts::{Mem, Probed, Typed, fact};
use crate::queue_state::observe_queue;
use crate::storage::{add, count_reason, per_cpu, shared};

/// The driver call in flight on this CPU, between its start and its end.
#[map]
static IN_FLIGHT: PerCpuArray<InFlight> = PerCpuArray::with_max_entries(1, 0);

/// Where drops are told by their path ([`DropClass::Path`]): what the packet of the call
/// in flight on this CPU carried when the call began, [`OWNED`] and [`TRACKED`].
#[map]
static IN_FLIGHT_MARKS: PerCpuArray<u32> = PerCpuArray::with_max_entries(1, 0);

/// The packet had an owner (`skb->destructor`), which `skb_orphan` clears.
const OWNED: u32 = 1;
/// The packet had a conntrack reference (`skb->_nfct`), which `nf_reset_ct` clears.
const TRACKED: u32 = 2;

/// What of [`OWNED`] and [`TRACKED`] the packet at `skb` carries now.
#[inline(always)]
fn marks<M: Mem>(skb: u64) -> u32 {
    let owned = M::read::<u64>(skb, fact!(skb_destructor)).is_some_and(|d| d != 0);
    let nfct = fact!(skb_nfct);
    let tracked = nfct != 0 && M::read::<u64>(skb, nfct).is_some_and(|ct| ct != 0);
    (u32::from(owned) * OWNED) | (u32::from(tracked) * TRACKED)
}

/// Whether drops are told apart by their path (the kernel gives no full-ring reason).
#[inline(always)]
fn by_path() -> bool {
    fact!(drop_class) == DropClass::Path as u32
}

/// A driver call begins: remember it for this CPU. False when the device is not counted.
#[inline(always)]
fn xmit_begin<M: Mem, C: EbpfContext>(ctx: &C, skb: u64, dev: u64) -> bool {
    let Some(at) = locate_skb::<M>(dev, skb) else {
        return false;
    };
    if let Some(f) = IN_FLIGHT.get_ptr_mut(0) {
        // SAFETY: per-CPU, and the transmit path runs with bottom halves disabled.
        let f = unsafe { &mut *f };
        if f.skb != 0 {
            // The end of the call before was never seen (a missed return probe), or a
            // counted device transmits from inside another's driver call: that call is
            // left uncounted.
            debug!(
                ctx,
                "driver call on slot {} began before the last one ended", at.slot
            );
        }
        *f = InFlight {
            skb,
            dev,
            key: at.key,
            slot: at.slot,
            queue: at.queue,
            dropped: 0,
            flags: at.flags,
            reserved: 0,
        };
    }
    if by_path()
        && let Some(m) = IN_FLIGHT_MARKS.get_ptr_mut(0)
    {
        // SAFETY: per-CPU, as IN_FLIGHT.
        unsafe { *m = marks::<M>(skb) };
    }
    crate::requeue::driver_call(at.slot, skb);
    crate::reorder::driver_call::<M>(skb, at.key);
    true
}

/// `net_dev_start_xmit(skb, dev)`: the tracepoint source of a driver call's start.
#[btf_tracepoint(function = "net_dev_start_xmit")]
#[inline(always)]
pub(crate) fn net_dev_start_xmit(ctx: BtfTracePointContext) -> i32 {
    // The end, `net_dev_xmit`, names its skb: a call it does not match is not counted.
    xmit_begin::<Typed, _>(&ctx, ctx.arg(0), ctx.arg(1));
    0
}

/// The kprobe source of a driver call's start: `tun_net_xmit(skb, dev)`, `veth_xmit(skb,
/// dev)` (every `ndo_start_xmit` has that signature).
#[kprobe]
#[inline(always)]
pub(crate) fn xmit_entry(ctx: ProbeContext) -> u32 {
    if let (Some(skb), Some(dev)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1))
        && !xmit_begin::<Probed, _>(&ctx, skb, dev)
        && let Some(f) = IN_FLIGHT.get_ptr_mut(0)
    {
        // The return probe has no skb to match: the call it ends is the last one that
        // began on this CPU. An uncounted device's call empties the slot, so that a call
        // whose return was missed is never counted at the return of another.
        // SAFETY: per-CPU, bottom halves disabled.
        unsafe { (*f).skb = 0 };
    }
    0
}

/// `kfree_skb(skb, location, reason, ...)` (`(skb, location)` before Linux 5.17): a drop; it
/// is the driver's when it frees the skb of the call in flight on this CPU (`tun_net_xmit`'s
/// `drop:` label, `drivers/net/tun.c`).
#[btf_tracepoint(function = "kfree_skb")]
#[inline(always)]
pub(crate) fn kfree_skb(ctx: BtfTracePointContext) -> i32 {
    let skb: u64 = ctx.arg(0);
    let Some(f) = IN_FLIGHT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU; see xmit_begin.
    let f = unsafe { &mut *f };
    if f.skb != skb || skb == 0 {
        return 0;
    }
    // The verifier reads `drop_class` as a constant and never sees the other branch: the
    // reason argument does not exist where drops are told by their path.
    let reason = if by_path() {
        drop_path(f.dev, skb)
    } else {
        // `enum skb_drop_reason`.
        ctx.arg(2)
    };
    f.dropped = 1;
    let at = At {
        key: f.key,
        slot: f.slot,
        queue: f.queue,
        flags: f.flags,
    };
    if reason == fact!(reason_full_ring) {
        let Some(c) = per_cpu(at.slot) else {
            return 0;
        };
        c.dropped_full_ring += 1;
        crate::ring::full(f.dev, at);
        record(at, EventKind::DroppedFullRing, 0);
    } else {
        let Some(s) = shared(at.slot) else {
            return 0;
        };
        add(&mut s.counters.dropped_other, 1);
        count_reason(&ctx, at.slot, reason);
        record(at, EventKind::DroppedOther, reason);
    }
    0
}

/// Where the driver dropped the packet at `skb` of the call in flight on this CPU, told by
/// what it lost during the call ([`DropClass::Path`]), as the reason the program counts:
/// `reason_full_ring` (0) where it lost an owner or conntrack reference it had (tun's last
/// steps before its ring), else a pseudo reason. Only tun/tap's path is known.
#[inline(always)]
fn drop_path(dev: u64, skb: u64) -> u32 {
    // The driver's own flags, not the entry's: those lose DEVICE_TUN where tun's ring
    // cannot be found (no module BTF), which says nothing of the path. The device's
    // address came through a map: only the probe helper reads behind it.
    if driver::<Probed>(dev).is_none_or(|flags| flags & DEVICE_TUN == 0) {
        return DROP_REASON_UNCLASSIFIED;
    }
    // This CPU's, written at the call's start.
    let before = IN_FLIGHT_MARKS.get(0).copied().unwrap_or(0);
    let now = marks::<Typed>(skb);
    if before & !now != 0 {
        fact!(reason_full_ring)
    } else if before != 0 {
        DROP_REASON_BEFORE_RING
    } else {
        DROP_REASON_UNCLASSIFIED
    }
}

/// The driver returned `rc` for the call in flight on this CPU, on the device at `dev`
/// (`None`: the one the call began with). `skb` is checked against it when the source knows
/// it (a return probe does not).
#[inline(always)]
fn xmit_end<M: Mem, C: EbpfContext>(ctx: &C, dev: Option<u64>, skb: Option<u64>, rc: u64) {
    let Some(f) = IN_FLIGHT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU; see xmit_begin.
    let f = unsafe { &mut *f };
    if f.skb == 0 || skb.is_some_and(|skb| skb != f.skb) {
        return;
    }
    let InFlight {
        dev: began_on,
        key,
        slot,
        queue,
        dropped,
        flags,
        ..
    } = *f;
    f.skb = 0;
    let dev = dev.unwrap_or(began_on);
    let at = At {
        key,
        slot,
        queue,
        flags,
    };
    let Some(c) = per_cpu(slot) else {
        return;
    };
    c.xmit_calls += 1;
    let mut clock = Clock::new();
    // rc is an int: NETDEV_TX_OK, NETDEV_TX_BUSY, a NET_XMIT_* code (tun answers a drop
    // with NET_XMIT_DROP), or a negative errno some drivers pass up.
    #[expect(
        clippy::cast_possible_truncation,
        reason = "the low 32 bits are the int"
    )]
    let rc = rc as u32;
    if rc == fact!(tx_busy) {
        if let Some(s) = shared(slot) {
            add(&mut s.counters.busy, 1);
        }
        record_at(at, EventKind::Busy, 0, &mut clock);
    } else if dropped == 0 {
        if rc == 0 {
            c.enqueued += 1;
            record_at(at, EventKind::Enqueued, 0, &mut clock);
            crate::reorder::taken(slot);
        } else {
            if let Some(s) = shared(slot) {
                add(&mut s.counters.dropped_other, 1);
            }
            count_reason(ctx, slot, DROP_REASON_XMIT_ERROR);
            record_at(
                at,
                EventKind::DroppedOther,
                DROP_REASON_XMIT_ERROR,
                &mut clock,
            );
        }
    }
    if let Some(state) = txq_state::<M>(dev, queue) {
        observe_queue(dev, at, state, &mut clock);
    }
    crate::ring::sample_exact(dev, at, &mut clock);
}

/// `net_dev_xmit(skb, rc, dev, skb_len)`: the tracepoint source of a driver call's end.
#[btf_tracepoint(function = "net_dev_xmit")]
#[inline(always)]
pub(crate) fn net_dev_xmit(ctx: BtfTracePointContext) -> i32 {
    let rc: i32 = ctx.arg(1);
    #[expect(
        clippy::cast_sign_loss,
        reason = "the int's bits, as xmit_end reads them"
    )]
    let rc = rc as u32;
    xmit_end::<Typed, _>(&ctx, Some(ctx.arg(2)), Some(ctx.arg(0)), u64::from(rc));
    0
}

/// The kprobe source of a driver call's end: the return of the function `xmit_entry`
/// probes. Entry and return run on one CPU with bottom halves disabled, and no driver's
/// transmit nests into another's, so the call in flight is this one: every entry, of a
/// counted device or not, replaces it (`xmit_entry`).
#[kretprobe]
#[inline(always)]
pub(crate) fn xmit_return(ctx: RetProbeContext) -> u32 {
    xmit_end::<Probed, _>(&ctx, None, None, ctx.ret::<u64>());
    0
}
