//! Keeps the tracked devices in step with the host and reads their counters.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use tap_probe_common::{DeviceKey, MAX_QUEUES_PER_DEVICE, QueueCounters};

use crate::bpf::backend::{Backend, Ring, Sources, Wakes};
use crate::bpf::missed::ProgramMissed;
use crate::bpf::probe::{Counting, DeviceCounters, Full, Occupancy, Probe};
use crate::host::baseline::{self, Baseline, counted_between};
use crate::host::discovery::{Device, Discovery, Filter, Scan};
use crate::host::report::{
    KernelAtStart, KernelDeltas, Report, Row, RowContext, Untracked, device_rows,
};
use crate::host::{Host, LiveHost};
use crate::kernel::modules::ModuleChange;
use crate::kernel::{KernelInfo, ReasonNames, TunBackpressure};

/// How long a stopped queue may go without a reader take before it is called stuck, unless
/// the watcher is told otherwise.
pub(crate) const DEFAULT_STUCK_AFTER: Duration = Duration::from_secs(1);

/// Watches the running host through an attached probe.
pub struct Watcher(Tracker<LiveHost>);

/// Keeps the tracked devices in step with a [`Host`] and reads their counters.
pub(crate) struct Tracker<H> {
    host: H,
    names: ReasonNames,
    /// How this kernel's tun answers a full ring; `None` when unknown.
    backpressure: Option<TunBackpressure>,
    stuck_after: Duration,
    started: Instant,
    devices: HashMap<DeviceKey, Tracked>,
    /// Devices that match but are not tracked, and why.
    untracked: HashMap<DeviceKey, Untracked>,
    /// The probe's tables were full at the last attempt; nothing was untracked since, so
    /// there is no point in trying again.
    full: bool,
    /// The module changes already warned about.
    warned: Vec<ModuleChange>,
    /// Devices the programs are told to skip: the filter leaves them out.
    ignored: HashSet<DeviceKey>,
    /// Devices the programs registered at their first packet that no scan has found yet
    /// (their namespace was not read).
    pending: HashSet<DeviceKey>,
    /// Every device a scan found since attach.
    seen: HashSet<DeviceKey>,
    /// The namespaces a scan listed since attach, and those it could read.
    namespaces_listed: HashSet<u32>,
    namespaces_read: HashSet<u32>,
    /// Whether the programs registered new devices since before the last scan: a device
    /// no scan saw before, in a namespace read before or in a new one, was then created
    /// since, and counted from its first packet.
    births_counted: bool,
}

struct Tracked {
    device: Device,
    /// The kernel's counters when tracking began (zero for a device tracked from birth).
    baseline: Baseline,
    /// Tracked since the device's first packet: its creation came after attach, and the
    /// programs registered it then.
    from_birth: bool,
    /// The last deltas read, kept for the retirement row.
    kernel: KernelDeltas,
    /// Per queue: `consumed` as last read, and when it last changed (`CLOCK_MONOTONIC` ns;
    /// tracking's start before the first take).
    takes: Vec<(u64, u64)>,
    /// When tracking began (`CLOCK_MONOTONIC` ns).
    since_ns: u64,
}

impl Tracked {
    /// Per queue: stopped, with no reader take for at least `after`. A take is seen as a
    /// change of `consumed` between refreshes, so the judgement is as fine as the refresh
    /// interval, and costs the programs nothing.
    fn stuck(&mut self, counters: &DeviceCounters, now_ns: u64, after: Duration) -> Vec<bool> {
        let after = u64::try_from(after.as_nanos()).unwrap_or(u64::MAX);
        self.takes.resize(counters.queues.len(), (0, self.since_ns));
        counters
            .queues
            .iter()
            .zip(&counters.stopped_since)
            .zip(&mut self.takes)
            .map(|((c, stopped), (consumed, at))| {
                if c.consumed != *consumed {
                    *consumed = c.consumed;
                    *at = now_ns;
                }
                stopped.is_some_and(|stop| now_ns.saturating_sub(stop.max(*at)) >= after)
            })
            .collect()
    }
}

impl Watcher {
    /// Attaches the probes of `backend`.
    ///
    /// # Errors
    /// When the programs cannot be attached, or a forced backend is not available.
    pub fn with_backend(
        kernel: &KernelInfo,
        filter: &Filter,
        backend: Backend,
    ) -> anyhow::Result<Self> {
        Self::with_occupancy(kernel, filter, backend, Occupancy::default())
    }

    /// Attaches the probes of `backend`, sampling the rings where `occupancy` says.
    ///
    /// # Errors
    /// As [`Watcher::with_backend`].
    pub fn with_occupancy(
        kernel: &KernelInfo,
        filter: &Filter,
        backend: Backend,
        occupancy: Occupancy,
    ) -> anyhow::Result<Self> {
        Self::counting(
            kernel,
            filter,
            backend,
            Counting {
                occupancy,
                macvtap: filter.macvtap,
                ..Counting::WATCH
            },
        )
    }

    /// Attaches the probes of `backend`, counting what `counting` says.
    ///
    /// # Errors
    /// As [`Watcher::with_backend`].
    pub fn counting(
        kernel: &KernelInfo,
        filter: &Filter,
        backend: Backend,
        counting: Counting,
    ) -> anyhow::Result<Self> {
        let host = LiveHost {
            discovery: Discovery::new(filter)?,
            probe: Probe::attach_backend(kernel, backend, counting)?,
            modules: kernel.modules.clone(),
        };
        let mut tracker = Tracker::on(host, kernel.drop_reasons.clone());
        tracker.backpressure = kernel.tun_backpressure;
        Ok(Self(tracker))
    }

    /// A stopped queue whose reader takes nothing for `after` is called stuck (default
    /// [`DEFAULT_STUCK_AFTER`]).
    pub fn set_stuck_after(&mut self, after: Duration) {
        self.0.stuck_after = after;
    }

