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

use core::{ffi::c_void, mem::size_of, ptr};

use aya_ebpf::{
    EbpfContext,
    bindings::{
        BPF_NOEXIST,
        bpf_map_type::{BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_ARRAY_OF_MAPS, BPF_MAP_TYPE_PERCPU_ARRAY},
    },
    helpers::generated::bpf_map_lookup_elem,
    macros::{btf_map, map},
    maps::HashMap,
};
use aya_log_ebpf::debug;
use tap_probe_common::{
    CHUNK_SLOTS, DropKey, MAX_CHUNKS, MAX_DROP_KEYS, PerCpuCounters, QueueShared,
    SHARED_CHUNK_FLAGS,
};

/// A chunk's definition in BTF, as libbpf reads one: by its key's and value's sizes, not
/// their types. The loader creates the chunks without BTF, and Linux 5.15 to 6.1 take a map
/// into an array of maps only if it is like the template in where BTF found a timer in its
/// value (none, where there is no BTF; not found, where there is); declared by sizes, the
/// template has no BTF either. The fields are never read: their types carry the values.
#[repr(C)]
pub(crate) struct Chunk<const TYPE: usize, const VALUE_SIZE: usize, const FLAGS: usize> {
    r#type: *const [i32; TYPE],
    key_size: *const [i32; size_of::<u32>()],
    value_size: *const [i32; VALUE_SIZE],
    max_entries: *const [i32; CHUNK_SLOTS as usize],
    map_flags: *const [i32; FLAGS],
}

/// An array of `MAX_CHUNKS` chunks of type `C`, in BTF as libbpf reads one (`values`, a
/// zero-length array of pointers to the inner map's definition).
#[repr(C)]
pub(crate) struct Chunks<C> {
    r#type: *const [i32; BPF_MAP_TYPE_ARRAY_OF_MAPS as usize],
    key: *const u32,
    value: *const u32,
    max_entries: *const [i32; MAX_CHUNKS as usize],
    values: [*const C; 0],
}

// SAFETY: never read or written by the programs but through the kernel's helpers, which
// take its address only.
unsafe impl<C> Sync for Chunks<C> {}

impl<C> Chunks<C> {
    const fn new() -> Self {
        Self {
            r#type: ptr::null(),
            key: ptr::null(),
            value: ptr::null(),
            max_entries: ptr::null(),
            values: [],
        }
    }

    /// The value at `slot`: in chunk `slot / CHUNK_SLOTS`, at `slot % CHUNK_SLOTS`; `None`
    /// when the chunk is not there. The two lookups go one after the other, as few
    /// instructions between them as the verifier has to follow.
    #[inline(always)]
    fn value<V>(&self, slot: u32) -> Option<*mut V> {
        let (chunk, index) = (slot / CHUNK_SLOTS, slot % CHUNK_SLOTS);
        // SAFETY: the helper reads the key; the map's address is all it takes of `self`.
        let inner = unsafe {
            bpf_map_lookup_elem(
                ptr::from_ref(self).cast_mut().cast::<c_void>(),
                ptr::from_ref(&chunk).cast(),
            )
        };
        if inner.is_null() {
            return None;
        }
        // SAFETY: `inner` is the chunk the kernel returned; the helper reads the key.
        let value = unsafe { bpf_map_lookup_elem(inner, ptr::from_ref(&index).cast()) };
        (!value.is_null()).then_some(value.cast())
    }
}

#[btf_map]
static PER_CPU_CHUNKS: Chunks<
    Chunk<{ BPF_MAP_TYPE_PERCPU_ARRAY as usize }, { size_of::<PerCpuCounters>() }, 0>,
> = Chunks::new();

#[btf_map]
static SHARED_CHUNKS: Chunks<
    Chunk<
        { BPF_MAP_TYPE_ARRAY as usize },
        { size_of::<QueueShared>() },
        { SHARED_CHUNK_FLAGS as usize },
    >,
> = Chunks::new();

/// Drops by reason, per slot: rare, so one copy added to atomically.
#[map]
static DROP_REASONS: HashMap<DropKey, u64> = HashMap::with_max_entries(MAX_DROP_KEYS, 0);

/// This CPU's counters of queue slot `slot`; `None` when its chunk is not there (a slot no
/// queue holds).
#[inline(always)]
pub(crate) fn per_cpu(slot: u32) -> Option<&'static mut PerCpuCounters> {
    let p = PER_CPU_CHUNKS.value::<PerCpuCounters>(slot)?;
    // SAFETY: this CPU's copy in a map value, alive for the program's run; the callers run
    // with bottom halves or preemption disabled, and no two of them that touch the same
    // field can interleave on one CPU.
    Some(unsafe { &mut *p })
}

/// The shared part of queue slot `slot`; every CPU writes it (see each field's rule).
#[inline(always)]
pub(crate) fn shared(slot: u32) -> Option<&'static mut QueueShared> {
    let p = SHARED_CHUNKS.value::<QueueShared>(slot)?;
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
    if let Some(n) = DROP_REASONS.get_ptr_mut(key) {
        // SAFETY: as above.
        add(unsafe { &mut *n }, 1);
    } else {
        // The table is full (MAX_DROP_KEYS pairs of slot and reason): the drop is still in
        // dropped_other, only its reason is not broken down.
        debug!(
            ctx,
            "drop-reason table full: reason {} of slot {} not broken down", reason, slot
        );
    }
}
