//! The counter map's slots: each tracked device owns one consecutive range, a slot per
//! transmit queue. A range freed by an untracked device waits one generation before reuse,
//! so a program that looked the device up just before it went cannot count into the
//! range's next owner.

/// Free and cooling ranges of slots, as `(base, len)`.
#[derive(Debug)]
pub(crate) struct Slots {
    /// Usable now.
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
            self.free.swap_remove(i);
        } else {
            self.free[i] = (base + len, n - len);
        }
        Some(base)
    }

    /// Gives `len` slots from `base` back, usable after the next generation.
    pub(crate) fn free(&mut self, base: u32, len: u32) {
        self.cooling.push((base, len));
    }

    /// Makes the ranges freed before this call usable. Call once per refresh interval: by
    /// then no program still runs with a lookup made before the device was removed.
    pub(crate) fn next_generation(&mut self) {
        self.free.append(&mut self.cooling);
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
}
