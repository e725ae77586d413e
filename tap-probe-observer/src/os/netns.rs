//! Network namespaces: naming them the way `ip netns` does, running code inside one, and
//! listing every namespace on the host.
//!
//! A network namespace is identified across the whole host by the inode number of its nsfs
//! file (`/proc/PID/ns/net`); the kernel's `net->ns.inum` is the same number, which is what
//! the eBPF side records in [`tap_probe_common::DeviceKey::netns_inode`].

use std::collections::HashSet;
use std::fs::{File, OpenOptions};
use std::io::ErrorKind;
use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

use anyhow::{Context as _, Result, anyhow, bail};
use nix::errno::Errno;
use nix::mount::{MntFlags, MsFlags};
use nix::sched::CloneFlags;

/// Where `ip netns` keeps its bind mounts (iproute2 `NETNS_RUN_DIR`).
pub(crate) const NETNS_RUN_DIR: &str = "/run/netns";

/// The inode of the calling thread's network namespace; equals the kernel's `net->ns.inum`.
///
/// `thread-self`, not `self`: namespaces are per thread, and [`run_in`] moves threads.
///
/// # Errors
/// When `/proc` is not mounted.
pub(crate) fn current_inode() -> Result<u32> {
    inode_of(Path::new("/proc/thread-self/ns/net"))
}

/// The namespace inode behind a namespace file (`/proc/PID/ns/net`, `/run/netns/NAME`).
///
/// # Errors
/// When the file cannot be read.
pub fn inode_of(path: &Path) -> Result<u32> {
    let meta = std::fs::metadata(path)
        .with_context(|| format!("cannot stat network namespace file {}", path.display()))?;
    // nsfs inode numbers are allocated from a 32-bit IDA (`ns_alloc_inum` in fs/nsfs.c).
    u32::try_from(meta.ino()).map_err(|_| {
        anyhow!(
            "{} has inode {} which does not fit 32 bits",
            path.display(),
            meta.ino()
        )
    })
}

/// Whether `path` is a mounted namespace file rather than, say, the empty placeholder file
/// left behind by an `ip netns add` that died half way.
fn is_nsfs(path: &Path) -> bool {
    nix::sys::statfs::statfs(path)
        .is_ok_and(|fs| fs.filesystem_type() == nix::sys::statfs::NSFS_MAGIC)
}

/// Runs `f` on a scoped thread that first joined the network namespace at `ns_path`
/// (`/run/netns/NAME` or `/proc/PID/ns/net`). Sockets and tun fds opened by `f` belong to
/// that namespace for their whole life, even after the thread ends.
///
/// A fresh thread is used because `setns` changes only the calling thread and there is no
/// reliable way back if anything fails half way; the caller's own thread is never moved.
///
/// # Errors
/// When the namespace cannot be opened or joined, or whatever `f` returns. A panic in `f` is
/// propagated to the caller.
pub fn run_in<T: Send>(ns_path: &Path, f: impl FnOnce() -> Result<T> + Send) -> Result<T> {
    let ns = File::open(ns_path)
        .with_context(|| format!("cannot open network namespace {}", ns_path.display()))?;
    let joined = std::thread::scope(|scope| {
        scope
            .spawn(move || {
                nix::sched::setns(&ns, CloneFlags::CLONE_NEWNET).with_context(|| {
                    format!(
                        "cannot join network namespace {} (setns needs CAP_SYS_ADMIN)",
                        ns_path.display()
                    )
                })?;
                f()
            })
            .join()
    });
    match joined {
        Ok(result) => result,
        Err(panic) => std::panic::resume_unwind(panic),
    }
}

/// A named network namespace (`/run/netns/NAME`), created like `ip netns add NAME` and
/// deleted like `ip netns delete NAME` when dropped.
#[derive(Debug)]
pub struct NamedNetns {
    name: String,
    path: PathBuf,
    inode: u32,
}

impl NamedNetns {
    /// Creates the namespace `name`, visible to `ip netns list`.
    ///
    /// # Errors
    /// When the name is invalid or taken, or the caller lacks `CAP_SYS_ADMIN`.
    pub fn create(name: &str) -> Result<Self> {
        validate_name(name)?;
        prepare_run_dir()?;
        let path = Path::new(NETNS_RUN_DIR).join(name);
        // O_EXCL: never take over a namespace somebody else named.
        OpenOptions::new().write(true).create_new(true).open(&path).map_err(|err| {
            if err.kind() == ErrorKind::AlreadyExists {
                anyhow!("network namespace {name} already exists ({}); delete it with `ip netns delete {name}`", path.display())
            } else {
                anyhow!("cannot create {}: {err}", path.display())
            }
        })?;
        // From here on the guard owns the file, so any failure below cleans it up.
        let mut ns = Self {
            name: name.to_owned(),
            path,
            inode: 0,
        };
        ns.inode = bind_new_netns(&ns.path)?;
        Ok(ns)
    }

