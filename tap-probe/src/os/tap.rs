//! tun/tap devices created through `/dev/net/tun`, one open file per queue.
//!
//! The devices are not persistent: the kernel deletes one when its last queue file is
//! closed (`tun_detach` in `drivers/net/tun.c`), so dropping a [`Tap`] removes it.

use std::ffi::CStr;
use std::fs::OpenOptions;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, OwnedFd};
use std::os::unix::fs::OpenOptionsExt as _;

use anyhow::{Context as _, Result, anyhow, bail};
use nix::fcntl::{FcntlArg, OFlag, fcntl};

const TUN_PATH: &str = "/dev/net/tun";

/// `IFF_BACKPRESSURE` (`include/uapi/linux/if_tun.h`, Linux 7.3): the tap stops its queue
/// when its ring fills, so a qdisc holds packets instead of the driver dropping them. Part of
/// the ioctl ABI, like the other `IFF_*` flags; the kernel lists it in `TUNGETFEATURES`.
pub(crate) const IFF_BACKPRESSURE: libc::c_int = 0x0080;

/// `TUNGETFEATURES`: `_IOR('T', 207, unsigned int)` (`include/uapi/linux/if_tun.h`).
const TUNGETFEATURES: libc::c_ulong = nix::request_code_read!(b'T', 207, size_of::<u32>());

/// How to create the device.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub struct TapOptions {
    /// `IFF_MULTI_QUEUE`: one fd per queue. The kernel then allocates 256 transmit queues
    /// (`MAX_TAP_QUEUES`) and uses as many as there are fds attached.
    pub multi_queue: bool,
    /// Queues (fds) to open; must be 1 unless `multi_queue`.
    pub queues: u16,
    /// `IFF_TUN` (layer 3, no Ethernet header) instead of `IFF_TAP`.
    pub tun: bool,
    /// `IFF_BACKPRESSURE`: stop the queue when the ring fills instead of dropping (Linux
    /// 7.3); refused with an error where the kernel lacks it (see [`check_backpressure`]).
    pub backpressure: bool,
}

impl Default for TapOptions {
    fn default() -> Self {
        Self {
            multi_queue: false,
            queues: 1,
            tun: false,
            backpressure: false,
        }
    }
}

/// The `IFF_*` flags this kernel's tun accepts (`TUNGETFEATURES`).
///
/// # Errors
/// When `/dev/net/tun` cannot be opened or the ioctl fails.
pub(crate) fn features() -> Result<libc::c_int> {
    let fd = open_tun()?;
    let mut features: libc::c_uint = 0;
    // SAFETY: TUNGETFEATURES writes one unsigned int; `features` is one and outlives the
    // call; fd is open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), TUNGETFEATURES, &raw mut features) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNGETFEATURES on /dev/net/tun");
    }
    libc::c_int::try_from(features).context("TUNGETFEATURES returned flags out of range")
}

/// Whether this kernel's tun has `IFF_BACKPRESSURE`.
///
/// # Errors
/// When it does not, saying so; when asking fails. TUNSETIFF itself would not tell: it masks
/// off flags it does not know (`tun_set_iff`: `flags & TUN_FEATURES`), so an older kernel
/// would silently give a tap that tail-drops.
pub(crate) fn check_backpressure() -> Result<()> {
    if features()? & IFF_BACKPRESSURE == 0 {
        bail!(
            "this kernel's tun ({}) has no IFF_BACKPRESSURE (TUNGETFEATURES does not list \
             0x0080; it came with Linux 7.3): its taps tail-drop when the ring is full. Run \
             on a kernel with it, e.g. `tap-probe vm --kernel debian-7.3 -- ...`",
            crate::kernel::release()
        );
    }
    Ok(())
}

/// A tun/tap device and the fds of its queues. Reading a queue fd takes packets the host
/// transmitted to the device (what a VM's virtio-net backend does).
#[derive(Debug)]
pub struct Tap {
    name: String,
    ifindex: u32,
    queues: Vec<OwnedFd>,
}

impl Tap {
    /// Creates the device in the calling thread's network namespace (run this inside
    /// [`crate::os::netns::run_in`] to create it elsewhere). `name` may be a pattern such as
    /// `tap%d`; `Tap::name` gives the name the kernel chose.
    ///
    /// # Errors
    /// When `/dev/net/tun` is missing, the name is taken by a device of another kind, or
    /// the caller lacks `CAP_NET_ADMIN`.
    pub fn create(name: &str, opts: TapOptions) -> Result<Self> {
        if opts.queues == 0 {
            bail!("a tap needs at least one queue");
        }
        if opts.queues > 1 && !opts.multi_queue {
            bail!("{} queues requested without multi_queue", opts.queues);
        }
        if name.len() >= libc::IFNAMSIZ || name.is_empty() || name.contains('\0') {
            bail!(
                "invalid interface name {name:?}: 1 to {} bytes",
                libc::IFNAMSIZ - 1
            );
        }
        let mut flags = libc::IFF_NO_PI
            | if opts.tun {
                libc::IFF_TUN
            } else {
                libc::IFF_TAP
            };
        if opts.multi_queue {
            flags |= libc::IFF_MULTI_QUEUE;
        }
        if opts.backpressure {
            check_backpressure()?;
            flags |= IFF_BACKPRESSURE;
        }
        let mut actual = name.to_owned();
        let mut queues = Vec::with_capacity(usize::from(opts.queues));
        for queue in 0..opts.queues {
            // The first TUNSETIFF creates the device; later ones attach further queues to
            // it by name (`tun_set_iff`), so they must use the name the kernel picked.
            let (fd, got) = attach(&actual, flags)
                .with_context(|| format!("cannot open queue {queue} of tap {actual}"))?;
            actual = got;
            queues.push(fd);
        }
        let ifindex = nix::net::if_::if_nametoindex(actual.as_str())
            .with_context(|| format!("tap {actual} was created but its ifindex cannot be read"))?;
        Ok(Self {
            name: actual,
            ifindex,
            queues,
        })
    }

