//! The guest's root filesystem, an initramfs: a static busybox and its applets, the kernel
//! modules to load, the payload's executables (dynamic ones with the libraries `ldd` finds,
//! at the same paths), and an `/init` that sets up, runs the payload and prints exactly one
//! verdict line before powering off.

use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::Command;

use anyhow::{Context as _, bail};

use crate::elf;
use crate::initramfs::Archive;
use crate::kernel::Module;

const BUSYBOX: &str = "/bin/busybox";

/// Busybox applets the init and payloads use; each becomes a symlink to `/bin/busybox`.
const APPLETS: &[&str] = &[
    "sh", "mount", "mkdir", "insmod", "poweroff", "echo", "cat", "uname", "sleep", "ls", "dmesg",
    "grep", "sync", "true", "false", "test", "[", "kill", "timeout", "tr", "sed", "head", "tail",
    "stty", "tar", "cp", "rm", "wc", "env",
];

/// The serial port that carries the payload's standard output, byte for byte: the console
/// (`ttyS0`) also carries the kernel's messages.
pub const STDOUT_TTY: &str = "/dev/ttyS1";
/// The serial port that carries a tar archive of the directory the payload leaves results
/// in, written once the payload ended.
pub const OUT_TTY: &str = "/dev/ttyS2";

/// A guest root filesystem being laid out.
#[derive(Debug)]
pub struct Image {
    archive: Archive,
    /// Where stripped copies of executables go.
    scratch: PathBuf,
    release: String,
    modules: Vec<Module>,
    script: String,
    /// A guest directory sent back over [`OUT_TTY`] after the payload.
    collect: Option<String>,
    /// The payload's working directory.
    cwd: Option<String>,
}

impl Image {
    /// The common base: directories, busybox, the modules (already in load order).
    ///
    /// # Errors
    /// If busybox is missing or not static.
    pub fn new(release: &str, modules: Vec<Module>, scratch: &Path) -> anyhow::Result<Self> {
        let mut archive = Archive::default();
        for dir in ["/proc", "/sys", "/dev", "/run", "/tmp", "/root", "/etc"] {
            archive.dir(dir);
        }
        archive.bytes("/etc/passwd", "root:x:0:0:root:/root:/bin/sh\n", 0o644);
        let busybox = std::fs::read(BUSYBOX).with_context(|| {
            format!("reading {BUSYBOX} (Debian's busybox-static package has it)")
        })?;
        if elf::is_dynamic(&busybox)? {
            bail!("{BUSYBOX} is dynamically linked: install busybox-static");
        }
        archive.bytes(BUSYBOX, busybox, 0o755);
        for applet in APPLETS {
            archive.symlink(&format!("/bin/{applet}"), "busybox");
        }
        for module in &modules {
            archive.host_file(&module.guest_path, &module.host_path, 0o644);
        }
        std::fs::create_dir_all(scratch)
            .with_context(|| format!("creating {}", scratch.display()))?;
        Ok(Self {
            archive,
            scratch: scratch.to_path_buf(),
            release: release.to_owned(),
            modules,
            script: String::new(),
            collect: None,
            cwd: None,
        })
    }

    /// An executable at `guest` (without its debug info); a dynamic one brings the
    /// libraries it needs, at their host paths.
    ///
    /// # Errors
    /// If it cannot be read, or `ldd` cannot list its libraries.
    pub fn executable(&mut self, guest: &str, host: &Path) -> anyhow::Result<()> {
        let data = std::fs::read(host).with_context(|| format!("reading {}", host.display()))?;
        if elf::is_dynamic(&data).with_context(|| host.display().to_string())? {
            self.libraries(host)?;
        }
        let stripped = strip_debug(host, &self.scratch);
        self.archive.host_file(guest, &stripped, 0o755);
        Ok(())
    }

    /// A host program at its own path, with its libraries.
    ///
    /// # Errors
    /// If it is missing or its libraries cannot be listed.
    pub fn host_tool(&mut self, path: &str) -> anyhow::Result<()> {
        if !Path::new(path).exists() {
            bail!("{path} is missing on this host");
        }
        self.executable(path, Path::new(path))
    }