    #[must_use]
    pub fn name(&self) -> &str {
        &self.name
    }

    #[must_use]
    pub fn path(&self) -> &Path {
        &self.path
    }

    #[must_use]
    pub fn inode(&self) -> u32 {
        self.inode
    }
}

impl Drop for NamedNetns {
    fn drop(&mut self) {
        if let Err(err) = delete_path(&self.path) {
            log::error!("cannot delete network namespace {}: {err:#}", self.name);
        }
    }
}

fn delete_path(path: &Path) -> Result<()> {
    // MNT_DETACH, as iproute2 does: the namespace file may be open elsewhere (a running
    // `tap-probe watch` holding an rtnetlink socket opened through it).
    match nix::mount::umount2(path, MntFlags::MNT_DETACH) {
        // EINVAL: not a mount point (already unmounted, or the bind never happened).
        Ok(()) | Err(Errno::EINVAL | Errno::ENOENT) => {}
        Err(err) => return Err(anyhow!("cannot unmount {}: {err}", path.display())),
    }
    match std::fs::remove_file(path) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == ErrorKind::NotFound => Ok(()),
        Err(err) => Err(anyhow!("cannot remove {}: {err}", path.display())),
    }
}

fn validate_name(name: &str) -> Result<()> {
    if name.is_empty() || name == "." || name == ".." || name.contains('/') || name.contains('\0') {
        bail!("invalid network namespace name {name:?}: must be a plain file name");
    }
    Ok(())
}

/// Makes `/run/netns` exist and be a shared mount, as `netns_add` in iproute2's
/// `ip/ipnetns.c` does, so that namespaces named here are visible in other mount namespaces
/// (and theirs here).
fn prepare_run_dir() -> Result<()> {
    let dir = Path::new(NETNS_RUN_DIR);
    std::fs::create_dir_all(dir).with_context(|| format!("cannot create {NETNS_RUN_DIR}"))?;
    let make_shared = || {
        nix::mount::mount(
            None::<&str>,
            dir,
            Some("none"),
            MsFlags::MS_SHARED | MsFlags::MS_REC,
            None::<&str>,
        )
    };
    match make_shared() {
        Ok(()) => Ok(()),
        // EINVAL: not a mount point yet. Bind it onto itself, then retry (what ip does).
        Err(Errno::EINVAL) => {
            nix::mount::mount(
                Some(dir),
                dir,
                Some("none"),
                MsFlags::MS_BIND | MsFlags::MS_REC,
                None::<&str>,
            )
            .with_context(|| {
                format!("cannot bind-mount {NETNS_RUN_DIR} onto itself (needs CAP_SYS_ADMIN)")
            })?;
            make_shared().with_context(|| format!("cannot make {NETNS_RUN_DIR} a shared mount"))
        }
        Err(err) => Err(anyhow!(
            "cannot make {NETNS_RUN_DIR} a shared mount: {err} (needs CAP_SYS_ADMIN)"
        )),
    }
}

/// Creates a namespace on a throwaway thread and pins it by bind-mounting the thread's
/// namespace file onto `target`. The bind mount is what keeps the namespace alive after
/// the thread exits. Returns the new namespace's inode.
fn bind_new_netns(target: &Path) -> Result<u32> {
    let owned = target.to_owned();
    let pinned = std::thread::spawn(move || -> Result<()> {
        nix::sched::unshare(CloneFlags::CLONE_NEWNET).context(
            "cannot create a network namespace: unshare(CLONE_NEWNET) failed (needs CAP_SYS_ADMIN)",
        )?;
        nix::mount::mount(
            Some("/proc/thread-self/ns/net"),
            &owned,
            Some("none"),
            MsFlags::MS_BIND,
            None::<&str>,
        )
        .with_context(|| {
            format!(
                "cannot bind-mount the new network namespace onto {}",
                owned.display()
            )
        })
    })
    .join();
    match pinned {
        Ok(result) => result?,
        Err(panic) => std::panic::resume_unwind(panic),
    }
    // Read the inode through the mount rather than on the thread: this also proves the
    // bind took.
    if !is_nsfs(target) {
        bail!(
            "{} is not a namespace file after the bind mount",
            target.display()
        );
    }
    inode_of(target)
}

/// A network namespace found on the host.
#[derive(Debug, Clone, PartialEq, Eq, serde::Serialize)]
pub struct NetnsInfo {
    pub(crate) inode: u32,
    /// `init` for the initial namespace, the file name for `/run/netns` entries, `pid:N`
    /// for namespaces only held by processes.
    pub(crate) name: String,
    /// A file that refers to the namespace, usable with [`run_in`].
    pub(crate) path: PathBuf,
}

