//! The per-queue counters (`tap_probe_common::QueueCounters`, one table entry per field)
//! and the breakdown of other drops by reason.

use aya_ebpf::{
    EbpfContext,
    macros::map,
    maps::{PerCpuArray, PerCpuHashMap},
};
use aya_log_ebpf::debug;
use tap_probe_common::{DropKey, MAX_DROP_KEYS, MAX_QUEUE_SLOTS, QueueCounters};

#[map]
static COUNTERS: PerCpuArray<QueueCounters> = PerCpuArray::with_max_entries(MAX_QUEUE_SLOTS, 0);

#[map]
static DROP_REASONS: PerCpuHashMap<DropKey, u64> =
    PerCpuHashMap::with_max_entries(MAX_DROP_KEYS, 0);

/// This CPU's counters of queue slot `slot`.
#[inline(always)]
pub(crate) fn counters(slot: u32) -> Option<&'static mut QueueCounters> {
    // SAFETY: per-CPU memory; the callers run with bottom halves or preemption disabled, and
    // no two of them that touch the same field can interleave on one CPU.
    COUNTERS.get_ptr_mut(slot).map(|p| unsafe { &mut *p })
}

/// Counts one drop of `reason` on `slot` in the breakdown of `dropped_other`.
#[inline(always)]
pub(crate) fn count_reason<C: EbpfContext>(ctx: &C, slot: u32, reason: u32) {
    let key = DropKey { slot, reason };
    match DROP_REASONS.get_ptr_mut(key) {
        // SAFETY: per-CPU value.
        Some(n) => unsafe { *n += 1 },
        None => {
            if DROP_REASONS.insert(key, 1, 0).is_err() {
                // The table is full (MAX_DROP_KEYS pairs of slot and reason): the drop is
                // still in dropped_other, only its reason is not broken down.
                debug!(
                    ctx,
                    "drop-reason table full: reason {} of slot {} not broken down", reason, slot
                );
            }
        }
    }
}
