//! The vhost and virtio uapi this reader uses: ioctl numbers, feature bits, ring flags
//! and structs (`include/uapi/linux/vhost.h`, `vhost_types.h`, `virtio_ring.h`), and the
//! system calls on the device and its eventfds.

use std::os::fd::{AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use anyhow::{Context as _, Result, anyhow};
use nix::errno::Errno;
use nix::sys::ioctl::ioctl_num_type;

pub(super) const VHOST_NET_PATH: &str = "/dev/vhost-net";

// ioctls from include/uapi/linux/vhost.h (type VHOST_VIRTIO = 0xAF).
pub(super) const VHOST_VIRTIO: u8 = 0xAF;
pub(super) const VHOST_GET_FEATURES: ioctl_num_type =
    nix::request_code_read!(VHOST_VIRTIO, 0x00, size_of::<u64>());
pub(super) const VHOST_SET_FEATURES: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x00, size_of::<u64>());
pub(super) const VHOST_SET_OWNER: ioctl_num_type = nix::request_code_none!(VHOST_VIRTIO, 0x01);
pub(super) const VHOST_SET_MEM_TABLE: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x03, size_of::<VhostMemoryHeader>());
pub(super) const VHOST_SET_VRING_NUM: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x10, size_of::<VhostVringState>());
pub(super) const VHOST_SET_VRING_ADDR: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x11, size_of::<VhostVringAddr>());
pub(super) const VHOST_SET_VRING_BASE: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x12, size_of::<VhostVringState>());
pub(super) const VHOST_SET_VRING_KICK: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x20, size_of::<VhostVringFile>());
pub(super) const VHOST_SET_VRING_CALL: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x21, size_of::<VhostVringFile>());
pub(super) const VHOST_SET_VRING_ERR: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x22, size_of::<VhostVringFile>());
pub(super) const VHOST_NET_SET_BACKEND: ioctl_num_type =
    nix::request_code_write!(VHOST_VIRTIO, 0x30, size_of::<VhostVringFile>());

// Feature bits: include/uapi/linux/virtio_config.h, virtio_net.h, vhost.h.
pub(super) const VIRTIO_NET_F_MRG_RXBUF: u64 = 1 << 15;
pub(super) const VHOST_NET_F_VIRTIO_NET_HDR: u64 = 1 << 27;
pub(super) const VIRTIO_F_VERSION_1: u64 = 1 << 32;

// include/uapi/linux/virtio_ring.h
pub(super) const VRING_DESC_F_WRITE: u16 = 2;
pub(super) const VRING_USED_F_NO_NOTIFY: u16 = 1;
pub(super) const VRING_AVAIL_F_NO_INTERRUPT: u16 = 1;

/// `VHOST_NET_VQ_RX` in `drivers/vhost/net.c`: the queue vhost-net fills from the tap.
pub(super) const RX_QUEUE: u32 = 0;
/// `sizeof(struct virtio_net_hdr_mrg_rxbuf)`: the header in front of every frame.
pub(super) const VNET_HDR_LEN: usize = 12;
/// `offsetof(struct virtio_net_hdr_mrg_rxbuf, num_buffers)`.
pub(super) const NUM_BUFFERS_OFFSET: usize = 10;
/// `VHOST_PAGE_SIZE`: memory regions must be aligned to it.
pub(super) const PAGE: usize = 4096;
/// The largest ring vhost accepts: a power of two up to 0xffff (`vhost_vring_set_num`).
pub(super) const MAX_QUEUE_SIZE: u16 = 32_768;

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VhostVringState {
    pub(super) index: u32,
    pub(super) num: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VhostVringFile {
    pub(super) index: u32,
    /// -1 unbinds.
    pub(super) fd: i32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VhostVringAddr {
    pub(super) index: u32,
    pub(super) flags: u32,
    pub(super) desc_user_addr: u64,
    pub(super) used_user_addr: u64,
    pub(super) avail_user_addr: u64,
    pub(super) log_guest_addr: u64,
}

/// `struct vhost_memory` without its flexible array; the ioctl number encodes this size.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VhostMemoryHeader {
    pub(super) nregions: u32,
    pub(super) padding: u32,
}

#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VhostMemoryRegion {
    pub(super) guest_phys_addr: u64,
    pub(super) memory_size: u64,
    pub(super) userspace_addr: u64,
    pub(super) flags_padding: u64,
}

/// `struct vhost_memory` with exactly one region.
#[repr(C)]
pub(super) struct VhostMemoryOne {
    pub(super) header: VhostMemoryHeader,
    pub(super) region: VhostMemoryRegion,
}

/// `struct vring_desc`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VringDesc {
    pub(super) addr: u64,
    pub(super) len: u32,
    pub(super) flags: u16,
    pub(super) next: u16,
}

/// `struct vring_used_elem`.
#[repr(C)]
#[derive(Clone, Copy)]
pub(super) struct VringUsedElem {
    pub(super) id: u32,
    pub(super) len: u32,
}

pub(super) fn open_vhost_net() -> Result<OwnedFd> {
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
pub(super) fn ioctl<T>(
    fd: BorrowedFd<'_>,
    name: &str,
    request: ioctl_num_type,
    arg: *const T,
) -> Result<()> {
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

pub(super) fn eventfd(role: &str) -> Result<OwnedFd> {
    // SAFETY: plain eventfd(2) call.
    let fd = unsafe { libc::eventfd(0, libc::EFD_CLOEXEC | libc::EFD_NONBLOCK) };
    if fd < 0 {
        return Err(Errno::last()).with_context(|| format!("cannot create the {role} eventfd"));
    }
    // SAFETY: fd is a fresh descriptor we own.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

pub(super) fn drain_eventfd(fd: BorrowedFd<'_>) -> Result<()> {
    let mut value: u64 = 0;
    // SAFETY: reads 8 bytes into a live u64 from an eventfd we own.
    let rc = unsafe { libc::read(fd.as_raw_fd(), (&raw mut value).cast(), size_of::<u64>()) };
    if rc < 0 && !matches!(Errno::last(), Errno::EAGAIN | Errno::EINTR) {
        return Err(Errno::last()).context("reading the vhost-net call eventfd failed");
    }
    Ok(())
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
}
