//! What the programs know about the running kernel: offsets and values the loader read from
//! its BTF and kallsyms, and the one way to read kernel memory with them.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use tap_probe_common::KernelFacts;

/// Filled in by the loader before load (it lands in `.rodata`); read field by field with
/// volatile reads so the compiler cannot fold the zero initialiser.
#[unsafe(no_mangle)]
pub(crate) static KERNEL: KernelFacts = unsafe { core::mem::zeroed() };

/// One field of [`KERNEL`].
macro_rules! fact {
    ($($field:ident).+) => {
        unsafe { core::ptr::read_volatile(&raw const $crate::facts::KERNEL.$($field).+) }
    };
}
pub(crate) use fact;

/// The `T` at `base + offset` in kernel memory, if readable.
#[inline(always)]
pub(crate) fn read<T>(base: u64, offset: u32) -> Option<T> {
    // SAFETY: bpf_probe_read_kernel tolerates any address and reports a fault as an error.
    unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
}
