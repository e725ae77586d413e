//! A VM-less vhost-net reader: the kernel's vhost-net worker takes frames from a tap queue
//! and writes them into receive buffers in this process's memory, as it would into a
//! guest's, and this module plays the guest's virtio-net driver: it keeps the receive ring
//! full of buffers, counts what vhost-net fills and gives the buffers back, as fast as it
//! can or at a chosen rate (a slow guest).
//!
//! # Set-up (`drivers/vhost/net.c`, `drivers/vhost/vhost.c`, `tools/virtio/vhost_net_test.c`)
//!
//! `/dev/vhost-net`, `VHOST_SET_OWNER` (binds the device to this process's memory: every
//! later ioctl must come from this process, `vhost_dev_check_owner`), `VHOST_SET_FEATURES`,
//! `VHOST_SET_MEM_TABLE` with one region that maps "guest physical" addresses 1:1 onto one
//! anonymous mapping (the [`Arena`]) holding the split virtqueue and the buffers, then for
//! the receive queue only (index 0, `VHOST_NET_VQ_RX`) `VHOST_SET_VRING_NUM/BASE/ADDR`,
//! eventfds for kick, call and error, and `VHOST_NET_SET_BACKEND` with the tap's fd.
//!
//! The transmit queue (index 1) is left unconfigured and without a backend: each queue
//! gets its backend separately (`vhost_net_set_backend` checks and starts only the vq it
//! is given), `handle_rx` uses only the receive vq, and the transmit vq's work returns at
//! once without a backend. Only vhost-net's busy polling (`vhost_net_busy_poll`, off unless
//! `VHOST_SET_VRING_BUSYLOOP_TIMEOUT` is set) looks at the other vq.
//!
//! # Features and the virtio-net header
//!
//! Every receive buffer starts with a 12-byte `virtio_net_hdr_mrg_rxbuf`
//! (`include/uapi/linux/virtio_net.h`): `VIRTIO_F_VERSION_1` and `VIRTIO_NET_F_MRG_RXBUF`
//! both make vhost-net use the 12-byte form (`vhost_net_set_features`), and `MRG_RXBUF` lets
//! a frame longer than one buffer span several (its first buffer's `num_buffers` says how
//! many), so no frame is ever too long for the ring. Who writes the header depends on the
//! tap, and must match it exactly:
//!
//! - a tap without `IFF_VNET_HDR` (tap-probe's own taps): we also ask for
//!   `VHOST_NET_F_VIRTIO_NET_HDR`, and vhost-net writes a zeroed header itself
//!   (`vhost_hlen` = 12, `sock_hlen` = 0);
//! - a tap with `IFF_VNET_HDR` (what QEMU uses): tun writes the header and vhost-net only
//!   patches `num_buffers` (`sock_hlen` = 12); the tap's `vnet_hdr_sz` must then be 12
//!   (`TUNSETVNETHDRSZ`; it is 10 after `TUNSETIFF`).
//!
//! A mismatch is not an error anywhere in the kernel: `handle_rx` asks tun for
//! `frame + sock_hlen` bytes, `tun_recvmsg` returns `frame + vnet_hdr_sz`, and vhost-net
//! silently discards the frame ("Discarded rx packet", `pr_debug`) after tun has counted
//! it in `tx_packets`. The same goes for a tap without `IFF_NO_PI` (4 more bytes). So
//! [`VhostReader::attach`] reads the tap's flags (`TUNGETIFF`, `TUNGETVNETHDRSZ`) and refuses
//! combinations that would lose frames this way.
//!
//! # How vhost-net takes frames from the tap (and what the kernel counts when)
//!
//! tun queues transmitted skbs in a per-queue `ptr_ring` (`tfile->tx_ring`, sized by
//! `tx_queue_len`), tail-dropping when it is full (`tun_net_xmit`: `tx_dropped`,
//! `SKB_DROP_REASON_FULL_RING`). vhost-net's `handle_rx` does not read the ring one skb at a
//! time: `peek_head_len` -> `vhost_net_buf_peek` -> `vhost_net_buf_produce` moves up to
//! `VHOST_NET_BATCH` (64) pointers at once out of the tap's ring into its own array
//! (`ptr_ring_consume_batched`; on 7.3 `__ptr_ring_consume_batched` followed by
//! `tun_wake_queue(file, n)`, which wakes a queue stopped by `IFF_BACKPRESSURE`). Then, per
//! frame, it reserves receive buffers (`get_rx_bufs`) and hands the skb to
//! `tun_recvmsg` as `msg_control`; `tun_recvmsg` -> `tun_do_read` -> `tun_put_user` copies
//! it into the buffers and counts it (`dev_sw_netstats_tx_add`: `tx_packets`, `tx_bytes`),
//! then `tun_do_read` frees it with `consume_skb`. So the ring's consumer index runs up to
//! 64 frames ahead of `tx_packets`; both count every frame exactly once. Frames vhost-net
//! holds when it runs out of receive buffers stay in its array (not in the tap's ring,
//! not yet counted) until buffers come back.
//!
//! Releasing the backend (`VHOST_NET_SET_BACKEND` with -1, or closing the device) puts
//! the frames still in that array back into the tap's ring (`vhost_net_buf_unproduce` ->
//! `ptr_ring_unconsume`); those that no longer fit because the tap refilled the ring are
//! freed with `tun_ptr_free` -> `kfree_skb` (no `tx_dropped`, no `tx_packets`). To account
//! for every frame, stop the sender first and [`VhostReader::run`] with
//! [`RunConfig::drain`] before dropping the reader.
//!
//! # What a probe sees (checked with tracefs histograms on Debian's 6.1, 6.12 and 7.3)
//!
//! Each frame vhost-net takes is one `consume_skb` called from `tun_do_read` (not inlined in
//! any of the three; `skb:consume_skb`'s `location`, or a kprobe's return address before
//! 6.3), right after `tun_put_user` counted it: exactly as many as `tx_packets`, on the
//! same hook as a `read(2)` reader. Only the caller of `tun_do_read` differs: `tun_recvmsg`
//! (from `handle_rx` in the vhost worker) instead of `tun_chr_read_iter`. Frames freed
//! without delivery show up as `kfree_skb` with reason `NOT_SPECIFIED` at
//! `vhost_net_buf_unproduce` (the release above) or `tun_queue_purge` (left in the ring
//! when the tap closes). The discard of a header mismatch also ends in that
//! `consume_skb`: tun counted the frame, the reader never sees it.
//!
//! # Notifications (`include/uapi/linux/virtio_ring.h`)
//!
//! No `VIRTIO_RING_F_EVENT_IDX`: the flags protocol is enough here. vhost-net sets
//! `VRING_USED_F_NO_NOTIFY` while it works and clears it when it ran out of buffers
//! (`vhost_enable_notify`), and only then needs a kick after buffers are re-posted; when
//! it stopped because the tap's ring was empty it waits for the tap's wake-up instead
//! (`vhost_net_enable_vq`). We set `VRING_AVAIL_F_NO_INTERRUPT` while busy and clear it
//! only before sleeping on the call eventfd, re-checking the used index after clearing it
//! (`vhost_notify` reads the flag on every signal).

