//! The plain model the optimised replay is checked against: `ptr_ring.h` transcribed line
//! by line onto an array of `Option`s (NULL = `None`), a `VecDeque` qdisc, every delay kept
//! and sorted. Slow and obviously faithful; used by the property tests only.

use std::collections::VecDeque;

use super::Ops;
use super::policy::Policy;

/// `struct ptr_ring`, literally.
#[derive(Debug, Clone)]
pub(crate) struct RefRing {
    producer: usize,
    consumer_head: usize,
    consumer_tail: usize,
    size: usize,
    batch: usize,
    queue: Vec<Option<u64>>,
}

impl RefRing {
    /// `ptr_ring_init` + `__ptr_ring_set_size`.
    #[must_use]
    pub(crate) fn new(size: u32, cache_batch: u32) -> Self {
        let size = size as usize;
        let mut batch = cache_batch as usize;
        if batch > size / 2 || batch == 0 {
            batch = 1;
        }
        Self {
            producer: 0,
            consumer_head: 0,
            consumer_tail: 0,
            size,
            batch,
            queue: vec![None; size],
        }
    }

    /// `__ptr_ring_full`.
    #[must_use]
    pub(crate) fn full(&self) -> bool {
        self.size == 0 || self.queue[self.producer].is_some()
    }

    /// `__ptr_ring_empty`.
    #[must_use]
    pub(crate) fn empty(&self) -> bool {
        self.size == 0 || self.queue[self.consumer_head].is_none()
    }

    /// `__ptr_ring_produce`: 0 (true) or -ENOSPC (false).
    pub(crate) fn produce(&mut self, ptr: u64) -> bool {
        if self.size == 0 || self.queue[self.producer].is_some() {
            return false;
        }
        self.queue[self.producer] = Some(ptr);
        self.producer += 1;
        if self.producer >= self.size {
            self.producer = 0;
        }
        true
    }

    /// `__ptr_ring_consume` = `__ptr_ring_peek` + `__ptr_ring_discard_one`.
    pub(crate) fn consume(&mut self) -> Option<u64> {
        if self.size == 0 {
            return None;
        }
        let ptr = self.queue[self.consumer_head]?;
        let mut consumer_head = self.consumer_head;
        let head = consumer_head;
        consumer_head += 1;
        if consumer_head - self.consumer_tail >= self.batch || consumer_head >= self.size {
            // while (likely(head >= r->consumer_tail)) r->queue[head--] = NULL;
            let mut h = Some(head);
            while let Some(i) = h.filter(|&i| i >= self.consumer_tail) {
                self.queue[i] = None;
                h = i.checked_sub(1);
            }
            self.consumer_tail = consumer_head;
        }
        if consumer_head >= self.size {
            consumer_head = 0;
            self.consumer_tail = 0;
        }
        self.consumer_head = consumer_head;
        Some(ptr)
    }
}

/// What the reference model reports (the exact values the optimised model must match).
#[derive(Debug, Clone, Default, PartialEq, Eq)]
pub(crate) struct RefMetrics {
    pub(crate) arrivals: u64,
    pub(crate) delivered: u64,
    pub(crate) ring_full_drops: u64,
    pub(crate) qdisc_drops: u64,
    pub(crate) busy: u64,
    pub(crate) stops: u64,
    pub(crate) wakes: u64,
    pub(crate) stopped_ns: u64,
    pub(crate) max_occupancy: u32,
    pub(crate) occupancy_area: u128,
    pub(crate) delays: Vec<u64>,
    pub(crate) left_in_ring: u32,
    pub(crate) left_in_qdisc: u64,
}

