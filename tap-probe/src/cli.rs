//! Command-line interface: the top-level command, its dispatch, and what several
//! subcommands share (durations, device filters, how to count). Each subcommand's own arguments live
//! with it; closed sets that a lower layer reads too (the output format, the qdisc) live
//! with that layer, so no layer imports the command line.

use std::time::Duration;

use clap::{Parser, Subcommand};

use crate::output::prometheus::BadWebConfig;

use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::bpf::probe::{Counting, Occupancy};
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::{KernelInfo, Unsupported};
use tap_probe_observer::os::files::Unusable;

/// The commit this binary was built from (`build.rs`), for `--version` and Prometheus.
pub(crate) const COMMIT: &str = env!("TAP_PROBE_COMMIT");

/// `--web.config.file`, of `serve` and `watch --prometheus`.
pub(crate) const WEB_CONFIG_HELP: &str = "TLS and basic auth for the metrics endpoint: a web \
    config file in the Prometheus exporter toolkit's format (tls_server_config, \
    basic_auth_users with bcrypt hashes; see docs/service.md), read again when it or a file \
    it names changes. A file that cannot be used stops the start (exit status 2)";

/// The exit status of a command line, or a file it names, that cannot be used: clap's own.
/// What clap cannot tell is found before anything is made ([`Unusable`], [`BadWebConfig`]).
const USAGE: u8 = 2;

#[derive(Debug, Parser)]
#[command(
    name = "tap-probe",
    version = concat!(env!("CARGO_PKG_VERSION"), " (commit ", env!("TAP_PROBE_COMMIT"), ")"),
    about = "Count what happens to packets on the transmit path of tun/tap devices"
)]
pub(crate) struct Cli {
    #[command(subcommand)]
    command: Command,
}

#[derive(Debug, Subcommand)]
enum Command {
    /// Attach to the running host and show per-device, per-queue transmit counters.
    Watch(crate::cmd::watch::Args),
    /// Run as a service: serve the counters for Prometheus until stopped, with a health
    /// endpoint and logs for journald, and no other output.
    Serve(crate::cmd::serve::Args),
    /// Run a self-contained demonstration in a private network namespace.
    Demo(crate::cmd::demo::Args),
    /// Report what this kernel allows and which probe backend would be used.
    Doctor(crate::cmd::doctor::Args),
    /// Drive bounded traffic through a fresh tap in a private namespace and report rates.
    Load(crate::cmd::load::Args),
    /// Record per-packet transmit events of tun/tap devices to a trace file.
    Record(crate::cmd::record::Args),
    /// Replay a trace (or a synthetic workload) under each queue policy: what would the
    /// patched kernel have done?
    Replay(crate::cmd::replay::Args),
    /// Measure the tail-drop fix's benchmark table on this kernel: delivered and lost
    /// packets per second, stock against backpressure, read(2) and vhost-net readers.
    Bench(crate::cmd::bench::Args),
    /// Run the scenarios of a spec on this kernel and check their expectations (a CI gate:
    /// exit 0 all hold, 1 one fails, 2 the spec or the kernel is the problem).
    Check(crate::cmd::check::Args),
    /// Boot a kernel in a QEMU guest and run `tap-probe ARGS` there: its output and exit
    /// status are this command's.
    Vm(crate::cmd::vm::Args),
    /// Print the command-line reference (`docs/cli.md`) as markdown; `cargo xtask docs`
    /// writes it.
    #[command(hide = true)]
    CliReference,
}

