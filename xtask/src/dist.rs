//! `cargo xtask dist`: one file to install on a hypervisor. `tap-probe` built for musl is
//! linked statically (the eBPF objects are in it already, `include_bytes_aligned!`), so it
//! runs on a host without a Rust toolchain or any library; beside it go the service unit,
//! the alert rules and the dashboard. `--check` proves the first claim in a QEMU guest
//! whose root filesystem holds nothing but a static busybox (for the init) and that binary.

use std::path::{Path, PathBuf};
use std::time::Duration;

use anyhow::{Context as _, bail};
use serde::Deserialize as _;
use tap_probe_common::MetricId;
use tap_probe_guest::{AccelChoice, Image, KernelSpec, Launcher, Series, Verdict, launch};
use tap_probe_spec::load::LoadNumbers;

use crate::{cmd, vm};

/// The target whose std links statically, libc (musl) included.
const TARGET: &str = "x86_64-unknown-linux-musl";

/// What goes into the archive beside the binary, from the repository.
const DEPLOY: &[&str] = &[
    "deploy/systemd/tap-probe.service",
    "deploy/prometheus/tap-probe-rules.yml",
    "deploy/prometheus/tap-probe-rules.test.yml",
    "deploy/grafana/tap-probe.json",
];

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Also boot the binary in a guest that has nothing else installed, and check that it
    /// says its version and commit, attaches (a `demo`), and serves until SIGTERM.
    #[arg(long)]
    check: bool,
    /// The guest's kernel for `--check`: `debian-6.1` (Debian 12's own), `debian-6.12`,
    /// `debian-7.3`, a bzImage or a kernel .deb.
    #[arg(long, default_value = "debian-6.1")]
    kernel: KernelSpec,
}

/// Runs `cargo xtask dist`.
///
/// # Errors
/// If the build fails or is not static, the archive cannot be written, or the guest check
/// fails.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let binary = build()?;
    let archive = package(&binary)?;
    println!("{}", binary.display());
    println!("{}", archive.display());
    if args.check {
        check_in_guest(&binary, &args.kernel)?;
    }
    Ok(())
}

/// The build half of `cargo xtask test`'s static-binary check, run in the host's lane: the
/// binary (which must be static) and its archive; returns the binary's path.
///
/// # Errors
/// As [`run`].
pub(crate) fn build_stage() -> anyhow::Result<PathBuf> {
    let binary = build()?;
    package(&binary)?;
    Ok(binary)
}

/// The guest half, run in the guests' lane: `binary` alone in Debian 12's own kernel.
///
/// # Errors
/// As [`run`].
pub(crate) fn check_stage(binary: &Path) -> anyhow::Result<()> {
    check_in_guest(binary, &KernelSpec::Debian(Series::Debian6_1))
}

/// Builds the static binary and returns its path.
fn build() -> anyhow::Result<PathBuf> {
    let artifacts = cmd::cargo_artifacts(cmd::cargo().args([
        "build",
        "--release",
        "--locked",
        "-p",
        "tap-probe",
        "--bin",
        "tap-probe",
        "--target",
        TARGET,
    ]))
    .with_context(|| {
        format!("building for {TARGET} (`rustup target add {TARGET}`; cargo xtask setup adds it)")
    })?;
    let binary: PathBuf = artifacts
        .into_iter()
        .filter(|a| a.target.name == "tap-probe")
        .find_map(|a| a.executable)
        .context("cargo built no tap-probe binary")?
        .into();
    let data = std::fs::read(&binary).with_context(|| format!("reading {}", binary.display()))?;
    if tap_probe_guest::elf::is_dynamic(&data)? {
        bail!(
            "{} names a dynamic loader: it is not static",
            binary.display()
        );
    }
    Ok(binary)
}

/// `target/dist/tap-probe-VERSION-x86_64-linux.tar.gz`: the binary and the deploy files,
/// under one directory of that name.
fn package(binary: &Path) -> anyhow::Result<PathBuf> {
    let version = version(binary)?;
    let name = format!("tap-probe-{version}-x86_64-linux");
    let dist = cmd::target_dir().join("dist");
    let dir = dist.join(&name);
    if dir.exists() {
        std::fs::remove_dir_all(&dir).with_context(|| format!("clearing {}", dir.display()))?;
    }
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    std::fs::copy(binary, dir.join("tap-probe"))
        .with_context(|| format!("copying {}", binary.display()))?;
    let root = cmd::workspace_root();
    for file in DEPLOY {
        let from = root.join(file);
        let to = dir.join(Path::new(file).file_name().context("a file name")?);
        std::fs::copy(&from, &to).with_context(|| format!("copying {}", from.display()))?;
    }
    let archive = dist.join(format!("{name}.tar.gz"));
    cmd::run(
        cmd::new("tar")
            .arg("-czf")
            .arg(&archive)
            .arg("-C")
            .arg(&dist)
            .arg(&name),
    )?;
    Ok(archive)
}

/// The version `tap-probe --version` states (`tap-probe 0.1.0 (commit 0123456789ab)`).
fn version(binary: &Path) -> anyhow::Result<String> {
    let out = cmd::probe(std::process::Command::new(binary).arg("--version"))
        .with_context(|| format!("{} --version failed", binary.display()))?;
    parse_version(&out).with_context(|| format!("`{}` states no version", out.trim()))
}

/// `0.1.0` from `tap-probe 0.1.0 (commit 0123456789ab)`.
fn parse_version(line: &str) -> Option<String> {
    let rest = line.trim().strip_prefix("tap-probe ")?;
    let (version, commit) = rest.split_once(" (commit ")?;
    let commit = commit.strip_suffix(')')?;
    (!version.is_empty() && !commit.is_empty() && commit != "unknown").then(|| version.to_owned())
}

