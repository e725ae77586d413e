//! Links: listing, looking up, setting up, creating veth pairs, adding addresses.

use std::net::Ipv4Addr;
use std::os::fd::AsRawFd as _;
use std::path::Path;

use anyhow::{Context as _, Result, anyhow};
use netlink_packet_core::{NLM_F_CREATE, NLM_F_EXCL, Nla};
use netlink_packet_route::address::{AddressAttribute, AddressMessage};
use netlink_packet_route::link::{
    InfoData, InfoKind, InfoTun, InfoVeth, LinkAttribute, LinkFlags, LinkInfo, LinkMessage,
};
use netlink_packet_route::{AddressFamily, RouteNetlinkMessage};

use super::Rtnl;
use super::socket::NetlinkError;
use super::socket::nla_value;

/// `IFLA_TUN_*` from `include/uapi/linux/if_link.h`, filled by `tun_fill_info` in
/// `drivers/net/tun.c`. netlink-packet-route leaves them undecoded.
const IFLA_TUN_TYPE: u16 = 3;
const IFLA_TUN_NUM_QUEUES: u16 = 8;
/// `IFF_TUN` / `IFF_TAP` from `include/uapi/linux/if_tun.h`.
const IFF_TUN: u8 = 0x0001;
const IFF_TAP: u8 = 0x0002;
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

impl Rtnl {
    /// All links (`ip link show`).
    ///
    /// # Errors
    /// When the dump fails.
    pub fn links(&mut self) -> Result<Vec<Link>> {
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
    pub fn link_by_index(&mut self, ifindex: u32) -> Result<Link> {
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
    pub fn set_tx_queue_len(&mut self, ifindex: u32, len: u32) -> Result<()> {
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

    /// `ip link add NAME type veth peer name PEER netns NS`: the peer goes straight into
    /// the namespace whose file is `peer_netns` (`/run/netns/NAME`), where the same name may
    /// be taken by nothing else.
    ///
    /// # Errors
    /// When the namespace file cannot be opened, a name is taken or the kernel refuses.
    pub fn add_veth_across(
        &mut self,
        name: &str,
        peer_name: &str,
        peer_netns: &Path,
    ) -> Result<()> {
        let ns = std::fs::File::open(peer_netns)
            .with_context(|| format!("opening network namespace {}", peer_netns.display()))?;
        let mut peer = LinkMessage::default();
        peer.attributes
            .push(LinkAttribute::IfName(peer_name.to_owned()));
        peer.attributes.push(LinkAttribute::NetNsFd(ns.as_raw_fd()));
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
        msg.attributes.push(LinkAttribute::LinkInfo(vec![
            LinkInfo::Kind(InfoKind::Veth),
            LinkInfo::Data(InfoData::Veth(InfoVeth::Peer(peer))),
        ]));
        self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!(
                "create veth pair {name}/{peer_name} (peer in {})",
                peer_netns.display()
            ),
        )?;
        Ok(())
    }

    /// `ip addr add ADDR/PREFIX dev X`.
    ///
    /// # Errors
    /// When the kernel refuses.
    pub fn add_address(&mut self, ifindex: u32, addr: Ipv4Addr, prefix_len: u8) -> Result<()> {
        let mut msg = AddressMessage::default();
        msg.header.family = AddressFamily::Inet;
        msg.header.prefix_len = prefix_len;
        msg.header.index = ifindex;
        msg.attributes.push(AddressAttribute::Local(addr.into()));
        msg.attributes.push(AddressAttribute::Address(addr.into()));
        self.request(
            RouteNetlinkMessage::NewAddress(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("add address {addr}/{prefix_len} to link {ifindex}"),
        )?;
        Ok(())
    }

    /// Creates macvtap `name` on the device `lower` (an ifindex), in the default mode.
    ///
    /// # Errors
    /// When the kernel refuses (no macvtap support, a name taken, no such lower device).
    pub fn add_macvtap(&mut self, name: &str, lower: u32) -> Result<()> {
        let mut msg = LinkMessage::default();
        msg.attributes.push(LinkAttribute::IfName(name.to_owned()));
        msg.attributes.push(LinkAttribute::Link(lower));
        msg.attributes
            .push(LinkAttribute::LinkInfo(vec![LinkInfo::Kind(
                InfoKind::MacVtap,
            )]));
        self.request(
            RouteNetlinkMessage::NewLink(msg),
            NLM_F_CREATE | NLM_F_EXCL,
            &format!("create macvtap {name} on ifindex {lower}"),
        )?;
        Ok(())
    }
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
