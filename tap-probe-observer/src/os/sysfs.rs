//! Device attributes under `/sys/class/net` of any network namespace.
//!
//! sysfs shows the network devices of the namespace that mounted it, so `/sys` of this
//! process shows only its own. A private sysfs per namespace is made with the mount API
//! instead (`fsopen`/`fsconfig`/`fsmount`, Linux 5.2): a thread that joined the namespace
//! creates a sysfs superblock tagged with it and gets a detached mount back as a file
//! descriptor. Nothing is mounted anywhere, so nothing is left behind; closing the
//! descriptor releases the mount (and the reference it holds on the namespace).

use std::ffi::CString;
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::Path;

use anyhow::{Context as _, Result, bail};

/// `FSOPEN_CLOEXEC`, `FSCONFIG_CMD_CREATE`, `FSMOUNT_CLOEXEC` and `MOUNT_ATTR_RDONLY` from
/// `include/uapi/linux/mount.h`.
const FSOPEN_CLOEXEC: libc::c_uint = 1;
const FSCONFIG_CMD_CREATE: libc::c_uint = 6;
const FSMOUNT_CLOEXEC: libc::c_uint = 1;
const MOUNT_ATTR_RDONLY: libc::c_uint = 1;

/// A read-only sysfs of one network namespace, as a detached mount.
#[derive(Debug)]
pub struct Sysfs {
    root: OwnedFd,
}

impl Sysfs {
    /// The sysfs of the namespace at `ns_path` (`/run/netns/NAME`, `/proc/PID/ns/net`).
    ///
    /// # Errors
    /// When the namespace cannot be joined or the kernel refuses the mount (it needs
    /// `CAP_SYS_ADMIN` over the namespace's owner).
    pub(crate) fn of_netns(ns_path: &Path) -> Result<Self> {
        let root = crate::os::netns::run_in(ns_path, mount_sysfs)
            .with_context(|| format!("a sysfs of network namespace {}", ns_path.display()))?;
        Ok(Self { root })
    }

    /// The text of `class/net/DEVICE/ATTRIBUTE`, trimmed.
    ///
    /// # Errors
    /// When the device or the attribute does not exist (the device vanished, or it is not
    /// of the kind that has the attribute).
    pub(crate) fn net_attribute(&self, device: &str, attribute: &str) -> Result<String> {
        if device.contains('/') || attribute.contains('/') || device.starts_with('.') {
            bail!("invalid device or attribute name {device:?}/{attribute:?}");
        }
        let path = CString::new(format!("class/net/{device}/{attribute}"))?;
        // SAFETY: openat with a NUL-terminated relative path below our mount's root.
        let fd = unsafe {
            libc::openat(
                self.root.as_raw_fd(),
                path.as_ptr(),
                libc::O_RDONLY | libc::O_CLOEXEC,
            )
        };
        if fd < 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("opening /sys/class/net/{device}/{attribute}"));
        }
        // SAFETY: a fresh fd we own.
        let file = std::fs::File::from(unsafe { OwnedFd::from_raw_fd(fd) });
        let text = std::io::read_to_string(file)
            .with_context(|| format!("reading /sys/class/net/{device}/{attribute}"))?;
        Ok(text.trim().to_owned())
    }
}

/// A sysfs mount of the calling thread's network namespace, detached.
fn mount_sysfs() -> Result<OwnedFd> {
    let fstype = CString::new("sysfs")?;
    // SAFETY: plain syscalls; each returned fd is owned right away.
    let fs = unsafe { libc::syscall(libc::SYS_fsopen, fstype.as_ptr(), FSOPEN_CLOEXEC) };
    let fs = owned(fs).context("fsopen(sysfs) (Linux 5.2+, CAP_SYS_ADMIN)")?;
    // SAFETY: FSCONFIG_CMD_CREATE takes no key or value.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_fsconfig,
            fs.as_raw_fd(),
            FSCONFIG_CMD_CREATE,
            std::ptr::null::<libc::c_char>(),
            std::ptr::null::<libc::c_void>(),
            0,
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error()).context("fsconfig(sysfs, create)");
    }
    // SAFETY: fsmount of a created filesystem context.
    let mnt = unsafe {
        libc::syscall(
            libc::SYS_fsmount,
            fs.as_raw_fd(),
            FSMOUNT_CLOEXEC,
            MOUNT_ATTR_RDONLY,
        )
    };
    owned(mnt).context("fsmount(sysfs)")
}

fn owned(rc: libc::c_long) -> Result<OwnedFd> {
    let fd = libc::c_int::try_from(rc).unwrap_or(-1);
    if fd < 0 {
        return Err(std::io::Error::last_os_error().into());
    }
    // SAFETY: a fresh fd from the kernel.
    Ok(unsafe { OwnedFd::from_raw_fd(fd) })
}

#[cfg(all(test, feature = "privileged-tests"))]
mod privileged_tests {
    use super::*;
    use crate::os::netns::{NamedNetns, run_in};
    use crate::os::tap::{Tap, TapOptions};

    #[test]
    fn reads_tun_flags_of_a_tap_in_another_namespace() {
        if !tap_probe_verdict::root() {
            return;
        }
        let ns = NamedNetns::create(&format!("tp-test-sysfs-{}", std::process::id())).unwrap();
        let tap = run_in(ns.path(), || Tap::create("tps-tap0", TapOptions::default())).unwrap();
        let sysfs = Sysfs::of_netns(ns.path()).unwrap();
        let flags = sysfs.net_attribute("tps-tap0", "tun_flags").unwrap();
        let expected = crate::os::tap::tun_flags_of(tap.queue_fd(0)).unwrap();
        assert_eq!(flags, format!("{expected:#x}"));
        // The host's own sysfs does not show it.
        assert!(!Path::new("/sys/class/net/tps-tap0").exists());
        assert!(sysfs.net_attribute("no-such-dev", "tun_flags").is_err());
        assert!(sysfs.net_attribute("../x", "tun_flags").is_err());
        drop(tap);
        drop(sysfs);
        drop(ns);
    }
}
