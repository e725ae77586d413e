//! `cargo xtask setup`: install what building and testing tap-probe need on a fresh
//! machine. Each item is checked first, so a second run does nothing and takes a moment.

use std::time::Instant;

use anyhow::{Context as _, bail};

use crate::cmd;

/// Nightly components: rust-src for `-Z build-std=core` (the eBPF build and its clippy),
/// clippy for the eBPF crate's own lint run.
const NIGHTLY_COMPONENTS: &[&str] = &["rust-src", "clippy"];

/// bpf-linker links the eBPF object. Later versions need an external LLVM that Debian 12
/// lacks; 0.10.3 uses rustc's own.
const BPF_LINKER_VERSION: &str = "0.10.3";

/// Debian packages: iproute2 (`ip`, `tc` for test hosts), util-linux's `setpriv` (the
/// tests run tap-probe with chosen capabilities), bpftrace (the overhead benchmark's
/// reference tracer); for the deployment files: prometheus (`promtool` tests the alert
/// rules, a Prometheus server evaluates them and the dashboard against a live `serve`),
/// systemd's `systemd-analyze` (verifies the unit), strace (the test of the unit's system
/// call filter); for the guests: QEMU, a static busybox for their init,
/// xz-utils for compressed kernel modules, binutils' `strip` to shrink their binaries; for
/// `cargo xtask seed-tun`: gcc, make and patch to build a module against Debian's kernel
/// headers, and dwarves' pahole for its BTF; for `cargo xtask dist`: musl-tools'
/// `musl-gcc`, which compiles the C of the TLS library (aws-lc) for the static binary.
const APT_PACKAGES: &[&str] = &[
    "iproute2",
    "util-linux",
    "bpftrace",
    "prometheus",
    "systemd",
    "strace",
    "qemu-system-x86",
    "busybox-static",
    "xz-utils",
    "binutils",
    "gcc",
    "make",
    "patch",
    "dwarves",
    "musl-tools",
];

/// `cargo xtask dist` links tap-probe statically against musl.
const MUSL_TARGET: &str = "x86_64-unknown-linux-musl";

/// aya attaches classic tracepoints through tracefs, which is not mounted by default here.
const TRACEFS: &str = "/sys/kernel/tracing";

const NEED_ROOT: &str = "setup installs packages and mounts tracefs: run as root";

#[derive(Debug, clap::Args)]
pub(crate) struct Args {}

/// Runs `cargo xtask setup`.
///
/// # Errors
/// If an install step fails, or one that needs root is due and this is not root.
pub(crate) fn run(_args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let mut done = Vec::new();
    if nightly_components()? {
        done.push("nightly components");
    }
    if bpf_linker()? {
        done.push("bpf-linker");
    }
    if musl_target()? {
        done.push("musl target");
    }
    if apt_packages()? {
        done.push("apt packages");
    }
    if tracefs()? {
        done.push("tracefs");
    }
    let elapsed = started.elapsed().as_secs_f64();
    if done.is_empty() {
        eprintln!("xtask setup: everything already present ({elapsed:.1} s)");
    } else {
        eprintln!(
            "xtask setup: installed {} ({elapsed:.1} s)",
            done.join(", ")
        );
    }
    Ok(())
}

fn nightly_components() -> anyhow::Result<bool> {
    let installed = cmd::probe(cmd::new("rustup").args([
        "component",
        "list",
        "--toolchain",
        "nightly",
        "--installed",
    ]))
    .context(
        "`rustup component list --toolchain nightly` failed: is the nightly toolchain installed?",
    )?;
    let missing: Vec<&str> = NIGHTLY_COMPONENTS
        .iter()
        .copied()
        .filter(|component| !installed.lines().any(|line| is_component(line, component)))
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    cmd::run(
        cmd::new("rustup")
            .args(["component", "add"])
            .args(&missing)
            .args(["--toolchain", "nightly"]),
    )?;
    Ok(true)
}

/// The musl target's standard library for the toolchain that builds tap-probe.
fn musl_target() -> anyhow::Result<bool> {
    let installed = cmd::probe(cmd::new("rustup").args(["target", "list", "--installed"]))
        .context("`rustup target list --installed` failed: is rustup installed?")?;
    if installed.lines().any(|line| line.trim() == MUSL_TARGET) {
        return Ok(false);
    }
    cmd::run(cmd::new("rustup").args(["target", "add", MUSL_TARGET]))?;
    Ok(true)
}

