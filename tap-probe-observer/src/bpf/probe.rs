//! The loaded eBPF object: attach, decide which devices are tracked, read their counters.
//!
//! Each tracked device owns `queues` consecutive slots of the counter map, handed out by
//! [`Slots`].

use std::collections::{BTreeMap, HashMap};

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{
        Array, ArrayOfMaps, HashMap as BpfHashMap, Map, MapData, PerCpuArray, PerCpuHashMap,
        PerCpuValues, Queue, RingBuf,
    },
    programs::{RawTracePoint, RawTracePointRunOptions, TestRun as _},
};
use tap_probe_common::{
    DEVICE_BY_PROBES, Dequeued, DeviceKey, DeviceSlot, DropKey, EVENTS_RING_BYTES,
    EVENTS_RING_MIN_BYTES, GLOBAL_FOLLOW_FLOWS, GLOBAL_KERNEL, GLOBAL_RECORD_EVENTS,
    GLOBAL_SAMPLE_RING, MAP_COUNTERS, MAP_DEQUEUED, MAP_DEVICES, MAP_DROP_REASONS, MAP_EVENTS,
    MAP_EVENTS_LOST, MAP_GENERATION, MAP_NO_ROOM, MAP_OCCUPANCY, MAP_QUEUE_STATE, MAP_READERS,
    MAP_REGISTERED, MAP_SLOT_DEV, MAP_SPARE_RANGES, MAP_SPARE_SINGLES, MAX_DEVICES,
    MAX_QUEUE_SLOTS, MAX_QUEUES_PER_DEVICE, OCCUPANCY_BUCKETS, PROG_SAMPLE_RINGS,
    QUEUE_STATE_UNKNOWN, QueueCounters, RING_SAMPLES_EVENTS, RING_SAMPLES_EXACT, RING_SAMPLES_OFF,
    ReaderState, RingSamples, SETTING_REGISTER, SPARE_RANGE_COUNT, SPARE_SINGLE_COUNT,
};

use crate::bpf::backend::{Backend, Ring, Sources};
use crate::bpf::kprobe::Kprobes;
use crate::bpf::missed::ProgramMissed;
use crate::bpf::object::Object;
use crate::bpf::slots::Slots;
use crate::kernel::KernelInfo;

/// `BPF_NOEXIST` (`include/uapi/linux/bpf.h`): an update that adds a key, never replaces.
const BPF_NOEXIST: u64 = 1;

/// Turns on the kernel's per-program run accounting (`kernel.bpf_stats_enabled`) for as long
/// as the returned descriptor is open; it costs two clock reads per program run.
///
/// # Errors
/// When the kernel refuses `BPF_ENABLE_STATS`.
pub fn enable_run_stats() -> anyhow::Result<std::os::fd::OwnedFd> {
    aya::sys::enable_stats(aya::sys::Stats::RunTime).context("enabling BPF run statistics")
}

/// One program's cost, as the kernel measured it.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ProgramStats {
    pub program: String,
    pub runs: u64,
    pub mean_ns: u64,
}

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

/// Events the programs could not write because their CPU's ring buffer was full, per CPU.
pub struct EventsLost(PerCpuArray<MapData, u64>);

impl EventsLost {
    /// The sum over CPUs.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn total(&self) -> anyhow::Result<u64> {
        Ok(self.0.get(&0, 0)?.iter().sum())
    }
}

/// Where the programs sample the tun/tap rings' occupancy (`ring_occupancy`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Occupancy {
    /// Where the queue stops and wakes, at the first full-ring drop, and once per refresh
    /// by a program the watcher runs itself: no packet pays for a sample.
    #[default]
    Events,
    /// Also at the end of every driver call and at every reader take: each sample reads
    /// the ring position the other CPU writes, a cache line that then moves between CPUs at
    /// every packet (about a quarter of a flooded tap's rate).
    Exact,
    /// Not sampled.
    Off,
}

/// What the programs count beyond the counters every use needs.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Counting {
    /// Per-packet events, for `record`.
    pub events: bool,
    /// Flows' order (`reordered`): the packet's headers at every driver call.
    pub flows: bool,
    /// Where rings are sampled.
    pub occupancy: Occupancy,
    /// Why rings are not sampled, as the sources say it, when `occupancy` is off.
    pub occupancy_off: &'static str,
    /// Also macvlan's devices (for macvtap), which the programs otherwise do not count.
    pub macvtap: bool,
}

