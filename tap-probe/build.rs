use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};
// A build-dependency only so that cargo reruns this script when the eBPF crate changes.
use tap_probe_ebpf as _;

/// Builds the eBPF objects with the nightly toolchain and bpf-linker, so a plain `cargo build`
/// builds everything. `AYA_BUILD_SKIP=1` skips it (fmt, clippy and pure unit tests then run
/// against empty objects). Also names the commit `tap-probe --version` reports.
fn main() -> anyhow::Result<()> {
    println!("cargo:rustc-env=TAP_PROBE_COMMIT={}", commit());
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tap-probe has no parent directory"))?
        .join("tap-probe-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    if std::env::var_os("AYA_BUILD_SKIP").is_some() {
        // Stub objects so `include_bytes_aligned!` still finds a file for each binary of the
        // eBPF package (aya-build names each object after its binary).
        for object in ["tap-probe", "doctor", "lab"] {
            let out = std::path::PathBuf::from(std::env::var("OUT_DIR")?).join(object);
            if !out.exists() {
                std::fs::write(out, [])?;
            }
        }
    }
    aya_build::build_ebpf(
        [Package {
            name: "tap-probe-ebpf",
            root_dir: root,
            ..Default::default()
        }],
        Toolchain::default(),
    )
}

/// The commit being built: `TAP_PROBE_COMMIT` when set (a build from a source archive),
/// else git's `HEAD`, else `unknown`. The script runs again when `HEAD` moves: a commit or a
/// checkout writes the worktree's `HEAD` or its reflog.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=TAP_PROBE_COMMIT");
    if let Some(commit) = std::env::var("TAP_PROBE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return commit;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|out| out.trim().to_owned())
    };
    for file in ["HEAD", "logs/HEAD"] {
        // A path that does not exist would make cargo run the script on every build.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", file])
            .filter(|path| std::path::Path::new(path).exists())
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}