    /// A file at `guest` with the contents of the host file `host`.
    pub fn file(&mut self, guest: &str, host: &Path, mode: u32) {
        self.archive.host_file(guest, host, mode);
    }

    /// An empty directory.
    pub fn dir(&mut self, guest: &str) {
        self.archive.dir(guest);
    }

    /// Shell commands the init runs after its set-up; they set `status` to the payload's
    /// exit status (0: success).
    pub fn script(&mut self, script: &str) {
        self.script.push_str(script);
    }

    /// The payload runs in `dir` (created in the guest).
    pub fn working_dir(&mut self, dir: &str) {
        self.archive.dir(dir);
        self.cwd = Some(dir.to_owned());
    }

    /// After the payload, the guest directory `dir` comes back as a tar archive over
    /// [`OUT_TTY`].
    pub fn collect(&mut self, dir: &str) {
        self.archive.dir(dir);
        self.collect = Some(dir.to_owned());
    }

    /// Writes the initramfs to `out` and returns its size in bytes.
    ///
    /// # Errors
    /// If a file cannot be read or `out` cannot be written.
    pub fn write(mut self, out: &Path) -> anyhow::Result<u64> {
        let init = init_script(
            &self.release,
            &self.modules,
            &self.script,
            self.cwd.as_deref(),
            self.collect.as_deref(),
        );
        self.archive.bytes("/init", init, 0o755);
        self.archive.write(out)
    }

    fn libraries(&mut self, binary: &Path) -> anyhow::Result<()> {
        let output = Command::new("ldd")
            .arg(binary)
            .output()
            .with_context(|| format!("running ldd {}", binary.display()))?;
        if !output.status.success() {
            bail!(
                "ldd {} failed: {}",
                binary.display(),
                String::from_utf8_lossy(&output.stderr).trim()
            );
        }
        for library in ldd_paths(&String::from_utf8_lossy(&output.stdout)) {
            self.archive.host_file(library, Path::new(library), 0o755);
        }
        Ok(())
    }
}

/// A copy of `binary` without debug info in `dir` (test binaries shrink from about 85 to 17
/// MiB, which the guest unpacks into RAM); symbols stay, so backtraces name functions. The
/// binary itself if `strip` fails.
fn strip_debug(binary: &Path, dir: &Path) -> PathBuf {
    let Some(name) = binary.file_name() else {
        return binary.to_path_buf();
    };
    let stripped = dir.join(name);
    let status = Command::new("strip")
        .arg("--strip-debug")
        .arg("-o")
        .arg(&stripped)
        .arg(binary)
        .status();
    if status.is_ok_and(|status| status.success()) {
        stripped
    } else {
        binary.to_path_buf()
    }
}

/// The library paths in `ldd` output: `libc.so.6 => /lib/x86_64-linux-gnu/libc.so.6 (0x..)`
/// and the loader's own `/lib64/ld-linux-x86-64.so.2 (0x..)`; not the vDSO.
fn ldd_paths(ldd: &str) -> Vec<&str> {
    ldd.lines()
        .filter_map(|line| {
            let line = line.trim();
            let path = line.split_once("=>").map_or(line, |(_, path)| path.trim());
            path.split_whitespace().next()
        })
        .filter(|path| path.starts_with('/'))
        .collect()
}

/// Quotes `word` for the init's shell.
#[must_use]
pub fn sh_quote(word: &str) -> String {
    format!("'{}'", word.replace('\'', r"'\''"))
}

