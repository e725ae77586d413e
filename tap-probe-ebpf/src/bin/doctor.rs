//! `tap-probe doctor`'s object: minimal programs it loads and attaches, one per attach type,
//! to learn which this kernel allows. They do nothing, and the object has no maps, so a
//! trial costs a program load and no more.
#![no_std]
#![no_main]
#![expect(
    unused_crate_dependencies,
    reason = "this object needs aya-ebpf alone; cargo passes every dependency of the package"
)]

use aya_ebpf::{
    macros::{btf_tracepoint, fentry, kprobe, raw_tracepoint, tracepoint},
    programs::{
        BtfTracePointContext, FEntryContext, ProbeContext, RawTracePointContext, TracePointContext,
    },
};

#[raw_tracepoint(tracepoint = "net_dev_xmit")]
pub(crate) fn doctor_raw_tp(_ctx: RawTracePointContext) -> i32 {
    0
}

#[btf_tracepoint(function = "net_dev_xmit")]
pub(crate) fn doctor_tp_btf(_ctx: BtfTracePointContext) -> i32 {
    0
}

#[tracepoint(category = "net", name = "net_dev_xmit")]
pub(crate) fn doctor_tracepoint(_ctx: TracePointContext) -> u32 {
    0
}

#[kprobe]
pub(crate) fn doctor_kprobe(_ctx: ProbeContext) -> u32 {
    0
}

// A vmlinux function: fentry on tun's own needs the module's BTF, which aya cannot load
// against (see tap-probe's `bpf::backend`); this trial asks only whether fentry loads here.
#[fentry(function = "consume_skb")]
pub(crate) fn doctor_fentry(_ctx: FEntryContext) -> u32 {
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
