//! What tap-probe needs from the process and the system before it touches BPF: capabilities,
//! the locked-memory limit, and a mounted tracefs.

use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};

pub(crate) const CAP_DAC_READ_SEARCH: u32 = 2;
pub const CAP_NET_ADMIN: u32 = 12;
pub(crate) const CAP_SYS_PTRACE: u32 = 19;
pub const CAP_SYS_ADMIN: u32 = 21;
pub(crate) const CAP_SYS_RESOURCE: u32 = 24;
pub(crate) const CAP_SYSLOG: u32 = 34;
pub const CAP_PERFMON: u32 = 38;
pub const CAP_BPF: u32 = 39;

/// Where tracefs lives on current kernels, and where it appears under debugfs on older setups.
pub(crate) const TRACEFS: &str = "/sys/kernel/tracing";
pub(crate) const DEBUGFS_TRACING: &str = "/sys/kernel/debug/tracing";

/// How to get the capabilities, quoted in the error: every one [`missing_capabilities`]
/// asks for (`CAP_SYS_RESOURCE` where `memlock` says it is needed).
fn how_to_grant(memlock: Memlock) -> String {
    let resource = if memlock == Memlock::Needs {
        ",cap_sys_resource"
    } else {
        ""
    };
    format!(
        "run as root, or grant them: sudo setcap cap_bpf,cap_perfmon,cap_net_admin,\
         cap_sys_admin,cap_sys_ptrace,cap_dac_read_search,cap_syslog{resource}+ep $(command -v \
         tap-probe)"
    )
}

/// Whether loading the programs needs the locked-memory limit lifted, which takes
/// `CAP_SYS_RESOURCE`.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Memlock {
    /// The kernel charges the memory cgroup, or the limit's ceiling is already unlimited.
    Fine,
    /// The kernel charges eBPF memory to `RLIMIT_MEMLOCK` (before 5.11) and the limit's
    /// ceiling (its hard limit) is finite: a few hundred kilobytes or megabytes by default,
    /// far below what the maps hold.
    Needs,
}

impl Memlock {
    /// This kernel's and this process's case.
    fn here() -> Self {
        let mut limit = libc::rlimit {
            rlim_cur: 0,
            rlim_max: 0,
        };
        // SAFETY: `getrlimit` writes the struct we pass.
        let read = unsafe { libc::getrlimit(libc::RLIMIT_MEMLOCK, &raw mut limit) } == 0;
        if read && limit.rlim_max == libc::RLIM_INFINITY || !charges_memlock() {
            Self::Fine
        } else {
            Self::Needs
        }
    }
}

/// Whether this kernel charges eBPF maps and programs to the locked-memory limit
/// (`RLIMIT_MEMLOCK`), as kernels before 5.11 do; later ones, and kernels with that change
/// backported, charge the memory cgroup. Told by kallsyms: the rlimit accounting's
/// functions (`bpf_map_charge_init`, `kernel/bpf/syscall.c`) went with it.
fn charges_memlock() -> bool {
    use std::io::BufRead as _;
    let Ok(file) = std::fs::File::open("/proc/kallsyms") else {
        return false;
    };
    std::io::BufReader::new(file)
        .lines()
        .map_while(Result::ok)
        .any(|line| line.split_whitespace().nth(2) == Some("bpf_map_charge_init"))
}

/// The effective capability set (`CapEff`) from the text of `/proc/<pid>/status`.
///
/// # Errors
/// When the line is missing or is not hexadecimal.
pub fn parse_cap_eff(status: &str) -> Result<u64> {
    let value = status
        .lines()
        .find_map(|line| line.strip_prefix("CapEff:"))
        .ok_or_else(|| anyhow!("no CapEff line in /proc/self/status"))?
        .trim();
    u64::from_str_radix(value, 16).with_context(|| format!("CapEff {value:?} is not hexadecimal"))
}

