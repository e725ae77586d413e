//! The chunks of per-queue storage the loader creates and puts into the programs' arrays of
//! maps (`PER_CPU_CHUNKS`, `SHARED_CHUNKS`): each holds [`CHUNK_SLOTS`] slots, a per-CPU
//! array of [`PerCpuCounters`] and an array of [`QueueShared`]. Chunk `i` holds slots
//! `i * CHUNK_SLOTS ..`.

use std::os::fd::{AsFd as _, AsRawFd as _, RawFd};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf,
    maps::{Array, ArrayOfMaps, IterableMap as _, Map, MapData, PerCpuArray, PerCpuValues},
};
use tap_probe_common::{
    CHUNK_SLOTS, MAP_PER_CPU_CHUNKS, MAP_SHARED_CHUNKS, PerCpuCounters, QueueShared,
    SHARED_CHUNK_FLAGS,
};

use crate::bpf::sys;

type PerCpuChunk = PerCpuArray<MapData, PerCpuCounters>;

/// The kernel's "operation not supported" (`include/linux/errno.h`, not in libc's).
const ENOTSUPP: i32 = 524;
type SharedChunk = Array<MapData, QueueShared>;

/// One chunk's two maps, and the shared one's memory mapped.
struct Chunk {
    per_cpu: PerCpuChunk,
    shared: SharedChunk,
    mapped: Mapped,
}

/// A shared chunk's values, mapped read-only (`BPF_F_MMAPABLE`): read in place, with no
/// system call and no copy of what is not read.
struct Mapped {
    at: std::ptr::NonNull<QueueShared>,
    len: usize,
}

impl Mapped {
    /// Maps the values of the array behind `fd` (`CHUNK_SLOTS` entries of `QueueShared`).
    fn new(fd: RawFd) -> anyhow::Result<Self> {
        let len = (CHUNK_SLOTS as usize * size_of::<QueueShared>()).next_multiple_of(4096);
        // SAFETY: a shared read-only mapping of a BPF array created mmapable, of its
        // values' size rounded up to pages, as the kernel maps it (`array_map_mmap`).
        let at = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ,
                libc::MAP_SHARED,
                fd,
                0,
            )
        };
        if at == libc::MAP_FAILED {
            return Err(std::io::Error::last_os_error())
                .context("mapping a chunk of the per-queue storage");
        }
        Ok(Self {
            at: std::ptr::NonNull::new(at.cast()).context("mmap gave a null mapping")?,
            len,
        })
    }

    /// The values of slot `index` of the chunk: read field by field while programs write
    /// them, each aligned u64 whole.
    fn get(&self, index: u32) -> QueueShared {
        assert!(index < CHUNK_SLOTS, "slot {index} beyond a chunk");
        // SAFETY: within the mapping, which holds CHUNK_SLOTS values; QueueShared is plain
        // integers, valid whatever their bits; volatile, as the programs write them.
        unsafe { std::ptr::read_volatile(self.at.as_ptr().add(index as usize)) }
    }
}

impl Drop for Mapped {
    fn drop(&mut self) {
        // SAFETY: the mapping made in `new`, unmapped once.
        unsafe { libc::munmap(self.at.as_ptr().cast(), self.len) };
    }
}

/// The chunks there are, and the two arrays of maps the programs find them in.
pub(crate) struct Chunks {
    per_cpu_outer: ArrayOfMaps<MapData, PerCpuChunk>,
    shared_outer: ArrayOfMaps<MapData, SharedChunk>,
    /// The two arrays' descriptors, in that order (the typed maps do not show them).
    outer_fds: [RawFd; 2],
    /// Indexed by chunk number; `None` for a chunk given back.
    present: Vec<Option<Chunk>>,
    /// CPUs the kernel keeps per-CPU values for (the possible CPUs).
    cpus: usize,
    /// Whether the kernel reads a run of a per-CPU array's entries in one call
    /// (`BPF_MAP_LOOKUP_BATCH`, for per-CPU arrays since Linux 5.13): cleared at the first
    /// `ENOTSUPP`, after which each entry is read on its own.
    batch: std::cell::Cell<bool>,
}

