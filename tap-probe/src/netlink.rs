//! A small synchronous rtnetlink client: the handful of link and qdisc operations tap-probe
//! needs, without an async runtime.
//!
//! Every request carries `NLM_F_ACK` so that success is confirmed rather than assumed, and
//! every kernel error comes back as an `anyhow` error naming the operation, the errno and
//! the kernel's extended-ack message when it sent one.

use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use netlink_packet_core::{
    DefaultNla, NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_CREATE, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_EXCL,
    NLM_F_REPLACE, NLM_F_REQUEST, NetlinkHeader, NetlinkMessage, NetlinkPayload, Nla, NlaBuffer,
    NlasIterator,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoTun, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcStats2};
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

/// `IFLA_TUN_*` from `include/uapi/linux/if_link.h`, filled by `tun_fill_info` in
/// `drivers/net/tun.c`. netlink-packet-route leaves them undecoded.
const IFLA_TUN_TYPE: u16 = 3;
const IFLA_TUN_NUM_QUEUES: u16 = 8;
/// `IFF_TUN` / `IFF_TAP` from `include/uapi/linux/if_tun.h`.
const IFF_TUN: u8 = 0x0001;
const IFF_TAP: u8 = 0x0002;
/// `TCA_OPTIONS` and `TCA_STATS_PKT64` from `include/uapi/linux/{rtnetlink,gen_stats}.h`.
const TCA_OPTIONS: u16 = 2;
const TCA_STATS_PKT64: u16 = 8;
/// `NLMSGERR_ATTR_MSG` from `include/uapi/linux/netlink.h`.
const NLMSGERR_ATTR_MSG: u16 = 1;
/// Size of `struct nlmsghdr`.
const NLMSG_HDR_LEN: usize = 16;

/// Dump replies are at most 32 KiB per datagram (`netlink_dump` in
/// `net/netlink/af_netlink.c` caps `max_recvmsg_len`); twice that leaves room.
const RECV_BUF: usize = 64 * 1024;
/// A kernel that does not answer within this is not going to.
const RECV_TIMEOUT: Duration = Duration::from_secs(5);
/// A dump interrupted by a concurrent change (`NLM_F_DUMP_INTR`) is retried this often.
const DUMP_RETRIES: usize = 3;

/// tun or tap, from the tun driver's `IFLA_TUN_TYPE`.
#[derive(Debug, Clone, Copy, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "lowercase")]
pub(crate) enum TunKind {
    Tun,
    Tap,
}

/// Interface counters from `IFLA_STATS64`. For tun/tap, "tx" is host to reader: the driver
/// counts `tx_packets` when the reader takes a packet, `tx_dropped` on a full ring.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub struct LinkStats {
    pub tx_packets: u64,
    pub tx_bytes: u64,
    pub tx_dropped: u64,
    pub rx_packets: u64,
    pub rx_dropped: u64,
}

/// A network device as `RTM_GETLINK` reports it.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct Link {
    pub ifindex: u32,
    pub name: String,
    /// `IFLA_INFO_KIND`: `tun`, `veth`, `macvtap`, ...; `None` for devices without
    /// rtnl link ops (loopback, most physical NICs).
    pub kind: Option<String>,
    /// Tun or tap when `kind` is `tun`.
    pub(crate) tun_kind: Option<TunKind>,
    /// Queues allocated. A multi-queue tap allocates `MAX_TAP_QUEUES` (256) up front.
    pub num_tx_queues: u32,
    /// Queues in use. rtnetlink has no attribute for it: for tun it is the number of
    /// attached queues (`IFLA_TUN_NUM_QUEUES`, at least 1), for anything else it is taken
    /// to be `num_tx_queues`.
    pub real_num_tx_queues: u32,
    pub tx_queue_len: u32,
    pub qdisc: Option<String>,
    /// `IFF_UP` (administratively up).
    pub up: bool,
    pub stats: LinkStats,
}