use std::collections::VecDeque;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};
use std::ptr::NonNull;
use std::sync::atomic::{AtomicBool, AtomicU16, Ordering, fence};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow, bail};

use crate::lab::pacer::{Pacer, deadline_after};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::ioctl::ioctl_num_type;

// The ring is shared with the kernel in its byte order; virtio 1.0 rings are little endian.
const _: () = assert!(
    cfg!(target_endian = "little"),
    "the vring is written in native byte order, which virtio 1.0 requires to be little endian"
);

const VHOST_NET_PATH: &str = "/dev/vhost-net";

// ioctls from include/uapi/linux/vhost.h (type VHOST_VIRTIO = 0xAF).
const VHOST_VIRTIO: u8 = 0xAF;
const VHOST_GET_FEATURES: ioctl_num_type =
    nix::request_code_read!(VHOST_VIRTIO, 0x00, size_of::<u64>());
const VHOST_SET_FEATURES: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x00, size_of::<u64>());
const VHOST_SET_OWNER: ioctl_num_type = nix::request_code_none!(VHOST_VIRTIO, 0x01);
const VHOST_SET_MEM_TABLE: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x03, size_of::<VhostMemoryHeader>());
const VHOST_SET_VRING_NUM: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x10, size_of::<VhostVringState>());
const VHOST_SET_VRING_ADDR: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x11, size_of::<VhostVringAddr>());
const VHOST_SET_VRING_BASE: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x12, size_of::<VhostVringState>());
const VHOST_SET_VRING_KICK: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x20, size_of::<VhostVringFile>());
const VHOST_SET_VRING_CALL: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x21, size_of::<VhostVringFile>());
const VHOST_SET_VRING_ERR: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x22, size_of::<VhostVringFile>());
const VHOST_NET_SET_BACKEND: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x30, size_of::<VhostVringFile>());

// Feature bits: include/uapi/linux/virtio_config.h, virtio_net.h, vhost.h.
const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
const VHOST_NET_F_VIRTIO_NET_HDR: u64 = 1 << 27;
const VIRTIO_F_VERSION_1: u64 = 1 << 32;

// include/uapi/linux/virtio_ring.h
const VRING_DESC_F_WRITE: u16 = 2;
const VRING_USED_F_NO_NOTIFY: u16 = 1;
const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// `VHOST_NET_VQ_RX` in `drivers/vhost/net.c`: the queue vhost-net fills from the tap.
const RX_QUEUE: u32 = 0;
/// `sizeof(struct virtio_net_hdr_mrg_rxbuf)`: the header in front of every frame.
pub(crate) const VNET_HDR_LEN: usize = 12;
/// `offsetof(struct virtio_net_hdr_mrg_rxbuf, num_buffers)`.
const NUM_BUFFERS_OFFSET: usize = 10;
/// `VHOST_PAGE_SIZE`: memory regions must be aligned to it.
const PAGE: usize = 4096;
/// The largest ring vhost accepts: a power of two up to 0xffff (`vhost_vring_set_num`).
const MAX_QUEUE_SIZE: u16 = 32_768;
const MIN_BUFFER_LEN: u32 = 64;
const MAX_BUFFER_LEN: u32 = 65_536;
/// How long a wait lasts at most before the stop flag and deadlines are checked again.
const POLL_SLICE: Duration = Duration::from_millis(20);

// uapi structs, include/uapi/linux/vhost_types.h.
#[repr(C)]
#[derive(Clone, Copy)]
struct VhostVringState {
    index: u32,
    num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct VhostVringFile {
    index: u32,
    /// -1 unbinds.
    fd: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct VhostVringAddr {
    index: u32,
    flags: u32,
    desc_user_addr: u64,
    used_user_addr: u64,
    avail_user_addr: u64,
    log_guest_addr: u64,
}

/// `struct vhost_memory` without its flexible array; the ioctl number encodes this size.
#[repr(C)]
#[derive(Clone, Copy)]
struct VhostMemoryHeader {
    nregions: u32,
    padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
struct VhostMemoryRegion {
    guest_phys_addr: u64,
    memory_size: u64,
    userspace_addr: u64,
    flags_padding: u64,
}

/// `struct vhost_memory` with exactly one region.
#[repr(C)]
struct VhostMemoryOne {
    header: VhostMemoryHeader,
    region: VhostMemoryRegion,
}

/// `struct vring_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
struct VringDesc {
    addr: u64,
    len: u32,
    flags: u16,
    next: u16,
}

/// `struct vring_used_elem`.
#[repr(C)]
#[derive(Clone, Copy)]
struct VringUsedElem {
    id: u32,
    len: u32,
}

/// The ring's shape.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct VhostConfig {
    /// Receive buffers, all posted at once: a power of two up to 32768. A real guest
    /// (QEMU's virtio-net) uses 256 by default.
    pub(crate) queue_size: u16,
    /// Bytes per buffer, header included. Longer frames span several buffers.
    pub(crate) buffer_len: u32,
}

impl Default for VhostConfig {
    fn default() -> Self {
        Self {
            queue_size: 256,
            buffer_len: 2048,
        }
    }
}

/// Who writes the virtio-net header in front of each frame.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) enum HeaderSource {
    /// vhost-net (`VHOST_NET_F_VIRTIO_NET_HDR`): the tap has no `IFF_VNET_HDR`.
    Vhost,
    /// tun (`IFF_VNET_HDR` with a 12-byte `vnet_hdr_sz`).
    Tap,
}

/// How long and how fast one [`VhostReader::run`] goes.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub(crate) struct RunConfig {
    /// Buffers given back per second (a slow guest); `None` gives them back at once.
    /// vhost-net then takes frames at this rate, after a first burst that fills the ring.
    pub(crate) pps: Option<u64>,
    /// Return after this long.
    pub(crate) deadline: Duration,
    /// Return once this many frames were taken in this run.
    pub(crate) max_frames: Option<u64>,
    /// Return once no frame arrived for this long while every buffer was posted.
    pub(crate) idle_stop: Option<Duration>,
}

