//! Bounded traffic for tests, the demo and benchmarks: a sender that transmits Ethernet
//! frames through a device's qdisc and driver, and a reader that plays the VM on a tap
//! queue. Every loop stops at a packet count and at a deadline, whichever comes first.
//!
//! The frames are IPv4/UDP from 10.200.0.1 to 10.200.0.2:9 (the discard port) between
//! locally administered MACs 02:00:00:00:00:01 -> 02:00:00:00:00:02, with valid headers;
//! each flow has a source port of its own, so that a multi-queue device spreads flows over
//! its queues as it does a VM's (by a hash of the addresses and ports).
//! IPv4 rather than an experimental ethertype (0x88b5) so that whatever reads them - a
//! guest kernel, tcpdump, a tc or XDP filter - parses them as ordinary traffic and a guest
//! that receives them discards them without fuss. The payload starts with a big-endian
//! sequence number, [`FRAME_MAGIC`] and a flow id: the sender spreads its frames over
//! `flows` flows round-robin, each numbered from 0, so that the probe (`reordered`) and the
//! reader ([`FrameOrder`]) can tell when a frame came out of its flow's order.

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};

use tap_probe_common::FRAME_MAGIC;

use crate::lab::pacer::{Pacer, deadline_after};
use tap_probe_observer::os::clock::poll_timeout;
use tap_probe_observer::os::tap::Tap;

const ETH_HDR: usize = 14;
const IPV4_HDR: usize = 20;
const UDP_HDR: usize = 8;
/// Where the payload starts: the sequence number, then the magic and the flow id.
const PAYLOAD: usize = ETH_HDR + IPV4_HDR + UDP_HDR;
/// The smallest frame that holds the headers, the 8-byte sequence number, the magic and
/// the flow id.
pub(crate) const MIN_FRAME_LEN: usize = PAYLOAD + 16;
/// The largest frame: an IPv4 datagram is at most 64 KiB. The device MTU usually limits
/// it further (1514 for a default tap), which the kernel reports as `EMSGSIZE`.
pub(crate) const MAX_FRAME_LEN: usize = ETH_HDR + 65_535;
pub(crate) const DST_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x02];
pub(crate) const SRC_MAC: [u8; 6] = [0x02, 0, 0, 0, 0, 0x01];
const SRC_IP: [u8; 4] = [10, 200, 0, 1];
const DST_IP: [u8; 4] = [10, 200, 0, 2];
const DISCARD_PORT: u16 = 9;
/// Flow `f` is sent from port `FIRST_SOURCE_PORT + f % SOURCE_PORTS`.
const FIRST_SOURCE_PORT: u16 = 10_000;
const SOURCE_PORTS: u32 = 50_000;
/// The socket's send buffer, forced as root so that the qdisc limit, not socket memory, is
/// what pushes back; otherwise the sender blocks long before the qdisc overflows.
const SEND_BUFFER: libc::c_int = 64 << 20;
/// How long a blocked wait (poll) lasts at most before stop flags and deadlines are
/// checked again.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// What to send.
#[derive(Debug, Clone)]
pub struct SenderConfig {
    /// Device to transmit on, in the calling thread's network namespace.
    pub ifindex: u32,
    /// Frames to send at most.
    pub count: u64,
    /// Ethernet frame length in bytes, headers included, FCS excluded.
    pub frame_len: usize,
    /// Stop after this long even if `count` was not reached.
    pub deadline: Duration,
    /// Frames per second; `None` sends as fast as the stack takes them.
    pub pps: Option<u64>,
    /// Frames per `sendmmsg` call.
    pub batch: usize,
    /// Flows the frames are spread over, round-robin (at least 1).
    pub flows: u32,
    /// Stops the sender early when set (Ctrl-C).
    pub stop: Option<Arc<AtomicBool>>,
}

impl SenderConfig {
    #[must_use]
    pub fn new(ifindex: u32, count: u64, deadline: Duration) -> Self {
        Self {
            ifindex,
            count,
            frame_len: 64,
            deadline,
            pps: None,
            batch: 64,
            flows: 1,
            stop: None,
        }
    }
}