/// Root qdiscs tap-probe knows how to install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQdisc {
    /// No queue: the stack calls the driver directly and drops on `NETDEV_TX_BUSY`.
    Noqueue,
    /// The kernel default for single-queue devices: 3 bands, `tx_queue_len` packets.
    PfifoFast,
    /// One FIFO; `limit` packets, or `tx_queue_len` when `None`.
    Pfifo { limit: Option<u32> },
}

impl RootQdisc {
    #[must_use]
    pub(crate) fn kind(self) -> &'static str {
        match self {
            Self::Noqueue => "noqueue",
            Self::PfifoFast => "pfifo_fast",
            Self::Pfifo { .. } => "pfifo",
        }
    }
}

/// Counters of a qdisc (`tc -s qdisc show`).
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct QdiscStats {
    pub kind: String,
    pub packets: u64,
    pub bytes: u64,
    pub drops: u64,
    pub requeues: u64,
    pub overlimits: u64,
    pub qlen: u32,
    pub backlog: u32,
}

/// A synchronous rtnetlink socket, bound to the network namespace it was opened in.
pub struct Rtnl {
    socket: Socket,
    seq: u32,
    buf: Vec<u8>,
}

impl std::fmt::Debug for Rtnl {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Rtnl")
            .field("fd", &self.socket.as_raw_fd())
            .field("seq", &self.seq)
            .finish_non_exhaustive()
    }
}

impl Rtnl {
    /// Opens a socket in the calling thread's network namespace.
    ///
    /// # Errors
    /// When the socket cannot be created.
    pub fn open() -> Result<Self> {
        let mut socket = Socket::new(NETLINK_ROUTE).context("cannot open an rtnetlink socket")?;
        socket
            .bind_auto()
            .context("cannot bind the rtnetlink socket")?;
        socket
            .connect(&SocketAddr::new(0, 0))
            .context("cannot connect the rtnetlink socket")?;
        // Strict checking makes the kernel honour the ifindex filter of qdisc dumps
        // (`tc_dump_qdisc` in net/sched/sch_api.c) and reject malformed requests.
        socket
            .set_netlink_get_strict_chk(true)
            .context("cannot enable NETLINK_GET_STRICT_CHK")?;
        // Ask for error messages, and only the header of the failed request back.
        socket
            .set_ext_ack(true)
            .context("cannot enable NETLINK_EXT_ACK")?;
        socket
            .set_cap_ack(true)
            .context("cannot enable NETLINK_CAP_ACK")?;
        set_recv_timeout(&socket, RECV_TIMEOUT)?;
        Ok(Self {
            socket,
            seq: 0,
            buf: vec![0; RECV_BUF],
        })
    }

    /// Opens a socket inside the namespace at `ns_path`; it stays bound there.
    ///
    /// # Errors
    /// When the namespace cannot be joined or the socket cannot be created.
    pub(crate) fn open_in(ns_path: &Path) -> Result<Self> {
        crate::netns::run_in(ns_path, Self::open)
    }

    /// All links (`ip link show`).
    ///
    /// # Errors
    /// When the dump fails.
    pub(crate) fn links(&mut self) -> Result<Vec<Link>> {
        let replies = self.dump(
            &RouteNetlinkMessage::GetLink(LinkMessage::default()),
            "list links",
        )?;
        Ok(replies
            .into_iter()
            .filter_map(|msg| match msg {
                RouteNetlinkMessage::NewLink(link) => Some(Link::from_message(&link)),
                _ => None,
            })
            .collect())
    }

    /// The link called `name`.
    ///
    /// # Errors
    /// When there is no such link or the request fails.
    pub fn link_by_name(&mut self, name: &str) -> Result<Link> {
        let mut request = LinkMessage::default();
        request
            .attributes
            .push(LinkAttribute::IfName(name.to_owned()));
        let replies = self
            .request(
                RouteNetlinkMessage::GetLink(request),
                0,
                &format!("look up link {name}"),
            )
            .map_err(|err| match err.downcast_ref::<NetlinkError>() {
                Some(e) if e.errno == libc::ENODEV => {
                    anyhow!("no network device named {name} in this namespace")
                }
                _ => err,
            })?;
        replies
            .into_iter()
            .find_map(|msg| match msg {
                RouteNetlinkMessage::NewLink(link) => Some(Link::from_message(&link)),
                _ => None,
            })
            .ok_or_else(|| anyhow!("the kernel answered the lookup of link {name} without a link"))
    }

