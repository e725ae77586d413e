//! Keeps the tracked devices in step with the host and reads their counters.

use std::collections::{HashMap, HashSet};
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use tap_probe_common::{DeviceKey, QueueCounters};

use crate::bpf::backend::{Backend, Consume, Ring, Sources, Wakes};
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
    /// Devices the programs counted from their first packet that were gone before any scan
    /// found them: no row can name them.
    gone_unnamed: u64,
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
        self.missed().iter().map(ProgramMissed::total).sum()
    }

    /// What the kernel skipped of each attached program, as [`Watcher::missed_runs`] sums.
    #[must_use]
    pub fn missed(&self) -> Vec<ProgramMissed> {
        self.0.host.missed()
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
            gone_unnamed: 0,
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
        // A device's rows together: sorted by device, thousands of them are moved once.
        let mut rows: Vec<Vec<Row>> = Vec::new();
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
        let mut retired = Vec::with_capacity(gone.len());
        for key in gone {
            retired.extend(self.retire(key, now_ns, &mut rows));
        }
        log_devices(&retired, "gone; retired");
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
                self.gone_unnamed += 1;
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
            rows.push(device_rows(
                &tracked.device,
                &counters,
                kernel,
                &self.names,
                now_ns,
                context,
                &stuck,
            ));
        }
        let born: Vec<String> = born
            .iter()
            .map(|key| {
                let d = &self.devices[key].device;
                format!("{} (netns {})", d.name, d.netns)
            })
            .collect();
        log_devices(&born, "appeared; counted from its first packet");
        self.seen.extend(self.devices.keys().copied());
        self.seen.extend(left_out.iter().copied());
        self.seen.extend(self.untracked.keys().copied());
        // A namespace no longer listed is gone: the scan's socket in it kept it alive until
        // now, so only from now on may the kernel give its inode to a namespace created
        // later, whose devices (from ifindex 2 again) are new ones, not those seen here.
        let vanished: Vec<u32> = self
            .namespaces_listed
            .iter()
            .filter(|inode| !namespaces.contains_key(inode))
            .copied()
            .collect();
        for inode in vanished {
            self.namespaces_listed.remove(&inode);
            self.namespaces_read.remove(&inode);
            self.seen.retain(|key| key.netns_inode != inode);
        }
        for (&inode, &was_read) in &namespaces {
            self.namespaces_listed.insert(inode);
            if was_read {
                self.namespaces_read.insert(inode);
            }
        }
        if !newly_untracked.is_empty() {
            warn_untracked(&newly_untracked, self.untracked.len());
        }
        // A device's rows come in queue order; devices by namespace and name.
        rows.retain(|device| !device.is_empty());
        rows.sort_by(|a, b| (&a[0].netns, &a[0].ifname).cmp(&(&b[0].netns, &b[0].ifname)));
        let rows: Vec<Row> = rows.into_iter().flatten().collect();
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
            gone_unnamed: self.gone_unnamed,
            memory: self.host.memory(),
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
        reader_takes: sources.consumed != Consume::Unavailable,
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
    /// A device is gone: its last row, marked, and its slots given back. Its name, for the
    /// log.
    fn retire(&mut self, key: DeviceKey, now_ns: u64, rows: &mut Vec<Vec<Row>>) -> Option<String> {
        let mut tracked = self.devices.remove(&key)?;
        // Read before untracking: the slots are zeroed on reuse, not on removal.
        match self.host.counters(key) {
            Ok(counters) => {
                let stuck = tracked.stuck(&counters, now_ns, self.stuck_after);
                rows.push(device_rows(
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
        Some(format!(
            "{} (netns {})",
            tracked.device.name, tracked.device.netns
        ))
    }
}

/// Says what happened to devices in one line per refresh, without a name per device when
/// a whole host's VMs start or stop at once.
fn log_devices(names: &[String], what: &str) {
    const SHOWN: usize = 8;
    match names {
        [] => {}
        [one] => log::info!("{one} {what}"),
        _ => {
            let mut list = names[..names.len().min(SHOWN)].join(", ");
            if names.len() > SHOWN {
                let _ = write!(list, " and {} more", names.len() - SHOWN);
            }
            log::info!("{} devices {what}: {list}", names.len());
        }
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
    // A multi-queue tap has 256 queues whatever number is attached: count those in use
    // now; the programs add any other at its first packet.
    let origin = host.track(key, device.active_queues.max(1), device.slot_flags())?;
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
pub(crate) mod tests;
