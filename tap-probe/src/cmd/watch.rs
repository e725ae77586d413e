//! `tap-probe watch`: attach to the running host and show the counters until stopped.

use std::time::{Duration, Instant};

use anyhow::bail;

use crate::output::Format;
use crate::output::columns::Chosen;
use crate::output::{self, View, tui};
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::signals::Stop;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(flatten)]
    pub(crate) devices: crate::cli::DeviceArgs,
    /// Time between refreshes (seconds, or with a unit: 500ms, 2m; at least 10ms). A refresh scans every namespace and reads
    /// the counters: its cost is the watcher's own CPU, never the packets'.
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = crate::cli::interval)]
    pub(crate) interval: Duration,
    /// Stop after this long (seconds, or with a unit; default: until Ctrl-C or SIGTERM).
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::duration)]
    pub(crate) duration: Option<Duration>,
    #[arg(long, value_enum, default_value_t)]
    pub(crate) format: Format,
    #[command(flatten)]
    pub(crate) view: ViewArgs,
    /// Start even if no device matches yet, and pick devices up as they appear.
    #[arg(long)]
    pub(crate) wait: bool,
    #[command(flatten)]
    pub(crate) counting: crate::cli::CountingArgs,
    /// Also report what each eBPF program costs, as the kernel measures it (runs and mean
    /// ns per run); turning the measurement on adds two clock reads per run.
    #[arg(long)]
    pub(crate) program_stats: bool,
    /// Also serve the counters for Prometheus at `http://ADDR/metrics`, refreshed every
    /// interval (ADDR as IP:PORT, e.g. 127.0.0.1:9464; port 0 picks a free one, printed on
    /// stderr).
    #[arg(long, value_name = "ADDR")]
    pub(crate) prometheus: Option<std::net::SocketAddr>,
    /// Which series `--prometheus` serves.
    #[command(flatten)]
    pub(crate) series: crate::cli::SeriesArgs,
    #[arg(long = "web.config.file", value_name = "FILE", requires = "prometheus",
          help = crate::cli::WEB_CONFIG_HELP)]
    pub(crate) web_config: Option<std::path::PathBuf>,
}

/// How the counters are shown to people.
#[derive(Debug, clap::Args)]
pub(crate) struct ViewArgs {
    /// The table's columns, in this order (comma-separated; default: device, netns, queue,
    /// delivered, ring-drops, busy, stopped, owner). Columns
    /// that do not fit the window are left out, the least needed first.
    #[arg(long, value_name = "LIST", value_parser = crate::output::columns::parse,
          conflicts_with = "wide")]
    pub(crate) columns: Option<Chosen>,
    /// Every counter in a column, however wide the table gets.
    #[arg(long)]
    pub(crate) wide: bool,
    /// A full-screen view: sortable devices, the selected one's counters, drop reasons and
    /// sparklines (`?` shows the keys). Needs a terminal.
    #[arg(long, conflicts_with_all = ["wide", "format"])]
    pub(crate) tui: bool,
}

/// Runs `tap-probe watch`.
///
/// # Errors
/// Missing privileges or kernel features, a filter that matches nothing, or a failure to
/// attach; the probes are detached in every case.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    use crate::output::prometheus::{About, Exporter, LiveConfig, Settings};
    let web = args
        .web_config
        .as_deref()
        .map(LiveConfig::load)
        .transpose()?;
    tap_probe_observer::kernel::privileges::check()?;
    if args.view.tui {
        tui::check()?;
    }
    let filter = args.devices.filter();
    // Catch SIGINT and SIGTERM before attaching anything, so a signal during set-up is
    // held until the loop below and still ends in a clean detach.
    let stop = Stop::install()?;
    let kernel = KernelInfo::load()?;
    let exporter = args
        .prometheus
        .map(|addr| {
            Exporter::start(
                addr,
                Settings {
                    stale_after: Settings::stale_after(args.interval),
                    departed_grace: Duration::ZERO,
                    about: Some(About::of(&kernel)),
                    series: args.series.series(),
                    web,
                },
            )
        })
        .transpose()?;
    let _stats = args
        .program_stats
        .then(tap_probe_observer::bpf::probe::enable_run_stats)
        .transpose()?;
    let mut watcher = args.counting.watcher(&kernel, &filter)?;
    log::info!("sources: {}", watcher.sources());
    let first = watcher.refresh()?;
    if first.rows.is_empty() && !args.wait {
        bail!("{}", watcher.nothing_matches()?);
    }
    if let Some(exporter) = &exporter {
        exporter.publish(first.clone());
        eprintln!(
            "tap-probe: serving metrics on {}{}",
            exporter.url("/metrics"),
            exporter.web_description()
        );
    }
    let view = match (&args.view.columns, args.view.wide) {
        (_, true) => View::Wide,
        (Some(columns), false) => View::Compact(columns.0.clone()),
        (None, false) => View::Compact(output::columns::defaults()),
    };
    let out = output::Output::with_view(args.format, view);
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut refresh = || -> anyhow::Result<_> {
        let report = watcher.refresh()?;
        if let Some(exporter) = &exporter {
            exporter.publish(report.clone());
        }
        Ok(report)
    };
    if args.view.tui {
        let columns = args
            .view
            .columns
            .as_ref()
            .map_or_else(output::columns::defaults, |c| c.0.clone());
        out.remember(&first);
        let mut state = tui::State::new(first, columns);
        tui::run(&mut state, args.interval, deadline, &stop, || {
            let report = refresh()?;
            out.remember(&report);
            Ok(report)
        })?;
    } else {
        out.show(&first, None)?;
        let mut previous = first;
        while let Some(wait) = next_wait(args.interval, deadline) {
            if output::sleep(&stop, wait) {
                break;
            }
            let report = refresh()?;
            out.show(&report, Some(&previous))?;
            previous = report;
        }
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