    /// The link with index `ifindex`.
    ///
    /// # Errors
    /// When there is no such link or the request fails.
    pub(crate) fn link_by_index(&mut self, ifindex: u32) -> Result<Link> {
        let mut request = LinkMessage::default();
        request.header.index = ifindex;
        let replies = self.request(
            RouteNetlinkMessage::GetLink(request),
            0,
            &format!("look up link {ifindex}"),
        )?;
        replies
            .into_iter()
            .find_map(|msg| match msg {
                RouteNetlinkMessage::NewLink(link) => Some(Link::from_message(&link)),
                _ => None,
            })
            .ok_or_else(|| {
                anyhow!("the kernel answered the lookup of link {ifindex} without a link")
            })
    }

    /// `ip link set dev X up`.
    ///
    /// # Errors
    /// When the kernel refuses.
    pub fn set_up(&mut self, ifindex: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        msg.header.flags = LinkFlags::Up;
        msg.header.change_mask = LinkFlags::Up;
        self.request(
            RouteNetlinkMessage::SetLink(msg),
            0,
            &format!("set link {ifindex} up"),
        )?;
        Ok(())
    }

    /// `ip link set dev X txqueuelen LEN`.
    ///
    /// # Errors
    /// When the kernel refuses.
    pub(crate) fn set_tx_queue_len(&mut self, ifindex: u32, len: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.header.index = ifindex;
        msg.attributes.push(LinkAttribute::TxQueueLen(len));
        self.request(
            RouteNetlinkMessage::SetLink(msg),
            0,
            &format!("set txqueuelen {len} on link {ifindex}"),
        )?;
        Ok(())
    }

