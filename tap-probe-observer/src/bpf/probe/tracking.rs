//! Which devices and queues the programs count: the device map, the queue map and the slot
//! each queue holds, the spare slots the programs hand to queues they meet first, the
//! chunks behind the slots, and zeroing what a new queue inherits.

use std::collections::BTreeMap;

use anyhow::{Context as _, anyhow};
use aya::{
    maps::{Array, HashMap as BpfHashMap, MapData, PerCpuArray, Queue},
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _},
};
use tap_probe_common::{
    DEVICE_BY_PROBES, DEVICE_LEFT_OUT, DEVICE_TUN, DeviceEntry, DeviceKey, MAP_DEVICES,
    MAP_GENERATION, MAP_NO_ROOM, MAP_QUEUES, MAP_REGISTERED, MAP_SPARE_SLOTS, MAX_DEVICES,
    MAX_QUEUE_SLOTS, PROG_SAMPLE_RINGS, QUEUE_STATE_UNKNOWN, QueueKey, QueueSlot,
    RING_SAMPLE_QUEUES, SETTING_REGISTER, SPARE_SLOTS,
};

use super::{Held, Origin, Probe};

/// `BPF_NOEXIST` (`include/uapi/linux/bpf.h`): an update that adds a key, never replaces.
const BPF_NOEXIST: u64 = 1;

/// Why a device cannot be tracked now: the probe's tables are full. Devices that go away
/// make room.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum Full {
    /// No free slot for each of its `queues` queues.
    Slots { queues: u32 },
    /// The device map holds `MAX_DEVICES` devices.
    Devices,
}

impl std::fmt::Display for Full {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Slots { queues } => write!(
                f,
                "no room for {queues} more queues ({MAX_QUEUE_SLOTS} queues are counted at most)"
            ),
            Self::Devices => write!(f, "{MAX_DEVICES} devices are tracked already"),
        }
    }
}

impl std::error::Error for Full {}

impl Probe {
    /// Starts counting the first `queues` transmit queues of a device (those in use; any
    /// other the programs add at its first packet); `flags` are `DeviceEntry::flags`
    /// (whether its ring is sampled). A device the programs registered themselves at its
    /// first packet keeps what they gave it ([`Origin::Probes`]); otherwise its queues get
    /// slots of their own, zeroed, their stop state unknown until the programs first look
    /// ([`Origin::Loader`]).
    ///
    /// # Errors
    /// [`Full`] when the slots or the device map have no room left (nothing is held then),
    /// or a map update fails.
    pub fn track(&mut self, key: DeviceKey, queues: u32, flags: u32) -> anyhow::Result<Origin> {
        if !self.tracked.contains_key(&key) && self.devices_map()?.get(&key, 0).is_ok() {
            // Registered by the programs since the last look.
            self.adopt_registered()?;
        }
        if let Some(held) = self.tracked.get(&key) {
            return Ok(if held.flags & DEVICE_BY_PROBES != 0 {
                Origin::Probes
            } else {
                Origin::Loader
            });
        }
        let queues = queues.max(1);
        if !self.insert_device(key, DeviceEntry { flags, reserved: 0 })? {
            // The programs registered it in the meantime, at its first packet.
            self.adopt_registered()?;
            return Ok(Origin::Probes);
        }
        self.tracked.insert(
            key,
            Held {
                flags,
                queues: BTreeMap::new(),
            },
        );
        for queue in 0..queues {
            if let Err(err) = self.add_queue(key, queue, flags) {
                // Nothing of it is held: the slots taken go back, the entries go.
                let _ = self.untrack(key);
                return Err(err);
            }
        }
        self.next_generation()?;
        Ok(Origin::Loader)
    }

    /// Counts queue `queue` of tracked device `key` in a slot of its own, zeroed; a queue
    /// the programs registered meanwhile keeps their slot.
    fn add_queue(&mut self, key: DeviceKey, queue: u32, flags: u32) -> anyhow::Result<()> {
        let slot = self.allocate()?.ok_or(Full::Slots { queues: 1 })?;
        let qkey = QueueKey { device: key, queue };
        let inserted = self
            .chunks
            .reset(slot, QUEUE_STATE_UNKNOWN)
            .and_then(|()| self.insert_queue(qkey, QueueSlot { slot, flags }));
        let slot = match inserted {
            Ok(true) => slot,
            Ok(false) => {
                // No program ever saw this slot: it is free again at once.
                self.slots.free_unused(slot);
                self.queues_map()?.get(&qkey, 0)?.slot
            }
            Err(err) => {
                self.slots.free_unused(slot);
                return Err(err);
            }
        };
        if let Some(held) = self.tracked.get_mut(&key) {
            held.queues.insert(queue, slot);
        }
        Ok(())
    }

