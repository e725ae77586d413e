//! Debian packages through apt's own client, without installing them and without touching
//! the host's apt configuration or state: each channel is a private apt root in the cache,
//! configured through its own `APT_CONFIG` file (apt reads that file before anything under
//! `/etc/apt`, so the host's `apt.conf.d` hooks and index targets stay out; `-o` options come
//! too late for that). Its sources copy the host's own Debian entry: the archive address and
//! keyring are read from `/etc/apt/sources.list.d/debian.sources`, never written here.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::cmd;

/// The host's deb822 sources, whose entries the channels copy.
const HOST_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";

/// A set of suites with its own apt root. They are kept apart so that a package in one never
/// shadows the other's (`linux-image-cloud-amd64` is 6.1 in bookworm, 7.2 in sid).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Channel {
    /// The host's own suites (Debian 12: bookworm, bookworm-updates, bookworm-security).
    Stable,
    /// sid and experimental, from the host's main archive.
    Unstable,
    /// Debian 11 (bullseye) and its security suite, from the host's main and security
    /// archives: Linux 5.10.
    Bullseye,
}

impl Channel {
    fn name(self) -> &'static str {
        match self {
            Self::Stable => "stable",
            Self::Unstable => "unstable",
            Self::Bullseye => "bullseye",
        }
    }
}

/// An apt client over one channel's private root.
#[derive(Debug, Clone)]
pub struct Apt {
    root: PathBuf,
    config: PathBuf,
}

impl Apt {
    /// The channel's apt root under `dir`, created and its lists updated when missing, when
    /// the host's sources changed, or when older than a day.
    ///
    /// # Errors
    /// If the host has no Debian entry to copy, or `apt-get update` fails.
    pub fn open(dir: &Path, channel: Channel) -> anyhow::Result<Self> {
        let root = dir.join(channel.name());
        for sub in [
            "lists/partial",
            "cache/archives/partial",
            "state",
            "log",
            "apt.conf.d",
            "sources.list.d",
            "preferences.d",
        ] {
            std::fs::create_dir_all(root.join(sub))
                .with_context(|| format!("creating {}", root.join(sub).display()))?;
        }
        let status = root.join("status");
        if !status.exists() {
            // An empty dpkg status: nothing of the host's installation is consulted.
            std::fs::write(&status, "")?;
        }
        let config = root.join("apt.conf");
        std::fs::write(&config, config_text(&root)?)
            .with_context(|| format!("writing {}", config.display()))?;
        let host = std::fs::read_to_string(HOST_SOURCES)
            .with_context(|| format!("reading {HOST_SOURCES}, the Debian entry to copy"))?;
        let codename = os_codename().context("no VERSION_CODENAME in /etc/os-release")?;
        let sources = sources_list(&host, &codename, channel).with_context(|| {
            format!("no Debian entry (URIs, Suites, Signed-By) in {HOST_SOURCES}")
        })?;
        let list = root.join("sources.list");
        let changed = std::fs::read_to_string(&list).ok().as_deref() != Some(sources.as_str());
        std::fs::write(&list, &sources).with_context(|| format!("writing {}", list.display()))?;
        let apt = Self { root, config };
        let stamp = apt.root.join("updated");
        if changed || stale(&stamp) {
            cmd::run(apt.command("apt-get").args(["update", "-q"]))
                .with_context(|| format!("updating the {} package lists", channel.name()))?;
            std::fs::write(&stamp, "")?;
        }
        Ok(apt)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        command
            .env("APT_CONFIG", &self.config)
            .env("DEBIAN_FRONTEND", "noninteractive");
        command
    }

    /// The versions apt knows of `package`, newest first.
    #[must_use]
    pub fn versions(&self, package: &str) -> Vec<String> {
        let Some(out) = cmd::probe(self.command("apt-cache").args(["madison", package])) else {
            return Vec::new();
        };
        let mut versions: Vec<String> = out
            .lines()
            .filter_map(|line| {
                let mut fields = line.split('|').map(str::trim);
                (fields.next()? == package).then(|| fields.next().map(str::to_owned))?
            })
            .collect();
        versions.sort_by(|a, b| compare_versions(b, a));
        versions.dedup();
        versions
    }

    /// Package names apt knows that start with `prefix`.
    #[must_use]
    pub fn names(&self, prefix: &str) -> Vec<String> {
        cmd::probe(self.command("apt-cache").args(["pkgnames", prefix]))
            .map(|out| out.lines().map(str::to_owned).collect())
            .unwrap_or_default()
    }

