//! Where the programs keep what they count per queue: chunks of slots, each a per-CPU array
//! of [`PerCpuCounters`] and an array of [`QueueShared`], put into the two arrays of maps
//! by the loader as devices appear (so the kernel memory the probe holds follows the queues
//! present); and the breakdown of other drops by reason.
//!
//! A slot's per-CPU counters are incremented in place: only the running CPU writes its
//! copy. Its shared counters are added to atomically, since any CPU may handle the queue;
//! they are the ones counted at most once per stop or on uncommon events, so the cost of
//! an atomic add stays off the common path. The adds carry no result back, the one form
//! of atomic every kernel the probe runs on accepts (`BPF_XADD`; fetching forms came in
//! 5.12).

use aya_ebpf::{
    EbpfContext,
    bindings::BPF_NOEXIST,
    btf_maps::{Array as InnerArray, ArrayOfMaps, PerCpuArray as InnerPerCpuArray},
    macros::{btf_map, map},
    maps::HashMap,
};
use aya_log_ebpf::debug;
use tap_probe_common::{
    CHUNK_SLOTS, DropKey, MAX_CHUNKS, MAX_DROP_KEYS, PerCpuCounters, QueueShared,
    SHARED_CHUNK_FLAGS,
};

#[btf_map]
static PER_CPU_CHUNKS: ArrayOfMaps<
    InnerPerCpuArray<PerCpuCounters, { CHUNK_SLOTS as usize }>,
    { MAX_CHUNKS as usize },
> = ArrayOfMaps::new();

#[btf_map]
static SHARED_CHUNKS: ArrayOfMaps<
    InnerArray<QueueShared, { CHUNK_SLOTS as usize }, { SHARED_CHUNK_FLAGS as usize }>,
    { MAX_CHUNKS as usize },
> = ArrayOfMaps::new();

/// Drops by reason, per slot: rare, so one copy added to atomically.
#[map]
static DROP_REASONS: HashMap<DropKey, u64> = HashMap::with_max_entries(MAX_DROP_KEYS, 0);

/// This CPU's counters of queue slot `slot`; `None` when its chunk is not there (a slot no
/// queue holds).
#[inline(always)]
pub(crate) fn per_cpu(slot: u32) -> Option<&'static mut PerCpuCounters> {
    let p = PER_CPU_CHUNKS.get_value_ptr_mut(slot / CHUNK_SLOTS, &(slot % CHUNK_SLOTS))?;
    // SAFETY: this CPU's copy in a map value, alive for the program's run; the callers run
    // with bottom halves or preemption disabled, and no two of them that touch the same
    // field can interleave on one CPU.
    Some(unsafe { &mut *p })
}

/// The shared part of queue slot `slot`; every CPU writes it (see each field's rule).
#[inline(always)]
pub(crate) fn shared(slot: u32) -> Option<&'static mut QueueShared> {
    let p = SHARED_CHUNKS.get_value_ptr_mut(slot / CHUNK_SLOTS, &(slot % CHUNK_SLOTS))?;
    // SAFETY: a map value, alive for the program's run.
    Some(unsafe { &mut *p })
}

/// Adds `n` to a counter other CPUs add to as well. The BPF target has no compare-and-swap,
/// so `core` offers no atomic types there; the intrinsic is the add itself, and with its
/// result unused it compiles to `BPF_XADD`.
#[inline(always)]
pub(crate) fn add(counter: &mut u64, n: u64) {
    use core::intrinsics::{AtomicOrdering, atomic_xadd};
    // SAFETY: `counter` is an aligned u64 in a map value; every writer adds atomically.
    unsafe { atomic_xadd::<u64, u64, { AtomicOrdering::Relaxed }>(counter, n) };
}

/// Counts one drop of `reason` on `slot` in the breakdown of `dropped_other`.
#[inline(always)]
pub(crate) fn count_reason<C: EbpfContext>(ctx: &C, slot: u32, reason: u32) {
    let key = DropKey { slot, reason };
    if let Some(n) = DROP_REASONS.get_ptr_mut(key) {
        // SAFETY: a map value; see `add`.
        add(unsafe { &mut *n }, 1);
        return;
    }
    if DROP_REASONS.insert(key, 1, u64::from(BPF_NOEXIST)).is_ok() {
        return;
    }
    // Another CPU added the pair first, or the table is full.
    match DROP_REASONS.get_ptr_mut(key) {
        // SAFETY: as above.
        Some(n) => add(unsafe { &mut *n }, 1),
        // The table is full (MAX_DROP_KEYS pairs of slot and reason): the drop is still in
        // dropped_other, only its reason is not broken down.
        None => debug!(
            ctx,
            "drop-reason table full: reason {} of slot {} not broken down", reason, slot
        ),
    }
}
