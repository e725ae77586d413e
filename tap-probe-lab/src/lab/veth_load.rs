//! `tap-probe load --topology veth`: bounded traffic through a veth pair between two private
//! namespaces instead of a tap: the numbered UDP frames, or TCP streams (`--proto tcp`) that
//! the receiver's own stack takes, with the peer slowed on request (the slow-consumer XDP
//! program), which makes veth push back (`NETDEV_TX_BUSY`) into the sender's qdisc.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use anyhow::Result;

use crate::lab::streams::{RECEIVER_DEV, SENDER_DEV, TcpCounters, VethConfig, VethLink};
use crate::lab::traffic::{self, SenderConfig};
use tap_probe_observer::os::netlink::{QdiscStats, Rtnl};
use tap_probe_observer::os::netns::run_in;

/// What goes through the pair.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, clap::ValueEnum, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub enum Proto {
    /// The numbered frames (flow id and sequence number), through a packet socket.
    #[default]
    Udp,
    /// TCP streams from a socket in the sender's namespace to one in the receiver's.
    Tcp,
}

/// A whole veth `load` run.
#[derive(Debug, Clone)]
pub struct VethLoadConfig {
    pub link: VethConfig,
    pub proto: Proto,
    /// TCP connections at once.
    pub streams: u32,
    /// UDP: the frames, as the tap's load sends them.
    pub sender: SenderConfig,
    pub duration: Duration,
    pub start_delay: Duration,
}

/// What a veth run did; the counters are the kernel's own.
#[derive(Debug, Clone, serde::Serialize)]
pub struct VethLoadReport {
    /// The sender's namespace and end (what `watch --netns NAME --dev tp-snd0` finds).
    pub(crate) netns: String,
    pub(crate) device: &'static str,
    pub(crate) peer: &'static str,
    pub(crate) qdisc: String,
    pub(crate) tso: bool,
    pub(crate) peer_hold_ns: Option<u64>,
    pub(crate) proto: Proto,
    pub(crate) streams: Option<u32>,
    pub(crate) flows: Option<u32>,
    /// UDP frames sent and refused (`ENOBUFS`); TCP bytes written and read.
    pub(crate) frames_sent: Option<u64>,
    pub(crate) frames_enobufs: Option<u64>,
    pub(crate) bytes_sent: Option<u64>,
    pub(crate) bytes_received: Option<u64>,
    pub(crate) elapsed_secs: f64,
    pub(crate) qdisc_requeues: Option<u64>,
    pub(crate) qdisc_drops: Option<u64>,
    /// Change of the sender's end's own `tx_packets` and `tx_dropped` over the run.
    pub(crate) kernel_tx_packets: Option<u64>,
    pub(crate) kernel_tx_dropped: Option<u64>,
    /// The TCP counters of the sender's and the receiver's namespace over the run.
    pub(crate) sender_tcp: TcpCounters,
    pub(crate) receiver_tcp: TcpCounters,
    pub interrupted: bool,
}

/// Runs a veth `load`; setting `stop` ends it early with `interrupted` set.
///
/// # Errors
/// When a step fails; everything created is removed.
pub fn run_veth_load(cfg: &VethLoadConfig, stop: &Arc<AtomicBool>) -> Result<VethLoadReport> {
    let name = format!("tap-probe-load-{}", std::process::id());
    let link = VethLink::create(&name, cfg.link)?;
    eprintln!(
        "veth {SENDER_DEV} in {} -> {RECEIVER_DEV} in {}",
        link.sender.name(),
        link.receiver.name()
    );
    crate::lab::load::sleep_unless(cfg.start_delay, stop);
    let qdisc = || -> Option<QdiscStats> {
        run_in(link.sender.path(), || {
            Rtnl::open()?.root_qdisc_stats(link.sender_ifindex)
        })
        .ok()
    };
    let q0 = qdisc();
    let link0 = link.sender_stats().ok();
    let (s0, r0) = link.tcp_counters()?;
    let mut report = VethLoadReport {
        netns: link.sender.name().to_owned(),
        device: SENDER_DEV,
        peer: RECEIVER_DEV,
        qdisc: cfg.link.qdisc.kind().to_owned(),
        tso: cfg.link.tso,
        peer_hold_ns: cfg.link.slow_peer_ns,
        proto: cfg.proto,
        streams: None,
        flows: None,
        frames_sent: None,
        frames_enobufs: None,
        bytes_sent: None,
        bytes_received: None,
        elapsed_secs: 0.0,
        qdisc_requeues: None,
        qdisc_drops: None,
        kernel_tx_packets: None,
        kernel_tx_dropped: None,
        sender_tcp: TcpCounters::default(),
        receiver_tcp: TcpCounters::default(),
        interrupted: false,
    };
    if !stop.load(Ordering::Relaxed) {
        match cfg.proto {
            Proto::Udp => {
                let sender = SenderConfig {
                    ifindex: link.sender_ifindex,
                    deadline: cfg.duration,
                    stop: Some(Arc::clone(stop)),
                    ..cfg.sender.clone()
                };
                let sent = run_in(link.sender.path(), || traffic::send(&sender))?;
                report.flows = Some(sender.flows);
                report.frames_sent = Some(sent.sent);
                report.frames_enobufs = Some(sent.enobufs);
                report.elapsed_secs = sent.elapsed.as_secs_f64();
            }
            Proto::Tcp => {
                let streams = link.tcp_streams(cfg.streams, cfg.duration, u64::MAX, stop)?;
                report.streams = Some(cfg.streams);
                report.bytes_sent = Some(streams.sent);
                report.bytes_received = Some(streams.received);
                report.elapsed_secs = streams.elapsed.as_secs_f64();
            }
        }
    }
    settle(&qdisc, || link.sender_stats().ok().map(|s| s.tx_packets));
    let (s1, r1) = link.tcp_counters()?;
    report.sender_tcp = s1.since(&s0);
    report.receiver_tcp = r1.since(&r0);
    if let (Some(a), Some(b)) = (q0, qdisc()) {
        report.qdisc_requeues = Some(b.requeues.saturating_sub(a.requeues));
        report.qdisc_drops = Some(b.drops.saturating_sub(a.drops));
    }
    if let (Some(a), Ok(b)) = (link0, link.sender_stats()) {
        report.kernel_tx_packets = Some(b.tx_packets.saturating_sub(a.tx_packets));
        report.kernel_tx_dropped = Some(b.tx_dropped.saturating_sub(a.tx_dropped));
    }
    report.interrupted = stop.load(Ordering::Relaxed);
    drop(link);
    Ok(report)
}

