//! The privileged tests: real taps, veths and qdiscs in network namespaces each test makes
//! for itself, with the kernel's own counters as the oracle. One binary, a module per
//! subject (aya's `integration-test` shape), which `cargo xtask test` runs a test at a time,
//! each as a process of its own, on the host and in guests; xtask names a test by its
//! module and its name (`exactness::tap_noqueue_counters_match_kernel`), and where each
//! module runs is `xtask/src/suite.rs`'s to say. Without root each test says so and passes.
//!
//! `vm_kernels` boots guests (and fetches a kernel package): behind the feature too, as the
//! tests that need the machine are.
#![expect(
    unused_crate_dependencies,
    reason = "the tests use a few of the package's dependencies"
)]

mod common;

mod alerts;
mod backpressure;
mod check;
mod churn;
mod dense;
mod exactness;
mod fleet;
mod from_birth;
mod live_attach;
mod misses;
mod multiqueue;
mod record_replay;
mod record_robustness;
mod reorder;
mod ring;
mod service;
mod stop;
mod unsupported;
mod vm_kernels;
mod watch_cli;
mod watch_tty;
mod web;