/// The names of the needed capabilities absent from `cap_eff`:
/// - `CAP_BPF` and `CAP_PERFMON` load the programs and attach kprobes and tracepoints
///   (`CAP_SYS_ADMIN` stands in for both: the kernel accepts it, and kernels before 5.8 have
///   only it);
/// - `CAP_NET_ADMIN` creates taps and sets qdiscs (`demo`, `load`, `check`);
/// - `CAP_SYS_ADMIN` enters other network namespaces (`setns`) and mounts tracefs;
/// - `CAP_SYS_PTRACE` reads other processes' `/proc/PID/ns/net` and open files, which is
///   how namespaces without a name, and the processes holding a tap, are found (the kernel
///   asks for ptrace read access, `proc_ns_get_link`, and a root process without it is
///   refused at processes with more capabilities, such as kthreadd's for the initial one);
/// - `CAP_DAC_READ_SEARCH` lists another user's `/proc/PID/fd` (mode 0500, its owner's:
///   `proc_fd_permission` is `generic_permission`, which `CAP_SYS_PTRACE` does not pass), which
///   is how the process holding each tap, and the VM it runs, are named;
/// - `CAP_SYSLOG` shows kernel addresses in `/proc/kallsyms` (`kallsyms_show_value`): the
///   reader's and the wakers' functions are told by address;
/// - `CAP_SYS_RESOURCE` lifts the locked-memory limit, where the kernel charges eBPF memory
///   to it and its ceiling is finite ([`Memlock::Needs`]).
#[must_use]
pub(crate) fn missing_capabilities(cap_eff: u64, memlock: Memlock) -> Vec<&'static str> {
    let has = |cap: u32| cap_eff & (1u64 << cap) != 0;
    let sys_admin = has(CAP_SYS_ADMIN);
    let mut missing = Vec::new();
    if !has(CAP_BPF) && !sys_admin {
        missing.push("CAP_BPF");
    }
    if !has(CAP_PERFMON) && !sys_admin {
        missing.push("CAP_PERFMON");
    }
    for (cap, name) in [
        (CAP_NET_ADMIN, "CAP_NET_ADMIN"),
        (CAP_SYS_ADMIN, "CAP_SYS_ADMIN"),
        (CAP_SYS_PTRACE, "CAP_SYS_PTRACE"),
        (CAP_DAC_READ_SEARCH, "CAP_DAC_READ_SEARCH"),
        (CAP_SYSLOG, "CAP_SYSLOG"),
    ] {
        if !has(cap) {
            missing.push(name);
        }
    }
    if memlock == Memlock::Needs && !has(CAP_SYS_RESOURCE) {
        missing.push("CAP_SYS_RESOURCE");
    }
    missing
}

/// Checks that this process may load and attach tap-probe's programs.
///
/// # Errors
/// Names exactly the missing capabilities and how to get them.
pub fn check() -> Result<()> {
    let status =
        std::fs::read_to_string("/proc/self/status").context("reading /proc/self/status")?;
    check_cap_eff(parse_cap_eff(&status)?, Memlock::here())
}

fn check_cap_eff(cap_eff: u64, memlock: Memlock) -> Result<()> {
    let missing = missing_capabilities(cap_eff, memlock);
    if missing.is_empty() {
        return Ok(());
    }
    let why = if memlock == Memlock::Needs {
        " (this kernel charges eBPF maps to the locked-memory limit, which only \
         CAP_SYS_RESOURCE lifts past its ceiling; a service may set LimitMEMLOCK=infinity \
         instead)"
    } else {
        ""
    };
    bail!(
        "tap-probe lacks {}: {}{why}",
        missing.join(", "),
        how_to_grant(memlock)
    )
}

