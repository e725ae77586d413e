//! The operating system, through narrow doors: rtnetlink, network namespaces, tun/tap
//! devices, `/proc` (and what a process's command line says), sysfs, signals, the standard
//! outputs, the files named on the command line and the clock.

pub mod clock;
pub mod cmdline;
pub mod files;
pub mod netlink;
pub mod netns;
pub mod procfs;
pub mod signals;
pub mod stdio;
pub mod sysfs;
pub mod tap;