    /// `ip link add NAME [numtxqueues N numrxqueues N] type veth peer name PEER [...]`, both
    /// ends in this namespace.
    ///
    /// # Errors
    /// When a name is taken or the kernel refuses.
    pub fn add_veth(&mut self, name: &str, peer_name: &str, queues: Option<u32>) -> Result<()> {
        // Without a count the kernel gives veth one queue per CPU (veth_get_num_queues).
        let queue_attrs = |attrs: &mut Vec<LinkAttribute>| {
            if let Some(n) = queues {
                attrs.push(LinkAttribute::NumTxQueues(n));
                attrs.push(LinkAttribute::NumRxQueues(n));
            }
        };
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_owned()));
        queue_attrs(&mut peer.attributes);
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
        queue_attrs(&mut msg.attributes);
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("create veth pair {name}/{peer_name}"),
        )?;
        Ok(())
    }

    /// `tc qdisc replace dev X root KIND`.
    ///
    /// # Errors
    /// When the kernel refuses (unknown qdisc kind, no such device).
    pub fn replace_root_qdisc(&mut self, ifindex: u32, qdisc: RootQdisc) -> Result<()> {
        let mut msg = TcMessage::with_index(ifindex_i32(ifindex)?);
        msg.header.parent = TcHandle::ROOT;
        // Handle 0: let the kernel pick one, as tc does without `handle`.
        msg.header.handle = TcHandle::UNSPEC;
        msg.attributes
            .push(TcAttribute::Kind(qdisc.kind().to_owned()));
        if let RootQdisc::Pfifo { limit: Some(limit) } = qdisc {
            // pfifo's TCA_OPTIONS is a bare `struct tc_fifo_qopt { __u32 limit; }`, not
            // nested attributes (`fifo_init` in net/sched/sch_fifo.c).
            msg.attributes.push(TcAttribute::Other(DefaultNla::new(
                TCA_OPTIONS,
                limit.to_ne_bytes().to_vec(),
            )));
        }
        self.request(
            RouteNetlinkMessage::NewQueueDiscipline(msg),
            NLM_F_CREATE | NLM_F_REPLACE,
            &format!(
                "replace the root qdisc of link {ifindex} with {}",
                qdisc.kind()
            ),
        )?;
        Ok(())
    }

    /// Counters of the root qdisc of `ifindex` (`tc -s qdisc show dev X root`). A device
    /// that was never up has the `noop` qdisc; a device without a queue shows `noqueue`.
    ///
    /// # Errors
    /// When the dump fails or the device has no root qdisc.
    pub fn root_qdisc_stats(&mut self, ifindex: u32) -> Result<QdiscStats> {
        let index = ifindex_i32(ifindex)?;
        let replies = self.dump(
            &RouteNetlinkMessage::GetQueueDiscipline(TcMessage::with_index(index)),
            &format!("list the qdiscs of link {ifindex}"),
        )?;
        replies
            .into_iter()
            .find_map(|msg| match msg {
                RouteNetlinkMessage::NewQueueDiscipline(tc)
                    if tc.header.index == index && tc.header.parent == TcHandle::ROOT =>
                {
                    Some(qdisc_stats(&tc))
                }
                _ => None,
            })
            .ok_or_else(|| anyhow!("link {ifindex} has no root qdisc (does it exist?)"))
    }

    fn dump(&mut self, msg: &RouteNetlinkMessage, what: &str) -> Result<Vec<RouteNetlinkMessage>> {
        for _ in 0..DUMP_RETRIES {
            match self.request(msg.clone(), NLM_F_DUMP, what) {
                Err(err) if err.downcast_ref::<DumpInterrupted>().is_some() => {}
                other => return other,
            }
        }
        bail!("cannot {what}: the dump was interrupted by concurrent changes {DUMP_RETRIES} times")
    }

    /// Sends one request and collects the replies up to its ACK (or `NLMSG_DONE` for dumps).
    fn request(
        &mut self,
        msg: RouteNetlinkMessage,
        flags: u16,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        self.seq = self.seq.wrapping_add(1);
        let seq = self.seq;
        let mut header = NetlinkHeader::default();
        header.flags = NLM_F_REQUEST | NLM_F_ACK | flags;
        header.sequence_number = seq;
        let mut packet = NetlinkMessage::new(header, NetlinkPayload::from(msg));
        packet.finalize();
        let mut out = vec![0; packet.buffer_len()];
        packet.serialize(&mut out);
        self.socket
            .send(&out, 0)
            .with_context(|| format!("cannot {what}: sending the rtnetlink request failed"))?;

        let dump = flags & NLM_F_DUMP == NLM_F_DUMP;
        let mut replies = Vec::new();
        let mut interrupted = false;
        loop {
            let len = self.recv(what)?;
            let mut offset = 0;
            while offset < len {
                let reply =
                    NetlinkMessage::<RouteNetlinkMessage>::deserialize(&self.buf[offset..len])
                        .with_context(|| {
                            format!("cannot {what}: cannot decode the kernel's reply")
                        })?;
                let reply_len = usize::try_from(reply.header.length).unwrap_or(usize::MAX);
                if reply_len == 0 {
                    bail!("cannot {what}: the kernel sent a zero-length netlink message");
                }
                // Messages are 4-byte aligned within a datagram (NLMSG_ALIGN).
                offset += reply_len.next_multiple_of(4);
                if reply.header.sequence_number != seq {
                    // A late answer to an earlier request that timed out: not ours.
                    continue;
                }
                interrupted |= reply.header.flags & NLM_F_DUMP_INTR != 0;
                match reply.payload {
                    NetlinkPayload::InnerMessage(inner) => replies.push(inner),
                    NetlinkPayload::Error(err) => match err.code {
                        // An ACK. For a dump the kernel sends NLMSG_DONE instead, so this
                        // only ends non-dump requests.
                        None => {
                            if interrupted {
                                return Err(DumpInterrupted.into());
                            }
                            return Ok(replies);
                        }
                        Some(code) => {
                            let message = ext_ack_message(reply.header.flags, &err.header);
                            return Err(NetlinkError {
                                errno: -code.get(),
                                what: what.to_owned(),
                                message,
                            }
                            .into());
                        }
                    },
                    NetlinkPayload::Done(done) => {
                        if done.code != 0 {
                            return Err(NetlinkError {
                                errno: -done.code,
                                what: what.to_owned(),
                                message: None,
                            }
                            .into());
                        }
                        if interrupted {
                            return Err(DumpInterrupted.into());
                        }
                        if dump {
                            return Ok(replies);
                        }
                    }
                    NetlinkPayload::Overrun(_) => bail!("cannot {what}: netlink overrun"),
                    _ => {}
                }
            }
        }
    }

    fn recv(&mut self, what: &str) -> Result<usize> {
        // MSG_TRUNC makes recv return the real length, so truncation is detected.
        let mut buf = &mut self.buf[..];
        let len = self.socket.recv(&mut buf, libc::MSG_TRUNC).map_err(|err| {
            if matches!(err.raw_os_error(), Some(libc::EAGAIN)) {
                anyhow!("cannot {what}: no answer from the kernel within {RECV_TIMEOUT:?}")
            } else {
                anyhow!("cannot {what}: receiving the rtnetlink reply failed: {err}")
            }
        })?;
        if len > self.buf.len() {
            bail!(
                "cannot {what}: a {len}-byte netlink reply does not fit the {RECV_BUF}-byte buffer"
            );
        }
        Ok(len)
    }
}

