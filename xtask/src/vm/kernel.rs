//! The guest kernel: Debian 12's cloud kernel, fetched with apt and unpacked into the cache,
//! and the modules the tests need, with their dependencies, in load order.
//!
//! Debian's package ships no `modules.dep` (its postinst runs depmod), so dependencies are
//! read from each module's `.modinfo` section (`depends=a,b`), as depmod itself does.

use std::collections::{BTreeSet, HashMap};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

use super::elf;
use crate::cmd;

/// The metapackage that depends on the newest `linux-image-6.1.0-NN-cloud-amd64`.
const METAPACKAGE: &str = "linux-image-cloud-amd64";

/// Written into an unpacked kernel's directory once unpacking finished, so that a run that
/// died half way is not mistaken for a cached kernel.
const COMPLETE: &str = ".complete";

/// An unpacked kernel package.
#[derive(Debug)]
pub struct Kernel {
    /// The kernel release (`uname -r`), e.g. `6.1.0-57-cloud-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>` in the unpacked package.
    modules_dir: PathBuf,
}

/// A module to load in the guest.
#[derive(Debug)]
pub struct Module {
    pub name: String,
    /// The uncompressed module on the host.
    pub host_path: PathBuf,
    /// Where it goes in the guest (`/lib/modules/<release>/...`, uncompressed).
    pub guest_path: String,
}

/// Whether the kernel came from the cache or was downloaded.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Source {
    Cached,
    Downloaded,
}

/// Finds the newest cloud kernel package apt knows, and downloads and unpacks it into
/// `cache` unless it is there already. Without apt's answer (no network, no lists), the
/// newest kernel already in the cache is used.
///
/// # Errors
/// If no kernel is cached and none can be downloaded.
pub fn fetch(cache: &Path) -> anyhow::Result<(Kernel, Source)> {
    std::fs::create_dir_all(cache).with_context(|| format!("creating {}", cache.display()))?;
    let package = package(cache)?;
    let dir = cache.join(&package);
    let source = if dir.join(COMPLETE).exists() {
        Source::Cached
    } else {
        download(cache, &package, &dir)?;
        Source::Downloaded
    };
    Ok((open(&dir)?, source))
}

/// The newest kernel package apt knows (updating its lists if it knows none), else the
/// newest cached one.
fn package(cache: &Path) -> anyhow::Result<String> {
    if let Some(package) = newest_package() {
        return Ok(package);
    }
    eprintln!("xtask vm: apt does not know {METAPACKAGE}; running apt-get update");
    let updated = cmd::run(
        cmd::new("apt-get")
            .args(["update", "-q"])
            .env("DEBIAN_FRONTEND", "noninteractive"),
    );
    if let Some(package) = newest_package() {
        return Ok(package);
    }
    let cached = newest_cached(cache).with_context(|| {
        format!(
            "cannot find the package {METAPACKAGE} depends on, and no kernel is cached in {}{}",
            cache.display(),
            updated.err().map_or_else(String::new, |err| format!(
                " (apt-get update: {err:#}; it needs root)"
            ))
        )
    })?;
    eprintln!("xtask vm: using the cached {cached}");
    Ok(cached)
}

/// The package the metapackage's candidate version depends on.
fn newest_package() -> Option<String> {
    let out = cmd::probe(cmd::new("apt-cache").args(["depends", METAPACKAGE]))?;
    image_package(&out)
}

/// The kernel image package in `apt-cache depends` output.
fn image_package(depends: &str) -> Option<String> {
    depends.lines().find_map(|line| {
        let name = line.trim().strip_prefix("Depends:")?.trim();
        let name = name.trim_start_matches('<').trim_end_matches('>');
        (name.starts_with("linux-image-") && name.ends_with("-cloud-amd64"))
            .then(|| name.to_owned())
    })
}

/// The newest completely unpacked kernel in the cache, by ABI number.
fn newest_cached(cache: &Path) -> Option<String> {
    std::fs::read_dir(cache)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join(COMPLETE).exists())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter_map(|name| Some((abi_number(&name)?, name)))
        .max()
        .map(|(_, name)| name)
}