/// What the sender did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct SendReport {
    /// Frames handed to the kernel (`sent + enobufs`).
    pub attempted: u64,
    /// Frames the kernel accepted (queued in the qdisc or taken by the driver).
    pub sent: u64,
    /// Frames the stack dropped on the way: refused by a full qdisc, or dropped by the
    /// driver without a qdisc (`NET_XMIT_DROP`, `ENOBUFS` to the sender), including the one
    /// that ended a batch early.
    pub enobufs: u64,
    #[serde(serialize_with = "serialize_secs")]
    pub elapsed: Duration,
}

/// Sends `cfg.count` frames (or fewer if the deadline or the stop flag comes first) on
/// `cfg.ifindex` through an `AF_PACKET` socket, i.e. through the device's qdisc and
/// `ndo_start_xmit`, like any locally generated traffic.
///
/// # Errors
/// When the socket cannot be set up or the kernel refuses a frame for a reason other
/// than a full qdisc (e.g. `EMSGSIZE` for frames above the MTU, `ENETDOWN` for a device
/// that is down).
pub fn send(cfg: &SenderConfig) -> Result<SendReport> {
    if !(MIN_FRAME_LEN..=MAX_FRAME_LEN).contains(&cfg.frame_len) {
        bail!(
            "frame length {} is outside {MIN_FRAME_LEN}..={MAX_FRAME_LEN}",
            cfg.frame_len
        );
    }
    if cfg.pps == Some(0) {
        bail!("a rate of 0 packets per second sends nothing; leave the rate unset for no limit");
    }
    let flows = u64::from(cfg.flows.max(1));
    let (socket, forced) = packet_socket(cfg.ifindex)?;
    // A batch that stops short hides why (see `send_batch`); the count below takes the
    // message that ended it for a drop, which holds only where the socket's memory cannot
    // run out first. Without a forced buffer, one message per call keeps every error.
    let batch = if forced { cfg.batch.clamp(1, 1024) } else { 1 };
    let mut frames: Vec<Vec<u8>> = (0..batch).map(|_| frame(cfg.frame_len)).collect();

    let start = Instant::now();
    let end = deadline_after(start, cfg.deadline);
    let mut report = SendReport::default();
    let mut pacer = cfg.pps.map(|pps| Pacer::new(pps, start));
    let stopped = || cfg.stop.as_ref().is_some_and(|s| s.load(Ordering::Relaxed));

    while report.attempted < cfg.count && !stopped() {
        let now = Instant::now();
        if now >= end {
            break;
        }
        let remaining = cfg.count - report.attempted;
        let mut n = usize::try_from(remaining).unwrap_or(usize::MAX).min(batch);
        if let Some(pacer) = &mut pacer {
            let allowed = pacer.allowed(now, report.attempted);
            if allowed == 0 {
                pacer.wait(report.attempted, end);
                continue;
            }
            n = n.min(usize::try_from(allowed).unwrap_or(usize::MAX));
        }
        for (i, buf) in frames.iter_mut().take(n).enumerate() {
            number(buf, report.attempted + i as u64, flows);
        }
        match send_batch(socket.as_fd(), &mut frames[..n]) {
            Ok(sent) => {
                report.sent += sent as u64;
                report.attempted += sent as u64;
                if sent < n {
                    // The message after the last one sent failed, and sendmmsg dropped its
                    // error (`__sys_sendmmsg`, net/socket.c: an error is returned only when
                    // no message went out). With the socket's memory forced far above any
                    // qdisc's limit, the only failure a packet socket sees here is the
                    // drop: a full qdisc or the driver's NET_XMIT_DROP (`packet_snd`,
                    // net/packet/af_packet.c, turns it into ENOBUFS).
                    report.enobufs += 1;
                    report.attempted += 1;
                }
            }
            // The first frame of the batch was dropped: count it, move on.
            Err(Errno::ENOBUFS) => {
                report.enobufs += 1;
                report.attempted += 1;
            }
            // Socket memory is full: wait for the qdisc to drain a bit.
            Err(Errno::EAGAIN) => wait_writable(socket.as_fd(), end)?,
            Err(Errno::EINTR) => {}
            Err(Errno::EMSGSIZE) => {
                bail!(
                    "{}-byte frames do not fit ifindex {}: a frame may be at most the MTU plus the 14-byte Ethernet header (1514 by default)",
                    cfg.frame_len,
                    cfg.ifindex
                );
            }
            Err(err) => {
                return Err(err).with_context(|| {
                    format!(
                        "sending {}-byte frames on ifindex {} failed after {} frames",
                        cfg.frame_len, cfg.ifindex, report.sent
                    )
                });
            }
        }
    }
    report.elapsed = start.elapsed();
    Ok(report)
}

