//! The host as tap-probe watches it: which devices exist, which are tracked, what each
//! refresh shows, the devices a recording follows, and the recorder that turns events into
//! a trace.

pub mod baseline;
pub mod discovery;
pub mod recorder;
pub mod recording;
pub mod report;
pub mod watcher;

use anyhow::Result;
use tap_probe_common::{DeviceKey, QueueCounters};

use crate::bpf::backend::Sources;
use crate::bpf::missed::ProgramMissed;
use crate::bpf::probe::{DeviceCounters, Origin, Probe};
use crate::kernel::modules::{ModuleChange, Modules};
use crate::os::clock::monotonic_ns;
use crate::os::netlink::LinkStats;
use discovery::{Discovery, Scan};

/// What the watcher needs from the host and from the probe, narrow enough for a test to
/// play without root: list the devices (with the kernel's statistics of each), track and
/// untrack them, and read their counters.
pub trait Host {
    /// The devices there are now: those that match the filter, and the others.
    ///
    /// # Errors
    /// When the host cannot be scanned.
    fn devices(&mut self) -> Result<Scan>;
    /// The devices the programs registered themselves, at their first packet, since the
    /// last call (once registering is on: see [`Host::start_registering`]). Their counters
    /// can be read from then on; [`Host::track`] finds them there.
    ///
    /// # Errors
    /// When the probe's maps cannot be read.
    fn registered(&mut self) -> Result<Vec<DeviceKey>>;
    /// Counts the first `queues` transmit queues of a device (`flags`: see
    /// `DeviceEntry::flags`), and any other at its first packet:
    /// from now on and from zero ([`Origin::Loader`]), or, for a device the programs
    /// registered, as they have since its first packet ([`Origin::Probes`]).
    ///
    /// # Errors
    /// When there is no room left or the maps refuse it.
    fn track(&mut self, key: DeviceKey, queues: u32, flags: u32) -> Result<Origin>;
    /// Leaves a device out: the programs neither count nor register it.
    ///
    /// # Errors
    /// When the maps refuse it.
    fn ignore(&mut self, key: DeviceKey) -> Result<()>;
    /// Stops counting a device, or forgets one left out.
    ///
    /// # Errors
    /// When the maps refuse it.
    fn untrack(&mut self, key: DeviceKey) -> Result<()>;
    /// Lets the programs register devices created from now on at their first packet.
    ///
    /// # Errors
    /// When the probe refuses it.
    fn start_registering(&mut self) -> Result<()>;
    /// Events of new devices the programs could not register (no spare slots were left):
    /// counts that are short.
    fn no_room(&self) -> u64;
    /// A tracked device's counters now.
    ///
    /// # Errors
    /// When the device is not tracked or a map cannot be read.
    fn counters(&self, key: DeviceKey) -> Result<DeviceCounters>;
    /// A tracked device's per-queue counters alone (no drop reasons): the cheap read the
    /// watcher brackets the kernel's statistics with.
    ///
    /// # Errors
    /// When the device is not tracked or a map cannot be read.
    fn queue_counters(&self, key: DeviceKey) -> Result<Vec<QueueCounters>>;
    /// Zeroes a tracked device's counters, to count again from now.
    ///
    /// # Errors
    /// When the device is not tracked or the maps refuse it.
    fn reset(&mut self, key: DeviceKey) -> Result<()>;
    /// Waits until a packet the kernel counted in the statistics just read has reached the
    /// probes' counters too (see `baseline`); `read_took` is how long reading them took.
    fn settle(&self, read_took: std::time::Duration);
    /// One device's statistics, as the kernel has them now.
    ///
    /// # Errors
    /// When the device or its namespace cannot be read.
    fn kernel_stats(&mut self, key: DeviceKey) -> Result<LinkStats>;
    /// Called at the start of each refresh: slots freed a refresh ago may be reused, and
    /// the programs' messages go to the log.
    fn refresh_started(&mut self);
    /// What feeds each counter.
    fn sources(&self) -> &Sources;
    /// `CLOCK_MONOTONIC` now, the clock of the programs' timestamps.
    fn now_ns(&self) -> u64;
    /// What the kernel skipped of each program since attach.
    fn missed(&self) -> Vec<ProgramMissed>;
    /// The modules tap-probe located at attach that changed since.
    fn module_changes(&self) -> Vec<ModuleChange>;
    /// The kernel memory the probe's maps hold; `None` where it cannot be read.
    fn memory(&self) -> Option<crate::bpf::probe::Memory>;
}