    /// What each attached program cost so far (see [`crate::bpf::probe::enable_run_stats`]).
    #[must_use]
    pub fn program_stats(&self) -> Vec<crate::bpf::probe::ProgramStats> {
        self.0.host.probe.program_stats()
    }

    /// Runs of the attached programs the kernel skipped, and hits of their kprobes that
    /// ran nothing (see [`crate::bpf::missed`]); when not 0, counts may be short. Kernels
    /// before 6.7 do not count the kprobes' skips.
    #[must_use]
    pub fn missed_runs(&self) -> u64 {
        self.0.host.missed().iter().map(ProgramMissed::total).sum()
    }

    /// Whether some counters come from kprobes while the kernel does not report their
    /// kprobes' own misses (before Linux 6.7): those counts may then be short unsaid.
    #[must_use]
    pub fn kprobe_misses_unreported(&self) -> bool {
        self.sources().uses_kprobes() && !self.0.host.probe.reports_kprobe_misses()
    }

    /// What feeds each counter.
    #[must_use]
    pub fn sources(&self) -> &crate::bpf::backend::Sources {
        self.0.host.probe.sources()
    }

    /// Rescans the host, tracks new devices, retires vanished ones (reported once more,
    /// marked), and reads every counter.
    ///
    /// # Errors
    /// When the scan or a map read fails.
    pub fn refresh(&mut self) -> anyhow::Result<Report> {
        self.0.refresh()
    }

    /// The error text for a filter that matches nothing: what exists instead.
    ///
    /// # Errors
    /// When the host cannot be scanned.
    pub fn nothing_matches(&mut self) -> anyhow::Result<String> {
        let all = self.0.host.discovery.describe_all()?;
        let mut text = String::from("no tun, tap, veth or macvtap device matches the filter");
        let refused = self.0.host.discovery.refused();
        if !refused.is_empty() {
            let _ = write!(
                text,
                "; {} network namespaces could not be entered, their devices are not seen ({}; \
                 entering one needs CAP_SYS_ADMIN)",
                refused.len(),
                refused.join("; ")
            );
        }
        if all.is_empty() && refused.is_empty() {
            text.push_str("; this host has none (start a VM, or try `tap-probe demo`)");
        } else {
            text.push_str("; devices present:");
            for d in all {
                let _ = write!(text, "\n  {} (netns {}, {:?})", d.name, d.netns, d.kind);
            }
            text.push_str("\npass --dev GLOB / --netns NAME to match one of them, or --wait");
        }
        Ok(text)
    }
}

impl<H: Host> Tracker<H> {
    /// Watches `host`, naming drop reasons with `names`.
    pub(crate) fn on(host: H, names: ReasonNames) -> Self {
        Self {
            host,
            names,
            backpressure: None,
            stuck_after: DEFAULT_STUCK_AFTER,
            started: Instant::now(),
            devices: HashMap::new(),
            untracked: HashMap::new(),
            full: false,
            warned: Vec::new(),
            ignored: HashSet::new(),
            pending: HashSet::new(),
            seen: HashSet::new(),
            namespaces_listed: HashSet::new(),
            namespaces_read: HashSet::new(),
            births_counted: false,
        }
    }
}

impl<H: Host> Tracker<H> {
    /// Rescans the host, starts tracking new devices, retires vanished ones, and reads every
    /// counter. Retired devices appear once more, marked, with their last counters.
    ///
    /// The first refresh tracks every device there is: each began before tracking (its
    /// kernel counters at that moment are its baseline). Then the programs register any
    /// other device at its first packet, and a second look tracks the devices created
    /// between the first one and that moment, mid-life too. A device found by a later
    /// refresh was created since, and is counted from its first packet.
    ///
    /// # Errors
    /// When the scan or a map read fails.
    pub(crate) fn refresh(&mut self) -> anyhow::Result<Report> {
        self.host.refresh_started();
        if !self.births_counted {
            self.pass()?;
            self.host.start_registering()?;
            let report = self.pass()?;
            self.births_counted = true;
            return Ok(report);
        }
        self.pass()
    }

