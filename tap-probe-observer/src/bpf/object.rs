//! The eBPF objects `build.rs` builds and embeds: one per binary of the eBPF package.

use anyhow::{Context as _, bail};
use aya::{Ebpf, EbpfLoader};

/// An embedded object.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Object {
    /// Every program and map `watch` and `record` use.
    Probe,
    /// The minimal programs of doctor's attach trials, with no maps.
    Doctor,
    /// The test rigs' programs (the slow veth consumer).
    Lab,
}

impl Object {
    /// The object's bytes; empty in a build with `AYA_BUILD_SKIP`.
    #[must_use]
    pub fn bytes(self) -> &'static [u8] {
        match self {
            Self::Probe => aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/tap-probe")),
            Self::Doctor => aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/doctor")),
            Self::Lab => aya::include_bytes_aligned!(concat!(env!("OUT_DIR"), "/lab")),
        }
    }

    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Probe => "probe",
            Self::Doctor => "doctor",
            Self::Lab => "lab",
        }
    }

    /// Loads the object with `loader`'s settings, after lifting the locked-memory limit.
    ///
    /// # Errors
    /// When this build carries no eBPF objects, or the kernel refuses the object's maps.
    pub fn load(self, loader: &mut EbpfLoader<'_>) -> anyhow::Result<Ebpf> {
        crate::kernel::privileges::raise_memlock();
        let bytes = self.bytes();
        if bytes.is_empty() {
            bail!("this tap-probe was built with AYA_BUILD_SKIP: it carries no eBPF programs");
        }
        loader
            .load(bytes)
            .with_context(|| format!("loading the {} eBPF object", self.name()))
    }
}
