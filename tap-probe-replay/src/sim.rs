//! The discrete-event replay: one ring, one policy, a stream of producer arrivals and reader
//! reads in time order, and the metrics of what the modelled kernel did with them.
//!
//! What the model does at each operation:
//! - An arrival (a packet the stack hands the device): with `tail-drop`, straight into
//!   `ptr_ring_produce`; a full ring drops it. With a stopping policy the packet goes to
//!   the qdisc while the queue is stopped (or the qdisc holds packets), else to the driver:
//!   produce, stop the queue when the produce left the ring full, return busy (requeue) when
//!   the produce failed.
//! - A read of up to `n` entries (`n = 1`: `tun_do_read`; more: vhost-net's
//!   `ptr_ring_consume_batched`): each entry taken runs the series' wake logic. A read that
//!   finds the ring empty blocks, and takes the next entry the moment it is produced (one
//!   blocked read at most).
//! - After each operation the qdisc runs while the queue is awake (`net_tx_action` after a
//!   wake, or the sender's own `__qdisc_run`).
//!
//! The hot loop allocates nothing and hashes nothing: the ring keeps counters and one array
//! of arrival times, the qdisc a preallocated deque, delays go into a fixed histogram.

use super::Ops;
use super::policy::Policy;
use super::qdisc::Pfifo;
use super::ring::PtrRing;

/// Parameters of one replay besides the policy.
#[derive(Debug, Clone, Copy)]
pub struct SimConfig {
    pub ring_size: u32,
    /// The cache-line batch of the modelled machine ([`super::ring::X86_64_BATCH`]).
    pub cache_batch: u32,
    /// `pfifo` limit of the modelled qdisc (the kernel's default is `tx_queue_len`).
    pub qdisc_limit: u32,
    /// Points of the occupancy-over-time series kept for plots (0: none).
    pub plot_points: usize,
}

/// What one policy did with one stream.
#[derive(Debug, Clone, Default, PartialEq, serde::Serialize)]
pub struct Metrics {
    pub policy: String,
    pub ring_size: u32,
    pub arrivals: u64,
    pub delivered: u64,
    pub ring_full_drops: u64,
    pub qdisc_drops: u64,
    pub busy: u64,
    pub stops: u64,
    pub wakes: u64,
    pub stopped_ns: u64,
    /// Entries in the ring, averaged over time.
    pub mean_occupancy: f64,
    pub max_occupancy: u32,
    /// Arrival to read, for delivered packets (histogram buckets: within 1.6%).
    pub delay_p50_ns: u64,
    pub delay_p99_ns: u64,
    pub delay_mean_ns: f64,
    pub left_in_ring: u32,
    pub left_in_qdisc: u64,
    /// From the first operation to the last.
    pub span_ns: u64,
    /// Exact sums, for comparisons with the reference model.
    #[serde(skip)]
    pub delay_sum_ns: u128,
    #[serde(skip)]
    pub occupancy_area: u128,
    /// Maximum occupancy in each of `plot_points` equal slices of the span.
    #[serde(skip)]
    pub occupancy_series: Vec<u32>,
}

/// Replays `ops` under `policy`.
#[must_use]
pub fn simulate(ops: &Ops, cfg: &SimConfig, policy: Policy) -> Metrics {
    match (policy.stops(), cfg.plot_points > 0) {
        (false, false) => Sim::<false, false>::new(ops, cfg, policy).run(ops),
        (false, true) => Sim::<false, true>::new(ops, cfg, policy).run(ops),
        (true, false) => Sim::<true, false>::new(ops, cfg, policy).run(ops),
        (true, true) => Sim::<true, true>::new(ops, cfg, policy).run(ops),
    }
}

struct Sim<const STOPS: bool, const PLOT: bool> {
    policy: Policy,
    ring: PtrRing,
    qdisc: Pfifo,
    threshold: u32,
    stopped: bool,
    stop_t: u64,
    cons_cnt: u32,
    reader_waiting: bool,
    m: Metrics,
    hist: Histogram,
    last_t: u64,
    // Plot state.
    t0: u64,
    span: u64,
    bucket: usize,
    next_edge: u64,
}

