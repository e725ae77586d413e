//! Bad input is refused before anything is made: a spec or a baseline that is no file or a
//! pipe, or too large, and an output that cannot be written, each in one line with exit
//! status 2; an output that fails after the run all the same ends it with status 2, never
//! 1. After each, no process, namespace, device, qdisc or file it could have made is left.

use std::io::Write as _;
use std::process::{Command, Output, Stdio};

use crate::common::BIN;
use crate::stop::leftovers::{self, Host};

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// Runs `tap-probe ARGS` with `stdin` and checks that it left nothing behind: no process
/// (the test is the subreaper of all it starts), namespace, device or qdisc.
fn leaving_nothing(args: &[&str], stdin: Stdio) -> Output {
    let host = Host::now();
    let out = Command::new(BIN).args(args).stdin(stdin).output().unwrap();
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added(&format!("tap-probe {}", args.join(" ")));
    out
}

/// A refusal of bad input: exit status 2, nothing on stdout, one line on stderr that
/// contains `says`.
fn assert_refused(out: &Output, says: &str) {
    let stderr = text(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(out.stdout.is_empty(), "{}", text(&out.stdout));
    assert_eq!(stderr.lines().count(), 1, "{stderr}");
    assert!(stderr.contains(says), "{stderr}");
}

/// A scenario that holds on every kernel and takes a moment.
const QUICK: &str = "[[scenario]]\nname = \"quick\"\nqdisc = \"pfifo-fast\"\npackets = 2000\n\
                     expect = [\"consumed == kernel_tx_packets\"]\n";

/// A spec or a baseline is read only when it is a file or a pipe, and only up to 16 MiB:
/// `/dev/zero`, a directory, a file past the bound and an endless pipe are each refused in
/// one line with exit status 2, before anything is made, and the pipe's writer is left with
/// most of what it had to write (the check stopped reading at the bound).
#[test]
fn a_spec_or_baseline_that_is_no_file_or_too_large_is_refused_before_it_is_read() {
    if !tap_probe_verdict::root() {
        return;
    }
    leftovers::subreaper();
    let dir = tempfile::tempdir().unwrap();
    let dir_path = dir.path().to_str().unwrap();
    let out = leaving_nothing(&["check", "/dev/zero"], Stdio::null());
    assert_refused(
        &out,
        "tap-probe check: the spec /dev/zero is a character device, not a file or a pipe; \
         give a TOML file of [[scenario]] tables",
    );
    let out = leaving_nothing(&["check", dir_path], Stdio::null());
    assert_refused(&out, "is a directory, not a file or a pipe");

    // Sparse: 16 MiB and one byte on the file system's word, none of it written.
    let big = dir.path().join("big.toml");
    std::fs::File::create(&big)
        .unwrap()
        .set_len((16 << 20) + 1)
        .unwrap();
    let out = leaving_nothing(&["check", big.to_str().unwrap()], Stdio::null());
    assert_refused(&out, "big.toml is 16777217 bytes, more than 16 MiB");

    let spec = dir.path().join("lab.toml");
    std::fs::write(&spec, QUICK).unwrap();
    let spec = spec.to_str().unwrap();
    let out = leaving_nothing(&["check", spec, "--baseline", "/dev/zero"], Stdio::null());
    assert_refused(
        &out,
        "--baseline /dev/zero is a character device, not a file or a pipe; pass a file \
         written by `tap-probe check --save-baseline FILE`",
    );
    let out = leaving_nothing(
        &["check", spec, "--baseline", big.to_str().unwrap()],
        Stdio::null(),
    );
    assert_refused(&out, "--baseline ");
    assert_refused(&out, "is 16777217 bytes, more than 16 MiB");

    // A pipe has no size: it is read up to the bound and one byte, then refused.
    let (reader, mut writer) = std::io::pipe().unwrap();
    let offered: usize = 256 << 20;
    let feeder = std::thread::spawn(move || {
        let chunk = vec![b'#'; 1 << 20];
        let mut written = 0;
        while written < offered && writer.write_all(&chunk).is_ok() {
            written += chunk.len();
        }
        written
    });
    let out = leaving_nothing(&["check", "/dev/stdin"], Stdio::from(reader));
    assert_refused(&out, "the spec /dev/stdin is larger than 16 MiB");
    let written = feeder.join().unwrap();
    assert!(written < offered, "the check read all {written} bytes");
    // Nothing was written beside the inputs.
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["big.toml", "lab.toml"]);
}