/// What the guest runs: the version, a demo (a tap, a reader, the probes attached and
/// counting), `serve` until SIGTERM, and a listing of where libraries would be; each result
/// into `/out`, which comes back.
const PAYLOAD: &str = r#"
/bin/tap-probe --version > /out/version 2>&1 || status=1
/bin/tap-probe demo --duration 2 --format json > /out/demo.json 2> /out/demo.err || status=1
/bin/tap-probe serve --listen 127.0.0.1:9464 --interval 0.5 2> /out/serve.log &
serve=$!
sleep 3
kill -TERM "$serve"
wait "$serve"
echo "$?" > /out/serve.status
ls -R /bin /lib /lib64 /usr /etc > /out/files 2>/dev/null
true
"#;

/// Boots `binary` alone in a guest and checks what it did there.
fn check_in_guest(binary: &Path, kernel: &KernelSpec) -> anyhow::Result<()> {
    let (kernel, modules) = vm::prepare(&vm::Guest {
        name: "dist".to_owned(),
        kernel: kernel.clone(),
        modules: Vec::new(),
        modules_dir: None,
        subset: None,
    })?;
    let dir = cmd::target_dir().join("dist").join("guest");
    let out = dir.join("out");
    if out.exists() {
        std::fs::remove_dir_all(&out).with_context(|| format!("clearing {}", out.display()))?;
    }
    let mut image = Image::new(&kernel.release, modules, &dir.join("scratch"))?;
    // A static binary brings no libraries: the guest has none but what the image's base
    // (a static busybox) is.
    image.executable("/bin/tap-probe", binary)?;
    image.collect("/out");
    image.script(PAYLOAD);
    eprintln!(
        "==> xtask dist: the static binary alone in a guest on {}",
        kernel.release
    );
    let mut echo = |_: &str| {};
    let ran = tap_probe_guest::boot(
        &mut Launcher::new(AccelChoice::Auto, "xtask dist"),
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 1024,
            timeout: Duration::from_mins(5),
            echo: &mut echo,
            stdout: None,
            collect_into: Some(&out),
        },
    )?;
    let outcome = &ran.booted.outcome;
    let read = |name: &str| {
        std::fs::read_to_string(out.join(name)).with_context(|| {
            format!(
                "the guest wrote no {name} (console log {})",
                ran.log.display()
            )
        })
    };
    if outcome.verdict != Verdict::Success {
        for line in outcome.tail(40) {
            eprintln!("{line}");
        }
        bail!(
            "the guest failed: {} (console log {})",
            launch::describe(&outcome.verdict),
            ran.log.display()
        );
    }
    let checked = check_results(
        &read("version")?,
        &read("demo.json")?,
        &read("serve.status")?,
        &read("serve.log")?,
        &read("files")?,
    )?;
    eprintln!(
        "xtask dist: checked in a guest on {} ({}): {checked}",
        kernel.release,
        ran.booted.times()
    );
    Ok(())
}

/// What the guest's results must show; a summary of them.
fn check_results(
    version: &str,
    demo: &str,
    serve_status: &str,
    serve_log: &str,
    files: &str,
) -> anyhow::Result<String> {
    if parse_version(version).is_none() {
        bail!("--version in the guest: {version:?} (want `tap-probe VERSION (commit HASH)`)");
    }
    let last: serde_json::Value = demo
        .lines()
        .last()
        .context("the demo wrote nothing")
        .and_then(|line| serde_json::from_str(line).context("the demo's last line"))?;
    let consumed: u64 = last["rows"]
        .as_array()
        .context("the demo's final object has no rows")?
        .iter()
        .filter_map(|row| row[MetricId::Consumed.metric().name].as_u64())
        .sum();
    let read = LoadNumbers::deserialize(&last["load"])
        .context("the demo's final object's load report")?
        .read_by_reader;
    if consumed == 0 {
        bail!("the probes counted no packet in the guest's demo: {last}");
    }
    if serve_status.trim() != "0" {
        bail!(
            "serve ended with status {} on SIGTERM:\n{serve_log}",
            serve_status.trim()
        );
    }
    if !serve_log.contains("serving metrics on") || !serve_log.contains("stopped") {
        bail!("serve's log lacks its start or its stop:\n{serve_log}");
    }
    if let Some(line) = serve_log.lines().find(|l| !l.starts_with('<')) {
        bail!("serve logged a line without a priority: {line:?}");
    }
    let libraries: Vec<&str> = files
        .split_whitespace()
        .filter(|f| {
            let name = f.to_ascii_lowercase();
            name.contains(".so.")
                || std::path::Path::new(&name)
                    .extension()
                    .is_some_and(|ext| ext == "so")
                || name.starts_with("ld-")
        })
        .collect();
    if !libraries.is_empty() {
        bail!("the guest has libraries: {libraries:?}");
    }
    Ok(format!(
        "{}; the probes counted {consumed} packets taken by the demo's reader ({read} by its \
         own count); serve stopped cleanly on SIGTERM; no library in the guest",
        version.trim(),
    ))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_version_names_a_commit() {
        assert_eq!(
            parse_version("tap-probe 0.1.0 (commit 0123456789ab)\n").as_deref(),
            Some("0.1.0")
        );
        assert_eq!(parse_version("tap-probe 0.1.0 (commit unknown)"), None);
        assert_eq!(parse_version("tap-probe 0.1.0"), None);
    }
}
