//! A newc ("070701") cpio archive, the format the kernel unpacks as an initramfs
//! (`Documentation/driver-api/early-userspace/buffer-format.rst`), written directly rather
//! than through the `cpio` tool.

use std::collections::BTreeMap;
use std::fmt::Write as _;
use std::fs::File;
use std::io::{BufWriter, Write};
use std::path::{Path, PathBuf};

use anyhow::{Context as _, bail};

const S_IFDIR: u32 = 0o040_000;
const S_IFREG: u32 = 0o100_000;
const S_IFLNK: u32 = 0o120_000;

#[derive(Debug)]
enum Entry {
    Dir,
    /// Contents read from a host file (following symlinks) when the archive is written.
    HostFile {
        source: PathBuf,
        mode: u32,
    },
    Bytes {
        data: Vec<u8>,
        mode: u32,
    },
    Symlink {
        target: String,
    },
}

/// The archive's entries by path (relative, no leading `/`). Sorted order puts every
/// directory before what it holds, which the kernel's unpacker needs.
#[derive(Debug, Default)]
pub(crate) struct Archive {
    entries: BTreeMap<String, Entry>,
}

fn relative(path: &str) -> String {
    path.trim_start_matches('/')
        .trim_end_matches('/')
        .to_owned()
}

impl Archive {
    /// A directory (and its parents).
    pub(crate) fn dir(&mut self, path: &str) {
        let path = relative(path);
        self.parents(&path);
        self.entries.entry(path).or_insert(Entry::Dir);
    }

    /// A regular file with the contents of the host file `source`.
    pub(crate) fn host_file(&mut self, path: &str, source: &Path, mode: u32) {
        self.insert(
            path,
            Entry::HostFile {
                source: source.to_path_buf(),
                mode,
            },
        );
    }

    /// A regular file with contents `data`.
    pub(crate) fn bytes(&mut self, path: &str, data: impl Into<Vec<u8>>, mode: u32) {
        self.insert(
            path,
            Entry::Bytes {
                data: data.into(),
                mode,
            },
        );
    }

    /// A symbolic link to `target`.
    pub(crate) fn symlink(&mut self, path: &str, target: &str) {
        self.insert(
            path,
            Entry::Symlink {
                target: target.to_owned(),
            },
        );
    }

    fn insert(&mut self, path: &str, entry: Entry) {
        let path = relative(path);
        self.parents(&path);
        self.entries.insert(path, entry);
    }

    fn parents(&mut self, path: &str) {
        let mut end = 0;
        while let Some(slash) = path[end..].find('/') {
            end += slash;
            self.entries
                .entry(path[..end].to_owned())
                .or_insert(Entry::Dir);
            end += 1;
        }
    }

    /// Writes the archive to `out` and returns its size in bytes.
    ///
    /// # Errors
    /// If a host file cannot be read, is too large for the format, or `out` cannot be
    /// written.
    pub(crate) fn write(&self, out: &Path) -> anyhow::Result<u64> {
        let file = File::create(out).with_context(|| format!("creating {}", out.display()))?;
        let mut writer = Writer {
            out: BufWriter::with_capacity(1 << 20, file),
            offset: 0,
        };
        for (ino, (path, entry)) in (1_u32..).zip(&self.entries) {
            match entry {
                Entry::Dir => writer.header(ino, S_IFDIR | 0o755, 2, 0, path)?,
                Entry::Bytes { data, mode } => {
                    writer.header(ino, S_IFREG | mode, 1, len(data.len())?, path)?;
                    writer.data(data)?;
                }
                Entry::Symlink { target } => {
                    writer.header(ino, S_IFLNK | 0o777, 1, len(target.len())?, path)?;
                    writer.data(target.as_bytes())?;
                }
                Entry::HostFile { source, mode } => {
                    let mut file = File::open(source)
                        .with_context(|| format!("opening {}", source.display()))?;
                    let size = file.metadata()?.len();
                    let size = u32::try_from(size).with_context(|| {
                        format!("{} is too large for a cpio archive", source.display())
                    })?;
                    writer.header(ino, S_IFREG | mode, 1, size, path)?;
                    let copied = std::io::copy(&mut file, &mut writer.out)
                        .with_context(|| format!("copying {}", source.display()))?;
                    if copied != u64::from(size) {
                        bail!("{} changed size while being archived", source.display());
                    }
                    writer.offset += copied;
                    writer.pad()?;
                }
            }
        }
        writer.header(0, 0, 1, 0, "TRAILER!!!")?;
        writer.out.flush()?;
        Ok(writer.offset)
    }
}

