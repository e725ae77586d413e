//! The probe's programs by name, as the embedded object gives them, so that a test can find
//! every one left loaded after a run (the kernel keeps the first 15 bytes of a program's
//! name, `BPF_OBJ_NAME_LEN` with the NUL) and tell them from others.

use std::collections::BTreeSet;

use anyhow::{Context as _, Result};

use tap_probe_observer::bpf::object::Object;

/// The names of every program in the probe object.
///
/// # Errors
/// When the embedded object cannot be parsed (a build with `AYA_BUILD_SKIP` has none).
pub fn probe_program_names() -> Result<BTreeSet<String>> {
    let object = aya_obj::Object::parse(Object::Probe.bytes())
        .context("parsing the embedded probe object")?;
    Ok(object.programs.keys().cloned().collect())
}
