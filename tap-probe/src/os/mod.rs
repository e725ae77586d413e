//! The operating system, through narrow doors: rtnetlink, network namespaces, tun/tap
//! devices, `/proc` (and what a process's command line says), sysfs, signals, the standard
//! outputs and the clock.

pub(crate) mod clock;
pub(crate) mod cmdline;
pub(crate) mod netlink;
pub(crate) mod netns;
pub(crate) mod procfs;
pub(crate) mod signals;
pub(crate) mod stdio;
pub(crate) mod sysfs;
pub(crate) mod tap;