/// `57` in `linux-image-6.1.0-57-cloud-amd64`.
fn abi_number(package: &str) -> Option<u32> {
    package
        .strip_prefix("linux-image-")?
        .split('-')
        .nth(1)?
        .parse()
        .ok()
}

fn download(cache: &Path, package: &str, dir: &Path) -> anyhow::Result<()> {
    let staging = cache.join(format!("{package}.partial"));
    remove_dir_if_exists(&staging)?;
    remove_dir_if_exists(dir)?;
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    // `apt-get download` writes into the current directory.
    cmd::run(
        cmd::new("apt-get")
            .args(["download", "-q", package])
            .current_dir(&staging),
    )?;
    let deb = std::fs::read_dir(&staging)?
        .filter_map(Result::ok)
        .map(|entry| entry.path())
        .find(|path| path.extension().is_some_and(|ext| ext == "deb"))
        .with_context(|| format!("apt-get download left no .deb in {}", staging.display()))?;
    let root = staging.join("root");
    cmd::run(cmd::new("dpkg-deb").arg("-x").arg(&deb).arg(&root))?;
    std::fs::rename(&root, dir)
        .with_context(|| format!("moving {} to {}", root.display(), dir.display()))?;
    std::fs::write(dir.join(COMPLETE), format!("{}\n", deb.display()))?;
    // The unpacked tree is the cache; the .deb is not needed again.
    remove_dir_if_exists(&staging)
}

fn remove_dir_if_exists(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

fn open(dir: &Path) -> anyhow::Result<Kernel> {
    let modules = dir.join("lib/modules");
    let release = std::fs::read_dir(&modules)
        .with_context(|| format!("reading {}", modules.display()))?
        .filter_map(Result::ok)
        .find_map(|entry| entry.file_name().into_string().ok())
        .with_context(|| format!("no kernel release in {}", modules.display()))?;
    let vmlinuz = dir.join("boot").join(format!("vmlinuz-{release}"));
    if !vmlinuz.exists() {
        bail!("{} is missing", vmlinuz.display());
    }
    Ok(Kernel {
        modules_dir: modules.join(&release),
        release,
        vmlinuz,
    })
}

impl Kernel {
    /// The modules `wanted`, with everything they depend on, in an order `insmod` can load
    /// them (dependencies first). Compressed modules (`.ko.xz`, `.ko.zst`) are decompressed
    /// into `scratch`, since busybox's insmod may not read them.
    ///
    /// # Errors
    /// If a module or a dependency is missing, or cannot be read.
    pub fn modules(&self, wanted: &[&str], scratch: &Path) -> anyhow::Result<Vec<Module>> {
        let index = self.index()?;
        let mut order = Vec::new();
        let mut seen = BTreeSet::new();
        for name in wanted {
            self.visit(&index, &normalise(name), &mut seen, &mut order, scratch)?;
        }
        Ok(order)
    }

    /// Module name (dashes as underscores, as the kernel names them) → its file.
    fn index(&self) -> anyhow::Result<HashMap<String, PathBuf>> {
        let mut index = HashMap::new();
        let mut dirs = vec![self.modules_dir.join("kernel")];
        while let Some(dir) = dirs.pop() {
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let path = entry?.path();
                if path.is_dir() {
                    dirs.push(path);
                } else if let Some(name) = path
                    .file_name()
                    .and_then(|name| name.to_str())
                    .and_then(module_name)
                {
                    index.insert(name, path);
                }
            }
        }
        Ok(index)
    }

    fn visit(
        &self,
        index: &HashMap<String, PathBuf>,
        name: &str,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<Module>,
        scratch: &Path,
    ) -> anyhow::Result<()> {
        if !seen.insert(name.to_owned()) {
            return Ok(());
        }
        let path = index.get(name).with_context(|| {
            format!(
                "module {name} is not in {} (built into the kernel? then drop it from the list)",
                self.modules_dir.display()
            )
        })?;
        let host_path = uncompressed(path, scratch)?;
        let data = std::fs::read(&host_path)
            .with_context(|| format!("reading {}", host_path.display()))?;
        for dependency in
            depends(&data).with_context(|| format!("reading {}", host_path.display()))?
        {
            self.visit(index, &dependency, seen, order, scratch)?;
        }
        let relative = path
            .strip_prefix(&self.modules_dir)
            .expect("indexed below the modules directory");
        let relative = relative.with_file_name(format!("{name}.ko"));
        order.push(Module {
            name: name.to_owned(),
            host_path,
            guest_path: format!("/lib/modules/{}/{}", self.release, relative.display()),
        });
        Ok(())
    }
}