/// How long a packet the kernel counted takes at most to reach the probes: the two counts
/// are a few instructions apart on one CPU (a copy to the reader's buffer between them, at
/// the read), microseconds; as long as reading the statistics took (a system call round
/// trip, which an emulated or loaded machine slows down by the same factor), within these
/// bounds. Not longer: a baseline is exact only when no packet of the device passed during
/// the read and this wait, and a paced reader under load leaves gaps of a few hundred
/// microseconds at most.
const SETTLE_MIN: std::time::Duration = std::time::Duration::from_micros(20);
const SETTLE_MAX: std::time::Duration = std::time::Duration::from_millis(5);

/// The running host, watched by an attached probe.
pub struct LiveHost {
    pub discovery: Discovery,
    pub probe: Probe,
    /// The modules as they were when the probe attached.
    pub modules: Modules,
}

impl Host for LiveHost {
    fn devices(&mut self) -> Result<Scan> {
        self.discovery.scan()
    }

    fn registered(&mut self) -> Result<Vec<DeviceKey>> {
        self.probe.registered()
    }

    fn track(&mut self, key: DeviceKey, queues: u32, flags: u32) -> Result<Origin> {
        self.probe.track(key, queues, flags)
    }

    fn ignore(&mut self, key: DeviceKey) -> Result<()> {
        self.probe.ignore(key)
    }

    fn untrack(&mut self, key: DeviceKey) -> Result<()> {
        self.probe.untrack(key)
    }

    fn start_registering(&mut self) -> Result<()> {
        self.probe.start_registering()
    }

    fn no_room(&self) -> u64 {
        self.probe.no_room().unwrap_or_else(|err| {
            log::warn!("cannot read the count of unregistered devices' events: {err:#}");
            0
        })
    }

    fn counters(&self, key: DeviceKey) -> Result<DeviceCounters> {
        // The rings' level now, where they are sampled: no packet pays for it.
        if let Err(err) = self.probe.sample_rings(key) {
            log::debug!("sampling the rings of {key:?}: {err:#}");
        }
        self.probe.read(key)
    }

    fn queue_counters(&self, key: DeviceKey) -> Result<Vec<QueueCounters>> {
        self.probe.read_queues(key)
    }

    fn reset(&mut self, key: DeviceKey) -> Result<()> {
        self.probe.reset_device(key)
    }

    fn kernel_stats(&mut self, key: DeviceKey) -> Result<LinkStats> {
        self.discovery.link_stats(key)
    }

    fn settle(&self, read_took: std::time::Duration) {
        std::thread::sleep(read_took.clamp(SETTLE_MIN, SETTLE_MAX));
    }

    fn refresh_started(&mut self) {
        self.probe.flush_log();
        self.probe.refresh_started();
        if let Err(err) = self.probe.refill_spares() {
            log::warn!("cannot refill the spare counter slots for new devices: {err:#}");
        }
    }

    fn sources(&self) -> &Sources {
        self.probe.sources()
    }

    fn now_ns(&self) -> u64 {
        monotonic_ns()
    }

    fn missed(&self) -> Vec<ProgramMissed> {
        self.probe.missed()
    }

    fn module_changes(&self) -> Vec<ModuleChange> {
        self.modules.changes()
    }

    fn memory(&self) -> Option<crate::bpf::probe::Memory> {
        self.probe
            .memory()
            .map_err(|err| log::debug!("cannot read the maps' kernel memory: {err:#}"))
            .ok()
    }
}
