//! Program runs the kernel skipped, as far as it says: a kprobe program does not run while
//! another kprobe or perf-event program is running on its CPU (`bpf_prog_active` in
//! `trace_call_bpf`, `kernel/trace/bpf_trace.c`), and a raw tracepoint program does not run
//! inside itself. The kernel counts each in the program's `recursion_misses` (`struct
//! bpf_prog_info`, Linux 5.12+; for kprobes since Linux 6.7), which aya does not expose, so
//! it is read here with `BPF_OBJ_GET_INFO_BY_FD`. An older kernel skips runs all the same
//! without counting them: its misses are unknown, never 0.
//!
//! A kprobe can also miss without running its program at all; [`crate::bpf::kprobe`]
//! reads that.

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, RawFd};

use anyhow::Context as _;

/// `BPF_OBJ_GET_INFO_BY_FD` (`include/uapi/linux/bpf.h`).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `offsetof(struct bpf_prog_info, recursion_misses)`: the uapi layout, stable since the
/// field was added (Linux 5.12).
const RECURSION_MISSES: usize = 208;

/// What the kernel skipped of one program since it was loaded; when not 0, the counts it
/// feeds may be short.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub struct ProgramMissed {
    pub program: String,
    /// Runs the kernel skipped because the program (for a kprobe: any kprobe program) was
    /// already running on the CPU: its `recursion_misses`. `None` where the kernel does not
    /// count them (before Linux 5.12).
    pub runs: Option<u64>,
    /// For a kprobe program: hits of its kprobes that ran no handler at all (their
    /// `nmissed`, summed). `None` for other programs, and where the kernel does not say
    /// (before Linux 6.7, or a kprobe attached without a perf link).
    pub kprobe: Option<u64>,
}

impl ProgramMissed {
    /// Everything the program missed, as far as the kernel says.
    #[must_use]
    pub fn total(&self) -> u64 {
        self.runs.unwrap_or(0) + self.kprobe.unwrap_or(0)
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`; the kernel fills what it knows and leaves the rest.
/// Returns how many bytes it knows: an older kernel's struct ends sooner.
pub(super) fn object_info(fd: RawFd, info: &mut [u8]) -> std::io::Result<usize> {
    #[repr(C)]
    struct InfoAttr {
        bpf_fd: u32,
        info_len: u32,
        info: u64,
    }
    let mut attr = InfoAttr {
        bpf_fd: u32::try_from(fd).unwrap_or(u32::MAX),
        info_len: u32::try_from(info.len()).unwrap_or(0),
        info: info.as_mut_ptr() as u64,
    };
    // SAFETY: the attribute points at `info`, which outlives the call; the kernel writes
    // at most `info_len` bytes there.
    unsafe { bpf(BPF_OBJ_GET_INFO_BY_FD, &mut attr) }?;
    // The kernel writes back the length it filled: the smaller of ours and its own struct's.
    Ok(usize::try_from(attr.info_len).unwrap_or(0))
}

/// The `bpf(2)` system call: command `cmd` on `attr`, a prefix of `union bpf_attr` (the
/// kernel reads that many bytes and takes the rest as zero); what it returns.
///
/// # Safety
/// Every pointer in `attr` must be valid for what `cmd` does with it.
pub(super) unsafe fn bpf<T>(cmd: libc::c_long, attr: &mut T) -> std::io::Result<libc::c_long> {
    // SAFETY: `attr` is valid for its size; its pointers are the caller's to vouch for.
    let rc = unsafe { libc::syscall(libc::SYS_bpf, cmd, std::ptr::from_mut(attr), size_of::<T>()) };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(rc)
}

pub(super) fn u64_at(info: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&info[at..at + 8]);
    u64::from_ne_bytes(bytes)
}

/// The runs of the program at `fd` the kernel skipped; `None` where it does not count them:
/// its `struct bpf_prog_info` ends before `recursion_misses` (as it says by the length it
/// fills).
///
/// # Errors
/// When the kernel refuses the request.
pub fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<Option<u64>> {
    let mut info = [0u8; RECURSION_MISSES + 8];
    let filled = object_info(fd.as_raw_fd(), &mut info)?;
    Ok((filled >= info.len()).then(|| u64_at(&info, RECURSION_MISSES)))
}

/// The runs of the loaded program `id` the kernel skipped (`bpf_prog_info.recursion_misses`),
/// read from the kernel by the program's id: what another process's programs missed; `None`
/// where the kernel does not count them (before Linux 5.12).
///
/// # Errors
/// When no such program is loaded, or the kernel refuses the request.
pub fn program_recursion_misses(id: u32) -> anyhow::Result<Option<u64>> {
    let program = aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .find(|p| p.id() == id)
        .with_context(|| format!("no program {id} is loaded"))?;
    let fd = program.fd()?;
    Ok(recursion_misses(fd.as_fd())?)
}