/// A kernel error answer to a request.
#[derive(Debug)]
pub(crate) struct NetlinkError {
    pub(crate) errno: i32,
    pub(crate) what: String,
    /// The kernel's extended-ack text, e.g. "Unknown qdisc kind".
    pub(crate) message: Option<String>,
}

impl std::fmt::Display for NetlinkError {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let os = std::io::Error::from_raw_os_error(self.errno);
        write!(f, "cannot {}: {os}", self.what)?;
        if let Some(message) = &self.message {
            write!(f, " ({message})")?;
        }
        if self.errno == libc::EPERM {
            write!(f, "; this needs CAP_NET_ADMIN (run as root)")?;
        }
        Ok(())
    }
}

impl std::error::Error for NetlinkError {}

#[derive(Debug)]
struct DumpInterrupted;

impl std::fmt::Display for DumpInterrupted {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("netlink dump interrupted")
    }
}

impl std::error::Error for DumpInterrupted {}

/// The `NLMSGERR_ATTR_MSG` string of an error reply. With `NETLINK_CAP_ACK` the error
/// payload is the request's bare header followed by the TLVs (`netlink_ack` in
/// `net/netlink/af_netlink.c`).
fn ext_ack_message(flags: u16, payload: &[u8]) -> Option<String> {
    if flags & NLM_F_ACK_TLVS == 0 {
        return None;
    }
    NlasIterator::new(payload.get(NLMSG_HDR_LEN..)?)
        .filter_map(Result::ok)
        .find_map(|nla: NlaBuffer<&[u8]>| {
            (nla.kind() == NLMSGERR_ATTR_MSG).then(|| {
                String::from_utf8_lossy(nla.value())
                    .trim_end_matches('\0')
                    .to_owned()
            })
        })
}