    /// One look at the host: see [`Tracker::refresh`].
    #[expect(
        clippy::too_many_lines,
        reason = "one refresh: retire, leave out, track, read, in the order the baseline needs"
    )]
    fn pass(&mut self) -> anyhow::Result<Report> {
        // The probes' counters before the kernel's statistics are read, and again after: what
        // they counted in between bounds how far the two may be off (see `baseline`).
        // Registered before the scan: a scan that does not find one of these finds it gone.
        self.pending.extend(self.host.registered()?);
        let before: HashMap<DeviceKey, Vec<QueueCounters>> = self
            .devices
            .keys()
            .chain(self.pending.iter())
            .filter_map(|&key| Some((key, self.host.queue_counters(key).ok()?)))
            .collect();
        let scanned_at = std::time::Instant::now();
        let Scan {
            matching,
            left_out,
            namespaces,
        } = self.host.devices()?;
        // The statistics were read with the scan; what the kernel had counted by then reaches
        // the probes before their counters are read below (see `baseline`).
        self.host.settle(scanned_at.elapsed());

        let now_ns = self.host.now_ns();
        let mut rows = Vec::new();
        let current: HashMap<DeviceKey, Device> =
            matching.into_iter().map(|d| (d.key, d)).collect();
        let left_out: HashSet<DeviceKey> = left_out.into_iter().collect();
        let read = |key: &DeviceKey| namespaces.get(&key.netns_inode).copied().unwrap_or(false);
        self.untracked.retain(|key, _| current.contains_key(key));
        let gone: Vec<DeviceKey> = self
            .devices
            .keys()
            .filter(|k| !current.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            self.retire(key, now_ns, &mut rows);
        }
        // The devices the filter leaves out: the programs skip them (and do not register
        // them at their first packet). Those gone are forgotten.
        for key in self.ignored.clone() {
            if read(&key) && !left_out.contains(&key) || !namespaces.contains_key(&key.netns_inode)
            {
                self.forget(key);
            }
        }
        for &key in &left_out {
            if !self.ignored.contains(&key) {
                match self.host.ignore(key) {
                    Ok(()) => {
                        self.ignored.insert(key);
                        self.pending.remove(&key);
                    }
                    Err(err) => log::warn!("cannot leave device {key:?} out: {err:#}"),
                }
            }
        }
        // Registered by the programs, and gone before any scan found them: nothing can name
        // them any more.
        for key in self.pending.clone() {
            if read(&key) && !current.contains_key(&key) && !left_out.contains(&key) {
                log::info!(
                    "a device (ifindex {} in namespace {}) came and went between two \
                     refreshes; its counts are not shown",
                    key.ifindex,
                    key.netns_inode
                );
                self.forget(key);
            }
        }
        let mut newly_untracked = Vec::new();
        let mut born = Vec::new();
        for (key, device) in current {
            // For a device tracked mid-life in this refresh, the kernel's statistics of the
            // row are its baseline, and the probes' counters read right after it bracket
            // them; one tracked from birth counts as the kernel has since its creation.
            let mut fresh = None;
            let mut from_zero = false;
            let tracked = match self.devices.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let t = e.into_mut();
                    t.device = device;
                    t
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    let since_birth = self.births_counted
                        && !self.seen.contains(&key)
                        && (self.namespaces_read.contains(&key.netns_inode)
                            || !self.namespaces_listed.contains(&key.netns_inode));
                    match start_tracking(&mut self.host, key, &device, self.full, since_birth) {
                        Ok((baseline, after)) => {
                            if since_birth {
                                // Bracketed from zero, unless the counters were read before
                                // the scan: all they counted may have passed since.
                                from_zero = !before.contains_key(&key);
                            }
                            self.untracked.remove(&key);
                            self.pending.remove(&key);
                            fresh = after;
                            if since_birth {
                                born.push(key);
                            }
                            e.insert(Tracked {
                                device,
                                baseline,
                                from_birth: since_birth,
                                kernel: KernelDeltas::default(),
                                takes: Vec::new(),
                                since_ns: now_ns,
                            })
                        }
                        Err(err) => {
                            self.full |= err.is::<Full>();
                            if !self.untracked.contains_key(&key) {
                                newly_untracked.push(device.name.clone());
                            }
                            self.untracked.insert(
                                key,
                                Untracked {
                                    ifname: device.name,
                                    netns: device.netns,
                                    reason: format!("{err:#}"),
                                },
                            );
                            continue;
                        }
                    }
                }
            };
            let counters = match self.host.counters(key) {
                Ok(counters) => counters,
                Err(err) => {
                    log::warn!(
                        "cannot read the counters of {} (netns {}): {err:#}",
                        tracked.device.name,
                        tracked.device.netns
                    );
                    continue;
                }
            };
            let before = before
                .get(&key)
                .map(Vec::as_slice)
                .or(from_zero.then_some(&[][..]));
            let kernel = kernel_deltas(tracked, fresh.as_deref(), before, &counters);
            tracked.kernel = kernel;
            let stuck = tracked.stuck(&counters, now_ns, self.stuck_after);
            let context = context(self.host.sources(), self.backpressure, tracked, false);
            rows.extend(device_rows(
                &tracked.device,
                &counters,
                kernel,
                &self.names,
                now_ns,
                context,
                &stuck,
            ));
        }
        for key in born {
            log::info!(
                "{} (netns {}) appeared; counted from its first packet",
                self.devices[&key].device.name,
                self.devices[&key].device.netns
            );
        }
        self.seen.extend(self.devices.keys().copied());
        self.seen.extend(left_out.iter().copied());
        self.seen.extend(self.untracked.keys().copied());
        for (&inode, &was_read) in &namespaces {
            self.namespaces_listed.insert(inode);
            if was_read {
                self.namespaces_read.insert(inode);
            }
        }
        if !newly_untracked.is_empty() {
            warn_untracked(&newly_untracked, self.untracked.len());
        }
        rows.sort_by(|a, b| (&a.netns, &a.ifname, a.queue).cmp(&(&b.netns, &b.ifname, b.queue)));
        let mut untracked: Vec<Untracked> = self.untracked.values().cloned().collect();
        untracked.sort_by(|a, b| (&a.netns, &a.ifname).cmp(&(&b.netns, &b.ifname)));
        let modules_changed = self.host.module_changes();
        for change in &modules_changed {
            if !self.warned.contains(change) {
                log::warn!(
                    "{change} since tap-probe attached: its functions were located at attach, \
                     so its devices may be counted wrongly or not at all; restart tap-probe"
                );
                self.warned.push(change.clone());
            }
        }
        Ok(Report {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            sources: self.host.sources().clone(),
            programs: None,
            rows,
            untracked,
            missed: self.host.missed(),
            no_room: self.host.no_room(),
            modules_changed,
        })
    }

    /// Forgets a device that is gone or left out: the programs' entry for it goes.
    fn forget(&mut self, key: DeviceKey) {
        self.ignored.remove(&key);
        self.pending.remove(&key);
        if let Err(err) = self.host.untrack(key) {
            log::warn!("forgetting device {key:?}: {err:#}");
        }
        self.full = false;
    }
}

/// What the rows of `device` carry besides its counters, from what feeds them (`sources`)
/// and how this kernel's tun answers a full ring (`mode`).
fn context(
    sources: &Sources,
    mode: Option<TunBackpressure>,
    tracked: &Tracked,
    retired: bool,
) -> RowContext {
    let device = &tracked.device;
    let backpressure = if device.kind.is_tun() {
        match mode {
            Some(TunBackpressure::OptIn) => device
                .tun_flags
                .map(|flags| TunBackpressure::OptIn.of_tap(flags)),
            Some(mode) => Some(mode.of_tap(0)),
            None => None,
        }
    } else {
        None
    };
    RowContext {
        backpressure,
        ring: device.kind.is_tun() && matches!(sources.ring, Ring::Sampled { .. }),
        wake_sources: matches!(sources.wakes, Wakes::Callers(_)),
        flows: sources.flows,
        retired,
        from_birth: tracked.from_birth,
        at_start: KernelAtStart {
            tx_packets: tracked.baseline.tx_packets,
            tx_dropped: tracked.baseline.tx_dropped,
        },
    }
}

