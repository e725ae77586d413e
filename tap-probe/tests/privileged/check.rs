//! `tap-probe check` and `tap-probe bench` end to end, on whatever kernel runs the tests:
//! what each must do depends on which version of the tail-drop fix the kernel has, and the
//! tests ask the kernel (`TUNGETFEATURES`, `/dev/vhost-net`) rather than assume.

use std::fmt::Write as _;
use std::path::Path;
use std::process::{Command, Output};

use crate::common;
use crate::common::BIN;
use tap_probe_verdict::Skip;

/// Runs `tap-probe check SPEC --junit` on `spec`; returns the output and the `JUnit` text.
fn check(dir: &Path, spec: &str) -> (Output, String) {
    let spec_path = dir.join("lab.toml");
    let junit = dir.join("junit.xml");
    std::fs::write(&spec_path, spec).unwrap();
    let out = Command::new(BIN)
        .arg("check")
        .arg(&spec_path)
        .arg("--junit")
        .arg(&junit)
        .output()
        .unwrap();
    let junit = std::fs::read_to_string(&junit).unwrap_or_default();
    (out, junit)
}

fn text(bytes: &[u8]) -> String {
    String::from_utf8_lossy(bytes).into_owned()
}

/// A paced run the reader cannot keep up with: the ring fills within the first second.
const SLOW: &str = "packets = 12000\npps = 6000\nreader_pps = 2000\ntx_queue_len = 500\n";

#[test]
fn a_spec_that_holds_passes_and_one_that_cannot_hold_fails() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let flag = common::tun_has_backpressure().unwrap();
    // Identities that hold on every kernel; with the flag, also no ring drop at all.
    let holds = if flag {
        format!(
            "[[scenario]]\nname = \"backpressure\"\nqdisc = \"fq-codel\"\nbackpressure = true\n\
             {SLOW}expect = [\"dropped_full_ring == 0\", \"consumed == kernel_tx_packets\", \
             \"consumed + qdisc_drops == sent\", \"queue_stops >= 1\"]\n"
        )
    } else {
        format!(
            "[[scenario]]\nname = \"accounted\"\nqdisc = \"pfifo\"\n{SLOW}expect = \
             [\"consumed == kernel_tx_packets\", \"dropped_full_ring == kernel_tx_dropped\", \
             \"consumed + dropped_full_ring == sent\"]\n"
        )
    };
    let (out, junit) = check(dir.path(), &holds);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(junit.contains("failures=\"0\" errors=\"0\""), "{junit}");

    // Without a qdisc every kernel tail-drops when the reader falls behind.
    let fails = format!(
        "[[scenario]]\nname = \"tail-drop\"\nqdisc = \"noqueue\"\n{SLOW}\
         expect = [\"dropped_full_ring == 0\"]\n"
    );
    let (out, junit) = check(dir.path(), &fails);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(1), "{stdout}{}", text(&out.stderr));
    assert!(
        stdout.contains("`dropped_full_ring == 0` failed"),
        "{stdout}"
    );
    let failure = junit
        .split("<failure message=\"")
        .nth(1)
        .and_then(|rest| rest.split('"').next())
        .unwrap_or_else(|| panic!("no failure in {junit}"));
    // It names the counter and its value, which cannot be 0.
    assert!(failure.contains("dropped_full_ring"), "{failure}");
    assert!(!failure.contains("dropped_full_ring` = 0"), "{failure}");
}

#[test]
fn backpressure_where_the_kernel_lacks_it_is_a_problem_of_the_kernel() {
    if !tap_probe_verdict::root() {
        return;
    }
    if common::tun_has_backpressure().unwrap() {
        Skip::test("this kernel has IFF_BACKPRESSURE").print();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let spec = format!(
        "[[scenario]]\nname = \"wants the flag\"\nqdisc = \"fq-codel\"\nbackpressure = true\n\
         {SLOW}expect = [\"dropped_full_ring == 0\"]\n"
    );
    let (out, junit) = check(dir.path(), &spec);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(2), "{stdout}{}", text(&out.stderr));
    assert!(stdout.contains("IFF_BACKPRESSURE"), "{stdout}");
    assert!(junit.contains("<error"), "{junit}");
}

#[test]
fn the_vhost_reader_accounts_for_every_frame() {
    if !tap_probe_verdict::root() {
        return;
    }
    if !Path::new("/dev/vhost-net").exists() {
        Skip::test("no /dev/vhost-net on this kernel (load vhost_net)").print();
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let flag = common::tun_has_backpressure().unwrap();
    // Every frame sent is read by vhost-net, dropped at the ring or by the qdisc, or still
    // held by the qdisc behind a queue that vhost-net never woke (a tun that stops its
    // queue with a vhost-net that does not wake it); vhost-net's takes are counted where
    // tun counts tx_packets.
    let mut spec = format!(
        "[[scenario]]\nname = \"vhost, no flag\"\nqdisc = \"fq-codel\"\nreader = \"vhost\"\n\
         {SLOW}expect = [\"consumed == kernel_tx_packets\", \
         \"dropped_full_ring == kernel_tx_dropped\", \
         \"consumed + dropped_full_ring + qdisc_drops + qdisc_backlog == sent\"]\n"
    );
    if flag {
        let _ = write!(
            spec,
            "[[scenario]]\nname = \"vhost, flag\"\nqdisc = \"fq-codel\"\nreader = \"vhost\"\n\
             backpressure = true\n{SLOW}expect = [\"dropped_full_ring == 0\", \
             \"consumed == kernel_tx_packets\", \"consumed + qdisc_drops == sent\"]\n"
        );
    }
    let (out, junit) = check(dir.path(), &spec);
    let stdout = text(&out.stdout);
    assert_eq!(out.status.code(), Some(0), "{stdout}{}", text(&out.stderr));
    assert!(junit.contains("failures=\"0\" errors=\"0\""), "{junit}");
}

#[test]
fn bench_measures_every_cell_or_says_why_not() {
    if !tap_probe_verdict::root() {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "bench",
            "--runs",
            "1",
            "--packets",
            "3000",
            "--format",
            "json",
        ])
        .output()
        .unwrap();
    let stderr = text(&out.stderr);
    let flag = common::tun_has_backpressure().unwrap();
    let patched = std::fs::read_to_string("/proc/kallsyms")
        .unwrap()
        .lines()
        .any(|line| line.split_whitespace().nth(2) == Some("__tun_wake_queue"));
    if !flag && !patched {
        assert!(!out.status.success());
        assert!(stderr.contains("has no tail-drop fix"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let json: serde_json::Value = serde_json::from_slice(&out.stdout).unwrap();
    let paths = if Path::new("/dev/vhost-net").exists() {
        2
    } else {
        1
    };
    let cells = json["cells"].as_array().unwrap();
    // Rows times thread counts (1 and 2) times columns (Stock, Backpressure).
    assert_eq!(cells.len(), paths * 2 * 2, "{json:#}");
    for cell in cells {
        assert_eq!(cell["runs"].as_array().unwrap().len(), 1, "{cell:#}");
        assert!(
            cell["delivered_pps"]["median"].as_f64().unwrap() > 0.0,
            "{cell:#}"
        );
    }
}