/// One `sendmmsg` of all `frames`; returns how many went out.
fn send_batch(socket: BorrowedFd<'_>, frames: &mut [Vec<u8>]) -> std::result::Result<usize, Errno> {
    let mut iovs: Vec<libc::iovec> = frames
        .iter_mut()
        .map(|f| libc::iovec {
            iov_base: f.as_mut_ptr().cast(),
            iov_len: f.len(),
        })
        .collect();
    let mut msgs: Vec<libc::mmsghdr> = iovs
        .iter_mut()
        .map(|iov| {
            // SAFETY: msghdr is plain old data; zero is "no name, no control".
            let mut hdr: libc::msghdr = unsafe { std::mem::zeroed() };
            hdr.msg_iov = std::ptr::from_mut(iov);
            hdr.msg_iovlen = 1;
            libc::mmsghdr {
                msg_hdr: hdr,
                msg_len: 0,
            }
        })
        .collect();
    let len = libc::c_uint::try_from(msgs.len()).unwrap_or(libc::c_uint::MAX);
    // SAFETY: msgs and the iovecs and buffers they point to outlive the call.
    let rc = unsafe {
        libc::sendmmsg(
            socket.as_raw_fd(),
            msgs.as_mut_ptr(),
            len,
            // c_int on glibc, c_uint on musl.
            libc::MSG_DONTWAIT as _,
        )
    };
    // sendmmsg reports an error only if the first message failed; a later failure ends
    // the batch early, and its error is lost (the caller accounts for it).
    usize::try_from(rc).map_err(|_| Errno::last())
}

fn wait_writable(fd: BorrowedFd<'_>, end: Instant) -> Result<()> {
    let slice = end
        .saturating_duration_since(Instant::now())
        .min(POLL_SLICE);
    let mut fds = [PollFd::new(fd, PollFlags::POLLOUT)];
    match nix::poll::poll(&mut fds, poll_timeout(slice)) {
        Ok(_) | Err(Errno::EINTR) => Ok(()),
        Err(err) => Err(err).context("poll on the packet socket failed"),
    }
}

/// An `AF_PACKET` raw socket bound to `ifindex` with protocol 0, so it receives nothing
/// (no packet hook registered) and only transmits; and whether its send buffer could be
/// forced to [`SEND_BUFFER`].
fn packet_socket(ifindex: u32) -> Result<(OwnedFd, bool)> {
    // SAFETY: plain socket(2) call.
    let raw = unsafe { libc::socket(libc::AF_PACKET, libc::SOCK_RAW | libc::SOCK_CLOEXEC, 0) };
    if raw < 0 {
        return Err(std::io::Error::last_os_error())
            .context("cannot open an AF_PACKET socket (needs CAP_NET_RAW: run as root)");
    }
    // SAFETY: raw is a fresh fd we own.
    let socket = unsafe { OwnedFd::from_raw_fd(raw) };
    // SAFETY: sockaddr_ll is plain old data.
    let mut addr: libc::sockaddr_ll = unsafe { std::mem::zeroed() };
    addr.sll_family = u16::try_from(libc::AF_PACKET).unwrap_or_default();
    addr.sll_ifindex = i32::try_from(ifindex).context("ifindex out of range")?;
    let addr_len = libc::socklen_t::try_from(size_of::<libc::sockaddr_ll>()).unwrap_or_default();
    // SAFETY: addr is a valid sockaddr_ll of the given length.
    let rc = unsafe { libc::bind(socket.as_raw_fd(), (&raw const addr).cast(), addr_len) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("cannot bind the packet socket to ifindex {ifindex} (does the device exist in this namespace?)"));
    }
    // SO_SNDBUFFORCE ignores wmem_max (CAP_NET_ADMIN); fall back to what SO_SNDBUF allows.
    let forced = setsockopt_int(socket.as_fd(), libc::SO_SNDBUFFORCE, SEND_BUFFER).is_ok();
    if !forced {
        log::info!(
            "the packet socket's send buffer could not be forced (no CAP_NET_ADMIN): \
             sending one frame per call"
        );
        let _ = setsockopt_int(socket.as_fd(), libc::SO_SNDBUF, SEND_BUFFER);
    }
    Ok((socket, forced))
}