impl Counting {
    /// Every counter, no events: `watch` and what shows its counters.
    pub const WATCH: Self = Self {
        events: false,
        flows: true,
        occupancy: Occupancy::Events,
        occupancy_off: "turned off (--occupancy off)",
        macvtap: false,
    };

    /// Events, and none of the counters a trace does not carry.
    pub(crate) const RECORD: Self = Self {
        events: true,
        flows: false,
        occupancy: Occupancy::Off,
        occupancy_off: "not recorded",
        macvtap: false,
    };
}

pub struct Probe {
    ebpf: Ebpf,
    /// The per-CPU event rings while recording, until [`Probe::take_events`] (empty
    /// otherwise).
    events: Vec<RingBuf<MapData>>,
    /// The CPU of each ring in `events`.
    event_cpus: Vec<u32>,
    /// The programs' debug messages, when the log level shows them.
    logger: Option<aya_log::EbpfLogger<&'static dyn log::Log>>,
    sources: Sources,
    cpus: usize,
    /// The devices in `DEVICES`, with the slots each holds.
    tracked: HashMap<DeviceKey, Held>,
    slots: Slots,
    /// The spare ranges in the programs' queues, ready for new devices.
    spares: Spares,
    /// The value last written to `GENERATION`.
    generation: u64,
    /// The kprobes attached, through links that report what they missed.
    kprobes: Kprobes,
    /// Where a kprobe's perf link reports its misses on this kernel, if it does.
    kprobe_link_missed: Option<u32>,
    /// Whether the ring sampler is loaded (rings are sampled where events are, and BTF says
    /// where they are).
    sampler: bool,
    /// The programs' count of registered devices when `DEVICES` was last looked through.
    registered_seen: u64,
}

/// A device in `DEVICES` and the slots it holds.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
struct Held {
    slot: DeviceSlot,
    /// The length of its range of slots (a spare multi-queue range is longer than the
    /// queues counted in it); 0 for a device left out (no slots).
    len: u32,
}

/// The bases of the spare ranges in the programs' queues (`SPARE_SINGLES`, `SPARE_RANGES`).
#[derive(Debug, Default)]
struct Spares {
    singles: Vec<u32>,
    ranges: Vec<u32>,
}

/// Who put a device into `DEVICES`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Origin {
    /// The watcher, now: the programs count it from here on.
    Loader,
    /// The programs, at its first packet since they attached (in a spare range).
    Probes,
}

impl Probe {
    /// As [`Probe::attach_backend`] with `auto`, counting what a recording needs: the
    /// programs emit per-packet [`tap_probe_common::TraceEvent`]s into the per-CPU rings that
    /// [`Probe::take_events`] hands out.
    ///
    /// # Errors
    /// As [`Probe::attach_backend`].
    pub fn attach_recording(kernel: &KernelInfo) -> anyhow::Result<Self> {
        Self::attach_backend(kernel, Backend::Auto, Counting::RECORD)
    }

