//! The floor of the probe's cost, for `cargo xtask bench`: a program of each name, attach
//! type and hook the probe has, each returning at its first instruction, and the switches
//! the loader sets. Attached where the probe's programs attach, it costs what the kernel's
//! hooks cost with nothing in them: what tap-probe's own work is measured above. Not a user
//! option: only the benchmark loads it.
#![no_std]
#![no_main]
#![expect(
    unused_crate_dependencies,
    reason = "this object needs aya-ebpf alone; cargo passes every dependency of the package"
)]

use aya_ebpf::{
    macros::{btf_tracepoint, kprobe, kretprobe, map},
    maps::Array,
    programs::{BtfTracePointContext, ProbeContext, RetProbeContext},
};

/// The loader's switches, which it sets as it attaches (see `SETTING_*`).
#[map]
static SETTINGS: Array<u32> = Array::with_max_entries(tap_probe_common::SETTING_COUNT, 0);

#[btf_tracepoint(function = "net_dev_start_xmit")]
pub(crate) fn net_dev_start_xmit(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "net_dev_xmit")]
pub(crate) fn net_dev_xmit(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "kfree_skb")]
pub(crate) fn kfree_skb(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "consume_skb")]
pub(crate) fn consume_skb(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "qdisc_dequeue")]
pub(crate) fn qdisc_dequeue(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[kprobe]
pub(crate) fn xmit_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe]
pub(crate) fn xmit_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[kprobe]
pub(crate) fn consume_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[kprobe]
pub(crate) fn direct_xmit_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[kretprobe]
pub(crate) fn direct_xmit_return(_ctx: RetProbeContext) -> u32 {
    0
}

#[kprobe]
pub(crate) fn wake_entry(_ctx: ProbeContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
