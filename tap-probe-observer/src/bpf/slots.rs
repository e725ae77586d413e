//! The probe's queue slots by number: which are free, which were freed too recently to reuse,
//! and how many chunks of [`CHUNK_SLOTS`] back them. A queue takes one slot; a slot freed
//! by a queue that went waits one generation before reuse, so a program that looked the
//! queue up just before it went cannot count into the slot's next owner. The lowest free
//! slot goes first, so the queues present pack into the lowest chunks and the top chunk
//! empties as they go, to be given back.

use std::collections::BTreeSet;

use tap_probe_common::CHUNK_SLOTS;

/// Free and cooling slots, within the chunks there are.
#[derive(Debug)]
pub(crate) struct Slots {
    /// Usable now.
    free: BTreeSet<u32>,
    /// Freed since the last [`Slots::next_generation`].
    cooling: Vec<u32>,
    /// Chunks backing slots `0 .. chunks * CHUNK_SLOTS`.
    chunks: u32,
    /// The most chunks there may be.
    max_chunks: u32,
}

impl Slots {
    /// No chunk yet; at most `max_chunks`.
    pub(crate) fn new(max_chunks: u32) -> Self {
        Self {
            free: BTreeSet::new(),
            cooling: Vec::new(),
            chunks: 0,
            max_chunks,
        }
    }

    /// The lowest free slot, now taken; `None` when every chunk there is is taken.
    pub(crate) fn allocate(&mut self) -> Option<u32> {
        self.free.pop_first()
    }

    /// The number of the chunk to add for more slots, if one may be added: call
    /// [`Slots::grown`] once it exists.
    pub(crate) fn next_chunk(&self) -> Option<u32> {
        (self.chunks < self.max_chunks).then_some(self.chunks)
    }

    /// The chunk [`Slots::next_chunk`] named exists: its slots are free.
    pub(crate) fn grown(&mut self) {
        let base = self.chunks * CHUNK_SLOTS;
        self.free.extend(base..base + CHUNK_SLOTS);
        self.chunks += 1;
    }

    /// Chunks there are.
    #[cfg(test)]
    pub(crate) fn chunks(&self) -> u32 {
        self.chunks
    }

    /// Gives `slot` back, usable after the next generation.
    pub(crate) fn free(&mut self, slot: u32) {
        self.cooling.push(slot);
    }

    /// Gives back a slot no program ever saw (its queue never made it into the map):
    /// usable at once.
    pub(crate) fn free_unused(&mut self, slot: u32) {
        self.free.insert(slot);
    }

    /// Makes the slots freed before this call usable, and names them. Call once per refresh
    /// interval: by then no program still runs with a lookup made before the queue was
    /// removed.
    pub(crate) fn next_generation(&mut self) -> Vec<u32> {
        let released = std::mem::take(&mut self.cooling);
        self.free.extend(&released);
        released
    }

    /// The top chunk, if every slot of it is free (none taken, none cooling), now no longer
    /// counted: the caller removes it. The lowest chunk stays, for the next queue.
    pub(crate) fn shrink(&mut self) -> Option<u32> {
        if self.chunks <= 1 {
            return None;
        }
        let top = self.chunks - 1;
        let base = top * CHUNK_SLOTS;
        if self.free.range(base..).count() < CHUNK_SLOTS as usize {
            return None;
        }
        self.free.retain(|&slot| slot < base);
        self.chunks = top;
        Some(top)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    fn with_chunks(n: u32) -> Slots {
        let mut slots = Slots::new(4);
        for _ in 0..n {
            assert!(slots.next_chunk().is_some());
            slots.grown();
        }
        slots
    }

    #[test]
    fn slots_are_reused_only_after_a_generation() {
        let mut slots = with_chunks(1);
        let taken: Vec<u32> = (0..CHUNK_SLOTS)
            .map(|_| slots.allocate().unwrap())
            .collect();
        assert_eq!(taken, (0..CHUNK_SLOTS).collect::<Vec<_>>(), "lowest first");
        assert_eq!(slots.allocate(), None, "the chunk is full");
        slots.free(5);
        assert_eq!(slots.allocate(), None, "still cooling");
        slots.next_generation();
        assert_eq!(slots.allocate(), Some(5));
        slots.free_unused(7);
        assert_eq!(
            slots.allocate(),
            Some(7),
            "never seen by a program: free at once"
        );
    }

    #[test]
    fn chunks_grow_to_their_limit_and_the_top_one_goes_once_empty() {
        let mut slots = with_chunks(4);
        assert_eq!(slots.next_chunk(), None, "at the limit");
        let held: Vec<u32> = (0..=CHUNK_SLOTS)
            .map(|_| slots.allocate().unwrap())
            .collect();
        assert_eq!(slots.shrink(), Some(3), "chunks 2 and 3 are empty");
        assert_eq!(slots.shrink(), Some(2));
        assert_eq!(slots.shrink(), None, "chunk 1 holds a slot");
        slots.free(held[CHUNK_SLOTS as usize]);
        assert_eq!(slots.shrink(), None, "its slot is cooling");
        slots.next_generation();
        assert_eq!(slots.shrink(), Some(1));
        for &slot in &held[..CHUNK_SLOTS as usize] {
            slots.free(slot);
        }
        slots.next_generation();
        assert_eq!(slots.shrink(), None, "the lowest chunk stays");
        assert_eq!(slots.chunks(), 1);
        assert_eq!(slots.next_chunk(), Some(1));
        assert_eq!(slots.allocate(), Some(0));
    }
}
