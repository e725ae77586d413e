//! `cargo xtask seed-tun`: the tail-drop fix as posted to netdev (v8 4/4 with v9 1/4), built
//! as a `tun.ko` for Debian's newest 6.12 cloud kernel, the one `--kernel debian-6.12`
//! boots, from Debian's own packages and the patch in `xtask/seed-tun/`. Prints the module's
//! path as its last line. The module is kept in the kernel cache under a key of its inputs,
//! so a later run finds it built.
//!
//! Out of tree, against the kernel's headers package: the arch headers, the common headers
//! and kbuild are unpacked into one root (their `scripts` and `tools` are relative links into
//! kbuild), the arch `Makefile`'s absolute include of the common headers is pointed at the
//! unpacked copy, and only `drivers/net/tun.c` is taken out of the source package. The
//! headers carry a BTF vmlinux, so the module gets split BTF, which needs pahole.

use std::path::{Path, PathBuf};
use std::process::{Child, ChildStdout, Command, Stdio};
use std::time::Instant;

use anyhow::{Context as _, bail};
use tap_probe_guest::apt::{Apt, Channel};
use tap_probe_guest::kernel::{debian_6_12_abi, remove_dir_if_exists};

use crate::cmd;

/// The patch, against 6.12's `drivers/net/tun.c`.
const PATCH: &str = "xtask/seed-tun/tun-backpressure-6.12.patch";

/// Written once a cached step finished, so that a run that died half way is redone.
const COMPLETE: &str = ".complete";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// Runs `cargo xtask seed-tun`.
///
/// # Errors
/// If a package cannot be had or the build fails.
pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    let module = build()?;
    println!("{}", module.display());
    Ok(())
}

