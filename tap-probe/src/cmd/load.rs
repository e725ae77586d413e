//! `tap-probe load`: bounded traffic through a fresh tap in a private network namespace,
//! with a reader thread playing the VM, and a report of what got through; or through a veth
//! pair between two private namespaces (`--topology veth`), UDP frames or TCP streams.

use std::time::Duration;

use anyhow::{Context as _, Result, bail};

use crate::output::Format;
use tap_probe_lab::lab::load::{LoadConfig, SessionConfig, root_qdisc, run_load_with_stop};
use tap_probe_lab::lab::streams::VethConfig;
use tap_probe_lab::lab::traffic::SenderConfig;
use tap_probe_lab::lab::veth_load::{Proto, VethLoadConfig, run_veth_load};
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_observer::os::signals::Stop;
use tap_probe_spec::traffic::{Qdisc, ReaderKind};

/// Where the traffic goes.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Topology {
    /// A tap with a reader thread playing the VM.
    #[default]
    Tap,
    /// A veth pair whose other end is in a namespace of its own (`tp-snd0` -> `tp-rcv0`).
    Veth,
}

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Where the traffic goes: a tap (`tap`) or a veth pair between two namespaces (`veth`).
    #[arg(long, value_enum, default_value_t)]
    pub(crate) topology: Topology,
    /// What to send: the numbered UDP frames (`udp`) or TCP streams (`tcp`, veth only: TCP
    /// needs a receiving stack).
    #[arg(long, value_enum, default_value_t)]
    pub(crate) proto: Proto,
    /// TCP connections at once (`--proto tcp`).
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=64))]
    pub(crate) streams: u32,
    /// Nanoseconds the veth peer spends on each packet (an XDP program, threaded NAPI): a
    /// slow reader that makes veth push back into the qdisc. Unset: the peer takes packets as
    /// they come.
    #[arg(long, value_name = "NS")]
    pub(crate) peer_hold_ns: Option<u64>,
    /// Turn TCP segmentation offload off on the veth's sending end, so the qdisc path cuts
    /// TCP's GSO packets into segment lists (the requeue-reordering scenario).
    #[arg(long)]
    pub(crate) no_tso: bool,
    /// Root qdisc to install on the tap (default: the kernel's, `pfifo_fast`); `tc`'s names
    /// (`pfifo_fast`, `fq_codel`) are taken too.
    #[arg(long, value_enum)]
    pub(crate) qdisc: Option<Qdisc>,
    /// Open the tap with `IFF_BACKPRESSURE`: it stops its queue when the ring fills, so the
    /// qdisc holds packets instead of the driver dropping them (Linux 7.3; refused where
    /// the kernel lacks it).
    #[arg(long)]
    pub(crate) backpressure: bool,
    /// Transmit queue length of the tap (also the size of its ring).
    #[arg(long, value_name = "N")]
    pub(crate) tx_queue_len: Option<u32>,
    /// Who reads the tap: `read` (a thread calling read(2), as QEMU without vhost-net) or
    /// `vhost` (vhost-net driven from userspace: needs /dev/vhost-net).
    #[arg(long, value_enum, default_value_t)]
    pub(crate) reader: ReaderKind,
    /// Packets per second the reader takes (a slow VM); unlimited when not given.
    #[arg(long, value_name = "N")]
    pub(crate) reader_pps: Option<u64>,
    /// Packets to send at most.
    #[arg(long, default_value_t = 2_000_000)]
    pub(crate) packets: u64,
    /// How long to send at most (seconds, or with a unit: 500ms, 2m).
    #[arg(long, value_name = "DURATION", default_value = "5", value_parser = crate::cli::duration)]
    pub(crate) duration: Duration,
    /// Ethernet frame length in bytes.
    #[arg(long, default_value_t = 64)]
    pub(crate) frame_len: usize,
    /// Packets per second to send; as fast as possible when not given.
    #[arg(long, value_name = "N")]
    pub(crate) pps: Option<u64>,
    /// Threads sending at once, each with its own socket; --packets and --pps are split
    /// evenly among them.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=16))]
    pub(crate) sender_threads: u32,
    /// Flows each sender spreads its frames over, round-robin; each frame carries its flow
    /// id and its sequence number in that flow, so the probe and the reader can count the
    /// frames that came out of order.
    #[arg(long, value_name = "N", default_value_t = 1, value_parser = clap::value_parser!(u32).range(1..=65536))]
    pub(crate) flows: u32,
    /// Frames per sendmmsg call.
    #[arg(long, default_value_t = 64)]
    pub(crate) batch: usize,
    /// How long to wait after the tap is up before sending (time for a separately started
    /// `tap-probe watch` to discover it).
    #[arg(long, value_name = "DURATION", default_value = "0", value_parser = crate::cli::delay)]
    pub(crate) start_delay: Duration,
    #[arg(long, value_enum, default_value_t)]
    pub(crate) format: Format,
}

