//! The lab: what tap-probe runs on purpose rather than watches. The test rigs (`lab`):
//! traffic, a tap with a reader playing the VM, slow consumers, programs the kernel skips;
//! `check`'s scenario runs and reports (its spec is `tap-probe-spec`'s); `bench`'s runs and
//! its table. All of it drives the observer (`tap-probe-observer`) below.
//!
//! The modules are public; an item in them is `pub` when the binary or the integration
//! tests use it and `pub(crate)` otherwise, so the compiler still finds dead code. `lab`
//! exports rigs only: the tests take the observer's parts from the observer.

pub mod bench;
pub mod check;
pub mod lab;