impl<H: Host> Tracker<H> {
    /// A device is gone: its last row, marked, and its slots given back.
    fn retire(&mut self, key: DeviceKey, now_ns: u64, rows: &mut Vec<Row>) {
        let Some(mut tracked) = self.devices.remove(&key) else {
            return;
        };
        // Read before untracking: the slots are zeroed on reuse, not on removal.
        match self.host.counters(key) {
            Ok(counters) => {
                let stuck = tracked.stuck(&counters, now_ns, self.stuck_after);
                rows.extend(device_rows(
                    &tracked.device,
                    &counters,
                    tracked.kernel,
                    &self.names,
                    now_ns,
                    context(self.host.sources(), self.backpressure, &tracked, true),
                    &stuck,
                ));
            }
            Err(err) => log::warn!(
                "cannot read the last counters of {} (netns {}): {err:#}",
                tracked.device.name,
                tracked.device.netns
            ),
        }
        if let Err(err) = self.host.untrack(key) {
            log::warn!("untracking {}: {err:#}", tracked.device.name);
        }
        self.full = false;
        log::info!(
            "{} (netns {}) is gone; retired",
            tracked.device.name,
            tracked.device.netns
        );
    }
}

/// The kernel's statistics of a device as deltas since its baseline, and how far they may be
/// off from `counters`: for a device tracked in this refresh (`fresh`: the probes' counters
/// read right after its baseline) they are the baseline itself; for the others, the
/// statistics of this refresh's scan, read after `before`.
fn kernel_deltas(
    tracked: &Tracked,
    fresh: Option<&[QueueCounters]>,
    before: Option<&[QueueCounters]>,
    counters: &DeviceCounters,
) -> KernelDeltas {
    let counted = |from: &[QueueCounters]| counted_between(from, &counters.queues);
    match fresh {
        Some(after) => KernelDeltas {
            tx_packets: 0,
            tx_dropped: 0,
            skew: tracked.baseline.skew + counted(after),
        },
        None => KernelDeltas {
            tx_packets: tracked
                .device
                .stats
                .tx_packets
                .saturating_sub(tracked.baseline.tx_packets),
            tx_dropped: tracked
                .device
                .stats
                .tx_dropped
                .saturating_sub(tracked.baseline.tx_dropped),
            skew: tracked.baseline.skew + before.map_or(0, counted),
        },
    }
}

/// Starts counting a device and reads the kernel's baseline for it; `full` says the probe's
/// tables were full at the last attempt, so it is not tried.
///
/// # Errors
/// [`Full`] when there is no room, or why tracking or the baseline failed (the device is then
/// not tracked).
fn start_tracking(
    host: &mut impl Host,
    key: DeviceKey,
    device: &Device,
    full: bool,
    from_birth: bool,
) -> anyhow::Result<(Baseline, Option<Vec<QueueCounters>>)> {
    if full {
        return Err(Full::Devices.into());
    }
    // A multi-queue tap has 256 queues whatever number is attached; count the first
    // MAX_QUEUES_PER_DEVICE (the eBPF side ignores queues beyond).
    let origin = host.track(
        key,
        device.queues.clamp(1, MAX_QUEUES_PER_DEVICE),
        device.slot_flags(),
    )?;
    if from_birth {
        // Created since the programs began registering devices: they have counted it since
        // its first packet (`Origin::Probes`), or it has sent none yet (`Origin::Loader`),
        // and the kernel's statistics began at zero with it.
        log::debug!("{} tracked from birth ({origin:?})", device.name);
        return Ok((Baseline::default(), None));
    }
    baseline::take(host, key)
        .map(|(baseline, after)| (baseline, Some(after)))
        .inspect_err(|_| {
            let _ = host.untrack(key);
        })
}

/// Says once which devices became untracked, without a line per device when thousands are.
fn warn_untracked(names: &[String], total: usize) {
    const SHOWN: usize = 8;
    let mut list = names[..names.len().min(SHOWN)].join(", ");
    if names.len() > SHOWN {
        let _ = write!(list, " and {} more", names.len() - SHOWN);
    }
    log::warn!(
        "not tracking {list} ({total} devices untracked in all; see `untracked` in the report): \
         the probe's tables are full or the devices could not be added; they are tracked as \
         soon as room is made"
    );
}

#[cfg(test)]
pub(crate) mod tests {
    use std::cell::RefCell;
    use std::collections::BTreeMap;

    use tap_probe_common::QueueCounters;

    use super::*;
    use crate::bpf::backend::Sources;
    use crate::bpf::probe::{DeviceCounters, Origin, RingOccupancy};
    use crate::host::discovery::DeviceKind;
    use crate::os::netlink::LinkStats;

    /// A host whose devices and counters the test sets, and which records what the
    /// tracker asked of it (the recording's tests use it too).
    pub(crate) struct FakeHost {
        pub(crate) devices: Vec<Device>,
        /// Devices of the counted drivers that the filter leaves out.
        left_out: Vec<DeviceKey>,
        /// Devices the programs registered at their first packet (once registering).
        registered: Vec<DeviceKey>,
        registering: bool,
        /// Devices the programs were told to skip.
        ignored: Vec<DeviceKey>,
        counters: HashMap<DeviceKey, DeviceCounters>,
        tracked: HashMap<DeviceKey, u32>,
        /// Every call, in order: `refresh`, `track IFINDEX N`, `untrack IFINDEX`.
        pub(crate) calls: Vec<String>,
        now_ns: u64,
        sources: Sources,
        /// How many devices the probe has room for.
        pub(crate) room: usize,
        wire: RefCell<Option<Wire>>,
        /// What the kernel skipped of each program, as the next reads find it.
        missed: Vec<ProgramMissed>,
        modules: Vec<ModuleChange>,
    }

