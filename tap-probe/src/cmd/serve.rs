//! `tap-probe serve`: the exporter as a service. It attaches, serves the counters at
//! `/metrics` and its health at `/healthz`, follows devices as VMs come and go, and runs
//! until SIGTERM (or SIGINT), then detaches. It writes nothing on stdout; its log lines on
//! stderr carry syslog priorities for journald.

use std::net::SocketAddr;
use std::path::PathBuf;
use std::time::Duration;

use crate::output::prometheus::{About, Exporter, LiveConfig, Settings};
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::signals::Stop;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) devices: crate::cli::DeviceArgs,
    /// Where to serve `/metrics` and `/healthz` (IP:PORT; port 0 picks a free one, logged).
    #[arg(long, value_name = "ADDR", default_value = "127.0.0.1:9464")]
    pub(crate) listen: SocketAddr,
    #[arg(long = "web.config.file", value_name = "FILE", help = crate::cli::WEB_CONFIG_HELP)]
    pub(crate) web_config: Option<PathBuf>,
    /// Time between refreshes (seconds, or with a unit: 500ms, 2m): each rescans processes and namespaces for devices and
    /// their owners, and reads the counters scrapes are then served.
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = crate::cli::interval)]
    pub(crate) interval: Duration,
    /// How long the series of a device that went away are still served, with the counts it
    /// had when it went, so that a scrape sees its last increase; after that they are
    /// dropped (0: at once). Make it longer than Prometheus' scrape interval.
    #[arg(long, value_name = "DURATION", default_value = "300", value_parser = crate::cli::delay)]
    pub(crate) forget_after: Duration,
    #[command(flatten)]
    pub(crate) counting: crate::cli::CountingArgs,
    #[command(flatten)]
    pub(crate) series: crate::cli::SeriesArgs,
}

/// Runs `tap-probe serve`.
///
/// # Errors
/// A web config file that cannot be used (before anything else), missing privileges or
/// kernel features, an address that cannot be bound, or a failure to attach; the probes
/// are detached in every case. A refresh that fails later does not end it: the last good
/// counters stay served and `/healthz` reports the failure.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let web = args
        .web_config
        .as_deref()
        .map(LiveConfig::load)
        .transpose()?;
    tap_probe_observer::kernel::privileges::check()?;
    let filter = args.devices.filter();
    // Before anything is attached, so a SIGTERM during set-up still ends in a clean detach.
    let stop = Stop::install()?;
    let kernel = KernelInfo::load()?;
    let exporter = Exporter::start(
        args.listen,
        Settings {
            stale_after: Settings::stale_after(args.interval),
            departed_grace: args.forget_after,
            about: Some(About::of(&kernel)),
            series: args.series.series(),
            web,
        },
    )?;
    log::info!(
        "serving metrics on {} and health on {}{}",
        exporter.url("/metrics"),
        exporter.url("/healthz"),
        exporter.web_description()
    );
    let mut watcher = args.counting.watcher(&kernel, &filter)?;
    log::info!(
        "attached on {} (tap-probe {}, commit {}); sources: {}",
        kernel.release,
        env!("CARGO_PKG_VERSION"),
        crate::cli::COMMIT,
        watcher.sources()
    );
    let mut failing = false;
    let mut first = true;
    loop {
        match watcher.refresh() {
            Ok(report) => {
                if failing {
                    log::info!("refreshing again");
                    failing = false;
                }
                if std::mem::take(&mut first) {
                    log::info!("{}", tracking(&report));
                }
                exporter.publish(report);
            }
            Err(err) => {
                // Once per spell of failures, not once per interval.
                if !failing {
                    log::error!("refresh failed, the last good counters stay served: {err:#}");
                    failing = true;
                }
                exporter.failed(&err);
            }
        }
        if stop.sleep(args.interval) {
            break;
        }
    }
    log::info!("stopping: detaching the probes");
    drop(watcher);
    drop(exporter);
    log::info!("stopped");
    Ok(())
}

/// What a refresh tracks and the kernel memory it takes, for the log.
fn tracking(report: &tap_probe_observer::host::report::Report) -> String {
    use tap_probe_common::units::bytes;
    let live = || report.rows.iter().filter(|r| !r.retired);
    let devices: std::collections::HashSet<(&str, u32)> =
        live().map(|r| (r.netns.as_str(), r.ifindex)).collect();
    let mut text = format!(
        "tracking {} devices ({} queues), {} untracked",
        devices.len(),
        live().count(),
        report.untracked.len()
    );
    if let Some(memory) = &report.memory {
        let _ = std::fmt::Write::write_fmt(
            &mut text,
            format_args!(
                "; the probe's maps hold {} of kernel memory ({} possible CPUs; {} with 256)",
                bytes(memory.bytes()),
                memory.possible_cpus,
                bytes(memory.bytes_at(256)),
            ),
        );
    }
    text
}
