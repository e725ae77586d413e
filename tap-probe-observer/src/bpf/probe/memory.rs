//! What the probe's maps cost the kernel, as the kernel charges it (`memlock` in each map's
//! fdinfo), and what the same maps would cost on a host with more CPUs.

use std::os::fd::{AsFd as _, AsRawFd as _, RawFd};

use aya::maps::{Map, MapData};
use serde::Serialize;

use super::Probe;
use crate::bpf::sys;

/// `BPF_MAP_TYPE_*` values whose entries are kept once per possible CPU
/// (`include/uapi/linux/bpf.h`): per-CPU hash, per-CPU array, LRU per-CPU hash, per-CPU
/// cgroup storage.
const PER_CPU_TYPES: [u64; 4] = [5, 6, 10, 21];

/// One map's kernel memory.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct MapMemory {
    /// The object's name for it; a chunk's maps are named after their array and number.
    pub name: String,
    /// What the kernel charges for it here (`memlock`).
    pub bytes: u64,
    /// The part of `bytes` kept once per possible CPU: `max_entries` times the value size
    /// rounded up to 8 for a per-CPU map, 0 for the others (whose per-CPU bookkeeping, a
    /// few locks and a spare entry per CPU in a hash map, is left out).
    pub per_cpu_bytes: u64,
}

/// The kernel memory of every map the probe holds.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Memory {
    /// The CPUs the kernel may bring online here (`/sys/devices/system/cpu/possible`): what
    /// per-CPU maps are sized by.
    pub possible_cpus: usize,
    pub maps: Vec<MapMemory>,
}

impl Memory {
    /// The bytes charged here.
    #[must_use]
    pub fn bytes(&self) -> u64 {
        self.maps.iter().map(|m| m.bytes).sum()
    }

    /// The bytes the same maps would cost with `cpus` possible CPUs.
    #[must_use]
    pub fn bytes_at(&self, cpus: usize) -> u64 {
        let here = self.possible_cpus as u64;
        self.maps
            .iter()
            .map(|m| m.bytes.saturating_sub(m.per_cpu_bytes * here) + m.per_cpu_bytes * cpus as u64)
            .sum()
    }
}

impl Probe {
    /// What each of the probe's maps costs the kernel now. Read again only when the chunks
    /// changed: every other map is allocated whole when it is created.
    ///
    /// # Errors
    /// When a map's fdinfo cannot be read.
    pub fn memory(&self) -> anyhow::Result<Memory> {
        let chunks = self.chunks.count();
        if let Some((at, memory)) = &*self.memory.borrow()
            && *at == chunks
        {
            return Ok(memory.clone());
        }
        let memory = self.read_memory()?;
        self.memory.replace(Some((chunks, memory.clone())));
        Ok(memory)
    }

    fn read_memory(&self) -> anyhow::Result<Memory> {
        let mut maps = Vec::new();
        for (name, map) in self.ebpf.maps() {
            maps.push(map_memory(
                name.to_owned(),
                data(map).fd().as_fd().as_raw_fd(),
            )?);
        }
        if let Some(fd) = self.log_map {
            maps.push(map_memory(super::AYA_LOGS.to_owned(), fd)?);
        }
        for (name, fd) in [
            tap_probe_common::MAP_PER_CPU_CHUNKS,
            tap_probe_common::MAP_SHARED_CHUNKS,
        ]
        .into_iter()
        .zip(self.chunks.outer_fds())
        {
            maps.push(map_memory(name.to_owned(), fd)?);
        }
        for (i, fd) in self.chunks.fds().into_iter().enumerate() {
            let kind = if i % 2 == 0 { "per-CPU" } else { "shared" };
            maps.push(map_memory(format!("chunk {} ({kind})", i / 2), fd)?);
        }
        Ok(Memory {
            possible_cpus: self.possible_cpus,
            maps,
        })
    }
}

/// The descriptor of map `name` of the loaded object, if it has one.
pub(super) fn descriptor(ebpf: &aya::Ebpf, name: &str) -> Option<RawFd> {
    ebpf.map(name).map(|map| data(map).fd().as_fd().as_raw_fd())
}

/// One map's `memlock`, and its per-CPU part from its type and sizes in the same fdinfo.
fn map_memory(name: String, fd: RawFd) -> anyhow::Result<MapMemory> {
    let text = std::fs::read_to_string(format!("/proc/self/fdinfo/{fd}"))?;
    let field = |key| {
        sys::fdinfo_field(&text, key)
            .ok_or_else(|| anyhow::anyhow!("fdinfo of map {name} has no {key}"))
    };
    let bytes = field("memlock")?;
    let per_cpu_bytes = if PER_CPU_TYPES.contains(&field("map_type")?) {
        field("max_entries")? * field("value_size")?.next_multiple_of(8)
    } else {
        0
    };
    Ok(MapMemory {
        name,
        bytes,
        per_cpu_bytes,
    })
}

/// The map's data, whatever its type (aya's `Map` names no descriptor itself).
fn data(map: &Map) -> &MapData {
    match map {
        Map::Array(m)
        | Map::ArrayOfMaps(m)
        | Map::BloomFilter(m)
        | Map::CgroupArray(m)
        | Map::CgroupStorage(m)
        | Map::CgrpStorage(m)
        | Map::CpuMap(m)
        | Map::DevMap(m)
        | Map::DevMapHash(m)
        | Map::HashMap(m)
        | Map::HashOfMaps(m)
        | Map::InodeStorage(m)
        | Map::LpmTrie(m)
        | Map::LruHashMap(m)
        | Map::PerCpuArray(m)
        | Map::PerCpuCgroupStorage(m)
        | Map::PerCpuHashMap(m)
        | Map::PerCpuLruHashMap(m)
        | Map::PerfEventArray(m)
        | Map::ProgramArray(m)
        | Map::Queue(m)
        | Map::ReusePortSockArray(m)
        | Map::RingBuf(m)
        | Map::SockHash(m)
        | Map::SockMap(m)
        | Map::SkStorage(m)
        | Map::Stack(m)
        | Map::StackTraceMap(m)
        | Map::Unsupported(m)
        | Map::XskMap(m) => m,
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn per_cpu_parts_scale_with_the_cpus_and_the_rest_stays() {
        let memory = Memory {
            possible_cpus: 2,
            maps: vec![
                MapMemory {
                    name: "per-CPU".to_owned(),
                    bytes: 10_496,
                    per_cpu_bytes: 5_120,
                },
                MapMemory {
                    name: "hash".to_owned(),
                    bytes: 4_000,
                    per_cpu_bytes: 0,
                },
            ],
        };
        assert_eq!(memory.bytes(), 14_496);
        assert_eq!(memory.bytes_at(2), 14_496);
        assert_eq!(memory.bytes_at(256), 256 + 5_120 * 256 + 4_000);
    }
}