impl<const STOPS: bool, const PLOT: bool> Sim<STOPS, PLOT> {
    fn new(ops: &Ops, cfg: &SimConfig, policy: Policy) -> Self {
        let t0 = ops.times.first().copied().unwrap_or(0);
        let span = ops.times.last().copied().unwrap_or(0) - t0;
        let points = cfg.plot_points.max(1);
        Self {
            policy,
            ring: PtrRing::new(cfg.ring_size, cfg.cache_batch),
            qdisc: Pfifo::new(if STOPS { cfg.qdisc_limit } else { 0 }),
            threshold: policy.wake_threshold(cfg.ring_size),
            stopped: false,
            stop_t: 0,
            cons_cnt: 0,
            reader_waiting: false,
            m: Metrics {
                occupancy_series: if PLOT { vec![0; points] } else { Vec::new() },
                ..Metrics::default()
            },
            hist: Histogram::new(),
            last_t: t0,
            t0,
            span,
            bucket: 0,
            next_edge: edge(t0, span, points, 0),
        }
    }

    fn run(mut self, ops: &Ops) -> Metrics {
        for (&t, &op) in ops.times.iter().zip(&ops.ops) {
            self.m.occupancy_area += u128::from(self.ring.len()) * u128::from(t - self.last_t);
            self.last_t = t;
            if PLOT {
                self.advance_plot(t);
            }
            if op == super::ARRIVAL {
                self.arrive(t);
            } else {
                self.read(t, op);
            }
            if STOPS && !self.stopped && !self.qdisc.is_empty() {
                self.drain(t);
            }
            if PLOT {
                let s = &mut self.m.occupancy_series[self.bucket];
                *s = (*s).max(self.ring.len());
            }
        }
        self.finish()
    }

    #[inline]
    fn arrive(&mut self, t: u64) {
        self.m.arrivals += 1;
        if !STOPS {
            if self.ring.produce(t) {
                self.produced(t);
            } else {
                self.m.ring_full_drops += 1;
            }
            return;
        }
        // The qdisc only holds packets while the queue is stopped: after a wake it runs
        // until it is empty or the queue stops again.
        if self.stopped {
            if !self.qdisc.enqueue(t) {
                self.m.qdisc_drops += 1;
            }
        } else {
            self.xmit(t, t);
        }
    }

    /// `tun_net_xmit` with the series applied (a qdisc is present).
    #[inline]
    fn xmit(&mut self, now: u64, arrival: u64) {
        let ok = self.ring.produce(arrival);
        if ok {
            self.produced(now);
        }
        if self.ring.is_full() && !self.stopped {
            self.stopped = true;
            self.stop_t = now;
            self.m.stops += 1;
            // The series re-checks after the barrier and wakes if room appeared; nothing
            // runs concurrently here, so the re-check always finds the ring still full.
        }
        if !ok {
            self.m.busy += 1;
            self.qdisc.requeue(arrival);
        }
    }

    fn drain(&mut self, t: u64) {
        while !self.stopped
            && let Some(arrival) = self.qdisc.dequeue()
        {
            self.xmit(t, arrival);
        }
    }

    #[inline]
    fn produced(&mut self, t: u64) {
        if self.reader_waiting {
            self.reader_waiting = false;
            self.take(t);
        }
        self.m.max_occupancy = self.m.max_occupancy.max(self.ring.len());
    }

    #[inline]
    fn read(&mut self, t: u64, n: u32) {
        for _ in 0..n {
            if !self.take(t) {
                self.reader_waiting = true;
                break;
            }
        }
    }

    /// One `tun_ring_consume`: the entry, then `__tun_wake_queue`. False when empty.
    #[inline]
    fn take(&mut self, t: u64) -> bool {
        let Some(arrival) = self.ring.consume() else {
            return false;
        };
        self.m.delivered += 1;
        let delay = t - arrival;
        self.m.delay_sum_ns += u128::from(delay);
        self.hist.record(delay);
        if STOPS {
            if self.ring.is_empty() {
                self.wake(t);
            } else if self.stopped {
                self.cons_cnt += 1;
                if self.cons_cnt >= self.threshold {
                    self.wake(t);
                }
            }
        }
        true
    }

    #[inline]
    fn wake(&mut self, t: u64) {
        if self.stopped {
            self.stopped = false;
            self.m.wakes += 1;
            self.m.stopped_ns += t - self.stop_t;
        }
        self.cons_cnt = 0;
    }

    fn advance_plot(&mut self, t: u64) {
        let points = self.m.occupancy_series.len();
        while t >= self.next_edge && self.bucket + 1 < points {
            self.bucket += 1;
            self.next_edge = edge(self.t0, self.span, points, self.bucket);
            // A slice with no operation still shows the ring as it was.
            self.m.occupancy_series[self.bucket] = self.ring.len();
        }
    }

