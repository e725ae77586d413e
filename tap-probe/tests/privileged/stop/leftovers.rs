//! What a run could leave behind, and the checks that it left none of it: processes (the
//! command and everything under it, by PID), BPF programs and links (listed through bpf(2)),
//! network namespaces, the host's devices and qdiscs.
//!
//! The test process is a child subreaper (`PR_SET_CHILD_SUBREAPER`): a process a command
//! left behind is handed to the test when the command exits, not to init, so it is found
//! however it was started.

use std::collections::BTreeSet;
use std::time::{Duration, Instant};

use tap_probe_observer::bpf::loaded;

/// Makes the test process the subreaper of everything it starts.
pub(crate) fn subreaper() {
    nix::sys::prctl::set_child_subreaper(true).expect("PR_SET_CHILD_SUBREAPER");
}

/// A process: its PID and start time (a PID can be reused, the pair cannot), its name.
#[derive(Clone, Debug, PartialEq, Eq, PartialOrd, Ord)]
pub(crate) struct Process {
    pub(crate) pid: u32,
    start: u64,
    pub(crate) comm: String,
}

/// Every process, with its parent and whether it is a zombie (ended, not yet reaped).
fn processes() -> Vec<(Process, u32, bool)> {
    let mut all = Vec::new();
    for entry in std::fs::read_dir("/proc").unwrap().flatten() {
        let Some(pid) = entry
            .file_name()
            .to_str()
            .and_then(|n| n.parse::<u32>().ok())
        else {
            continue;
        };
        if let Some(process) = process(pid) {
            all.push(process);
        }
    }
    all
}

/// `/proc/PID/stat`: the name in parentheses, then state (field 3), ppid (4), start time
/// (22).
fn process(pid: u32) -> Option<(Process, u32, bool)> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).ok()?;
    let (head, rest) = stat.rsplit_once(')')?;
    let comm = head.split_once('(')?.1.to_owned();
    let fields: Vec<&str> = rest.split_whitespace().collect();
    let (state, parent, started) = (fields[0], fields[1].parse().ok()?, fields[19].parse().ok()?);
    Some((
        Process {
            pid,
            start: started,
            comm,
        },
        parent,
        state == "Z",
    ))
}

/// Whether `process` still runs (a zombie runs nothing).
fn alive(process: &Process) -> bool {
    self::process(process.pid).is_some_and(|(now, _, zombie)| now.start == process.start && !zombie)
}

/// What a running command holds: itself and the processes under it, and the BPF programs
/// and links they have open.
#[derive(Debug, Default)]
pub(crate) struct Held {
    pub(crate) processes: Vec<Process>,
    pub(crate) programs: BTreeSet<u32>,
    pub(crate) links: BTreeSet<u32>,
}

impl Held {
    /// What `root` and its descendants hold now (`/proc/PID/fdinfo`: a program's and a
    /// link's descriptors say `prog_id:`, a link's also `link_id:`).
    pub(crate) fn of(root: u32) -> Self {
        let all = processes();
        let mut held = Self {
            processes: all
                .iter()
                .filter(|(p, _, _)| p.pid == root)
                .map(|(p, _, _)| p.clone())
                .collect(),
            ..Self::default()
        };
        let mut at = 0;
        while at < held.processes.len() {
            let parent = held.processes[at].pid;
            for (process, ppid, _) in &all {
                if *ppid == parent && !held.processes.contains(process) {
                    held.processes.push(process.clone());
                }
            }
            at += 1;
        }
        for process in &held.processes {
            let Ok(fds) = std::fs::read_dir(format!("/proc/{}/fdinfo", process.pid)) else {
                continue;
            };
            for fd in fds.flatten() {
                let info = std::fs::read_to_string(fd.path()).unwrap_or_default();
                for line in info.lines() {
                    let id = |key: &str| line.strip_prefix(key).and_then(|v| v.trim().parse().ok());
                    if let Some(id) = id("prog_id:") {
                        held.programs.insert(id);
                    }
                    if let Some(id) = id("link_id:") {
                        held.links.insert(id);
                    }
                }
            }
        }
        held
    }

