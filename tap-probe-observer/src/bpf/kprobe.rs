//! Kprobes attached through BPF links this process holds, so that the kernel can say what
//! each kprobe missed.
//!
//! A kprobe whose handler would run while another kprobe's handler runs on its CPU
//! (`kprobe_running()`, kernel/kprobes.c) runs nothing and only counts the hit in its
//! `nmissed`. The kernel reports that count through the BPF link of the kprobe's perf
//! event (`bpf_link_info.perf_event.kprobe.missed`, Linux 6.7+), and only there: a kprobe
//! made through perf is not listed in tracefs' `kprobe_profile`. aya attaches a kprobe
//! through such a link only where its own feature probe says perf links work, and that
//! probe says no on some kernels that have them (Debian's 7.3), leaving the misses
//! unreadable. So the perf event is opened and linked here, the way libbpf does it
//! (`perf_event_open` on the `kprobe` PMU, then `BPF_LINK_CREATE`), and aya's attach is
//! the fallback where the kernel has no perf links (before Linux 5.15).

use std::collections::{HashMap, HashSet};
use std::ffi::CString;
use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd, FromRawFd as _, OwnedFd};

use anyhow::{Context as _, anyhow};
use aya::Ebpf;
use aya::programs::KProbe;

use crate::bpf::missed::{bpf, object_info, u64_at};

/// The kernel's kprobe PMU: its perf type and the config bit of a return probe.
pub(crate) const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// `BPF_LINK_CREATE` (`enum bpf_cmd`, `include/uapi/linux/bpf.h`).
const BPF_LINK_CREATE: libc::c_long = 28;
/// `BPF_PERF_EVENT` (`enum bpf_attach_type`).
const BPF_PERF_EVENT: u32 = 41;
/// `PERF_FLAG_FD_CLOEXEC` (`include/uapi/linux/perf_event.h`).
const PERF_FLAG_FD_CLOEXEC: libc::c_ulong = 8;

/// Whether this kernel has kprobes (the perf event source they are attached through).
#[must_use]
pub fn available() -> bool {
    std::path::Path::new(KPROBE_PMU).exists()
}

/// `struct perf_event_attr` up to `config2` (`PERF_ATTR_SIZE_VER1`), the part a kprobe
/// event needs: `config1` points at the function's name, `config2` is the offset in it.
#[repr(C)]
#[derive(Default)]
struct PerfEventAttr {
    kind: u32,
    size: u32,
    config: u64,
    sample_period: u64,
    sample_type: u64,
    read_format: u64,
    flags: u64,
    wakeup_events: u32,
    bp_type: u32,
    config1: u64,
    config2: u64,
}

/// The part of `union bpf_attr` that `BPF_LINK_CREATE` reads for a perf event.
#[repr(C)]
struct LinkCreateAttr {
    prog_fd: u32,
    target_fd: u32,
    attach_type: u32,
    flags: u32,
    bpf_cookie: u64,
}

/// The kprobes attached so far, by program; dropping it detaches them.
#[derive(Default)]
pub struct Kprobes {
    /// Each kprobe's link, with the program it runs.
    links: Vec<(String, OwnedFd)>,
    /// Programs with a kprobe attached without a link: their misses are not known.
    unlinked: HashSet<String>,
}

impl Kprobes {
    /// Loads the kprobe program `name` (once) and attaches it to the entry of `function`,
    /// or to its return when `ret`.
    ///
    /// # Errors
    /// When the kernel refuses to load the program or to attach it; the program is then
    /// unloaded, unless one of its kprobes is attached already.
    pub fn attach(
        &mut self,
        ebpf: &mut Ebpf,
        name: &str,
        function: &str,
        ret: bool,
    ) -> anyhow::Result<()> {
        let program: &mut KProbe = ebpf
            .program_mut(name)
            .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
            .try_into()?;
        if program.fd().is_err() {
            program
                .load()
                .with_context(|| format!("loading {name} (kprobe)"))?;
        }
        let kind = if ret { "kretprobe" } else { "kprobe" };
        let attached = link(program.fd()?.as_fd(), function, ret).and_then(|link| {
            if let Some(fd) = link {
                self.links.push((name.to_owned(), fd));
            } else {
                program.attach(function, 0)?;
                self.unlinked.insert(name.to_owned());
            }
            Ok(())
        });
        if let Err(err) = attached {
            // Leave nothing loaded that is not attached.
            if !self.links.iter().any(|(program, _)| program == name)
                && !self.unlinked.contains(name)
            {
                let _ = program.unload();
            }
            return Err(err).with_context(|| format!("attaching a {kind} to {function}"));
        }
        Ok(())
    }

