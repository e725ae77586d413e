//! `tap-probe watch`: attach to the running host and show the counters until stopped.

use std::collections::HashMap;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_common::DeviceKey;

use crate::discovery::{Device, Discovery, Filter};
use crate::probe::Probe;
use crate::render::{self, Format};
use crate::report::{KernelDeltas, ReasonNames, Report, device_rows};

#[derive(Debug, clap::Args)]
pub struct Args {
    /// Watch devices whose name matches GLOB (repeatable; default: every tun, tap, veth and
    /// macvtap device).
    #[arg(long = "dev", value_name = "GLOB")]
    pub devs: Vec<String>,
    /// Only devices in network namespaces whose name matches NAME (a glob; "init" is the
    /// host's own, named ones as in `ip netns list`, others `pid:N`).
    #[arg(long, value_name = "NAME")]
    pub netns: Option<String>,
    /// Seconds between refreshes.
    #[arg(long, default_value_t = 1.0, value_parser = positive_secs)]
    pub interval: f64,
    /// Stop after this many seconds (default: until Ctrl-C or SIGTERM).
    #[arg(long, value_parser = positive_secs)]
    pub duration: Option<f64>,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub format: Format,
    /// Start even if no device matches yet, and pick devices up as they appear.
    #[arg(long)]
    pub wait: bool,
}

fn positive_secs(s: &str) -> Result<f64, String> {
    let v: f64 = s.parse().map_err(|_| format!("{s:?} is not a number of seconds"))?;
    if v.is_finite() && v > 0.0 && v <= 86_400.0 * 365.0 {
        Ok(v)
    } else {
        Err(format!("{s} must be a number of seconds greater than 0"))
    }
}

/// Runs `tap-probe watch`.
///
/// # Errors
/// Missing privileges or kernel features, a filter that matches nothing, or a failure to
/// attach; the probes are detached in every case.
pub fn run(args: &Args) -> anyhow::Result<()> {
    crate::privileges::check()?;
    let filter = Filter { globs: args.devs.clone(), netns: args.netns.clone() };
    let mut watcher = Watcher::new(filter)?;
    let first = watcher.refresh()?;
    if first.rows.is_empty() && !args.wait {
        bail!("{}", watcher.nothing_matches()?);
    }
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let out = render::Output::new(args.format);
    out.show(&first, None)?;
    runtime.block_on(async {
        let mut sigterm =
            tokio::signal::unix::signal(tokio::signal::unix::SignalKind::terminate())?;
        let period = Duration::from_secs_f64(args.interval);
        let deadline = args.duration.map(|d| Instant::now() + Duration::from_secs_f64(d));
        let mut ticker = tokio::time::interval_at(tokio::time::Instant::now() + period, period);
        let mut previous = first;
        loop {
            let remaining = deadline.map(|d| d.saturating_duration_since(Instant::now()));
            if remaining == Some(Duration::ZERO) {
                break;
            }
            tokio::select! {
                _ = ticker.tick() => {}
                _ = tokio::signal::ctrl_c() => break,
                _ = sigterm.recv() => break,
                () = tokio::time::sleep(remaining.unwrap_or(Duration::MAX)), if remaining.is_some() => {}
            }
            let report = watcher.refresh()?;
            out.show(&report, Some(&previous))?;
            previous = report;
        }
        anyhow::Ok(())
    })?;
    let last = watcher.refresh()?;
    out.summary(&last)
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
    /// Attaches the probes.
    ///
    /// # Errors
    /// When kernel facts cannot be read or the programs cannot be attached.
    pub fn new(filter: Filter) -> anyhow::Result<Self> {
        let btf = crate::btf::load_vmlinux()?;
        let names = ReasonNames(crate::btf::drop_reason_names(&btf)?);
        let facts = crate::probe::kernel_facts()?;
        let discovery = Discovery::new(filter)?;
        let probe = Probe::attach(&facts)?;
        Ok(Self { probe, discovery, names, started: Instant::now(), devices: HashMap::new() })
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
        let current: HashMap<DeviceKey, Device> =
            seen.into_iter().map(|d| (d.key, d)).collect();
        let gone: Vec<DeviceKey> =
            self.devices.keys().filter(|k| !current.contains_key(k)).copied().collect();
        for key in gone {
            if let Some(tracked) = self.devices.remove(&key) {
                // Read before untracking: the slots are zeroed on reuse, not on removal.
                let counters = self.probe.read(&key)?;
                let kernel = tracked.kernel;
                rows.extend(device_rows(&tracked.device, &counters, kernel, &self.names, now_ns, true));
                self.probe.untrack(&key)?;
                log::info!("{} (netns {}) is gone; retired", tracked.device.name, tracked.device.netns);
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
                    self.probe.track(key, device.queues)?;
                    let baseline = (device.stats.tx_packets, device.stats.tx_dropped);
                    e.insert(Tracked { device, baseline, kernel: KernelDeltas::default() })
                }
            };
            let counters = self.probe.read(&key)?;
            let kernel = KernelDeltas {
                tx_packets: tracked.device.stats.tx_packets.saturating_sub(tracked.baseline.0),
                tx_dropped: tracked.device.stats.tx_dropped.saturating_sub(tracked.baseline.1),
            };
            tracked.kernel = kernel;
            rows.extend(device_rows(&tracked.device, &counters, kernel, &self.names, now_ns, false));
        }
        rows.sort_by(|a, b| (&a.netns, &a.ifname, a.queue).cmp(&(&b.netns, &b.ifname, b.queue)));
        Ok(Report { elapsed_s: self.started.elapsed().as_secs_f64(), rows })
    }

    /// The error text for a filter that matches nothing: what exists instead.
    ///
    /// # Errors
    /// When the host cannot be scanned.
    pub fn nothing_matches(&mut self) -> anyhow::Result<String> {
        let all = self.discovery.describe_all()?;
        let mut text = String::from("no tun, tap, veth or macvtap device matches the filter");
        if all.is_empty() {
            text.push_str("; this host has none (start a VM, or try `tap-probe demo`)");
        } else {
            text.push_str("; devices present:");
            for d in all {
                text.push_str(&format!("\n  {} (netns {}, {:?})", d.name, d.netns, d.kind));
            }
            text.push_str("\npass --dev GLOB / --netns NAME to match one of them, or --wait");
        }
        Ok(text)
    }
}

/// CLOCK_MONOTONIC in ns, the clock of `bpf_ktime_get_ns`.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000 + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}
