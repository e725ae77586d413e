//! Ring occupancy: the entries in a tun/tap queue's `ptr_ring`, sampled at the end of every
//! driver call and at every reader take, into a per-CPU record of the latest sample, the
//! highest and a log2 histogram.
//!
//! The ring is found from the device: `tun_struct = netdev_priv(dev)` (checked to point back
//! at `dev` once per device cache fill, see `device.rs`), `tun_struct.tfiles[queue]`, then
//! `tun_file.tx_ring`. Its four fields (`producer`, `consumer_head`, `size`, `queue`) come
//! in one read of the span that holds them.

use aya_ebpf::{helpers::generated::bpf_probe_read_kernel, macros::map, maps::PerCpuArray};
use tap_probe_common::{DEVICE_TUN, MAX_QUEUE_SLOTS, OCCUPANCY_BUCKETS, RingSamples};

use crate::clock::Clock;
use crate::device::At;
use crate::facts::{fact, read};

/// 1 when the loader wants rings sampled. A sample reads the ring position the other side
/// of the ring writes (the reader's at a driver call, the driver's at a take): a cache line
/// that moves between CPUs at every packet, the larger part of a sample's cost.
#[unsafe(no_mangle)]
static SAMPLE_RING: u32 = 0;

/// Whether rings are sampled at all (read once per device cache fill).
#[inline(always)]
pub(crate) fn wanted() -> bool {
    // SAFETY: a plain read of the loader's value; volatile so the zero is not folded.
    let on = unsafe { core::ptr::read_volatile(&raw const SAMPLE_RING) };
    on != 0
}

/// The most of `struct ptr_ring` read at once; the loader keeps `ring.span_len` within it.
const SPAN_MAX: usize = 256;

#[map]
static OCCUPANCY: PerCpuArray<RingSamples> = PerCpuArray::with_max_entries(MAX_QUEUE_SLOTS, 0);

/// Where the span of the ring is copied: per CPU, so the programs' stacks stay small.
#[map]
static RING_SPAN: PerCpuArray<[u8; SPAN_MAX]> = PerCpuArray::with_max_entries(1, 0);

/// Samples the ring of `at`'s queue of the tun/tap at `dev`, if it is one.
#[inline(always)]
pub(crate) fn sample(dev: u64, at: At, clock: &mut Clock) {
    if at.flags & DEVICE_TUN == 0 {
        return;
    }
    let Some(entries) = occupancy(dev, at.queue) else {
        return;
    };
    let Some(s) = OCCUPANCY.get_ptr_mut(at.slot) else {
        return;
    };
    // SAFETY: per-CPU; a driver call and a reader take do not interleave on one CPU
    // mid-update (both run with bottom halves disabled or in the reader's own context,
    // and an interrupted update only leaves one sample half counted).
    let s = unsafe { &mut *s };
    s.ts_ns = clock.now();
    s.current = entries;
    if entries > s.max {
        s.max = entries;
    }
    s.count += 1;
    s.sum += entries;
    let bucket = bucket(entries);
    if let Some(n) = s.buckets.get_mut(bucket) {
        *n += 1;
    }
}

/// Entries in the ring of `queue` of the tun/tap at `dev`: `producer - consumer_head`
/// modulo the size; when the two are equal the ring is empty or full, which the slot at
/// `consumer_head` tells (`__ptr_ring_empty` in `include/linux/ptr_ring.h`: the consumer
/// keeps that slot valid; consumed slots behind it wait for their batched zeroing).
#[inline(always)]
fn occupancy(dev: u64, queue: u16) -> Option<u64> {
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
        return Some(0);
    }
    if producer != head {
        return Some(if producer > head {
            producer - head
        } else {
            producer + size - head
        });
    }
    let slots = field(fact!(ring.queue))?;
    let at_head: u64 = read(slots + head * 8, 0)?;
    Some(if at_head != 0 { size } else { 0 })
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
