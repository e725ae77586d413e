//! Keeps the tracked devices in step with the host and reads their counters.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::Instant;

use tap_probe_common::{DeviceKey, MAX_QUEUES_PER_DEVICE};

use crate::bpf::backend::Backend;
use crate::bpf::probe::Probe;
use crate::host::discovery::{Device, Discovery, Filter};
use crate::host::report::{KernelDeltas, Report, device_rows};
use crate::kernel::{KernelInfo, ReasonNames};
use crate::os::clock::monotonic_ns;

/// Keeps the tracked devices in step with the host and reads their counters.
pub struct Watcher {
    probe: Probe,
    discovery: Discovery,
    names: ReasonNames,
    started: Instant,
    devices: HashMap<DeviceKey, Tracked>,
}

struct Tracked {
    device: Device,
    /// The kernel's counters when tracking began.
    baseline: (u64, u64),
    /// The last deltas read, kept for the retirement row.
    kernel: KernelDeltas,
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
        let discovery = Discovery::new(filter)?;
        let probe = Probe::attach_backend(kernel, backend, false)?;
        Ok(Self {
            probe,
            discovery,
            names: kernel.drop_reasons.clone(),
            started: Instant::now(),
            devices: HashMap::new(),
        })
    }

    /// Rescans the host, starts tracking new devices, retires vanished ones, and reads every
    /// counter. Retired devices appear once more, marked, with their last counters.
    ///
    /// # Errors
    /// When the scan or a map read fails.
    pub fn refresh(&mut self) -> anyhow::Result<Report> {
        let now_ns = monotonic_ns();
        self.probe.flush_log();
        let seen = self.discovery.scan()?;
        self.probe.retire_generation();
        let mut rows = Vec::new();
        let current: HashMap<DeviceKey, Device> = seen.into_iter().map(|d| (d.key, d)).collect();
        let gone: Vec<DeviceKey> = self
            .devices
            .keys()
            .filter(|k| !current.contains_key(k))
            .copied()
            .collect();
        for key in gone {
            if let Some(tracked) = self.devices.remove(&key) {
                // Read before untracking: the slots are zeroed on reuse, not on removal.
                let counters = self.probe.read(key)?;
                let kernel = tracked.kernel;
                rows.extend(device_rows(
                    &tracked.device,
                    &counters,
                    kernel,
                    &self.names,
                    now_ns,
                    true,
                ));
                self.probe.untrack(key)?;
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
                    self.probe
                        .track(key, device.queues.min(MAX_QUEUES_PER_DEVICE))?;
                    let baseline = (device.stats.tx_packets, device.stats.tx_dropped);
                    e.insert(Tracked {
                        device,
                        baseline,
                        kernel: KernelDeltas::default(),
                    })
                }
            };
            let counters = self.probe.read(key)?;
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
            rows.extend(device_rows(
                &tracked.device,
                &counters,
                kernel,
                &self.names,
                now_ns,
                false,
            ));
        }
        rows.sort_by(|a, b| (&a.netns, &a.ifname, a.queue).cmp(&(&b.netns, &b.ifname, b.queue)));
        Ok(Report {
            elapsed_s: self.started.elapsed().as_secs_f64(),
            sources: self.probe.sources().clone(),
            programs: None,
            rows,
        })
    }

    /// What each attached program cost so far (see [`crate::bpf::probe::enable_run_stats`]).
    #[must_use]
    pub(crate) fn program_stats(&self) -> Vec<crate::bpf::probe::ProgramStats> {
        self.probe.program_stats()
    }

    /// What feeds each counter.
    #[must_use]
    pub(crate) fn sources(&self) -> &crate::bpf::backend::Sources {
        self.probe.sources()
    }

    /// The error text for a filter that matches nothing: what exists instead.
    ///
    /// # Errors
    /// When the host cannot be scanned.
    pub(crate) fn nothing_matches(&mut self) -> anyhow::Result<String> {
        let all = self.discovery.describe_all()?;
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