/// Waits until what the sender's end still holds after the sender stopped has reached the
/// peer: the qdisc empty, and the end's `tx_packets` unchanged for [`SETTLED`]. With NAPI on
/// the peer (threaded, or GRO), veth counts a packet as sent when the peer's NAPI takes it
/// from the ring (`veth_get_stats64` adds the peer's `xdp_packets`), not when the driver
/// call put it there: read earlier, the kernel's figure is short by what the rings hold,
/// and a slow peer on a loaded machine held 433 packets 200 ms after the sender stopped.
/// At most [`SETTLE_FOR`]; the report's figures are read then, settled or not.
fn settle(qdisc: &dyn Fn() -> Option<QdiscStats>, tx_packets: impl Fn() -> Option<u64>) {
    let deadline = std::time::Instant::now() + SETTLE_FOR;
    let mut last = (tx_packets(), std::time::Instant::now());
    while std::time::Instant::now() < deadline {
        std::thread::sleep(Duration::from_millis(20));
        let now = tx_packets();
        if now != last.0 {
            last = (now, std::time::Instant::now());
            continue;
        }
        let empty = qdisc().is_none_or(|q| q.qlen == 0);
        if empty && last.1.elapsed() >= SETTLED {
            return;
        }
    }
}

/// How long the sender's end's `tx_packets` stays unchanged once the rings are empty,
/// before [`settle`] takes its figures as final: a slow peer takes a packet every few
/// hundred microseconds, so a wait this long without one means none is left.
const SETTLED: Duration = Duration::from_millis(200);

/// The most [`settle`] waits.
const SETTLE_FOR: Duration = Duration::from_secs(10);

impl VethLoadReport {
    /// The report as `(name, value)` pairs, in the order a reader wants them (the binary
    /// aligns them into a table).
    #[must_use]
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let rate = |n: Option<u64>| {
            n.filter(|_| self.elapsed_secs > 0.0).map_or_else(
                || "-".to_owned(),
                #[expect(clippy::cast_precision_loss, reason = "a rate")]
                |n| format!("{:.0}", n as f64 * 8.0 / self.elapsed_secs / 1e6),
            )
        };
        vec![
            (
                "device",
                format!("{} (netns {}) -> {}", self.device, self.netns, self.peer),
            ),
            ("qdisc", self.qdisc.clone()),
            ("tso", self.tso.to_string()),
            ("peer hold ns", opt(self.peer_hold_ns)),
            ("proto", format!("{:?}", self.proto).to_lowercase()),
            ("streams", opt(self.streams.map(u64::from))),
            ("flows", opt(self.flows.map(u64::from))),
            ("frames sent", opt(self.frames_sent)),
            ("frames enobufs", opt(self.frames_enobufs)),
            ("bytes sent", opt(self.bytes_sent)),
            ("bytes received", opt(self.bytes_received)),
            ("Mbit/s received", rate(self.bytes_received)),
            ("elapsed", format!("{:.3} s", self.elapsed_secs)),
            ("qdisc requeues", opt(self.qdisc_requeues)),
            ("qdisc drops", opt(self.qdisc_drops)),
            ("kernel tx_packets", opt(self.kernel_tx_packets)),
            ("kernel tx_dropped", opt(self.kernel_tx_dropped)),
            (
                "sender TCP retransmits",
                self.sender_tcp.retrans_segs.to_string(),
            ),
            ("sender TCP segments", self.sender_tcp.out_segs.to_string()),
            (
                "receiver TCPOFOQueue",
                self.receiver_tcp.ofo_queue.to_string(),
            ),
        ]
    }
}