    /// Whether every kprobe was attached through a link (which reports its misses).
    #[must_use]
    pub(crate) fn all_linked(&self) -> bool {
        self.unlinked.is_empty()
    }

    /// The `nmissed` of every kprobe, summed by program; `missed_at` is
    /// `offsetof(struct bpf_link_info, perf_event.kprobe.missed)` on this kernel (from
    /// BTF). A program with a kprobe attached without a link is left out: what it missed
    /// is not known.
    #[must_use]
    pub fn missed(&self, missed_at: u32) -> HashMap<String, u64> {
        let missed_at = missed_at as usize;
        let mut out = HashMap::new();
        for (program, fd) in &self.links {
            if self.unlinked.contains(program) {
                continue;
            }
            let mut info = vec![0u8; missed_at + 8];
            if object_info(fd.as_raw_fd(), &mut info).is_ok() {
                *out.entry(program.clone()).or_default() += u64_at(&info, missed_at);
            }
        }
        out
    }
}

/// Opens a kprobe perf event on `function` and links `program` to it; `None` where the
/// kernel has no perf links (then the caller attaches the old way).
fn link(program: BorrowedFd<'_>, function: &str, ret: bool) -> anyhow::Result<Option<OwnedFd>> {
    let event = open_event(function, ret)?;
    let mut attr = LinkCreateAttr {
        prog_fd: fd_number(program),
        target_fd: fd_number(event.as_fd()),
        attach_type: BPF_PERF_EVENT,
        flags: 0,
        bpf_cookie: 0,
    };
    // SAFETY: the attribute holds no pointer.
    let rc = match unsafe { bpf(BPF_LINK_CREATE, &mut attr) } {
        Ok(rc) => rc,
        // No BPF_LINK_CREATE for perf events (before 5.15).
        Err(err) if err.raw_os_error() == Some(libc::EINVAL) => return Ok(None),
        Err(err) => return Err(err).context("BPF_LINK_CREATE on the kprobe's perf event"),
    };
    // The link holds its own reference to the event: closing `event` detaches nothing.
    // SAFETY: on success the call returns a new descriptor that nothing else owns.
    Ok(Some(unsafe {
        OwnedFd::from_raw_fd(i32::try_from(rc).expect("a descriptor fits an int"))
    }))
}

/// `perf_event_open` of a kprobe (or kretprobe) on `function`, on every CPU's calls
/// (a tracing event counts all CPUs whichever one it is opened on).
fn open_event(function: &str, ret: bool) -> anyhow::Result<OwnedFd> {
    let kind = pmu_value("type")?;
    let config = if ret { 1u64 << retprobe_bit()? } else { 0 };
    let name = CString::new(function).context("a function name without NUL")?;
    let attr = PerfEventAttr {
        kind,
        size: u32::try_from(size_of::<PerfEventAttr>()).unwrap_or(u32::MAX),
        config,
        config1: name.as_ptr() as u64,
        ..PerfEventAttr::default()
    };
    // Any process, on CPU 0, in no group.
    let (pid, cpu, group): (libc::pid_t, libc::c_int, libc::c_int) = (-1, 0, -1);
    // SAFETY: `attr` and the name it points at outlive the call.
    let fd = unsafe {
        libc::syscall(
            libc::SYS_perf_event_open,
            &raw const attr,
            pid,
            cpu,
            group,
            PERF_FLAG_FD_CLOEXEC,
        )
    };
    if fd < 0 {
        return Err(std::io::Error::last_os_error())
            .with_context(|| format!("perf_event_open of a kprobe on {function}"));
    }
    // SAFETY: a new descriptor that nothing else owns.
    Ok(unsafe { OwnedFd::from_raw_fd(i32::try_from(fd).expect("a descriptor fits an int")) })
}

fn fd_number(fd: BorrowedFd<'_>) -> u32 {
    u32::try_from(fd.as_raw_fd()).unwrap_or(u32::MAX)
}

/// A number the kprobe PMU publishes in sysfs, `type` for one.
fn pmu_value(file: &str) -> anyhow::Result<u32> {
    let path = format!("{KPROBE_PMU}/{file}");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.trim()
        .parse()
        .with_context(|| format!("{path}: not a number: {text:?}"))
}

/// The config bit that makes a kprobe event a return probe: the PMU's
/// `format/retprobe` says `config:N`.
fn retprobe_bit() -> anyhow::Result<u32> {
    let path = format!("{KPROBE_PMU}/format/retprobe");
    let text = std::fs::read_to_string(&path).with_context(|| format!("reading {path}"))?;
    text.trim()
        .strip_prefix("config:")
        .and_then(|bit| bit.parse().ok())
        .ok_or_else(|| anyhow!("{path}: expected `config:N`, found {text:?}"))
}
