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
/// when its ring fills instead of dropping, when a qdisc sits in front of it. A kernel
/// without it masks the bit off in TUNSETIFF without an error (`tun_set_iff` keeps only
/// `TUN_FEATURES`), so its support is read from TUNGETFEATURES, never assumed.
pub const IFF_BACKPRESSURE: u32 = 0x0080;

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
    /// [`IFF_BACKPRESSURE`]: refused with an error on kernels that do not list it.
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

/// The `IFF_*` flags this kernel's tun driver accepts in TUNSETIFF (TUNGETFEATURES on
/// `/dev/net/tun`).
///
/// # Errors
/// When `/dev/net/tun` cannot be opened (tun not loaded) or the ioctl fails.
pub fn tun_features() -> Result<u32> {
    let fd = open_tun()?;
    let mut features: libc::c_uint = 0;
    // SAFETY: TUNGETFEATURES writes one unsigned int; fd is an open /dev/net/tun.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETFEATURES, &raw mut features) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNGETFEATURES on /dev/net/tun");
    }
    Ok(features)
}

/// Refuses [`IFF_BACKPRESSURE`] on a kernel that would silently ignore it.
///
/// # Errors
/// When this kernel's tun does not list the flag, naming the kernel.
pub fn require_backpressure() -> Result<()> {
    let features = tun_features()?;
    if features & IFF_BACKPRESSURE == 0 {
        let release = std::fs::read_to_string("/proc/sys/kernel/osrelease").map_or_else(
            |_| "this kernel".to_owned(),
            |r| format!("Linux {}", r.trim()),
        );
        bail!(
            "{release} does not support IFF_BACKPRESSURE: TUNGETFEATURES lists {features:#06x}, \
             without {IFF_BACKPRESSURE:#06x} (the opt-in arrived with Linux 7.3; older kernels \
             ignore the flag silently). Leave out --backpressure, or run on a kernel with it \
             (e.g. tap-probe vm --kernel debian-7.3 -- ...)"
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
    /// The `IFF_*` flags it was created with, for the queues attached later.
    flags: libc::c_int,
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
            require_backpressure()?;
            flags |= libc::c_int::try_from(IFF_BACKPRESSURE).unwrap_or_default();
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
        if opts.backpressure {
            let got = tun_flags_of(queues[0].as_fd())?;
            if got & IFF_BACKPRESSURE == 0 {
                bail!(
                    "tap {actual} was created without IFF_BACKPRESSURE although the kernel lists \
                     it (TUNGETIFF flags {got:#06x}): an existing device with other flags?"
                );
            }
        }
        let ifindex = nix::net::if_::if_nametoindex(actual.as_str())
            .with_context(|| format!("tap {actual} was created but its ifindex cannot be read"))?;
        Ok(Self {
            name: actual,
            ifindex,
            queues,
            flags,
        })
    }

    /// Attaches one more queue to a multi-queue tap, as a VM's holder does when it opens
    /// another fd on it: the tap's queues in use grow by one. Run in the tap's namespace.
    /// The new queue's index.
    ///
    /// # Errors
    /// When the tap is not multi-queue, or the kernel refuses.
    pub fn attach_queue(&mut self) -> Result<usize> {
        if self.flags & libc::IFF_MULTI_QUEUE == 0 {
            bail!("tap {} is not multi-queue: it has one queue", self.name);
        }
        let (fd, _) = attach(&self.name, self.flags)
            .with_context(|| format!("cannot attach another queue to tap {}", self.name))?;
        self.queues.push(fd);
        Ok(self.queues.len() - 1)
    }

    #[must_use]
    pub fn name(&self) -> &str {
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
    pub fn clone_queue_fd(&self, i: usize) -> Result<OwnedFd> {
        let fd = self
            .queues
            .get(i)
            .ok_or_else(|| anyhow!("tap {} has no queue {i}", self.name))?;
        fd.try_clone()
            .with_context(|| format!("cannot duplicate the fd of queue {i} of tap {}", self.name))
    }

    /// The device's flags as the kernel keeps them (`tun_flags`; TUNGETIFF).
    ///
    /// # Errors
    /// When the ioctl fails.
    pub fn tun_flags(&self) -> Result<u32> {
        tun_flags_of(self.queue_fd(0))
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
pub fn set_nonblocking(fd: BorrowedFd<'_>, nonblocking: bool) -> Result<()> {
    let current = fcntl(fd, FcntlArg::F_GETFL).context("fcntl(F_GETFL) failed")?;
    let mut flags = OFlag::from_bits_truncate(current);
    flags.set(OFlag::O_NONBLOCK, nonblocking);
    fcntl(fd, FcntlArg::F_SETFL(flags)).context("fcntl(F_SETFL) failed")?;
    Ok(())
}

/// The device's flags as the kernel keeps them (TUNGETIFF on a queue fd; what
/// `/sys/class/net/DEV/tun_flags` shows).
///
/// # Errors
/// When the ioctl fails.
pub(crate) fn tun_flags_of(fd: BorrowedFd<'_>) -> Result<u32> {
    // SAFETY: ifreq is plain old data; all-zero is a valid value.
    let mut ifr: libc::ifreq = unsafe { std::mem::zeroed() };
    // SAFETY: TUNGETIFF fills a `struct ifreq`; fd is an attached tun/tap queue.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TUNGETIFF, &raw mut ifr) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("TUNGETIFF");
    }
    // SAFETY: TUNGETIFF sets ifru_flags (`tun_get_iff`).
    let flags = unsafe { ifr.ifr_ifru.ifru_flags };
    Ok(u32::from(flags.cast_unsigned()))
}

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
