//! Test rigs: bounded traffic, a tap with a reader playing the VM (`load`, `demo`): a
//! `read(2)` loop or vhost-net driven from userspace; a deliberately slow veth peer; TCP
//! streams between two namespaces joined by a veth pair; programs the kernel skips on
//! purpose. The benchmarks and the privileged tests drive them.
//!
//! This is also the surface of the privileged integration tests: the rigs, and the parts of
//! the observer they drive (real devices in private namespaces, a watcher counting them),
//! re-exported here so that a test names them in one place.

pub mod load;
pub mod misses;
pub mod pacer;
pub mod programs;
pub mod slow_consumer;
pub mod streams;
pub mod traffic;
pub mod veth_load;
pub mod vhost;

pub use crate::lab::misses::{KprobeLab, RecursionLab};
pub use crate::lab::programs::probe_program_names;
pub use crate::lab::slow_consumer::SlowConsumer;
pub use crate::lab::streams::{
    RECEIVER_DEV, SENDER_DEV, StreamsReport, TcpCounters, VethConfig, VethLink,
};
pub use crate::lab::traffic::{
    Drive, Driven, FrameOrder, ReadReport, ReaderConfig, SendReport, SenderConfig, send,
};
pub use tap_probe_observer::bpf::backend::{Backend, Sources};
pub use tap_probe_observer::bpf::probe::{Occupancy, RingOccupancy};
pub use tap_probe_observer::host::discovery::{DeviceKind, Discovery, Filter};
pub use tap_probe_observer::host::report::{Report, Row, Value};
pub use tap_probe_observer::host::watcher::Watcher;
pub use tap_probe_observer::kernel::{KernelInfo, TunBackpressure};
pub use tap_probe_observer::os::netlink::{QdiscStats, RootQdisc, Rtnl};
pub use tap_probe_observer::os::netns::{NamedNetns, run_in};
pub use tap_probe_observer::os::root;
pub use tap_probe_observer::os::tap::{Tap, TapOptions};

/// What the kernel has loaded and attached, listed through bpf(2): the tests prove with it
/// that a run left none of its programs behind.
pub mod loaded {
    pub use tap_probe_observer::bpf::loaded::{BpfLink, Program, links, programs};
}

/// Whether this kernel's tun offers `IFF_BACKPRESSURE` (the fix as merged), as
/// [`KernelInfo`] tells it.
///
/// # Errors
/// When `/dev/net/tun` cannot be asked, or kallsyms cannot be read.
pub fn tun_has_backpressure() -> anyhow::Result<bool> {
    Ok(KernelInfo::tun_backpressure_now()? == TunBackpressure::OptIn)
}

/// The runs of the loaded program `id` the kernel skipped (`bpf_prog_info.recursion_misses`),
/// read from the kernel by the program's id: what another process's programs missed; `None`
/// where the kernel does not count them (before Linux 5.12).
///
/// # Errors
/// When no such program is loaded, or the kernel refuses the request.
pub fn program_recursion_misses(id: u32) -> anyhow::Result<Option<u64>> {
    use anyhow::Context as _;
    use std::os::fd::AsFd as _;
    let program = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .with_context(|| format!("no program {id} is loaded"))?;
    let fd = program.fd()?;
    Ok(tap_probe_observer::bpf::missed::recursion_misses(
        fd.as_fd(),
    )?)
}