    /// Traffic on one device while the tracker works: each call into the host lets the next
    /// number of `per_call` packets (cycling) through, which the kernel counts and, once the
    /// device is tracked, the probes too (as takes by the reader).
    struct Wire {
        key: DeviceKey,
        per_call: Vec<u64>,
        calls: usize,
        kernel: u64,
        ours: u64,
        /// Each packet reaches the probes only at the next `settle`, after the kernel
        /// counted it (as tun counts `tx_packets` before the reader's free).
        lag: bool,
        /// Counted by the kernel, not yet by the probes.
        in_flight: u64,
    }

    impl FakeHost {
        fn tick(&self) {
            if let Some(w) = self.wire.borrow_mut().as_mut() {
                let n = w.per_call[w.calls % w.per_call.len()];
                w.calls += 1;
                w.kernel += n;
                if w.lag {
                    w.in_flight += n;
                } else if self.tracked.contains_key(&w.key) {
                    w.ours += n;
                }
            }
        }

        /// The packets in flight reach the probes (counted then if the device is tracked).
        fn land(&self) {
            if let Some(w) = self.wire.borrow_mut().as_mut() {
                if self.tracked.contains_key(&w.key) {
                    w.ours += w.in_flight;
                }
                w.in_flight = 0;
            }
        }

        /// The kernel's extra count of `key`, and the probes'.
        fn on_wire(&self, key: DeviceKey) -> (u64, u64) {
            self.wire
                .borrow()
                .as_ref()
                .filter(|w| w.key == key)
                .map_or((0, 0), |w| (w.kernel, w.ours))
        }

        fn stats(&self, key: DeviceKey) -> Option<LinkStats> {
            let mut stats = self.devices.iter().find(|d| d.key == key)?.stats;
            stats.tx_packets += self.on_wire(key).0;
            Some(stats)
        }
    }

    impl FakeHost {
        pub(crate) fn new() -> Self {
            Self {
                devices: Vec::new(),
                left_out: Vec::new(),
                registered: Vec::new(),
                registering: false,
                ignored: Vec::new(),
                counters: HashMap::new(),
                tracked: HashMap::new(),
                calls: Vec::new(),
                now_ns: 1_000_000_000,
                sources: crate::host::report::tests::sources(),
                room: usize::MAX,
                wire: RefCell::new(None),
                missed: Vec::new(),
                modules: Vec::new(),
            }
        }
    }

    impl Host for FakeHost {
        fn devices(&mut self) -> anyhow::Result<Scan> {
            self.tick();
            let matching: Vec<Device> = self
                .devices
                .iter()
                .map(|d| Device {
                    stats: self.stats(d.key).unwrap(),
                    ..d.clone()
                })
                .collect();
            let namespaces = matching
                .iter()
                .map(|d| d.key.netns_inode)
                .chain(self.left_out.iter().map(|k| k.netns_inode))
                .chain([7])
                .map(|ns| (ns, true))
                .collect();
            Ok(Scan {
                matching,
                left_out: self.left_out.clone(),
                namespaces,
            })
        }

        fn registered(&mut self) -> anyhow::Result<Vec<DeviceKey>> {
            let new: Vec<DeviceKey> = self
                .registered
                .iter()
                .filter(|k| !self.tracked.contains_key(k))
                .copied()
                .collect();
            for key in &new {
                self.tracked.insert(*key, 1);
            }
            Ok(new)
        }

        fn track(&mut self, key: DeviceKey, queues: u32, _flags: u32) -> anyhow::Result<Origin> {
            self.tick();
            if self.tracked.contains_key(&key) {
                self.calls.push(format!("adopt {}", key.ifindex));
                return Ok(Origin::Probes);
            }
            if self.tracked.len() >= self.room {
                self.calls.push(format!("full {}", key.ifindex));
                return Err(Full::Devices.into());
            }
            self.calls.push(format!("track {} {queues}", key.ifindex));
            self.tracked.insert(key, queues);
            Ok(Origin::Loader)
        }

        fn ignore(&mut self, key: DeviceKey) -> anyhow::Result<()> {
            self.calls.push(format!("ignore {}", key.ifindex));
            self.tracked.remove(&key);
            self.ignored.push(key);
            Ok(())
        }

        fn untrack(&mut self, key: DeviceKey) -> anyhow::Result<()> {
            self.calls.push(format!("untrack {}", key.ifindex));
            self.tracked.remove(&key);
            self.ignored.retain(|k| *k != key);
            Ok(())
        }

        fn start_registering(&mut self) -> anyhow::Result<()> {
            self.calls.push("registering".to_owned());
            self.registering = true;
            Ok(())
        }

        fn no_room(&self) -> u64 {
            0
        }

        fn counters(&self, key: DeviceKey) -> anyhow::Result<DeviceCounters> {
            let queues = *self
                .tracked
                .get(&key)
                .ok_or_else(|| anyhow::anyhow!("{key:?} is not tracked"))?;
            self.tick();
            let mut counters = self.counters.get(&key).cloned().unwrap_or_default();
            let queues = usize::try_from(queues).unwrap();
            counters.queues.resize(queues, QueueCounters::default());
            counters.stopped_since.resize(queues, None);
            counters.occupancy.resize(queues, RingOccupancy::default());
            counters.queues[0].consumed += self.on_wire(key).1;
            Ok(counters)
        }

        fn queue_counters(&self, key: DeviceKey) -> anyhow::Result<Vec<QueueCounters>> {
            Ok(self.counters(key)?.queues)
        }

