//! The tracepoint backend: raw tracepoints on the transmit path, the drop and consume points,
//! and the qdisc dequeue, counting per (device, queue) into per-CPU maps.
//!
//! Per packet the programs do a few `bpf_probe_read_kernel`s at offsets the loader read from
//! the kernel's BTF, one hash lookup on a 64-bit key, and plain increments of per-CPU memory.
#![no_std]
#![no_main]

use aya_ebpf::{
    helpers::{
        bpf_get_current_task, bpf_get_smp_processor_id, bpf_ktime_get_ns, bpf_probe_read_kernel,
    },
    macros::{btf_tracepoint, fentry, kprobe, kretprobe, map, raw_tracepoint, tracepoint, xdp},
    maps::{Array, HashMap, PerCpuArray, PerCpuHashMap, RingBuf},
    programs::{
        BtfTracePointContext, FEntryContext, ProbeContext, RawTracePointContext, RetProbeContext,
        TracePointContext, XdpContext,
    },
};
use tap_probe_common::{
    DROP_REASON_XMIT_ERROR, DeviceCache, DeviceKey, DeviceSlot, DropKey, EVENTS_RING_BYTES,
    EventKind, InFlight, KernelFacts, MAX_DEVICES, MAX_DROP_KEYS, MAX_QUEUE_SLOTS,
    MAX_READER_RANGES, QueueCounters, ReaderState, TraceEvent,
};

/// Filled in by the loader before load (it lands in `.rodata`); read field by field with
/// volatile reads so the compiler cannot fold the zero initialiser.
#[unsafe(no_mangle)]
static KERNEL: KernelFacts = unsafe { core::mem::zeroed() };

macro_rules! fact {
    ($field:ident) => {
        unsafe { core::ptr::read_volatile(&raw const KERNEL.$field) }
    };
}

#[map]
static DEVICES: HashMap<DeviceKey, DeviceSlot> = HashMap::with_max_entries(MAX_DEVICES, 0);

#[map]
static COUNTERS: PerCpuArray<QueueCounters> = PerCpuArray::with_max_entries(MAX_QUEUE_SLOTS, 0);

#[map]
static DROP_REASONS: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(MAX_DROP_KEYS, 0);

/// Per queue slot: 0 while the queue runs, `since_ns | 1` while it is stopped.
///
/// Shared between CPUs, yet read and written without atomics: a queue only stops under a
/// qdisc (tun's series and veth stop the queue only when a qdisc is attached), and then every
/// transmit and every dequeue of that queue runs under the qdisc's running state
/// (`qdisc_run_begin`, net/sched/sch_generic.c), which serialises the observers below.
#[map]
static QUEUE_STATE: Array<u64> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

#[map]
static IN_FLIGHT: PerCpuArray<InFlight> = PerCpuArray::with_max_entries(1, 0);

/// Per queue slot: its reader at the last take. Shared between CPUs without atomics: a
/// queue's reader is one thread (a tap queue is one file, read by the thread that owns it),
/// and its takes do not overlap; two threads taking turns on one queue only reset each
/// other's baseline, so sleeps are then undercounted, never invented.
#[map]
static READERS: Array<ReaderState> = Array::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// 1 when `tap-probe record` wants per-packet events; set by the loader.
#[unsafe(no_mangle)]
static RECORD_EVENTS: u32 = 0;

#[map]
static EVENTS: RingBuf = RingBuf::with_byte_size(EVENTS_RING_BYTES, 0);

/// Events that found `EVENTS` full, per CPU: counted, never silent.
#[map]
static EVENTS_LOST: PerCpuArray<u64> = PerCpuArray::with_max_entries(1, 0);

#[inline(always)]
fn read<T>(base: u64, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports a fault as an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
}

/// Where an event happened: the device, its queue, and that queue's counter slot.
#[derive(Clone, Copy)]
struct At {
    key: DeviceKey,
    slot: u32,
    queue: u16,
}

#[map]
static GENERATION: Array<u64> = Array::with_max_entries(1, 0);

#[map]
static DEVICE_CACHE: PerCpuArray<DeviceCache> = PerCpuArray::with_max_entries(1, 0);

