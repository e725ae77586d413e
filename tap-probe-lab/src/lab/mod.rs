//! Test rigs: bounded traffic, a tap with a reader playing the VM (`load`, `demo`): a
//! `read(2)` loop or vhost-net driven from userspace; a deliberately slow veth peer; TCP
//! streams between two namespaces joined by a veth pair; programs the kernel skips on
//! purpose. The benchmarks and the privileged tests drive them.
//!
//! It exports the rigs only: a test names what it observes with (devices, namespaces, the
//! watcher, the kernel's facts) by the observer's own paths, so the rigs stay apart from
//! the library they test.

pub mod load;
pub mod misses;
pub mod pacer;
pub mod slow_consumer;
pub mod streams;
pub mod traffic;
pub mod veth_load;
pub mod vhost;

pub use crate::lab::misses::{KprobeLab, RecursionLab};
pub use crate::lab::slow_consumer::SlowConsumer;
pub use crate::lab::streams::{
    RECEIVER_DEV, SENDER_DEV, StreamsReport, TcpCounters, VethConfig, VethLink,
};
pub use crate::lab::traffic::{
    Drive, Driven, FrameOrder, ReadReport, ReaderConfig, SendReport, SenderConfig, send,
};
