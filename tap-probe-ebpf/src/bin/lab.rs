//! The test rigs' object: a deliberately slow reader of a veth ring.
#![no_std]
#![no_main]
#![expect(
    unused_crate_dependencies,
    reason = "this object needs aya-ebpf alone; cargo passes every dependency of the package"
)]

use aya_ebpf::{
    bindings::xdp_action::XDP_PASS, helpers::bpf_ktime_get_ns, macros::xdp, programs::XdpContext,
};

/// How long `slow_consumer` holds each packet, set by the loader.
#[unsafe(no_mangle)]
static SLOW_CONSUMER_NS: u64 = 0;

/// An XDP program that spends `SLOW_CONSUMER_NS` on every packet, then passes it: attached to
/// a veth peer whose NAPI runs threaded on another CPU, it makes a deliberately slow reader of
/// the veth ring, so the sender sees the ring fill (`NETDEV_TX_BUSY`, queue stops and wakes).
#[xdp]
pub(crate) fn slow_consumer(_ctx: XdpContext) -> u32 {
    let hold = unsafe { core::ptr::read_volatile(&raw const SLOW_CONSUMER_NS) };
    let start = unsafe { bpf_ktime_get_ns() };
    // Bounded for the verifier; a ktime read costs tens of ns, so 16384 rounds cover at
    // least ~300 us on real hardware (more under emulation, where each read costs more).
    for _ in 0..16384 {
        if unsafe { bpf_ktime_get_ns() }.wrapping_sub(start) >= hold {
            break;
        }
    }
    XDP_PASS
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