/// Whether a line of `rustup component list` names `component`: lines are either the bare
/// name (`rust-src`) or the name with the host triple (`clippy-x86_64-unknown-linux-gnu`).
fn is_component(line: &str, component: &str) -> bool {
    line == component
        || line
            .strip_prefix(component)
            .and_then(|rest| rest.strip_prefix('-'))
            .is_some_and(|triple| triple.matches('-').count() >= 2)
}

fn bpf_linker() -> anyhow::Result<bool> {
    let installed = cmd::probe(cmd::new("bpf-linker").arg("--version"))
        .as_deref()
        .and_then(bpf_linker_version)
        .map(str::to_owned);
    if installed.as_deref() == Some(BPF_LINKER_VERSION) {
        return Ok(false);
    }
    let mut install = cmd::cargo();
    install.args([
        "install",
        &format!("bpf-linker@{BPF_LINKER_VERSION}"),
        "--locked",
    ]);
    if installed.is_some() {
        // Another version is installed: replace it.
        install.arg("--force");
    }
    cmd::run(&mut install)?;
    Ok(true)
}

/// The version in `bpf-linker --version`'s output (`bpf-linker 0.10.3`).
fn bpf_linker_version(output: &str) -> Option<&str> {
    output
        .split_whitespace()
        .skip_while(|word| *word != "bpf-linker")
        .nth(1)
}

fn apt_packages() -> anyhow::Result<bool> {
    let missing: Vec<&str> = APT_PACKAGES
        .iter()
        .copied()
        .filter(|package| {
            cmd::probe(cmd::new("dpkg-query").args(["-W", "-f=${Status}", package]))
                .is_none_or(|status| status.trim() != "install ok installed")
        })
        .collect();
    if missing.is_empty() {
        return Ok(false);
    }
    if !cmd::is_root() {
        bail!("{NEED_ROOT} (missing packages: {})", missing.join(" "));
    }
    let apt = |args: &[&str]| {
        let mut command = cmd::new("apt-get");
        command
            .env("DEBIAN_FRONTEND", "noninteractive")
            .args(args)
            .stdin(std::process::Stdio::null());
        command
    };
    cmd::run(&mut apt(&["update"]))?;
    cmd::run(apt(&["install", "-y", "--no-install-recommends"]).args(&missing))?;
    if missing.contains(&"prometheus") {
        // Debian's package enables and starts a server of its own on :9090 where systemd
        // runs; only promtool and the binary are wanted (the tests start their own server on
        // loopback, and stop it). Without systemd there is nothing to stop.
        let _ = cmd::probe(cmd::new("systemctl").args(["disable", "--now", "prometheus.service"]));
    }
    Ok(true)
}

fn tracefs() -> anyhow::Result<bool> {
    let mounts = std::fs::read_to_string("/proc/mounts").context("reading /proc/mounts")?;
    let mounted = mounts.lines().any(|line| {
        let mut fields = line.split_whitespace();
        let (_source, target, fstype) = (fields.next(), fields.next(), fields.next());
        target == Some(TRACEFS) && fstype == Some("tracefs")
    });
    if mounted {
        return Ok(false);
    }
    if !cmd::is_root() {
        bail!("{NEED_ROOT} (tracefs is not mounted at {TRACEFS})");
    }
    cmd::run(cmd::new("mount").args(["-t", "tracefs", "nodev", TRACEFS]))?;
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::{bpf_linker_version, is_component};

    #[test]
    fn bpf_linker_version_is_read_from_its_banner() {
        assert_eq!(bpf_linker_version("bpf-linker 0.10.3\n"), Some("0.10.3"));
        assert_eq!(bpf_linker_version("garbage"), None);
    }

    #[test]
    fn component_lines_match_with_or_without_triple() {
        assert!(is_component("rust-src", "rust-src"));
        assert!(is_component("clippy-x86_64-unknown-linux-gnu", "clippy"));
        assert!(!is_component(
            "rust-std-x86_64-unknown-linux-gnu",
            "rust-src"
        ));
        assert!(!is_component("clippy-preview", "clippy"));
    }
}
