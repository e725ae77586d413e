//! A kernel tap-probe cannot watch at all: one without BTF, one without the tun/tap
//! functions. Each is made for one command run, in a mount namespace of its own: a tmpfs
//! over `/sys/kernel/btf` hides the kernel's BTF, a copy of `/proc/kallsyms` without tun's
//! and tap's symbols, mounted over it, hides those. The command names what is missing in one
//! line and exits 2, without a panic; `doctor` still prints its whole report first.
use std::ffi::CString;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Output};

use crate::common::BIN;

/// What the command's mount namespace hides.
enum Hide<'a> {
    /// The kernel's BTF.
    Btf,
    /// Every tun and tap symbol: kallsyms is this file instead.
    TunTap(&'a Path),
}

/// `tap-probe ARGS` with `hide` hidden from it, and only from it.
fn run_hiding(hide: &Hide<'_>, args: &[&str]) -> Output {
    // Made before the fork: the child only makes system calls.
    let cstr = |s: &str| CString::new(s).expect("no NUL");
    let root = cstr("/");
    let (source, target, fstype, flags) = match hide {
        Hide::Btf => (
            cstr("tmpfs"),
            cstr("/sys/kernel/btf"),
            Some(cstr("tmpfs")),
            0,
        ),
        Hide::TunTap(file) => (
            cstr(file.to_str().expect("UTF-8 path")),
            cstr("/proc/kallsyms"),
            None,
            libc::MS_BIND,
        ),
    };
    let mut command = Command::new(BIN);
    command.args(args);
    // SAFETY: the closure makes three system calls on strings made before the fork.
    unsafe {
        command.pre_exec(move || {
            let fail = |rc: i32| {
                if rc == 0 {
                    Ok(())
                } else {
                    Err(std::io::Error::last_os_error())
                }
            };
            fail(libc::unshare(libc::CLONE_NEWNS))?;
            // Nothing mounted here reaches the host's namespace.
            fail(libc::mount(
                std::ptr::null(),
                root.as_ptr(),
                std::ptr::null(),
                libc::MS_REC | libc::MS_PRIVATE,
                std::ptr::null(),
            ))?;
            fail(libc::mount(
                source.as_ptr(),
                target.as_ptr(),
                fstype.as_ref().map_or(std::ptr::null(), |f| f.as_ptr()),
                flags,
                std::ptr::null(),
            ))
        });
    }
    command.output().expect("running tap-probe")
}

/// The command exited 2 with one line on stderr that says `missing`, and did not panic.
#[track_caller]
fn assert_refused(out: &Output, missing: &str) {
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    let lines: Vec<&str> = stderr.lines().filter(|l| !l.trim().is_empty()).collect();
    assert_eq!(lines.len(), 1, "one line: {stderr}");
    assert!(lines[0].starts_with("tap-probe: error: "), "{stderr}");
    assert!(lines[0].contains(missing), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_kernel_without_btf_is_named_in_one_line_and_exits_2() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().expect("temp dir");
    let trace = dir.path().join("run.trace");
    let trace = trace.to_str().expect("UTF-8 path");
    for args in [
        &["watch", "--duration", "1s"][..],
        &["record", "-o", trace, "--wait", "--duration", "1s"][..],
    ] {
        let out = run_hiding(&Hide::Btf, args);
        assert_refused(
            &out,
            "this kernel has no BTF (/sys/kernel/btf/vmlinux is missing",
        );
        assert!(out.stdout.is_empty(), "{args:?}: nothing on stdout");
    }
    let out = run_hiding(&Hide::Btf, &["doctor"]);
    assert_refused(&out, "this kernel has no BTF");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(
        report.contains("btf           FAILED  /sys/kernel/btf/vmlinux is missing"),
        "doctor still reports: {report}"
    );
    assert!(report.contains("kallsyms      ok"), "{report}");
}

#[test]
fn a_kernel_without_tun_or_tap_is_named_in_one_line_and_exits_2() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kallsyms = std::fs::read_to_string("/proc/kallsyms").expect("reading /proc/kallsyms");
    // Every symbol of the tun and tap modules, and tun's and tap's own where built in.
    let without: String = kallsyms
        .lines()
        .filter(|line| {
            let mut fields = line.split_whitespace().skip(2);
            let name = fields.next().unwrap_or_default();
            let module = fields.next().unwrap_or_default();
            !(module == "[tun]"
                || module == "[tap]"
                || ["tun_", "tap_", "__tun_"]
                    .iter()
                    .any(|prefix| name.starts_with(prefix)))
        })
        .flat_map(|line| [line, "\n"])
        .collect();
    assert!(
        without.len() < kallsyms.len(),
        "tun or tap symbols were there"
    );
    let dir = tempfile::tempdir().expect("temp dir");
    let file = dir.path().join("kallsyms");
    std::fs::write(&file, without).expect("writing");
    let hide = Hide::TunTap(&file);
    let out = run_hiding(&hide, &["watch", "--duration", "1s"]);
    assert_refused(&out, "this kernel has none of the tun/tap read functions");
    let out = run_hiding(&hide, &["doctor"]);
    assert_refused(&out, "none of the tun/tap read functions");
    let report = String::from_utf8_lossy(&out.stdout);
    assert!(report.contains("btf           ok"), "{report}");
    assert!(
        report.contains("reader ranges"),
        "doctor still reports: {report}"
    );
}
