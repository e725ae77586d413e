use anyhow::{Context as _, anyhow};
use aya_build::{Package, Toolchain};
// A build-dependency only so that cargo reruns this script when the eBPF crate changes.
use tap_probe_ebpf as _;

/// Builds the eBPF objects with the nightly toolchain and bpf-linker, so a plain `cargo build`
/// builds everything; `bpf/object.rs` embeds them. `AYA_BUILD_SKIP=1` skips it (fmt, clippy
/// and pure unit tests then run against empty objects).
fn main() -> anyhow::Result<()> {
    let manifest_dir = std::env::var("CARGO_MANIFEST_DIR").context("CARGO_MANIFEST_DIR")?;
    let root = std::path::Path::new(&manifest_dir)
        .parent()
        .ok_or_else(|| anyhow!("tap-probe-observer has no parent directory"))?
        .join("tap-probe-ebpf");
    let root = root.to_str().ok_or_else(|| anyhow!("non-UTF-8 path"))?;
    if std::env::var_os("AYA_BUILD_SKIP").is_some() {
        // Stub objects so `include_bytes_aligned!` still finds a file for each binary of the
        // eBPF package (aya-build names each object after its binary).
        for object in ["tap-probe", "doctor", "lab", "floor"] {
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