        fn reset(&mut self, key: DeviceKey) -> anyhow::Result<()> {
            self.calls.push(format!("reset {}", key.ifindex));
            self.counters.remove(&key);
            if let Some(w) = self.wire.get_mut().as_mut().filter(|w| w.key == key) {
                w.ours = 0;
            }
            Ok(())
        }

        fn kernel_stats(&mut self, key: DeviceKey) -> anyhow::Result<LinkStats> {
            self.tick();
            self.stats(key)
                .ok_or_else(|| anyhow::anyhow!("no device {key:?}"))
        }

        fn settle(&self, _read_took: std::time::Duration) {
            self.land();
        }

        fn refresh_started(&mut self) {
            self.calls.push("refresh".to_owned());
            // Between refreshes, whatever the kernel counted has reached the probes.
            self.land();
        }

        fn sources(&self) -> &Sources {
            &self.sources
        }

        fn now_ns(&self) -> u64 {
            self.now_ns
        }

        fn missed(&self) -> Vec<ProgramMissed> {
            self.missed.clone()
        }

        fn module_changes(&self) -> Vec<ModuleChange> {
            self.modules.clone()
        }
    }

    pub(crate) fn device(ifindex: u32, name: &str, tx_packets: u64, tx_dropped: u64) -> Device {
        Device {
            key: DeviceKey {
                netns_inode: 7,
                ifindex,
            },
            name: name.to_owned(),
            netns: "ns".to_owned(),
            kind: DeviceKind::Tap,
            queues: 1,
            active_queues: 1,
            tx_queue_len: 1000,
            owners: Vec::new(),
            stats: LinkStats {
                tx_packets,
                tx_dropped,
                ..LinkStats::default()
            },
            tun_flags: Some(0x1002),
        }
    }

    fn consumed(n: u64) -> DeviceCounters {
        DeviceCounters {
            queues: vec![QueueCounters {
                consumed: n,
                ..QueueCounters::default()
            }],
            stopped_since: vec![None],
            occupancy: vec![RingOccupancy::default()],
            drop_reasons: BTreeMap::new(),
        }
    }

    fn tracker() -> Tracker<FakeHost> {
        Tracker::on(FakeHost::new(), ReasonNames::default())
    }

    const TAP0: DeviceKey = DeviceKey {
        netns_inode: 7,
        ifindex: 3,
    };

