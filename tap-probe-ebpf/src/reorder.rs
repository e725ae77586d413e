//! `reordered`: packets the driver took out of their flow's order.
//!
//! At the start of a driver call of a tracked device, the packet's IPv4 header is read (the
//! skb's `network_header`, set by the IP layer and kept by the qdisc) and its place in its
//! flow's order is stashed for this CPU; when the driver takes it (`NETDEV_TX_OK`, not freed)
//! the place is compared with the flow's next one in `FLOWS`. A packet handed back with
//! `NETDEV_TX_BUSY` is not taken: it is looked at again at its next driver call.
//!
//! What gives the order:
//! - TCP: the IPv4 ID. A TCP socket numbers its segments with its own counter as it sends
//!   them, `segs` at a time for a GSO packet (`ip_select_ident_segs`, `include/net/ip.h`),
//!   before the qdisc: IDs leave the socket in order, and a retransmission takes a fresh one.
//!   A segment whose ID is below the flow's next one was overtaken on the way to the driver.
//!   Only segments that carry data, SYN or FIN count (a reordered bare ACK does not reorder
//!   the byte stream); bare ACKs move the flow's next ID all the same.
//! - The project's UDP frames: their sequence number per flow id ([`FRAME_MAGIC`]).
//!
//! `FLOWS` is an LRU hash: when it is full the least recently seen flow is forgotten to make
//! room. A flow whose state is found missing mid-way (not at its SYN or frame 0) is counted
//! in `flows_joined`: forgotten, or begun before its device was tracked.
//!
//! Other packets (IPv6, other UDP, non-IP) are left alone. The flow state is shared between
//! CPUs without atomics: one queue's driver calls are serialised by its transmit lock, so
//! only a flow moving between two queues of a device while packets of it are in both can
//! race, and then one comparison may use a stale next.

use aya_ebpf::{
    macros::map,
    maps::{LruHashMap, PerCpuArray},
};
use tap_probe_common::{DeviceKey, FRAME_MAGIC, FlowKey, FlowState, MAX_FLOWS};

use crate::facts::{Mem, fact, read};
use crate::storage::{add, shared};

/// `htons(ETH_P_IP)` as `skb->protocol` holds it, read as a little-endian `u16`.
const PROTOCOL_IPV4: u16 = 0x0008;
const IPPROTO_TCP: u8 = 6;
const IPPROTO_UDP: u8 = 17;
const TCP_FIN: u8 = 0x01;
const TCP_SYN: u8 = 0x02;

/// What the packet of this CPU's driver call is in its flow's order.
#[derive(Clone, Copy)]
#[repr(C)]
struct Place {
    key: FlowKey,
    /// The packet's number in its flow: an IPv4 ID, or a frame's sequence number.
    number: u64,
    /// How many numbers the packet takes: a GSO packet's segments, else 1.
    count: u32,
    /// One of `NONE`, `TCP_COUNTED`, `TCP_ACK`, `FRAME`.
    kind: u32,
    /// 1 when the packet begins its flow: a SYN, or a frame numbered 0.
    first: u32,
}

const NONE: u32 = 0;
/// A TCP segment with data, SYN or FIN: counted when late.
const TCP_COUNTED: u32 = 1;
/// A bare TCP ACK: moves the flow's order, never counted.
const TCP_ACK: u32 = 2;
const FRAME: u32 = 3;

/// 1 when the loader wants flows followed (`reordered`); a recording, which does not carry
/// the count, leaves them alone.
#[unsafe(no_mangle)]
static FOLLOW_FLOWS: u32 = 0;

#[inline(always)]
fn following() -> bool {
    // SAFETY: a plain read of the loader's value; volatile so the zero is not folded.
    let on = unsafe { core::ptr::read_volatile(&raw const FOLLOW_FLOWS) };
    on != 0
}

#[map]
static FLOWS: LruHashMap<FlowKey, FlowState> = LruHashMap::with_max_entries(MAX_FLOWS, 0);

#[map]
static PLACE: PerCpuArray<Place> = PerCpuArray::with_max_entries(1, 0);

#[repr(C)]
struct Ipv4 {
    version_ihl: u8,
    tos: u8,
    tot_len: u16,
    id: u16,
    frag_off: u16,
    ttl: u8,
    protocol: u8,
    check: u16,
    saddr: u32,
    daddr: u32,
}

/// A TCP header's first 14 bytes; a UDP header (8 bytes) and the frame's first 8 bytes
/// share the first words.
#[repr(C)]
struct Ports {
    sport: u16,
    dport: u16,
}

#[repr(C)]
struct TcpHead {
    ports: Ports,
    seq: u32,
    ack: u32,
    doff: u8,
    flags: u8,
}

#[repr(C)]
struct FrameHead {
    ports: Ports,
    len: u16,
    check: u16,
    seq: u64,
    magic: u32,
    flow: u32,
}

