//! TCP through a veth pair that joins two private namespaces, a sender's and a receiver's:
//! the scene of the seeds' "net/sched: fix packet reordering on requeue" (a root qdisc on
//! the sender's end, TSO off, a slow peer that makes veth answer `NETDEV_TX_BUSY`), with
//! the receiving stack's own TCP counters as the witness of what arrived out of order.

use std::io::{ErrorKind, Read as _, Write as _};
use std::net::{Ipv4Addr, TcpListener, TcpStream};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::lab::pacer::deadline_after;
use crate::lab::slow_consumer::SlowConsumer;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};

/// The sender's end and its address; the receiver's end has [`RECEIVER_ADDR`].
const SENDER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 1);
const RECEIVER_ADDR: Ipv4Addr = Ipv4Addr::new(10, 201, 0, 2);
/// The names of the two ends, each in its own namespace.
pub const SENDER_DEV: &str = "tp-snd0";
pub const RECEIVER_DEV: &str = "tp-rcv0";
/// How long a blocked read or write waits before the deadline is checked again.
const IO_SLICE: Duration = Duration::from_millis(100);
/// The receivers outlive the senders' deadline by at most this, reading what is in flight.
const RECEIVE_GRACE: Duration = Duration::from_secs(5);
const CHUNK: usize = 64 << 10;
/// `SIOCETHTOOL` (`include/uapi/linux/sockios.h`) as `ioctl`'s request type, which is
/// `c_ulong` with glibc and `c_int` with musl (libc declares the constant for the first).
const SIOCETHTOOL: libc::Ioctl = 0x8946;

/// How the pair is set up.
#[derive(Debug, Clone, Copy)]
pub struct VethConfig {
    /// Root qdisc of the sender's end.
    pub qdisc: RootQdisc,
    /// TCP segmentation offload on the sender's end. Off, TCP's GSO packets are cut into
    /// segments in the qdisc path (`validate_xmit_skb`), so one dequeue hands the driver a
    /// list: what a busy return puts back in `gso_skb`.
    pub tso: bool,
    /// Nanoseconds the receiver's end spends on each packet (the slow-consumer XDP program,
    /// threaded NAPI), or `None` for a peer that takes packets as fast as it can.
    pub slow_peer_ns: Option<u64>,
}

/// Two namespaces joined by a veth pair. Dropping it removes the devices and namespaces.
pub struct VethLink {
    // Declared (and so dropped) in this order: the XDP program, then the namespaces.
    consumer: Option<SlowConsumer>,
    /// The sender's namespace and end.
    pub sender: NamedNetns,
    pub sender_ifindex: u32,
    /// The receiver's namespace and end.
    pub receiver: NamedNetns,
    pub receiver_ifindex: u32,
}

impl VethLink {
    /// Creates the namespaces `NAME-s` and `NAME-r`, the pair, its addresses and qdisc.
    ///
    /// # Errors
    /// When a step is refused; whatever was created is removed.
    pub fn create(name: &str, cfg: VethConfig) -> Result<Self> {
        let sender = NamedNetns::create(&format!("{name}-s"))?;
        let receiver = NamedNetns::create(&format!("{name}-r"))?;
        let sender_ifindex = run_in(sender.path(), || {
            let mut rtnl = Rtnl::open()?;
            rtnl.add_veth_across(SENDER_DEV, RECEIVER_DEV, receiver.path())?;
            let ifindex = rtnl.link_by_name(SENDER_DEV)?.ifindex;
            rtnl.replace_root_qdisc(ifindex, cfg.qdisc)?;
            rtnl.add_address(ifindex, SENDER_ADDR, 24)?;
            set_tso(SENDER_DEV, cfg.tso)?;
            quiet(SENDER_DEV);
            rtnl.set_up(ifindex)?;
            Ok(ifindex)
        })?;
        let (receiver_ifindex, consumer) = run_in(receiver.path(), || {
            let mut rtnl = Rtnl::open()?;
            let ifindex = rtnl.link_by_name(RECEIVER_DEV)?.ifindex;
            rtnl.add_address(ifindex, RECEIVER_ADDR, 24)?;
            quiet(RECEIVER_DEV);
            rtnl.set_up(ifindex)?;
            let consumer = cfg
                .slow_peer_ns
                .map(|ns| SlowConsumer::attach(ifindex, RECEIVER_DEV, ns))
                .transpose()?;
            Ok((ifindex, consumer))
        })?;
        Ok(Self {
            consumer,
            sender,
            sender_ifindex,
            receiver,
            receiver_ifindex,
        })
    }

    /// The sender's end's own counters (`IFLA_STATS64`).
    ///
    /// # Errors
    /// When the link cannot be read.
    pub fn sender_stats(&self) -> Result<tap_probe_observer::os::netlink::LinkStats> {
        run_in(self.sender.path(), || {
            Ok(Rtnl::open()?.link_by_index(self.sender_ifindex)?.stats)
        })
    }