/// The same replay as [`super::sim::simulate`], written as plainly as possible.
#[must_use]
#[expect(
    clippy::too_many_lines,
    reason = "one straight-line transcription is the point"
)]
pub(crate) fn simulate(
    ops: &Ops,
    ring_size: u32,
    cache_batch: u32,
    qdisc_limit: u32,
    policy: Policy,
) -> RefMetrics {
    let mut ring = RefRing::new(ring_size, cache_batch);
    let mut qdisc: VecDeque<u64> = VecDeque::new();
    let mut m = RefMetrics::default();
    let qdisc_present = policy.stops();
    let threshold = policy.wake_threshold(ring_size);
    let mut stopped = false;
    let mut stop_t = 0;
    let mut cons_cnt: u32 = 0;
    let mut reader_waiting = false;
    let mut occupancy: u32 = 0;
    let mut last_t = ops.times.first().copied().unwrap_or(0);

    // One reader step: take an entry and run __tun_wake_queue. Returns false when empty.
    let take = |t: u64,
                ring: &mut RefRing,
                m: &mut RefMetrics,
                occupancy: &mut u32,
                stopped: &mut bool,
                stop_t: u64,
                cons_cnt: &mut u32|
     -> bool {
        let Some(arrival) = ring.consume() else {
            return false;
        };
        *occupancy -= 1;
        m.delivered += 1;
        m.delays.push(t - arrival);
        if qdisc_present {
            let mut wake = false;
            if ring.empty() {
                wake = true;
            } else if *stopped {
                *cons_cnt += 1;
                if *cons_cnt >= threshold {
                    wake = true;
                }
            }
            if wake {
                if *stopped {
                    *stopped = false;
                    m.wakes += 1;
                    m.stopped_ns += t - stop_t;
                }
                *cons_cnt = 0;
            }
        }
        true
    };

    for (&t, &op) in ops.times.iter().zip(&ops.ops) {
        m.occupancy_area += u128::from(occupancy) * u128::from(t - last_t);
        last_t = t;
        // Packets to hand the driver now: the arrival, or nothing.
        let mut to_send: Option<u64> = None;
        if op == super::ARRIVAL {
            m.arrivals += 1;
            if !qdisc_present || !stopped {
                to_send = Some(t);
            } else if qdisc.len() < qdisc_limit as usize {
                qdisc.push_back(t);
            } else {
                m.qdisc_drops += 1;
            }
        } else {
            for _ in 0..op {
                let took = take(
                    t,
                    &mut ring,
                    &mut m,
                    &mut occupancy,
                    &mut stopped,
                    stop_t,
                    &mut cons_cnt,
                );
                if !took {
                    reader_waiting = true;
                    break;
                }
            }
        }
        // The driver: the arrival first (the qdisc is empty whenever the queue is awake),
        // then whatever the qdisc holds while the queue stays awake.
        loop {
            let pkt = match to_send.take() {
                Some(p) => p,
                None if qdisc_present && !stopped => match qdisc.pop_front() {
                    Some(p) => p,
                    None => break,
                },
                None => break,
            };
            let ok = ring.produce(pkt);
            if ok {
                occupancy += 1;
                if reader_waiting {
                    reader_waiting = false;
                    take(
                        t,
                        &mut ring,
                        &mut m,
                        &mut occupancy,
                        &mut stopped,
                        stop_t,
                        &mut cons_cnt,
                    );
                }
                m.max_occupancy = m.max_occupancy.max(occupancy);
            }
            if qdisc_present && ring.full() && !stopped {
                stopped = true;
                stop_t = t;
                m.stops += 1;
            }
            if !ok {
                if qdisc_present {
                    m.busy += 1;
                    qdisc.push_front(pkt);
                } else {
                    m.ring_full_drops += 1;
                }
            }
            if !qdisc_present {
                break;
            }
        }
    }
    if stopped {
        m.stopped_ns += last_t - stop_t;
    }
    m.left_in_ring = occupancy;
    m.left_in_qdisc = qdisc.len() as u64;
    m
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::{PtrRing, X86_64_BATCH};
    use crate::sim::{Histogram, SimConfig, simulate as fast};
    use proptest::prelude::*;

    /// A random operation: an arrival, or a read of 1..=3 or 64 entries, at a time step.
    fn op() -> impl Strategy<Value = (u64, u32)> {
        (
            0u64..50,
            prop_oneof![
                6 => Just(super::super::ARRIVAL),
                3 => Just(1u32),
                1 => 2u32..=3,
                1 => Just(64u32),
            ],
        )
    }

    fn workload() -> impl Strategy<Value = Ops> {
        prop::collection::vec(op(), 0..3000).prop_map(|steps| {
            let mut ops = Ops::default();
            let mut t = 0;
            for (dt, op) in steps {
                t += dt;
                ops.push(t, op);
            }
            ops
        })
    }

    fn policy() -> impl Strategy<Value = Policy> {
        prop_oneof![
            Just(Policy::TailDrop),
            Just(Policy::StopWake(0.5)),
            (1u32..=8).prop_map(|k| Policy::StopWake(f64::from(k) / 8.0)),
            Just(Policy::WakeEvery),
            Just(Policy::WakeEmpty),
        ]
    }

    proptest! {
        #![proptest_config(ProptestConfig::with_cases(400))]

        /// The O(1) ring and the literal transcription agree on every operation.
        #[test]
        fn ring_matches_reference(
            size in 0u32..80,
            batch in prop_oneof![Just(0u32), Just(1), Just(16), 2u32..40],
            script in prop::collection::vec(any::<bool>(), 0..2000),
        ) {
            let mut a = PtrRing::new(size, batch);
            let mut b = RefRing::new(size, batch);
            let mut fifo = VecDeque::new();
            for (i, produce) in (0u64..).zip(script) {
                if produce {
                    let ok = b.produce(i);
                    prop_assert_eq!(a.produce(i), ok);
                    if ok {
                        fifo.push_back(i);
                    }
                } else {
                    let got = b.consume();
                    prop_assert_eq!(got, fifo.pop_front());
                    prop_assert_eq!(a.consume(), got);
                }
                prop_assert_eq!(a.is_full(), b.full());
                prop_assert_eq!(a.is_empty(), b.empty());
                prop_assert_eq!(a.len() as usize, fifo.len());
            }
        }

        /// The replay and the reference model agree on every metric.
        #[test]
        fn replay_matches_reference(
            ops in workload(),
            size in prop_oneof![1u32..8, 8u32..40, Just(64u32), Just(256u32)],
            limit in prop_oneof![Just(0u32), 1u32..20, Just(1000u32)],
            policy in policy(),
        ) {
            let cfg = SimConfig {
                ring_size: size,
                cache_batch: X86_64_BATCH,
                qdisc_limit: limit,
                plot_points: 7,
            };
            let f = fast(&ops, &cfg, policy);
            let r = simulate(&ops, size, X86_64_BATCH, limit, policy);
            prop_assert_eq!(f.arrivals, r.arrivals);
            prop_assert_eq!(f.delivered, r.delivered);
            prop_assert_eq!(f.ring_full_drops, r.ring_full_drops);
            prop_assert_eq!(f.qdisc_drops, r.qdisc_drops);
            prop_assert_eq!(f.busy, r.busy);
            prop_assert_eq!(f.stops, r.stops);
            prop_assert_eq!(f.wakes, r.wakes);
            prop_assert_eq!(f.stopped_ns, r.stopped_ns);
            prop_assert_eq!(f.max_occupancy, r.max_occupancy);
            prop_assert_eq!(f.occupancy_area, r.occupancy_area);
            prop_assert_eq!(f.left_in_ring, r.left_in_ring);
            prop_assert_eq!(f.left_in_qdisc, r.left_in_qdisc);
            prop_assert_eq!(f.delay_sum_ns, r.delays.iter().map(|&d| u128::from(d)).sum::<u128>());
            // Conservation: every arrival is delivered, dropped, or still held.
            prop_assert_eq!(
                f.arrivals,
                f.delivered + f.ring_full_drops + f.qdisc_drops
                    + u64::from(f.left_in_ring) + f.left_in_qdisc
            );
            // Percentiles: within the histogram's bucket precision of the exact ones.
            let mut d = r.delays.clone();
            d.sort_unstable();
            for (q, got) in [(0.5, f.delay_p50_ns), (0.99, f.delay_p99_ns)] {
                if let Some(exact) = exact_quantile(&d, q) {
                    prop_assert!(got.abs_diff(exact) <= exact / 32 + 1, "q{} {} vs {}", q, got, exact);
                }
            }
            prop_assert!(f.occupancy_series.iter().all(|&o| o <= f.max_occupancy));
        }
    }

    fn exact_quantile(sorted: &[u64], q: f64) -> Option<u64> {
        if sorted.is_empty() {
            return None;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank between 1 and len"
        )]
        let rank = ((q * sorted.len() as f64).ceil() as usize).clamp(1, sorted.len());
        Some(sorted[rank - 1])
    }

    #[test]
    fn histogram_matches_exact_quantiles_on_a_spread() {
        let mut h = Histogram::new();
        let values: Vec<u64> = (0..10_000u64).map(|i| i * i % 7919 * 131).collect();
        for &v in &values {
            h.record(v);
        }
        let mut s = values.clone();
        s.sort_unstable();
        for q in [0.01, 0.5, 0.9, 0.99, 1.0] {
            let exact = exact_quantile(&s, q).unwrap();
            assert!(h.quantile(q).abs_diff(exact) <= exact / 32 + 1);
        }
    }
}
