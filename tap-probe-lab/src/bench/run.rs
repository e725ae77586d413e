//! Measuring the cells of the table: each run is a `load` through a fresh tap, with no
//! probe attached (the bench measures the kernel, not tap-probe), its delivered rate and
//! losses taken from the load's report and the kernel's own counters.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Result, bail};

use super::table::{Path, Run, Variant};
use crate::lab::load::{LoadConfig, SessionConfig, run_load_with_stop};
use tap_probe_observer::kernel::{KernelInfo, TunBackpressure};
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_spec::traffic::ReaderKind;

/// Which version of the tail-drop fix the running kernel has, which decides what the
/// Stock and Backpressure columns run.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Fix {
    /// The fix as merged (Linux 7.3): opt-in per tap with `IFF_BACKPRESSURE`. Stock: the
    /// flag off; Backpressure: the flag on. Both with `fq_codel`.
    Flag,
    /// The fix as posted (a patched tun.ko): always on where a qdisc is present. Stock:
    /// `noqueue`, which keeps the tail-drop; Backpressure: `fq_codel`.
    Patched,
}

impl Fix {
    /// The running kernel's, as [`KernelInfo`] tells it.
    ///
    /// # Errors
    /// When the kernel has none: there is nothing to compare.
    pub fn detect() -> Result<Self> {
        match KernelInfo::tun_backpressure_now()? {
            TunBackpressure::OptIn => return Ok(Self::Flag),
            TunBackpressure::Always => return Ok(Self::Patched),
            TunBackpressure::Never => {}
        }
        bail!(
            "this kernel ({}) has no tail-drop fix for tun (no IFF_BACKPRESSURE, no \
             __tun_wake_queue): run the bench on one that has, e.g. `tap-probe vm --kernel \
             debian-7.3 -- bench`",
            tap_probe_observer::kernel::release()
        )
    }

    /// What each column runs, for the table's header.
    #[must_use]
    pub fn describe(self, variant: Variant) -> &'static str {
        match (self, variant) {
            (Self::Flag, Variant::Stock) => "IFF_BACKPRESSURE off, fq_codel",
            (Self::Flag, Variant::Backpressure) => "IFF_BACKPRESSURE on, fq_codel",
            (Self::Patched, Variant::Stock) => "patched tun, noqueue (tail-drop kept)",
            (Self::Patched, Variant::Backpressure) => "patched tun, fq_codel",
        }
    }

    fn session(self, variant: Variant) -> (RootQdisc, bool) {
        match (self, variant) {
            (Self::Flag, v) => (RootQdisc::FqCodel, v == Variant::Backpressure),
            (Self::Patched, Variant::Stock) => (RootQdisc::Noqueue, false),
            (Self::Patched, Variant::Backpressure) => (RootQdisc::FqCodel, false),
        }
    }
}

/// One run of one cell: `packets` sent as fast as the stack takes them by `threads`
/// senders, the reader as fast as it can.
///
/// # Errors
/// When the run fails or is interrupted.
pub fn measure(
    fix: Fix,
    path: Path,
    threads: u32,
    variant: Variant,
    packets: u64,
    stop: &Arc<AtomicBool>,
) -> Result<Run> {
    let (qdisc, backpressure) = fix.session(variant);
    let cfg = LoadConfig {
        session: SessionConfig {
            qdisc: Some(qdisc),
            backpressure,
            reader: match path {
                Path::Tap => ReaderKind::Read,
                Path::TapVhost => ReaderKind::Vhost,
            },
            ..SessionConfig::default()
        },
        packets,
        duration: RUN_LIMIT,
        sender_threads: threads,
        ..LoadConfig::default()
    };
    let report = run_load_with_stop(&cfg, stop)?;
    if report.interrupted {
        bail!("interrupted");
    }
    let n = report.numbers;
    let delivered = n.read_by_reader + n.drained;
    let lost = n.attempted.saturating_sub(delivered);
    #[expect(
        clippy::cast_precision_loss,
        reason = "a rate; 52 bits of packet count are plenty"
    )]
    let lost_per_sec = if n.elapsed_secs > 0.0 {
        lost as f64 / n.elapsed_secs
    } else {
        0.0
    };
    Ok(Run {
        delivered_pps: n.delivered_pps,
        lost_per_sec,
        ring_drops: n.kernel_tx_dropped,
        qdisc_drops: n.qdisc_drops.unwrap_or(0),
    })
}

/// A run ends after this long even if its packets were not all sent.
const RUN_LIMIT: Duration = Duration::from_mins(2);