    #[must_use]
    pub(crate) fn name(&self) -> &str {
        &self.name
    }

    /// The ifindex in the namespace the device was created in.
    #[must_use]
    pub fn ifindex(&self) -> u32 {
        self.ifindex
    }

    /// The fd of queue `i`.
    ///
    /// # Panics
    /// When `i` is not a queue of this tap.
    #[must_use]
    pub fn queue_fd(&self, i: usize) -> BorrowedFd<'_> {
        self.queues[i].as_fd()
    }

    /// A duplicate of queue `i`'s fd, for a reader thread that must own it. The queue
    /// stays attached (and the device alive) until every duplicate is closed too.
    ///
    /// # Errors
    /// When `i` is out of range or `dup` fails.
    pub(crate) fn clone_queue_fd(&self, i: usize) -> Result<OwnedFd> {
        let fd = self
            .queues
            .get(i)
            .ok_or_else(|| anyhow!("tap {} has no queue {i}", self.name))?;
        fd.try_clone()
            .with_context(|| format!("cannot duplicate the fd of queue {i} of tap {}", self.name))
    }

    /// Sets or clears `O_NONBLOCK` on every queue fd.
    ///
    /// # Errors
    /// When `fcntl` fails.
    pub fn set_nonblocking(&self, nonblocking: bool) -> Result<()> {
        for fd in &self.queues {
            set_nonblocking(fd.as_fd(), nonblocking)?;
        }
        Ok(())
    }
}

/// Sets or clears `O_NONBLOCK` on `fd`.
///
/// # Errors
/// When `fcntl` fails.
pub(crate) fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> Result<()> {
    let current = fcntl(fd, FcntlArg::F_GETFL).context("fcntl(F_GETFL) failed")?;
    let mut flags = OFlag::from_bits_truncate(current);
    flags.set(OFlag::O_NONBLOCK, nonblocking);
    fcntl(fd, FcntlArg::F_SETFL(flags)).context("fcntl(F_SETFL) failed")?;
    Ok(())
}

/// `/dev/net/tun`, opened.
fn open_tun() -> Result<OwnedFd> {
    let file = OpenOptions::new()
        .read(true)
        .write(true)
        .custom_flags(libc::O_CLOEXEC)
        .open(TUN_PATH)
        .map_err(|err| match err.raw_os_error() {
            Some(libc::ENOENT | libc::ENODEV) => {
                anyhow!("cannot open {TUN_PATH}: {err} (load the tun module: `modprobe tun`)")
            }
            _ => anyhow!("cannot open {TUN_PATH}: {err}"),
        })?;
    Ok(OwnedFd::from(file))
}

/// Opens `/dev/net/tun` and binds it to device `name` with `flags`; returns the fd and the
/// device name the kernel reported back.
fn attach(name: &str, flags: libc::c_int) -> Result<(OwnedFd, String)> {
    let fd = open_tun()?;

    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    for (dst, src) in ifr.ifr_name.iter_mut().zip(name.bytes()) {
        *dst = src.cast_signed();
    }
    ifr.ifr_ifru.ifru_flags =
        libc::c_short::try_from(flags).map_err(|_| anyhow!("tun flags {flags:#x} overflow"))?;
    // SAFETY: TUNSETIFF reads and writes a `struct ifreq`, which `ifr` is; fd is open.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNSETIFF, &raw mut ifr) };
    if rc < 0 {
        let err = std::io::Error::last_os_error();
        return Err(match err.raw_os_error() {
            Some(libc::EPERM) => {
                anyhow!("TUNSETIFF {name}: {err} (needs CAP_NET_ADMIN: run as root)")
            }
            Some(libc::EBUSY) => anyhow!(
                "TUNSETIFF {name}: {err} (a device with that name exists or all its queues are taken)"
            ),
            Some(libc::EINVAL) => anyhow!(
                "TUNSETIFF {name}: {err} (a device with that name exists with other flags, e.g. tun vs tap or single vs multi queue)"
            ),
            _ => anyhow!("TUNSETIFF {name}: {err}"),
        });
    }
    // SAFETY: the kernel NUL-terminates ifr_name (it copies at most IFNAMSIZ - 1 bytes).
    let got = unsafe { CStr::from_ptr(ifr.ifr_name.as_ptr()) }
        .to_string_lossy()
        .into_owned();
    Ok((fd, got))
}
