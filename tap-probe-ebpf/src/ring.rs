//! Ring occupancy: the entries in a tun/tap queue's `ptr_ring`, into the queue's record of
//! the latest sample, the highest and a log2 histogram (`QueueShared::occupancy`).
//!
//! Where samples are taken is the loader's choice (`SAMPLE_RING`):
//! - by default where the ring's level means something and events are rare: when the queue
//!   is seen to stop (the ring is full) and to wake (the reader made room), and once per
//!   refresh, by [`sample_rings`], which the loader runs itself over each tracked tap. A
//!   drop at a full ring does not sample, it only notes that the ring was full (`max`
//!   becomes its size, read once). No packet pays for a sample;
//! - exactly: also at the end of every driver call and at every reader take. A sample reads
//!   the position the other side of the ring writes (the reader's at a driver call, the
//!   driver's at a take): a cache line that moves between CPUs at every packet.
//!
//! The record is the queue's one copy, which any CPU may sample into: the count, the sum and
//! the histogram are added to atomically, so no sample is lost; the latest sample and its
//! time are plain stores (the last writer's stays), and so is the highest, which two CPUs
//! sampling one ring at the same instant can leave at the lower of their two samples.
//!
//! The ring is found from the device: `tun_struct = netdev_priv(dev)` (checked to point back
//! at `dev` once per device cache fill, see `device.rs`), `tun_struct.tfiles[queue]`, then
//! `tun_file.tx_ring`. Its four fields (`producer`, `consumer_head`, `size`, `queue`) come
//! in one read of the span that holds them.

use aya_ebpf::{
    helpers::generated::bpf_probe_read_kernel,
    macros::{map, raw_tracepoint},
    maps::PerCpuArray,
    programs::RawTracePointContext,
};
use tap_probe_common::{
    DEVICE_TUN, OCCUPANCY_BUCKETS, RING_SAMPLE_QUEUES, RING_SAMPLES_EVENTS, RING_SAMPLES_EXACT,
};

use crate::clock::Clock;
use crate::device::At;
use crate::facts::{fact, read};
use crate::storage::{add, shared};

/// How rings are sampled (`RING_SAMPLES_*`), set by the loader.
#[unsafe(no_mangle)]
static SAMPLE_RING: u32 = 0;

#[inline(always)]
fn sampling() -> u32 {
    // SAFETY: a plain read of the loader's value; volatile so the zero is not folded.
    unsafe { core::ptr::read_volatile(&raw const SAMPLE_RING) }
}

/// The most of `struct ptr_ring` read at once; the loader keeps `ring.span_len` within it.
const SPAN_MAX: usize = 256;

/// Where the span of the ring is copied: per CPU, so the programs' stacks stay small.
#[map]
static RING_SPAN: PerCpuArray<[u8; SPAN_MAX]> = PerCpuArray::with_max_entries(1, 0);

/// `slot_flags` without [`DEVICE_TUN`] unless the device's private area is a `tun_struct`
/// that points back at `dev` (and rings are sampled at all): a wrong offset never leads the
/// ring samples astray.
#[inline(always)]
pub(crate) fn tun_checked(dev: u64, slot_flags: u32) -> u32 {
    if slot_flags & DEVICE_TUN == 0 || fact!(ring.known) == 0 || sampling() == 0 {
        return !DEVICE_TUN;
    }
    if is_tun(dev) { u32::MAX } else { !DEVICE_TUN }
}

/// Whether the private area of the device at `dev` is a `tun_struct` that points back at it.
#[inline(always)]
fn is_tun(dev: u64) -> bool {
    let tun = dev + u64::from(fact!(ring.dev_priv));
    read::<u64>(tun, fact!(ring.tun_dev)) == Some(dev)
}

/// Samples the ring of `at`'s queue of the tun/tap at `dev` when every driver call and
/// take is sampled.
#[inline(always)]
pub(crate) fn sample_exact(dev: u64, at: At, clock: &mut Clock) {
    if sampling() == RING_SAMPLES_EXACT {
        sample(dev, at, clock);
    }
}

/// Samples the ring of `at`'s queue of the tun/tap at `dev` at a stop or a wake (where
/// every call and take samples, the call that stopped the queue did).
#[inline(always)]
pub(crate) fn sample_event(dev: u64, at: At, clock: &mut Clock) {
    if sampling() == RING_SAMPLES_EVENTS {
        sample(dev, at, clock);
    }
}

/// The ring of `at`'s queue tail-dropped: it was full, so `max` is its size (read from the
/// ring once per queue and CPU).
#[inline(always)]
pub(crate) fn full(dev: u64, at: At) {
    if at.flags & DEVICE_TUN == 0 || sampling() == 0 {
        return;
    }
    let Some(q) = shared(at.slot) else {
        return;
    };
    let s = &mut q.occupancy;
    if s.size == 0
        && let Some(ring) = read_ring(dev, at.queue)
    {
        s.size = ring.size;
    }
    if s.max < s.size {
        s.max = s.size;
    }
}

#[inline(always)]
fn sample(dev: u64, at: At, clock: &mut Clock) {
    if at.flags & DEVICE_TUN == 0 {
        return;
    }
    if let Some(ring) = read_ring(dev, at.queue) {
        record(at.slot, ring, clock.now());
    }
}