    /// The newest version of any package named `prefix` + X where `accept(X)`, as (name,
    /// version), over every version apt lists (not its candidate: experimental's priority
    /// plays no part).
    ///
    /// # Errors
    /// If no such package is known.
    pub fn newest(
        &self,
        prefix: &str,
        accept: impl Fn(&str) -> bool,
    ) -> anyhow::Result<(String, String)> {
        let mut best: Option<(String, String)> = None;
        for name in self.names(prefix) {
            if !name.strip_prefix(prefix).is_some_and(&accept) {
                continue;
            }
            if let Some(version) = self.versions(&name).into_iter().next()
                && best
                    .as_ref()
                    .is_none_or(|(_, v)| compare_versions(&version, v).is_gt())
            {
                best = Some((name, version));
            }
        }
        best.with_context(|| {
            format!(
                "Debian has no {prefix}* package that apt can see ({})",
                self.root.display()
            )
        })
    }

    /// The packages `package` at `version` depends on.
    #[must_use]
    pub fn depends(&self, package: &str, version: &str) -> Vec<String> {
        cmd::probe(
            self.command("apt-cache")
                .args(["show", "--no-all-versions"])
                .arg(format!("{package}={version}")),
        )
        .map(|out| {
            out.lines()
                .filter_map(|line| line.strip_prefix("Depends:"))
                .flat_map(|list| list.split(','))
                .filter_map(|dep| dep.split_whitespace().next().map(str::to_owned))
                .collect()
        })
        .unwrap_or_default()
    }

    /// Fails naming `package` when apt does not know it at `version`.
    ///
    /// # Errors
    /// When it does not.
    pub fn require(&self, package: &str, version: &str) -> anyhow::Result<()> {
        if self.versions(package).iter().any(|v| v == version) {
            Ok(())
        } else {
            bail!("Debian no longer has {package} (= {version})")
        }
    }

    /// Downloads `package` at `version` into `dir` (unless it is there) and returns the
    /// `.deb`'s path.
    ///
    /// # Errors
    /// If apt cannot download it.
    pub fn download(&self, package: &str, version: &str, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        let find = || {
            // apt names the file NAME_VERSION_ARCH.deb, with the epoch's colon escaped.
            let stem = format!("{package}_{}_", version.replace(':', "%3a"));
            std::fs::read_dir(dir)
                .ok()?
                .filter_map(Result::ok)
                .map(|entry| entry.path())
                .find(|path| {
                    path.extension().is_some_and(|ext| ext == "deb")
                        && path
                            .file_name()
                            .and_then(|name| name.to_str())
                            .is_some_and(|name| name.starts_with(&stem))
                })
        };
        if let Some(deb) = find() {
            return Ok(deb);
        }
        // `apt-get download` writes into the current directory.
        cmd::run(
            self.command("apt-get")
                .args(["download", "-q"])
                .arg(format!("{package}={version}"))
                .current_dir(dir),
        )
        .with_context(|| format!("downloading {package} {version}"))?;
        find().with_context(|| {
            format!(
                "apt-get download left no {package} .deb in {}",
                dir.display()
            )
        })
    }
}

/// The private root's apt configuration: every directory apt would read or write is inside
/// `root`; the host's `/etc/apt` is not read at all.
fn config_text(root: &Path) -> anyhow::Result<String> {
    let root = root.to_str().context("the cache path is not UTF-8")?;
    let mut text = String::new();
    for (key, value) in [
        ("Dir::Etc::main", "/dev/null".to_owned()),
        ("Dir::Etc::parts", format!("{root}/apt.conf.d")),
        ("Dir::Etc::sourcelist", format!("{root}/sources.list")),
        // An empty directory: `-` in a configuration file would be a relative path.
        ("Dir::Etc::sourceparts", format!("{root}/sources.list.d")),
        ("Dir::Etc::preferences", format!("{root}/preferences")),
        (
            "Dir::Etc::preferencesparts",
            format!("{root}/preferences.d"),
        ),
        ("Dir::State", format!("{root}/state")),
        ("Dir::State::Lists", format!("{root}/lists")),
        ("Dir::State::status", format!("{root}/status")),
        ("Dir::Cache", format!("{root}/cache")),
        ("Dir::Cache::archives", format!("{root}/cache/archives")),
        ("Dir::Log", format!("{root}/log")),
        ("Acquire::Languages", "none".to_owned()),
        ("Acquire::GzipIndexes", "true".to_owned()),
        // Mirrors that serve a snapshot of the archive serve Release files past their
        // Valid-Until date; the host's own apt configuration accepts them the same way.
        ("Acquire::Check-Valid-Until", "false".to_owned()),
    ] {
        let _ = writeln!(text, "{key} \"{value}\";");
    }
    // As root, apt downloads as its sandbox user `_apt`, which cannot enter a private home
    // directory; other users download as themselves anyway.
    // SAFETY: geteuid has no preconditions and cannot fail.
    if unsafe { libc::geteuid() } == 0 {
        text.push_str("APT::Sandbox::User \"root\";\n");
    }
    Ok(text)
}

