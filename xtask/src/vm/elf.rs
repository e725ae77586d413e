//! Just enough ELF64 (little-endian) to read a kernel module's `.modinfo` section and to
//! tell a static executable from a dynamic one.

use anyhow::{Context as _, bail};

/// `PT_INTERP`: the program header naming the dynamic loader.
const PT_INTERP: u32 = 3;

fn read<const N: usize>(data: &[u8], offset: usize) -> anyhow::Result<[u8; N]> {
    data.get(offset..offset + N)
        .and_then(|bytes| bytes.try_into().ok())
        .with_context(|| format!("truncated ELF file (reading {N} bytes at {offset:#x})"))
}

fn u16_at(data: &[u8], offset: usize) -> anyhow::Result<usize> {
    Ok(usize::from(u16::from_le_bytes(read(data, offset)?)))
}

fn u32_at(data: &[u8], offset: usize) -> anyhow::Result<u32> {
    Ok(u32::from_le_bytes(read(data, offset)?))
}

fn usize_at(data: &[u8], offset: usize) -> anyhow::Result<usize> {
    usize::try_from(u64::from_le_bytes(read(data, offset)?)).context("ELF offset overflows")
}

fn check_header(data: &[u8]) -> anyhow::Result<()> {
    // ELFCLASS64, ELFDATA2LSB.
    if data.get(..6) != Some(b"\x7fELF\x02\x01".as_slice()) {
        bail!("not a 64-bit little-endian ELF file");
    }
    Ok(())
}

/// The contents of the section called `name`, if there is one.
///
/// # Errors
/// If `data` is not a well-formed ELF64 little-endian file.
pub fn section<'a>(data: &'a [u8], name: &str) -> anyhow::Result<Option<&'a [u8]>> {
    check_header(data)?;
    let shoff = usize_at(data, 0x28)?;
    let shentsize = u16_at(data, 0x3a)?;
    let shnum = u16_at(data, 0x3c)?;
    let shstrndx = u16_at(data, 0x3e)?;
    let header = |index: usize| -> anyhow::Result<(usize, &'a [u8])> {
        let at = shoff + index * shentsize;
        let name = usize::try_from(u32_at(data, at)?)?;
        let offset = usize_at(data, at + 0x18)?;
        let size = usize_at(data, at + 0x20)?;
        let contents = data
            .get(offset..offset + size)
            .context("section extends past the end of the file")?;
        Ok((name, contents))
    };
    let (_, names) = header(shstrndx)?;
    for index in 0..shnum {
        let (name_offset, contents) = header(index)?;
        let section_name = names
            .get(name_offset..)
            .and_then(|rest| rest.split(|&byte| byte == 0).next())
            .context("section name out of bounds")?;
        if section_name == name.as_bytes() {
            return Ok(Some(contents));
        }
    }
    Ok(None)
}

/// Whether the executable has no dynamic loader (`PT_INTERP`), so that it runs in a guest
/// with no libc. Static-pie executables (Rust's musl default) count as static.
///
/// # Errors
/// If `data` is not a well-formed ELF64 little-endian file.
pub fn is_static(data: &[u8]) -> anyhow::Result<bool> {
    check_header(data)?;
    let phoff = usize_at(data, 0x20)?;
    let phentsize = u16_at(data, 0x36)?;
    let phnum = u16_at(data, 0x38)?;
    for index in 0..phnum {
        if u32_at(data, phoff + index * phentsize)? == PT_INTERP {
            return Ok(false);
        }
    }
    Ok(true)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn this_test_binary_is_elf() {
        let me = std::fs::read(std::env::current_exe().unwrap()).unwrap();
        assert!(section(&me, ".text").unwrap().is_some());
        assert!(section(&me, ".no-such-section").unwrap().is_none());
        // Built for the host's glibc target: dynamic.
        assert!(!is_static(&me).unwrap());
    }

    #[test]
    fn non_elf_is_an_error() {
        assert!(section(b"#!/bin/sh\n", ".text").is_err());
    }
}