/// The tracked device at `dev`, through this CPU's one-entry cache.
#[inline(always)]
fn device(dev: u64) -> Option<DeviceCache> {
    let ifindex: u32 = read(dev, fact!(dev_ifindex))?;
    let generation = GENERATION.get(0).copied().unwrap_or(0);
    let cache = DEVICE_CACHE.get_ptr_mut(0)?;
    // SAFETY: per-CPU; the programs sharing it do not interleave on one CPU mid-update
    // (and a torn entry would fail the checks below and be refilled).
    let cache = unsafe { &mut *cache };
    if cache.dev != dev || cache.generation != generation || cache.key.ifindex != ifindex {
        let net: u64 = read(dev, fact!(dev_net))?;
        let netns: u32 = read(net, fact!(net_inum))?;
        let key = DeviceKey { netns, ifindex };
        // SAFETY: the value is copied out before any other map operation.
        let slot = unsafe { DEVICES.get(key) }.copied().unwrap_or_default();
        *cache = DeviceCache {
            dev,
            generation,
            key,
            base: slot.base,
            queues: slot.queues,
        };
    }
    (cache.queues != 0).then_some(*cache)
}

/// Where `queue` of the net_device at `dev` is counted, if that device is tracked.
#[inline(always)]
fn locate(dev: u64, queue: u16) -> Option<At> {
    let d = device(dev)?;
    // The loader sizes each device by its num_tx_queues, which bounds queue_mapping.
    (u32::from(queue) < d.queues).then_some(At {
        key: d.key,
        slot: d.base + u32::from(queue),
        queue,
    })
}

#[inline(always)]
fn counters(slot: u32) -> Option<&'static mut QueueCounters> {
    // SAFETY: per-CPU memory; the callers run with bottom halves or preemption disabled, and
    // no two of them that touch the same field can interleave on one CPU.
    COUNTERS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

/// Emits a per-packet event when recording.
#[inline(always)]
fn record(at: At, kind: EventKind, reason: u32) {
    if unsafe { core::ptr::read_volatile(&raw const RECORD_EVENTS) } == 0 {
        return;
    }
    let event = TraceEvent {
        ts_ns: unsafe { bpf_ktime_get_ns() },
        netns: at.key.netns,
        ifindex: at.key.ifindex,
        queue: at.queue,
        cpu: unsafe { bpf_get_smp_processor_id() } as u16,
        kind: kind as u32,
        reason,
        reserved: 0,
    };
    if EVENTS.output::<TraceEvent>(&event, 0).is_err()
        && let Some(lost) = EVENTS_LOST.get_ptr_mut(0)
    {
        // SAFETY: per-CPU.
        unsafe { *lost += 1 };
    }
}