    /// Whether one of the processes is called `comm` (as the kernel keeps it: 15 bytes).
    pub(crate) fn has(&self, comm: &str) -> bool {
        self.processes
            .iter()
            .any(|p| comm.starts_with(&p.comm) && !p.comm.is_empty())
    }

    /// After the command's exit: none of its processes runs, none of its programs is still
    /// loaded, and no link attaches one. Each gets a bounded moment: a process the kernel
    /// kills when its parent dies (`PR_SET_PDEATHSIG`) takes a little while to go, and the
    /// kernel frees a program after its last reference through a work queue
    /// (`bpf_prog_put`).
    pub(crate) fn assert_gone(&self, what: &str) {
        let deadline = Instant::now() + Duration::from_secs(2);
        loop {
            let left: Vec<&Process> = self.processes.iter().filter(|p| alive(p)).collect();
            if left.is_empty() {
                break;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: processes left running: {left:?}"
            );
            std::thread::sleep(Duration::from_millis(20));
        }
        let deadline = Instant::now() + Duration::from_secs(5);
        loop {
            let programs: Vec<loaded::Program> = loaded::programs()
                .expect("listing programs (bpf(2))")
                .into_iter()
                .filter(|p| self.programs.contains(&p.id))
                .collect();
            let links: Vec<loaded::BpfLink> = loaded::links()
                .expect("listing links (bpf(2))")
                .into_iter()
                .filter(|l| self.links.contains(&l.id) || self.programs.contains(&l.program))
                .collect();
            if programs.is_empty() && links.is_empty() {
                return;
            }
            assert!(
                Instant::now() < deadline,
                "{what}: its BPF objects are still there: programs {programs:?}, links {links:?}"
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// What runs make that outlives a process unless removed: named network namespaces, and
/// the host's own devices and qdiscs.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Host {
    netns: BTreeSet<String>,
    devices: BTreeSet<String>,
    qdiscs: BTreeSet<String>,
}

impl Host {
    pub(crate) fn now() -> Self {
        let names = |dir: &str| -> BTreeSet<String> {
            std::fs::read_dir(dir)
                .map(|d| {
                    d.flatten()
                        .filter_map(|e| e.file_name().into_string().ok())
                        .collect()
                })
                .unwrap_or_default()
        };
        let tc = std::process::Command::new("tc")
            .args(["qdisc", "show"])
            .output()
            .expect("tc (iproute2) runs");
        Self {
            netns: names("/run/netns"),
            devices: names("/sys/class/net"),
            qdiscs: String::from_utf8_lossy(&tc.stdout)
                .lines()
                .map(str::to_owned)
                .collect(),
        }
    }

    /// Nothing was added (what went away meanwhile is none of the run's business).
    pub(crate) fn assert_nothing_added(&self, what: &str) {
        let now = Self::now();
        let added = |before: &BTreeSet<String>, after: &BTreeSet<String>| -> Vec<String> {
            after.difference(before).cloned().collect()
        };
        assert!(
            added(&self.netns, &now.netns).is_empty()
                && added(&self.devices, &now.devices).is_empty()
                && added(&self.qdiscs, &now.qdiscs).is_empty(),
            "{what} left behind: namespaces {:?}, devices {:?}, qdiscs {:?}",
            added(&self.netns, &now.netns),
            added(&self.devices, &now.devices),
            added(&self.qdiscs, &now.qdiscs)
        );
    }
}

/// No process that the test did not start itself runs as its child: a command's leftover
/// would have been handed to it ([`subreaper`]). Those found are ended before the test
/// fails; ended ones (a QEMU its kernel killed when its owner died) are reaped.
pub(crate) fn assert_no_strays(started: &[u32]) {
    let me = std::process::id();
    let mut strays = Vec::new();
    for (process, ppid, zombie) in processes() {
        if ppid != me || started.contains(&process.pid) {
            continue;
        }
        let pid = nix::unistd::Pid::from_raw(i32::try_from(process.pid).unwrap());
        if !zombie {
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGKILL);
            strays.push(process);
        }
        let _ = nix::sys::wait::waitpid(pid, None);
    }
    assert!(strays.is_empty(), "processes left behind: {strays:?}");
}