    /// `streams` TCP connections from the sender to the receiver, each writing as fast as
    /// it can for `duration` (or `bytes_per_stream`, or until `stop` is set, whichever comes
    /// first), each read to its end by the receiver.
    ///
    /// # Errors
    /// When a connection cannot be made or breaks.
    pub fn tcp_streams(
        &self,
        streams: u32,
        duration: Duration,
        bytes_per_stream: u64,
        stop: &AtomicBool,
    ) -> Result<StreamsReport> {
        let listener = run_in(self.receiver.path(), || {
            TcpListener::bind((RECEIVER_ADDR, 0)).context("listening in the receiver's namespace")
        })?;
        let to = listener.local_addr()?;
        let senders = run_in(self.sender.path(), || {
            (0..streams)
                .map(|_| {
                    TcpStream::connect_timeout(&to, Duration::from_secs(5))
                        .with_context(|| format!("connecting to {to} from the sender's namespace"))
                })
                .collect::<Result<Vec<_>>>()
        })?;
        let receivers = (0..streams)
            .map(|_| Ok(listener.accept()?.0))
            .collect::<Result<Vec<_>>>()
            .context("accepting the streams")?;
        let start = Instant::now();
        let end = deadline_after(start, duration);
        let (sent, received) = std::thread::scope(|scope| -> Result<_> {
            let readers: Vec<_> = receivers
                .into_iter()
                .map(|s| scope.spawn(move || receive(s, end + RECEIVE_GRACE)))
                .collect();
            let writers: Vec<_> = senders
                .into_iter()
                .map(|s| scope.spawn(move || send(s, end, bytes_per_stream, stop)))
                .collect();
            let join = |handles: Vec<std::thread::ScopedJoinHandle<'_, Result<u64>>>| {
                handles
                    .into_iter()
                    .map(|h| h.join().map_err(|_| anyhow!("a stream thread panicked"))?)
                    .sum::<Result<u64>>()
            };
            let sent = join(writers)?;
            Ok((sent, join(readers)?))
        })?;
        Ok(StreamsReport {
            sent,
            received,
            elapsed: start.elapsed(),
        })
    }

    /// The TCP counters of the sender's and the receiver's namespace.
    ///
    /// # Errors
    /// When `/proc` cannot be read.
    pub fn tcp_counters(&self) -> Result<(TcpCounters, TcpCounters)> {
        Ok((
            TcpCounters::of(self.sender.path())?,
            TcpCounters::of(self.receiver.path())?,
        ))
    }

    /// Whether the receiver's end is read by the slow-consumer program.
    #[must_use]
    pub fn slow_peer(&self) -> bool {
        self.consumer.is_some()
    }
}

/// What the streams moved.
#[derive(Debug, Clone, Copy, Default, serde::Serialize)]
pub struct StreamsReport {
    /// Bytes the senders wrote into their sockets.
    pub sent: u64,
    /// Bytes the receivers read: all of `sent` once every stream ended.
    pub received: u64,
    pub elapsed: Duration,
}

fn send(mut s: TcpStream, end: Instant, bytes: u64, stop: &AtomicBool) -> Result<u64> {
    s.set_write_timeout(Some(IO_SLICE))?;
    let buf = vec![0x5a_u8; CHUNK];
    let mut sent = 0u64;
    while sent < bytes && Instant::now() < end && !stop.load(Ordering::Relaxed) {
        let n = usize::try_from(bytes - sent).unwrap_or(CHUNK).min(CHUNK);
        match s.write(&buf[..n]) {
            Ok(n) => sent += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) => {}
            Err(e) => return Err(e).context("writing a stream"),
        }
    }
    s.shutdown(std::net::Shutdown::Write)
        .context("closing a stream")?;
    Ok(sent)
}

fn receive(mut s: TcpStream, end: Instant) -> Result<u64> {
    s.set_read_timeout(Some(IO_SLICE))?;
    let mut buf = vec![0u8; 4 * CHUNK];
    let mut received = 0u64;
    loop {
        match s.read(&mut buf) {
            Ok(0) => return Ok(received),
            Ok(n) => received += n as u64,
            Err(e)
                if matches!(
                    e.kind(),
                    ErrorKind::WouldBlock | ErrorKind::TimedOut | ErrorKind::Interrupted
                ) =>
            {
                if Instant::now() >= end {
                    bail!("a stream did not end within {RECEIVE_GRACE:?} of its deadline");
                }
            }
            Err(e) => return Err(e).context("reading a stream"),
        }
    }
}