/// `VERSION_CODENAME` from `/etc/os-release`: the suite the host's main entry carries.
fn os_codename() -> Option<String> {
    std::fs::read_to_string("/etc/os-release")
        .ok()?
        .lines()
        .find_map(|line| line.strip_prefix("VERSION_CODENAME="))
        .map(|name| name.trim_matches('"').to_owned())
}

/// The channel's sources list, from the host's deb822 `sources` text: for `Stable` a copy
/// of every Debian entry; for `Unstable` sid and experimental from the entry that carries
/// the host's own release (`codename`), i.e. the main archive; for `Bullseye` bullseye from
/// that entry and bullseye-security from the one that carries `<codename>-security`.
fn sources_list(host: &str, codename: &str, channel: Channel) -> Option<String> {
    let mut out = String::new();
    for stanza in host.split("\n\n") {
        let field = |name: &str| {
            stanza.lines().find_map(|line| {
                if line.trim_start().starts_with('#') {
                    return None;
                }
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_owned())
            })
        };
        let (Some(uris), Some(suites), Some(keyring)) =
            (field("URIs"), field("Suites"), field("Signed-By"))
        else {
            continue;
        };
        let components = field("Components").unwrap_or_else(|| "main".to_owned());
        for uri in uris.split_whitespace() {
            match channel {
                Channel::Stable => {
                    for suite in suites.split_whitespace() {
                        let _ =
                            writeln!(out, "deb [signed-by={keyring}] {uri} {suite} {components}");
                    }
                }
                Channel::Unstable => {
                    if suites.split_whitespace().any(|suite| suite == codename) {
                        for suite in ["sid", "experimental"] {
                            let _ = writeln!(out, "deb [signed-by={keyring}] {uri} {suite} main");
                        }
                    }
                }
                Channel::Bullseye => {
                    let security = format!("{codename}-security");
                    for suite in suites.split_whitespace() {
                        let other = if suite == codename {
                            "bullseye"
                        } else if suite == security {
                            "bullseye-security"
                        } else {
                            continue;
                        };
                        let _ = writeln!(out, "deb [signed-by={keyring}] {uri} {other} main");
                    }
                }
            }
        }
    }
    (!out.is_empty()).then_some(out)
}

/// Unpacks the `.deb` at `deb` into `dir` (`dpkg-deb -x`: files only, no scripts run),
/// creating `dir` and its parents first: dpkg-deb makes only the last component.
///
/// # Errors
/// If `dir` cannot be created or dpkg-deb fails.
pub fn unpack(deb: &Path, dir: &Path) -> anyhow::Result<()> {
    std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir))
}

/// Lists older than this are refreshed.
const LISTS_MAX_AGE: std::time::Duration = std::time::Duration::from_hours(24);

/// Whether the lists were last updated (`stamp` written) more than a day ago, or never.
fn stale(stamp: &Path) -> bool {
    std::fs::metadata(stamp)
        .and_then(|meta| meta.modified())
        .map_or(true, |time| {
            time.elapsed().is_ok_and(|age| age > LISTS_MAX_AGE)
        })
}

/// Debian version order (`dpkg --compare-versions`), enough for kernel versions: epoch,
/// then upstream and revision compared by digit runs and the rest, `~` before anything.
#[must_use]
pub fn compare_versions(a: &str, b: &str) -> std::cmp::Ordering {
    let (epoch_a, rest_a) = epoch(a);
    let (epoch_b, rest_b) = epoch(b);
    epoch_a.cmp(&epoch_b).then_with(|| {
        let (up_a, rev_a) = rest_a.rsplit_once('-').unwrap_or((rest_a, ""));
        let (up_b, rev_b) = rest_b.rsplit_once('-').unwrap_or((rest_b, ""));
        compare_part(up_a, up_b).then_with(|| compare_part(rev_a, rev_b))
    })
}

fn epoch(version: &str) -> (u64, &str) {
    match version.split_once(':') {
        Some((epoch, rest)) => (epoch.parse().unwrap_or(0), rest),
        None => (0, version),
    }
}