fn setsockopt_int(fd: BorrowedFd<'_>, opt: libc::c_int, value: libc::c_int) -> std::io::Result<()> {
    let len = libc::socklen_t::try_from(size_of::<libc::c_int>()).unwrap_or_default();
    // SAFETY: value is a c_int that outlives the call.
    let rc = unsafe {
        libc::setsockopt(
            fd.as_raw_fd(),
            libc::SOL_SOCKET,
            opt,
            (&raw const value).cast(),
            len,
        )
    };
    if rc < 0 {
        Err(std::io::Error::last_os_error())
    } else {
        Ok(())
    }
}

/// Numbers `frame` as the `index`th frame sent: flow `index % flows`, sequence number
/// `index / flows` in that flow.
fn number(frame: &mut [u8], index: u64, flows: u64) {
    let flow = u32::try_from(index % flows).unwrap_or(u32::MAX);
    frame[PAYLOAD..PAYLOAD + 8].copy_from_slice(&(index / flows).to_be_bytes());
    frame[PAYLOAD + 12..PAYLOAD + 16].copy_from_slice(&flow.to_be_bytes());
    // The UDP checksum is left 0 (none, for IPv4), so the port needs no checksum update.
    let port = FIRST_SOURCE_PORT + u16::try_from(flow % SOURCE_PORTS).unwrap_or_default();
    frame[ETH_HDR + IPV4_HDR..ETH_HDR + IPV4_HDR + 2].copy_from_slice(&port.to_be_bytes());
}

/// Frames out of their flow's order, as the reader sees them: RFC 4737's "reordered", a
/// frame whose sequence number is below the next one its flow expects (one past the
/// highest seen). The same definition as the probe's `reordered`, so where nothing is lost
/// between the driver and the reader the two counts are equal.
#[derive(Debug, Default)]
pub struct FrameOrder {
    next: std::collections::HashMap<u32, u64>,
    /// Frames that came after a later one of their flow.
    pub reordered: u64,
    /// Sequence numbers skipped over when a frame came ahead of its flow's next: frames
    /// that had not arrived yet (later reordered, or lost).
    pub gaps: u64,
}

impl FrameOrder {
    /// Takes one frame as read (Ethernet header first); ignores what is not a test frame.
    pub fn see(&mut self, frame: &[u8]) {
        let Some(head) = frame.get(PAYLOAD..PAYLOAD + 16) else {
            return;
        };
        let word =
            |at: usize| u32::from_be_bytes([head[at], head[at + 1], head[at + 2], head[at + 3]]);
        if word(8) != FRAME_MAGIC {
            return;
        }
        let seq = (u64::from(word(0)) << 32) | u64::from(word(4));
        let next = self.next.entry(word(12)).or_insert(0);
        if seq < *next {
            self.reordered += 1;
        } else {
            self.gaps += seq - *next;
            *next = seq + 1;
        }
    }
}

