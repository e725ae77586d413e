//! The command line without privileges: bad input is refused with a clear message, and a
//! reader that closes stdout early ends tap-probe quietly.
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

use std::process::{Command, Stdio};

const BIN: &str = env!("CARGO_BIN_EXE_tap-probe");

#[test]
fn a_closed_stdout_ends_quietly() {
    let (read_end, write_end) = nix::unistd::pipe().unwrap();
    // Nobody reads: the first write fails with EPIPE.
    drop(read_end);
    let out = Command::new(BIN)
        .args([
            "replay",
            "--synthetic",
            "producer=const:200k,consumer=poisson:150k,duration=100ms,ring=256",
        ])
        .stdout(Stdio::from(write_end))
        .stderr(Stdio::piped())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{:?}: {stderr}", out.status);
    assert!(stderr.is_empty(), "nothing to say about it: {stderr}");
}

#[test]
fn an_interval_below_the_floor_is_refused() {
    let out = Command::new(BIN)
        .args(["watch", "--interval", "1e-12"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("shorter than 0.01 s"), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn a_spec_naming_an_unknown_counter_is_refused_before_any_traffic() {
    let dir = tempfile::tempdir().unwrap();
    let spec = dir.path().join("lab.toml");
    let junit = dir.path().join("junit.xml");
    std::fs::write(
        &spec,
        "[[scenario]]\nname = \"typo\"\nqdisc = \"fq-codel\"\npackets = 1000\n\
         expect = [\"dropped_fullring == 0\"]\n",
    )
    .unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg(&spec)
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("dropped_fullring"), "{stderr}");
    assert!(
        stderr.contains("dropped_full_ring"),
        "suggests the right name: {stderr}"
    );
    // No scenario ran: nothing was reported on stdout, and the JUnit report is the spec's
    // problem alone.
    assert!(out.stdout.is_empty());
    let junit = std::fs::read_to_string(&junit).unwrap();
    assert!(junit.contains("<error"), "{junit}");
}