impl Chunks {
    /// Takes the two arrays of maps out of the loaded object (the programs keep them).
    ///
    /// # Errors
    /// When the object lacks them.
    pub(crate) fn new(ebpf: &mut Ebpf, cpus: usize) -> anyhow::Result<Self> {
        let mut take = |name: &str| -> anyhow::Result<(Map, RawFd)> {
            let map = ebpf
                .take_map(name)
                .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))?;
            let Map::ArrayOfMaps(data) = &map else {
                bail!("map {name} is not an array of maps");
            };
            let fd = data.fd().as_fd().as_raw_fd();
            Ok((map, fd))
        };
        let (per_cpu, per_cpu_fd) = take(MAP_PER_CPU_CHUNKS)?;
        let (shared, shared_fd) = take(MAP_SHARED_CHUNKS)?;
        Ok(Self {
            per_cpu_outer: ArrayOfMaps::try_from(per_cpu)?,
            shared_outer: ArrayOfMaps::try_from(shared)?,
            outer_fds: [per_cpu_fd, shared_fd],
            present: Vec::new(),
            cpus,
            batch: std::cell::Cell::new(true),
        })
    }

    /// Creates chunk `index`, zeroed, and puts it where the programs find it.
    ///
    /// # Errors
    /// When the kernel refuses to create the maps (out of memory) or to take them.
    pub(crate) fn add(&mut self, index: u32) -> anyhow::Result<()> {
        use aya_obj::generated::bpf_map_type::{BPF_MAP_TYPE_ARRAY, BPF_MAP_TYPE_PERCPU_ARRAY};
        let create = |kind, value: usize, flags: u32, name: &str| {
            let def = aya_obj::Map::new_from_params(
                kind as u32,
                4,
                u32::try_from(value)?,
                CHUNK_SLOTS,
                flags,
            );
            MapData::create(def, name, None)
                .with_context(|| format!("creating chunk {index} of the per-queue storage"))
        };
        let per_cpu = PerCpuArray::try_from(Map::PerCpuArray(create(
            BPF_MAP_TYPE_PERCPU_ARRAY,
            size_of::<PerCpuCounters>(),
            0,
            &format!("tp_percpu_{index}"),
        )?))?;
        let shared = Array::try_from(Map::Array(create(
            BPF_MAP_TYPE_ARRAY,
            size_of::<QueueShared>(),
            SHARED_CHUNK_FLAGS,
            &format!("tp_shared_{index}"),
        )?))?;
        let mapped = Mapped::new(shared.map().fd().as_fd().as_raw_fd())?;
        // The shared part first: a program that finds the per-CPU part finds both.
        self.shared_outer
            .set(index, &shared, 0)
            .with_context(|| format!("installing chunk {index}"))?;
        self.per_cpu_outer
            .set(index, &per_cpu, 0)
            .with_context(|| format!("installing chunk {index}"))?;
        let at = index as usize;
        if self.present.len() <= at {
            self.present.resize_with(at + 1, || None);
        }
        self.present[at] = Some(Chunk {
            per_cpu,
            shared,
            mapped,
        });
        Ok(())
    }

    /// Takes chunk `index` out of the programs' reach and frees it (the kernel keeps it until
    /// no program runs with it). Its slots must be free.
    ///
    /// # Errors
    /// When the kernel refuses the update.
    pub(crate) fn remove(&mut self, index: u32) -> anyhow::Result<()> {
        for outer in self.outer_fds {
            sys::map_delete(outer, &index)
                .with_context(|| format!("removing chunk {index} of the per-queue storage"))?;
        }
        if let Some(chunk) = self.present.get_mut(index as usize) {
            *chunk = None;
        }
        Ok(())
    }

    fn chunk(&self, slot: u32) -> anyhow::Result<&Chunk> {
        self.present
            .get((slot / CHUNK_SLOTS) as usize)
            .and_then(Option::as_ref)
            .ok_or_else(|| anyhow!("slot {slot} is in no chunk"))
    }

    fn chunk_mut(&mut self, slot: u32) -> anyhow::Result<&mut Chunk> {
        self.present
            .get_mut((slot / CHUNK_SLOTS) as usize)
            .and_then(Option::as_mut)
            .ok_or_else(|| anyhow!("slot {slot} is in no chunk"))
    }

    /// Zeroes slot `slot`, its queue state set to `state`.
    ///
    /// # Errors
    /// When a map update fails.
    pub(crate) fn reset(&mut self, slot: u32, state: u64) -> anyhow::Result<()> {
        let cpus = self.cpus;
        let chunk = self.chunk_mut(slot)?;
        let zero = PerCpuValues::try_from(vec![PerCpuCounters::default(); cpus])?;
        chunk.per_cpu.set(slot % CHUNK_SLOTS, zero, 0)?;
        chunk.shared.set(
            slot % CHUNK_SLOTS,
            QueueShared {
                state,
                ..QueueShared::default()
            },
            0,
        )?;
        Ok(())
    }

    /// Slots `first .. first + n`, all in one chunk: each one's per-CPU counters summed
    /// over CPUs, and its shared part. One system call, however many slots, where the
    /// kernel reads per-CPU arrays in batches; else one per slot.
    ///
    /// # Errors
    /// When the slots are not in one chunk there is, or a map cannot be read.
    pub(crate) fn read_run(
        &self,
        first: u32,
        n: u32,
    ) -> anyhow::Result<Vec<(PerCpuCounters, QueueShared)>> {
        let chunk = self.chunk(first)?;
        if first % CHUNK_SLOTS + n > CHUNK_SLOTS {
            anyhow::bail!("slots {first}.. ({n}) are not all in one chunk");
        }
        let fd = |map: &MapData| map.fd().as_fd().as_raw_fd();
        let start = first % CHUNK_SLOTS;
        if !self.batch.get() {
            return Self::read_each(chunk, start, n);
        }
        let per_cpu_size = size_of::<PerCpuCounters>().next_multiple_of(8);
        let per_cpu = match sys::array_lookup_batch(
            fd(chunk.per_cpu.map()),
            start,
            n,
            per_cpu_size * self.cpus,
        ) {
            Ok(bytes) => bytes,
            Err(err) if err.raw_os_error() == Some(ENOTSUPP) => {
                log::debug!("no batch lookups of per-CPU arrays here: one lookup per slot");
                self.batch.set(false);
                return Self::read_each(chunk, start, n);
            }
            Err(err) => return Err(err.into()),
        };
        Ok((0..n as usize)
            .map(|i| {
                let mut sum = PerCpuCounters::default();
                for cpu in 0..self.cpus {
                    let at = (i * self.cpus + cpu) * per_cpu_size;
                    // SAFETY: within the buffer the kernel filled (n entries of `cpus`
                    // values each); `PerCpuCounters` is plain u64s, any bits valid.
                    sum += unsafe {
                        std::ptr::read_unaligned(per_cpu[at..].as_ptr().cast::<PerCpuCounters>())
                    };
                }
                #[expect(clippy::cast_possible_truncation, reason = "below CHUNK_SLOTS")]
                let shared = chunk.mapped.get(start + i as u32);
                (sum, shared)
            })
            .collect())
    }

    /// [`Self::read_run`] one slot at a time.
    fn read_each(
        chunk: &Chunk,
        start: u32,
        n: u32,
    ) -> anyhow::Result<Vec<(PerCpuCounters, QueueShared)>> {
        (start..start + n)
            .map(|index| {
                let values = chunk.per_cpu.get(&index, 0)?;
                let mut sum = PerCpuCounters::default();
                for value in values.iter() {
                    sum += *value;
                }
                Ok((sum, chunk.mapped.get(index)))
            })
            .collect()
    }

    /// The descriptors of the chunks' maps, for their kernel memory.
    pub(crate) fn fds(&self) -> Vec<i32> {
        self.present
            .iter()
            .flatten()
            .flat_map(|c| {
                [
                    c.per_cpu.map().fd().as_fd().as_raw_fd(),
                    c.shared.map().fd().as_fd().as_raw_fd(),
                ]
            })
            .collect()
    }

    /// Chunks there are.
    pub(crate) fn count(&self) -> usize {
        self.present.iter().flatten().count()
    }

    /// The descriptors of the two arrays of maps, for their kernel memory.
    pub(crate) fn outer_fds(&self) -> [RawFd; 2] {
        self.outer_fds
    }
}
