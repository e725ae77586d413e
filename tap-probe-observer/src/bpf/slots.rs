//! The counter map's slots: each tracked device owns one consecutive range, a slot per
//! transmit queue. A range freed by an untracked device waits one generation before reuse,
//! so a program that looked the device up just before it went cannot count into the
//! range's next owner. Free ranges that touch are merged, so devices coming and going for
//! days leave the table as usable as it started.

/// Free and cooling ranges of slots, as `(base, len)`.
#[derive(Debug)]
pub(crate) struct Slots {
    /// Usable now: sorted by base, no two touching.
    free: Vec<(u32, u32)>,
    /// Freed since the last [`Slots::next_generation`].
    cooling: Vec<(u32, u32)>,
}

impl Slots {
    /// `count` slots, all free.
    pub(crate) fn new(count: u32) -> Self {
        Self {
            free: vec![(0, count)],
            cooling: Vec::new(),
        }
    }

    /// The base of `len` consecutive free slots, now taken; `None` when no free range is
    /// that long.
    pub(crate) fn allocate(&mut self, len: u32) -> Option<u32> {
        let i = self.free.iter().position(|&(_, n)| n >= len)?;
        let (base, n) = self.free[i];
        if n == len {
            self.free.remove(i);
        } else {
            self.free[i] = (base + len, n - len);
        }
        Some(base)
    }

    /// Gives `len` slots from `base` back, usable after the next generation.
    pub(crate) fn free(&mut self, base: u32, len: u32) {
        self.cooling.push((base, len));
    }

    /// Gives back a range no program ever saw (its device never made it into the map):
    /// usable at once.
    pub(crate) fn free_unused(&mut self, base: u32, len: u32) {
        self.release(base, len);
    }

    /// Makes the ranges freed before this call usable. Call once per refresh interval: by
    /// then no program still runs with a lookup made before the device was removed.
    pub(crate) fn next_generation(&mut self) {
        for (base, len) in std::mem::take(&mut self.cooling) {
            self.release(base, len);
        }
    }

    /// Puts a range into the free list, merged with the free ranges it touches.
    fn release(&mut self, base: u32, len: u32) {
        let i = self.free.partition_point(|&(b, _)| b < base);
        let mut range = (base, len);
        // The range after, if it starts where this one ends.
        if let Some(&(next, n)) = self.free.get(i)
            && range.0 + range.1 == next
        {
            range.1 += n;
            self.free.remove(i);
        }
        // The range before, if it ends where this one starts.
        if i > 0 && self.free[i - 1].0 + self.free[i - 1].1 == range.0 {
            self.free[i - 1].1 += range.1;
        } else {
            self.free.insert(i, range);
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ranges_are_reused_only_after_a_generation() {
        let mut slots = Slots::new(10);
        assert_eq!(slots.allocate(4), Some(0));
        assert_eq!(slots.allocate(4), Some(4));
        assert_eq!(slots.allocate(4), None, "two slots left");
        slots.free(0, 4);
        assert_eq!(slots.allocate(4), None, "still cooling");
        slots.next_generation();
        assert_eq!(slots.allocate(3), Some(0));
        assert_eq!(slots.allocate(2), Some(8));
        assert_eq!(slots.allocate(1), Some(3));
        assert_eq!(slots.allocate(1), None);
    }

    /// Churn: devices of one to three queues fill the table, then go in a shuffled order
    /// over several generations; once all are gone, the whole table is one range again.
    #[test]
    fn freed_ranges_merge_back_into_one() {
        let mut slots = Slots::new(1000);
        let mut rng = 0x2545_f491_4f6c_dd1d_u64;
        let mut next = move || {
            rng ^= rng << 13;
            rng ^= rng >> 7;
            rng ^= rng << 17;
            rng
        };
        for _ in 0..20 {
            let mut held: Vec<(u32, u32)> = Vec::new();
            loop {
                let len = 1 + u32::try_from(next() % 3).unwrap();
                let Some(base) = slots.allocate(len) else {
                    break;
                };
                held.push((base, len));
            }
            assert!(
                held.iter().map(|h| h.1).sum::<u32>() >= 998,
                "the table was full"
            );
            while !held.is_empty() {
                let i = usize::try_from(next() % held.len() as u64).unwrap();
                let (base, len) = held.swap_remove(i);
                slots.free(base, len);
                if next() % 7 == 0 {
                    slots.next_generation();
                }
            }
            slots.next_generation();
        }
        assert_eq!(slots.allocate(1000), Some(0), "{slots:?}");
    }
}