/// Every output is checked before a namespace, a tap or a probe exists: a `--junit` file in
/// a missing directory, a `--save-baseline` that is a directory, a trace for `record -o`,
/// a plot for `replay --plot` and a directory for `vm --out` that cannot be made are each
/// refused in one line with exit status 2, having made nothing.
#[test]
fn every_output_is_checked_before_anything_is_made() {
    if !tap_probe_verdict::root() {
        return;
    }
    leftovers::subreaper();
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("lab.toml");
    std::fs::write(&spec, QUICK).unwrap();
    let spec = spec.to_str().unwrap();
    let missing = dir.path().join("no/such/j.xml");
    let out = leaving_nothing(
        &["check", spec, "--junit", missing.to_str().unwrap()],
        Stdio::null(),
    );
    assert_refused(
        &out,
        &format!(
            "tap-probe check: --junit {} cannot be created: No such file or directory (os \
             error 2) (the directory {} does not exist)",
            missing.display(),
            missing.parent().unwrap().display()
        ),
    );
    let out = leaving_nothing(
        &[
            "check",
            spec,
            "--save-baseline",
            dir.path().to_str().unwrap(),
        ],
        Stdio::null(),
    );
    assert_refused(&out, "--save-baseline ");
    assert_refused(&out, "is a directory; name a file");
    let trace = dir.path().join("no/such/t.trace");
    let out = leaving_nothing(
        &["record", "-o", trace.to_str().unwrap(), "--dev", "tp-none0"],
        Stdio::null(),
    );
    assert_refused(&out, "-o ");
    assert_refused(&out, "t.trace cannot be created: No such file or directory");
    let out = leaving_nothing(
        &[
            "replay",
            "--synthetic",
            "producer=const:1k,consumer=const:1k,duration=10ms,ring=16",
            "--plot",
            dir.path().join("no/such/p.svg").to_str().unwrap(),
        ],
        Stdio::null(),
    );
    assert_refused(&out, "--plot ");
    assert_refused(&out, "p.svg cannot be created: No such file or directory");
    let file = dir.path().join("lab.toml/out");
    let out = leaving_nothing(
        &[
            "vm",
            "--kernel",
            "debian-7.3",
            "--out",
            file.to_str().unwrap(),
            "--",
            "doctor",
        ],
        Stdio::null(),
    );
    assert_refused(&out, "--out ");
    assert_refused(&out, "lab.toml/out cannot be");
    let mut left: Vec<_> = std::fs::read_dir(dir.path())
        .unwrap()
        .map(|e| e.unwrap().file_name())
        .collect();
    left.sort();
    assert_eq!(left, ["lab.toml"]);
}

/// An output that takes the check before the run but not the writing after it (`/dev/full`)
/// ends the run with exit status 2, the run could not be completed (not 1, an expectation
/// failed): the scenario runs, its `JUnit` file is written, the baseline is not, and the
/// summary's last line names the output and states that status.
#[test]
fn an_output_that_fails_after_the_run_ends_it_with_status_2() {
    if !tap_probe_verdict::root() {
        return;
    }
    leftovers::subreaper();
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("lab.toml");
    std::fs::write(&spec, QUICK).unwrap();
    let spec = spec.to_str().unwrap();
    let junit = dir.path().join("junit.xml");
    let out = leaving_nothing(
        &[
            "check",
            spec,
            "--junit",
            junit.to_str().unwrap(),
            "--save-baseline",
            "/dev/full",
        ],
        Stdio::null(),
    );
    let (stdout, stderr) = (text(&out.stdout), text(&out.stderr));
    assert_eq!(out.status.code(), Some(2), "{stdout}{stderr}");
    assert!(
        stdout.ends_with(
            "1 scenarios: 1 passed, 0 failed, 0 errors; not written: --save-baseline \
             /dev/full (exit 2)\n"
        ),
        "{stdout}{stderr}"
    );
    assert!(
        stderr.contains(
            "tap-probe check: --save-baseline /dev/full could not be written: No space left \
             on device"
        ),
        "{stderr}"
    );
    let junit = std::fs::read_to_string(&junit).unwrap();
    assert!(junit.contains("failures=\"0\" errors=\"0\""), "{junit}");
}
