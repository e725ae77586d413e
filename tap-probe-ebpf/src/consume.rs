//! Reader takes: a packet the reader (QEMU, vhost-net, any tap reader) took out of the ring,
//! and how often that reader slept between takes.

use aya_ebpf::{
    helpers::generated::{bpf_get_current_task, bpf_get_current_task_btf},
    macros::{btf_tracepoint, kprobe},
    programs::{BtfTracePointContext, ProbeContext},
};
use tap_probe_common::{EventKind, MAX_READER_RANGES};

use crate::clock::Clock;
use crate::device::locate_skb;
use crate::events::record_at;
use crate::facts::{KERNEL, Mem, Probed, Typed, fact};
use crate::storage::{per_cpu, shared};

/// A free of `skb` called from `location`: the reader's take when freed from the tun/tap
/// read path (`tun_do_read`: `tun_put_user`, then `consume_skb`), which is also where tun
/// counts `tx_packets`. The caller's address is compared first: every other free on the
/// host leaves there.
#[inline(always)]
fn freed_after_use<M: Mem>(skb: u64, location: u64) {
    if !in_reader(location) {
        return;
    }
    let Some(dev) = M::read::<u64>(skb, fact!(skb_dev)) else {
        return;
    };
    let Some(at) = locate_skb::<M>(dev, skb) else {
        return;
    };
    let mut clock = Clock::new();
    if let Some(c) = per_cpu(at.slot) {
        c.consumed += 1;
        c.reader_sleeps += reader_sleeps_since_last_take(at.slot);
        record_at(at, EventKind::Consumed, 0, &mut clock);
    }
    crate::ring::sample_exact(dev, at, &mut clock);
}

/// Called in the reader's context at each take: how many times the current thread slept
/// voluntarily since its previous take from the same queue (0 at its first take).
///
/// The queue's last reader (`QueueShared::reader`) is shared between CPUs without atomics:
/// a queue's reader is one thread (a tap queue is one file, read by the thread that owns
/// it), and its takes do not overlap; two threads taking turns on one queue only reset each
/// other's baseline, so sleeps are then undercounted, never invented.
#[inline(always)]
fn reader_sleeps_since_last_take(slot: u32) -> u64 {
    // The running task: its address names the thread (one helper call fewer than the tid).
    // Where the kernel types it (5.11+) `nvcsw` is a plain load; before, a probe read. The
    // verifier reads `task_btf` as a constant and never sees the helper a kernel lacks.
    let (task, nvcsw) = if fact!(task_btf) != 0 {
        let task = unsafe { bpf_get_current_task_btf() } as u64;
        (task, Typed::read::<u64>(task, fact!(task_nvcsw)))
    } else {
        let task = unsafe { bpf_get_current_task() };
        (task, Probed::read::<u64>(task, fact!(task_nvcsw)))
    };
    let Some(nvcsw) = nvcsw else {
        return 0;
    };
    let Some(s) = shared(slot) else {
        return 0;
    };
    let last = &mut s.reader;
    // A count that went down is another thread whose task_struct reuses the memory of an
    // exited one: a new baseline, like any other change of reader.
    let slept = if last.task == task && nvcsw >= last.nvcsw {
        nvcsw - last.nvcsw
    } else {
        last.task = task;
        0
    };
    if last.nvcsw != nvcsw {
        last.nvcsw = nvcsw;
    }
    slept
}

/// `consume_skb(skb, location)`: the tracepoint source of reader takes (Linux >= 6.3, where
/// the tracepoint carries its caller's address).
#[btf_tracepoint(function = "consume_skb")]
#[inline(always)]
pub(crate) fn consume_skb(ctx: BtfTracePointContext) -> i32 {
    freed_after_use::<Typed>(ctx.arg(0), ctx.arg(1));
    0
}

/// The kprobe source of reader takes, on any kernel: at the entry of `consume_skb(skb)`
/// the return address, i.e. the caller's location, is the word at the stack pointer.
#[kprobe]
#[inline(always)]
pub(crate) fn consume_entry(ctx: ProbeContext) -> u32 {
    let Some(skb) = ctx.arg::<u64>(0) else {
        return 0;
    };
    // SAFETY: regs points at the probed context's saved registers.
    let sp = unsafe { (*ctx.regs).rsp };
    if let Some(location) = Probed::read::<u64>(sp, 0) {
        freed_after_use::<Probed>(skb, location);
    }
    0
}

/// Whether `location` lies in one of the read-path ranges the loader found in kallsyms.
#[inline(always)]
fn in_reader(location: u64) -> bool {
    let n = fact!(reader_range_count) as usize;
    for i in 0..MAX_READER_RANGES {
        if i >= n {
            break;
        }
        let range = unsafe { core::ptr::read_volatile(&raw const KERNEL.reader_ranges[i]) };
        if location >= range.start && location < range.end {
            return true;
        }
    }
    false
}
