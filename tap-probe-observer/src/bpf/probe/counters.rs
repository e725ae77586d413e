//! Reading a tracked device's counters: per queue, the per-CPU ones summed over CPUs with
//! the shared ones, its rings' occupancy samples and the drop reasons.

use std::collections::{BTreeMap, HashMap, HashSet};

use aya::maps::{HashMap as BpfHashMap, MapData, PerCpuArray};
use tap_probe_common::{
    CHUNK_SLOTS, DeviceKey, DropKey, MAP_DROP_REASONS, MAP_EVENTS_LOST, OCCUPANCY_BUCKETS,
    PerCpuCounters, QueueCounters, QueueShared, RingSamples,
};

use super::Probe;

/// A queue's ring occupancy samples since tracking began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct RingOccupancy {
    /// The latest sample; `None` before the first.
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
    /// The samples of one queue, as the programs keep them.
    #[must_use]
    pub(crate) fn of(s: &RingSamples) -> Self {
        Self {
            current: (s.count > 0).then_some(s.current),
            max: s.max,
            samples: s.count,
            sum: s.sum,
            histogram: s.buckets,
        }
    }

    /// The largest value bucket `k` holds, `None` for the last (unbounded) one.
    #[must_use]
    pub fn bucket_bound(k: usize) -> Option<u64> {
        (k + 1 < OCCUPANCY_BUCKETS).then(|| (1u64 << k) - 1)
    }
}

/// Counters of one device, per queue index from 0 to the highest counted (a queue between
/// that is not counted reads as zero).
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

/// The drop-reason breakdown by slot: `(reason, count)` pairs.
pub(crate) type Reasons = HashMap<u32, Vec<(u32, u64)>>;

impl Probe {
    /// The device's per-queue counters now (without the drop reasons), one entry per queue
    /// index as [`DeviceCounters::queues`] has them.
    ///
    /// # Errors
    /// When the device is not tracked or a map read fails.
    pub(crate) fn read_queues(&self, key: DeviceKey) -> anyhow::Result<Vec<QueueCounters>> {
        let held = self.held(key)?;
        let mut out = vec![QueueCounters::default(); queue_span(&held.queues)];
        for (queue, per_cpu, shared) in self.read_slots(&held.queues)? {
            out[queue as usize] = QueueCounters::of(&per_cpu, &shared.counters);
        }
        Ok(out)
    }

    /// Each queue of `queues` (queue to slot): its per-CPU counters summed and its shared
    /// part, read a run of consecutive slots at a time (a device's queues tracked together
    /// hold consecutive slots: two system calls for all of them).
    fn read_slots(
        &self,
        queues: &BTreeMap<u32, u32>,
    ) -> anyhow::Result<Vec<(u32, PerCpuCounters, QueueShared)>> {
        let mut by_slot: Vec<(u32, u32)> = queues.iter().map(|(&q, &s)| (s, q)).collect();
        by_slot.sort_unstable();
        let mut out = Vec::with_capacity(by_slot.len());
        let mut rest = &by_slot[..];
        while let Some(&(first, _)) = rest.first() {
            let run = rest
                .iter()
                .enumerate()
                .take_while(|&(i, &(slot, _))| {
                    u32::try_from(i).is_ok_and(|i| slot == first + i)
                        && slot / CHUNK_SLOTS == first / CHUNK_SLOTS
                })
                .count();
            let values = self.chunks.read_run(first, u32::try_from(run)?)?;
            for (&(_, queue), (per_cpu, shared)) in rest[..run].iter().zip(values) {
                out.push((queue, per_cpu, shared));
            }
            rest = &rest[run..];
        }
        Ok(out)
    }

    /// The device's counters now.
    ///
    /// # Errors
    /// When the device is not tracked or a map read fails.
    pub fn read(&self, key: DeviceKey) -> anyhow::Result<DeviceCounters> {
        let held = self.held(key)?;
        let n = queue_span(&held.queues);
        let mut out = DeviceCounters {
            queues: vec![QueueCounters::default(); n],
            occupancy: vec![RingOccupancy::default(); n],
            stopped_since: vec![None; n],
            drop_reasons: BTreeMap::new(),
        };
        for (queue, per_cpu, shared) in self.read_slots(&held.queues)? {
            let i = queue as usize;
            let QueueShared {
                state,
                counters,
                occupancy,
                ..
            } = shared;
            out.queues[i] = QueueCounters::of(&per_cpu, &counters);
            out.occupancy[i] = RingOccupancy::of(&occupancy);
            out.stopped_since[i] = (state & 1 != 0).then_some(state & !1);
        }
        // Read once per refresh, after the counters of the first device read in it.
        if self.reasons.borrow().is_none() {
            let reasons = self.read_reasons()?;
            self.reasons.replace(Some(reasons));
        }
        if let Some(reasons) = &*self.reasons.borrow() {
            for (&queue, slot) in &held.queues {
                for &(reason, n) in reasons.get(slot).into_iter().flatten() {
                    *out.drop_reasons.entry((queue, reason)).or_default() += n;
                }
            }
        }
        Ok(out)
    }

    /// Every slot's drop reasons, in one pass over the map.
    fn read_reasons(&self) -> anyhow::Result<Reasons> {
        let map: BpfHashMap<&MapData, DropKey, u64> =
            BpfHashMap::try_from(self.map(MAP_DROP_REASONS)?)?;
        let mut out = Reasons::new();
        for entry in &map {
            let (key, n) = entry?;
            out.entry(key.slot).or_default().push((key.reason, n));
        }
        Ok(out)
    }

    /// Removes the drop reasons of `slots`, in one pass over the map.
    ///
    /// # Errors
    /// When the map cannot be read or updated.
    pub(crate) fn remove_reasons(&mut self, slots: &[u32]) -> anyhow::Result<()> {
        if slots.is_empty() {
            return Ok(());
        }
        let slots: HashSet<u32> = slots.iter().copied().collect();
        let mut map: BpfHashMap<&mut MapData, DropKey, u64> =
            BpfHashMap::try_from(self.map_mut(MAP_DROP_REASONS)?)?;
        let leftover: Vec<DropKey> = map
            .keys()
            .filter_map(Result::ok)
            .filter(|k| slots.contains(&k.slot))
            .collect();
        for key in leftover {
            match map.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
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

/// Entries from queue 0 to the highest of `queues` (at least one).
fn queue_span(queues: &BTreeMap<u32, u32>) -> usize {
    queues.keys().next_back().map_or(1, |&q| q as usize + 1)
}