/// Lifts `RLIMIT_MEMLOCK`, which kernels before 5.11 charge BPF maps and programs to. Later
/// kernels account BPF memory to the memory cgroup instead, so a failure (no
/// `CAP_SYS_RESOURCE`) is only logged.
pub fn raise_memlock() {
    let unlimited = libc::rlimit {
        rlim_cur: libc::RLIM_INFINITY,
        rlim_max: libc::RLIM_INFINITY,
    };
    // SAFETY: `setrlimit` only reads the struct we pass by reference.
    let ret = unsafe { libc::setrlimit(libc::RLIMIT_MEMLOCK, &raw const unlimited) };
    if ret != 0 {
        log::debug!(
            "cannot lift RLIMIT_MEMLOCK ({}); fine on kernels >= 5.11, which charge BPF memory \
             to the memory cgroup",
            std::io::Error::last_os_error()
        );
    }
}

/// Whether `mounts` (the text of `/proc/mounts`) lists a tracefs mounted at `at`.
fn tracefs_mounted_at(mounts: &str, at: &str) -> bool {
    mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let (_, Some(mount_point), Some(fs_type)) = (fields.next(), fields.next(), fields.next())
        else {
            return false;
        };
        fs_type == "tracefs" && mount_point == at
    })
}

/// Whether a directory exists and has entries (tracefs under debugfs shows up that way).
fn non_empty_dir(path: &Path) -> bool {
    std::fs::read_dir(path).is_ok_and(|mut entries| entries.next().is_some())
}

/// Where tracefs is mounted right now, without changing anything.
#[must_use]
pub fn mounted_tracefs() -> Option<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if tracefs_mounted_at(&mounts, TRACEFS) {
        return Some(PathBuf::from(TRACEFS));
    }
    if tracefs_mounted_at(&mounts, DEBUGFS_TRACING) || non_empty_dir(Path::new(DEBUGFS_TRACING)) {
        return Some(PathBuf::from(DEBUGFS_TRACING));
    }
    None
}