/// A driver call of the tracked device `device` begins with `skb`: stash its place.
#[inline(always)]
pub(crate) fn driver_call<M: Mem>(skb: u64, device: DeviceKey) {
    if !following() {
        return;
    }
    let Some(p) = PLACE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU; the transmit path runs with bottom halves disabled.
    let p = unsafe { &mut *p };
    p.kind = NONE;
    if let Some(place) = place::<M>(skb, device) {
        *p = place;
    }
}

#[inline(always)]
fn place<M: Mem>(skb: u64, device: DeviceKey) -> Option<Place> {
    if M::read::<u16>(skb, fact!(packet.skb_protocol))? != PROTOCOL_IPV4 {
        return None;
    }
    // The skb's fields as `M` reads them; the headers behind `head`, a plain address to
    // the verifier, with the probe helper.
    let head: u64 = M::read(skb, fact!(packet.skb_head))?;
    let network: u16 = M::read(skb, fact!(packet.skb_network_header))?;
    let ip_at = head + u64::from(network);
    let ip: Ipv4 = read(ip_at, 0)?;
    let ihl = u32::from(ip.version_ihl & 0x0f) * 4;
    if ip.version_ihl >> 4 != 4 || ihl < 20 {
        return None;
    }
    let l4 = ip_at + u64::from(ihl);
    let mut key = FlowKey {
        device,
        saddr: ip.saddr,
        daddr: ip.daddr,
        sport: 0,
        dport: 0,
        proto: u32::from(ip.protocol),
        flow: 0,
        reserved: 0,
    };
    match ip.protocol {
        IPPROTO_TCP => {
            let tcp: TcpHead = read(l4, 0)?;
            key.sport = tcp.ports.sport;
            key.dport = tcp.ports.dport;
            let end: u32 = M::read(skb, fact!(packet.skb_end))?;
            let segs: u16 = read(head + u64::from(end), fact!(packet.shinfo_gso_segs))?;
            let headers = ihl + u32::from(tcp.doff >> 4) * 4;
            let data = u32::from(u16::from_be(ip.tot_len)) > headers
                || segs > 1
                || tcp.flags & (TCP_SYN | TCP_FIN) != 0;
            Some(Place {
                key,
                number: u64::from(u16::from_be(ip.id)),
                count: u32::from(segs).max(1),
                kind: if data { TCP_COUNTED } else { TCP_ACK },
                first: u32::from(tcp.flags & TCP_SYN != 0),
            })
        }
        IPPROTO_UDP => {
            let frame: FrameHead = read(l4, 0)?;
            if u32::from_be(frame.magic) != FRAME_MAGIC {
                return None;
            }
            key.sport = frame.ports.sport;
            key.dport = frame.ports.dport;
            key.flow = u32::from_be(frame.flow);
            let number = u64::from_be(frame.seq);
            Some(Place {
                key,
                number,
                count: 1,
                kind: FRAME,
                first: u32::from(number == 0),
            })
        }
        _ => None,
    }
}

/// The driver took the packet of this CPU's driver call on slot `slot`: counts it there if
/// it came out of its flow's order.
#[inline(always)]
pub(crate) fn taken(slot: u32) {
    if !following() {
        return;
    }
    let Some(p) = PLACE.get_ptr_mut(0) else {
        return;
    };
    // SAFETY: per-CPU; see driver_call.
    let p = unsafe { &mut *p };
    let Place {
        key,
        number,
        count,
        kind,
        first,
    } = *p;
    p.kind = NONE;
    if kind == NONE {
        return;
    }
    let next = number + u64::from(count);
    let Some(state) = FLOWS.get_ptr_mut(key) else {
        // A flow's first packet is in order. One seen first mid-way was forgotten to make
        // room for others, or began before the device was tracked: what came late across
        // that gap is not seen.
        if first == 0
            && let Some(s) = shared(slot)
        {
            add(&mut s.counters.flows_joined, 1);
        }
        let _ = FLOWS.insert(key, FlowState { next }, 0);
        return;
    };
    // SAFETY: a map value; see the module's note on sharing.
    let state = unsafe { &mut *state };
    let late = if kind == FRAME {
        number < state.next
    } else {
        // 16-bit IDs wrap: serial number arithmetic (RFC 1982), as TCP's before().
        #[expect(clippy::cast_possible_truncation, reason = "IPv4 IDs are 16 bits")]
        let behind = (number as u16).wrapping_sub(state.next as u16);
        #[expect(clippy::cast_possible_wrap, reason = "serial number arithmetic")]
        let late = (behind as i16) < 0;
        late
    };
    if late {
        if kind != TCP_ACK
            && let Some(s) = shared(slot)
        {
            add(&mut s.counters.reordered, 1);
        }
    } else {
        state.next = next;
    }
}