fn set_recv_timeout(socket: &Socket, timeout: Duration) -> Result<()> {
    // Field types differ between glibc and musl, so let inference pick them.
    let tv = libc::timeval {
        tv_sec: timeout.as_secs().try_into().unwrap_or(i32::MAX.into()),
        tv_usec: timeout.subsec_micros().min(999_999).into(),
    };
    // SAFETY: `tv` is a valid timeval that outlives the call; the fd is open.
    let rc = unsafe {
        libc::setsockopt(
            socket.as_raw_fd(),
            libc::SOL_SOCKET,
            libc::SO_RCVTIMEO,
            (&raw const tv).cast(),
            libc::socklen_t::try_from(size_of::<libc::timeval>()).unwrap_or(libc::socklen_t::MAX),
        )
    };
    if rc != 0 {
        return Err(std::io::Error::last_os_error())
            .context("cannot set SO_RCVTIMEO on the rtnetlink socket");
    }
    Ok(())
}

fn ifindex_i32(ifindex: u32) -> Result<i32> {
    i32::try_from(ifindex).map_err(|_| anyhow!("ifindex {ifindex} is out of range"))
}

/// The value bytes of a netlink attribute the crate left undecoded.
fn nla_value(nla: &impl Nla) -> Vec<u8> {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    value
}

impl Link {
    fn from_message(msg: &LinkMessage) -> Self {
        let mut link = Self {
            ifindex: msg.header.index,
            name: String::new(),
            kind: None,
            tun_kind: None,
            num_tx_queues: 1,
            real_num_tx_queues: 0,
            tx_queue_len: 0,
            qdisc: None,
            up: msg.header.flags.contains(LinkFlags::Up),
            stats: LinkStats::default(),
        };
        let mut tun_queues = None;
        for attr in &msg.attributes {
            match attr {
                LinkAttribute::IfName(name) => link.name.clone_from(name),
                LinkAttribute::NumTxQueues(n) => link.num_tx_queues = *n,
                LinkAttribute::TxQueueLen(n) => link.tx_queue_len = *n,
                LinkAttribute::Qdisc(q) => link.qdisc = Some(q.clone()),
                LinkAttribute::Stats64(s) => {
                    link.stats = LinkStats {
                        tx_packets: s.tx_packets,
                        tx_bytes: s.tx_bytes,
                        tx_dropped: s.tx_dropped,
                        rx_packets: s.rx_packets,
                        rx_dropped: s.rx_dropped,
                    };
                }
                LinkAttribute::LinkInfo(infos) => {
                    for info in infos {
                        match info {
                            LinkInfo::Kind(kind) => link.kind = Some(kind.to_string()),
                            LinkInfo::Data(InfoData::Tun(tun)) => {
                                let (kind, queues) = tun_info(tun);
                                link.tun_kind = kind;
                                tun_queues = queues;
                            }
                            _ => {}
                        }
                    }
                }
                _ => {}
            }
        }
        if link.kind.as_deref() == Some("tun") && link.tun_kind.is_none() {
            link.tun_kind = tun_kind_from_sysfs(&link.name);
        }
        // netif_set_real_num_tx_queues refuses 0, so a tun with no queue attached still
        // has one real queue.
        link.real_num_tx_queues = tun_queues.map_or(link.num_tx_queues, |n| {
            n.clamp(1, link.num_tx_queues.max(1))
        });
        link
    }
}

fn tun_info(attrs: &[InfoTun]) -> (Option<TunKind>, Option<u32>) {
    let mut kind = None;
    let mut queues = None;
    for attr in attrs {
        let value = nla_value(attr);
        match (attr.kind(), value.as_slice()) {
            (IFLA_TUN_TYPE, [t, ..]) => {
                kind = match *t {
                    IFF_TUN => Some(TunKind::Tun),
                    IFF_TAP => Some(TunKind::Tap),
                    _ => None,
                };
            }
            (IFLA_TUN_NUM_QUEUES, [a, b, c, d, ..]) => {
                queues = Some(u32::from_ne_bytes([*a, *b, *c, *d]));
            }
            _ => {}
        }
    }
    (kind, queues)
}