impl RunConfig {
    /// Unpaced until nothing arrives for `idle` (or `limit` passes): what is still in the
    /// tap's ring, in vhost-net's batch and in the ring gets taken and counted.
    #[must_use]
    pub(crate) fn drain(idle: Duration, limit: Duration) -> Self {
        Self {
            pps: None,
            deadline: limit,
            max_frames: None,
            idle_stop: Some(idle),
        }
    }
}

/// Totals since [`VhostReader::attach`].
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct Counters {
    /// Frames vhost-net delivered (a frame is one or more used buffers).
    pub(crate) frames: u64,
    /// Their bytes, virtio-net headers excluded: what tun adds to `tx_bytes`.
    pub(crate) bytes: u64,
    /// Used ring entries read.
    pub(crate) buffers: u64,
    /// Buffers given back to vhost-net after use.
    pub(crate) recycled: u64,
    /// Kicks sent: one at attach, then one whenever buffers were re-posted after
    /// vhost-net had run out of them and asked for a kick.
    pub(crate) kicks: u64,
    /// Sleeps on the call eventfd.
    pub(crate) waits: u64,
}

/// What one [`VhostReader::run`] did.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
pub(crate) struct RunReport {
    pub(crate) frames: u64,
    pub(crate) bytes: u64,
    pub(crate) elapsed: Duration,
}

/// A tap queue attached to vhost-net, and the receive ring it fills.
///
/// Counting: every frame vhost-net delivers is counted once, when its used entry is read
/// ([`VhostReader::run`], [`VhostReader::detach`]); after `detach`, [`Counters::frames`]
/// equals the frames tun counted in `tx_packets` for this queue while attached, unless
/// vhost-net discarded some (it does not for the packet formats `attach` accepts).
///
/// Dropping it releases the backend (the tap's queue stays attached to whoever else holds
/// its fd), closes the device and unmaps the ring.
pub(crate) struct VhostReader {
    // Drop order is field order: the device is closed (which stops and flushes its
    // worker, `vhost_net_release`) before the memory it writes into is unmapped.
    device: OwnedFd,
    kick: OwnedFd,
    call: OwnedFd,
    error: OwnedFd,
    ring: RxRing,
    counters: Counters,
    attached: bool,
}

impl VhostReader {
    /// Attaches vhost-net to the tap queue `tap` (a `/dev/net/tun` fd after `TUNSETIFF`)
    /// and posts every buffer. vhost-net takes its own reference to the queue, so the
    /// caller may close `tap` and the queue stays attached until the reader is dropped.
    ///
    /// # Errors
    /// When `/dev/vhost-net` is missing or not ours to open, `tap` is not a tap queue or has
    /// a packet format vhost-net would silently discard (see the module docs), an ioctl
    /// fails (the message names it and the errno), or the ring cannot be mapped.
    pub(crate) fn attach(tap: BorrowedFd<'_>, cfg: &VhostConfig) -> Result<Self> {
        let header = header_source(tap)?;
        let device = open_vhost_net()?;
        let dev = device.as_fd();
        ioctl(
            dev,
            "VHOST_SET_OWNER",
            VHOST_SET_OWNER,
            std::ptr::null::<u8>(),
        )?;

        let mut offered: u64 = 0;
        ioctl(
            dev,
            "VHOST_GET_FEATURES",
            VHOST_GET_FEATURES,
            &raw mut offered,
        )?;
        let features = choose_features(offered, header)?;
        ioctl(
            dev,
            "VHOST_SET_FEATURES",
            VHOST_SET_FEATURES,
            &raw const features,
        )?;

        let mut ring = RxRing::new(cfg.queue_size, cfg.buffer_len)?;
        register_ring(dev, &ring)?;
        let [kick, call, error] = register_eventfds(dev)?;

        // Buffers first, so that vhost-net finds them when the backend starts polling
        // the tap (`vhost_net_enable_vq` runs the handler at once if frames wait).
        ring.set_interrupts(false);
        ring.post(usize::MAX);
        let mut reader = Self {
            device,
            kick,
            call,
            error,
            ring,
            counters: Counters::default(),
            attached: false,
        };
        reader.set_backend(tap.as_raw_fd())?;
        reader.attached = true;
        reader.kick()?;
        Ok(reader)
    }

    /// Totals since attach.
    #[must_use]
    pub(crate) fn counters(&self) -> Counters {
        self.counters
    }

    /// Takes frames until `stop` is set, or `cfg`'s deadline, frame count or idle time is
    /// reached, giving buffers back at `cfg.pps` or at once. `on_frame` sees each frame's
    /// bytes in its first buffer (all of it unless it spans several buffers), without
    /// the virtio-net header, e.g. to check sequence numbers.
    ///
    /// # Errors
    /// When `cfg.pps` is 0, vhost-net signals a ring error, or the ring holds an entry it
    /// should not (a corrupt ring: nothing is counted twice or read out of bounds).
    pub(crate) fn run(
        &mut self,
        cfg: &RunConfig,
        stop: &AtomicBool,
        on_frame: &mut dyn FnMut(&[u8]),
    ) -> Result<RunReport> {
        if cfg.pps == Some(0) {
            bail!(
                "a reader rate of 0 frames per second takes nothing; leave the rate unset for no limit"
            );
        }
        let start = Instant::now();
        let end = deadline_after(start, cfg.deadline);
        let max = cfg.max_frames.unwrap_or(u64::MAX);
        let mut pacer = cfg.pps.map(|pps| Pacer::new(pps, start));
        let mut report = RunReport::default();
        let mut last_progress = start;
        let mut recycled: u64 = 0;

        while !stop.load(Ordering::Relaxed) && report.frames < max {
            let now = Instant::now();
            if now >= end {
                break;
            }
            if cfg
                .idle_stop
                .is_some_and(|idle| now.duration_since(last_progress) >= idle)
            {
                break;
            }

            let taken = self.ring.take(max - report.frames, on_frame)?;
            if taken.buffers > 0 {
                last_progress = Instant::now();
            }
            self.record(taken, &mut report);

            let allowed = match &mut pacer {
                Some(p) => {
                    let now = Instant::now();
                    if self.ring.waiting() == 0 {
                        p.forgive(now, recycled);
                    }
                    usize::try_from(p.allowed(now, recycled)).unwrap_or(usize::MAX)
                }
                None => usize::MAX,
            };
            let posted = self.ring.post(allowed);
            if posted > 0 {
                recycled += posted as u64;
                self.counters.recycled += posted as u64;
                if self.ring.device_wants_kick() {
                    self.kick()?;
                }
            }

            if taken.buffers == 0 && posted == 0 {
                let until = match cfg.idle_stop {
                    Some(idle) => end.min(last_progress + idle),
                    None => end,
                };
                match &pacer {
                    // Buffers wait for their turn: sleep until the next one is due.
                    Some(p) if self.ring.waiting() > 0 => p.wait(recycled, until),
                    // Everything is posted: sleep until vhost-net uses a buffer.
                    _ => self.wait_used(until)?,
                }
            }
        }
        report.elapsed = start.elapsed();
        Ok(report)
    }