/// A namespace's TCP counters (`/proc/net/snmp`, `/proc/net/netstat`), the ones `nstat`
/// shows.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct TcpCounters {
    /// `TcpExtTCPOFOQueue`: segments the receiver queued out of order
    /// (`tcp_data_queue_ofo`, `net/ipv4/tcp_input.c`): after a hole, however it came about
    /// (reordering or loss), counted per skb after GRO and backlog coalescing.
    pub ofo_queue: u64,
    /// `TcpRetransSegs`: segments retransmitted.
    pub retrans_segs: u64,
    /// `TcpOutSegs`, `TcpInSegs`.
    pub out_segs: u64,
    pub in_segs: u64,
}

impl TcpCounters {
    /// The counters of the namespace at `ns`.
    ///
    /// # Errors
    /// When `/proc` cannot be read or lacks a counter.
    pub fn of(ns: &Path) -> Result<Self> {
        run_in(ns, || {
            // thread-self: /proc/net is the calling thread's namespace's.
            let netstat = std::fs::read_to_string("/proc/thread-self/net/netstat")?;
            let snmp = std::fs::read_to_string("/proc/thread-self/net/snmp")?;
            Ok(Self {
                ofo_queue: field(&netstat, "TcpExt", "TCPOFOQueue")?,
                retrans_segs: field(&snmp, "Tcp", "RetransSegs")?,
                out_segs: field(&snmp, "Tcp", "OutSegs")?,
                in_segs: field(&snmp, "Tcp", "InSegs")?,
            })
        })
    }

    /// The change from `before`.
    #[must_use]
    pub fn since(&self, before: &Self) -> Self {
        Self {
            ofo_queue: self.ofo_queue - before.ofo_queue,
            retrans_segs: self.retrans_segs - before.retrans_segs,
            out_segs: self.out_segs - before.out_segs,
            in_segs: self.in_segs - before.in_segs,
        }
    }
}

/// `name` of the `group` in a `/proc/net/snmp`-style file: pairs of lines, the names after
/// `group:` on the first, the values on the second.
fn field(text: &str, group: &str, name: &str) -> Result<u64> {
    let prefix = format!("{group}:");
    let mut lines = text.lines().filter(|l| l.starts_with(&prefix));
    while let (Some(names), Some(values)) = (lines.next(), lines.next()) {
        if let Some(i) = names.split_whitespace().position(|n| n == name) {
            let value = values.split_whitespace().nth(i);
            return value
                .and_then(|v| v.parse().ok())
                .ok_or_else(|| anyhow!("{group} {name} has no number: {values}"));
        }
    }
    bail!("no {group} {name} in /proc/net")
}

/// Turns IPv6 off on `dev` before it comes up: it would send router and multicast-listener
/// solicitations of its own, so that the device's counters would not be the load's alone.
/// `/proc/sys/net` resolves against the calling thread's namespace. Absent IPv6 is fine.
fn quiet(dev: &str) {
    let _ = std::fs::write(format!("/proc/sys/net/ipv6/conf/{dev}/disable_ipv6"), "1");
}

/// `ethtool -K NAME tso on|off` (`ETHTOOL_STSO`, `include/uapi/linux/ethtool.h`), in the
/// calling thread's namespace.
fn set_tso(name: &str, on: bool) -> Result<()> {
    const ETHTOOL_STSO: u32 = 0x1f;
    #[repr(C)]
    struct EthtoolValue {
        cmd: u32,
        data: u32,
    }
    let mut value = EthtoolValue {
        cmd: ETHTOOL_STSO,
        data: u32::from(on),
    };
    // SAFETY: ifreq is plain old data.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr
        .ifr_name
        .iter_mut()
        .zip(name.bytes().take(libc::IFNAMSIZ - 1))
    {
        *dst = src.cast_signed();
    }
    ifr.ifr_ifru.ifru_data = (&raw mut value).cast();
    // SAFETY: plain socket(2) call.
    let raw = unsafe { libc::socket(libc::AF_INET, libc::SOCK_DGRAM | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error()).context("socket for the ethtool ioctl");
    }
    // SAFETY: raw is a fresh fd we own.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: ifr points at `value`, both live across the call.
    let rc = unsafe { libc::ioctl(socket.as_raw_fd(), SIOCETHTOOL, &raw mut ifr) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("turning TSO {} on {name}", if on { "on" } else { "off" }));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn reads_a_counter_of_a_group() {
        let text =
            "TcpExt: SyncookiesSent TCPOFOQueue\nTcpExt: 0 42\nIpExt: InNoRoutes\nIpExt: 7\n";
        assert_eq!(field(text, "TcpExt", "TCPOFOQueue").unwrap(), 42);
        assert_eq!(field(text, "IpExt", "InNoRoutes").unwrap(), 7);
        assert!(field(text, "TcpExt", "Nope").is_err());
    }
}