    /// A free slot, after adding a chunk if every chunk there is is taken; `None` when the
    /// chunks are at their limit.
    fn allocate(&mut self) -> anyhow::Result<Option<u32>> {
        if let Some(slot) = self.slots.allocate() {
            return Ok(Some(slot));
        }
        let Some(chunk) = self.slots.next_chunk() else {
            return Ok(None);
        };
        self.chunks.add(chunk)?;
        self.slots.grown();
        Ok(self.slots.allocate())
    }

    /// Puts a device into `DEVICES` unless it is there already (then `false`).
    fn insert_device(&mut self, key: DeviceKey, entry: DeviceEntry) -> anyhow::Result<bool> {
        let mut devices = self.devices_map_mut()?;
        added(
            devices.insert(key, entry, BPF_NOEXIST),
            Full::Devices,
            "adding a device",
        )
    }

    /// Puts a queue into `QUEUES` unless it is there already (then `false`).
    fn insert_queue(&mut self, key: QueueKey, slot: QueueSlot) -> anyhow::Result<bool> {
        let mut queues = self.queues_map_mut()?;
        added(
            queues.insert(key, slot, BPF_NOEXIST),
            Full::Slots { queues: 1 },
            "adding a queue",
        )
    }

    /// Takes over what the programs registered at a first packet since the last look: new
    /// devices, and new queues of devices tracked or registered. The slots they took leave
    /// the spares.
    fn adopt_registered(&mut self) -> anyhow::Result<Vec<DeviceKey>> {
        let devices: Vec<(DeviceKey, DeviceEntry)> = self
            .devices_map()?
            .iter()
            .filter_map(Result::ok)
            .filter(|(key, entry)| {
                entry.flags & DEVICE_BY_PROBES != 0 && !self.tracked.contains_key(key)
            })
            .collect();
        let mut new = Vec::with_capacity(devices.len());
        for (key, entry) in devices {
            self.tracked.insert(
                key,
                Held {
                    flags: entry.flags,
                    queues: BTreeMap::new(),
                },
            );
            new.push(key);
        }
        let queues: Vec<(QueueKey, QueueSlot)> = self
            .queues_map()?
            .iter()
            .filter_map(Result::ok)
            .filter(|(qkey, _)| {
                self.tracked
                    .get(&qkey.device)
                    .is_some_and(|held| !held.queues.contains_key(&qkey.queue))
            })
            .collect();
        for (qkey, slot) in queues {
            if let Some(i) = self.spares.iter().position(|&s| s == slot.slot) {
                self.spares.swap_remove(i);
            }
            if let Some(held) = self.tracked.get_mut(&qkey.device) {
                held.queues.insert(qkey.queue, slot.slot);
            }
        }
        Ok(new)
    }

