//! Guest kernels: Debian's cloud kernels by series (fetched with apt into the cache, the
//! newest of the series), a kernel package (`.deb`) or a kernel build (`bzImage` and its
//! modules), and the modules a guest loads, with their dependencies, in load order.
//!
//! Debian's packages ship no `modules.dep` (their postinst runs depmod), so dependencies are
//! read from each module's `.modinfo` section (`depends=a,b`), as depmod itself does.

use std::collections::{BTreeSet, HashMap, HashSet};
use std::fmt;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::str::FromStr;

use anyhow::{Context as _, bail};

use crate::apt::{self, Apt, Channel};
use crate::elf;

/// A Debian cloud kernel series this knows how to find.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Series {
    /// Debian 11's kernel (bullseye, with bullseye-security): Linux 5.10, which predates
    /// the drop reasons (5.17) and the programs' `recursion_misses` (5.12).
    Debian5_10,
    /// Debian 12's own kernel (bookworm).
    Debian6_1,
    /// Debian 12's backported LTS kernel (bookworm-security).
    Debian6_12,
    /// Linux 7.3 from experimental (sid once it moves there): the first with the tail-drop
    /// fix (`IFF_BACKPRESSURE`).
    Debian7_3,
}

impl Series {
    pub const ALL: [Self; 4] = [
        Self::Debian5_10,
        Self::Debian6_1,
        Self::Debian6_12,
        Self::Debian7_3,
    ];

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Debian5_10 => "debian-5.10",
            Self::Debian6_1 => "debian-6.1",
            Self::Debian6_12 => "debian-6.12",
            Self::Debian7_3 => "debian-7.3",
        }
    }
}

/// What `--kernel` names.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum KernelSpec {
    Debian(Series),
    /// A kernel package (`linux-image-*.deb`, `linux-binary-*.deb`).
    Deb(PathBuf),
    /// A kernel image (`arch/x86/boot/bzImage`).
    Image(PathBuf),
}

impl FromStr for KernelSpec {
    type Err = String;

    fn from_str(text: &str) -> Result<Self, Self::Err> {
        if let Some(series) = Series::ALL.into_iter().find(|s| s.name() == text) {
            return Ok(Self::Debian(series));
        }
        if text.starts_with("debian-") {
            return Err(format!(
                "unknown kernel series `{text}`: known are {}, or give a path",
                Series::ALL.map(Series::name).join(", ")
            ));
        }
        let path = PathBuf::from(text);
        if !path.is_file() {
            return Err(format!(
                "`{text}` is neither a kernel series ({}) nor a file",
                Series::ALL.map(Series::name).join(", ")
            ));
        }
        Ok(
            if path
                .extension()
                .is_some_and(|ext| ext.eq_ignore_ascii_case("deb"))
            {
                Self::Deb(path)
            } else {
                Self::Image(path)
            },
        )
    }
}

impl fmt::Display for KernelSpec {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Debian(series) => f.write_str(series.name()),
            Self::Deb(path) | Self::Image(path) => write!(f, "{}", path.display()),
        }
    }
}

/// A kernel ready to boot.
#[derive(Debug, Clone)]
pub struct Kernel {
    /// The kernel release (`uname -r`), e.g. `6.1.0-57-cloud-amd64`.
    pub release: String,
    pub vmlinuz: PathBuf,
    /// `lib/modules/<release>`, if the kernel has modules here.
    pub modules_dir: Option<PathBuf>,
    /// Where it came from, for messages: the package and version, or the path.
    pub origin: String,
}

/// A module to load in the guest.
#[derive(Debug, Clone)]
pub struct Module {
    pub name: String,
    /// The uncompressed module on the host.
    pub host_path: PathBuf,
    /// Where it goes in the guest (`/lib/modules/<release>/...`, uncompressed).
    pub guest_path: String,
}

/// Written into an unpacked package's directory once unpacking finished, so that a run that
/// died half way is not mistaken for a cached package.
const COMPLETE: &str = ".complete";