    fn finish(mut self) -> Metrics {
        if self.stopped {
            self.m.stopped_ns += self.last_t - self.stop_t;
        }
        let m = &mut self.m;
        m.policy = self.policy.to_string();
        m.ring_size = self.ring.size();
        m.span_ns = self.last_t - self.t0;
        m.left_in_ring = self.ring.len();
        m.left_in_qdisc = self.qdisc.len() as u64;
        #[expect(
            clippy::cast_precision_loss,
            reason = "averages for display; the exact sums are kept beside them"
        )]
        {
            m.mean_occupancy = if m.span_ns == 0 {
                f64::from(self.ring.len())
            } else {
                m.occupancy_area as f64 / m.span_ns as f64
            };
            m.delay_mean_ns = if m.delivered == 0 {
                0.0
            } else {
                m.delay_sum_ns as f64 / m.delivered as f64
            };
        }
        m.delay_p50_ns = self.hist.quantile(0.50);
        m.delay_p99_ns = self.hist.quantile(0.99);
        self.m
    }
}

/// End of slice `i + 1` of `points` over `[t0, t0 + span]`.
fn edge(t0: u64, span: u64, points: usize, i: usize) -> u64 {
    let num = u128::from(span) * (i as u128 + 1);
    t0 + u64::try_from(num / points.max(1) as u128).unwrap_or(u64::MAX)
}

/// Sub-buckets per power of two: values are kept within 1/64 of their size.
const SUB_BITS: u32 = 5;
const SUB: usize = 1 << SUB_BITS;
const BUCKETS: usize = (64 - SUB_BITS as usize + 1) * SUB;

/// A log-linear histogram of u64 values (like HdrHistogram): exact below 64, then 32
/// buckets per power of two.
#[derive(Debug, Clone)]
pub struct Histogram {
    counts: Box<[u64; BUCKETS]>,
    total: u64,
}

impl Default for Histogram {
    fn default() -> Self {
        Self::new()
    }
}

impl Histogram {
    #[must_use]
    pub fn new() -> Self {
        Self {
            counts: Box::new([0; BUCKETS]),
            total: 0,
        }
    }