/// Makes sure tracefs is mounted (classic tracepoints need it to look up event ids), mounting
/// it at `/sys/kernel/tracing` when it is not.
///
/// # Errors
/// When it is not mounted and mounting it fails.
pub fn ensure_tracefs() -> Result<PathBuf> {
    let mounts = std::fs::read_to_string("/proc/mounts").unwrap_or_default();
    if tracefs_mounted_at(&mounts, TRACEFS) {
        return Ok(PathBuf::from(TRACEFS));
    }
    let mounted = nix::mount::mount(
        Some("nodev"),
        TRACEFS,
        Some("tracefs"),
        nix::mount::MsFlags::empty(),
        None::<&str>,
    );
    match mounted {
        Ok(()) => {
            log::info!("mounted tracefs at {TRACEFS}");
            Ok(PathBuf::from(TRACEFS))
        }
        Err(errno) => {
            if tracefs_mounted_at(&mounts, DEBUGFS_TRACING)
                || non_empty_dir(Path::new(DEBUGFS_TRACING))
            {
                return Ok(PathBuf::from(DEBUGFS_TRACING));
            }
            bail!(
                "tracefs is not mounted and `mount -t tracefs nodev {TRACEFS}` failed: {errno} \
                 (classic tracepoints need tracefs; mount it as root)"
            )
        }
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const STATUS: &str = "Name:\ttap-probe\nCapInh:\t0000000000000000\nCapPrm:\t000001ffffffffff\n\
                          CapEff:\t000001fffeffffff\nCapBnd:\t000001ffffffffff\n";

    #[test]
    fn parses_cap_eff() {
        assert_eq!(parse_cap_eff(STATUS).unwrap(), 0x01ff_feff_ffff);
        assert!(parse_cap_eff("Name:\tx\n").is_err());
        assert!(parse_cap_eff("CapEff:\tzz\n").is_err());
    }

    #[test]
    fn root_has_everything() {
        assert!(missing_capabilities(parse_cap_eff(STATUS).unwrap(), Memlock::Fine).is_empty());
        assert!(check_cap_eff(0x01ff_ffff_ffff, Memlock::Needs).is_ok());
    }

    const OTHERS: u64 = (1 << CAP_NET_ADMIN)
        | (1 << CAP_SYS_PTRACE)
        | (1 << CAP_DAC_READ_SEARCH)
        | (1 << CAP_SYSLOG);

    #[test]
    fn names_exactly_what_is_missing() {
        assert_eq!(
            missing_capabilities(0, Memlock::Fine),
            [
                "CAP_BPF",
                "CAP_PERFMON",
                "CAP_NET_ADMIN",
                "CAP_SYS_ADMIN",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH",
                "CAP_SYSLOG"
            ]
        );
        let bpf_only = 1 << CAP_BPF;
        assert_eq!(
            missing_capabilities(bpf_only, Memlock::Fine),
            [
                "CAP_PERFMON",
                "CAP_NET_ADMIN",
                "CAP_SYS_ADMIN",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH",
                "CAP_SYSLOG"
            ]
        );
        let all = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_ADMIN) | OTHERS;
        assert!(missing_capabilities(all, Memlock::Fine).is_empty());
        assert_eq!(
            missing_capabilities(all & !(1 << CAP_SYSLOG), Memlock::Fine),
            ["CAP_SYSLOG"]
        );
        assert_eq!(
            missing_capabilities(all & !(1 << CAP_DAC_READ_SEARCH), Memlock::Fine),
            ["CAP_DAC_READ_SEARCH"]
        );
        let err = check_cap_eff(1 << CAP_NET_ADMIN, Memlock::Fine)
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("lacks CAP_BPF, CAP_PERFMON, CAP_SYS_ADMIN, CAP_SYS_PTRACE, CAP_DAC_READ_SEARCH, CAP_SYSLOG:"),
            "{err}"
        );
        assert!(
            err.contains(
                "setcap cap_bpf,cap_perfmon,cap_net_admin,cap_sys_admin,cap_sys_ptrace,cap_dac_read_search,cap_syslog+ep"
            ),
            "{err}"
        );
    }

    /// Where the kernel charges eBPF memory to a limit the process cannot lift, the one
    /// capability that lifts it is named, in the error and in the advice.
    #[test]
    fn a_memlock_charging_kernel_needs_sys_resource() {
        let all = (1 << CAP_BPF) | (1 << CAP_PERFMON) | (1 << CAP_SYS_ADMIN) | OTHERS;
        assert!(missing_capabilities(all, Memlock::Fine).is_empty());
        assert_eq!(
            missing_capabilities(all, Memlock::Needs),
            ["CAP_SYS_RESOURCE"]
        );
        assert!(missing_capabilities(all | (1 << CAP_SYS_RESOURCE), Memlock::Needs).is_empty());
        let err = check_cap_eff(all, Memlock::Needs).unwrap_err().to_string();
        assert!(err.contains("lacks CAP_SYS_RESOURCE: "), "{err}");
        assert!(err.contains(",cap_syslog,cap_sys_resource+ep"), "{err}");
        assert!(err.ends_with("LimitMEMLOCK=infinity instead)"), "{err}");
        let err = check_cap_eff(0, Memlock::Fine).unwrap_err().to_string();
        assert!(!err.contains("sys_resource"), "{err}");
    }

    #[test]
    fn sys_admin_stands_in_for_bpf_and_perfmon() {
        let caps = (1 << CAP_SYS_ADMIN) | OTHERS;
        assert!(missing_capabilities(caps, Memlock::Fine).is_empty());
        assert_eq!(
            missing_capabilities(1 << CAP_SYS_ADMIN, Memlock::Fine),
            [
                "CAP_NET_ADMIN",
                "CAP_SYS_PTRACE",
                "CAP_DAC_READ_SEARCH",
                "CAP_SYSLOG"
            ]
        );
    }

    #[test]
    fn finds_tracefs_in_mounts() {
        let mounts = "sysfs /sys sysfs rw 0 0\nnodev /sys/kernel/tracing tracefs rw 0 0\n";
        assert!(tracefs_mounted_at(mounts, TRACEFS));
        assert!(!tracefs_mounted_at("sysfs /sys sysfs rw 0 0\n", TRACEFS));
        assert!(!tracefs_mounted_at(
            "x /sys/kernel/tracing tmpfs rw 0 0\n",
            TRACEFS
        ));
    }
}
