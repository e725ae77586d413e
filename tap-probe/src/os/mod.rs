//! The operating system, through narrow doors: rtnetlink, network namespaces, tun/tap
//! devices, `/proc`, sysfs, signals, the standard outputs and the clock.

pub(crate) mod clock;
pub(crate) mod netlink;
pub(crate) mod netns;
pub(crate) mod procfs;
pub(crate) mod signals;
pub(crate) mod stdio;
pub(crate) mod sysfs;
pub(crate) mod tap;
