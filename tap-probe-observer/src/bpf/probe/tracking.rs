//! Which devices the programs count: the device map, the counter slots each holds, the
//! spare ranges the programs hand to devices they meet first, and zeroing what a new
//! device inherits.

use anyhow::{Context as _, anyhow};
use aya::{
    maps::{
        Array, HashMap as BpfHashMap, MapData, PerCpuArray, PerCpuHashMap, PerCpuValues, Queue,
    },
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _},
};
use tap_probe_common::{
    DEVICE_BY_PROBES, Dequeued, DeviceKey, DeviceSlot, DropKey, MAP_COUNTERS, MAP_DEQUEUED,
    MAP_DEVICES, MAP_DROP_REASONS, MAP_GENERATION, MAP_NO_ROOM, MAP_OCCUPANCY, MAP_QUEUE_STATE,
    MAP_READERS, MAP_REGISTERED, MAP_SLOT_DEV, MAP_SPARE_RANGES, MAP_SPARE_SINGLES, MAX_DEVICES,
    MAX_QUEUE_SLOTS, MAX_QUEUES_PER_DEVICE, PROG_SAMPLE_RINGS, QUEUE_STATE_UNKNOWN, QueueCounters,
    ReaderState, RingSamples, SETTING_REGISTER, SPARE_RANGE_COUNT, SPARE_SINGLE_COUNT,
};

use super::{Held, Origin, Probe};

/// `BPF_NOEXIST` (`include/uapi/linux/bpf.h`): an update that adds a key, never replaces.
const BPF_NOEXIST: u64 = 1;

/// Why a device cannot be tracked now: the probe's tables are full. Devices that go away
/// make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// No `queues` consecutive counter slots are free.
    Slots { queues: u32 },
    /// The device map holds `MAX_DEVICES` devices.
    Devices,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Slots { queues } => write!(
                f,
                "no room for {queues} more queues ({MAX_QUEUE_SLOTS} counter slots in all)"
            ),
            Self::Devices => write!(f, "{MAX_DEVICES} devices are tracked already"),
        }
    }
}

impl std::error::Error for Full {}

impl Probe {
    /// Starts counting for a device with `queues` transmit queues; `flags` are
    /// [`DeviceSlot::flags`] (whether its ring is sampled). A device the programs registered
    /// themselves at its first packet keeps the slots they gave it ([`Origin::Probes`]);
    /// otherwise it gets slots of its own, zeroed, its queues' stop state unknown until the
    /// programs first look ([`Origin::Loader`]).
    ///
    /// # Errors
    /// [`Full`] when the counter slots or the device map have no room left (nothing is
    /// held then), or a map update fails.
    pub fn track(&mut self, key: DeviceKey, queues: u32, flags: u32) -> anyhow::Result<Origin> {
        if let Some(held) = self.tracked.get(&key) {
            return Ok(if held.slot.flags & DEVICE_BY_PROBES != 0 {
                Origin::Probes
            } else {
                Origin::Loader
            });
        }
        if let Ok(slot) = self.devices_map()?.get(&key, 0) {
            self.adopt(key, slot);
            return Ok(Origin::Probes);
        }
        let queues = queues.max(1);
        let base = self.slots.allocate(queues).ok_or(Full::Slots { queues })?;
        let slot = DeviceSlot {
            base,
            queues,
            flags,
            reserved: 0,
        };
        let inserted = self
            .reset(base, queues, QUEUE_STATE_UNKNOWN)
            .and_then(|()| self.insert(key, slot));
        match inserted {
            Ok(true) => {}
            Ok(false) => {
                // The programs registered it in the meantime, at its first packet.
                self.slots.free_unused(base, queues);
                let slot = self.devices_map()?.get(&key, 0)?;
                self.adopt(key, slot);
                return Ok(Origin::Probes);
            }
            Err(err) => {
                // No program ever saw these slots: they are free again at once.
                self.slots.free_unused(base, queues);
                return Err(err);
            }
        }
        self.tracked.insert(key, Held { slot, len: queues });
        self.next_generation()?;
        Ok(Origin::Loader)
    }