/// One test frame of `len` bytes (`len >= MIN_FRAME_LEN`), flow 0, sequence number 0.
#[must_use]
pub fn frame(len: usize) -> Vec<u8> {
    let mut f = vec![0u8; len];
    f[0..6].copy_from_slice(&DST_MAC);
    f[6..12].copy_from_slice(&SRC_MAC);
    f[12..14].copy_from_slice(&0x0800u16.to_be_bytes());
    let ip_len = u16::try_from(len - ETH_HDR).unwrap_or(u16::MAX);
    let ip = &mut f[ETH_HDR..ETH_HDR + IPV4_HDR];
    ip[0] = 0x45; // version 4, 5 words of header
    ip[2..4].copy_from_slice(&ip_len.to_be_bytes());
    ip[6] = 0x40; // don't fragment
    ip[8] = 64; // ttl
    ip[9] = 17; // udp
    ip[12..16].copy_from_slice(&SRC_IP);
    ip[16..20].copy_from_slice(&DST_IP);
    let csum = ipv4_checksum(ip);
    ip[10..12].copy_from_slice(&csum.to_be_bytes());
    let udp = &mut f[ETH_HDR + IPV4_HDR..ETH_HDR + IPV4_HDR + UDP_HDR];
    udp[0..2].copy_from_slice(&DISCARD_PORT.to_be_bytes());
    udp[2..4].copy_from_slice(&DISCARD_PORT.to_be_bytes());
    udp[4..6]
        .copy_from_slice(&(ip_len - u16::try_from(IPV4_HDR).unwrap_or_default()).to_be_bytes());
    // UDP checksum 0 = "not computed", allowed for IPv4 (RFC 768), so the sequence number
    // can change without recomputing anything.
    f[PAYLOAD + 8..PAYLOAD + 12].copy_from_slice(&FRAME_MAGIC.to_be_bytes());
    f
}

fn ipv4_checksum(header: &[u8]) -> u16 {
    let mut sum: u32 = header
        .chunks(2)
        .map(|w| u32::from(u16::from_be_bytes([w[0], w.get(1).copied().unwrap_or(0)])))
        .sum();
    while sum > 0xffff {
        sum = (sum & 0xffff) + (sum >> 16);
    }
    !u16::try_from(sum).unwrap_or(u16::MAX)
}

/// How to read.
#[derive(Debug, Clone, Copy)]
pub struct ReaderConfig {
    /// Packets per second; `None` reads as fast as possible.
    pub pps: Option<u64>,
    pub deadline: Duration,
    pub max_packets: Option<u64>,
}

/// What the reader did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct ReadReport {
    pub packets: u64,
    pub bytes: u64,
    /// Frames read out of their flow's order ([`FrameOrder`]).
    pub reordered: u64,
    #[serde(serialize_with = "serialize_secs")]
    pub elapsed: Duration,
}

/// Reads frames from a tap queue until `stop` is set, the deadline passes or
/// `max_packets` were read; paced to `cfg.pps` when given (a slow VM).
///
/// # Errors
/// When reading fails other than with `EAGAIN`/`EINTR`.
pub fn read(fd: BorrowedFd<'_>, cfg: &ReaderConfig, stop: &AtomicBool) -> Result<ReadReport> {
    if cfg.pps == Some(0) {
        bail!(
            "a reader rate of 0 packets per second reads nothing; leave the rate unset for no limit"
        );
    }
    let start = Instant::now();
    let end = deadline_after(start, cfg.deadline);
    let max = cfg.max_packets.unwrap_or(u64::MAX);
    let mut pacer = cfg.pps.map(|pps| Pacer::new(pps, start));
    let mut buf = vec![0u8; 65_536];
    let mut report = ReadReport::default();
    let mut order = FrameOrder::default();
    while report.packets < max && !stop.load(Ordering::Relaxed) {
        let now = Instant::now();
        if now >= end {
            break;
        }
        if let Some(pacer) = &pacer
            && pacer.allowed(now, report.packets) == 0
        {
            pacer.wait(report.packets, end);
            continue;
        }
        // Poll first so the loop wakes up for `stop` and the deadline even on a blocking
        // fd with nothing to read.
        if !readable(fd, end.saturating_duration_since(now).min(POLL_SLICE))? {
            // Time with nothing to read earns no credit: a reader that waited for the
            // traffic (while a probe attached, say) must not then read at full speed.
            if let Some(pacer) = &mut pacer {
                pacer.forgive(Instant::now(), report.packets);
            }
            continue;
        }
        match nix::unistd::read(fd, &mut buf) {
            Ok(n) => {
                report.packets += 1;
                report.bytes += n as u64;
                order.see(&buf[..n]);
            }
            Err(Errno::EAGAIN | Errno::EINTR) => {}
            Err(err) => return Err(err).context("reading from the tap queue failed"),
        }
    }
    report.reordered = order.reordered;
    report.elapsed = start.elapsed();
    Ok(report)
}