/// Fallback for kernels whose tun driver does not fill link info. sysfs shows the devices
/// of the namespace /sys was mounted in, so this can be wrong for other namespaces.
fn tun_kind_from_sysfs(name: &str) -> Option<TunKind> {
    let text = std::fs::read_to_string(format!("/sys/class/net/{name}/tun_flags")).ok()?;
    let flags = u32::from_str_radix(text.trim().trim_start_matches("0x"), 16).ok()?;
    if flags & u32::from(IFF_TAP) != 0 {
        Some(TunKind::Tap)
    } else if flags & u32::from(IFF_TUN) != 0 {
        Some(TunKind::Tun)
    } else {
        None
    }
}

fn qdisc_stats(tc: &TcMessage) -> QdiscStats {
    let mut stats = QdiscStats::default();
    let mut have_stats2 = false;
    let mut pkt64 = None;
    for attr in &tc.attributes {
        match attr {
            TcAttribute::Kind(kind) => stats.kind.clone_from(kind),
            TcAttribute::Stats2(items) => {
                have_stats2 = true;
                for item in items {
                    match item {
                        TcStats2::Basic(b) => {
                            stats.bytes = b.bytes;
                            stats.packets = u64::from(b.packets);
                        }
                        TcStats2::Queue(q) => {
                            stats.qlen = q.qlen;
                            stats.backlog = q.backlog;
                            stats.drops = u64::from(q.drops);
                            stats.requeues = u64::from(q.requeues);
                            stats.overlimits = u64::from(q.overlimits);
                        }
                        // The 32-bit packet count in gnet_stats_basic wraps; the kernel
                        // adds the full count as TCA_STATS_PKT64 (net/core/gen_stats.c).
                        TcStats2::Other(nla) if nla.kind() == TCA_STATS_PKT64 => {
                            if let Ok(bytes) = <[u8; 8]>::try_from(nla_value(nla).as_slice()) {
                                pkt64 = Some(u64::from_ne_bytes(bytes));
                            }
                        }
                        _ => {}
                    }
                }
            }
            TcAttribute::Stats(s) if !have_stats2 => {
                stats.bytes = s.bytes;
                stats.packets = u64::from(s.packets);
                stats.drops = u64::from(s.drops);
                stats.overlimits = u64::from(s.overlimits);
                stats.qlen = s.qlen;
                stats.backlog = s.backlog;
            }
            _ => {}
        }
    }
    if let Some(packets) = pkt64 {
        stats.packets = packets;
    }
    stats
}

#[cfg(all(test, feature = "privileged-tests"))]
mod tests {
    use super::*;
    use crate::netns::{NamedNetns, run_in};
    use crate::tap::{Tap, TapOptions};