    /// Puts a device into `DEVICES` unless it is there already (then `false`).
    fn insert(&mut self, key: DeviceKey, slot: DeviceSlot) -> anyhow::Result<bool> {
        let mut devices = self.devices_map_mut()?;
        match devices.insert(key, slot, BPF_NOEXIST) {
            Ok(()) => Ok(true),
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
            {
                Ok(false)
            }
            // The hash map is full (htab_map_update_elem: E2BIG).
            Err(aya::maps::MapError::SyscallError(e))
                if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
            {
                Err(Full::Devices.into())
            }
            Err(err) => Err(anyhow::Error::new(err).context("adding a device")),
        }
    }

    /// Takes over a device the programs registered: its range leaves the spares.
    fn adopt(&mut self, key: DeviceKey, slot: DeviceSlot) {
        let len = if slot.flags & DEVICE_BY_PROBES == 0 {
            slot.queues
        } else if let Some(i) = self.spares.singles.iter().position(|&b| b == slot.base) {
            self.spares.singles.swap_remove(i);
            1
        } else if let Some(i) = self.spares.ranges.iter().position(|&b| b == slot.base) {
            self.spares.ranges.swap_remove(i);
            MAX_QUEUES_PER_DEVICE
        } else {
            // A range this probe never handed out: not to be freed by it.
            0
        };
        self.tracked.insert(key, Held { slot, len });
    }

