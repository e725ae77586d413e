//! The loaded eBPF object: attach, decide which devices are tracked (`tracking`), where
//! their queues are counted (`chunks`), read their counters (`counters`), and what the
//! maps cost the kernel (`memory`).
//!
//! Each tracked queue owns a slot of the chunks, handed out by [`Slots`].

use std::collections::HashMap;

use anyhow::{Context as _, anyhow, bail};
use aya::{
    Ebpf, EbpfLoader,
    maps::{ArrayOfMaps, Map, MapData, PerCpuArray, RingBuf},
    programs::RawTracePoint,
};
use tap_probe_common::{
    CHUNK_SLOTS, DeviceKey, EVENTS_RING_BYTES, EVENTS_RING_MIN_BYTES, GLOBAL_FOLLOW_FLOWS,
    GLOBAL_KERNEL, GLOBAL_RECORD_EVENTS, GLOBAL_SAMPLE_RING, MAP_EVENTS, MAP_EVENTS_LOST,
    MAX_CHUNKS, MAX_QUEUE_SLOTS, PROG_SAMPLE_RINGS, RING_SAMPLES_EVENTS, RING_SAMPLES_EXACT,
    RING_SAMPLES_OFF,
};

use crate::bpf::backend::{Backend, Misses, Ring, Sources};
use crate::bpf::kprobe::Kprobes;
use crate::bpf::missed::ProgramMissed;
use crate::bpf::object::Object;
use crate::bpf::slots::Slots;
use crate::kernel::KernelInfo;

mod chunks;
mod counters;
mod memory;
mod tracking;

pub use counters::{DeviceCounters, RingOccupancy};
pub use memory::{MapMemory, Memory};
pub(crate) use tracking::Full;

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

/// The map aya-log's logger reads the programs' messages from (`aya_log`'s own name for it).
const AYA_LOGS: &str = "AYA_LOGS";

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
    /// The most queues counted at once (rounded up to a whole chunk of
    /// [`tap_probe_common::CHUNK_SLOTS`], at most [`tap_probe_common::MAX_QUEUE_SLOTS`]):
    /// what bounds the kernel memory the probe takes as devices come.
    pub max_queues: u32,
}

impl Counting {
    /// Every counter, no events: `watch` and what shows its counters.
    pub const WATCH: Self = Self {
        events: false,
        flows: true,
        occupancy: Occupancy::Events,
        occupancy_off: "turned off (--occupancy off)",
        macvtap: false,
        max_queues: MAX_QUEUE_SLOTS,
    };

    /// Events, and none of the counters a trace does not carry.
    pub(crate) const RECORD: Self = Self {
        events: true,
        flows: false,
        occupancy: Occupancy::Off,
        occupancy_off: "not recorded",
        macvtap: false,
        max_queues: MAX_QUEUE_SLOTS,
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
    /// The descriptor of the map the logger took, while it holds it.
    log_map: Option<std::os::fd::RawFd>,
    sources: Sources,
    /// The CPUs the kernel may bring online: the number of values of a per-CPU map entry.
    possible_cpus: usize,
    /// The devices in `DEVICES`, with the slots their queues hold.
    tracked: HashMap<DeviceKey, Held>,
    /// Slot numbers, free and taken.
    slots: Slots,
    /// The chunks behind the slots.
    chunks: chunks::Chunks,
    /// The spare slots in the programs' queue, ready for new queues.
    spares: Vec<u32>,
    /// The value last written to `GENERATION`.
    generation: u64,
    /// The kprobes attached, through links that report what they missed.
    kprobes: Kprobes,
    /// Where a kprobe's perf link reports its misses on this kernel, if it does.
    kprobe_link_missed: Option<u32>,
    /// Whether the ring sampler is loaded (rings are sampled where events are, and BTF says
    /// where they are).
    sampler: bool,
    /// The programs' count of registered devices and queues when `DEVICES` and `QUEUES`
    /// were last looked through.
    registered_seen: u64,
    /// The drop-reason breakdown as read once per refresh (see [`Probe::refresh_started`]).
    reasons: std::cell::RefCell<Option<counters::Reasons>>,
    /// The maps' kernel memory as last read, with the number of chunks then.
    memory: std::cell::RefCell<Option<(usize, Memory)>>,
}

/// A device in `DEVICES` and the slots its queues hold.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
struct Held {
    /// `DeviceEntry::flags`.
    flags: u32,
    /// Queue index to slot, for each queue counted; empty for a device left out.
    queues: std::collections::BTreeMap<u32, u32>,
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
        if !counting.flows {
            // The flow table is only read when flows are followed: one entry holds nothing.
            loader.map_max_entries(tap_probe_common::MAP_FLOWS, 1);
        }
        let mut ebpf = Object::Probe.load(&mut loader)?;
        let chunks = chunks::Chunks::new(&mut ebpf, cpus)?;
        // The rings go in before any program runs, so that no event finds its CPU's slot
        // empty.
        let (event_cpus, events) = if counting.events {
            event_rings(&mut ebpf)?
        } else {
            (Vec::new(), Vec::new())
        };
        // The logger takes its map out of the object: its descriptor, for the memory.
        let log_map = memory::descriptor(&ebpf, AYA_LOGS);
        let logger = if log_debug {
            aya_log::EbpfLogger::init(&mut ebpf)
                .map_err(|err| log::debug!("no log from the eBPF programs: {err}"))
                .ok()
        } else {
            None
        };
        let log_map = log_map.filter(|_| logger.is_some());
        let mut kprobes = Kprobes::default();
        let mut sources = crate::bpf::backend::attach(&mut ebpf, &mut kprobes, backend, kernel)?;
        sources.flows = counting.flows;
        sources.misses = Misses {
            // Asked of a loaded program: the kernel says by what it fills in.
            runs: ebpf.programs().any(|(_, program)| {
                use std::os::fd::AsFd as _;
                program.fd().is_ok_and(|fd| {
                    crate::bpf::missed::recursion_misses(fd.as_fd()).is_ok_and(|r| r.is_some())
                })
            }),
            kprobes: kernel.kprobe_link_missed.is_some() && kprobes.all_linked(),
        };
        sources.ring = ring_source(&sources.ring, &counting);
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
            log_map,
            sources,
            possible_cpus: cpus,
            tracked: HashMap::new(),
            slots: Slots::new(
                counting
                    .max_queues
                    .div_ceil(CHUNK_SLOTS)
                    .clamp(1, MAX_CHUNKS),
            ),
            chunks,
            spares: Vec::new(),
            generation: 0,
            kprobes,
            kprobe_link_missed: kernel.kprobe_link_missed,
            sampler,
            registered_seen: 0,
            reasons: std::cell::RefCell::new(None),
            memory: std::cell::RefCell::new(None),
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
                // `None`: this kernel does not count them, which the views say.
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

/// The ring's source as `counting` asks for it: off, or sampled in the mode it asks for
/// where the kernel lets the ring be sampled at all.
fn ring_source(ring: &Ring, counting: &Counting) -> Ring {
    match (ring, counting.occupancy) {
        (_, Occupancy::Off) => Ring::Unavailable(counting.occupancy_off.to_owned()),
        (Ring::Sampled { btf, .. }, mode) => Ring::Sampled {
            btf: btf.clone(),
            mode,
        },
        (Ring::Unavailable(why), _) => Ring::Unavailable(why.clone()),
    }
}