    /// Releases the backend now and takes what vhost-net delivered before it stopped, so
    /// that the counters end equal to the tap's `tx_packets`; reports a failure (drop does
    /// the same silently). Frames vhost-net took from the tap's ring but had not
    /// delivered go back to that ring, or are freed if it has no room for them (see the
    /// module docs): drain first to account for every frame.
    ///
    /// # Errors
    /// When `VHOST_NET_SET_BACKEND` fails or the ring holds a corrupt entry.
    pub(crate) fn detach(&mut self, on_frame: &mut dyn FnMut(&[u8])) -> Result<RunReport> {
        let mut report = RunReport::default();
        if !self.attached {
            return Ok(report);
        }
        let start = Instant::now();
        self.attached = false;
        self.set_backend(-1)?;
        // vhost_net_set_backend flushed the queue's work (vhost_net_flush_vq) after
        // clearing the backend, and handle_rx publishes used entries under the vq mutex:
        // the used ring is final now.
        let taken = self.ring.take(u64::MAX, on_frame)?;
        self.record(taken, &mut report);
        report.elapsed = start.elapsed();
        Ok(report)
    }

    fn record(&mut self, taken: Taken, report: &mut RunReport) {
        report.frames += taken.frames;
        report.bytes += taken.bytes;
        self.counters.frames += taken.frames;
        self.counters.bytes += taken.bytes;
        self.counters.buffers += taken.buffers;
    }

    fn set_backend(&self, fd: i32) -> Result<()> {
        let backend = VhostVringFile {
            index: RX_QUEUE,
            fd,
        };
        ioctl(
            self.device.as_fd(),
            "VHOST_NET_SET_BACKEND",
            VHOST_NET_SET_BACKEND,
            &raw const backend,
        )
    }

    fn kick(&mut self) -> Result<()> {
        let one: u64 = 1;
        // SAFETY: writes 8 bytes from a live u64 to an eventfd we own.
        let rc = unsafe {
            libc::write(
                self.kick.as_raw_fd(),
                (&raw const one).cast(),
                size_of::<u64>(),
            )
        };
        // EAGAIN means the counter is saturated: a kick is pending anyway.
        if rc < 0 && Errno::last() != Errno::EAGAIN {
            return Err(Errno::last()).context("writing the vhost-net kick eventfd failed");
        }
        self.counters.kicks += 1;
        Ok(())
    }

    /// Sleeps until vhost-net signals used buffers or `until` (at most one poll slice).
    fn wait_used(&mut self, until: Instant) -> Result<()> {
        self.ring.set_interrupts(true);
        // Paired with the full barrier in vhost_notify (drivers/vhost/vhost.c): either it
        // sees interrupts enabled or we see its used index.
        fence(Ordering::SeqCst);
        if self.ring.has_used() {
            self.ring.set_interrupts(false);
            return Ok(());
        }
        let slice = until
            .saturating_duration_since(Instant::now())
            .min(POLL_SLICE);
        let mut fds = [
            PollFd::new(self.call.as_fd(), PollFlags::POLLIN),
            PollFd::new(self.error.as_fd(), PollFlags::POLLIN),
        ];
        let polled = nix::poll::poll(&mut fds, crate::os::clock::poll_timeout(slice));
        let call_ready = fds[0]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        let error_ready = fds[1]
            .revents()
            .is_some_and(|r| r.contains(PollFlags::POLLIN));
        self.ring.set_interrupts(false);
        self.counters.waits += 1;
        match polled {
            Ok(_) | Err(Errno::EINTR) => {}
            Err(err) => return Err(err).context("poll on the vhost-net call eventfd failed"),
        }
        if error_ready {
            bail!(
                "vhost-net reported an error on its receive ring (vq_err in drivers/vhost/vhost.c; \
                 enable dynamic debug for drivers/vhost to see it in the kernel log)"
            );
        }
        if call_ready {
            drain_eventfd(self.call.as_fd())?;
        }
        Ok(())
    }
}

impl Drop for VhostReader {
    fn drop(&mut self) {
        // Best effort: closing the device releases the backend too (vhost_net_release).
        let _ = self.detach(&mut |_| {});
    }
}

/// Registers the arena as the device's memory and the receive ring in it.
fn register_ring(dev: BorrowedFd<'_>, ring: &RxRing) -> Result<()> {
    let (base, len) = ring.region();
    let mem = VhostMemoryOne {
        header: VhostMemoryHeader {
            nregions: 1,
            padding: 0,
        },
        // "Guest physical" addresses are our own virtual addresses: descriptors
        // then simply hold pointers.
        region: VhostMemoryRegion {
            guest_phys_addr: base,
            memory_size: len,
            userspace_addr: base,
            flags_padding: 0,
        },
    };
    ioctl(
        dev,
        "VHOST_SET_MEM_TABLE",
        VHOST_SET_MEM_TABLE,
        &raw const mem,
    )?;

    let num = VhostVringState {
        index: RX_QUEUE,
        num: u32::from(ring.size),
    };
    ioctl(
        dev,
        "VHOST_SET_VRING_NUM",
        VHOST_SET_VRING_NUM,
        &raw const num,
    )?;
    let base_state = VhostVringState {
        index: RX_QUEUE,
        num: 0,
    };
    ioctl(
        dev,
        "VHOST_SET_VRING_BASE",
        VHOST_SET_VRING_BASE,
        &raw const base_state,
    )?;
    let (desc, avail, used) = ring.addresses();
    let addr = VhostVringAddr {
        index: RX_QUEUE,
        flags: 0,
        desc_user_addr: desc,
        used_user_addr: used,
        avail_user_addr: avail,
        log_guest_addr: 0,
    };
    ioctl(
        dev,
        "VHOST_SET_VRING_ADDR",
        VHOST_SET_VRING_ADDR,
        &raw const addr,
    )?;
    Ok(())
}