    /// Without a branch: below `2 * SUB` the shift is 0 and the index is `v`; above it,
    /// `v >> shift` is in `SUB..2 * SUB`, the sub-bucket plus `SUB`, which is the `+ 1` of
    /// the power's row. At most `58 * SUB + 63 < BUCKETS`.
    #[inline]
    fn index(v: u64) -> usize {
        let shift = (v | 1).ilog2().saturating_sub(SUB_BITS);
        #[expect(
            clippy::cast_possible_truncation,
            reason = "v >> shift < 2 * SUB: the shift leaves SUB_BITS + 1 bits"
        )]
        let sub = (v >> shift) as usize;
        ((shift as usize) << SUB_BITS) + sub
    }

    /// The middle of bucket `i`.
    fn value(i: usize) -> u64 {
        if i < 2 * SUB {
            return i as u64;
        }
        let shift = u32::try_from(i / SUB - 1).unwrap_or(0);
        let m = (i % SUB + SUB) as u64;
        (m << shift) + ((1u64 << shift) >> 1)
    }

    #[inline]
    pub fn record(&mut self, v: u64) {
        let i = Self::index(v);
        debug_assert!(i < BUCKETS);
        // SAFETY: `index` is below `BUCKETS` for every u64 (see there; a test checks the
        // extremes).
        unsafe { *self.counts.get_unchecked_mut(i) += 1 };
        self.total += 1;
    }

    /// The smallest recorded value (up to bucket precision) with at least `q` of all values
    /// at or below it; 0 when empty.
    #[must_use]
    pub(crate) fn quantile(&self, q: f64) -> u64 {
        if self.total == 0 {
            return 0;
        }
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            clippy::cast_precision_loss,
            reason = "a rank between 1 and total"
        )]
        let rank = ((q * self.total as f64).ceil() as u64).clamp(1, self.total);
        let mut seen = 0;
        for (i, &c) in self.counts.iter().enumerate() {
            seen += c;
            if seen >= rank {
                return Self::value(i);
            }
        }
        0
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::ring::X86_64_BATCH;

    fn cfg(ring: u32, limit: u32) -> SimConfig {
        SimConfig {
            ring_size: ring,
            cache_batch: X86_64_BATCH,
            qdisc_limit: limit,
            plot_points: 16,
        }
    }

    /// `n` arrivals at t = 0..n, then `reads` single reads.
    fn burst_then_reads(n: u64, reads: u64) -> Ops {
        let mut ops = Ops::default();
        for t in 0..n {
            ops.push(t, super::super::ARRIVAL);
        }
        for t in 0..reads {
            ops.push(n + t, 1);
        }
        ops
    }

    #[test]
    fn tail_drop_counts_full_ring_drops() {
        let m = simulate(
            &burst_then_reads(100, 100),
            &cfg(64, 1000),
            Policy::TailDrop,
        );
        assert_eq!(m.arrivals, 100);
        assert_eq!(m.ring_full_drops, 36);
        assert_eq!(m.delivered, 64);
        assert_eq!(m.stops, 0);
        assert_eq!(m.max_occupancy, 64);
    }

    #[test]
    fn stop_wake_holds_packets_in_the_qdisc() {
        let m = simulate(
            &burst_then_reads(100, 100),
            &cfg(64, 1000),
            Policy::StopWake(0.5),
        );
        // By hand: the 64th arrival fills the ring and stops the queue, the other 36 wait
        // in the qdisc. 32 reads (half the ring, two zeroed batches of 16) wake it; 32 of
        // the waiting ones fill the ring again and stop it; 32 more reads wake it for the
        // last 4. Two stops, two wakes, nothing lost.
        assert_eq!((m.stops, m.wakes), (2, 2), "{m:?}");
        assert_eq!((m.delivered, m.qdisc_drops, m.busy), (100, 0, 0), "{m:?}");
        assert_eq!(m.left_in_ring + u32::try_from(m.left_in_qdisc).unwrap(), 0);
        // And the transcription of the kernel's C agrees on everything, drops included.
        let r = crate::reference::simulate(
            &burst_then_reads(100, 100),
            64,
            X86_64_BATCH,
            1000,
            Policy::StopWake(0.5),
        );
        assert_eq!(
            (m.ring_full_drops, m.stops, m.wakes, m.busy),
            (r.ring_full_drops, r.stops, r.wakes, r.busy)
        );
    }

    #[test]
    fn qdisc_overflow_is_its_own_drop() {
        let m = simulate(
            &burst_then_reads(100, 100),
            &cfg(64, 10),
            Policy::StopWake(0.5),
        );
        assert_eq!(m.qdisc_drops, 26);
        assert_eq!(m.delivered, 74);
    }

    #[test]
    fn wake_every_returns_busy_until_a_batch_is_zeroed() {
        // Woken after one read, the producer still sees the ring full (15 consumed slots
        // not yet zeroed): the qdisc's packet comes back busy, and the queue stops again.
        let m = simulate(
            &burst_then_reads(100, 20),
            &cfg(64, 1000),
            Policy::WakeEvery,
        );
        assert!(m.busy > 0, "{m:?}");
        assert_eq!(m.wakes, 20);
        let r = crate::reference::simulate(
            &burst_then_reads(100, 20),
            64,
            X86_64_BATCH,
            1000,
            Policy::WakeEvery,
        );
        assert_eq!(
            (m.ring_full_drops, m.stops, m.wakes, m.busy, m.delivered),
            (r.ring_full_drops, r.stops, r.wakes, r.busy, r.delivered)
        );
    }

    #[test]
    fn branchless_index_matches_the_two_range_formula() {
        let old = |v: u64| -> usize {
            if v < 2 * SUB as u64 {
                return usize::try_from(v).unwrap();
            }
            let shift = v.ilog2() - SUB_BITS;
            (shift as usize + 1) * SUB + usize::try_from((v >> shift) & (SUB as u64 - 1)).unwrap()
        };
        let edges = (0..64).flat_map(|b| {
            let p = 1u64 << b;
            [p - 1, p, p + 1, p | (p >> 1)]
        });
        for v in (0..10_000).chain(edges).chain([u64::MAX]) {
            assert_eq!(Histogram::index(v), old(v), "{v}");
        }
    }

    #[test]
    fn histogram_quantiles() {
        let mut h = Histogram::new();
        for v in 1..=1000u64 {
            h.record(v * 1000);
        }
        let p50 = h.quantile(0.5);
        assert!(p50.abs_diff(500_000) < 500_000 / 32, "{p50}");
        let p99 = h.quantile(0.99);
        assert!(p99.abs_diff(990_000) < 990_000 / 32, "{p99}");
        for v in [0, 1, 63, 64, 65, 1 << 40, u64::MAX] {
            let i = Histogram::index(v);
            assert!(i < BUCKETS);
            let back = Histogram::value(i);
            assert!(back.abs_diff(v) <= v / 32, "{v} -> {back}");
        }
    }
}
