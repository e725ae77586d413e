//! `tap-probe demo`: a tap in a private namespace, read by a deliberately slow reader (an
//! emulated VM), fed bounded traffic, watched live; then everything is removed again.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, anyhow};

use crate::discovery::Filter;
use crate::load::{LoadSession, QdiscArg, SessionConfig};
use crate::render::{self, Format};
use crate::report::Row;
use crate::traffic::SenderConfig;
use crate::watch::{Stop, Watcher};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Seconds of traffic.
    #[arg(long, value_name = "SECS", default_value_t = 10.0, value_parser = secs)]
    pub(crate) duration: f64,
    /// Root qdisc on the tap.
    #[arg(long, value_enum, default_value_t = QdiscArg::PfifoFast)]
    pub(crate) qdisc: QdiscArg,
    /// Packets per second the emulated VM reads.
    #[arg(long, value_name = "N", default_value_t = 20_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) reader_pps: u64,
    /// Packets per second sent into the tap.
    #[arg(long, value_name = "N", default_value_t = 100_000, value_parser = clap::value_parser!(u64).range(1..))]
    pub(crate) pps: u64,
    /// Seconds between refreshes.
    #[arg(long, value_name = "SECS", default_value_t = 1.0, value_parser = secs)]
    pub(crate) interval: f64,
    #[arg(long, value_enum, default_value_t = Format::Table)]
    pub(crate) format: Format,
}

fn secs(s: &str) -> Result<f64, String> {
    match s.parse::<f64>() {
        Ok(v) if v.is_finite() && v > 0.0 && v <= 3600.0 => Ok(v),
        _ => Err(format!("{s:?} must be a number of seconds in (0, 3600]")),
    }
}

/// Runs `tap-probe demo`.
///
/// # Errors
/// Missing privileges or kernel features, or a failing step; the namespace, tap and probes
/// are removed in every case (they are guards), also on Ctrl-C and SIGTERM.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    crate::privileges::check()?;
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .context("starting the runtime")?;
    let mut signals = runtime.block_on(async { Stop::install() })?;
    let stop = Arc::new(AtomicBool::new(false));
    let session_cfg = SessionConfig {
        qdisc: Some(args.qdisc.into()),
        tx_queue_len: None,
        reader_pps: Some(args.reader_pps),
        reader_deadline: Some(Duration::from_secs_f64(args.duration) + Duration::from_secs(30)),
    };
    let mut session = LoadSession::start(&session_cfg, Arc::clone(&stop))?;
    let device = session.device().clone();
    let mut watcher = Watcher::new(&Filter {
        globs: vec![device.name.clone()],
        netns: Some(device.netns_name.clone()),
    })?;
    let out = render::Output::new(args.format);
    if args.format == Format::Table {
        eprintln!(
            "tap-probe demo: tap {} in network namespace {}, qdisc {}; a reader takes {} pkt/s \
             (an emulated slow VM) while {} pkt/s are sent for {} s. Ctrl-C stops early.",
            device.name,
            device.netns_name,
            clap::ValueEnum::to_possible_value(&args.qdisc)
                .map_or_else(String::new, |v| v.get_name().to_owned()),
            args.reader_pps,
            args.pps,
            args.duration
        );
    }
    let mut previous = watcher.refresh()?;
    out.show(&previous, None)?;

    let duration = Duration::from_secs_f64(args.duration);
    #[expect(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::cast_precision_loss,
        reason = "pps and duration are bounded by their parsers"
    )]
    let count = (args.pps as f64 * args.duration).ceil() as u64;
    let sender_cfg = SenderConfig {
        pps: Some(args.pps),
        ..SenderConfig::new(0, count, duration)
    };
    let period = Duration::from_secs_f64(args.interval);
    let sent = std::thread::scope(|scope| -> anyhow::Result<_> {
        let sender = scope.spawn(|| session.send(&sender_cfg));
        let end = Instant::now() + duration;
        while !sender.is_finished() {
            let wait = period.min(
                end.saturating_duration_since(Instant::now())
                    .max(Duration::from_millis(50)),
            );
            if runtime.block_on(signals.sleep(wait)) {
                stop.store(true, Ordering::Relaxed);
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
    let last = watcher.refresh()?;
    out.summary(&last)?;
    if let (Format::Table, Some(row)) = (args.format, last.rows.first()) {
        let kernel = &drained.link;
        eprintln!(
            "{}",
            explain(row, sent.sent, kernel.tx_packets, kernel.tx_dropped)
        );
    }
    Ok(())
}

/// A few sentences on what the counters showed, checked against the kernel's own.
fn explain(row: &Row, sent: u64, tx_packets: u64, tx_dropped: u64) -> String {
    let check = |ours: u64, kernel: u64| if ours == kernel { "equal" } else { "DIFFERENT" };
    format!(
        "\nThe sender handed {sent} packets to the stack; the driver was called {} times. The \
         reader took {} packets (kernel tx_packets: {tx_packets}, {}); {} were dropped because \
         the ring was full (kernel tx_dropped: {tx_dropped}, {}). This kernel tail-drops when \
         the ring is full; with the tun/tap 'avoid tail-drop' series and a qdisc, those drops \
         become queue stops and NETDEV_TX_BUSY requeues (the busy, stops and wakes columns).",
        row.xmit_calls,
        row.consumed,
        check(row.consumed, tx_packets),
        row.dropped_full_ring,
        check(row.dropped_full_ring, tx_dropped),
    )
}
