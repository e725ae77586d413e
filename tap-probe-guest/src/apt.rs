//! Debian packages through apt's own client, without installing them and without touching
//! the host's apt configuration. Suites the host already lists (bookworm and
//! bookworm-security for its own kernels) are read through the host's lists; other suites
//! (experimental and sid, where Linux 7.3 is) through a private sources list and lists
//! directory in the cache, with the archive address and keyring copied from the host's own
//! Debian entry.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::cmd;

/// Where the host's deb822 sources live; the first entry whose URI serves Debian's main
/// archive (not the security one) gives the address and keyring for the private list.
const HOST_SOURCES: &str = "/etc/apt/sources.list.d/debian.sources";

/// An apt client: the host's configuration, or a private one.
#[derive(Debug, Clone)]
pub struct Apt {
    /// `-o` options that point apt at a private configuration; empty for the host's.
    options: Vec<String>,
    /// The private list's directory, for messages.
    private: Option<PathBuf>,
}

impl Apt {
    /// The host's own apt configuration.
    #[must_use]
    pub fn host() -> Self {
        Self {
            options: Vec::new(),
            private: None,
        }
    }

    /// A private apt for `suites` of the host's Debian archive, its state under `dir`.
    /// Updates its lists when they are missing or older than a day.
    ///
    /// # Errors
    /// If the host has no Debian archive entry to copy, or `apt-get update` fails.
    pub fn private(dir: &Path, suites: &[&str]) -> anyhow::Result<Self> {
        let lists = dir.join("lists");
        let cache = dir.join("cache");
        std::fs::create_dir_all(lists.join("partial"))
            .with_context(|| format!("creating {}", lists.display()))?;
        std::fs::create_dir_all(cache.join("archives/partial"))
            .with_context(|| format!("creating {}", cache.display()))?;
        let host = std::fs::read_to_string(HOST_SOURCES).with_context(|| {
            format!("reading {HOST_SOURCES}, whose Debian archive entry the private list copies")
        })?;
        let (uri, keyring) = debian_archive(&host).with_context(|| {
            format!("no Debian archive entry (URIs, Signed-By) in {HOST_SOURCES}")
        })?;
        let list = dir.join("sources.list");
        let mut text = String::new();
        for suite in suites {
            let _ = writeln!(text, "deb [signed-by={keyring}] {uri} {suite} main");
        }
        let changed = std::fs::read_to_string(&list).ok().as_deref() != Some(text.as_str());
        std::fs::write(&list, &text).with_context(|| format!("writing {}", list.display()))?;
        let apt = Self {
            options: vec![
                format!("Dir::Etc::sourcelist={}", list.display()),
                "Dir::Etc::sourceparts=-".to_owned(),
                format!("Dir::State::Lists={}", lists.display()),
                format!("Dir::Cache={}", cache.display()),
                // The host's dpkg status is read, never written; no lock on it is needed.
                "Debug::NoLocking=1".to_owned(),
            ],
            private: Some(dir.to_path_buf()),
        };
        if changed || stale(&lists) {
            cmd::run(apt.command("apt-get").args(["update", "-q"]))
                .context("updating the private apt lists")?;
        }
        Ok(apt)
    }