/// The guest's `/init`: busybox sh as PID 1. It mounts what tap-probe needs, loads the
/// modules, runs the payload, prints one verdict line and powers off.
fn init_script(
    release: &str,
    modules: &[Module],
    payload: &str,
    cwd: Option<&str>,
    collect: Option<&str>,
) -> String {
    let mut script = String::from(
        r#"#!/bin/sh
# Generated by tap-probe-guest (image.rs): mounts what tap-probe needs, loads the modules,
# runs the payload, prints one verdict line, powers off.
# TERM=dumb: the serial lines carry output to the host; nothing here can draw in place.
export PATH=/usr/sbin:/usr/bin:/sbin:/bin HOME=/root TMPDIR=/tmp RUST_BACKTRACE=1 TERM=dumb
status=0
must() { "$@" || { echo "init: '$*' failed"; status=1; }; }
must mount -t proc proc /proc
must mount -t sysfs sysfs /sys
must mount -t devtmpfs devtmpfs /dev
must mount -t tmpfs tmpfs /run
# Pseudo-terminals (openpty): tests drive watch on one.
must mkdir -p /dev/pts
must mount -t devpts -o ptmxmode=0666 devpts /dev/pts
# No tmpfs on /tmp: the initramfs root is in memory already, and payloads may expect files at
# host paths that lie under /tmp.
must mount -t tracefs tracefs /sys/kernel/tracing
must mount -t debugfs debugfs /sys/kernel/debug
must mount -t bpf bpf /sys/fs/bpf
must mkdir -p /run/netns
# An oops in the kernel code under test ends the run instead of hanging it until the host
# gives up: panic_on_oops makes it a panic, panic=-1 a reboot, QEMU's -no-reboot an exit.
echo 1 > /proc/sys/kernel/panic_on_oops
# The payload's output ports: raw, so bytes pass unchanged (no CR before LF).
for tty in /dev/ttyS1 /dev/ttyS2; do stty -F "$tty" raw -echo 2>/dev/null; done
"#,
    );
    let _ = writeln!(
        script,
        "echo \"init: kernel $(uname -r), expected {release}\""
    );
    for module in modules {
        let _ = writeln!(script, "must insmod {}", module.guest_path);
    }
    script.push_str("[ -e /sys/class/net/lo ] && ip link set lo up 2>/dev/null\n");
    script.push_str("[ \"$status\" -eq 0 ] || echo \"init: set-up failed\"\n");
    if let Some(cwd) = cwd {
        let _ = writeln!(script, "cd {}", sh_quote(cwd));
    }
    // The payload runs only after a clean set-up.
    script.push_str("if [ \"$status\" -eq 0 ]; then\n");
    script.push_str(payload);
    script.push_str("\nfi\n");
    if let Some(dir) = collect {
        let _ = writeln!(
            script,
            "tar -c -C {} . > {OUT_TTY} || echo \"init: sending {dir} back failed\"",
            sh_quote(dir)
        );
    }
    script.push_str(
        r#"if [ "$status" -eq 0 ]; then echo "init: success"; else echo "init: failure (exit $status)"; fi
sync
poweroff -f
"#,
    );
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn ldd_output_yields_library_paths() {
        let ldd = "\tlinux-vdso.so.1 (0x00007f1d71c2e000)\n\
                   \tlibbpf.so.1 => /lib/x86_64-linux-gnu/libbpf.so.1 (0x00007f1d71ace000)\n\
                   \t/lib64/ld-linux-x86-64.so.2 (0x00007f1d71c30000)\n";
        assert_eq!(
            ldd_paths(ldd),
            [
                "/lib/x86_64-linux-gnu/libbpf.so.1",
                "/lib64/ld-linux-x86-64.so.2"
            ]
        );
    }

    #[test]
    fn init_script_runs_the_payload_and_gives_one_verdict() {
        let script = init_script(
            "6.1.0-57-cloud-amd64",
            &[],
            "run 'it'\\''s'\n",
            Some("/work"),
            Some("/out"),
        );
        assert!(script.contains("run 'it'\\''s'\n"));
        assert!(script.contains("cd '/work'\n"));
        assert!(script.contains("tar -c -C '/out' . > /dev/ttyS2"));
        assert_eq!(script.matches("echo \"init: success\"").count(), 1);
        assert!(script.contains("init: failure (exit $status)"));
    }

    #[test]
    fn quoting_survives_quotes() {
        assert_eq!(sh_quote("it's"), r"'it'\''s'");
    }
}