/// Reads whatever is queued on `fd` right now, until it is empty (or `deadline` passes),
/// and returns how many frames that was. Used after traffic so that the kernel's
/// `tx_packets` (counted on read) settles.
///
/// # Errors
/// When reading fails.
pub fn drain(fd: BorrowedFd<'_>, deadline: Duration) -> Result<u64> {
    let end = deadline_after(Instant::now(), deadline);
    let mut buf = vec![0u8; 65_536];
    let mut packets = 0;
    while Instant::now() < end && readable(fd, Duration::ZERO)? {
        match nix::unistd::read(fd, &mut buf) {
            Ok(_) => packets += 1,
            Err(Errno::EAGAIN) => break,
            Err(Errno::EINTR) => {}
            Err(err) => return Err(err).context("draining the tap queue failed"),
        }
    }
    Ok(packets)
}

/// Drains `fd` until it stays empty for a moment (three polls 10 ms apart), at most for
/// `limit`: packets still in a qdisc reach the ring from the TX softirq shortly after the
/// sender stops. Returns the frames read.
///
/// # Errors
/// When reading fails.
pub(crate) fn drain_until_quiet(fd: BorrowedFd<'_>, limit: Duration) -> Result<u64> {
    let end = deadline_after(Instant::now(), limit);
    let mut drained = 0;
    let mut quiet = 0;
    while quiet < 3 && Instant::now() < end {
        let n = drain(fd, end.saturating_duration_since(Instant::now()))?;
        drained += n;
        quiet = if n == 0 { quiet + 1 } else { 0 };
        std::thread::sleep(Duration::from_millis(10));
    }
    Ok(drained)
}

/// Traffic through a tap, sent from inside its namespace, read by a reader on each of its
/// first `queues` queues; then the readers stop and the queues are drained. The scaffold of
/// the privileged tests that count a tap's traffic.
pub struct Drive<'a> {
    /// The tap's namespace (`/run/netns/NAME`): the sender transmits from inside it.
    pub netns: &'a Path,
    pub tap: &'a Tap,
    /// What to send; its `ifindex` is the tap's.
    pub sender: SenderConfig,
    /// How each reader reads.
    pub reader: ReaderConfig,
    /// Queues with a reader, from 0.
    pub queues: usize,
    /// How long the readers keep reading after the sender is done.
    pub linger: Duration,
}

/// What a [`Drive`] did.
#[derive(Debug, Clone)]
pub struct Driven {
    pub sent: SendReport,
    /// Per queue: what its reader took.
    pub read: Vec<ReadReport>,
    /// Per queue: what was left in its ring afterwards.
    pub drained: Vec<u64>,
}

impl Drive<'_> {
    /// Sends, reads, stops the readers and drains every queue (leaving them non-blocking).
    ///
    /// # Errors
    /// When sending, reading or draining fails.
    pub fn run(&self) -> Result<Driven> {
        let stop = AtomicBool::new(false);
        let (sent, read) = std::thread::scope(|scope| -> Result<_> {
            let readers: Vec<_> = (0..self.queues)
                .map(|queue| {
                    let (fd, cfg, stop) = (self.tap.queue_fd(queue), &self.reader, &stop);
                    scope.spawn(move || read(fd, cfg, stop))
                })
                .collect();
            let sender = SenderConfig {
                ifindex: self.tap.ifindex(),
                ..self.sender.clone()
            };
            let sent = tap_probe_observer::os::netns::run_in(self.netns, || send(&sender));
            std::thread::sleep(self.linger);
            stop.store(true, Ordering::Relaxed);
            let read = readers
                .into_iter()
                .map(|reader| {
                    reader
                        .join()
                        .map_err(|_| anyhow::anyhow!("a reader thread panicked"))?
                })
                .collect::<Result<Vec<_>>>()?;
            Ok((sent?, read))
        })?;
        self.tap.set_nonblocking(true)?;
        let drained = (0..self.queues)
            .map(|queue| drain_until_quiet(self.tap.queue_fd(queue), Duration::from_secs(10)))
            .collect::<Result<_>>()?;
        Ok(Driven {
            sent,
            read,
            drained,
        })
    }
}

