//! The kernel's `ptr_ring` (`include/linux/ptr_ring.h`), as the producer and the consumer
//! see it.
//!
//! In the kernel a slot is free when it holds NULL. `__ptr_ring_produce` fails when
//! `queue[producer]` is not NULL, and the consumer does not NULL a slot when it takes the
//! entry: `__ptr_ring_discard_one` zeroes consumed slots in batches of `r->batch`
//! (`SMP_CACHE_BYTES * 2 / sizeof(void *)`, 16 on x86-64, or 1 when that exceeds half the
//! ring), and when `consumer_head` reaches the end of the array. So after a full ring lost
//! one entry to the reader, the producer still sees it full until the batch is zeroed.
//!
//! Produced slots are set to NULL in the order they were filled, so the non-NULL slots are always
//! the contiguous run starting at `consumer_tail`; this model keeps the length of that run
//! (`filled`) instead of scanning an array, which makes every operation O(1) with the exact
//! outcomes of the kernel's code (`super::reference` checks that against a literal
//! transcription of the C).

/// `SMP_CACHE_BYTES * 2 / sizeof(void *)` on x86-64 (64-byte cache lines).
pub const X86_64_BATCH: u32 = 16;

/// `__ptr_ring_set_size`: the cache-line batch, or 1 when it exceeds half the ring (or is 0).
#[must_use]
pub(crate) const fn batch_for(size: u32, cache_batch: u32) -> u32 {
    if cache_batch > size / 2 || cache_batch == 0 {
        1
    } else {
        cache_batch
    }
}

/// A `ptr_ring` of `size` slots whose entries are `u64` values (the replay stores each
/// packet's arrival time).
#[derive(Debug, Clone)]
pub(crate) struct PtrRing {
    size: u32,
    batch: u32,
    producer: u32,
    consumer_head: u32,
    consumer_tail: u32,
    /// Non-NULL slots: produced and not yet zeroed.
    filled: u32,
    /// Entries not yet consumed (what `__ptr_ring_empty` tests).
    avail: u32,
    values: Box<[u64]>,
}

impl PtrRing {
    /// `ptr_ring_init(r, size)` on a machine whose cache-line batch is `cache_batch`.
    #[must_use]
    pub(crate) fn new(size: u32, cache_batch: u32) -> Self {
        Self {
            size,
            batch: batch_for(size, cache_batch),
            producer: 0,
            consumer_head: 0,
            consumer_tail: 0,
            filled: 0,
            avail: 0,
            values: vec![0; size as usize].into_boxed_slice(),
        }
    }

    #[must_use]
    pub(crate) fn size(&self) -> u32 {
        self.size
    }

    /// Entries the consumer can still take.
    #[must_use]
    pub(crate) fn len(&self) -> u32 {
        self.avail
    }

    /// `__ptr_ring_empty`: the consumer finds nothing.
    #[must_use]
    pub(crate) fn is_empty(&self) -> bool {
        self.avail == 0
    }

    /// `__ptr_ring_full` (also what the series calls `__ptr_ring_produce_peek`): the slot at
    /// `producer` is not NULL, so a produce would fail.
    #[must_use]
    #[inline]
    pub(crate) fn is_full(&self) -> bool {
        self.filled == self.size
    }

    /// Slots the producer cannot use: unconsumed entries plus consumed ones not yet zeroed.
    #[cfg(test)]
    #[must_use]
    pub(crate) fn slots_used(&self) -> u32 {
        self.filled
    }

    /// `__ptr_ring_produce`: false (`-ENOSPC`) when full.
    #[inline]
    pub(crate) fn produce(&mut self, value: u64) -> bool {
        if self.is_full() {
            return false;
        }
        // `size > 0` here: a zero-sized ring is always full.
        let i = self.producer as usize;
        debug_assert!(i < self.values.len());
        // SAFETY: `producer` is in `0..size` (it wraps to 0 on reaching `size`, below) and
        // `values` has `size` slots.
        unsafe { *self.values.get_unchecked_mut(i) = value };
        let next = self.producer + 1;
        self.producer = if next >= self.size { 0 } else { next };
        self.filled += 1;
        self.avail += 1;
        true
    }