/// Compares the DRV_XOFF bit of the queue at `txq` with what was last seen for it and
/// counts the transition, if any.
#[inline(always)]
fn observe_queue(txq: u64, at: At) {
    let Some(state) = read::<u64>(txq, fact!(txq_state)) else {
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
    let now = unsafe { bpf_ktime_get_ns() };
    if stopped {
        unsafe { *seen = now | 1 };
        c.queue_stops += 1;
        record(at, EventKind::QueueStop, 0);
    } else {
        unsafe { *seen = 0 };
        c.queue_wakes += 1;
        c.stopped_ns += now.saturating_sub(since & !1);
        record(at, EventKind::QueueWake, 0);
    }
}

#[inline(always)]
fn txq_of(dev: u64, queue: u16) -> Option<u64> {
    let tx: u64 = read(dev, fact!(dev_tx))?;
    Some(tx + u64::from(queue) * u64::from(fact!(txq_size)))
}

/// A driver call begins: remember it for this CPU.
#[inline(always)]
fn xmit_begin(skb: u64, dev: u64) {
    let Some(queue) = read::<u16>(skb, fact!(skb_queue_mapping)) else {
        return;
    };
    let Some(at) = locate(dev, queue) else {
        return;
    };
    if let Some(f) = IN_FLIGHT.get_ptr_mut(0) {
        // SAFETY: per-CPU, and the transmit path runs with bottom halves disabled.
        unsafe {
            *f = InFlight {
                skb,
                dev,
                key: at.key,
                slot: at.slot,
                queue,
                dropped: 0,
            };
        }
    }
}

/// `net_dev_start_xmit(skb, dev)`: the tracepoint source of a driver call's start.
#[raw_tracepoint(tracepoint = "net_dev_start_xmit")]
pub fn net_dev_start_xmit(ctx: RawTracePointContext) -> i32 {
    xmit_begin(ctx.arg(0), ctx.arg(1));
    0
}

/// The kprobe source of a driver call's start: `tun_net_xmit(skb, dev)`, `veth_xmit(skb,
/// dev)` (every `ndo_start_xmit` has that signature).
#[kprobe]
pub fn xmit_entry(ctx: ProbeContext) -> u32 {
    if let (Some(skb), Some(dev)) = (ctx.arg::<u64>(0), ctx.arg::<u64>(1)) {
        xmit_begin(skb, dev);
    }
    0
}

/// `kfree_skb(skb, location, reason, rx_sk)`: a drop; it is the driver's when it frees the
/// skb of the call in flight on this CPU (tun_net_xmit's `drop:` label, drivers/net/tun.c).
#[raw_tracepoint(tracepoint = "kfree_skb")]
pub fn kfree_skb(ctx: RawTracePointContext) -> i32 {
    let skb: u64 = ctx.arg(0);
    let reason: u64 = ctx.arg(2);
    let Some(f) = IN_FLIGHT.get_ptr_mut(0) else {
        return 0;
    };
    // SAFETY: per-CPU; see xmit_begin.
    let f = unsafe { &mut *f };
    if f.skb != skb || skb == 0 {
        return 0;
    }
    f.dropped = 1;
    let at = At {
        key: f.key,
        slot: f.slot,
        queue: f.queue,
    };
    let Some(c) = counters(at.slot) else {
        return 0;
    };
    if reason == u64::from(fact!(reason_full_ring)) {
        c.dropped_full_ring += 1;
        record(at, EventKind::DroppedFullRing, 0);
    } else {
        c.dropped_other += 1;
        count_reason(at.slot, reason as u32);
        record(at, EventKind::DroppedOther, reason as u32);
    }
    0
}

#[inline(always)]
fn count_reason(slot: u32, reason: u32) {
    let key = DropKey { slot, reason };
    match DROP_REASONS.get_ptr_mut(key) {
        // SAFETY: per-CPU value.
        Some(n) => unsafe { *n += 1 },
        None => {
            let _ = DROP_REASONS.insert(key, 1, 0);
        }
    }
}

/// The driver returned `rc` for the call in flight on this CPU. `skb` is checked against it
/// when the source knows it (a return probe does not).
#[inline(always)]
fn xmit_end(skb: Option<u64>, rc: u64) {
    let Some(f) = IN_FLIGHT.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU; see xmit_begin.
    let f = unsafe { &mut *f };
    if f.skb == 0 || skb.is_some_and(|skb| skb != f.skb) {
        return;
    }
    let InFlight {
        dev,
        key,
        slot,
        queue,
        dropped,
        ..
    } = *f;
    f.skb = 0;
    let at = At { key, slot, queue };
    let Some(c) = counters(slot) else {
        return;
    };
    c.xmit_calls += 1;
    // rc is an int: NETDEV_TX_OK, NETDEV_TX_BUSY, a NET_XMIT_* code (tun answers a drop
    // with NET_XMIT_DROP), or a negative errno some drivers pass up.
    let rc = rc as u32;
    if rc == fact!(tx_busy) {
        c.busy += 1;
        record(at, EventKind::Busy, 0);
    } else if dropped == 0 {
        if rc == 0 {
            c.enqueued += 1;
            record(at, EventKind::Enqueued, 0);
        } else {
            c.dropped_other += 1;
            count_reason(slot, DROP_REASON_XMIT_ERROR);
            record(at, EventKind::DroppedOther, DROP_REASON_XMIT_ERROR);
        }
    }
    if let Some(txq) = txq_of(dev, queue) {
        observe_queue(txq, at);
    }
}

/// `net_dev_xmit(skb, rc, dev, skb_len)`: the tracepoint source of a driver call's end.
#[raw_tracepoint(tracepoint = "net_dev_xmit")]
pub fn net_dev_xmit(ctx: RawTracePointContext) -> i32 {
    xmit_end(Some(ctx.arg(0)), ctx.arg(1));
    0
}

/// The kprobe source of a driver call's end: the return of the function `xmit_entry`
/// probes. Entry and return run on one CPU with bottom halves disabled, and no driver's
/// transmit nests into another's, so the call in flight is this one.
#[kretprobe]
pub fn xmit_return(ctx: RetProbeContext) -> u32 {
    xmit_end(None, ctx.ret::<u64>());
    0
}

/// A free of `skb` called from `location`: the reader's take when freed from the tun/tap
/// read path (tun_do_read: tun_put_user, then consume_skb), which is also where tun counts
/// `tx_packets`.
#[inline(always)]
fn freed_after_use(skb: u64, location: u64) {
    if !in_reader(location) {
        return;
    }
    let Some(dev) = read::<u64>(skb, fact!(skb_dev)) else {
        return;
    };
    let Some(queue) = read::<u16>(skb, fact!(skb_queue_mapping)) else {
        return;
    };
    let Some(at) = locate(dev, queue) else {
        return;
    };
    if let Some(c) = counters(at.slot) {
        c.consumed += 1;
        c.reader_sleeps += reader_sleeps_since_last_take(at.slot);
        record(at, EventKind::Consumed, 0);
    }
}

/// Called in the reader's context at each take: how many times the current thread slept
/// voluntarily since its previous take from the same queue (0 at its first take).
#[inline(always)]
fn reader_sleeps_since_last_take(slot: u32) -> u64 {
    // The running task: its address names the thread (one helper call fewer than the tid).
    let task = unsafe { bpf_get_current_task() };
    let Some(nvcsw) = read::<u64>(task, fact!(task_nvcsw)) else {
        return 0;
    };
    let Some(last) = READERS.get_ptr_mut(slot) else {
        return 0;
    };
    // SAFETY: see READERS.
    let last = unsafe { &mut *last };
    // A count that went down is another thread whose task_struct reuses the memory of an
    // exited one: a new baseline, like any other change of reader.
    let slept = if last.task == task && nvcsw >= last.nvcsw {
        nvcsw - last.nvcsw
    } else {
        last.task = task;
        0
    };
    last.nvcsw = nvcsw;
    slept
}

/// `consume_skb(skb, location)`: the tracepoint source of reader takes (Linux >= 6.3, where
/// the tracepoint carries its caller's address).
#[raw_tracepoint(tracepoint = "consume_skb")]
pub fn consume_skb(ctx: RawTracePointContext) -> i32 {
    freed_after_use(ctx.arg(0), ctx.arg(1));
    0
}

/// The kprobe source of reader takes, on any kernel: at the entry of `consume_skb(skb)`
/// the return address, i.e. the caller's location, is the word at the stack pointer.
#[kprobe]
pub fn consume_entry(ctx: ProbeContext) -> u32 {
    let Some(skb) = ctx.arg::<u64>(0) else {
        return 0;
    };
    // SAFETY: regs points at the probed context's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    if let Some(location) = read::<u64>(sp, 0) {
        freed_after_use(skb, location);
    }
    0
}