/// Counts one sample of `ring` into the record of `slot` (see the module's note on what
/// the CPUs share).
#[inline(always)]
fn record(slot: u32, ring: Ring, ts_ns: u64) {
    let Some(q) = shared(slot) else {
        return;
    };
    let s = &mut q.occupancy;
    let entries = ring.entries;
    s.ts_ns = ts_ns;
    s.current = entries;
    s.size = ring.size;
    if entries > s.max {
        s.max = entries;
    }
    add(&mut s.count, 1);
    add(&mut s.sum, entries);
    if let Some(n) = s.buckets.get_mut(bucket(entries)) {
        add(n, 1);
    }
}

/// `sample_rings(n, q1, q2, ..)`: samples the rings of `n` queues (at most
/// `RING_SAMPLE_QUEUES`) of one tun/tap, each argument a queue's slot in the high 32 bits
/// and its index in the low ones. Attached nowhere: the loader runs it once per refresh
/// (`BPF_PROG_TEST_RUN`), so a ring's level shows without any packet paying for it.
#[raw_tracepoint(tracepoint = "sample_rings")]
#[inline(always)]
pub(crate) fn sample_rings(ctx: RawTracePointContext) -> i32 {
    if fact!(ring.known) == 0 {
        return 0;
    }
    let n: u64 = ctx.arg(0);
    // Each argument read at a constant offset: the verifier refuses a context pointer moved
    // along in a loop.
    let args: [u64; RING_SAMPLE_QUEUES as usize] = [
        ctx.arg(1),
        ctx.arg(2),
        ctx.arg(3),
        ctx.arg(4),
        ctx.arg(5),
        ctx.arg(6),
        ctx.arg(7),
        ctx.arg(8),
        ctx.arg(9),
        ctx.arg(10),
        ctx.arg(11),
    ];
    let now = Clock::new().now();
    for (i, &arg) in args.iter().enumerate() {
        if i as u64 >= n {
            break;
        }
        #[expect(clippy::cast_possible_truncation, reason = "the packed halves")]
        let (slot, queue) = ((arg >> 32) as u32, arg as u16);
        let Some(dev) = shared(slot).map(|s| s.dev) else {
            continue;
        };
        if dev == 0 || !is_tun(dev) {
            continue;
        }
        if let Some(ring) = read_ring(dev, queue) {
            record(slot, ring, now);
        }
    }
    0
}

/// What one read of a ring says.
#[derive(Clone, Copy)]
struct Ring {
    entries: u64,
    size: u64,
}

/// The ring of `queue` of the tun/tap at `dev`: its size, and its entries:
/// `producer - consumer_head` modulo the size; when the two are equal the ring is empty or
/// full, which the slot at `consumer_head` tells (`__ptr_ring_empty` in
/// `include/linux/ptr_ring.h`: the consumer keeps that slot valid; consumed slots behind it
/// wait for their batched zeroing).
#[inline(always)]
fn read_ring(dev: u64, queue: u16) -> Option<Ring> {
    let tun = dev + u64::from(fact!(ring.dev_priv));
    let tfile: u64 = read(tun, fact!(ring.tun_tfiles) + u32::from(queue) * 8)?;
    if tfile == 0 {
        return None; // no reader attached to this queue
    }
    let start = tfile + u64::from(fact!(ring.tfile_tx_ring)) + u64::from(fact!(ring.span_start));
    let len = fact!(ring.span_len);
    if len == 0 || len as usize > SPAN_MAX {
        return None;
    }
    let buf = RING_SPAN.get_ptr_mut(0)?;
    // SAFETY: `buf` is this CPU's SPAN_MAX bytes and `len` is at most that; the helper
    // tolerates any source address.
    let rc = unsafe { bpf_probe_read_kernel(buf.cast(), len, start as *const _) };
    if rc != 0 {
        return None;
    }
    let field = |offset: u32| -> Option<u64> {
        let offset = offset as usize;
        if offset > SPAN_MAX - 8 {
            return None;
        }
        // SAFETY: within the SPAN_MAX bytes of `buf`, checked above.
        Some(unsafe { core::ptr::read_unaligned(buf.cast::<u8>().add(offset).cast::<u64>()) })
    };
    // producer, consumer_head and size are ints; queue is a pointer.
    let producer = field(fact!(ring.producer))? & 0xffff_ffff;
    let head = field(fact!(ring.consumer_head))? & 0xffff_ffff;
    let size = field(fact!(ring.size))? & 0xffff_ffff;
    if size == 0 || producer >= size || head >= size {
        return Some(Ring { entries: 0, size });
    }
    let entries = match producer.cmp(&head) {
        core::cmp::Ordering::Greater => producer - head,
        core::cmp::Ordering::Less => producer + size - head,
        core::cmp::Ordering::Equal => {
            let slots = field(fact!(ring.queue))?;
            let at_head: u64 = read(slots + head * 8, 0)?;
            if at_head == 0 { 0 } else { size }
        }
    };
    Some(Ring { entries, size })
}

/// The histogram bucket of `v`: 0 for 0, else `floor(log2 v) + 1`, capped at the last.
#[inline(always)]
fn bucket(v: u64) -> usize {
    if v == 0 {
        return 0;
    }
    // floor(log2 v) by halving steps: no loop for the verifier to bound.
    let mut v = v;
    let mut log = 0;
    if v >= 1 << 32 {
        v >>= 32;
        log += 32;
    }
    if v >= 1 << 16 {
        v >>= 16;
        log += 16;
    }
    if v >= 1 << 8 {
        v >>= 8;
        log += 8;
    }
    if v >= 1 << 4 {
        v >>= 4;
        log += 4;
    }
    if v >= 1 << 2 {
        v >>= 2;
        log += 2;
    }
    if v >= 1 << 1 {
        log += 1;
    }
    (log + 1).min(OCCUPANCY_BUCKETS - 1)
}