    /// Loads the object and attaches the sources `backend` calls for (see
    /// [`crate::bpf::backend`]); `counting` says what the programs count.
    ///
    /// # Errors
    /// When the kernel refuses to load or attach a program (nothing stays attached then), or
    /// a forced backend is not available here.
    pub fn attach_backend(
        kernel: &KernelInfo,
        backend: Backend,
        counting: Counting,
    ) -> anyhow::Result<Self> {
        // The programs report rare anomalies with aya-log at debug level. Below that level
        // they are switched off in the object's read-only data, so the verifier prunes them.
        let log_debug = log::max_level() >= log::LevelFilter::Debug;
        let log_level: u8 = if log_debug {
            aya_log::Level::Debug.into()
        } else {
            0
        };
        let record_events = u32::from(counting.events);
        let sample_ring = match counting.occupancy {
            Occupancy::Events => RING_SAMPLES_EVENTS,
            Occupancy::Exact => RING_SAMPLES_EXACT,
            Occupancy::Off => RING_SAMPLES_OFF,
        };
        let follow_flows = u32::from(counting.flows);
        let mut facts = kernel.facts;
        let drivers = kernel.kallsyms.drivers(counting.macvtap);
        for (slot, (_, driver)) in facts.drivers.iter_mut().zip(&drivers) {
            *slot = *driver;
        }
        facts.driver_count = u32::try_from(drivers.len().min(facts.drivers.len()))?;
        let mut loader = EbpfLoader::new();
        loader
            .override_global(GLOBAL_KERNEL, &facts, true)
            .override_global(GLOBAL_RECORD_EVENTS, &record_events, true)
            .override_global(GLOBAL_SAMPLE_RING, &sample_ring, true)
            .override_global(GLOBAL_FOLLOW_FLOWS, &follow_flows, true)
            .override_global(aya_log::LEVEL, &log_level, false);
        let cpus = aya::util::nr_cpus().map_err(|(what, err)| anyhow!("{what}: {err}"))?;
        // A slot per CPU that may come online (CPU ids are below that number); the rings
        // go in only when recording, so watching holds no ring memory.
        loader.map_max_entries(MAP_EVENTS, u32::try_from(cpus)?);
        let mut ebpf = Object::Probe.load(&mut loader)?;
        // The rings go in before any program runs, so that no event finds its CPU's slot
        // empty.
        let (event_cpus, events) = if counting.events {
            event_rings(&mut ebpf)?
        } else {
            (Vec::new(), Vec::new())
        };
        let logger = if log_debug {
            aya_log::EbpfLogger::init(&mut ebpf)
                .map_err(|err| log::debug!("no log from the eBPF programs: {err}"))
                .ok()
        } else {
            None
        };
        let mut kprobes = Kprobes::default();
        let mut sources = crate::bpf::backend::attach(&mut ebpf, &mut kprobes, backend, kernel)?;
        sources.flows = counting.flows;
        match (&sources.ring, counting.occupancy) {
            (_, Occupancy::Off) => {
                sources.ring = Ring::Unavailable(counting.occupancy_off.to_owned());
            }
            (Ring::Sampled { btf, .. }, mode) => {
                sources.ring = Ring::Sampled {
                    btf: btf.clone(),
                    mode,
                };
            }
            (Ring::Unavailable(_), _) => {}
        }
        // Where every driver call and take samples, a refresh adds nothing.
        let sampler = if sources.ring_sampled() && counting.occupancy == Occupancy::Events {
            let program: &mut RawTracePoint = ebpf
                .program_mut(PROG_SAMPLE_RINGS)
                .ok_or_else(|| anyhow!("program {PROG_SAMPLE_RINGS} missing from the eBPF object"))?
                .try_into()?;
            program
                .load()
                .with_context(|| format!("loading {PROG_SAMPLE_RINGS}"))?;
            true
        } else {
            false
        };
        let mut probe = Self {
            ebpf,
            events,
            event_cpus,
            logger,
            sources,
            cpus,
            tracked: HashMap::new(),
            slots: Slots::new(MAX_QUEUE_SLOTS),
            spares: Spares::default(),
            generation: 0,
            kprobes,
            kprobe_link_missed: kernel.kprobe_link_missed,
            sampler,
            registered_seen: 0,
        };
        probe.refill_spares()?;
        Ok(probe)
    }

    /// The kernel's own accounting of each attached program: runs and time spent, which
    /// the kernel keeps while [`enable_run_stats`] is held. Programs this backend did not
    /// load are left out.
    #[must_use]
    pub fn program_stats(&self) -> Vec<ProgramStats> {
        let mut out = Vec::new();
        for (name, program) in self.ebpf.programs() {
            let Ok(info) = program.info() else {
                continue; // not loaded: this backend does not use it
            };
            let runs = info.run_count();
            let ns = u64::try_from(info.run_time().as_nanos()).unwrap_or(u64::MAX);
            out.push(ProgramStats {
                program: name.to_owned(),
                runs,
                mean_ns: ns.checked_div(runs).unwrap_or(0),
            });
        }
        out.sort_by(|a, b| a.program.cmp(&b.program));
        out
    }

    /// What the kernel skipped of each of this probe's programs since they were loaded (see
    /// [`crate::bpf::missed`]), by program name: when not 0, the counts they feed may be
    /// short. Programs this backend did not load are left out.
    #[must_use]
    pub fn missed(&self) -> Vec<ProgramMissed> {
        use std::os::fd::AsFd as _;
        let kprobes = self
            .kprobe_link_missed
            .map(|at| self.kprobes.missed(at))
            .unwrap_or_default();
        let mut out: Vec<ProgramMissed> = self
            .ebpf
            .programs()
            .filter_map(|(name, program)| {
                let runs = crate::bpf::missed::recursion_misses(program.fd().ok()?.as_fd()).ok()?;
                let kprobe = kprobes.get(name).copied();
                Some(ProgramMissed {
                    program: name.to_owned(),
                    runs,
                    kprobe,
                })
            })
            .collect();
        out.sort_by(|a, b| a.program.cmp(&b.program));
        out
    }

    /// Whether the kernel reports what this probe's kprobes missed: it does through their
    /// links, since Linux 6.7.
    #[must_use]
    pub fn reports_kprobe_misses(&self) -> bool {
        self.kprobe_link_missed.is_some() && self.kprobes.all_linked()
    }