/// The packages a series is made of, newest version first, with the apt that knows them.
struct Packages {
    apt: Apt,
    /// (package, version), the kernel image's first.
    debs: Vec<(String, String)>,
}

/// Finds `spec`'s kernel, downloading and unpacking it into `cache` when needed. A Debian
/// series resolves to its newest kernel apt knows; without apt's answer (offline), to the
/// newest one in the cache.
///
/// # Errors
/// If the kernel cannot be found, downloaded or unpacked.
pub fn resolve(spec: &KernelSpec, modules: Option<&Path>, cache: &Path) -> anyhow::Result<Kernel> {
    match spec {
        KernelSpec::Debian(series) => debian(*series, cache),
        KernelSpec::Deb(deb) => {
            let dir = unpack_cached(deb, cache)?;
            let mut kernel = open_tree(&dir, &deb.display().to_string())?;
            if let Some(modules) = modules {
                kernel.modules_dir = Some(modules_tree(modules, &kernel.release, cache)?);
            }
            Ok(kernel)
        }
        KernelSpec::Image(image) => {
            let release = bzimage_release(image)?;
            let modules_dir = modules
                .map(|modules| modules_tree(modules, &release, cache))
                .transpose()?;
            Ok(Kernel {
                release,
                vmlinuz: image.clone(),
                modules_dir,
                origin: image.display().to_string(),
            })
        }
    }
}

fn debian(series: Series, cache: &Path) -> anyhow::Result<Kernel> {
    let packages = match packages(series, &cache.join("apt")) {
        Ok(packages) => packages,
        Err(err) => {
            let cached = newest_cached(series, &cache.join("kernels")).with_context(|| {
                format!(
                    "finding the {} kernel: {err:#}; and none is cached",
                    series.name()
                )
            })?;
            eprintln!(
                "tap-probe-guest: {err:#}; using the cached {}",
                cached.display()
            );
            return open_tree(&cached, &cached.display().to_string());
        }
    };
    let kernels = cache.join("kernels");
    let (image, version) = &packages.debs[0];
    let dir = kernels.join(format!("{image}_{version}"));
    if !dir.join(COMPLETE).exists() {
        let staging = kernels.join(format!("{image}_{version}.partial"));
        remove_dir_if_exists(&staging)?;
        let root = staging.join("root");
        for (package, version) in &packages.debs {
            let deb = packages.apt.download(package, version, &staging)?;
            apt::unpack(&deb, &root)?;
        }
        remove_dir_if_exists(&dir)?;
        std::fs::rename(&root, &dir)
            .with_context(|| format!("moving {} to {}", root.display(), dir.display()))?;
        std::fs::write(dir.join(COMPLETE), format!("{}\n", series.name()))?;
        remove_dir_if_exists(&staging)?;
    }
    open_tree(&dir, &format!("{} ({image} {version})", series.name()))
}

/// The packages of `series`' newest kernel (the image's first) as Debian ships them, kept in
/// `cache`'s `packages` directory: what `--kernel FILE.deb` takes.
///
/// # Errors
/// If apt cannot find or download them.
pub fn download(series: Series, cache: &Path) -> anyhow::Result<Vec<PathBuf>> {
    let packages = packages(series, &cache.join("apt"))?;
    let dir = cache.join("packages");
    packages
        .debs
        .iter()
        .map(|(package, version)| packages.apt.download(package, version, &dir))
        .collect()
}

