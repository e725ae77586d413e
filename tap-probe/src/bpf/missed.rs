//! Program runs the kernel skipped, as far as it says: a kprobe program does not run while
//! another kprobe or perf-event program is running on its CPU (`bpf_prog_active` in
//! `trace_call_bpf`, `kernel/trace/bpf_trace.c`), and a raw tracepoint program does not run
//! inside itself. The kernel counts each in the program's `recursion_misses` (`struct
//! bpf_prog_info`; for kprobes since Linux 6.7), which aya does not expose, so it is read
//! here with `BPF_OBJ_GET_INFO_BY_FD`.
//!
//! Not counted here: a kprobe that does not fire at all because another kprobe's handler
//! is running on its CPU (`kprobe_running()`, the kprobe's own `nmissed`). The kernel
//! reports that only through a kprobe's tracefs profile or its BPF link, and aya attaches
//! kprobes through perf events without a link. See `backend.rs` for how the programs avoid
//! it.

use std::os::fd::{AsRawFd as _, BorrowedFd};

/// `BPF_OBJ_GET_INFO_BY_FD` (`include/uapi/linux/bpf.h`).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `offsetof(struct bpf_prog_info, recursion_misses)`: the uapi layout, stable since the
/// field was added (Linux 5.12).
const RECURSION_MISSES: usize = 208;

/// The runs of the program at `fd` the kernel skipped; 0 where it does not count them.
///
/// # Errors
/// When the kernel refuses the request.
pub(crate) fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    // Up to and including recursion_misses: an older kernel fills less, leaving it 0.
    let mut info = [0u8; RECURSION_MISSES + 8];
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX),
        info_len: u32::try_from(info.len()).unwrap_or(0),
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: the attribute points at `info`, which outlives the call; the kernel writes
    // at most `info_len` bytes.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_OBJ_GET_INFO_BY_FD,
            &raw mut attr,
            size_of::<InfoAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    let mut misses = [0u8; 8];
    misses.copy_from_slice(&info[RECURSION_MISSES..]);
    Ok(u64::from_ne_bytes(misses))
}
