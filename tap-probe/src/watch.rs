//! `tap-probe watch`: attach to the running host and show the counters until stopped.

use std::collections::HashMap;
use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::bail;
use tap_probe_common::{DeviceKey, MAX_QUEUES_PER_DEVICE};

use crate::backend::Backend;
use crate::cli::Format;
use crate::discovery::{Device, Discovery, Filter};
use crate::kernel::{KernelInfo, ReasonNames};
use crate::probe::Probe;
use crate::render;
use crate::report::{KernelDeltas, Report, device_rows};
use crate::signals::Stop;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) devices: crate::cli::DeviceArgs,
    /// Seconds between refreshes (at least 0.01).
    #[arg(long, value_name = "SECS", default_value = "1", value_parser = crate::cli::interval)]
    pub(crate) interval: Duration,
    /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "SECS", value_parser = crate::cli::duration)]
    pub(crate) duration: Option<Duration>,
    #[arg(long, value_enum, default_value_t)]
    pub(crate) format: Format,
    /// Start even if no device matches yet, and pick devices up as they appear.
    #[arg(long)]
    pub(crate) wait: bool,
    /// Which kernel hooks feed the counters; `auto` picks the best that works, counter by
    /// counter (`tap-probe doctor` shows what this kernel allows).
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub(crate) backend: Backend,
    /// Also report what each eBPF program costs, as the kernel measures it (runs and mean
    /// ns per run); turning the measurement on adds two clock reads per run.
    #[arg(long)]
    pub(crate) program_stats: bool,
    /// Also serve the counters for Prometheus at `http://ADDR/metrics`, refreshed every
    /// interval (ADDR as IP:PORT, e.g. 127.0.0.1:9464; port 0 picks a free one, printed on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    pub(crate) prometheus: Option<std::net::SocketAddr>,
}

/// Runs `tap-probe watch`.
///
/// # Errors
/// Missing privileges or kernel features, a filter that matches nothing, or a failure to
/// attach; the probes are detached in every case.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    crate::privileges::check()?;
    let filter = args.devices.filter();
    // Catch SIGINT and SIGTERM before attaching anything, so a signal during set-up is
    // held until the loop below and still ends in a clean detach.
    let stop = Stop::install()?;
    let exporter = args
        .prometheus
        .map(crate::prometheus::Exporter::start)
        .transpose()?;
    let _stats = args
        .program_stats
        .then(crate::probe::enable_run_stats)
        .transpose()?;
    let kernel = KernelInfo::load()?;
    let mut watcher = Watcher::with_backend(&kernel, &filter, args.backend)?;
    log::info!("sources: {}", watcher.sources());
    let first = watcher.refresh()?;
    if first.rows.is_empty() && !args.wait {
        bail!("{}", watcher.nothing_matches()?);
    }
    if let Some(exporter) = &exporter {
        exporter.publish(&first);
        eprintln!(
            "tap-probe: serving metrics on http://{}/metrics",
            exporter.addr()
        );
    }
    let out = render::Output::new(args.format);
    out.show(&first, None)?;
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut previous = first;
    while let Some(wait) = next_wait(args.interval, deadline) {
        if stop.sleep(wait) {
            break;
        }
        let report = watcher.refresh()?;
        if let Some(exporter) = &exporter {
            exporter.publish(&report);
        }
        out.show(&report, Some(&previous))?;
        previous = report;
    }
    let mut last = watcher.refresh()?;
    if args.program_stats {
        last.programs = Some(watcher.program_stats());
    }
    out.summary(&last)
}

/// How long to sleep before the next refresh, or `None` once the deadline has passed.
fn next_wait(period: Duration, deadline: Option<Instant>) -> Option<Duration> {
    match deadline {
        None => Some(period),
        Some(d) => {
            let left = d.saturating_duration_since(Instant::now());
            (!left.is_zero()).then(|| period.min(left))
        }
    }
}

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

    /// What each attached program cost so far (see [`crate::probe::enable_run_stats`]).
    #[must_use]
    pub(crate) fn program_stats(&self) -> Vec<crate::probe::ProgramStats> {
        self.probe.program_stats()
    }

    /// What feeds each counter.
    #[must_use]
    pub(crate) fn sources(&self) -> &crate::backend::Sources {
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

/// `CLOCK_MONOTONIC` in ns, the clock of `bpf_ktime_get_ns`.
#[must_use]
pub(crate) fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}
