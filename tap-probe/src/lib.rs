//! tap-probe: counts what happens to packets on the transmit path of tun/tap devices.

pub mod backend;
pub mod btf;
pub mod cli;
pub mod demo;
pub mod discovery;
pub mod doctor;
pub mod kallsyms;
pub mod load;
pub mod netlink;
pub mod netns;
pub mod privileges;
pub mod probe;
pub mod prometheus;
pub mod record;
pub mod render;
pub mod replay;
pub mod replay_cmd;
pub mod report;
pub mod slow_consumer;
pub mod tap;
pub mod trace_file;
pub mod traffic;
pub mod watch;

/// The eBPF object built by `build.rs`.
#[must_use]
pub fn ebpf_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tap-probe"))
}

/// Shared by the privileged unit tests.
#[cfg(all(test, feature = "privileged-tests"))]
mod test_support {
    /// Privileged tests need root; elsewhere they say so and pass.
    pub fn root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            println!("skipping test - not root");
        }
        root
    }
}
