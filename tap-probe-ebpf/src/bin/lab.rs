//! The test rigs' object: a deliberately slow reader of a veth ring, and programs that make
//! the kernel skip runs of a program on purpose, so that the tests can prove that what
//! tap-probe reads of such misses is what happened.
#![no_std]
#![no_main]
#![expect(
    unused_crate_dependencies,
    reason = "this object needs aya-ebpf alone; cargo passes every dependency of the package"
)]

use aya_ebpf::{
    bindings::xdp_action::XDP_PASS,
    bpf_printk,
    helpers::{bpf_get_current_comm, bpf_get_current_pid_tgid, bpf_ktime_get_ns},
    macros::{kprobe, map, raw_tracepoint, tracepoint, xdp},
    maps::PerCpuArray,
    programs::{ProbeContext, RawTracePointContext, TracePointContext, XdpContext},
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

/// The test's process, set by the loader: the miss programs act for it alone, so that what
/// other processes do (their own `bpf_trace_printk`) cannot change the counts.
#[unsafe(no_mangle)]
static LAB_TGID: u32 = 0;

/// Runs of each miss program that did their work, indexed by `RUN_*`, per CPU (summed by
/// the loader): what the test compares the kernel's miss counts with.
#[map]
static RUNS: PerCpuArray<u64> = PerCpuArray::with_max_entries(3, 0);
const RUN_RECURSE_PRINTK: u32 = 0;
const RUN_COMM_KPROBE: u32 = 1;
const RUN_PRINTK_TRACEPOINT: u32 = 2;

fn ours() -> bool {
    let tgid = unsafe { core::ptr::read_volatile(&raw const LAB_TGID) };
    // The upper half of pid_tgid is the thread group id.
    (bpf_get_current_pid_tgid() >> 32) as u32 == tgid
}

fn count(run: u32) {
    if let Some(slot) = RUNS.get_ptr_mut(run) {
        // SAFETY: this CPU's map value, alive for the program's run; a program is not
        // preempted on its CPU, so nothing else writes it meanwhile.
        unsafe { *slot += 1 };
    }
}

/// Never attached: the test runs it (`BPF_PROG_TEST_RUN`) to set the others off, each time
/// once: a `bpf_get_current_comm` call (the function `comm_kprobe` is attached to) and a
/// `bpf_trace_printk` (the tracepoint `recurse_printk` and `printk_tracepoint` are attached
/// to), outside any other program.
#[raw_tracepoint(tracepoint = "bpf_trace_printk")]
pub(crate) fn trigger(_ctx: RawTracePointContext) -> i32 {
    let _ = bpf_get_current_comm();
    unsafe { bpf_printk!(c"tap-probe lab: trigger") };
    0
}

/// On the raw tracepoint `bpf_trace_printk`, it calls `bpf_trace_printk` itself: that run
/// would nest in itself, which the kernel refuses, counting one recursion miss of this
/// program per run that did its work.
#[raw_tracepoint(tracepoint = "bpf_trace_printk")]
pub(crate) fn recurse_printk(_ctx: RawTracePointContext) -> i32 {
    if ours() {
        count(RUN_RECURSE_PRINTK);
        unsafe { bpf_printk!(c"tap-probe lab: nested printk") };
    }
    0
}

/// On a kprobe of `bpf_get_current_comm`, it calls that helper itself: the kprobe is hit
/// while a kprobe handler runs on the CPU, and runs nothing but a count of its own misses
/// (`nmissed`). Its `bpf_trace_printk` reaches `printk_tracepoint` while this program runs,
/// which the kernel refuses (one BPF program of that kind per CPU at a time), counting a
/// recursion miss of that program (Linux 6.7+; before, it is not counted).
#[kprobe]
pub(crate) fn comm_kprobe(_ctx: ProbeContext) -> u32 {
    if ours() {
        count(RUN_COMM_KPROBE);
        let _ = bpf_get_current_comm();
        unsafe { bpf_printk!(c"tap-probe lab: printk under a kprobe") };
    }
    0
}

/// On the classic tracepoint `bpf_trace:bpf_trace_printk`: counts the runs the kernel let
/// it make.
#[tracepoint(category = "bpf_trace", name = "bpf_trace_printk")]
pub(crate) fn printk_tracepoint(_ctx: TracePointContext) -> u32 {
    if ours() {
        count(RUN_PRINTK_TRACEPOINT);
    }
    0
}

#[cfg(not(test))]
#[panic_handler]
fn panic(_info: &core::panic::PanicInfo) -> ! {
    loop {}
}