/// dpkg's `verrevcmp`: alternating non-digit and digit runs; in non-digit runs `~` sorts
/// before everything (even the end), letters before other characters.
fn compare_part(a: &str, b: &str) -> std::cmp::Ordering {
    fn order(c: Option<u8>) -> i32 {
        match c {
            None => 0,
            Some(b'~') => -1,
            Some(c) if c.is_ascii_alphabetic() => i32::from(c),
            Some(c) => i32::from(c) + 256,
        }
    }
    let (mut a, mut b) = (a.as_bytes(), b.as_bytes());
    while !a.is_empty() || !b.is_empty() {
        loop {
            let (ca, cb) = (a.first().copied(), b.first().copied());
            let digit_a = ca.is_none_or(|c| c.is_ascii_digit());
            let digit_b = cb.is_none_or(|c| c.is_ascii_digit());
            if digit_a && digit_b {
                break;
            }
            let (oa, ob) = (
                if digit_a { 0 } else { order(ca) },
                if digit_b { 0 } else { order(cb) },
            );
            if oa != ob {
                return oa.cmp(&ob);
            }
            a = &a[usize::from(!digit_a)..];
            b = &b[usize::from(!digit_b)..];
        }
        let digits = |s: &[u8]| s.iter().take_while(|c| c.is_ascii_digit()).count();
        let (na, nb) = (digits(a), digits(b));
        let value = |s: &[u8]| -> u128 {
            s.iter()
                .fold(0_u128, |n, c| n.saturating_mul(10) + u128::from(c - b'0'))
        };
        match value(&a[..na]).cmp(&value(&b[..nb])) {
            std::cmp::Ordering::Equal => {}
            other => return other,
        }
        a = &a[na..];
        b = &b[nb..];
    }
    std::cmp::Ordering::Equal
}

#[cfg(test)]
mod tests {
    use std::cmp::Ordering;

    use super::*;

    #[test]
    fn versions_compare_as_dpkg_does() {
        assert_eq!(
            compare_versions("6.1.192-3", "6.1.158-1"),
            Ordering::Greater
        );
        assert_eq!(
            compare_versions("6.12.118-1~deb12u1", "6.12.118-1"),
            Ordering::Less
        );
        assert_eq!(compare_versions("7.3~rc7-1~exp1", "7.3-1"), Ordering::Less);
        assert_eq!(
            compare_versions("7.3~rc7-1~exp1", "7.3~rc6-1~exp1"),
            Ordering::Greater
        );
        assert_eq!(compare_versions("1:1.0", "2.0"), Ordering::Greater);
        assert_eq!(compare_versions("6.12.9-1", "6.12.10-1"), Ordering::Less);
        assert_eq!(compare_versions("6.1.0", "6.1.0"), Ordering::Equal);
    }

    const HOST: &str = "Types: deb\n# http://snapshot.debian.org/archive/debian/20250520T000000Z\n\
                        URIs: http://deb.debian.org/debian\n\
                        Suites: bookworm bookworm-updates\nComponents: main\n\
                        Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                        Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                        Suites: bookworm-security\nComponents: main\n\
                        Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";

    #[test]
    fn the_stable_channel_copies_the_hosts_entries() {
        let list = sources_list(HOST, "bookworm", Channel::Stable).expect("entries");
        let key = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]";
        assert_eq!(
            list,
            format!(
                "deb {key} http://deb.debian.org/debian bookworm main\n\
                 deb {key} http://deb.debian.org/debian bookworm-updates main\n\
                 deb {key} http://deb.debian.org/debian-security bookworm-security main\n"
            )
        );
    }

    #[test]
    fn the_unstable_channel_takes_the_main_archive() {
        let list = sources_list(HOST, "bookworm", Channel::Unstable).expect("entries");
        assert_eq!(list.lines().count(), 2);
        assert!(list.contains("http://deb.debian.org/debian sid main"));
        assert!(list.contains("http://deb.debian.org/debian experimental main"));
        assert!(!list.contains("security"));
        assert_eq!(
            sources_list("Types: deb\n", "bookworm", Channel::Stable),
            None
        );
    }

    #[test]
    fn the_bullseye_channel_takes_the_main_and_security_archives() {
        let list = sources_list(HOST, "bookworm", Channel::Bullseye).expect("entries");
        let key = "[signed-by=/usr/share/keyrings/debian-archive-keyring.gpg]";
        assert_eq!(
            list,
            format!(
                "deb {key} http://deb.debian.org/debian bullseye main\n\
                 deb {key} http://deb.debian.org/debian-security bullseye-security main\n"
            )
        );
    }

    #[test]
    fn the_config_keeps_apt_inside_its_root() {
        let text = config_text(Path::new("/c/apt/stable")).expect("UTF-8");
        assert!(text.contains("Dir::Etc::main \"/dev/null\";"));
        assert!(text.contains("Dir::Etc::parts \"/c/apt/stable/apt.conf.d\";"));
        assert!(text.contains("Dir::State::status \"/c/apt/stable/status\";"));
        assert!(!text.contains("/etc/apt"));
    }
}