/// The packages of `series`' newest kernel: the image's first.
fn packages(series: Series, apt_dir: &Path) -> anyhow::Result<Packages> {
    match series {
        Series::Debian5_10 => release_kernel(Apt::open(apt_dir, Channel::Bullseye)?, "5.10"),
        Series::Debian6_1 => release_kernel(Apt::open(apt_dir, Channel::Stable)?, "6.1"),
        Series::Debian6_12 => {
            let apt = Apt::open(apt_dir, Channel::Stable)?;
            let (image, version) = apt.newest("linux-image-6.12.", |rest| {
                debian_6_12_abi(&format!("linux-image-6.12.{rest}")).is_some()
            })?;
            Ok(Packages {
                apt,
                debs: vec![(image, version)],
            })
        }
        Series::Debian7_3 => {
            // `linux-binary-7.3-cloud-amd64` in experimental, `linux-binary-7.3.N+debNN-
            // cloud-amd64` once in sid: vmlinuz alone; the modules and `linux-base` (the
            // config and `modules.builtin`) are separate packages of the same version.
            let apt = Apt::open(apt_dir, Channel::Unstable)?;
            let (binary, version) = apt.newest("linux-binary-7.3", |rest| {
                rest.strip_suffix("-cloud-amd64").is_some_and(|abi| {
                    abi.is_empty()
                        || abi.strip_prefix('.').is_some_and(|point| {
                            point.split('+').next().is_some_and(|n| {
                                !n.is_empty() && n.bytes().all(|b| b.is_ascii_digit())
                            })
                        })
                })
            })?;
            let abi = binary
                .strip_prefix("linux-binary-")
                .and_then(|rest| rest.strip_suffix("-cloud-amd64"))
                .context("unexpected 7.3 package name")?
                .to_owned();
            let mut debs = vec![(binary, version.clone())];
            for kind in ["modules", "base"] {
                let package = format!("linux-{kind}-{abi}-cloud-amd64");
                apt.require(&package, &version)?;
                debs.push((package, version.clone()));
            }
            Ok(Packages { apt, debs })
        }
    }
}

/// A Debian release's own kernel series `upstream` (`6.1` in bookworm, `5.10` in bullseye):
/// the cloud metapackage's newest version depends on the newest ABI's image, at the same
/// version.
fn release_kernel(apt: Apt, upstream: &str) -> anyhow::Result<Packages> {
    let (meta, version) = apt.newest("linux-image-cloud-amd64", str::is_empty)?;
    let prefix = format!("linux-image-{upstream}.");
    let image = apt
        .depends(&meta, &version)
        .into_iter()
        .find(|name| name.starts_with(&prefix) && name.ends_with("-cloud-amd64"))
        .with_context(|| format!("{meta} {version} depends on no {upstream} kernel image"))?;
    apt.require(&image, &version)?;
    Ok(Packages {
        apt,
        debs: vec![(image, version)],
    })
}

/// The ABI of a 6.12 cloud image package name: `6.12.118+deb12` of
/// `linux-image-6.12.118+deb12-cloud-amd64-unsigned`.
#[must_use]
pub fn debian_6_12_abi(name: &str) -> Option<&str> {
    let abi = name
        .strip_prefix("linux-image-")?
        .strip_suffix("-cloud-amd64-unsigned")?;
    let (point, deb) = abi.strip_prefix("6.12.")?.split_once("+deb")?;
    let digits = |s: &str| !s.is_empty() && s.bytes().all(|b| b.is_ascii_digit());
    (digits(point) && digits(deb)).then_some(abi)
}

/// The newest complete unpacked kernel of `series` in `dir`.
fn newest_cached(series: Series, dir: &Path) -> Option<PathBuf> {
    let prefix = match series {
        Series::Debian5_10 => "linux-image-5.10.0-",
        Series::Debian6_1 => "linux-image-6.1.0-",
        Series::Debian6_12 => "linux-image-6.12.",
        Series::Debian7_3 => "linux-binary-7.3-",
    };
    std::fs::read_dir(dir)
        .ok()?
        .filter_map(Result::ok)
        .filter(|entry| entry.path().join(COMPLETE).exists())
        .filter_map(|entry| entry.file_name().into_string().ok())
        .filter(|name| name.starts_with(prefix))
        .max_by(|a, b| {
            let version = |name: &str| name.split_once('_').map(|(_, v)| v.to_owned());
            apt::compare_versions(
                &version(a).unwrap_or_default(),
                &version(b).unwrap_or_default(),
            )
        })
        .map(|name| dir.join(name))
}