/// The whole program: logging to stderr (`RUST_LOG`; warnings by default, and for `serve`
/// lines journald reads), the command line, the subcommand, and how the process ends: the
/// subcommand's exit code when it ran to its end, or, when a signal, a lost terminal or a
/// lost reader of stdout stopped it early, that signal once everything is undone
/// ([`tap_probe_observer::os::signals::exit`]), so the wait status says why; `serve` exits 0 when it
/// stopped cleanly on a signal. A file named on the command line that cannot be used (an
/// input that is no file, too large; an output that cannot be written; a web config) exits 2,
/// as a command line clap refuses does; any other error 1.
#[must_use]
pub(crate) fn main() -> std::process::ExitCode {
    use crate::output::logging::{self, Style};
    let cli = Cli::parse();
    let service = matches!(cli.command, Command::Serve(_));
    logging::init(if service {
        Style::Journal
    } else {
        Style::Terminal
    });
    let result = run(cli);
    // A service's normal end is a signal from its manager: it exits 0 once it has stopped
    // cleanly, as other exporters do, so its manager logs no failure.
    let stopped_service = service && result.is_ok();
    if let Some(why) = tap_probe_observer::os::signals::why().filter(|_| !stopped_service) {
        // The reader of stdout or the terminal is gone: nothing to tell it. Otherwise say
        // what the command could not finish (what it finished, it said itself).
        if let Err(err) = result
            && !crate::output::is_closed_stdout(&err)
        {
            if service {
                log::error!("{why}: {err:#}");
            } else {
                eprintln!("tap-probe: {why}: {err:#}");
            }
        }
        tap_probe_observer::os::signals::exit(why);
    }
    // An unusable web config, or a kernel tap-probe cannot run on at all (the kernel's
    // problem, as a bad spec is check's): exit status 2, as for bad input, and one line
    // naming what is wrong.
    let code = |err: &anyhow::Error| {
        let unusable = |cause: &(dyn std::error::Error + 'static)| {
            cause.is::<BadWebConfig>() || cause.is::<Unusable>()
        };
        if err.chain().any(unusable) || Unsupported::in_error(err).is_some() {
            std::process::ExitCode::from(USAGE)
        } else {
            std::process::ExitCode::FAILURE
        }
    };
    match result {
        Ok(code) => code,
        Err(err) if service => {
            log::error!("error: {err:#}");
            code(&err)
        }
        Err(err) => {
            eprintln!("tap-probe: error: {err:#}");
            code(&err)
        }
    }
}

/// Runs the chosen subcommand and returns its exit code: success, or the code a
/// subcommand chose (`vm` passes on the guest's).
///
/// # Errors
/// Whatever the subcommand reports.
fn run(cli: Cli) -> anyhow::Result<std::process::ExitCode> {
    let success = |()| std::process::ExitCode::SUCCESS;
    match cli.command {
        Command::Watch(args) => crate::cmd::watch::run(&args).map(success),
        Command::Serve(args) => crate::cmd::serve::run(&args).map(success),
        Command::Demo(args) => crate::cmd::demo::run(&args).map(success),
        Command::Doctor(args) => crate::cmd::doctor::run(&args),
        Command::Load(args) => crate::cmd::load::run(&args).map(success),
        Command::Record(args) => crate::cmd::record::run(&args).map(success),
        Command::Replay(args) => crate::cmd::replay::run(&args).map(success),
        Command::Bench(args) => crate::cmd::bench::run(&args).map(success),
        Command::Check(args) => crate::cmd::check::run(&args),
        Command::Vm(args) => crate::cmd::vm::run(&args),
        Command::CliReference => {
            let page = crate::cli_reference::markdown(&<Cli as clap::CommandFactory>::command());
            crate::output::stdout(&page).map(success)
        }
    }
}

/// Which devices to watch or record (`--dev`, `--netns`).
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct DeviceArgs {
    /// Devices whose name matches GLOB (repeatable; default: every tun, tap and veth
    /// device).
    #[arg(long = "dev", value_name = "GLOB")]
    pub(crate) devs: Vec<String>,
    /// Also macvtap devices. Only their `consumed` is exact: their ring is filled by the
    /// rx handler of the lower device, which the transmit-side counters do not see.
    #[arg(long)]
    pub(crate) macvtap: bool,
    /// Only devices in network namespaces whose name matches NAME (a glob; "init" is the
    /// host's own, named ones as in `ip netns list`, others `pid:N`).
    #[arg(long, value_name = "NAME")]
    pub(crate) netns: Option<String>,
}

