//! `tap-probe bench`: the tail-drop fix's benchmark table, measured on the running kernel:
//! rows TAP (read) and TAP + vhost-net, one table per number of sender threads, columns
//! Stock and Backpressure, Transmitted (delivered packets per second) and Lost/s with the
//! ring and qdisc drops behind them, each cell the median of `--runs` runs. Typically run
//! in a guest: `tap-probe vm --kernel debian-7.3 -- bench`.

use std::time::Instant;

use anyhow::{Context as _, Result};

use crate::output::Format;
use crate::output::progress::{Progress, Status};
use tap_probe_lab::bench::run::{self, Fix};
use tap_probe_lab::bench::table::{BenchTable, Cell, Header, Path, Variant};
use tap_probe_observer::os::signals::Stop;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Runs per cell; cells take turns run by run, so drift over time spreads evenly.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..=50))]
    runs: u32,
    /// Packets per run, sent as fast as the stack takes them.
    #[arg(long, default_value_t = 200_000, value_parser = clap::value_parser!(u64).range(1000..=100_000_000))]
    packets: u64,
    /// Numbers of sender threads, one table each.
    #[arg(long = "threads", value_name = "N", value_delimiter = ',', default_values_t = [1, 2], value_parser = clap::value_parser!(u32).range(1..=16))]
    threads: Vec<u32>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Runs `tap-probe bench`.
///
/// # Errors
/// When the kernel has no version of the fix, or a run fails.
pub(crate) fn run(args: &Args) -> Result<()> {
    let fix = Fix::detect()?;
    let vhost = std::path::Path::new("/dev/vhost-net").exists();
    if !vhost {
        eprintln!(
            "tap-probe bench: /dev/vhost-net is missing (load vhost_net): the TAP + vhost-net \
             row is not measured"
        );
    }
    let paths: Vec<Path> = [Path::Tap, Path::TapVhost]
        .into_iter()
        .filter(|&path| path == Path::Tap || vhost)
        .collect();
    let mut cells: Vec<Cell> = args
        .threads
        .iter()
        .flat_map(|&threads| {
            paths.iter().flat_map(move |&path| {
                [Variant::Stock, Variant::Backpressure].map(|variant| Cell {
                    path,
                    sender_threads: threads,
                    variant,
                    runs: Vec::new(),
                })
            })
        })
        .collect();
    let stop = Stop::install()?;
    let started = Instant::now();
    // At most 16 thread counts x 2 rows x 2 columns x 50 runs: far below u32::MAX.
    let total = u32::try_from(cells.len())? * args.runs;
    let mut progress = Progress::stderr();
    let mut done = 0;
    for round in 0..args.runs {
        for cell in &mut cells {
            let name = format!(
                "{}, {} sender thread{}, {}",
                cell.path.label(),
                cell.sender_threads,
                if cell.sender_threads == 1 { "" } else { "s" },
                cell.variant.label()
            );
            // The runs so far tell how long the rest will take.
            let left = (done > 0).then(|| started.elapsed() / done * (total - done));
            progress.update(&Status {
                what: &name,
                step: Some((u64::from(done), u64::from(total))),
                left,
                detail: &format!("run {} of {}", round + 1, args.runs),
            });
            let run = run::measure(
                fix,
                cell.path,
                cell.sender_threads,
                cell.variant,
                args.packets,
                &stop.flag(),
            )
            .with_context(|| name.clone())?;
            cell.runs.push(run);
            done += 1;
        }
    }
    progress.finish();
    let header = Header {
        kernel_release: tap_probe_observer::kernel::release(),
        cpus: u32::try_from(std::thread::available_parallelism().map_or(1, usize::from))
            .unwrap_or(u32::MAX),
        accelerator: accelerator(),
        packets_per_run: args.packets,
        stock: fix.describe(Variant::Stock).to_owned(),
        backpressure: fix.describe(Variant::Backpressure).to_owned(),
    };
    let table = BenchTable::new(header, cells)?;
    crate::output::stdout(&match args.format {
        Format::Table => table.markdown(),
        Format::Json => table.to_json() + "\n",
    })
}

/// How this machine runs: the accelerator `tap-probe vm` put on the guest's kernel command
/// line, or `none` (not in a tap-probe guest).
fn accelerator() -> String {
    std::fs::read_to_string("/proc/cmdline")
        .ok()
        .and_then(|cmdline| {
            cmdline.split_whitespace().find_map(|word| {
                word.strip_prefix(tap_probe_guest::qemu::ACCEL_PARAM)
                    .and_then(|rest| rest.strip_prefix('='))
                    .map(str::to_owned)
            })
        })
        .unwrap_or_else(|| "none".to_owned())
}
