//! The probe's programs as the kernel lists them, so that a test can find every one left
//! loaded after a run: the names the embedded object gives them, cut as the kernel cuts a
//! program's name (`BPF_OBJ_NAME_LEN`, 16 bytes with the NUL).

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};

use crate::bpf::object::Object;

/// The longest program name the kernel keeps.
const KERNEL_NAME_LEN: usize = 15;

/// The names of every program in the probe object, as the kernel lists loaded programs.
///
/// # Errors
/// When the embedded object cannot be parsed (a build with `AYA_BUILD_SKIP` has none).
pub fn probe_program_names() -> Result<BTreeSet<String>> {
    let object = aya_obj::Object::parse(Object::Probe.bytes())
        .context("parsing the embedded probe object")?;
    Ok(object
        .programs
        .keys()
        .map(|name| name.chars().take(KERNEL_NAME_LEN).collect())
        .collect())
}
