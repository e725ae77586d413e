//! What the programs know about the running kernel (offsets and values the loader read from
//! its BTF and kallsyms), and the two ways they read kernel memory with them.

use aya_ebpf::helpers::bpf_probe_read_kernel;
use tap_probe_common::KernelFacts;

/// Filled in by the loader before load (it lands in `.rodata`); read field by field with
/// volatile reads so the compiler cannot fold the zero initialiser. The verifier reads the
/// frozen `.rodata` as constants, so an offset from here is as good as one compiled in.
#[unsafe(no_mangle)]
pub(crate) static KERNEL: KernelFacts = unsafe { core::mem::zeroed() };

/// One field of [`KERNEL`].
macro_rules! fact {
    ($($field:ident).+) => {
        unsafe { core::ptr::read_volatile(&raw const $crate::facts::KERNEL.$($field).+) }
    };
}
pub(crate) use fact;

/// How a program reads a field of a kernel object it holds a pointer to.
pub(crate) trait Mem {
    /// Whether a read costs about as much as a compare (a plain load), so that checking
    /// more fields is cheaper than keeping them; a helper call is not.
    const CHEAP: bool;
    /// The `T` at `base + offset`, if readable.
    fn read<T>(base: u64, offset: u32) -> Option<T>;
}

/// Plain loads through the BTF-typed pointers of a `tp_btf` program: the verifier knows the
/// type behind `base` (a tracepoint argument, or a pointer field loaded from one), checks the
/// constant offset against it, and the JIT emits one load with a fault handler. No helper
/// call. `base` must be such a pointer: one that went through a map or arithmetic other than
/// a constant offset is a scalar, and the verifier refuses the load.
pub(crate) struct Typed;

impl Mem for Typed {
    const CHEAP: bool = true;

    #[inline(always)]
    fn read<T>(base: u64, offset: u32) -> Option<T> {
        // SAFETY: a BTF-typed load; the JIT turns a fault into a zero read.
        Some(unsafe { core::ptr::read_volatile((base + u64::from(offset)) as *const T) })
    }
}

/// `bpf_probe_read_kernel`, for pointers the verifier knows nothing of: a kprobe's
/// registers, or an address computed from a value stored in a map.
pub(crate) struct Probed;

impl Mem for Probed {
    const CHEAP: bool = false;

    #[inline(always)]
    fn read<T>(base: u64, offset: u32) -> Option<T> {
        // SAFETY: bpf_probe_read_kernel tolerates any address and reports a fault as an error.
        unsafe { bpf_probe_read_kernel((base + u64::from(offset)) as *const T).ok() }
    }
}

/// The `T` at `base + offset` in kernel memory, read with `bpf_probe_read_kernel`.
#[inline(always)]
pub(crate) fn read<T>(base: u64, offset: u32) -> Option<T> {
    Probed::read(base, offset)
}
