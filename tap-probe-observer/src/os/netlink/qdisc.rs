//! Root qdiscs: installing one, reading its counters.

use anyhow::{Result, anyhow};
use netlink_packet_core::{DefaultNla, NLM_F_CREATE, NLM_F_REPLACE, Nla};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_packet_route::tc::{TcAttribute, TcHandle, TcMessage, TcStats2};

use super::Rtnl;
use super::socket::{ifindex_i32, nla_value};

/// `TCA_OPTIONS` and `TCA_STATS_PKT64` from `include/uapi/linux/{rtnetlink,gen_stats}.h`.
const TCA_OPTIONS: u16 = 2;
const TCA_STATS_PKT64: u16 = 8;

/// Root qdiscs tap-probe knows how to install.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum RootQdisc {
    /// No queue: the stack calls the driver directly and drops on `NETDEV_TX_BUSY`.
    Noqueue,
    /// The kernel default for single-queue devices: 3 bands, `tx_queue_len` packets.
    PfifoFast,
    /// One FIFO; `limit` packets, or `tx_queue_len` when `None`.
    Pfifo { limit: Option<u32> },
    /// Fair queueing with `CoDel`'s delay control, with its defaults (10240 packets).
    FqCodel,
}

impl RootQdisc {
    #[must_use]
    pub fn kind(self) -> &'static str {
        match self {
            Self::Noqueue => "noqueue",
            Self::PfifoFast => "pfifo_fast",
            Self::Pfifo { .. } => "pfifo",
            Self::FqCodel => "fq_codel",
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

impl Rtnl {
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
        )
        .map_err(|err| {
            // qdisc_lookup_ops found no such kind, built in or as a module.
            if err
                .downcast_ref::<super::socket::NetlinkError>()
                .is_some_and(|e| e.errno == libc::ENOENT)
            {
                err.context(format!(
                    "this kernel has no {} qdisc (neither built in nor a loadable module); \
                     choose another --qdisc",
                    qdisc.kind()
                ))
            } else {
                err
            }
        })?;
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