#[inline(always)]
fn in_reader(location: u64) -> bool {
    let n = fact!(reader_range_count) as usize;
    for i in 0..MAX_READER_RANGES {
        if i >= n {
            break;
        }
        let range = unsafe { core::ptr::read_volatile(&raw const KERNEL.reader_ranges[i]) };
        if location >= range.start && location < range.end {
            return true;
        }
    }
    false
}

/// `qdisc_dequeue(qdisc, txq, packets, skb)`: the qdisc looks at the queue; a wake shows
/// here first, since netif_tx_wake_queue reschedules the qdisc.
#[raw_tracepoint(tracepoint = "qdisc_dequeue")]
pub fn qdisc_dequeue(ctx: RawTracePointContext) -> i32 {
    let txq: u64 = ctx.arg(1);
    let Some(dev) = read::<u64>(txq, fact!(txq_dev)) else {
        return 0;
    };
    let Some(tx) = read::<u64>(dev, fact!(dev_tx)) else {
        return 0;
    };
    let size = u64::from(fact!(txq_size));
    if size == 0 || txq < tx {
        return 0;
    }
    let Ok(queue) = u16::try_from((txq - tx) / size) else {
        return 0;
    };
    if let Some(at) = locate(dev, queue) {
        observe_queue(txq, at);
    }
    0
}

/// How long `slow_consumer` holds each packet, set by the loader.
#[unsafe(no_mangle)]
static SLOW_CONSUMER_NS: u64 = 0;

/// An XDP program that spends `SLOW_CONSUMER_NS` on every packet, then passes it: attached to
/// a veth peer whose NAPI runs threaded on another CPU, it makes a deliberately slow reader of
/// the veth ring, so the sender sees the ring fill (NETDEV_TX_BUSY, queue stops and wakes).
#[xdp]
pub fn slow_consumer(_ctx: XdpContext) -> u32 {
    let hold = unsafe { core::ptr::read_volatile(&raw const SLOW_CONSUMER_NS) };
    let start = unsafe { bpf_ktime_get_ns() };
    // Bounded for the verifier; a ktime read costs tens of ns, so 16384 rounds cover at
    // least ~300 us on real hardware (more under emulation, where each read costs more).
    for _ in 0..16384 {
        if unsafe { bpf_ktime_get_ns() }.wrapping_sub(start) >= hold {
            break;
        }
    }
    aya_ebpf::bindings::xdp_action::XDP_PASS
}

// Minimal programs `tap-probe doctor` loads and attaches to learn which attach types this
// kernel allows. They do nothing.

#[raw_tracepoint(tracepoint = "net_dev_xmit")]
pub fn doctor_raw_tp(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "net_dev_xmit")]
pub fn doctor_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[tracepoint(category = "net", name = "net_dev_xmit")]
pub fn doctor_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[kprobe]
pub fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

#[fentry(function = "tun_net_xmit")]
pub fn doctor_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