/// A `.deb` the user named, unpacked once into the cache (keyed by its name and size).
fn unpack_cached(deb: &Path, cache: &Path) -> anyhow::Result<PathBuf> {
    let size = std::fs::metadata(deb)
        .with_context(|| format!("reading {}", deb.display()))?
        .len();
    let name = deb
        .file_stem()
        .and_then(|stem| stem.to_str())
        .context("a .deb path without a file name")?;
    let debs = cache.join("debs");
    let dir = debs.join(format!("{name}-{size}"));
    if !dir.join(COMPLETE).exists() {
        // Unpacked aside and moved in whole, as a series' packages are: a run that died
        // half way leaves no tree that looks complete.
        let staging = debs.join(format!("{name}-{size}.partial"));
        remove_dir_if_exists(&staging)?;
        apt::unpack(deb, &staging)?;
        std::fs::write(staging.join(COMPLETE), "")?;
        remove_dir_if_exists(&dir)?;
        std::fs::rename(&staging, &dir)
            .with_context(|| format!("moving {} to {}", staging.display(), dir.display()))?;
    }
    Ok(dir)
}

/// A kernel in an unpacked package tree: `boot/vmlinuz-<release>` with `lib/modules/<release>`
/// (Debian 12), or `usr/lib/modules/<release>/vmlinuz` (newer packaging).
fn open_tree(dir: &Path, origin: &str) -> anyhow::Result<Kernel> {
    for modules in ["usr/lib/modules", "lib/modules"] {
        let Ok(entries) = std::fs::read_dir(dir.join(modules)) else {
            continue;
        };
        for entry in entries.filter_map(Result::ok) {
            let Ok(release) = entry.file_name().into_string() else {
                continue;
            };
            let candidates = [
                entry.path().join("vmlinuz"),
                dir.join("boot").join(format!("vmlinuz-{release}")),
            ];
            if let Some(vmlinuz) = candidates.into_iter().find(|path| path.is_file()) {
                return Ok(Kernel {
                    release,
                    vmlinuz,
                    modules_dir: Some(entry.path()),
                    origin: origin.to_owned(),
                });
            }
        }
    }
    bail!(
        "no kernel in {} (looked for boot/vmlinuz-RELEASE and usr/lib/modules/RELEASE/vmlinuz)",
        dir.display()
    )
}

/// The modules directory for `release` in what `--modules` names: a `.deb`, a directory
/// holding `lib/modules/<release>` (`make modules_install INSTALL_MOD_PATH=DIR`), or the
/// release directory itself.
fn modules_tree(path: &Path, release: &str, cache: &Path) -> anyhow::Result<PathBuf> {
    let root = if path.extension().is_some_and(|ext| ext == "deb") {
        unpack_cached(path, cache)?
    } else {
        path.to_path_buf()
    };
    let candidates = [
        root.join("lib/modules").join(release),
        root.join("usr/lib/modules").join(release),
        root.clone(),
    ];
    candidates
        .into_iter()
        .find(|dir| dir.join("kernel").is_dir() || dir.join("modules.builtin").is_file())
        .with_context(|| {
            format!(
                "{} holds no modules for {release} (expected lib/modules/{release}/kernel in it)",
                path.display()
            )
        })
}

/// The release a bzImage was built as: the setup header's `kernel_version` field points at
/// the version string (Documentation/arch/x86/boot.rst), whose first word is the release.
fn bzimage_release(image: &Path) -> anyhow::Result<String> {
    let data = std::fs::read(image).with_context(|| format!("reading {}", image.display()))?;
    let not_bzimage = || format!("{} is not an x86 bzImage", image.display());
    if data.get(0x202..0x206) != Some(b"HdrS".as_slice()) {
        bail!(not_bzimage());
    }
    let offset = data
        .get(0x20e..0x210)
        .map(|bytes| usize::from(u16::from_le_bytes([bytes[0], bytes[1]])) + 0x200)
        .with_context(not_bzimage)?;
    let version = data.get(offset..).with_context(not_bzimage)?;
    let end = version
        .iter()
        .position(|&b| b == 0 || b == b' ')
        .unwrap_or(0);
    let release = String::from_utf8_lossy(&version[..end]).into_owned();
    if release.is_empty() {
        bail!("{} has no kernel version string", image.display());
    }
    Ok(release)
}