    fn json(ns: &str, cmd: &str, args: &[&str]) -> serde_json::Value {
        let out = std::process::Command::new(cmd)
            .args(["-n", ns, "-j"])
            .args(args)
            .output()
            .unwrap();
        assert!(
            out.status.success(),
            "{cmd} {args:?}: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).unwrap()
    }

    fn root_qdisc_json(ns: &str, dev: &str) -> serde_json::Value {
        let all = json(ns, "tc", &["-s", "qdisc", "show", "dev", dev]);
        all.as_array()
            .unwrap()
            .iter()
            .find(|q| q["root"].as_bool() == Some(true))
            .unwrap()
            .clone()
    }

    #[test]
    fn links_veth_and_qdiscs_match_iproute2() {
        if !crate::test_support::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-rtnl-{}", std::process::id())).unwrap();
        let mut rtnl = Rtnl::open_in(ns.path()).unwrap();
        let lo = rtnl.link_by_name("lo").unwrap();
        assert_eq!(lo.ifindex, 1);
        assert!(
            rtnl.link_by_name("nope0")
                .unwrap_err()
                .to_string()
                .contains("no network device named nope0")
        );

        rtnl.add_veth("tpv0", "tpv1", None).unwrap();
        let err = rtnl.add_veth("tpv0", "tpv2", None).unwrap_err();
        assert!(
            err.downcast_ref::<NetlinkError>()
                .is_some_and(|e| e.errno == libc::EEXIST),
            "{err:#}"
        );
        let v0 = rtnl.link_by_name("tpv0").unwrap();
        assert_eq!(v0.kind.as_deref(), Some("veth"));
        assert_eq!(v0.tun_kind, None);
        rtnl.set_tx_queue_len(v0.ifindex, 77).unwrap();
        rtnl.set_up(v0.ifindex).unwrap();

        let ip = json(ns.name(), "ip", &["-d", "link", "show", "dev", "tpv0"]);
        let ip = &ip[0];
        let v0 = rtnl.link_by_name("tpv0").unwrap();
        assert_eq!(u64::from(v0.ifindex), ip["ifindex"].as_u64().unwrap());
        assert_eq!(u64::from(v0.tx_queue_len), ip["txqlen"].as_u64().unwrap());
        assert_eq!(
            u64::from(v0.num_tx_queues),
            ip["num_tx_queues"].as_u64().unwrap()
        );
        assert!(v0.up);
        assert_eq!(v0.qdisc.as_deref(), ip["qdisc"].as_str());
        assert_eq!(rtnl.links().unwrap().len(), 3);

        // pfifo with a limit, then noqueue, then pfifo_fast, each checked with tc.
        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::Pfifo { limit: Some(42) })
            .unwrap();
        let tc = root_qdisc_json(ns.name(), "tpv0");
        assert_eq!(tc["kind"], "pfifo");
        assert_eq!(tc["options"]["limit"], 42);
        let stats = rtnl.root_qdisc_stats(v0.ifindex).unwrap();
        assert_eq!(stats.kind, "pfifo");
        assert_eq!(stats.packets, tc["packets"].as_u64().unwrap());
        assert_eq!(stats.drops, tc["drops"].as_u64().unwrap());

        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::Noqueue)
            .unwrap();
        assert_eq!(root_qdisc_json(ns.name(), "tpv0")["kind"], "noqueue");
        assert_eq!(rtnl.root_qdisc_stats(v0.ifindex).unwrap().kind, "noqueue");
        rtnl.replace_root_qdisc(v0.ifindex, RootQdisc::PfifoFast)
            .unwrap();
        assert_eq!(root_qdisc_json(ns.name(), "tpv0")["kind"], "pfifo_fast");
    }

    #[test]
    fn tap_kind_queues_and_stats() {
        if !crate::test_support::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-rtnlt-{}", std::process::id())).unwrap();
        let (tap, tun, mq) = run_in(ns.path(), || {
            Ok((
                Tap::create("tpt0", TapOptions::default())?,
                Tap::create(
                    "tpt1",
                    TapOptions {
                        tun: true,
                        ..TapOptions::default()
                    },
                )?,
                Tap::create(
                    "tpt2",
                    TapOptions {
                        multi_queue: true,
                        queues: 3,
                        tun: false,
                    },
                )?,
            ))
        })
        .unwrap();
        let mut rtnl = Rtnl::open_in(ns.path()).unwrap();
        let t0 = rtnl.link_by_name("tpt0").unwrap();
        assert_eq!(t0.ifindex, tap.ifindex());
        assert_eq!(
            (t0.kind.as_deref(), t0.tun_kind),
            (Some("tun"), Some(TunKind::Tap))
        );
        assert_eq!((t0.num_tx_queues, t0.real_num_tx_queues), (1, 1));
        let t1 = rtnl.link_by_name("tpt1").unwrap();
        assert_eq!(t1.tun_kind, Some(TunKind::Tun));
        let t2 = rtnl.link_by_name("tpt2").unwrap();
        let ip = json(ns.name(), "ip", &["-d", "link", "show", "dev", "tpt2"]);
        assert_eq!(
            u64::from(t2.num_tx_queues),
            ip[0]["num_tx_queues"].as_u64().unwrap()
        );
        assert_eq!(t2.real_num_tx_queues, 3);
        assert_eq!(tun.name(), "tpt1");
        drop((tap, tun, mq));
        // Non-persistent: closing the fds removed the devices.
        assert_eq!(rtnl.links().unwrap().len(), 1);
    }
}
