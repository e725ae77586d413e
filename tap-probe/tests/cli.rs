//! The command line without privileges: bad input is refused with a clear message, and a
//! reader that closes stdout early ends tap-probe quietly, with SIGPIPE as a shell tool.
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
    // What `yes | head` ends with: a shell shows 141, systemd counts it as a clean end.
    assert_eq!(
        std::os::unix::process::ExitStatusExt::signal(&out.status),
        Some(nix::sys::signal::Signal::SIGPIPE as i32),
        "{:?}: {stderr}",
        out.status
    );
    assert!(stderr.is_empty(), "nothing to say about it: {stderr}");
}

#[test]
fn an_interval_below_the_floor_is_refused() {
    let out = Command::new(BIN)
        .args(["watch", "--interval", "1ns"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("shorter than 10ms"), "{stderr}");
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

/// A trace of `events` arrivals and reads on one tap whose ring has `ring_size` entries.
fn trace(ring_size: u32, events: u64) -> Vec<u8> {
    use tap_probe_trace::{DeviceInfo, Event, EventKind, Header, TraceWriter};
    let header = Header {
        kernel_release: "test".to_owned(),
        backend: "tracepoint".to_owned(),
        start_ns: 1_000,
        devices: vec![DeviceInfo {
            netns: 1,
            ifindex: 2,
            queues: 1,
            ring_size,
            name: "tap0".to_owned(),
        }],
    };
    let mut w = TraceWriter::new(Vec::new(), &header).unwrap();
    for i in 0..events {
        let kind = if i % 2 == 0 {
            EventKind::Enqueued
        } else {
            EventKind::Consumed
        };
        w.event(&Event {
            ts_ns: 1_000 + i * 1_000,
            device: 0,
            queue: 0,
            cpu: 0,
            kind,
            reason: 0,
        })
        .unwrap();
    }
    w.finish().unwrap().0
}

fn replay(file: &std::path::Path, args: &[&str]) -> (Option<i32>, String, String) {
    let out = Command::new(BIN)
        .arg("replay")
        .arg(file)
        .args(args)
        .output()
        .unwrap();
    (
        out.status.code(),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// A ring size or qdisc limit that no kernel has would size the model's memory: refused with
/// an error, never an allocation failure that aborts the process.
#[test]
fn absurd_sizes_are_refused() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("huge.trace");
    std::fs::write(&path, trace(u32::MAX, 4)).unwrap();
    let (code, _, stderr) = replay(&path, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(
        stderr.contains("device ring size 4294967295 is not in 1..=16777216"),
        "{stderr}"
    );
    std::fs::write(&path, trace(500, 4)).unwrap();
    let (code, _, stderr) = replay(&path, &["--qdisc-limit", "4000000000"]);
    assert_eq!(code, Some(2), "{stderr}");
    assert!(
        stderr.contains("4000000000 is not in 0..=16777216"),
        "{stderr}"
    );
    let (code, stdout, stderr) = replay(&path, &["--qdisc-limit", "16777216"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stdout.contains("tail-drop"), "{stdout}");
}

/// A ring size is checked alike wherever it comes from: `--ring-size`, a synthetic
/// workload's `ring=` and a trace's header refuse the same sizes with the same words
/// (none of them replays a ring of 0 entries), and take the largest.
#[test]
fn a_ring_size_is_checked_alike_from_the_flag_the_synthetic_spec_and_a_trace() {
    const WORKLOAD: &str = "producer=const:200k,consumer=poisson:150k,duration=10ms";
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("ring.trace");
    for size in [0, 16_777_217, 4_294_967_295, 1_099_511_627_776_u64] {
        let refused = format!("ring size {size} is not in 1..=16777216");
        let out = Command::new(BIN)
            .args(["replay", "--synthetic", WORKLOAD, "--ring-size"])
            .arg(size.to_string())
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        // A flag clap refuses: the command line's status.
        assert_eq!(out.status.code(), Some(2), "{stderr}");
        assert!(
            stderr.contains(&format!(
                "invalid value '{size}' for '--ring-size <N>': {refused}"
            )),
            "{stderr}"
        );
        let out = Command::new(BIN)
            .args(["replay", "--synthetic"])
            .arg(format!("{WORKLOAD},ring={size}"))
            .output()
            .unwrap();
        let stderr = String::from_utf8_lossy(&out.stderr);
        assert_eq!(out.status.code(), Some(1), "{stderr}");
        assert!(
            stderr.contains(&format!("\"ring={size}\": {refused}")),
            "{stderr}"
        );
        assert!(out.stdout.is_empty());
        if let Ok(size) = u32::try_from(size) {
            std::fs::write(&path, trace(size, 4)).unwrap();
            let (code, stdout, stderr) = replay(&path, &[]);
            assert_eq!(code, Some(1), "{stderr}");
            assert!(stderr.contains(&format!("device {refused}")), "{stderr}");
            assert!(stdout.is_empty(), "{stdout}");
        }
    }
    // The largest is taken from each.
    std::fs::write(&path, trace(16_777_216, 4)).unwrap();
    let (code, _, stderr) = replay(&path, &["--ring-size", "16777216"]);
    assert_eq!(code, Some(0), "{stderr}");
    let out = Command::new(BIN)
        .args(["replay", "--synthetic"])
        .arg(format!("{WORKLOAD},ring=16777216"))
        .output()
        .unwrap();
    assert_eq!(
        out.status.code(),
        Some(0),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
}

/// A synthetic workload is sized before it is generated, from what generation makes: a
/// pause whose every window opens with an event makes one per window, far beyond its mean
/// rate, and is refused at once, naming the bound.
#[test]
fn a_synthetic_workload_too_large_to_generate_is_refused() {
    let out = Command::new(BIN)
        .args([
            "replay",
            "--synthetic",
            "producer=pause:1:1ns:1ns,consumer=const:1,duration=100s",
        ])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(
        stderr.contains("would generate about 5.000e10 operations; at most 1e8"),
        "{stderr}"
    );
}

/// A trace cut short (a killed recorder, a full disk) is refused with a pointer to
/// `--salvage`, which replays it up to the last whole record and says what is missing.
#[test]
fn a_cut_trace_is_salvaged_on_request() {
    let dir = tempfile::tempdir().unwrap();
    let path = dir.path().join("cut.trace");
    let whole = trace(500, 1_000);
    // The trailer (86 bytes) and 5 bytes of the last event record (22) are gone.
    std::fs::write(&path, &whole[..whole.len() - 86 - 17]).unwrap();
    let (code, _, stderr) = replay(&path, &[]);
    assert_eq!(code, Some(1), "{stderr}");
    assert!(stderr.contains("truncated record at byte"), "{stderr}");
    assert!(stderr.contains("--salvage"), "{stderr}");
    let (code, stdout, stderr) = replay(&path, &["--salvage", "--format", "json"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(stderr.contains("was cut short"), "{stderr}");
    assert!(stderr.contains("replaying its 999 events"), "{stderr}");
    assert!(
        stderr.contains("5 bytes after that are a partial record"),
        "{stderr}"
    );
    let report: serde_json::Value = serde_json::from_str(&stdout).unwrap();
    assert_eq!(report["streams"][0]["events"], 999, "{report}");
    // A complete file needs no salvage and gets no warning.
    std::fs::write(&path, &whole).unwrap();
    let (code, _, stderr) = replay(&path, &["--salvage"]);
    assert_eq!(code, Some(0), "{stderr}");
    assert!(!stderr.contains("cut short"), "{stderr}");
}

/// A web config file `serve` and `watch --prometheus` cannot use is refused before anything
/// is attached, without privileges: one line that names the key, and exit status 2, as a
/// bad command line.
#[test]
fn an_unusable_web_config_is_refused_in_one_line_with_status_2() {
    let dir = tempfile::tempdir().unwrap();
    let write = |name: &str, text: &str| {
        std::fs::write(dir.path().join(name), text).unwrap();
        dir.path().join(name)
    };
    let server = rcgen::generate_simple_self_signed(vec!["127.0.0.1".to_owned()]).unwrap();
    write("tls.crt", &server.cert.pem());
    write("tls.key", &server.signing_key.serialize_pem());
    write(
        "other.key",
        &rcgen::KeyPair::generate().unwrap().serialize_pem(),
    );
    let tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n";
    for (text, key) in [
        (
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n  client_auth: x\n"
                .to_owned(),
            "unknown field `client_auth`",
        ),
        (
            "tls_server_config:\n  cert_file: tls.crt\n  key_file: other.key\n".to_owned(),
            "tls_server_config.key_file",
        ),
        (
            format!("{tls}basic_auth_users:\n  prometheus: secret\n"),
            "basic_auth_users.prometheus: not a bcrypt hash",
        ),
    ] {
        let config = write("web.yml", &text);
        for args in [
            vec!["serve", "--listen", "127.0.0.1:0"],
            vec!["watch", "--prometheus", "127.0.0.1:0"],
        ] {
            let out = Command::new(BIN)
                .args(&args)
                .arg("--web.config.file")
                .arg(&config)
                .env_remove("RUST_LOG")
                .output()
                .unwrap();
            let stderr = String::from_utf8_lossy(&out.stderr);
            assert_eq!(out.status.code(), Some(2), "{args:?} {key}: {stderr}");
            assert_eq!(stderr.lines().count(), 1, "one line: {stderr}");
            assert!(
                stderr.contains(&format!("--web.config.file {}: ", config.display()))
                    && stderr.contains(key),
                "{args:?}: {key} in {stderr}"
            );
        }
    }
    // Without --prometheus there is nothing for it to configure.
    let out = Command::new(BIN)
        .args(["watch", "--web.config.file", "web.yml"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert_eq!(out.status.code(), Some(2), "{stderr}");
    assert!(stderr.contains("--prometheus"), "{stderr}");
}
