//! A `pfifo` qdisc: a FIFO of at most `limit` packets (each stored as its arrival time);
//! an enqueue beyond the limit is a qdisc drop. A packet the driver refused with
//! `NETDEV_TX_BUSY` goes back to the head: `dev_requeue_skb` parks it in `q->gso_skb` and
//! counts it in `q->q.qlen` ("it's still part of the queue"), so it counts against the
//! limit `pfifo_enqueue` checks.

use std::collections::VecDeque;

#[derive(Debug, Clone)]
pub struct Pfifo {
    limit: u32,
    queue: VecDeque<u64>,
    requeued: Option<u64>,
}

impl Pfifo {
    #[must_use]
    pub fn new(limit: u32) -> Self {
        Self {
            limit,
            // Room for everything up front: no allocation while replaying.
            queue: VecDeque::with_capacity(limit as usize),
            requeued: None,
        }
    }

    /// `pfifo_enqueue`: false (a drop) when `limit` packets are queued.
    #[inline]
    pub(crate) fn enqueue(&mut self, arrival: u64) -> bool {
        if self.len() >= self.limit as usize {
            return false;
        }
        self.queue.push_back(arrival);
        true
    }

    #[inline]
    pub fn dequeue(&mut self) -> Option<u64> {
        self.requeued.take().or_else(|| self.queue.pop_front())
    }

    /// Puts back a packet the driver returned busy; it goes out first next time.
    pub fn requeue(&mut self, arrival: u64) {
        debug_assert!(self.requeued.is_none());
        self.requeued = Some(arrival);
    }

    #[must_use]
    #[inline]
    pub fn is_empty(&self) -> bool {
        self.requeued.is_none() && self.queue.is_empty()
    }

    #[must_use]
    pub fn len(&self) -> usize {
        self.queue.len() + usize::from(self.requeued.is_some())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn limit_and_requeue() {
        let mut q = Pfifo::new(2);
        assert!(q.enqueue(1));
        assert!(q.enqueue(2));
        assert!(!q.enqueue(3));
        assert_eq!(q.dequeue(), Some(1));
        q.requeue(1);
        assert_eq!(q.len(), 2);
        assert!(
            !q.enqueue(4),
            "the requeued packet counts against the limit"
        );
        assert_eq!(q.dequeue(), Some(1));
        assert_eq!(q.dequeue(), Some(2));
        assert!(q.is_empty());
    }
}