impl DeviceArgs {
    #[must_use]
    pub(crate) fn filter(&self) -> Filter {
        Filter {
            globs: self.devs.clone(),
            netns: self.netns.clone(),
            macvtap: self.macvtap,
        }
    }
}

/// How `watch` and `serve` count: which hooks, where the rings are sampled, whether flows
/// are followed, when a stopped queue is stuck.
#[derive(Debug, Clone, clap::Args)]
pub(crate) struct CountingArgs {
    /// Which kernel hooks feed the counters; `auto` picks the best that works, counter by
    /// counter (`tap-probe doctor` shows what this kernel allows). The tracepoints cost
    /// least: a kprobe costs several times a tracepoint program per packet.
    #[arg(long, value_enum, default_value_t = Backend::Auto)]
    pub(crate) backend: Backend,
    /// Where the tun/tap rings' occupancy is sampled: `events` (where the queue stops and
    /// wakes, at a full-ring drop, once per refresh: no packet pays), `exact` (also at
    /// every driver call and reader take: each sample moves a cache line between CPUs, the
    /// most costly counter under a flood), `off`.
    #[arg(long, value_enum, value_name = "WHERE", default_value_t)]
    pub(crate) occupancy: Occupancy,
    /// Also follow each flow's order (`reordered`, `flows_joined`): every driver call reads
    /// the packet's headers and updates a flow table, the costliest per-packet work (about
    /// 75 ns a packet, 5 % of a flooded tap's rate, on a 2-CPU machine). Off, those two
    /// columns are empty, not zero.
    #[arg(long)]
    pub(crate) flows: bool,
    /// Call a queue stuck when it stays stopped this long (seconds, or with a unit) with no
    /// packet taken by its reader.
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = duration)]
    pub(crate) stuck_after: Duration,
    /// The most transmit queues counted at once, over every device (rounded up to a
    /// multiple of 128): what bounds the kernel memory the probe takes as VMs come. A
    /// device beyond it is named and counted in `tap_probe_untracked_devices`, and tracked
    /// once others go.
    #[arg(long, value_name = "N", default_value_t = tap_probe_common::MAX_QUEUE_SLOTS,
          value_parser = clap::value_parser!(u32).range(1..=i64::from(tap_probe_common::MAX_QUEUE_SLOTS)))]
    pub(crate) max_queues: u32,
}

impl CountingArgs {
    /// Attaches the probes as asked, for the devices of `filter`.
    ///
    /// # Errors
    /// A backend this kernel cannot run, or a failure to attach.
    pub(crate) fn watcher(&self, kernel: &KernelInfo, filter: &Filter) -> anyhow::Result<Watcher> {
        let counting = Counting {
            occupancy: self.occupancy,
            flows: self.flows,
            macvtap: filter.macvtap,
            max_queues: self.max_queues,
            ..Counting::WATCH
        };
        let mut watcher = Watcher::counting(kernel, filter, self.backend, counting)?;
        watcher.set_stuck_after(self.stuck_after);
        Ok(watcher)
    }
}

/// Which series a Prometheus endpoint serves (`serve`, `watch --prometheus`).
#[derive(Debug, Clone, Copy, clap::Args)]
pub(crate) struct SeriesArgs {
    /// A series per transmit queue (label `queue`) rather than one per device, and the
    /// families that break others down (wakes by waker, drops by reason, the kernel's
    /// statistics when tracking began): about 27 series per queue where the default serves
    /// at most 21 per device, whatever its queues.
    #[arg(long)]
    pub(crate) per_queue: bool,
    /// Also the histogram of the ring occupancy samples (`ring_occupancy_samples`): 20 more
    /// series per tun/tap, or per queue with --per-queue.
    #[arg(long)]
    pub(crate) occupancy_histogram: bool,
}

impl SeriesArgs {
    pub(crate) fn series(self) -> crate::output::prometheus::Series {
        crate::output::prometheus::Series {
            per_queue: self.per_queue,
            histogram: self.occupancy_histogram,
        }
    }
}