/// The module name of a module file name: `vhost_net.ko.xz` → `vhost_net`.
fn module_name(file: &str) -> Option<String> {
    [".ko", ".ko.xz", ".ko.zst", ".ko.gz"]
        .iter()
        .find_map(|ext| file.strip_suffix(ext))
        .map(normalise)
}

fn normalise(name: &str) -> String {
    name.replace('-', "_")
}

/// `path` itself if uncompressed, else a decompressed copy in `scratch`.
fn uncompressed(path: &Path, scratch: &Path) -> anyhow::Result<PathBuf> {
    let file = path
        .file_name()
        .and_then(|n| n.to_str())
        .unwrap_or_default();
    let tool = if file.ends_with(".ko.xz") {
        "xz"
    } else if file.ends_with(".ko.zst") {
        "zstd"
    } else if file.ends_with(".ko.gz") {
        "gzip"
    } else {
        return Ok(path.to_path_buf());
    };
    std::fs::create_dir_all(scratch)?;
    let out = scratch.join(file.rsplit_once('.').map_or(file, |(stem, _)| stem));
    let output = cmd::new(tool)
        .args(["-d", "-c"])
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} (cargo xtask setup installs xz-utils)"))?;
    if !output.status.success() {
        bail!(
            "{tool} -d -c {} failed: {}",
            path.display(),
            String::from_utf8_lossy(&output.stderr)
        );
    }
    std::fs::write(&out, output.stdout).with_context(|| format!("writing {}", out.display()))?;
    Ok(out)
}

/// The `depends=` list of a module's `.modinfo` section (NUL-separated `key=value`).
fn depends(module: &[u8]) -> anyhow::Result<Vec<String>> {
    let modinfo = elf::section(module, ".modinfo")?.context("no .modinfo section")?;
    Ok(modinfo
        .split(|&byte| byte == 0)
        .filter_map(|entry| entry.strip_prefix(b"depends="))
        .flat_map(|list| {
            String::from_utf8_lossy(list)
                .split(',')
                .map(normalise)
                .collect::<Vec<_>>()
        })
        .filter(|name| !name.is_empty())
        .collect())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn image_package_is_read_from_apt_cache_depends() {
        let out = "linux-image-cloud-amd64\n  Depends: linux-image-6.1.0-57-cloud-amd64\n";
        assert_eq!(
            image_package(out).as_deref(),
            Some("linux-image-6.1.0-57-cloud-amd64")
        );
        assert_eq!(image_package("linux-image-cloud-amd64\n"), None);
    }

    #[test]
    fn abi_number_orders_cached_kernels() {
        assert_eq!(abi_number("linux-image-6.1.0-57-cloud-amd64"), Some(57));
        assert_eq!(abi_number("linux-image-6.1.0-9-cloud-amd64"), Some(9));
        assert_eq!(
            abi_number("linux-image-6.1.0-9-cloud-amd64.partial"),
            Some(9)
        );
        assert_eq!(abi_number("other"), None);
    }

    #[test]
    fn module_names_drop_extensions_and_dashes() {
        assert_eq!(module_name("vhost_net.ko").as_deref(), Some("vhost_net"));
        assert_eq!(module_name("sch-tbf.ko.xz").as_deref(), Some("sch_tbf"));
        assert_eq!(module_name("modules.dep"), None);
    }
}