    /// The devices the programs registered at their first packet since the last call,
    /// now tracked as they were registered.
    ///
    /// # Errors
    /// When the device map cannot be read.
    pub fn registered(&mut self) -> anyhow::Result<Vec<DeviceKey>> {
        let counter: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_REGISTERED)?)?;
        let registered: u64 = counter.get(&0, 0)?.iter().sum();
        if registered == self.registered_seen {
            return Ok(Vec::new());
        }
        self.registered_seen = registered;
        let found: Vec<(DeviceKey, DeviceSlot)> = self
            .devices_map()?
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, slot)| {
                slot.flags & DEVICE_BY_PROBES != 0 && !self.tracked.contains_key(key)
            })
            .collect();
        let mut out = Vec::with_capacity(found.len());
        for (key, slot) in found {
            self.adopt(key, slot);
            out.push(key);
        }
        Ok(out)
    }

    /// Leaves a device out: the programs skip it from now on (a negative entry in
    /// `DEVICES`, so that they do not register it either), and its slots are given back.
    ///
    /// # Errors
    /// When the map update fails.
    pub fn ignore(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        let none = DeviceSlot::default();
        if let Some(held) = self.tracked.get(&key).copied() {
            if held.len == 0 && held.slot.queues == 0 {
                return Ok(());
            }
            self.devices_map_mut()?.insert(key, none, 0)?;
            if held.len > 0 {
                self.slots.free(held.slot.base, held.len);
            }
        } else if !self.insert(key, none)? {
            // Registered by the programs since the last look: take it over first.
            let slot = self.devices_map()?.get(&key, 0)?;
            self.adopt(key, slot);
            return self.ignore(key);
        }
        self.tracked.insert(key, Held { slot: none, len: 0 });
        self.next_generation()
    }

    /// Stops counting for a device (or forgets one left out); its slots are reused after
    /// the next generation.
    ///
    /// # Errors
    /// When the map update fails.
    pub(crate) fn untrack(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        let Some(held) = self.tracked.remove(&key) else {
            return Ok(());
        };
        match self.devices_map_mut()?.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(err) => return Err(err).context("removing a device"),
        }
        if held.len > 0 {
            self.slots.free(held.slot.base, held.len);
        }
        self.next_generation()
    }

    /// Lets the programs register the devices they meet that are not in `DEVICES`: those
    /// created from now on are counted from their first packet.
    ///
    /// # Errors
    /// When the settings map refuses the update.
    pub(crate) fn start_registering(&mut self) -> anyhow::Result<()> {
        crate::bpf::backend::set(&mut self.ebpf, SETTING_REGISTER)
    }

    /// Tops the programs' spare ranges up to [`SPARE_SINGLE_COUNT`] single slots and
    /// [`SPARE_RANGE_COUNT`] ranges of [`MAX_QUEUES_PER_DEVICE`], each zeroed first.
    /// Where the counter slots run short, fewer: a new device that finds none is counted in
    /// `NO_ROOM` (see [`Probe::no_room`]).
    ///
    /// # Errors
    /// When a map update fails.
    pub(crate) fn refill_spares(&mut self) -> anyhow::Result<()> {
        for (len, want, map) in [
            (1, SPARE_SINGLE_COUNT, MAP_SPARE_SINGLES),
            (MAX_QUEUES_PER_DEVICE, SPARE_RANGE_COUNT, MAP_SPARE_RANGES),
        ] {
            loop {
                let have = if len == 1 {
                    &self.spares.singles
                } else {
                    &self.spares.ranges
                };
                if have.len() >= want as usize {
                    break;
                }
                let Some(base) = self.slots.allocate(len) else {
                    break;
                };
                self.reset(base, len, 0)?;
                let mut queue: Queue<&mut MapData, u32> = Queue::try_from(self.map_mut(map)?)?;
                queue
                    .push(base, 0)
                    .with_context(|| format!("adding a spare range to {map}"))?;
                if len == 1 {
                    self.spares.singles.push(base);
                } else {
                    self.spares.ranges.push(base);
                }
            }
        }
        Ok(())
    }

    /// Events of new devices that found no spare range left, so went uncounted.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn no_room(&self) -> anyhow::Result<u64> {
        let n: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_NO_ROOM)?)?;
        Ok(n.get(&0, 0)?.iter().sum())
    }

    /// Samples the rings of a tracked tun/tap's queues now (the ring sampler, run through
    /// `BPF_PROG_TEST_RUN`), where rings are sampled.
    ///
    /// # Errors
    /// When the device is not tracked or the kernel refuses the run.
    pub(crate) fn sample_rings(&self, key: DeviceKey) -> anyhow::Result<()> {
        if !self.sampler {
            return Ok(());
        }
        let held = self.held(key)?;
        if held.slot.queues == 0 || held.slot.flags & tap_probe_common::DEVICE_TUN == 0 {
            return Ok(());
        }
        let program: &RawTracePoint = self
            .ebpf
            .program(PROG_SAMPLE_RINGS)
            .ok_or_else(|| anyhow!("program {PROG_SAMPLE_RINGS} missing from the eBPF object"))?
            .try_into()?;
        let mut opts = RawTracePointRunOptions::new();
        opts.args[0] = u64::from(held.slot.base);
        opts.args[1] = u64::from(held.slot.queues);
        program.test_run(opts).context("running the ring sampler")?;
        Ok(())
    }

    /// Invalidates the programs' per-CPU device caches: called after each change to the
    /// device map, so no CPU keeps counting a device by a mapping that changed.
    fn next_generation(&mut self) -> anyhow::Result<()> {
        self.generation += 1;
        let value = self.generation;
        let mut generation: Array<&mut MapData, u64> =
            Array::try_from(self.map_mut(MAP_GENERATION)?)?;
        generation.set(0, value, 0)?;
        Ok(())
    }

    /// Makes the slots freed before this call reusable (see [`Slots`](crate::bpf::slots::Slots)). Call once per
    /// refresh interval.
    pub(crate) fn retire_generation(&mut self) {
        self.slots.next_generation();
    }

    fn devices_map(&self) -> anyhow::Result<BpfHashMap<&MapData, DeviceKey, DeviceSlot>> {
        Ok(BpfHashMap::try_from(self.map(MAP_DEVICES)?)?)
    }

    fn devices_map_mut(
        &mut self,
    ) -> anyhow::Result<BpfHashMap<&mut MapData, DeviceKey, DeviceSlot>> {
        Ok(BpfHashMap::try_from(self.map_mut(MAP_DEVICES)?)?)
    }

    /// Zeroes the counters and drop reasons of slots `base..base + len`, and sets their
    /// queue state to `state` (0: running; [`QUEUE_STATE_UNKNOWN`]).
    fn reset(&mut self, base: u32, len: u32, state: u64) -> anyhow::Result<()> {
        let cpus = self.cpus;
        let mut counters: PerCpuArray<&mut MapData, QueueCounters> =
            PerCpuArray::try_from(self.map_mut(MAP_COUNTERS)?)?;
        for slot in base..base + len {
            let zero = PerCpuValues::try_from(vec![QueueCounters::default(); cpus])?;
            counters.set(slot, zero, 0)?;
        }
        let mut states: Array<&mut MapData, u64> = Array::try_from(self.map_mut(MAP_QUEUE_STATE)?)?;
        for slot in base..base + len {
            states.set(slot, state, 0)?;
        }
        let mut devs: Array<&mut MapData, u64> = Array::try_from(self.map_mut(MAP_SLOT_DEV)?)?;
        for slot in base..base + len {
            devs.set(slot, 0, 0)?;
        }
        let mut readers: Array<&mut MapData, ReaderState> =
            Array::try_from(self.map_mut(MAP_READERS)?)?;
        for slot in base..base + len {
            readers.set(slot, ReaderState::default(), 0)?;
        }
        let mut occupancy: PerCpuArray<&mut MapData, RingSamples> =
            PerCpuArray::try_from(self.map_mut(MAP_OCCUPANCY)?)?;
        for slot in base..base + len {
            let zero = PerCpuValues::try_from(vec![RingSamples::default(); cpus])?;
            occupancy.set(slot, zero, 0)?;
        }
        let mut dequeued: Array<&mut MapData, Dequeued> =
            Array::try_from(self.map_mut(MAP_DEQUEUED)?)?;
        for slot in base..base + len {
            dequeued.set(slot, Dequeued::default(), 0)?;
        }
        let mut reasons: PerCpuHashMap<&mut MapData, DropKey, u64> =
            PerCpuHashMap::try_from(self.map_mut(MAP_DROP_REASONS)?)?;
        let leftover: Vec<DropKey> = reasons
            .keys()
            .filter_map(Result::ok)
            .filter(|k| (base..base + len).contains(&k.slot))
            .collect();
        for key in leftover {
            match reasons.remove(&key) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(err) => return Err(err.into()),
            }
        }
        Ok(())
    }

    /// Zeroes a tracked device's counters, queue state and drop reasons.
    ///
    /// # Errors
    /// When the device is not tracked or a map update fails.
    pub(crate) fn reset_device(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        let slot = self.slot_of(key)?;
        self.reset(slot.base, slot.queues, QUEUE_STATE_UNKNOWN)
    }

    fn held(&self, key: DeviceKey) -> anyhow::Result<Held> {
        self.tracked
            .get(&key)
            .copied()
            .ok_or_else(|| anyhow!("device {key:?} is not tracked"))
    }

    pub(super) fn slot_of(&self, key: DeviceKey) -> anyhow::Result<DeviceSlot> {
        self.held(key).map(|held| held.slot)
    }

    /// The counter slots of a tracked device: from the first, one per queue counted.
    #[must_use]
    pub fn slots(&self, key: DeviceKey) -> Option<(u32, u32)> {
        self.tracked
            .get(&key)
            .map(|held| (held.slot.base, held.slot.queues))
    }
}
