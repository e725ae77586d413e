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

/// Whether this process runs as root, which the privileged tests need; elsewhere they say
/// so and pass (`skipping test - not root`, the form aya's tests use). It lives here, below
/// everything, because the privileged tests of every layer ask it.
#[must_use]
pub fn root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        eprintln!("skipping test - not root");
    }
    root
}
