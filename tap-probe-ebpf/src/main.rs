//! The probe's object: the programs `watch` and `record` attach and the maps they count
//! into, per (device, queue).
//!
//! Per packet the programs do a few loads at offsets the loader read from the kernel's BTF,
//! a lookup in their CPU's cache of the queues they saw last, and plain increments of
//! per-CPU memory.
//! Each concern is a module: which devices are tracked and where their queues are counted
//! (`device`), the per-queue storage (`storage`), driver calls and drops (`transmit`), reader takes
//! (`consume`), the queue's stop state (`queue_state`), packets put back by a stopped queue
//! (`requeue`), packets taken out of their flow's order (`reorder`), wakes by their caller (`wake`), the ring's occupancy (`ring`), and
//! per-packet events (`events`).
#![no_std]
#![no_main]
// The one atomic the programs need, an add: the BPF target has no compare-and-swap, so
// `core` leaves its atomic types out there (see `storage::add`).
#![feature(core_intrinsics)]
#![expect(internal_features, reason = "see above")]
#![expect(
    unused_crate_dependencies,
    reason = "cargo passes each binary its package's library, which is empty here"
)]
// The helpers are inlined into each program: a program is verified as one body, and the
// older kernels the probe runs on limit calls between BPF functions.
#![expect(clippy::inline_always, reason = "see above")]
// The program macros hand each program its context by value.
#![expect(clippy::needless_pass_by_value, reason = "see above")]

mod clock;
mod consume;
mod device;
mod events;
mod facts;
mod queue_state;
mod reorder;
mod requeue;
mod ring;
mod storage;
mod transmit;
mod wake;

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
