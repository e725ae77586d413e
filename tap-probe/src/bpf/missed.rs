//! Program runs the kernel skipped, as far as it says: a kprobe program does not run while
//! another kprobe or perf-event program is running on its CPU (`bpf_prog_active` in
//! `trace_call_bpf`, `kernel/trace/bpf_trace.c`), and a raw tracepoint program does not run
//! inside itself. The kernel counts each in the program's `recursion_misses` (`struct
//! bpf_prog_info`; for kprobes since Linux 6.7), which aya does not expose, so it is read
//! here with `BPF_OBJ_GET_INFO_BY_FD`.
//!
//! A kprobe can also miss without running its program at all: while another kprobe's
//! handler runs on its CPU (`kprobe_running()`), the kprobe only counts the hit in its own
//! `nmissed`. The kernel reports that through the BPF link of the kprobe's perf event
//! (`bpf_link_info.perf_event.kprobe.missed`, since Linux 6.7), which aya
//! makes on kernels with perf links but does not expose: the links are found among this
//! process's descriptors and matched to programs by id, and the field is found in BTF. A kprobe made by tracefs would show
//! it in `kprobe_profile`; aya's are made through perf and are not listed there.

use std::collections::HashMap;
use std::os::fd::{AsRawFd as _, BorrowedFd, RawFd};

/// `BPF_OBJ_GET_INFO_BY_FD` (`include/uapi/linux/bpf.h`).
const BPF_OBJ_GET_INFO_BY_FD: libc::c_long = 15;
/// `offsetof(struct bpf_prog_info, recursion_misses)`: the uapi layout, stable since the
/// field was added (Linux 5.12).
const RECURSION_MISSES: usize = 208;

/// `offsetof(struct bpf_link_info, prog_id)`.
const LINK_PROG_ID: usize = 8;
/// `offsetof(struct bpf_link_info, perf_event.type)`: the union after three `__u32`s is
/// 8-byte aligned.
const LINK_PERF_EVENT_TYPE: usize = 16;
/// `BPF_LINK_TYPE_PERF_EVENT` (`enum bpf_link_type`).
const BPF_LINK_TYPE_PERF_EVENT: u32 = 7;
/// `BPF_PERF_EVENT_KPROBE` and `BPF_PERF_EVENT_KRETPROBE` (`enum bpf_perf_event_type`).
const BPF_PERF_EVENT_KPROBES: [u32; 2] = [3, 4];

/// What the kernel skipped of one program since it was loaded; when not 0, the counts it
/// feeds may be short.
#[derive(Clone, Debug, Default, PartialEq, Eq, serde::Serialize)]
pub(crate) struct ProgramMissed {
    pub(crate) program: String,
    /// Runs the kernel skipped because the program (for a kprobe: any kprobe program) was
    /// already running on the CPU: its `recursion_misses`.
    pub(crate) runs: u64,
    /// For a kprobe program: hits of its kprobes that ran no handler at all (their
    /// `nmissed`, summed). `None` for other programs, and where the kernel does not say
    /// (before Linux 6.7, or a kprobe attached without a perf link).
    pub(crate) kprobe: Option<u64>,
}

impl ProgramMissed {
    /// Everything the program missed.
    #[must_use]
    pub(crate) fn total(&self) -> u64 {
        self.runs + self.kprobe.unwrap_or(0)
    }
}

/// `BPF_OBJ_GET_INFO_BY_FD` into `info`; the kernel fills what it knows and leaves the rest.
fn object_info(fd: RawFd, info: &mut [u8]) -> std::io::Result<()> {
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
    Ok(())
}

fn u32_at(info: &[u8], at: usize) -> u32 {
    let mut bytes = [0u8; 4];
    bytes.copy_from_slice(&info[at..at + 4]);
    u32::from_ne_bytes(bytes)
}

fn u64_at(info: &[u8], at: usize) -> u64 {
    let mut bytes = [0u8; 8];
    bytes.copy_from_slice(&info[at..at + 8]);
    u64::from_ne_bytes(bytes)
}

/// The runs of the program at `fd` the kernel skipped; 0 where it does not count them.
///
/// # Errors
/// When the kernel refuses the request.
pub(crate) fn recursion_misses(fd: BorrowedFd<'_>) -> std::io::Result<u64> {
    // Up to and including recursion_misses: an older kernel fills less, leaving it 0.
    let mut info = [0u8; RECURSION_MISSES + 8];
    object_info(fd.as_raw_fd(), &mut info)?;
    Ok(u64_at(&info, RECURSION_MISSES))
}

/// The `nmissed` of every kprobe this process attached a program to through a BPF link,
/// summed by program id; `missed_at` is `offsetof(struct bpf_link_info,
/// perf_event.kprobe.missed)` on this kernel (from BTF). Descriptors that are no BPF link,
/// or vanish meanwhile, are passed over.
pub(crate) fn kprobe_misses(missed_at: u32) -> HashMap<u32, u64> {
    let missed_at = missed_at as usize;
    let mut out = HashMap::new();
    let Ok(fds) = std::fs::read_dir("/proc/self/fd") else {
        return out;
    };
    for entry in fds.filter_map(Result::ok) {
        let Some(fd) = entry
            .file_name()
            .to_str()
            .and_then(|name| name.parse::<RawFd>().ok())
        else {
            continue;
        };
        if !std::fs::read_link(entry.path())
            .is_ok_and(|target| target.as_os_str() == "anon_inode:bpf_link")
        {
            continue;
        }
        let mut info = vec![0u8; missed_at + 8];
        if object_info(fd, &mut info).is_err()
            || u32_at(&info, 0) != BPF_LINK_TYPE_PERF_EVENT
            || !BPF_PERF_EVENT_KPROBES.contains(&u32_at(&info, LINK_PERF_EVENT_TYPE))
        {
            continue;
        }
        *out.entry(u32_at(&info, LINK_PROG_ID)).or_default() += u64_at(&info, missed_at);
    }
    out
}