/// The modules a guest asked for, resolved.
#[derive(Debug, Default)]
pub struct ModuleSet {
    /// In an order `insmod` can load them (dependencies first).
    pub load: Vec<Module>,
    /// Asked for, but neither a module here nor built into the kernel.
    pub missing: Vec<String>,
}

impl Kernel {
    /// The modules `wanted`, with what they depend on, in load order. `replacements` are
    /// module files (a kernel developer's own `tun.ko`) that take the place of the kernel's
    /// module of the same name, or are added. Modules built into the kernel
    /// (`modules.builtin`) are not loaded. Compressed modules are decompressed into
    /// `scratch`, since busybox's insmod may not read them.
    ///
    /// # Errors
    /// If a replacement was built for another kernel release, or a module cannot be read.
    pub fn modules(
        &self,
        wanted: &[&str],
        replacements: &[PathBuf],
        scratch: &Path,
    ) -> anyhow::Result<ModuleSet> {
        let mut index = self.index()?;
        let mut wanted: Vec<String> = wanted.iter().map(|name| normalise(name)).collect();
        for path in replacements {
            let data =
                std::fs::read(path).with_context(|| format!("reading {}", path.display()))?;
            let name = elf::modinfo(&data, "name")
                .with_context(|| path.display().to_string())?
                .into_iter()
                .next()
                .or_else(|| path.file_name()?.to_str().and_then(module_name))
                .with_context(|| format!("{} has no module name", path.display()))?;
            let vermagic = elf::modinfo(&data, "vermagic")?.into_iter().next();
            let built_for = vermagic
                .as_deref()
                .and_then(|magic| magic.split_whitespace().next());
            if built_for != Some(self.release.as_str()) {
                bail!(
                    "{} was built for kernel {}, not {} (its vermagic must match the guest's)",
                    path.display(),
                    built_for.unwrap_or("(no vermagic)"),
                    self.release
                );
            }
            let name = normalise(&name);
            index.insert(name.clone(), path.clone());
            if !wanted.contains(&name) {
                wanted.push(name);
            }
        }
        let builtin = self.builtin();
        let mut set = ModuleSet::default();
        let mut seen = BTreeSet::new();
        for name in &wanted {
            if builtin.contains(name) {
                continue;
            }
            if !index.contains_key(name) {
                set.missing.push(name.clone());
                continue;
            }
            self.visit(&index, &builtin, name, &mut seen, &mut set.load, scratch)?;
        }
        Ok(set)
    }