/// Every network namespace on the host that has a name or a process in it, deduplicated by
/// inode: the initial one (`init`, the namespace of pid 1) first, then the named ones from
/// `/run/netns`, then the rest by lowest pid.
///
/// Namespaces held only by an open fd or a socket (no process inside, no name) are not
/// found; neither are ones only a non-main thread of a process has joined.
///
/// # Errors
/// When `/proc` cannot be read. Processes that exit mid-scan are skipped.
pub fn list() -> Result<Vec<NetnsInfo>> {
    let mut seen = HashSet::new();
    let mut out = Vec::new();
    let mut push = |inode: u32, name: String, path: PathBuf| {
        if seen.insert(inode) {
            out.push(NetnsInfo { inode, name, path });
        }
    };

    let (init_inode, init) = initial_netns()?;
    push(init_inode, "init".to_owned(), init);

    for (name, path) in named_entries()? {
        // A stale placeholder file (not a mount) would give a tmpfs inode: skip it.
        if !is_nsfs(&path) {
            continue;
        }
        if let Ok(inode) = inode_of(&path) {
            push(inode, name, path);
        }
    }

    for pid in crate::os::procfs::pids()? {
        let path = PathBuf::from(format!("/proc/{pid}/ns/net"));
        // Vanished processes (ENOENT) and kernel threads we cannot inspect are skipped.
        if let Ok(inode) = inode_of(&path) {
            push(inode, format!("pid:{pid}"), path);
        }
    }
    Ok(out)
}

/// The initial namespace: pid 1's. Some sandboxes make pid 1 non-dumpable, which hides
/// its namespace files even from root; kthreadd (pid 2) is then used, as kernel threads
/// always live in `init_net`.
fn initial_netns() -> Result<(u32, PathBuf)> {
    let mut last = None;
    for path in ["/proc/1/ns/net", "/proc/2/ns/net"] {
        match inode_of(Path::new(path)) {
            Ok(inode) => return Ok((inode, PathBuf::from(path))),
            Err(err) => last = Some(err),
        }
    }
    Err(last.unwrap_or_else(|| anyhow!("no candidate")))
        .context("cannot find the initial network namespace in /proc/1/ns/net or /proc/2/ns/net (is /proc mounted, are we root?)")
}

/// `/run/netns` entries sorted by name; none when the directory does not exist.
fn named_entries() -> Result<Vec<(String, PathBuf)>> {
    let dir = match std::fs::read_dir(NETNS_RUN_DIR) {
        Ok(dir) => dir,
        Err(err) if err.kind() == ErrorKind::NotFound => return Ok(Vec::new()),
        Err(err) => return Err(anyhow!("cannot list {NETNS_RUN_DIR}: {err}")),
    };
    let mut entries: Vec<(String, PathBuf)> = dir
        .filter_map(std::result::Result::ok)
        .filter_map(|entry| Some((entry.file_name().into_string().ok()?, entry.path())))
        .collect();
    entries.sort();
    Ok(entries)
}

#[cfg(all(test, feature = "privileged-tests"))]
mod privileged_tests {
    use super::*;

    #[test]
    fn named_netns_lifecycle() {
        if !tap_probe_verdict::root() {
            return;
        }
        let name = format!("tp-test-netns-{}", std::process::id());
        let ns = NamedNetns::create(&name).unwrap();
        assert_ne!(ns.inode(), current_inode().unwrap());
        assert!(
            NamedNetns::create(&name)
                .unwrap_err()
                .to_string()
                .contains("already exists")
        );
        // Code run inside sees the namespace's inode; the caller's thread is not moved.
        let inside = run_in(ns.path(), current_inode).unwrap();
        assert_eq!(inside, ns.inode());
        assert_ne!(current_inode().unwrap(), ns.inode());

        let listed = list().unwrap();
        assert_eq!(listed[0].name, "init");
        let entry = listed.iter().find(|n| n.inode == ns.inode()).unwrap();
        assert_eq!(entry.name, name);
        let mut inodes: Vec<u32> = listed.iter().map(|n| n.inode).collect();
        inodes.sort_unstable();
        inodes.dedup();
        assert_eq!(
            inodes.len(),
            listed.len(),
            "list() must not repeat a namespace"
        );

        let path = ns.path().to_owned();
        drop(ns);
        assert!(!path.exists());
        assert!(!list().unwrap().iter().any(|n| n.name == name));
    }

    #[test]
    fn run_in_propagates_errors() {
        if !tap_probe_verdict::root() {
            return;
        }
        let err = run_in(Path::new("/nonexistent/ns"), || Ok(())).unwrap_err();
        assert!(err.to_string().contains("/nonexistent/ns"), "{err}");
        let name = format!("tp-test-runin-{}", std::process::id());
        let ns = NamedNetns::create(&name).unwrap();
        let err = run_in(ns.path(), || -> Result<()> { bail!("inner failure") }).unwrap_err();
        assert_eq!(err.to_string(), "inner failure");
        drop(ns);
    }
}