/// Runs `tap-probe load`.
///
/// # Errors
/// When a step of the run fails or the run is interrupted; everything created is removed
/// first.
pub(crate) fn run(args: &Args) -> Result<()> {
    check_combination(args)?;
    if args.topology == Topology::Veth {
        return run_veth(args);
    }
    let cfg = LoadConfig {
        session: SessionConfig {
            qdisc: args.qdisc.map(root_qdisc),
            tx_queue_len: args.tx_queue_len,
            backpressure: args.backpressure,
            reader: args.reader,
            reader_pps: args.reader_pps,
            reader_deadline: None,
        },
        packets: args.packets,
        duration: args.duration,
        frame_len: args.frame_len,
        pps: args.pps,
        batch: args.batch,
        start_delay: args.start_delay,
        sender_threads: args.sender_threads,
        flows: args.flows,
    };
    check_capabilities()?;
    let stop = Stop::install()?;
    let report = run_load_with_stop(&cfg, &stop.flag())?;
    let cut_short = report.interrupted.then(|| {
        format!(
            "the load was cut short after {:.1} s of traffic: the report above covers it \
             (`interrupted` in JSON); the namespace and the tap were removed",
            report.numbers.elapsed_secs
        )
    });
    print_report(args.format, &report, report.fields(), cut_short)
}

/// Writes a load's report to stdout in `format`: the report itself as JSON, or its
/// `fields` as a table. A load that was interrupted then fails with `cut_short`, after
/// its report, so that the exit status says the traffic was not all sent.
fn print_report(
    format: Format,
    report: &impl serde::Serialize,
    fields: Vec<(&'static str, String)>,
    cut_short: Option<String>,
) -> Result<()> {
    crate::output::stdout(&match format {
        Format::Json => serde_json::to_string(report)? + "\n",
        Format::Table => crate::output::table::name_values(fields),
    })?;
    if let Some(why) = cut_short {
        bail!(why);
    }
    Ok(())
}

/// Refuses options that do not apply to the topology, saying what does.
fn check_combination(args: &Args) -> Result<()> {
    match args.topology {
        Topology::Tap => {
            if args.proto == Proto::Tcp {
                bail!("--proto tcp needs a receiving TCP stack: use it with --topology veth");
            }
            if args.peer_hold_ns.is_some() || args.no_tso {
                bail!("--peer-hold-ns and --no-tso set up a veth peer: add --topology veth");
            }
        }
        Topology::Veth => {
            if args.backpressure || args.reader != ReaderKind::Read || args.reader_pps.is_some() {
                bail!(
                    "--backpressure, --reader and --reader-pps set up a tap; with --topology \
                     veth the peer's pace is --peer-hold-ns"
                );
            }
            if args.tx_queue_len.is_some() {
                bail!("--tx-queue-len sets a tap's ring; a veth's ring has a fixed size");
            }
        }
    }
    Ok(())
}

/// `load --topology veth`.
fn run_veth(args: &Args) -> Result<()> {
    let cfg = VethLoadConfig {
        link: VethConfig {
            qdisc: args.qdisc.map_or(RootQdisc::PfifoFast, root_qdisc),
            tso: !args.no_tso,
            slow_peer_ns: args.peer_hold_ns,
        },
        proto: args.proto,
        streams: args.streams,
        sender: SenderConfig {
            frame_len: args.frame_len,
            pps: args.pps,
            batch: args.batch,
            flows: args.flows,
            ..SenderConfig::new(0, args.packets, args.duration)
        },
        duration: args.duration,
        start_delay: args.start_delay,
    };
    check_capabilities()?;
    let stop = Stop::install()?;
    let report = run_veth_load(&cfg, &stop.flag())?;
    let cut_short = report.interrupted.then(|| {
        "the load was cut short: the report above covers the traffic until then \
         (`interrupted` in JSON); the namespaces and the veth pair were removed"
            .to_owned()
    });
    print_report(args.format, &report, report.fields(), cut_short)
}

/// `load` needs `CAP_SYS_ADMIN` (namespaces, mounts), `CAP_NET_ADMIN` (tap, links, qdiscs)
/// and `CAP_NET_RAW` (the packet socket); not the BPF ones `privileges::check` asks for.
fn check_capabilities() -> Result<()> {
    const NEEDED: [(u32, &str); 3] = [
        (21, "CAP_SYS_ADMIN"),
        (12, "CAP_NET_ADMIN"),
        (13, "CAP_NET_RAW"),
    ];
    let status =
        std::fs::read_to_string("/proc/self/status").context("cannot read /proc/self/status")?;
    let eff = tap_probe_observer::kernel::privileges::parse_cap_eff(&status)?;
    let missing: Vec<&str> = NEEDED
        .iter()
        .filter(|(bit, _)| eff & (1 << bit) == 0)
        .map(|(_, name)| *name)
        .collect();
    if !missing.is_empty() {
        bail!(
            "tap-probe load lacks {}: run it as root (sudo tap-probe load ...)",
            missing.join(", ")
        );
    }
    Ok(())
}
