use which::which;

/// Rebuild when bpf-linker changes: cargo does not track the linker itself.
fn main() {
    if let Ok(bpf_linker) = which("bpf-linker") {
        println!("cargo:rerun-if-changed={}", bpf_linker.display());
    }
}