    /// `__ptr_ring_consume`: the oldest entry, zeroing a batch of slots when due.
    #[inline]
    pub(crate) fn consume(&mut self) -> Option<u64> {
        if self.avail == 0 {
            return None;
        }
        let i = self.consumer_head as usize;
        debug_assert!(i < self.values.len());
        // SAFETY: `consumer_head` is in `0..size` (it wraps to 0 on reaching `size`, below)
        // and `values` has `size` slots.
        let value = unsafe { *self.values.get_unchecked(i) };
        self.avail -= 1;
        // __ptr_ring_discard_one: zero a batch, or everything consumed at the array's end.
        let head = self.consumer_head + 1;
        let wrap = head >= self.size;
        if head - self.consumer_tail >= self.batch || wrap {
            self.filled -= head - self.consumer_tail;
            self.consumer_tail = if wrap { 0 } else { head };
        }
        self.consumer_head = if wrap { 0 } else { head };
        Some(value)
    }

    /// `__ptr_ring_consume_batched`: up to `out.len()` entries; returns how many.
    #[cfg(test)]
    pub(crate) fn consume_batched(&mut self, out: &mut [u64]) -> usize {
        let mut n = 0;
        for slot in out.iter_mut() {
            match self.consume() {
                Some(v) => {
                    *slot = v;
                    n += 1;
                }
                None => break,
            }
        }
        n
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn batch_is_reduced_for_small_rings() {
        assert_eq!(batch_for(500, 16), 16);
        assert_eq!(batch_for(32, 16), 16);
        assert_eq!(batch_for(31, 16), 1);
        assert_eq!(batch_for(1, 16), 1);
        assert_eq!(batch_for(256, 0), 1);
    }

    #[test]
    fn producer_sees_full_until_a_batch_is_zeroed() {
        let mut r = PtrRing::new(64, X86_64_BATCH);
        for i in 0..64 {
            assert!(r.produce(i));
        }
        assert!(r.is_full());
        assert!(!r.produce(99));
        for i in 0..15 {
            assert_eq!(r.consume(), Some(i));
            assert!(r.is_full(), "after {} consumes", i + 1);
        }
        assert_eq!(r.consume(), Some(15));
        assert!(!r.is_full());
        assert_eq!(r.slots_used(), 48);
        assert_eq!(r.len(), 48);
        for i in 0..16 {
            assert!(r.produce(100 + i));
        }
        assert!(!r.produce(0));
    }

    #[test]
    fn end_of_array_zeroes_early() {
        // 40 slots, batch 16: heads 16 and 32 zero batches, 40 zeroes the last 8.
        let mut r = PtrRing::new(40, X86_64_BATCH);
        for i in 0..40 {
            assert!(r.produce(i));
        }
        for _ in 0..32 {
            r.consume();
        }
        assert_eq!(r.slots_used(), 8);
        for _ in 0..7 {
            r.consume();
        }
        assert_eq!(r.slots_used(), 8);
        r.consume();
        assert_eq!(r.slots_used(), 0);
        assert!(r.is_empty());
    }

    #[test]
    fn zero_sized_ring_is_always_full() {
        let mut r = PtrRing::new(0, X86_64_BATCH);
        assert!(r.is_full());
        assert!(r.is_empty());
        assert!(!r.produce(1));
        assert_eq!(r.consume(), None);
    }

    #[test]
    fn consume_batched_stops_when_empty() {
        let mut r = PtrRing::new(8, X86_64_BATCH);
        for i in 0..5 {
            r.produce(i);
        }
        let mut out = [0; 64];
        assert_eq!(r.consume_batched(&mut out), 5);
        assert_eq!(&out[..5], &[0, 1, 2, 3, 4]);
        assert_eq!(r.consume_batched(&mut out), 0);
    }
}
