//! Reading a tracked device's counters: per queue, summed over CPUs, with its rings'
//! occupancy samples and the drop reasons.

use std::collections::BTreeMap;

use aya::maps::{Array, MapData, PerCpuArray, PerCpuHashMap};
use tap_probe_common::{
    DeviceKey, DropKey, MAP_COUNTERS, MAP_DROP_REASONS, MAP_EVENTS_LOST, MAP_OCCUPANCY,
    MAP_QUEUE_STATE, OCCUPANCY_BUCKETS, QueueCounters, RingSamples,
};

use super::Probe;

/// A queue's ring occupancy samples since tracking began, over every CPU.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingOccupancy {
    /// The latest sample (of whichever CPU sampled last); `None` before the first.
    pub current: Option<u64>,
    /// The highest sample, or the ring's size once it tail-dropped.
    pub max: u64,
    pub samples: u64,
    /// The sum of the samples (for a mean, and Prometheus' `_sum`).
    pub sum: u64,
    /// Samples per bucket: bucket 0 holds 0, bucket `k` holds `2^(k-1) ..= 2^k - 1`, the
    /// last one everything above.
    pub histogram: [u64; OCCUPANCY_BUCKETS],
}

impl RingOccupancy {
    /// The samples of every CPU of one queue.
    #[must_use]
    pub(crate) fn over_cpus<'a>(cpus: impl IntoIterator<Item = &'a RingSamples>) -> Self {
        let mut out = Self::default();
        let mut latest = 0;
        for s in cpus {
            if s.count > 0 && s.ts_ns >= latest {
                latest = s.ts_ns;
                out.current = Some(s.current);
            }
            out.max = out.max.max(s.max);
            out.samples += s.count;
            out.sum += s.sum;
            for (total, n) in out.histogram.iter_mut().zip(&s.buckets) {
                *total += n;
            }
        }
        out
    }

    /// The largest value bucket `k` holds, `None` for the last (unbounded) one.
    #[must_use]
    pub fn bucket_bound(k: usize) -> Option<u64> {
        (k + 1 < OCCUPANCY_BUCKETS).then(|| (1u64 << k) - 1)
    }
}

/// Counters of one device, summed over CPUs.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct DeviceCounters {
    /// One entry per transmit queue.
    pub(crate) queues: Vec<QueueCounters>,
    /// Per queue: its ring's occupancy samples.
    pub(crate) occupancy: Vec<RingOccupancy>,
    /// Per queue: when the queue was last seen stopped and is not yet seen woken
    /// (`CLOCK_MONOTONIC` ns), so a live display can add the running interval.
    pub(crate) stopped_since: Vec<Option<u64>>,
    /// `(queue, enum skb_drop_reason value) -> count` for `dropped_other`.
    pub(crate) drop_reasons: BTreeMap<(u32, u32), u64>,
}

impl Probe {
    /// The device's per-queue counters now, summed over CPUs (without the drop reasons).
    ///
    /// # Errors
    /// When the device is not tracked or a map read fails.
    pub(crate) fn read_queues(&self, key: DeviceKey) -> anyhow::Result<Vec<QueueCounters>> {
        let slot = self.slot_of(key)?;
        let counters: PerCpuArray<&MapData, QueueCounters> =
            PerCpuArray::try_from(self.map(MAP_COUNTERS)?)?;
        (slot.base..slot.base + slot.queues)
            .map(|index| {
                let mut total = QueueCounters::default();
                for cpu in counters.get(&index, 0)?.iter() {
                    total += *cpu;
                }
                Ok(total)
            })
            .collect()
    }

    /// The device's counters now, summed over CPUs.
    ///
    /// # Errors
    /// When the device is not tracked or a map read fails.
    pub fn read(&self, key: DeviceKey) -> anyhow::Result<DeviceCounters> {
        let slot = self.slot_of(key)?;
        let counters: PerCpuArray<&MapData, QueueCounters> =
            PerCpuArray::try_from(self.map(MAP_COUNTERS)?)?;
        let state: Array<&MapData, u64> = Array::try_from(self.map(MAP_QUEUE_STATE)?)?;
        let occupancy: PerCpuArray<&MapData, RingSamples> =
            PerCpuArray::try_from(self.map(MAP_OCCUPANCY)?)?;
        let mut out = DeviceCounters::default();
        for index in slot.base..slot.base + slot.queues {
            let per_cpu = counters.get(&index, 0)?;
            let mut total = QueueCounters::default();
            for cpu in per_cpu.iter() {
                total += *cpu;
            }
            out.queues.push(total);
            let samples = occupancy.get(&index, 0)?;
            out.occupancy.push(RingOccupancy::over_cpus(samples.iter()));
            let since = state.get(&index, 0)?;
            out.stopped_since
                .push((since & 1 != 0).then_some(since & !1));
        }
        let reasons: PerCpuHashMap<&MapData, DropKey, u64> =
            PerCpuHashMap::try_from(self.map(MAP_DROP_REASONS)?)?;
        for entry in &reasons {
            let (k, values) = entry?;
            if (slot.base..slot.base + slot.queues).contains(&k.slot) {
                let n: u64 = values.iter().sum();
                *out.drop_reasons
                    .entry((k.slot - slot.base, k.reason))
                    .or_default() += n;
            }
        }
        Ok(out)
    }

    /// Events the programs could not write because their CPU's ring buffer was full.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn events_lost(&self) -> anyhow::Result<u64> {
        let lost: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_EVENTS_LOST)?)?;
        Ok(lost.get(&0, 0)?.iter().sum())
    }
}