    /// A device there at attach began before tracking: the kernel's counters then are its
    /// baseline, shown as `kernel.*_at_start`, and the rows show the growth since.
    #[test]
    fn a_device_there_at_attach_is_tracked_mid_life() {
        let mut t = tracker();
        t.host.devices = vec![device(3, "tap0", 100, 40)];
        let rows = t.refresh().unwrap().rows;
        assert_eq!(t.host.tracked.get(&TAP0), Some(&1));
        assert_eq!(rows.len(), 1);
        assert!(!rows[0].from_birth);
        assert_eq!(
            (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
            (0, 0)
        );
        assert_eq!(
            (
                rows[0].kernel_at_start.tx_packets,
                rows[0].kernel_at_start.tx_dropped
            ),
            (100, 40)
        );
        // Later the kernel's counters have grown: the rows show the growth since tracking.
        t.host.devices = vec![device(3, "tap0", 150, 45)];
        t.host.counters.insert(TAP0, consumed(50));
        let rows = t.refresh().unwrap().rows;
        assert_eq!(
            (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
            (50, 5)
        );
        assert_eq!(rows[0].counters.consumed, 50);
        assert!(!rows[0].retired);
        let tracks = t
            .host
            .calls
            .iter()
            .filter(|c| c.starts_with("track"))
            .count();
        assert_eq!(tracks, 1, "tracked once: {:?}", t.host.calls);
        // The programs register new devices only once every device there was tracked.
        let registering = t.host.calls.iter().position(|c| c == "registering");
        let tracked = t.host.calls.iter().position(|c| c == "track 3 1");
        assert!(tracked < registering, "{:?}", t.host.calls);
    }

    /// A device created after attach is counted from its first packet: the programs
    /// registered it, the watcher takes it over without zeroing anything, and the kernel's
    /// counters count from zero, all of them.
    #[test]
    fn a_device_created_after_attach_is_counted_from_birth() {
        let mut t = tracker();
        assert!(t.refresh().unwrap().rows.is_empty());
        assert!(t.host.registering);
        // It sent 100 packets before this refresh, which the programs counted.
        t.host.registered = vec![TAP0];
        t.host.devices = vec![device(3, "tap0", 100, 40)];
        t.host.counters.insert(TAP0, consumed(100));
        let rows = t.refresh().unwrap().rows;
        assert_eq!(rows.len(), 1);
        assert!(rows[0].from_birth);
        assert_eq!(
            (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
            (100, 40)
        );
        assert_eq!(rows[0].kernel_at_start, KernelAtStart::default());
        assert_eq!(rows[0].counters.consumed, 100);
        assert!(
            !t.host.calls.iter().any(|c| c.starts_with("reset")),
            "nothing the programs counted is zeroed: {:?}",
            t.host.calls
        );
        assert!(t.host.calls.contains(&"adopt 3".to_owned()));
        // A quiet one (no packet yet, so not registered) is from birth too.
        t.host.devices.push(device(4, "tap1", 0, 0));
        let rows = t.refresh().unwrap().rows;
        assert!(rows.iter().all(|r| r.from_birth), "{rows:?}");
    }

    /// Devices the filter leaves out are skipped by the programs (so not registered), and
    /// forgotten once gone; one registered before the watcher knew is left out too.
    #[test]
    fn devices_left_out_are_skipped_and_forgotten_once_gone() {
        let mut t = tracker();
        let other = DeviceKey {
            netns_inode: 7,
            ifindex: 9,
        };
        t.host.left_out = vec![other];
        t.refresh().unwrap();
        assert_eq!(t.host.ignored, [other]);
        let ignores = |t: &Tracker<FakeHost>| {
            t.host
                .calls
                .iter()
                .filter(|c| c.starts_with("ignore"))
                .count()
        };
        let once = ignores(&t);
        t.refresh().unwrap();
        assert_eq!(ignores(&t), once, "left out once");
        t.host.left_out.clear();
        t.refresh().unwrap();
        assert!(t.host.ignored.is_empty());
        assert!(t.host.calls.contains(&"untrack 9".to_owned()));
        // Registered by the programs, then found left out by the filter.
        t.host.registered = vec![other];
        t.host.left_out = vec![other];
        let report = t.refresh().unwrap();
        assert!(report.rows.is_empty());
        assert_eq!(t.host.ignored, [other]);
        assert!(!t.host.tracked.contains_key(&other));
    }

    /// A device registered by the programs that came and went between two refreshes, in a
    /// namespace that was read, is forgotten: its slots go back.
    #[test]
    fn a_device_gone_before_any_scan_found_it_is_forgotten() {
        let mut t = tracker();
        t.refresh().unwrap();
        t.host.registered = vec![TAP0];
        t.refresh().unwrap();
        assert!(!t.host.tracked.contains_key(&TAP0));
        assert!(t.host.calls.contains(&"untrack 3".to_owned()));
        assert!(t.pending.is_empty());
    }

    #[test]
    fn a_gone_device_is_reported_once_more_with_its_last_counters_then_forgotten() {
        let mut t = tracker();
        let key = DeviceKey {
            netns_inode: 7,
            ifindex: 3,
        };
        t.host.devices = vec![device(3, "tap0", 10, 0), device(4, "tap1", 0, 0)];
        t.refresh().unwrap();
        t.host.devices = vec![device(3, "tap0", 30, 0), device(4, "tap1", 0, 0)];
        t.host.counters.insert(key, consumed(20));
        t.refresh().unwrap();
        // tap0 goes; its slots still hold its last counters.
        t.host.devices = vec![device(4, "tap1", 0, 0)];
        t.host.counters.insert(key, consumed(25));
        let rows = t.refresh().unwrap().rows;
        let gone: Vec<_> = rows.iter().filter(|r| r.retired).collect();
        assert_eq!(gone.len(), 1);
        assert_eq!(gone[0].ifname, "tap0");
        // The fake refuses to read an untracked device: these were read before untracking.
        assert_eq!(gone[0].counters.consumed, 25);
        assert_eq!(
            gone[0].kernel.tx_packets, 20,
            "the kernel's last known delta"
        );
        let untracks = t.host.calls.iter().filter(|c| *c == "untrack 3").count();
        assert_eq!(untracks, 1, "{:?}", t.host.calls);
        assert!(!t.host.tracked.contains_key(&key));
        let rows = t.refresh().unwrap().rows;
        assert_eq!(rows.len(), 1);
        assert_eq!(rows[0].ifname, "tap1", "then it is gone: {rows:?}");
    }

    #[test]
    fn queues_are_capped_and_shown_when_in_use_or_counting() {
        let mut t = tracker();
        let key = DeviceKey {
            netns_inode: 7,
            ifindex: 5,
        };
        // A multi-queue tap: 256 queues allocated, 2 attached.
        let mut mq = device(5, "tapmq", 0, 0);
        mq.queues = 256;
        mq.active_queues = 2;
        t.host.devices = vec![mq];
        let rows = t.refresh().unwrap().rows;
        assert_eq!(t.host.tracked.get(&key), Some(&MAX_QUEUES_PER_DEVICE));
        assert_eq!(rows.iter().map(|r| r.queue).collect::<Vec<_>>(), [0, 1]);
        // Queue 9 counted something (a reader detached since): it shows too.
        let mut counters = DeviceCounters::default();
        counters.queues.resize(10, QueueCounters::default());
        counters.queues[9].enqueued = 3;
        counters.stopped_since.resize(10, None);
        t.host.counters.insert(key, counters);
        let rows = t.refresh().unwrap().rows;
        assert_eq!(rows.iter().map(|r| r.queue).collect::<Vec<_>>(), [0, 1, 9]);
    }

    #[test]
    fn a_stopped_queue_shows_the_stop_still_running() {
        let mut t = tracker();
        let key = DeviceKey {
            netns_inode: 7,
            ifindex: 3,
        };
        t.host.devices = vec![device(3, "tap0", 0, 0)];
        t.refresh().unwrap();
        let mut counters = consumed(0);
        counters.queues[0].stopped_ns = 1_000;
        counters.stopped_since[0] = Some(t.host.now_ns - 500);
        t.host.counters.insert(key, counters);
        let row = t.refresh().unwrap().rows.remove(0);
        assert!(row.stopped);
        assert_eq!(row.counters.stopped_ns, 1_500);
    }

    #[test]
    fn rows_are_sorted_by_namespace_device_and_queue() {
        let mut t = tracker();
        let mut b = device(2, "b", 0, 0);
        b.netns = "a-ns".to_owned();
        t.host.devices = vec![device(3, "z", 0, 0), device(4, "a", 0, 0), b];
        let rows = t.refresh().unwrap().rows;
        let order: Vec<(&str, &str)> = rows
            .iter()
            .map(|r| (r.netns.as_str(), r.ifname.as_str()))
            .collect();
        assert_eq!(order, [("a-ns", "b"), ("ns", "a"), ("ns", "z")]);
    }

    /// A tracker of one tap that has sent 5,000 packets, on which `per_call[i]` more pass
    /// at the i-th read of any counter (cycling).
    fn under_load(per_call: Vec<u64>) -> Tracker<FakeHost> {
        let mut t = tracker();
        t.host.devices = vec![device(3, "tap0", 5_000, 0)];
        *t.host.wire.get_mut() = Some(Wire {
            key: DeviceKey {
                netns_inode: 7,
                ifindex: 3,
            },
            per_call,
            calls: 0,
            kernel: 0,
            ours: 0,
            lag: false,
            in_flight: 0,
        });
        t
    }

    /// Refreshes under `t`'s load, each within the skew it shows; then stops the traffic:
    /// the refresh after it has counted something, with no skew, and the kernel's column and
    /// the probes' agree exactly.
    fn assert_within_skew_then_exact(t: &mut Tracker<FakeHost>) {
        for _ in 0..5 {
            let row = t.refresh().unwrap().rows.remove(0);
            assert!(
                row.kernel.tx_packets.abs_diff(row.counters.consumed) <= row.kernel.skew,
                "under load the difference is within the skew shown: {row:?}"
            );
        }
        t.host.wire.get_mut().as_mut().unwrap().per_call = vec![0];
        let row = t.refresh().unwrap().rows.remove(0);
        assert!(row.counters.consumed > 0, "{row:?}");
        assert_eq!(row.kernel.skew, 0, "{row:?}");
        assert_eq!(
            row.kernel.tx_packets, row.counters.consumed,
            "once traffic stops the two agree: {row:?}"
        );
    }

    /// Attached while a load runs (packets flow between any two reads, in bursts): once the
    /// traffic stops, the kernel's column and the probes' agree exactly, and the skew says so.
    #[test]
    fn attached_under_load_the_kernel_columns_agree_once_traffic_stops() {
        let mut t = under_load(vec![2, 0, 3, 0, 0, 1, 0]);
        assert_within_skew_then_exact(&mut t);
    }

    /// The kernel counts each packet a moment before the probes do: one caught between the
    /// two when the kernel's statistics are read reaches the probes before their counters
    /// are read, so it is bracketed, and once traffic stops the two agree exactly.
    #[test]
    fn packets_the_kernel_counted_first_are_bracketed() {
        let mut t = under_load(vec![2, 0, 3, 0, 0, 1, 0]);
        t.host.wire.get_mut().as_mut().unwrap().lag = true;
        assert_within_skew_then_exact(&mut t);
    }

    /// A load that never pauses: no exact baseline can be read, and the skew bounds the
    /// difference instead of hiding it.
    #[test]
    fn a_load_without_pauses_shows_its_skew() {
        let mut t = under_load(vec![1]);
        t.refresh().unwrap();
        t.host.wire.get_mut().as_mut().unwrap().per_call = vec![0];
        let row = t.refresh().unwrap().rows.remove(0);
        assert!(row.kernel.skew > 0, "{row:?}");
        let diff = row.counters.consumed - row.kernel.tx_packets;
        assert!(diff > 0 && diff <= row.kernel.skew, "{row:?}");
    }

    /// When the probe's tables are full, the devices left out are listed, the refresh goes
    /// on, and they are tracked once a device goes away and makes room.
    #[test]
    fn devices_beyond_the_tables_are_listed_and_tracked_once_room_is_made() {
        let mut t = tracker();
        t.host.room = 2;
        t.host.devices = vec![
            device(3, "tap0", 0, 0),
            device(4, "tap1", 0, 0),
            device(5, "tap2", 0, 0),
        ];
        let report = t.refresh().unwrap();
        assert_eq!(report.rows.len(), 2);
        assert_eq!(report.untracked.len(), 1, "{:?}", report.untracked);
        assert!(report.untracked[0].reason.contains("tracked already"));
        // Full: no attempt is made again until something goes away.
        let attempts = |t: &Tracker<FakeHost>| {
            t.host
                .calls
                .iter()
                .filter(|c| c.starts_with("full"))
                .count()
        };
        let before = attempts(&t);
        let report = t.refresh().unwrap();
        assert_eq!((report.rows.len(), report.untracked.len()), (2, 1));
        assert_eq!(attempts(&t), before);
        // One of the tracked ones goes: the untracked one takes its place.
        let gone = report.rows[0].ifindex;
        t.host.devices.retain(|d| d.key.ifindex != gone);
        let report = t.refresh().unwrap();
        assert!(report.untracked.is_empty(), "{:?}", report.untracked);
        assert_eq!(report.rows.iter().filter(|r| !r.retired).count(), 2);
    }

    /// Every refresh reads what the kernel skipped of each program, and a report that has
    /// a skip says its counts may be short (the outputs show it: see the output's tests).
    #[test]
    fn skipped_program_runs_are_reported_per_program_and_mark_the_counts_short() {
        let mut t = tracker();
        t.host.devices = vec![device(3, "tap0", 0, 0)];
        let quiet = vec![
            ProgramMissed {
                program: "consume_entry".to_owned(),
                runs: 0,
                kprobe: Some(0),
            },
            ProgramMissed {
                program: "kfree_skb".to_owned(),
                runs: 0,
                kprobe: None,
            },
        ];
        t.host.missed.clone_from(&quiet);
        let report = t.refresh().unwrap();
        assert!(!report.may_be_short());
        assert_eq!(report.missed, quiet);

        t.host.missed = quiet;
        t.host.missed[0].kprobe = Some(2);
        t.host.missed[1].runs = 5;
        let report = t.refresh().unwrap();
        assert!(report.may_be_short());
        assert_eq!(report.missed, t.host.missed);
    }

    /// A module located at attach that changes later is reported in every refresh, and
    /// warned about once.
    #[test]
    fn a_module_loaded_after_attach_is_reported() {
        use crate::kernel::modules::Change;
        let mut t = tracker();
        t.host.devices = vec![device(3, "tap0", 0, 0)];
        assert!(t.refresh().unwrap().modules_changed.is_empty());
        t.host.modules = vec![ModuleChange {
            module: "veth",
            change: Change::Loaded,
        }];
        for _ in 0..2 {
            let report = t.refresh().unwrap();
            assert_eq!(report.modules_changed, t.host.modules);
        }
        assert_eq!(t.warned.len(), 1);
    }
}