/// Creates and registers the kick, call and error eventfds of the receive queue.
fn register_eventfds(dev: BorrowedFd<'_>) -> Result<[OwnedFd; 3]> {
    let kick = eventfd("kick")?;
    let call = eventfd("call")?;
    let error = eventfd("error")?;
    for (name, request, fd) in [
        ("VHOST_SET_VRING_KICK", VHOST_SET_VRING_KICK, &kick),
        ("VHOST_SET_VRING_CALL", VHOST_SET_VRING_CALL, &call),
        ("VHOST_SET_VRING_ERR", VHOST_SET_VRING_ERR, &error),
    ] {
        let file = VhostVringFile {
            index: RX_QUEUE,
            fd: fd.as_raw_fd(),
        };
        ioctl(dev, name, request, &raw const file)?;
    }
    Ok([kick, call, error])
}

/// Reads the tap queue's flags and picks who writes the virtio-net header.
fn header_source(tap: BorrowedFd<'_>) -> Result<HeaderSource> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF writes a `struct ifreq`, which `ifr` is.
    let rc = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNGETIFF, &raw mut ifr) };
    if rc < 0 {
        let err = Errno::last();
        bail!(
            "fd {} is not an attached tun/tap queue: TUNGETIFF failed with {err} \
             (pass the fd of /dev/net/tun after TUNSETIFF)",
            tap.as_raw_fd()
        );
    }
    // SAFETY: TUNGETIFF filled the flags member of the union.
    let flags = libc::c_int::from(unsafe { ifr.ifr_ifru.ifru_flags });
    // SAFETY: the kernel NUL-terminates ifr_name.
    let name = unsafe { std::ffi::CStr::from_ptr(ifr.ifr_name.as_ptr()) }.to_string_lossy();
    if flags & libc::IFF_NO_PI == 0 {
        bail!(
            "tap {name} prepends packet information (no IFF_NO_PI): vhost-net would discard \
             every frame; create it with IFF_NO_PI"
        );
    }
    if flags & libc::IFF_VNET_HDR == 0 {
        return Ok(HeaderSource::Vhost);
    }
    let mut size: libc::c_int = 0;
    // SAFETY: TUNGETVNETHDRSZ writes an int, which `size` is.
    let rc = unsafe { libc::ioctl(tap.as_raw_fd(), libc::TUNGETVNETHDRSZ, &raw mut size) };
    if rc < 0 {
        bail!("TUNGETVNETHDRSZ on tap {name} failed: {}", Errno::last());
    }
    if usize::try_from(size).ok() != Some(VNET_HDR_LEN) {
        bail!(
            "tap {name} writes a {size}-byte virtio-net header (IFF_VNET_HDR) but vhost-net with \
             VIRTIO_F_VERSION_1 expects {VNET_HDR_LEN} and would discard every frame: set it \
             with TUNSETVNETHDRSZ {VNET_HDR_LEN}, or create the tap without IFF_VNET_HDR"
        );
    }
    Ok(HeaderSource::Tap)
}

/// The features to acknowledge: the 12-byte header, mergeable buffers, and vhost-side
/// headers for a tap that writes none. Nothing else (no event index, no indirect
/// descriptors, no IOTLB).
fn choose_features(offered: u64, header: HeaderSource) -> Result<u64> {
    let mut wanted = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF;
    if header == HeaderSource::Vhost {
        wanted |= VHOST_NET_F_VIRTIO_NET_HDR;
    }
    let missing = wanted & !offered;
    if missing != 0 {
        let names: Vec<&str> = [
            (VIRTIO_F_VERSION_1, "VIRTIO_F_VERSION_1"),
            (VIRTIO_NET_F_MRG_RXBUF, "VIRTIO_NET_F_MRG_RXBUF"),
            (VHOST_NET_F_VIRTIO_NET_HDR, "VHOST_NET_F_VIRTIO_NET_HDR"),
        ]
        .iter()
        .filter(|(bit, _)| missing & bit != 0)
        .map(|(_, name)| *name)
        .collect();
        bail!(
            "vhost-net does not offer {} (VHOST_GET_FEATURES returned {offered:#x})",
            names.join(", ")
        );
    }
    Ok(wanted)
}

