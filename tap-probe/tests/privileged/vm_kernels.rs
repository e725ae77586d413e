//! `tap-probe vm` with a kernel of the user's own, as on a machine that never ran it: a
//! kernel package (`--kernel FILE.deb`) and a kernel build (`--kernel bzImage --modules
//! DIR`), each booted with a cache directory that does not exist yet. Both boot Debian 11's
//! 5.10, the oldest kernel tap-probe supports, and run `doctor` there.
use std::path::{Path, PathBuf};
use std::process::{Command, Output};

use tap_probe_guest::Series;

use crate::common::BIN;

/// Debian's 5.10 image package, downloaded once into the user's cache (`--kernel` takes
/// what a user downloaded; here apt is that user).
fn package() -> PathBuf {
    let cache = tap_probe_guest::cache_dir().expect("a cache directory");
    let debs = tap_probe_guest::kernel::download(Series::Debian5_10, &cache)
        .expect("downloading Debian's 5.10 kernel package");
    debs.into_iter().next().expect("the image package")
}

/// `tap-probe vm ARGS -- doctor` with `cache` as the only cache, which does not exist yet.
fn doctor_in_guest(cache: &Path, args: &[&std::ffi::OsStr]) -> Output {
    assert!(!cache.exists(), "a cache that does not exist yet");
    Command::new(BIN)
        .arg("vm")
        .args(args)
        .args(["--timeout", "10m", "--", "doctor"])
        .env("XDG_CACHE_HOME", cache)
        .output()
        .expect("running tap-probe vm")
}

/// The guest ran doctor to its end on 5.10, and it could watch there.
#[track_caller]
fn assert_doctor_ran(out: &Output) {
    let stdout = String::from_utf8_lossy(&out.stdout);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(0), "{stdout}\n{stderr}");
    assert!(
        stdout
            .lines()
            .any(|l| l.starts_with("kernel ") && l.contains("ok") && l.contains(" 5.10.")),
        "{stdout}"
    );
    assert!(
        !stdout.contains("watch --backend auto: FAILED"),
        "watch works there: {stdout}"
    );
}

#[test]
fn a_kernel_package_boots_from_an_empty_cache() {
    let deb = package();
    let dir = tempfile::tempdir().expect("temp dir");
    let cache = dir.path().join("fresh").join("cache");
    let out = doctor_in_guest(&cache, &["--kernel".as_ref(), deb.as_os_str()]);
    assert_doctor_ran(&out);
    // The package was unpacked into the new cache, whole.
    let unpacked: Vec<PathBuf> = std::fs::read_dir(cache.join("tap-probe/debs"))
        .expect("the cache's packages")
        .map(|entry| entry.expect("an entry").path())
        .collect();
    assert_eq!(unpacked.len(), 1, "{unpacked:?}");
    assert!(unpacked[0].join(".complete").exists(), "{unpacked:?}");
}

#[test]
fn a_kernel_build_with_its_modules_boots_from_an_empty_cache() {
    let deb = package();
    let dir = tempfile::tempdir().expect("temp dir");
    // What `make bzImage modules_install INSTALL_MOD_PATH=build` leaves: the image, and
    // `lib/modules/RELEASE` under the modules' directory.
    let build = dir.path().join("build");
    let unpacked = Command::new("dpkg-deb")
        .arg("-x")
        .arg(&deb)
        .arg(&build)
        .status()
        .expect("running dpkg-deb");
    assert!(unpacked.success());
    let image = std::fs::read_dir(build.join("boot"))
        .expect("the package's boot directory")
        .map(|entry| entry.expect("an entry").path())
        .find(|path| {
            path.file_name()
                .and_then(|n| n.to_str())
                .is_some_and(|n| n.starts_with("vmlinuz-"))
        })
        .expect("a vmlinuz in the package");
    let cache = dir.path().join("fresh").join("cache");
    let out = doctor_in_guest(
        &cache,
        &[
            "--kernel".as_ref(),
            image.as_os_str(),
            "--modules".as_ref(),
            build.as_os_str(),
        ],
    );
    assert_doctor_ran(&out);
}
