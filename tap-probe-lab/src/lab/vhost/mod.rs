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
//! anonymous mapping (the [`Arena`](vring::Arena)) holding the split virtqueue and the buffers, then for
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

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::sync::atomic::{AtomicBool, Ordering, fence};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, bail};

use crate::lab::pacer::{Pacer, deadline_after};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};

mod uapi;
mod vring;

use uapi::VNET_HDR_LEN;
use uapi::{
    RX_QUEUE, VHOST_GET_FEATURES, VHOST_NET_F_VIRTIO_NET_HDR, VHOST_NET_SET_BACKEND,
    VHOST_SET_FEATURES, VHOST_SET_MEM_TABLE, VHOST_SET_OWNER, VHOST_SET_VRING_ADDR,
    VHOST_SET_VRING_BASE, VHOST_SET_VRING_CALL, VHOST_SET_VRING_ERR, VHOST_SET_VRING_KICK,
    VHOST_SET_VRING_NUM, VIRTIO_F_VERSION_1, VIRTIO_NET_F_MRG_RXBUF, VhostMemoryHeader,
    VhostMemoryOne, VhostMemoryRegion, VhostVringAddr, VhostVringFile, VhostVringState,
    drain_eventfd, eventfd, ioctl, open_vhost_net,
};
use vring::{RxRing, Taken};

/// How long a wait lasts at most before the stop flag and deadlines are checked again.
const POLL_SLICE: Duration = Duration::from_millis(20);

// uapi structs, include/uapi/linux/vhost_types.h.
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
pub struct Counters {
    /// Frames vhost-net delivered (a frame is one or more used buffers).
    pub frames: u64,
    /// Their bytes, virtio-net headers excluded: what tun adds to `tx_bytes`.
    pub bytes: u64,
    /// Used ring entries read.
    pub buffers: u64,
    /// Buffers given back to vhost-net after use.
    pub(crate) recycled: u64,
    /// Kicks sent: one at attach, then one whenever buffers were re-posted after
    /// vhost-net had run out of them and asked for a kick.
    pub(crate) kicks: u64,
    /// Sleeps on the call eventfd.
    pub waits: u64,
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
        let polled = nix::poll::poll(&mut fds, tap_probe_observer::os::clock::poll_timeout(slice));
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

#[cfg(test)]
mod tests {
    use super::*;

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
