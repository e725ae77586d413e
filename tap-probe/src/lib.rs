//! tap-probe: counts what happens to packets on the transmit path of tun/tap devices.
//!
//! Everything is `pub(crate)`; the facade below exports what the binary, the privileged
//! integration tests and the fuzz target need.

mod backend;
mod btf;
mod cli;
mod demo;
mod discovery;
mod doctor;
mod kallsyms;
mod kernel;
mod load;
mod netlink;
mod netns;
mod output;
mod privileges;
mod probe;
mod prometheus;
mod record;
mod render;
mod replay;
mod replay_cmd;
mod report;
mod signals;
mod slow_consumer;
mod table;
mod tap;
mod trace_file;
mod traffic;
mod watch;

pub use cli::main;

/// The test rigs and the parts of tap-probe the privileged integration tests drive: real
/// devices in private namespaces, bounded traffic, and a watcher counting it.
pub mod lab {
    pub use crate::backend::Backend;
    pub use crate::discovery::{DeviceKind, Discovery, Filter};
    pub use crate::kernel::KernelInfo;
    pub use crate::netlink::{QdiscStats, RootQdisc, Rtnl};
    pub use crate::netns::{NamedNetns, run_in};
    pub use crate::report::{Report, Row, Value};
    pub use crate::slow_consumer::SlowConsumer;
    pub use crate::tap::{Tap, TapOptions};
    pub use crate::traffic::{
        ReadReport, ReaderConfig, SendReport, SenderConfig, drain, read, send,
    };
    pub use crate::watch::Watcher;
}

/// The replay model, for the fidelity test.
pub mod model {
    pub use crate::replay::load_recording;
    pub use crate::replay::policy::Policy;
    pub use crate::replay::ring::X86_64_BATCH;
    pub use crate::replay::sim::{SimConfig, simulate};
}

/// The trace reader, for the fuzz target.
pub mod trace {
    pub use crate::trace_file::TraceReader;
}

/// The eBPF object built by `build.rs`.
fn ebpf_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tap-probe"))
}

/// Shared by the privileged unit tests.
#[cfg(all(test, feature = "privileged-tests"))]
mod test_support {
    /// Privileged tests need root; elsewhere they say so and pass.
    pub(crate) fn root() -> bool {
        let root = nix::unistd::geteuid().is_root();
        if !root {
            println!("skipping test - not root");
        }
        root
    }
}