    /// Passes the programs' messages since the last call on to the log.
    pub fn flush_log(&mut self) {
        if let Some(logger) = &mut self.logger {
            logger.flush();
        }
    }

    /// What feeds each counter.
    #[must_use]
    pub fn sources(&self) -> &Sources {
        &self.sources
    }

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

    /// Makes the slots freed before this call reusable (see [`Slots`]). Call once per
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

    fn slot_of(&self, key: DeviceKey) -> anyhow::Result<DeviceSlot> {
        self.held(key).map(|held| held.slot)
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

    /// The per-CPU ring buffers of per-packet events, with the CPU of each (once; they move
    /// out of the probe).
    ///
    /// # Errors
    /// When they were taken already, or the probe does not record.
    pub fn take_events(&mut self) -> anyhow::Result<(Vec<u32>, Vec<RingBuf<MapData>>)> {
        if self.events.is_empty() {
            bail!("the event rings were taken already, or this probe does not record");
        }
        Ok((
            std::mem::take(&mut self.event_cpus),
            std::mem::take(&mut self.events),
        ))
    }

    /// The counter slots of a tracked device: from the first, one per queue counted.
    #[must_use]
    pub fn slots(&self, key: DeviceKey) -> Option<(u32, u32)> {
        self.tracked
            .get(&key)
            .map(|held| (held.slot.base, held.slot.queues))
    }

    /// Events the programs could not write because their CPU's ring buffer was full.
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn events_lost(&self) -> anyhow::Result<u64> {
        let lost: PerCpuArray<&MapData, u64> = PerCpuArray::try_from(self.map(MAP_EVENTS_LOST)?)?;
        Ok(lost.get(&0, 0)?.iter().sum())
    }

    /// The lost-event counter, moved out of the probe so that it can still be read once the
    /// programs are detached (dropping the probe detaches them).
    ///
    /// # Errors
    /// When it was taken already.
    pub fn take_events_lost(&mut self) -> anyhow::Result<EventsLost> {
        let map = self
            .ebpf
            .take_map(MAP_EVENTS_LOST)
            .ok_or_else(|| anyhow!("the lost-event counter was taken already"))?;
        Ok(EventsLost(PerCpuArray::try_from(map)?))
    }

    fn map(&self, name: &str) -> anyhow::Result<&aya::maps::Map> {
        self.ebpf
            .map(name)
            .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))
    }

    fn map_mut(&mut self, name: &str) -> anyhow::Result<&mut aya::maps::Map> {
        self.ebpf
            .map_mut(name)
            .ok_or_else(|| anyhow!("map {name} missing from the eBPF object"))
    }
}

/// Creates a ring buffer for each online CPU and puts it in `EVENTS` at the CPU's id. The
/// rings share [`EVENTS_RING_BYTES`], each at least [`EVENTS_RING_MIN_BYTES`] (a power of
/// two, as the kernel requires). A machine may name many more possible CPUs than it runs;
/// a CPU that comes online later finds no ring, and its events are counted as lost.
fn event_rings(ebpf: &mut Ebpf) -> anyhow::Result<(Vec<u32>, Vec<RingBuf<MapData>>)> {
    let online = aya::util::online_cpus().map_err(|(what, err)| anyhow!("{what}: {err}"))?;
    let share = EVENTS_RING_BYTES / u32::try_from(online.len().max(1))?;
    let bytes = share.max(EVENTS_RING_MIN_BYTES).next_power_of_two();
    let outer = ebpf
        .map_mut(MAP_EVENTS)
        .ok_or_else(|| anyhow!("map {MAP_EVENTS} missing from the eBPF object"))?;
    let mut outer: ArrayOfMaps<&mut MapData> = ArrayOfMaps::try_from(outer)?;
    let mut rings = Vec::with_capacity(online.len());
    let cpus = online.clone();
    for cpu in online {
        let def = aya_obj::Map::new_from_params(
            aya_obj::generated::bpf_map_type::BPF_MAP_TYPE_RINGBUF as u32,
            0,
            0,
            bytes,
            0,
        );
        let ring = MapData::create(def, &format!("events_{cpu}"), None)
            .with_context(|| format!("creating the event ring of CPU {cpu} ({bytes} bytes)"))?;
        outer
            .set(cpu, &ring, 0)
            .with_context(|| format!("installing the event ring of CPU {cpu}"))?;
        rings.push(RingBuf::try_from(Map::RingBuf(ring))?);
    }
    Ok((cpus, rings))
}