fn open_vhost_net() -> Result<OwnedFd> {
    let path = c"/dev/vhost-net";
    // SAFETY: plain open(2) of a NUL-terminated path.
    let fd = unsafe { libc::open(path.as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        let err = Errno::last();
        return Err(match err {
            Errno::ENOENT | Errno::ENODEV | Errno::ENXIO => anyhow!(
                "cannot open {VHOST_NET_PATH}: {err} (load the vhost_net module: `modprobe vhost_net`)"
            ),
            Errno::EACCES | Errno::EPERM => {
                anyhow!("cannot open {VHOST_NET_PATH}: {err} (run as root)")
            }
            _ => anyhow!("cannot open {VHOST_NET_PATH}: {err}"),
        });
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

/// One vhost ioctl whose argument is `arg` (or none); the error names the ioctl.
fn ioctl<T>(fd: BorrowedFd<'_>, name: &str, request: ioctl_num_type, arg: *const T) -> Result<()> {
    // SAFETY: every caller passes the uapi struct (or u64) that `request` encodes, alive for
    // the call, or null for VHOST_SET_OWNER, which takes no argument.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), request, arg) };
    if rc >= 0 {
        return Ok(());
    }
    let err = Errno::last();
    let hint = match (name, err) {
        ("VHOST_SET_OWNER", Errno::EBUSY) => " (this vhost-net device already has an owner)",
        (_, Errno::EPERM) => {
            " (only the process that called VHOST_SET_OWNER may configure the device)"
        }
        ("VHOST_NET_SET_BACKEND", Errno::ENOTSOCK) => {
            " (the fd is neither a tun/tap queue nor a packet socket)"
        }
        ("VHOST_NET_SET_BACKEND", Errno::EBADFD) => " (the tap queue is detached)",
        ("VHOST_NET_SET_BACKEND", Errno::EFAULT) => {
            " (vhost-net cannot access the ring: memory table or ring addresses are wrong)"
        }
        ("VHOST_SET_FEATURES", Errno::EOPNOTSUPP) => " (a feature bit that was not offered)",
        _ => "",
    };
    Err(anyhow!("{name} on {VHOST_NET_PATH} failed: {err}{hint}"))
}

fn eventfd(role: &str) -> Result<OwnedFd> {
    // SAFETY: plain eventfd(2) call.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Errno::last()).with_context(|| format!("cannot create the {role} eventfd"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

fn drain_eventfd(fd: BorrowedFd<'_>) -> Result<()> {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
    let rc = unsafe { libc::read(fd.as_raw_fd(), (&raw mut value).cast(), size_of::<u64>()) };
    if rc < 0 && !matches!(Errno::last(), Errno::EAGAIN | Errno::EINTR) {
        return Err(Errno::last()).context("reading the vhost-net call eventfd failed");
    }
    Ok(())
}

/// Where the parts of the split virtqueue and the buffers lie in the arena.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
struct Layout {
    desc: usize,
    avail: usize,
    used: usize,
    buffers: usize,
    len: usize,
}

impl Layout {
    /// The legacy virtio layout (descriptors, then the available ring, then the used ring
    /// on the next page), followed by the buffers on the next page.
    fn new(size: u16, buffer_len: u32) -> Result<Self> {
        if !size.is_power_of_two() || !(2..=MAX_QUEUE_SIZE).contains(&size) {
            bail!("the queue size must be a power of two from 2 to {MAX_QUEUE_SIZE}, got {size}");
        }
        if !(MIN_BUFFER_LEN..=MAX_BUFFER_LEN).contains(&buffer_len) {
            bail!(
                "the buffer length must be {MIN_BUFFER_LEN} to {MAX_BUFFER_LEN} bytes, got {buffer_len}"
            );
        }
        let n = usize::from(size);
        let desc = 0;
        let avail = desc + n * size_of::<VringDesc>();
        // flags, idx, ring[n], used_event
        let avail_len = 2 + 2 + 2 * n + 2;
        let used = (avail + avail_len).next_multiple_of(PAGE);
        // flags, idx, ring[n], avail_event
        let used_len = 2 + 2 + n * size_of::<VringUsedElem>() + 2;
        let buffers = (used + used_len).next_multiple_of(PAGE);
        let len = (buffers + n * usize::try_from(buffer_len)?).next_multiple_of(PAGE);
        Ok(Self {
            desc,
            avail,
            used,
            buffers,
            len,
        })
    }
}

/// An anonymous read-write mapping, unmapped on drop.
struct Arena {
    base: NonNull<u8>,
    len: usize,
}

// SAFETY: the mapping is owned by this value alone and has no thread affinity; sending it
// to another thread moves that ownership.
unsafe impl Send for Arena {}

impl Arena {
    fn new(len: usize) -> Result<Self> {
        // SAFETY: a fresh anonymous mapping; no existing memory is affected.
        let ptr = unsafe {
            libc::mmap(
                std::ptr::null_mut(),
                len,
                libc::PROT_READ | libc::PROT_WRITE,
                libc::MAP_PRIVATE | libc::MAP_ANONYMOUS | libc::MAP_POPULATE,
                -1,
                0,
            )
        };
        if ptr == libc::MAP_FAILED {
            return Err(Errno::last())
                .with_context(|| format!("cannot map {len} bytes for the vhost-net ring"));
        }
        let base = NonNull::new(ptr.cast::<u8>())
            .ok_or_else(|| anyhow!("mmap returned a null mapping"))?;
        Ok(Self { base, len })
    }

    fn addr(&self) -> u64 {
        self.base.as_ptr() as u64
    }

    /// A pointer `offset` bytes into the mapping, for a `T` that fits there.
    fn at<T>(&self, offset: usize) -> *mut T {
        debug_assert!(offset + size_of::<T>() <= self.len);
        debug_assert!(offset.is_multiple_of(align_of::<T>()));
        // SAFETY: callers only pass offsets computed from the Layout, inside the mapping.
        unsafe { self.base.as_ptr().add(offset).cast() }
    }
}

impl Drop for Arena {
    fn drop(&mut self) {
        // SAFETY: base/len is exactly the mapping made in Arena::new, unmapped once.
        unsafe {
            libc::munmap(self.base.as_ptr().cast(), self.len);
        }
    }
}

/// What one [`RxRing::take`] read.
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq)]
struct Taken {
    frames: u64,
    bytes: u64,
    buffers: u64,
}

/// The receive virtqueue seen from the driver side. Descriptor `i` always points at
/// buffer `i`; only their order in the available ring changes.
struct RxRing {
    arena: Arena,
    layout: Layout,
    size: u16,
    buffer_len: u32,
    /// Our copy of `avail->idx`: buffers posted so far, modulo 2^16.
    next_avail: u16,
    /// The next used entry to read.
    next_used: u16,
    /// Descriptors the device owns (posted, not yet returned).
    with_device: Vec<bool>,
    /// Descriptors returned and waiting to be posted again, oldest first.
    to_post: VecDeque<u16>,
    /// Buffers still to come of a frame that spans several (mergeable buffers).
    frame_rest: u16,
}

impl RxRing {
    fn new(size: u16, buffer_len: u32) -> Result<Self> {
        let layout = Layout::new(size, buffer_len)?;
        let arena = Arena::new(layout.len)?;
        for i in 0..size {
            let desc = VringDesc {
                addr: arena.addr() + (layout.buffers + usize::from(i) * buffer_len as usize) as u64,
                len: buffer_len,
                flags: VRING_DESC_F_WRITE,
                next: 0,
            };
            // SAFETY: descriptor i lies inside the mapping (Layout), nobody else uses it
            // before the ring is handed to the device.
            unsafe {
                arena
                    .at::<VringDesc>(layout.desc + usize::from(i) * size_of::<VringDesc>())
                    .write(desc);
            }
        }
        Ok(Self {
            arena,
            layout,
            size,
            buffer_len,
            next_avail: 0,
            next_used: 0,
            with_device: vec![false; usize::from(size)],
            to_post: (0..size).collect(),
            frame_rest: 0,
        })
    }

    /// The memory region to register: (address, length).
    fn region(&self) -> (u64, u64) {
        (self.arena.addr(), self.layout.len as u64)
    }

    /// (descriptor table, available ring, used ring) addresses.
    fn addresses(&self) -> (u64, u64, u64) {
        let base = self.arena.addr();
        (
            base + self.layout.desc as u64,
            base + self.layout.avail as u64,
            base + self.layout.used as u64,
        )
    }

    fn u16_at(&self, offset: usize) -> &AtomicU16 {
        // SAFETY: the offset is a 2-byte aligned u16 field of the ring inside the mapping,
        // which lives as long as `self`; the kernel accesses it concurrently, hence atomic.
        unsafe { AtomicU16::from_ptr(self.arena.at::<u16>(offset)) }
    }

    fn avail_flags(&self) -> &AtomicU16 {
        self.u16_at(self.layout.avail)
    }

    fn avail_idx(&self) -> &AtomicU16 {
        self.u16_at(self.layout.avail + 2)
    }

    fn used_flags(&self) -> &AtomicU16 {
        self.u16_at(self.layout.used)
    }

    fn used_idx(&self) -> &AtomicU16 {
        self.u16_at(self.layout.used + 2)
    }

    fn slot(&self, idx: u16) -> usize {
        usize::from(idx & (self.size - 1))
    }

    /// Descriptors returned by the device and not yet posted again.
    fn waiting(&self) -> usize {
        self.to_post.len()
    }

    /// Posts up to `max` waiting descriptors; returns how many.
    fn post(&mut self, max: usize) -> usize {
        let n = self.to_post.len().min(max);
        if n == 0 {
            return 0;
        }
        for id in self.to_post.drain(..n) {
            let offset = self.layout.avail + 4 + 2 * usize::from(self.next_avail & (self.size - 1));
            // SAFETY: a slot of the available ring inside the mapping; the device reads
            // it only after the index store below publishes it.
            unsafe { self.arena.at::<u16>(offset).write_volatile(id) };
            self.with_device[usize::from(id)] = true;
            self.next_avail = self.next_avail.wrapping_add(1);
        }
        // Publishes the ring entries (vhost_get_avail_idx reads the index, then smp_rmb).
        self.avail_idx().store(self.next_avail, Ordering::Release);
        n
    }

    /// Whether the device asked to be kicked for new buffers.
    fn device_wants_kick(&self) -> bool {
        // Paired with the smp_mb in vhost_enable_notify: either it sees our new index or
        // we see the flag it cleared.
        fence(Ordering::SeqCst);
        self.used_flags().load(Ordering::Relaxed) & VRING_USED_F_NO_NOTIFY == 0
    }

    fn set_interrupts(&self, enabled: bool) {
        let flags = if enabled {
            0
        } else {
            VRING_AVAIL_F_NO_INTERRUPT
        };
        self.avail_flags().store(flags, Ordering::Relaxed);
    }

    fn has_used(&self) -> bool {
        self.used_idx().load(Ordering::Acquire) != self.next_used
    }

    /// Reads the used entries the device published, at most `max_frames` frames' worth,
    /// and queues their descriptors for posting.
    fn take(&mut self, max_frames: u64, on_frame: &mut dyn FnMut(&[u8])) -> Result<Taken> {
        // Paired with vhost's smp_wmb between the used entries and the index.
        let used_idx = self.used_idx().load(Ordering::Acquire);
        let mut taken = Taken::default();
        while self.next_used != used_idx {
            let offset =
                self.layout.used + 4 + self.slot(self.next_used) * size_of::<VringUsedElem>();
            // SAFETY: a used ring slot inside the mapping, published by the index above.
            let elem = unsafe { self.arena.at::<VringUsedElem>(offset).read_volatile() };
            let id = u16::try_from(elem.id)
                .ok()
                .filter(|id| *id < self.size)
                .ok_or_else(|| {
                    anyhow!(
                        "vhost-net returned descriptor {} of a {}-entry ring: the ring is corrupt",
                        elem.id,
                        self.size
                    )
                })?;
            if !self.with_device[usize::from(id)] {
                bail!(
                    "vhost-net returned descriptor {id}, which it did not own: the ring is corrupt"
                );
            }
            if elem.len > self.buffer_len {
                bail!(
                    "vhost-net wrote {} bytes into a {}-byte buffer: the ring is corrupt",
                    elem.len,
                    self.buffer_len
                );
            }
            let len = elem.len as usize;
            if self.frame_rest == 0 {
                if taken.frames >= max_frames {
                    break;
                }
                let buffer = self.buffer(id, len);
                if len < VNET_HDR_LEN {
                    bail!(
                        "vhost-net returned a {len}-byte buffer, shorter than the virtio-net header"
                    );
                }
                let num_buffers = u16::from_le_bytes([
                    buffer[NUM_BUFFERS_OFFSET],
                    buffer[NUM_BUFFERS_OFFSET + 1],
                ]);
                if num_buffers == 0 {
                    bail!("vhost-net wrote a virtio-net header with num_buffers 0");
                }
                on_frame(&buffer[VNET_HDR_LEN..]);
                taken.frames += 1;
                taken.bytes += (len - VNET_HDR_LEN) as u64;
                self.frame_rest = num_buffers - 1;
            } else {
                taken.bytes += len as u64;
                self.frame_rest -= 1;
            }
            self.with_device[usize::from(id)] = false;
            self.to_post.push_back(id);
            self.next_used = self.next_used.wrapping_add(1);
            taken.buffers += 1;
        }
        Ok(taken)
    }

    /// The first `len` bytes of buffer `id`.
    fn buffer(&self, id: u16, len: usize) -> &[u8] {
        debug_assert!(len <= self.buffer_len as usize);
        let offset = self.layout.buffers + usize::from(id) * self.buffer_len as usize;
        // SAFETY: buffer `id` lies inside the mapping (Layout) and `len` is at most its
        // length; the device returned it and cannot write it again until we post it,
        // which needs `&mut self` while this borrow of `self` lives.
        unsafe { std::slice::from_raw_parts(self.arena.at::<u8>(offset), len) }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[allow(
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        clippy::unnecessary_cast,
        reason = "ioctl_num_type is c_int on musl and c_ulong on glibc; the numbers fit 32 bits"
    )]
    fn num(request: ioctl_num_type) -> u32 {
        request as u32
    }

    /// Known values of the uapi ioctl numbers (x86-64, as strace prints them for QEMU).
    #[test]
    fn ioctl_numbers() {
        assert_eq!(num(VHOST_GET_FEATURES), 0x8008_af00);
        assert_eq!(num(VHOST_SET_FEATURES), 0x4008_af00);
        assert_eq!(num(VHOST_SET_OWNER), 0xaf01);
        assert_eq!(num(VHOST_SET_MEM_TABLE), 0x4008_af03);
        assert_eq!(num(VHOST_SET_VRING_NUM), 0x4008_af10);
        assert_eq!(num(VHOST_SET_VRING_ADDR), 0x4028_af11);
        assert_eq!(num(VHOST_SET_VRING_BASE), 0x4008_af12);
        assert_eq!(num(VHOST_SET_VRING_KICK), 0x4008_af20);
        assert_eq!(num(VHOST_SET_VRING_CALL), 0x4008_af21);
        assert_eq!(num(VHOST_SET_VRING_ERR), 0x4008_af22);
        assert_eq!(num(VHOST_NET_SET_BACKEND), 0x4008_af30);
    }

    #[test]
    fn layout_is_aligned_and_disjoint() {
        let l = Layout::new(256, 2048).unwrap();
        assert_eq!(l.avail, 256 * 16);
        assert_eq!(l.used % PAGE, 0);
        assert!(l.used >= l.avail + 6 + 2 * 256);
        assert!(l.buffers >= l.used + 6 + 8 * 256);
        assert_eq!(l.buffers % PAGE, 0);
        assert_eq!(l.len % PAGE, 0);
        assert!(l.len >= l.buffers + 256 * 2048);
        assert!(Layout::new(32_768, 65_536).is_ok());
    }

    #[test]
    fn layout_rejects_bad_shapes() {
        for (size, len) in [(0, 2048), (1, 2048), (300, 2048), (256, 10), (256, 70_000)] {
            assert!(Layout::new(size, len).is_err(), "{size} x {len}");
        }
    }

    #[test]
    fn features_follow_the_header_source() {
        let all = VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF | VHOST_NET_F_VIRTIO_NET_HDR;
        assert_eq!(choose_features(all, HeaderSource::Vhost).unwrap(), all);
        assert_eq!(
            choose_features(all, HeaderSource::Tap).unwrap(),
            VIRTIO_F_VERSION_1 | VIRTIO_NET_F_MRG_RXBUF
        );
        let err = choose_features(VIRTIO_F_VERSION_1, HeaderSource::Vhost).unwrap_err();
        assert!(err.to_string().contains("VIRTIO_NET_F_MRG_RXBUF"), "{err}");
        assert!(
            err.to_string().contains("VHOST_NET_F_VIRTIO_NET_HDR"),
            "{err}"
        );
    }

    /// A stand-in for vhost-net's receive side: fills posted buffers with frames whose
    /// payload is a sequence number, `per_frame` buffers per frame.
    struct FakeDevice {
        next_avail: u16,
        next_used: u16,
        seq: u64,
    }

    impl FakeDevice {
        fn fill(&mut self, ring: &RxRing, frames: usize, per_frame: u16) -> usize {
            let avail = ring.avail_idx().load(Ordering::Acquire);
            let mut done = 0;
            while done < frames && avail.wrapping_sub(self.next_avail) >= per_frame {
                for k in 0..per_frame {
                    let slot = ring.slot(self.next_avail);
                    let id = unsafe {
                        ring.arena
                            .at::<u16>(ring.layout.avail + 4 + 2 * slot)
                            .read_volatile()
                    };
                    self.next_avail = self.next_avail.wrapping_add(1);
                    let buf = ring.layout.buffers + usize::from(id) * ring.buffer_len as usize;
                    let len: u32 = if k == 0 {
                        let hdr = ring.arena.at::<u8>(buf);
                        unsafe {
                            std::ptr::write_bytes(hdr, 0, VNET_HDR_LEN);
                            hdr.add(NUM_BUFFERS_OFFSET)
                                .cast::<[u8; 2]>()
                                .write_unaligned(per_frame.to_le_bytes());
                            hdr.add(VNET_HDR_LEN)
                                .cast::<[u8; 8]>()
                                .write_unaligned(self.seq.to_be_bytes());
                        }
                        u32::try_from(VNET_HDR_LEN + 60).unwrap()
                    } else {
                        100
                    };
                    let used = ring.layout.used + 4 + ring.slot(self.next_used) * 8;
                    unsafe {
                        ring.arena
                            .at::<VringUsedElem>(used)
                            .write_volatile(VringUsedElem { id: id.into(), len });
                    }
                    self.next_used = self.next_used.wrapping_add(1);
                }
                self.seq += 1;
                done += 1;
            }
            ring.used_idx().store(self.next_used, Ordering::Release);
            done
        }
    }

    fn seq_of(frame: &[u8]) -> u64 {
        u64::from_be_bytes(frame[..8].try_into().unwrap())
    }

    #[test]
    fn recycles_across_index_wraparound() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 0,
        };
        assert_eq!(ring.post(usize::MAX), 8);
        let mut seen = Vec::new();
        let mut total = Taken::default();
        // 70,000 frames: both 16-bit indexes wrap.
        while total.frames < 70_000 {
            let filled = dev.fill(&ring, 5, 1);
            assert!(filled > 0);
            let t = ring.take(u64::MAX, &mut |f| seen.push(seq_of(f))).unwrap();
            total.frames += t.frames;
            total.bytes += t.bytes;
            ring.post(usize::MAX);
        }
        assert_eq!(total.frames, 70_000);
        assert_eq!(total.bytes, 70_000 * 60);
        assert!(seen.iter().copied().eq(0..70_000));
    }

    #[test]
    fn mergeable_frames_count_once() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 7,
        };
        ring.post(usize::MAX);
        assert_eq!(dev.fill(&ring, 2, 3), 2);
        let mut seen = Vec::new();
        let t = ring.take(u64::MAX, &mut |f| seen.push(seq_of(f))).unwrap();
        assert_eq!(
            t,
            Taken {
                frames: 2,
                bytes: 2 * (60 + 200),
                buffers: 6
            }
        );
        assert_eq!(seen, [7, 8]);
        assert_eq!(ring.waiting(), 6);
    }

    #[test]
    fn max_frames_leaves_the_rest_for_later() {
        let mut ring = RxRing::new(8, 256).unwrap();
        let mut dev = FakeDevice {
            next_avail: 0,
            next_used: 0,
            seq: 0,
        };
        ring.post(usize::MAX);
        dev.fill(&ring, 6, 1);
        let t = ring.take(4, &mut |_| {}).unwrap();
        assert_eq!(t.frames, 4);
        let t = ring.take(u64::MAX, &mut |_| {}).unwrap();
        assert_eq!(t.frames, 2);
    }

    #[test]
    fn rejects_corrupt_used_entries() {
        let mut ring = RxRing::new(8, 256).unwrap();
        ring.post(usize::MAX);
        let bad = |ring: &mut RxRing, elem: VringUsedElem| {
            let used = ring.layout.used + 4 + ring.slot(ring.next_used) * 8;
            unsafe { ring.arena.at::<VringUsedElem>(used).write_volatile(elem) };
            ring.used_idx()
                .store(ring.next_used.wrapping_add(1), Ordering::Release);
            ring.take(u64::MAX, &mut |_| {}).unwrap_err().to_string()
        };
        assert!(bad(&mut ring, VringUsedElem { id: 8, len: 20 }).contains("descriptor 8"));
        assert!(bad(&mut ring, VringUsedElem { id: 1, len: 300 }).contains("300 bytes"));
        // Descriptor 2 after the ring gave it back and before it was posted again.
        ring.with_device[2] = false;
        assert!(bad(&mut ring, VringUsedElem { id: 2, len: 20 }).contains("did not own"));
    }

    #[test]
    fn attach_refuses_a_non_tap_fd() {
        let file = std::fs::File::open("/dev/null").unwrap();
        let err = VhostReader::attach(file.as_fd(), &VhostConfig::default())
            .err()
            .unwrap();
        assert!(
            err.to_string().contains("not an attached tun/tap queue"),
            "{err}"
        );
    }
}
