//! The eBPF objects `build.rs` builds and embeds.

/// The probe's object: every program and map `watch` and `record` use.
pub(crate) fn ebpf_object() -> &'static [u8] {
    aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tap-probe"))
}