/// The longest duration any flag takes: a year. More is a typo rather than an intent.
const MAX_DURATION: Duration = Duration::from_hours(365 * 24);

/// The shortest refresh interval. A refresh scans `/proc` and every network namespace and
/// reads the maps; much more often than this and the loop would do nothing else.
pub(crate) const MIN_INTERVAL: Duration = Duration::from_millis(10);

/// A duration above zero (`--duration 2.5`, `--duration 10s`; see [`tap_probe_common::duration`]).
///
/// # Errors
/// Not a duration, zero, or more than a year.
pub(crate) fn duration(text: &str) -> Result<Duration, String> {
    tap_probe_common::duration::within(text, &(Duration::from_nanos(1)..=MAX_DURATION))
}

/// A duration that may be zero (`--start-delay 0`).
///
/// # Errors
/// Not a duration, or more than a year.
pub(crate) fn delay(text: &str) -> Result<Duration, String> {
    tap_probe_common::duration::within(text, &(Duration::ZERO..=MAX_DURATION))
}

/// A refresh interval, at least [`MIN_INTERVAL`].
///
/// # Errors
/// Not a duration, shorter than [`MIN_INTERVAL`], or more than a year.
pub(crate) fn interval(text: &str) -> Result<Duration, String> {
    tap_probe_common::duration::within(text, &(MIN_INTERVAL..=MAX_DURATION)).map_err(|err| {
        if err.contains("shorter than") {
            format!(
                "{err}: a refresh scans every namespace, so shorter intervals would leave no \
                 time for anything else"
            )
        } else {
            err
        }
    })
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn durations_are_bounded_once() {
        assert_eq!(duration("2.5"), Ok(Duration::from_millis(2500)));
        assert_eq!(duration(" 1 "), Ok(Duration::from_secs(1)));
        assert_eq!(duration("500ms"), Ok(Duration::from_millis(500)));
        assert_eq!(duration("2m"), Ok(Duration::from_mins(2)));
        assert!(duration("0").unwrap_err().contains("above 0"));
        assert!(duration("0s").unwrap_err().contains("above 0"));
        assert!(duration("-1").is_err());
        assert!(duration("nan").is_err());
        assert!(duration("inf").is_err());
        assert!(duration("1e9").is_err());
        let err = duration("1000000000").unwrap_err();
        assert!(err.contains("longer than 8760h"), "{err}");
        assert!(duration("abc").unwrap_err().contains("not a duration"));
        assert_eq!(delay("0"), Ok(Duration::ZERO));
        assert_eq!(delay("0ms"), Ok(Duration::ZERO));
        assert!(delay("-0.5").is_err());
    }

    #[test]
    fn interval_has_a_floor() {
        assert_eq!(interval("0.01"), Ok(MIN_INTERVAL));
        assert_eq!(interval("10ms"), Ok(MIN_INTERVAL));
        assert_eq!(interval("0.5"), Ok(Duration::from_millis(500)));
        let err = interval("0.000000001").unwrap_err();
        assert!(err.contains("shorter than 10ms"), "{err}");
        assert!(err.contains("a refresh scans every namespace"), "{err}");
        assert!(interval("0").is_err());
    }

    #[test]
    fn the_command_line_parses() {
        use clap::CommandFactory as _;
        Cli::command().debug_assert();
    }

    /// `--qdisc` takes tc's names of the qdiscs as well as tap-probe's.
    #[test]
    fn qdiscs_are_named_as_tc_names_them_too() {
        use tap_probe_spec::traffic::Qdisc;
        for (name, qdisc) in [
            ("fq-codel", Qdisc::FqCodel),
            ("fq_codel", Qdisc::FqCodel),
            ("pfifo-fast", Qdisc::PfifoFast),
            ("pfifo_fast", Qdisc::PfifoFast),
        ] {
            let cli = Cli::try_parse_from(["tap-probe", "load", "--qdisc", name]).unwrap();
            let Command::Load(args) = cli.command else {
                panic!("load parses as load");
            };
            assert_eq!(args.qdisc, Some(qdisc), "{name}");
        }
    }
}
