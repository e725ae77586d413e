//! tap-probe: counts what happens to packets on the transmit path of tun/tap devices.
//!
//! Everything is `pub(crate)`; the facade exports what the binary (`main`) and the
//! privileged integration tests (`lab`, `model`) need. Where to start reading: `cli.rs`,
//! then a subcommand in `cmd/`; the counters are declared in `tap-probe-common`'s
//! `counters.rs`.

mod bench;
mod bpf;
mod check;
mod cli;
mod cli_reference;
mod cmd;
mod duration;
mod host;
mod kernel;
pub mod lab;
mod os;
mod output;
mod replay;

pub use cli::main;

/// The replay model, for the fidelity test.
pub mod model {
    pub use crate::replay::policy::Policy;
    pub use crate::replay::ring::X86_64_BATCH;
    pub use crate::replay::sim::{SimConfig, simulate};
    pub use crate::replay::{Cut, Recording, load_recording, salvage_recording};
}
