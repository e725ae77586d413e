//! tap-probe: counts what happens to packets on the transmit path of tun/tap devices.
//!
//! Everything is `pub(crate)`; the facade below exports what the binary, the privileged
//! integration tests and the fuzz target need.

mod bpf;
mod cli;
mod cmd;
mod host;
mod kernel;
pub mod lab;
mod os;
mod output;
mod replay;

pub use cli::main;

/// The replay model, for the fidelity test.
pub mod model {
    pub use crate::replay::load_recording;
    pub use crate::replay::policy::Policy;
    pub use crate::replay::ring::X86_64_BATCH;
    pub use crate::replay::sim::{SimConfig, simulate};
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