/// Builds the module (or finds it built, in the cache, from the same patch, source and
/// headers) and returns its path.
///
/// # Errors
/// If a package cannot be had or the build fails.
pub(crate) fn build() -> anyhow::Result<PathBuf> {
    let started = Instant::now();
    let cache = tap_probe_guest::cache_dir()?;
    let apt = Apt::open(&cache.join("apt"), Channel::Stable)?;
    let (image, version) = apt.newest("linux-image-6.12.", |rest| {
        debian_6_12_abi(&format!("linux-image-6.12.{rest}")).is_some()
    })?;
    let abi = debian_6_12_abi(&image)
        .context("unexpected 6.12 image name")?
        .to_owned();
    let release = format!("{abi}-cloud-amd64");
    let work = cache.join("seed-tun").join(&abi);
    let debs = cache.join("seed-tun").join("debs");

    let sys = work.join("sys");
    let headers = sys.join("usr/src").join(format!("linux-headers-{release}"));
    if !sys.join(COMPLETE).exists() {
        unpack_headers(&apt, &abi, &version, &work, &debs)?;
    }

    let source = work.join("tun.c");
    if !source.exists() {
        apt.require("linux-source-6.12", &version)?;
        let deb = apt.download("linux-source-6.12", &version, &debs)?;
        extract_tun_c(&deb, &work, &source)?;
    }

    // The module is a function of the patch, the source and the headers it is built
    // against (named by the release and Debian's version): kept in the cache under a key
    // of those, built once.
    let patch = std::fs::read(cmd::workspace_root().join(PATCH))
        .with_context(|| format!("reading {PATCH}"))?;
    let tun_c = std::fs::read(&source).with_context(|| format!("reading {}", source.display()))?;
    let key = fnv1a(&[&patch, &tun_c, release.as_bytes(), version.as_bytes()]);
    let cached = work.join(format!("tun-{key:016x}.ko"));
    if cached.exists() {
        check(&cached, &release)?;
        eprintln!(
            "xtask seed-tun: tun.ko for {release} (Debian {version}), built before: {}",
            cached.display()
        );
        return Ok(cached);
    }

    let build = cmd::target_dir().join("seed-tun").join(&abi);
    remove_dir_if_exists(&build)?;
    std::fs::create_dir_all(build.join("drivers/net"))?;
    std::fs::copy(&source, build.join("drivers/net/tun.c"))?;
    cmd::run(
        cmd::new("patch")
            .args(["-p1", "--quiet", "--directory"])
            .arg(&build)
            .arg("--input")
            .arg(cmd::workspace_root().join(PATCH)),
    )
    .context("applying the patch to 6.12's tun.c (Debian's patch package has `patch`)")?;
    std::fs::rename(build.join("drivers/net/tun.c"), build.join("tun.c"))?;
    std::fs::write(build.join("Kbuild"), "obj-m += tun.o\n")?;
    cmd::run(
        cmd::new("make")
            .arg("-s")
            .arg("-C")
            .arg(&headers)
            .arg(format!("M={}", build.display()))
            .arg("modules"),
    )
    .context("building tun.ko (needs gcc, make and pahole: cargo xtask setup installs them)")?;
    let module = build.join("tun.ko");
    check(&module, &release)?;
    // Copied, then renamed: a run that dies half way leaves no module under the key.
    let partial = work.join("tun.ko.partial");
    std::fs::copy(&module, &partial)
        .with_context(|| format!("copying {} into the cache", module.display()))?;
    std::fs::rename(&partial, &cached)
        .with_context(|| format!("moving {} to {}", partial.display(), cached.display()))?;
    eprintln!(
        "xtask seed-tun: tun.ko for {release} (Debian {version}) in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    Ok(cached)
}

/// FNV-1a over `parts`, each followed by its length (so that moving bytes from one part to
/// the next changes the key): a cache key that stays the same from one build of xtask to
/// the next, which `std`'s hashers do not promise.
fn fnv1a(parts: &[&[u8]]) -> u64 {
    const OFFSET: u64 = 0xcbf2_9ce4_8422_2325;
    const PRIME: u64 = 0x0000_0100_0000_01b3;
    let mut hash = OFFSET;
    for part in parts {
        for byte in part
            .iter()
            .copied()
            .chain((part.len() as u64).to_le_bytes())
        {
            hash ^= u64::from(byte);
            hash = hash.wrapping_mul(PRIME);
        }
    }
    hash
}

/// Unpacks the headers and kbuild of 6.12 `abi` into `work/sys`, with the arch headers'
/// `Makefile` pointed at the common headers there.
fn unpack_headers(
    apt: &Apt,
    abi: &str,
    version: &str,
    work: &Path,
    debs: &Path,
) -> anyhow::Result<()> {
    let release = format!("{abi}-cloud-amd64");
    let sys = work.join("sys");
    let staging = work.join("sys.partial");
    remove_dir_if_exists(&staging)?;
    std::fs::create_dir_all(&staging).with_context(|| format!("creating {}", staging.display()))?;
    for package in [
        format!("linux-headers-{release}"),
        format!("linux-headers-{abi}-common"),
        format!("linux-kbuild-{abi}"),
    ] {
        apt.require(&package, version)?;
        let deb = apt.download(&package, version, debs)?;
        tap_probe_guest::apt::unpack(&deb, &staging)?;
    }
    // `include /usr/src/linux-headers-ABI-common/Makefile`: the installed location.
    let makefile = staging
        .join("usr/src")
        .join(format!("linux-headers-{release}"))
        .join("Makefile");
    let text = std::fs::read_to_string(&makefile)
        .with_context(|| format!("reading {}", makefile.display()))?;
    let root = sys.to_str().context("the cache path is not UTF-8")?;
    let repointed = text.replace("include /usr/src/", &format!("include {root}/usr/src/"));
    if repointed == text {
        bail!(
            "{} does not include the common headers from /usr/src",
            makefile.display()
        );
    }
    std::fs::write(&makefile, repointed)?;
    remove_dir_if_exists(&sys)?;
    std::fs::rename(&staging, &sys)
        .with_context(|| format!("moving {} to {}", staging.display(), sys.display()))?;
    std::fs::write(sys.join(COMPLETE), "")?;
    Ok(())
}

/// Streams `drivers/net/tun.c` out of the source package's tarball into `out`, without
/// unpacking the rest (the tarball is about 150 MB of xz).
fn extract_tun_c(deb: &Path, work: &Path, out: &Path) -> anyhow::Result<()> {
    let scratch = work.join("source.partial");
    remove_dir_if_exists(&scratch)?;
    std::fs::create_dir_all(&scratch)?;
    let member = "linux-source-6.12/drivers/net/tun.c";
    let mut package = cmd::new("dpkg-deb");
    package.arg("--fsys-tarfile").arg(deb);
    let mut tarball = cmd::new("tar");
    tarball.args(["-xO", "./usr/src/linux-source-6.12.tar.xz"]);
    let mut xz = cmd::new("xz");
    xz.arg("-dc");
    let mut source = cmd::new("tar");
    source.arg("-x").arg("-C").arg(&scratch).arg(member);
    pipeline(vec![package, tarball, xz, source])
        .with_context(|| format!("extracting {member} from {}", deb.display()))?;
    std::fs::rename(scratch.join(member), out)
        .with_context(|| format!("moving the extracted tun.c to {}", out.display()))?;
    remove_dir_if_exists(&scratch)
}

/// Runs `commands` as a shell pipeline would, each one's stdout into the next one's stdin.
fn pipeline(commands: Vec<Command>) -> anyhow::Result<()> {
    let mut children: Vec<(String, Child)> = Vec::new();
    let mut input: Option<ChildStdout> = None;
    let last = commands.len().saturating_sub(1);
    for (index, mut command) in commands.into_iter().enumerate() {
        if let Some(stdin) = input.take() {
            command.stdin(stdin);
        }
        if index < last {
            command.stdout(Stdio::piped());
        }
        let name = cmd::display(&command);
        match command.spawn() {
            Ok(mut child) => {
                input = child.stdout.take();
                children.push((name, child));
            }
            Err(err) => {
                for (_, mut child) in children {
                    let _ = child.kill();
                    let _ = child.wait();
                }
                return Err(err).with_context(|| format!("could not run `{name}`"));
            }
        }
    }
    let mut failed = Vec::new();
    for (name, mut child) in children {
        let status = child
            .wait()
            .with_context(|| format!("waiting for `{name}`"))?;
        if !status.success() {
            failed.push(format!("`{name}` {status}"));
        }
    }
    if failed.is_empty() {
        Ok(())
    } else {
        bail!("{}", failed.join(", "))
    }
}

/// The module must be for `release` (its vermagic) and carry split BTF (tap-probe reads
/// `struct tun_file` from `/sys/kernel/btf/tun`).
fn check(module: &Path, release: &str) -> anyhow::Result<()> {
    let data = std::fs::read(module).with_context(|| format!("reading {}", module.display()))?;
    let vermagic = tap_probe_guest::elf::modinfo(&data, "vermagic")?;
    let built_for = vermagic
        .first()
        .and_then(|magic| magic.split_whitespace().next());
    if built_for != Some(release) {
        bail!(
            "{} was built for {}, not {release}",
            module.display(),
            built_for.unwrap_or("(no vermagic)")
        );
    }
    if !tap_probe_guest::elf::has_section(&data, ".BTF")? {
        bail!(
            "{} has no .BTF section (is pahole installed?)",
            module.display()
        );
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn cache_keys_are_stable_and_tell_parts_apart() {
        // No parts: the offset basis, untouched.
        assert_eq!(fnv1a(&[]), 0xcbf2_9ce4_8422_2325);
        assert_eq!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"ab", b"c"]));
        assert_ne!(fnv1a(&[b"ab", b"c"]), fnv1a(&[b"a", b"bc"]));
    }
}
