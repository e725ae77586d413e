//! The socket: requests with `NLM_F_ACK`, dumps that are retried when a concurrent change
//! interrupts them, and kernel errors with their extended-ack message.

use std::os::fd::AsRawFd as _;
use std::path::Path;
use std::time::Duration;

use anyhow::{Context as _, Result, anyhow, bail};
use netlink_packet_core::{
    NLM_F_ACK, NLM_F_ACK_TLVS, NLM_F_DUMP, NLM_F_DUMP_INTR, NLM_F_REQUEST, NetlinkHeader,
    NetlinkMessage, NetlinkPayload, Nla, NlaBuffer, NlasIterator,
};
use netlink_packet_route::RouteNetlinkMessage;
use netlink_sys::{Socket, SocketAddr, protocols::NETLINK_ROUTE};

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
        crate::os::netns::run_in(ns_path, Self::open)
    }

    pub(super) fn dump(
        &mut self,
        msg: &RouteNetlinkMessage,
        what: &str,
    ) -> Result<Vec<RouteNetlinkMessage>> {
        for _ in 0..DUMP_RETRIES {
            match self.request(msg.clone(), NLM_F_DUMP, what) {
                Err(err) if err.downcast_ref::<DumpInterrupted>().is_some() => {}
                other => return other,
            }
        }
        bail!("cannot {what}: the dump was interrupted by concurrent changes {DUMP_RETRIES} times")
    }

    /// Sends one request and collects the replies up to its ACK (or `NLMSG_DONE` for dumps).
    pub(super) fn request(
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

pub(super) fn ifindex_i32(ifindex: u32) -> Result<i32> {
    i32::try_from(ifindex).map_err(|_| anyhow!("ifindex {ifindex} is out of range"))
}

/// The value bytes of a netlink attribute the crate left undecoded.
pub(super) fn nla_value(nla: &impl Nla) -> Vec<u8> {
    let mut value = vec![0; nla.value_len()];
    nla.emit_value(&mut value);
    value
}