fn readable(fd: BorrowedFd<'_>, timeout: Duration) -> Result<bool> {
    let mut fds = [PollFd::new(fd, PollFlags::POLLIN)];
    match nix::poll::poll(&mut fds, poll_timeout(timeout)) {
        Ok(0) | Err(Errno::EINTR) => Ok(false),
        Ok(_) => {
            let revents = fds[0].revents().unwrap_or(PollFlags::empty());
            if revents.intersects(PollFlags::POLLERR | PollFlags::POLLNVAL) {
                bail!(
                    "the tap queue fd reports an error (revents {revents:?}); was the device deleted?"
                );
            }
            Ok(revents.contains(PollFlags::POLLIN))
        }
        Err(err) => Err(err).context("poll on the tap queue failed"),
    }
}

fn serialize_secs<S: serde::Serializer>(
    d: &Duration,
    s: S,
) -> std::result::Result<S::Ok, S::Error> {
    s.serialize_f64(d.as_secs_f64())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn frame_has_valid_ipv4_header() {
        let f = frame(100);
        assert_eq!(f.len(), 100);
        assert_eq!(&f[12..14], &[0x08, 0x00]);
        // A header including its checksum sums to 0xffff, i.e. checksums to 0.
        assert_eq!(ipv4_checksum(&f[14..34]), 0);
        assert_eq!(u16::from_be_bytes([f[16], f[17]]), 86);
        assert_eq!(u16::from_be_bytes([f[38], f[39]]), 66);
    }

    #[test]
    fn frame_order_counts_frames_behind_their_flow() {
        let mut order = FrameOrder::default();
        let mut f = frame(MIN_FRAME_LEN);
        // Two flows, round-robin: indexes 0..8 are seq 0..4 of flows 0 and 1. Flow 0 sees
        // 0 2 1 3 (one late), flow 1 sees 3 0 1 2 (three late: after 3 every one is behind).
        for index in [0, 4, 2, 6, 7, 1, 3, 5] {
            number(&mut f, index, 2);
            order.see(&f);
        }
        assert_eq!(order.reordered, 1 + 3);
        assert_eq!(order.gaps, 1 + 3);
        // Not a test frame: ignored.
        f[PAYLOAD + 8] ^= 1;
        order.see(&f);
        assert_eq!(order.reordered, 4);
    }

    /// A device hashes flows by addresses and ports: each flow has its own source port, the
    /// same for all its frames, with the IPv4 header untouched.
    #[test]
    fn each_flow_has_its_own_source_port() {
        let mut f = frame(MIN_FRAME_LEN);
        let header = f[ETH_HDR..ETH_HDR + IPV4_HDR].to_vec();
        let port = |f: &[u8]| u16::from_be_bytes([f[34], f[35]]);
        let mut ports = Vec::new();
        for index in 0..8 {
            number(&mut f, index, 4);
            ports.push(port(&f));
            assert_eq!(f[ETH_HDR..ETH_HDR + IPV4_HDR], header[..]);
            assert_eq!(u16::from_be_bytes([f[36], f[37]]), DISCARD_PORT);
        }
        assert_eq!(ports, [10_000, 10_001, 10_002, 10_003].repeat(2));
    }

    #[test]
    fn pacer_schedule() {
        let start = Instant::now();
        let p = Pacer::new(1000, start);
        assert_eq!(p.allowed(start, 0), 1);
        assert_eq!(p.allowed(start + Duration::from_millis(10), 0), 11);
        assert_eq!(p.allowed(start + Duration::from_millis(10), 11), 0);
    }

    #[test]
    fn rejects_bad_frame_len() {
        let cfg = SenderConfig {
            frame_len: 10,
            ..SenderConfig::new(1, 1, Duration::from_millis(10))
        };
        assert!(send(&cfg).is_err());
    }
}
