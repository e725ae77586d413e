//! `tap-probe demo`: a tap in a private namespace, read by a deliberately slow reader (an
//! emulated VM), fed bounded traffic, watched live; then everything is removed again.

use std::fmt::Write as _;
use std::time::{Duration, Instant};

use anyhow::{anyhow, bail};

use crate::output;
use crate::output::Format;
use tap_probe_lab::lab::load::{LoadConfig, LoadReport, LoadSession, SessionConfig, root_qdisc};
use tap_probe_lab::lab::traffic::SenderConfig;
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::report::Row;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::signals::Stop;
use tap_probe_spec::traffic::Qdisc;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// How long to send (seconds, or with a unit: 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = "10", value_parser = crate::cli::duration)]
    pub(crate) duration: Duration,
    /// Root qdisc on the tap.
    #[arg(long, value_enum, default_value_t = Qdisc::PfifoFast)]
    pub(crate) qdisc: Qdisc,
    /// Open the tap with `IFF_BACKPRESSURE`: with a qdisc, a full ring stops the queue
    /// instead of dropping (Linux 7.3; an error on kernels without it).
    #[arg(long)]
    pub(crate) backpressure: bool,
    /// Packets per second the emulated VM reads.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) reader_pps: u64,
    /// Packets per second sent into the tap.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) pps: u64,
    /// Time between refreshes (seconds, or with a unit; at least 10ms).
    #[arg(long, value_name = "DURATION", default_value = "1", value_parser = crate::cli::interval)]
    pub(crate) interval: Duration,
    #[arg(long, value_enum, default_value_t)]
    pub(crate) format: Format,
    /// Also report what each eBPF program cost, as the kernel measures it (runs and mean ns
    /// per run), in the final summary; the measurement adds two clock reads per run.
    #[arg(long)]
    pub(crate) program_stats: bool,
}

/// Runs `tap-probe demo`.
///
/// # Errors
/// Missing privileges or kernel features, or a failing step; the namespace, tap and probes
/// are removed in every case (they are guards), also on Ctrl-C and SIGTERM.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    tap_probe_observer::kernel::privileges::check()?;
    let stop = Stop::install()?;
    let session_cfg = SessionConfig {
        qdisc: Some(root_qdisc(args.qdisc)),
        backpressure: args.backpressure,
        tx_queue_len: None,
        reader_pps: Some(args.reader_pps),
        reader_deadline: Some(args.duration + Duration::from_secs(30)),
        ..SessionConfig::default()
    };
    let _stats = args
        .program_stats
        .then(tap_probe_observer::bpf::probe::enable_run_stats)
        .transpose()?;
    let mut session = LoadSession::start(&session_cfg, stop.flag())?;
    let device = session.device().clone();
    let filter = Filter {
        globs: vec![device.name.clone()],
        netns: Some(device.netns_name.clone()),
        macvtap: false,
    };
    let mut watcher = Watcher::with_backend(&KernelInfo::load()?, &filter, Backend::Auto)?;
    let out = output::Output::new(args.format);
    if args.format == Format::Table {
        eprintln!("{}", banner(args, &device.name, &device.netns_name));
    }
    let mut previous = watcher.refresh()?;
    out.show(&previous, None)?;

    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "pps and duration are bounded by their parsers"
    )]
    let count = (args.pps as f64 * args.duration.as_secs_f64()).ceil() as u64;
    let load_cfg = LoadConfig {
        session: session_cfg,
        packets: count,
        duration: args.duration,
        pps: Some(args.pps),
        ..LoadConfig::default()
    };
    let sender_cfg = SenderConfig {
        pps: load_cfg.pps,
        frame_len: load_cfg.frame_len,
        batch: load_cfg.batch,
        ..SenderConfig::new(0, count, args.duration)
    };
    let sent = std::thread::scope(|scope| -> anyhow::Result<_> {
        let sender = scope.spawn(|| session.send(&sender_cfg));
        let end = Instant::now() + args.duration;
        while !sender.is_finished() {
            let wait = args.interval.min(
                end.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(50)),
            );
            // A stop also stops the sender (it shares the flag); the loop ends with it.
            if output::sleep(&stop, wait) {
                break;
            }
            let report = watcher.refresh()?;
            out.show(&report, Some(&previous))?;
            previous = report;
        }
        sender
            .join()
            .map_err(|_| anyhow!("the sender thread panicked"))?
    })?;
    let drained = session.drain()?;
    let mut last = watcher.refresh()?;
    if args.program_stats {
        last.programs = Some(watcher.program_stats());
    }
    let load = LoadReport::of_run(&session, &load_cfg, &sent, &drained, stop.stopped());
    match args.format {
        Format::Json => output::stdout(&output::json::json_line_with(
            &last,
            true,
            "load",
            serde_json::to_value(&load)?,
        )?)?,
        Format::Table => {
            out.summary(&last)?;
            if let Some(row) = last.rows.first() {
                eprintln!("{}", explain(row, &load));
            }
        }
    }
    if stop.stopped() {
        bail!(
            "the demo was cut short after {:.1} s of its {} s; the figures above cover the \
             traffic until then, and the namespace, the tap and the probes were removed",
            load.numbers.elapsed_secs,
            args.duration.as_secs_f64()
        );
    }
    Ok(())
}

