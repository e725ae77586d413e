//! Keeps the tracked devices in step with the host and reads their counters.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use tap_probe_common::{DeviceKey, MAX_QUEUES_PER_DEVICE};

use crate::bpf::backend::{Backend, Ring, Sources, Wakes};
use crate::bpf::probe::{DeviceCounters, Probe};
use crate::host::discovery::{Device, Discovery, Filter};
use crate::host::report::{KernelDeltas, Report, RowContext, device_rows};
use crate::host::{Host, LiveHost};
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
}

struct Tracked {
    device: Device,
    /// The kernel's counters when tracking began.
    baseline: (u64, u64),
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
        let host = LiveHost {
            discovery: Discovery::new(filter)?,
            probe: Probe::attach_backend(kernel, backend, false)?,
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
    pub(crate) fn program_stats(&self) -> Vec<crate::bpf::probe::ProgramStats> {
        self.0.host.probe.program_stats()
    }

    /// Runs of the attached programs the kernel skipped (another kprobe program was running
    /// on the CPU); when not 0, counts may be short. Kernels before 6.7 do not count the
    /// kprobes' skips.
    #[must_use]
    pub fn missed_runs(&self) -> u64 {
        self.0.host.probe.missed_runs()
    }

    /// What feeds each counter.
    #[must_use]
    pub(crate) fn sources(&self) -> &crate::bpf::backend::Sources {
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
    pub(crate) fn nothing_matches(&mut self) -> anyhow::Result<String> {
        let all = self.0.host.discovery.describe_all()?;
        let mut text = String::from("no tun, tap, veth or macvtap device matches the filter");
        if all.is_empty() {
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
        }
    }
}

impl<H: Host> Tracker<H> {
    /// Rescans the host, starts tracking new devices, retires vanished ones, and reads every
    /// counter. Retired devices appear once more, marked, with their last counters.
    ///
    /// # Errors
    /// When the scan or a map read fails.
    pub(crate) fn refresh(&mut self) -> anyhow::Result<Report> {
        self.host.refresh_started();
        let now_ns = self.host.now_ns();
        let seen = self.host.devices()?;
        let mut rows = Vec::new();
        let current: HashMap<DeviceKey, Device> = seen.into_iter().map(|d| (d.key, d)).collect();
        let gone: Vec<DeviceKey> = self
            .devices
            .keys()
            .filter(|k| !current.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(mut tracked) = self.devices.remove(&key) {
                // Read before untracking: the slots are zeroed on reuse, not on removal.
                let counters = self.host.counters(key)?;
                let kernel = tracked.kernel;
                let stuck = tracked.stuck(&counters, now_ns, self.stuck_after);
                rows.extend(device_rows(
                    &tracked.device,
                    &counters,
                    kernel,
                    &self.names,
                    now_ns,
                    context(
                        self.host.sources(),
                        self.backpressure,
                        &tracked.device,
                        true,
                    ),
                    &stuck,
                ));
                self.host.untrack(key)?;
                log::info!(
                    "{} (netns {}) is gone; retired",
                    tracked.device.name,
                    tracked.device.netns
                );
            }
        }
        for (key, device) in current {
            let tracked = match self.devices.entry(key) {
                std::collections::hash_map::Entry::Occupied(e) => {
                    let t = e.into_mut();
                    t.device = device;
                    t
                }
                std::collections::hash_map::Entry::Vacant(e) => {
                    // A multi-queue tap has 256 queues whatever number is attached; count the
                    // first MAX_QUEUES_PER_DEVICE (the eBPF side ignores queues beyond).
                    self.host.track(
                        key,
                        device.queues.min(MAX_QUEUES_PER_DEVICE),
                        device.slot_flags(),
                    )?;
                    let baseline = (device.stats.tx_packets, device.stats.tx_dropped);
                    e.insert(Tracked {
                        device,
                        baseline,
                        kernel: KernelDeltas::default(),
                        takes: Vec::new(),
                        since_ns: now_ns,
                    })
                }
            };
            let counters = self.host.counters(key)?;
            let kernel = KernelDeltas {
                tx_packets: tracked
                    .device
                    .stats
                    .tx_packets
                    .saturating_sub(tracked.baseline.0),
                tx_dropped: tracked
                    .device
                    .stats
                    .tx_dropped
                    .saturating_sub(tracked.baseline.1),
            };
            tracked.kernel = kernel;
            let stuck = tracked.stuck(&counters, now_ns, self.stuck_after);
            let context = context(
                self.host.sources(),
                self.backpressure,
                &tracked.device,
                false,
            );
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
        rows.sort_by(|a, b| (&a.netns, &a.ifname, a.queue).cmp(&(&b.netns, &b.ifname, b.queue)));
        Ok(Report {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            sources: self.host.sources().clone(),
            programs: None,
            rows,
        })
    }
}

/// What the rows of `device` carry besides its counters, from what feeds them (`sources`)
/// and how this kernel's tun answers a full ring (`mode`).
fn context(
    sources: &Sources,
    mode: Option<TunBackpressure>,
    device: &Device,
    retired: bool,
) -> RowContext {
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
        ring: device.kind.is_tun() && matches!(sources.ring, Ring::Sampled(_)),
        wake_sources: matches!(sources.wakes, Wakes::Callers(_)),
        retired,
    }
}

#[cfg(test)]
mod tests {
    use std::collections::BTreeMap;

    use tap_probe_common::QueueCounters;

    use super::*;
    use crate::bpf::backend::{Consume, Requeues, Ring, Sources, Wakes, Xmit};
    use crate::bpf::probe::{DeviceCounters, RingOccupancy};
    use crate::host::discovery::DeviceKind;
    use crate::os::netlink::LinkStats;

    /// A host whose devices and counters the test sets, and which records what the
    /// tracker asked of it.
    struct FakeHost {
        devices: Vec<Device>,
        counters: HashMap<DeviceKey, DeviceCounters>,
        tracked: HashMap<DeviceKey, u32>,
        /// Every call, in order: `refresh`, `track IFINDEX N`, `untrack IFINDEX`.
        calls: Vec<String>,
        now_ns: u64,
        sources: Sources,
    }

    impl FakeHost {
        fn new() -> Self {
            Self {
                devices: Vec::new(),
                counters: HashMap::new(),
                tracked: HashMap::new(),
                calls: Vec::new(),
                now_ns: 1_000_000_000,
                sources: Sources {
                    xmit: Xmit::Tracepoints,
                    consumed: Consume::Tracepoint,
                    requeues: Requeues::DequeuePairs,
                    wakes: Wakes::Inferred,
                    ring: Ring::Unavailable("not in this test".to_owned()),
                    notes: Vec::new(),
                },
            }
        }
    }

    impl Host for FakeHost {
        fn devices(&mut self) -> anyhow::Result<Vec<Device>> {
            Ok(self.devices.clone())
        }

        fn track(&mut self, key: DeviceKey, queues: u32, _flags: u32) -> anyhow::Result<()> {
            self.calls.push(format!("track {} {queues}", key.ifindex));
            self.tracked.insert(key, queues);
            Ok(())
        }

        fn untrack(&mut self, key: DeviceKey) -> anyhow::Result<()> {
            self.calls.push(format!("untrack {}", key.ifindex));
            self.tracked.remove(&key);
            Ok(())
        }

        fn counters(&self, key: DeviceKey) -> anyhow::Result<DeviceCounters> {
            let queues = *self
                .tracked
                .get(&key)
                .ok_or_else(|| anyhow::anyhow!("{key:?} is not tracked"))?;
            let mut counters = self.counters.get(&key).cloned().unwrap_or_default();
            let queues = usize::try_from(queues).unwrap();
            counters.queues.resize(queues, QueueCounters::default());
            counters.stopped_since.resize(queues, None);
            counters.occupancy.resize(queues, RingOccupancy::default());
            Ok(counters)
        }

        fn refresh_started(&mut self) {
            self.calls.push("refresh".to_owned());
        }

        fn sources(&self) -> &Sources {
            &self.sources
        }

        fn now_ns(&self) -> u64 {
            self.now_ns
        }
    }

    fn device(ifindex: u32, name: &str, tx_packets: u64, tx_dropped: u64) -> Device {
        Device {
            key: DeviceKey { netns: 7, ifindex },
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

    #[test]
    fn a_new_device_is_tracked_and_the_kernel_counts_from_then_on() {
        let mut t = tracker();
        assert!(t.refresh().unwrap().rows.is_empty());
        t.host.devices = vec![device(3, "tap0", 100, 40)];
        let rows = t.refresh().unwrap().rows;
        assert_eq!(
            t.host.tracked.get(&DeviceKey {
                netns: 7,
                ifindex: 3
            }),
            Some(&1)
        );
        assert_eq!(rows.len(), 1);
        assert_eq!(
            (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
            (0, 0)
        );
        // Later the kernel's counters have grown: the rows show the growth since tracking.
        t.host.devices = vec![device(3, "tap0", 150, 45)];
        t.host.counters.insert(
            DeviceKey {
                netns: 7,
                ifindex: 3,
            },
            consumed(50),
        );
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
    }

    #[test]
    fn a_gone_device_is_reported_once_more_with_its_last_counters_then_forgotten() {
        let mut t = tracker();
        let key = DeviceKey {
            netns: 7,
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
            netns: 7,
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
            netns: 7,
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
}
