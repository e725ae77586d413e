//! The modules whose code tap-probe locates once, at attach: the kprobes on `tun_net_xmit`,
//! `veth_xmit` and the wake functions, and the reader's address ranges that tell a take at
//! `consume_skb`, all come from kallsyms as it was then. A module loaded later (a first
//! tap, a first veth) has no probe on it; one unloaded and loaded again sits at other
//! addresses. Neither can be fixed without attaching again, so each refresh looks whether
//! one of them changed, and says so.
//!
//! A loaded module has a directory `/sys/module/NAME`; a fresh one is made at each load,
//! with a fresh inode number (kernfs numbers its nodes from a cyclic id), so comparing the
//! inode costs one `stat` per module and tells a reload from no change. A built-in driver's
//! directory, where it has one, never changes.

use std::os::unix::fs::MetadataExt as _;
use std::path::{Path, PathBuf};

/// The modules whose functions tap-probe finds in kallsyms: tun/tap and the read path
/// (`tun`, `tap`), veth, and vhost-net's reads and wakes.
const WATCHED: [&str; 4] = ["tun", "tap", "veth", "vhost_net"];

/// How a module changed since attach.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum Change {
    Loaded,
    Unloaded,
    Reloaded,
}

/// A watched module that changed since attach.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct ModuleChange {
    pub module: &'static str,
    pub change: Change,
}

impl std::fmt::Display for ModuleChange {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let change = match self.change {
            Change::Loaded => "loaded",
            Change::Unloaded => "unloaded",
            Change::Reloaded => "reloaded",
        };
        write!(f, "{}.ko {change}", self.module)
    }
}

/// The watched modules as they were at attach.
#[derive(Clone, Debug)]
pub struct Modules {
    dir: PathBuf,
    /// Per watched module: its directory's inode, `None` when not loaded.
    at_attach: Vec<(&'static str, Option<u64>)>,
}

impl Modules {
    /// The modules now, to compare later ones with.
    #[must_use]
    pub fn now() -> Self {
        Self::under(Path::new("/sys/module"))
    }

    /// As [`Modules::now`], with module directories under `dir`.
    fn under(dir: &Path) -> Self {
        Self {
            at_attach: WATCHED.iter().map(|&m| (m, identity(dir, m))).collect(),
            dir: dir.to_owned(),
        }
    }

    /// The watched modules that were loaded, unloaded or reloaded since [`Modules::now`].
    #[must_use]
    pub fn changes(&self) -> Vec<ModuleChange> {
        self.at_attach
            .iter()
            .filter_map(|&(module, then)| {
                let change = match (then, identity(&self.dir, module)) {
                    (None, Some(_)) => Change::Loaded,
                    (Some(_), None) => Change::Unloaded,
                    (Some(a), Some(b)) if a != b => Change::Reloaded,
                    _ => return None,
                };
                Some(ModuleChange { module, change })
            })
            .collect()
    }
}

/// The inode of `dir/module`, `None` when there is no such directory.
fn identity(dir: &Path, module: &str) -> Option<u64> {
    std::fs::metadata(dir.join(module)).ok().map(|m| m.ino())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn loads_unloads_and_reloads_are_told_apart() {
        let dir = tempfile::tempdir().unwrap();
        let path = |m: &str| dir.path().join(m);
        std::fs::create_dir(path("tun")).unwrap();
        std::fs::create_dir(path("tap")).unwrap();
        let modules = Modules::under(dir.path());
        assert_eq!(modules.changes(), []);
        // A reload: a new directory in place of the old one. Made before the old one goes,
        // so the file system cannot hand out the same inode again.
        std::fs::create_dir(path("tun.new")).unwrap();
        std::fs::remove_dir(path("tun")).unwrap();
        std::fs::rename(path("tun.new"), path("tun")).unwrap();
        std::fs::create_dir(path("veth")).unwrap();
        std::fs::remove_dir(path("tap")).unwrap();
        let changes: Vec<String> = modules.changes().iter().map(ToString::to_string).collect();
        assert_eq!(
            changes,
            ["tun.ko reloaded", "tap.ko unloaded", "veth.ko loaded"]
        );
    }
}