/// What the demo does, in a sentence, before it starts.
fn banner(args: &Args, tap: &str, netns: &str) -> String {
    format!(
        "tap-probe demo: tap {tap}{} in network namespace {netns}, qdisc {}; a reader takes {} \
         pkt/s (an emulated slow VM) while {} pkt/s are sent for {} s. Ctrl-C stops early.",
        if args.backpressure {
            " (IFF_BACKPRESSURE)"
        } else {
            ""
        },
        clap::ValueEnum::to_possible_value(&args.qdisc)
            .map_or_else(String::new, |v| v.get_name().to_owned()),
        args.reader_pps,
        args.pps,
        args.duration.as_secs_f64()
    )
}

/// A few sentences on what the counters showed, checked against the kernel's own.
fn explain(row: &Row, load: &LoadReport) -> String {
    let check = |ours: u64, kernel: u64| if ours == kernel { "equal" } else { "DIFFERENT" };
    let n = &load.numbers;
    let c = &row.counters;
    let mut text = format!(
        "\nThe sender handed {} packets to the stack ({} dropped on the way); the driver was \
         called {} times. The reader took {} packets (kernel tx_packets: {}, {}); {} were \
         dropped because the ring was full (kernel tx_dropped: {}, {}).",
        n.attempted,
        n.enobufs,
        c.xmit_calls,
        c.consumed,
        n.kernel_tx_packets,
        check(c.consumed, n.kernel_tx_packets),
        c.dropped_full_ring,
        n.kernel_tx_dropped,
        check(c.dropped_full_ring, n.kernel_tx_dropped),
    );
    if let (Some(requeues), Some(drops)) = (n.qdisc_requeues, n.qdisc_drops) {
        let _ = write!(
            text,
            " The queue stopped {} times and woke {} times; the qdisc ({}) put back {} packets \
             (busy {} + requeued while stopped {}: {}) and dropped {}.",
            c.queue_stops,
            c.queue_wakes,
            load.qdisc,
            requeues,
            c.busy,
            c.requeued_stopped,
            check(c.busy + c.requeued_stopped, requeues),
            drops,
        );
    }
    text.push_str(match row.backpressure {
        Some(true) => {
            " This tap stops its queue when its ring fills, so with a qdisc the qdisc holds \
             the packets (or drops by its own limit) instead of the ring tail-dropping them."
        }
        Some(false) => {
            " This tap tail-drops when its ring is full; with the tun/tap 'avoid tail-drop' \
             fix (Linux 7.3 with --backpressure) and a qdisc, those drops become queue stops."
        }
        None => "",
    });
    text
}