fn len(len: usize) -> anyhow::Result<u32> {
    u32::try_from(len).context("entry too large for a cpio archive")
}

struct Writer {
    out: BufWriter<File>,
    offset: u64,
}

impl Writer {
    /// A newc header: magic, then 13 fields of 8 hex digits (ino, mode, uid, gid, nlink,
    /// mtime, filesize, devmajor, devminor, rdevmajor, rdevminor, namesize, check), then
    /// the NUL-terminated name, padded to 4 bytes.
    fn header(
        &mut self,
        ino: u32,
        mode: u32,
        nlink: u32,
        filesize: u32,
        name: &str,
    ) -> anyhow::Result<()> {
        // Every file has nlink 1: the kernel treats regular files with nlink >= 2 as
        // hard links to be matched up by inode.
        let namesize = len(name.len() + 1)?;
        let fields = [ino, mode, 0, 0, nlink, 0, filesize, 0, 0, 0, 0, namesize, 0];
        let mut header = String::with_capacity(110);
        header.push_str("070701");
        for field in fields {
            let _ = write!(header, "{field:08X}");
        }
        self.raw(header.as_bytes())?;
        self.raw(name.as_bytes())?;
        self.raw(&[0])?;
        self.pad()
    }

    /// File contents, padded to 4 bytes.
    fn data(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.raw(data)?;
        self.pad()
    }

    fn raw(&mut self, data: &[u8]) -> anyhow::Result<()> {
        self.out.write_all(data)?;
        self.offset += data.len() as u64;
        Ok(())
    }

    fn pad(&mut self) -> anyhow::Result<()> {
        let padding = match self.offset % 4 {
            0 => 0,
            rest => 4 - rest,
        };
        self.raw(&[0; 3][..usize::try_from(padding)?])
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    /// Reads back (name, mode, contents) from a newc archive.
    fn entries(archive: &[u8]) -> Vec<(String, u32, Vec<u8>)> {
        let field = |at: usize, index: usize| {
            let hex =
                std::str::from_utf8(&archive[at + 6 + index * 8..at + 14 + index * 8]).unwrap();
            usize::from_str_radix(hex, 16).unwrap()
        };
        let align = |n: usize| n.div_ceil(4) * 4;
        let mut out = Vec::new();
        let mut at = 0;
        loop {
            assert_eq!(&archive[at..at + 6], b"070701");
            assert_eq!(at % 4, 0);
            let (mode, size, namesize) = (field(at, 1), field(at, 6), field(at, 11));
            let name = std::str::from_utf8(&archive[at + 110..at + 110 + namesize - 1])
                .unwrap()
                .to_owned();
            let data_at = align(at + 110 + namesize);
            if name == "TRAILER!!!" {
                return out;
            }
            out.push((
                name,
                u32::try_from(mode).unwrap(),
                archive[data_at..data_at + size].to_vec(),
            ));
            at = align(data_at + size);
        }
    }

    #[test]
    fn archive_round_trips() {
        let dir = std::env::temp_dir().join(format!("xtask-cpio-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let host = dir.join("host");
        std::fs::write(&host, b"hello").unwrap();
        let mut archive = Archive::default();
        archive.bytes("/init", "#!/bin/sh\n", 0o755);
        archive.host_file("/usr/bin/hello", &host, 0o644);
        archive.symlink("/bin/sh", "busybox");
        archive.dir("/proc");
        let out = dir.join("out.cpio");
        let size = archive.write(&out).unwrap();
        let bytes = std::fs::read(&out).unwrap();
        std::fs::remove_dir_all(&dir).unwrap();
        assert_eq!(size, bytes.len() as u64);
        let got = entries(&bytes);
        let names: Vec<&str> = got.iter().map(|(name, _, _)| name.as_str()).collect();
        assert_eq!(
            names,
            [
                "bin",
                "bin/sh",
                "init",
                "proc",
                "usr",
                "usr/bin",
                "usr/bin/hello"
            ]
        );
        assert_eq!(got[1].1, S_IFLNK | 0o777);
        assert_eq!(got[1].2, b"busybox");
        assert_eq!(got[2].1, S_IFREG | 0o755);
        assert_eq!(got[2].2, b"#!/bin/sh\n");
        assert_eq!(got[6].2, b"hello");
        assert_eq!(got[0].1, S_IFDIR | 0o755);
    }
}