    /// The devices the programs registered at their first packet since the last call, now
    /// tracked as they were registered; queues they registered for devices already tracked
    /// are counted too.
    ///
    /// # Errors
    /// When the maps cannot be read.
    pub fn registered(&mut self) -> anyhow::Result<Vec<DeviceKey>> {
        let counter: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_REGISTERED)?)?;
        let registered: u64 = counter.get(&0, 0)?.iter().sum();
        if registered == self.registered_seen {
            return Ok(Vec::new());
        }
        self.registered_seen = registered;
        self.adopt_registered()
    }

    /// Leaves a device out: the programs skip it from now on (a negative entry in
    /// `DEVICES`, so that they do not register it either), and its queues' slots are given
    /// back.
    ///
    /// # Errors
    /// When a map update fails.
    pub fn ignore(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        if self
            .tracked
            .get(&key)
            .is_some_and(|h| h.flags & DEVICE_LEFT_OUT != 0)
        {
            return Ok(());
        }
        let none = DeviceEntry {
            flags: DEVICE_LEFT_OUT,
            reserved: 0,
        };
        if !self.tracked.contains_key(&key) && !self.insert_device(key, none)? {
            // Registered by the programs since the last look: take it over first.
            self.adopt_registered()?;
        }
        // The device's entry first: a program that misses its queues then finds it left out,
        // and registers none again.
        self.devices_map_mut()?.insert(key, none, 0)?;
        self.next_generation()?;
        let queues = self
            .tracked
            .insert(
                key,
                Held {
                    flags: DEVICE_LEFT_OUT,
                    queues: BTreeMap::new(),
                },
            )
            .map(|held| held.queues)
            .unwrap_or_default();
        self.remove_queues(key, &queues)
    }

    /// Stops counting a device (or forgets one left out); its slots are reused after the
    /// next generation.
    ///
    /// # Errors
    /// When a map update fails.
    pub(crate) fn untrack(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        let Some(held) = self.tracked.remove(&key) else {
            return Ok(());
        };
        match self.devices_map_mut()?.remove(&key) {
            Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
            Err(err) => return Err(err).context("removing a device"),
        }
        self.remove_queues(key, &held.queues)?;
        self.next_generation()
    }

    /// Removes `queues` of device `key` from `QUEUES`; their slots cool for a generation.
    fn remove_queues(&mut self, key: DeviceKey, queues: &BTreeMap<u32, u32>) -> anyhow::Result<()> {
        let mut map = self.queues_map_mut()?;
        for &queue in queues.keys() {
            match map.remove(&QueueKey { device: key, queue }) {
                Ok(()) | Err(aya::maps::MapError::KeyNotFound) => {}
                Err(err) => return Err(err).context("removing a queue"),
            }
        }
        for &slot in queues.values() {
            self.slots.free(slot);
        }
        Ok(())
    }

    /// Lets the programs register the devices they meet that are not in `DEVICES`: those
    /// created from now on are counted from their first packet.
    ///
    /// # Errors
    /// When the settings map refuses the update.
    pub(crate) fn start_registering(&mut self) -> anyhow::Result<()> {
        crate::bpf::backend::set(&mut self.ebpf, SETTING_REGISTER)
    }

    /// Tops the programs' spare slots up to [`SPARE_SLOTS`], each zeroed first. Where the
    /// slots run short, fewer: a new queue that finds none is counted in `NO_ROOM` (see
    /// [`Probe::no_room`]).
    ///
    /// # Errors
    /// When a map update fails.
    pub(crate) fn refill_spares(&mut self) -> anyhow::Result<()> {
        while self.spares.len() < SPARE_SLOTS as usize {
            let Some(slot) = self.allocate()? else {
                break;
            };
            self.chunks.reset(slot, 0)?;
            let mut queue: Queue<&mut MapData, u32> =
                Queue::try_from(self.map_mut(MAP_SPARE_SLOTS)?)?;
            queue
                .push(slot, 0)
                .with_context(|| format!("adding a spare slot to {MAP_SPARE_SLOTS}"))?;
            self.spares.push(slot);
        }
        Ok(())
    }

    /// Events of new queues that found no spare slot left, so went uncounted.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn no_room(&self) -> anyhow::Result<u64> {
        let n: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_NO_ROOM)?)?;
        Ok(n.get(&0, 0)?.iter().sum())
    }

    /// Samples the rings of a tracked tun/tap's queues now (the ring sampler, run through
    /// `BPF_PROG_TEST_RUN`, a few queues a run), where rings are sampled.
    ///
    /// # Errors
    /// When the device is not tracked or the kernel refuses the run.
    pub(crate) fn sample_rings(&self, key: DeviceKey) -> anyhow::Result<()> {
        if !self.sampler {
            return Ok(());
        }
        let held = self.held(key)?;
        if held.flags & DEVICE_TUN == 0 || held.queues.is_empty() {
            return Ok(());
        }
        let program: &RawTracePoint = self
            .ebpf
            .program(PROG_SAMPLE_RINGS)
            .ok_or_else(|| anyhow!("program {PROG_SAMPLE_RINGS} missing from the eBPF object"))?
            .try_into()?;
        let queues: Vec<(&u32, &u32)> = held.queues.iter().collect();
        for batch in queues.chunks(RING_SAMPLE_QUEUES as usize) {
            let mut opts = RawTracePointRunOptions::new();
            opts.args[0] = batch.len() as u64;
            for (arg, &(&queue, &slot)) in opts.args[1..].iter_mut().zip(batch) {
                *arg = (u64::from(slot) << 32) | u64::from(queue);
            }
            program.test_run(opts).context("running the ring sampler")?;
        }
        Ok(())
    }

    /// Invalidates the programs' per-CPU queue caches: called after each change to the
    /// device or queue map, so no CPU keeps counting a queue by a mapping that changed.
    fn next_generation(&mut self) -> anyhow::Result<()> {
        self.generation += 1;
        let value = self.generation;
        let mut generation: Array<&mut MapData, u64> =
            Array::try_from(self.map_mut(MAP_GENERATION)?)?;
        generation.set(0, value, 0)?;
        Ok(())
    }

    /// Called once per refresh interval: makes the slots freed before it reusable (see
    /// [`Slots`](crate::bpf::slots::Slots)), their drop reasons gone, gives back the chunks
    /// that emptied, and forgets the last refresh's drop reasons.
    pub(crate) fn refresh_started(&mut self) {
        let released = self.slots.next_generation();
        if let Err(err) = self.remove_reasons(&released) {
            log::warn!("cannot clear the drop reasons of freed slots: {err:#}");
        }
        while let Some(chunk) = self.slots.shrink() {
            if let Err(err) = self.chunks.remove(chunk) {
                log::warn!("cannot give back an empty chunk of the per-queue storage: {err:#}");
                break;
            }
        }
        self.reasons.replace(None);
    }

    fn devices_map(&self) -> anyhow::Result<BpfHashMap<&MapData, DeviceKey, DeviceEntry>> {
        Ok(BpfHashMap::try_from(self.map(MAP_DEVICES)?)?)
    }

    fn devices_map_mut(
        &mut self,
    ) -> anyhow::Result<BpfHashMap<&mut MapData, DeviceKey, DeviceEntry>> {
        Ok(BpfHashMap::try_from(self.map_mut(MAP_DEVICES)?)?)
    }

    fn queues_map(&self) -> anyhow::Result<BpfHashMap<&MapData, QueueKey, QueueSlot>> {
        Ok(BpfHashMap::try_from(self.map(MAP_QUEUES)?)?)
    }

    fn queues_map_mut(&mut self) -> anyhow::Result<BpfHashMap<&mut MapData, QueueKey, QueueSlot>> {
        Ok(BpfHashMap::try_from(self.map_mut(MAP_QUEUES)?)?)
    }

    /// Zeroes a tracked device's counters, queue state and drop reasons.
    ///
    /// # Errors
    /// When the device is not tracked or a map update fails.
    pub(crate) fn reset_device(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        let slots: Vec<u32> = self.held(key)?.queues.values().copied().collect();
        for &slot in &slots {
            self.chunks.reset(slot, QUEUE_STATE_UNKNOWN)?;
        }
        self.remove_reasons(&slots)
    }

    pub(super) fn held(&self, key: DeviceKey) -> anyhow::Result<&Held> {
        self.tracked
            .get(&key)
            .ok_or_else(|| anyhow!("device {key:?} is not tracked"))
    }

    /// The slot of queue `queue` of a tracked device, if it is counted.
    #[must_use]
    pub fn slot(&self, key: DeviceKey, queue: u32) -> Option<u32> {
        self.tracked.get(&key)?.queues.get(&queue).copied()
    }
}

/// The outcome of a map insert that must not replace: `true` when it added the key, `false`
/// when the key was there, `full` when the map is (`E2BIG`).
fn added(
    outcome: Result<(), aya::maps::MapError>,
    full: Full,
    what: &'static str,
) -> anyhow::Result<bool> {
    match outcome {
        Ok(()) => Ok(true),
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::EEXIST) =>
        {
            Ok(false)
        }
        // A hash map is full (htab_map_update_elem: E2BIG).
        Err(aya::maps::MapError::SyscallError(e))
            if e.io_error.raw_os_error() == Some(libc::E2BIG) =>
        {
            Err(full.into())
        }
        Err(err) => Err(anyhow::Error::new(err).context(what)),
    }
}
