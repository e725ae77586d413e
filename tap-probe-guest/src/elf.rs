//! What the guest image needs to know of ELF files: a kernel module's `.modinfo` fields and
//! whether an executable needs a dynamic loader.

use anyhow::Context as _;
use object::{Object as _, ObjectSection as _};

/// The `key=value` entries of a kernel module's `.modinfo` section (NUL-separated, as
/// `modinfo` reads them) whose key is `key`.
///
/// # Errors
/// If `module` is not an ELF file or has no `.modinfo` section.
pub fn modinfo(module: &[u8], key: &str) -> anyhow::Result<Vec<String>> {
    let file = object::File::parse(module).context("not an ELF file")?;
    let section = file
        .section_by_name(".modinfo")
        .context("no .modinfo section: not a kernel module")?;
    let data = section.data().context("unreadable .modinfo section")?;
    let prefix = format!("{key}=");
    Ok(data
        .split(|&byte| byte == 0)
        .filter_map(|entry| entry.strip_prefix(prefix.as_bytes()))
        .map(|value| String::from_utf8_lossy(value).into_owned())
        .collect())
}

/// Whether the ELF file has a section called `name`.
///
/// # Errors
/// If `data` is not an ELF file.
pub fn has_section(data: &[u8], name: &str) -> anyhow::Result<bool> {
    let file = object::File::parse(data).context("not an ELF file")?;
    Ok(file.section_by_name(name).is_some())
}

/// Whether the executable names a dynamic loader (`PT_INTERP`): such a binary needs its
/// libraries in the guest. Static-pie executables (Rust's musl default) count as static.
///
/// # Errors
/// If `data` is not an ELF file.
pub fn is_dynamic(data: &[u8]) -> anyhow::Result<bool> {
    let file = object::File::parse(data).context("not an ELF file")?;
    Ok(file.section_by_name(".interp").is_some())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_dynamic() {
        let me = std::fs::read(std::env::current_exe().expect("own path")).expect("own binary");
        // Built for the host's glibc target.
        assert!(is_dynamic(&me).expect("an ELF file"));
        assert!(has_section(&me, ".text").expect("an ELF file"));
        assert!(!has_section(&me, ".no-such-section").expect("an ELF file"));
        assert!(modinfo(&me, "depends").is_err(), "not a module");
    }

    #[test]
    fn non_elf_is_an_error() {
        assert!(is_dynamic(b"#!/bin/sh\n").is_err());
    }
}