    fn command(&self, program: &str) -> Command {
        let mut command = Command::new(program);
        for option in &self.options {
            command.arg("-o").arg(option);
        }
        command.env("DEBIAN_FRONTEND", "noninteractive");
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

    /// What `package`'s candidate version depends on (`apt-cache depends`).
    #[must_use]
    pub fn depends(&self, package: &str) -> Vec<String> {
        cmd::probe(self.command("apt-cache").args(["depends", package]))
            .map(|out| {
                out.lines()
                    .filter_map(|line| line.trim().strip_prefix("Depends:"))
                    .map(|name| name.trim().trim_matches(['<', '>']).to_owned())
                    .collect()
            })
            .unwrap_or_default()
    }

    /// Updates the host's lists (when they do not know a package the host's suites have).
    ///
    /// # Errors
    /// If `apt-get update` fails (it needs root).
    pub fn update(&self) -> anyhow::Result<()> {
        cmd::run(self.command("apt-get").args(["update", "-q"]))
    }

    /// Downloads `package` at `version` into `dir` and returns the `.deb`'s path.
    ///
    /// # Errors
    /// If apt cannot download it.
    pub fn download(&self, package: &str, version: &str, dir: &Path) -> anyhow::Result<PathBuf> {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
        // `apt-get download` writes into the current directory.
        cmd::run(
            self.command("apt-get")
                .args(["download", "-q"])
                .arg(format!("{package}={version}"))
                .current_dir(dir),
        )
        .with_context(|| match &self.private {
            Some(private) => format!(
                "downloading {package} {version} (private apt state in {})",
                private.display()
            ),
            None => format!("downloading {package} {version}"),
        })?;
        std::fs::read_dir(dir)?
            .filter_map(Result::ok)
            .map(|entry| entry.path())
            .find(|path| {
                path.extension().is_some_and(|ext| ext == "deb")
                    && path
                        .file_name()
                        .and_then(|name| name.to_str())
                        .is_some_and(|name| name.starts_with(&format!("{package}_")))
            })
            .with_context(|| {
                format!(
                    "apt-get download left no {package} .deb in {}",
                    dir.display()
                )
            })
    }
}

/// Unpacks the `.deb` at `deb` into `dir` (`dpkg-deb -x`: files only, no scripts run).
///
/// # Errors
/// If dpkg-deb fails.
pub fn unpack(deb: &Path, dir: &Path) -> anyhow::Result<()> {
    cmd::run(Command::new("dpkg-deb").arg("-x").arg(deb).arg(dir))
}

/// Lists older than this are refreshed.
const LISTS_MAX_AGE: std::time::Duration = std::time::Duration::from_hours(24);

fn stale(lists: &Path) -> bool {
    let newest = std::fs::read_dir(lists)
        .into_iter()
        .flatten()
        .filter_map(Result::ok)
        .filter(|entry| entry.file_name().to_string_lossy().ends_with("_Packages"))
        .filter_map(|entry| entry.metadata().ok()?.modified().ok())
        .max();
    newest.is_none_or(|time| time.elapsed().is_ok_and(|age| age > LISTS_MAX_AGE))
}

/// The URI and keyring of the main Debian archive in deb822 `sources` text.
fn debian_archive(sources: &str) -> Option<(String, String)> {
    sources.split("\n\n").find_map(|stanza| {
        let field = |name: &str| {
            stanza.lines().find_map(|line| {
                let (key, value) = line.split_once(':')?;
                (key.trim() == name).then(|| value.trim().to_owned())
            })
        };
        let uri = field("URIs")?;
        let suites = field("Suites")?;
        // The security archive serves only `<suite>-security`.
        if suites
            .split_whitespace()
            .all(|suite| suite.ends_with("-security"))
        {
            return None;
        }
        Some((
            uri.split_whitespace().next()?.to_owned(),
            field("Signed-By")?,
        ))
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

/// Fails with a message naming `package` when apt knows no version of it.
///
/// # Errors
/// When `versions` is empty.
pub fn newest(package: &str, versions: &[String], where_: &str) -> anyhow::Result<String> {
    match versions.first() {
        Some(version) => Ok(version.clone()),
        None => bail!(
            "Debian no longer has (or apt does not know) {package} in {where_}; give a kernel \
             with --kernel PATH instead"
        ),
    }
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

    #[test]
    fn the_main_archive_entry_is_found() {
        let sources = "Types: deb\nURIs: http://deb.debian.org/debian\n\
                       Suites: bookworm bookworm-updates\nComponents: main\n\
                       Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n\n\
                       Types: deb\nURIs: http://deb.debian.org/debian-security\n\
                       Suites: bookworm-security\nComponents: main\n\
                       Signed-By: /usr/share/keyrings/debian-archive-keyring.gpg\n";
        assert_eq!(
            debian_archive(sources),
            Some((
                "http://deb.debian.org/debian".to_owned(),
                "/usr/share/keyrings/debian-archive-keyring.gpg".to_owned()
            ))
        );
        assert_eq!(debian_archive("Types: deb\n"), None);
    }
}