    /// Module name (dashes as underscores, as the kernel names them) → its file.
    fn index(&self) -> anyhow::Result<HashMap<String, PathBuf>> {
        let mut index = HashMap::new();
        let Some(modules_dir) = &self.modules_dir else {
            return Ok(index);
        };
        let mut dirs = vec![modules_dir.clone()];
        while let Some(dir) = dirs.pop() {
            for entry in
                std::fs::read_dir(&dir).with_context(|| format!("reading {}", dir.display()))?
            {
                let path = entry?.path();
                // `build` and `source` point at the kernel's build tree, not modules.
                if path.is_symlink() {
                    continue;
                }
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

    /// Modules built into the kernel, from `modules.builtin` (`kernel/net/sched/sch_x.ko`).
    fn builtin(&self) -> HashSet<String> {
        self.modules_dir
            .as_ref()
            .and_then(|dir| std::fs::read_to_string(dir.join("modules.builtin")).ok())
            .map(|text| {
                text.lines()
                    .filter_map(|line| line.rsplit('/').next().and_then(module_name))
                    .collect()
            })
            .unwrap_or_default()
    }

    fn visit(
        &self,
        index: &HashMap<String, PathBuf>,
        builtin: &HashSet<String>,
        name: &str,
        seen: &mut BTreeSet<String>,
        order: &mut Vec<Module>,
        scratch: &Path,
    ) -> anyhow::Result<()> {
        if !seen.insert(name.to_owned()) || builtin.contains(name) {
            return Ok(());
        }
        let path = index.get(name).with_context(|| {
            format!(
                "module {name} is needed but is not in {}",
                self.describe_modules()
            )
        })?;
        let host_path = uncompressed(path, scratch)?;
        let data = std::fs::read(&host_path)
            .with_context(|| format!("reading {}", host_path.display()))?;
        let depends =
            elf::modinfo(&data, "depends").with_context(|| host_path.display().to_string())?;
        for dependency in depends.iter().flat_map(|list| list.split(',')) {
            if !dependency.is_empty() {
                self.visit(index, builtin, &normalise(dependency), seen, order, scratch)?;
            }
        }
        order.push(Module {
            name: name.to_owned(),
            guest_path: format!("/lib/modules/{}/{name}.ko", self.release),
            host_path,
        });
        Ok(())
    }

    fn describe_modules(&self) -> String {
        self.modules_dir.as_ref().map_or_else(
            || "the kernel's modules (none were given)".to_owned(),
            |dir| dir.display().to_string(),
        )
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
    let output = Command::new(tool)
        .args(["-d", "-c"])
        .arg(path)
        .output()
        .with_context(|| format!("running {tool} (Debian's xz-utils has xz)"))?;
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

/// Removes `dir` and everything in it; a directory that is not there is no error.
///
/// # Errors
/// When it is there and cannot be removed.
pub fn remove_dir_if_exists(dir: &Path) -> anyhow::Result<()> {
    match std::fs::remove_dir_all(dir) {
        Err(err) if err.kind() != std::io::ErrorKind::NotFound => {
            Err(err).with_context(|| format!("removing {}", dir.display()))
        }
        _ => Ok(()),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn series_and_paths_parse() {
        assert_eq!(
            "debian-7.3".parse::<KernelSpec>(),
            Ok(KernelSpec::Debian(Series::Debian7_3))
        );
        assert_eq!(
            "debian-5.10".parse::<KernelSpec>(),
            Ok(KernelSpec::Debian(Series::Debian5_10))
        );
        let err = "debian-4.19".parse::<KernelSpec>().unwrap_err();
        assert!(
            err.contains("debian-5.10, debian-6.1, debian-6.12, debian-7.3"),
            "{err}"
        );
        let err = "/nonexistent/bzImage".parse::<KernelSpec>().unwrap_err();
        assert!(err.contains("neither"), "{err}");
    }

    #[test]
    fn the_6_12_abi_is_read_from_the_image_name() {
        assert_eq!(
            debian_6_12_abi("linux-image-6.12.118+deb12-cloud-amd64-unsigned"),
            Some("6.12.118+deb12")
        );
        assert_eq!(
            debian_6_12_abi("linux-image-6.12.118+deb12-cloud-amd64"),
            None
        );
        assert_eq!(
            debian_6_12_abi("linux-image-6.12.x+deb12-cloud-amd64-unsigned"),
            None
        );
    }

    #[test]
    fn module_names_drop_extensions_and_dashes() {
        assert_eq!(module_name("vhost_net.ko").as_deref(), Some("vhost_net"));
        assert_eq!(module_name("sch-tbf.ko.xz").as_deref(), Some("sch_tbf"));
        assert_eq!(module_name("modules.dep"), None);
    }

    #[test]
    fn a_bzimage_names_its_release() {
        let mut image = vec![0_u8; 0x400];
        image[0x202..0x206].copy_from_slice(b"HdrS");
        // kernel_version points 0x200 bytes before the string.
        image[0x20e..0x210].copy_from_slice(&0x100_u16.to_le_bytes());
        let version = b"7.3.0-rc7-dirty (dev@host) #1 SMP\0";
        image[0x300..0x300 + version.len()].copy_from_slice(version);
        let dir = tempfile::tempdir().expect("temp dir");
        let path = dir.path().join("bzImage");
        std::fs::write(&path, &image).expect("writing");
        assert_eq!(
            bzimage_release(&path).expect("a bzImage"),
            "7.3.0-rc7-dirty"
        );
        std::fs::write(&path, b"not a kernel").expect("writing");
        assert!(bzimage_release(&path).is_err());
    }
}
