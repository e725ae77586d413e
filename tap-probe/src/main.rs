//! tap-probe: counts what happens to packets on the transmit path of tun/tap devices.
//!
//! The binary is the top layer: the command line (`cli`), one module per subcommand
//! (`cmd`) and what they show (`output`), over the lab (`tap-probe-lab`), the ring model
//! (`tap-probe-replay`) and the observer (`tap-probe-observer`). Where to start reading:
//! `cli.rs`, then a subcommand in `cmd/`; the counters are declared in `tap-probe-common`'s
//! `counters.rs`.

mod cli;
mod cli_reference;
mod cmd;
mod output;

// What only the integration tests use: what they tell xtask, and the probe object's
// program names; the binary's own unit tests use neither.
#[cfg(test)]
use {aya_obj as _, tap_probe_verdict as _};

fn main() -> std::process::ExitCode {
    cli::main()
}
