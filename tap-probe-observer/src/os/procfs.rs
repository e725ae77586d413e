//! What `/proc` tells about processes: who they are and which tun/tap queues they hold.

use std::collections::HashSet;
use std::path::Path;

use anyhow::{Context as _, Result};

use crate::os::{cmdline, netns};

/// Pids of all processes, ascending.
///
/// # Errors
/// When `/proc` cannot be listed.
pub(crate) fn pids() -> Result<Vec<u32>> {
    let mut pids: Vec<u32> = std::fs::read_dir("/proc")
        .context("cannot list /proc")?
        .filter_map(std::result::Result::ok)
        .filter_map(|entry| entry.file_name().to_str()?.parse().ok())
        .collect();
    pids.sort_unstable();
    Ok(pids)
}

/// A tun/tap queue fd found in a process.
#[derive(Debug, Clone, PartialEq, Eq)]
pub(crate) struct Holder {
    pub(crate) pid: u32,
    pub(crate) comm: String,
    /// The inode of the process's own network namespace.
    pub(crate) netns_inode: Option<u32>,
    /// Device name from the fd's `iff:` fdinfo line (`tun_chr_show_fdinfo`).
    pub(crate) iff: String,
    /// The VM the process runs, from its command line (QEMU's `-name`, libvirt's domain).
    pub(crate) vm: Option<String>,
}

/// Every open `/dev/net/tun` fd bound to a device in the processes `pids`, from
/// `/proc/PID/fd` and `/proc/PID/fdinfo`. Processes and fds that go away mid-scan are
/// skipped.
pub(crate) fn tun_holders(pids: &[u32]) -> Vec<Holder> {
    let mut holders = Vec::new();
    for &pid in pids {
        let fd_dir = format!("/proc/{pid}/fd");
        let Ok(fds) = std::fs::read_dir(&fd_dir) else {
            continue;
        };
        let mut comm = None;
        let mut vm = None;
        let mut seen = HashSet::new();
        for fd in fds.filter_map(std::result::Result::ok) {
            // readlink is cheap; fdinfo is read only for tun fds.
            if std::fs::read_link(fd.path()).ok().as_deref() != Some(Path::new("/dev/net/tun")) {
                continue;
            }
            let Some(iff) = read_iff(pid, &fd.file_name().to_string_lossy()) else {
                continue;
            };
            // One owner entry per (process, device), however many queues it holds.
            if !seen.insert(iff.clone()) {
                continue;
            }
            let comm = comm
                .get_or_insert_with(|| {
                    std::fs::read_to_string(format!("/proc/{pid}/comm"))
                        .map(|c| c.trim_end().to_owned())
                        .unwrap_or_default()
                })
                .clone();
            // Read once per process, and only for those that hold a tap.
            let vm = vm
                .get_or_insert_with(|| {
                    std::fs::read(format!("/proc/{pid}/cmdline"))
                        .ok()
                        .and_then(|line| cmdline::vm_name(&line))
                })
                .clone();
            let netns_inode = netns::inode_of(Path::new(&format!("/proc/{pid}/ns/net"))).ok();
            holders.push(Holder {
                pid,
                comm,
                netns_inode,
                iff,
                vm,
            });
        }
    }
    holders
}

fn read_iff(pid: u32, fd: &str) -> Option<String> {
    let info = std::fs::read_to_string(format!("/proc/{pid}/fdinfo/{fd}")).ok()?;
    info.lines()
        .find_map(|line| line.strip_prefix("iff:"))
        .map(|name| name.trim().to_owned())
}
