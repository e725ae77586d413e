//! Fidelity of the replay: record a real tap with a slow reader on this (stock) kernel,
//! replay the recording under `tail-drop` with the recorded ring size, and compare the
//! predicted ring-full drops with the kernel's own `tx_dropped`.
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

mod common;

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tap_probe::lab::RootQdisc;
use tap_probe::lab::{Discovery, Filter};
use tap_probe::lab::{Drive, ReaderConfig, SenderConfig};
use tap_probe::model::Policy;
use tap_probe::model::X86_64_BATCH;
use tap_probe::model::{SimConfig, simulate};
use tap_probe_common::EventKind;

const FRAMES: u64 = 20_000;
const DEV: &str = "tprr0";

#[test]
fn replayed_tail_drops_match_kernel_tx_dropped() {
    if !tap_probe::lab::root() {
        return;
    }
    let ns = common::quiet_netns("rr").unwrap();
    let tap = common::tap_in(&ns, DEV, RootQdisc::Noqueue).unwrap();
    let filter = Filter {
        globs: vec![DEV.to_owned()],
        netns: Some(ns.name().to_owned()),
    };
    let stats = || {
        let devs = Discovery::new(&filter).unwrap().scan().unwrap();
        assert_eq!(devs.len(), 1, "{devs:?}");
        (devs[0].stats, devs[0].tx_queue_len)
    };
    let (before, _) = stats();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.trace");

    let (mut recorder, pump) = start_recorder(&trace, ns.name());

    let sent = Drive {
        netns: ns.path(),
        tap: &tap,
        sender: SenderConfig {
            batch: 1,
            ..SenderConfig::new(0, FRAMES, Duration::from_secs(20))
        },
        reader: ReaderConfig {
            pps: Some(4_000),
            deadline: Duration::from_secs(30),
            max_packets: None,
        },
        queues: 1,
        // Let the reader work on a full ring for a while after the burst.
        linger: Duration::from_millis(300),
    }
    .run()
    .unwrap()
    .sent;
    std::thread::sleep(Duration::from_millis(100));

    // SIGINT: the recorder completes the file and exits zero.
    let child = nix::unistd::Pid::from_raw(i32::try_from(recorder.id()).unwrap());
    nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGINT).unwrap();
    let exit = recorder.wait().unwrap();
    let log = pump.join().unwrap();
    assert!(exit.success(), "record failed: {exit}\n{log}");
    let (after, tx_queue_len) = stats();
    let tx_dropped = after.tx_dropped - before.tx_dropped;
    let tx_packets = after.tx_packets - before.tx_packets;
    eprintln!("sent {sent:?}\nkernel tx_dropped {tx_dropped} tx_packets {tx_packets}\n{log}");

    let rec = tap_probe::model::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    assert_eq!(
        rec.trailer.lost, 0,
        "events were lost: the replay cannot be exact"
    );
    assert_eq!(rec.streams.len(), 1, "{:?}", rec.streams.len());
    let stream = &rec.streams[0];
    assert_eq!(
        stream.ring_size, tx_queue_len,
        "the ring size is tx_queue_len"
    );
    assert!(
        tx_dropped > 1000,
        "the ring never filled: this run proves nothing"
    );
    assert_eq!(stream.recorded(EventKind::DroppedFullRing), tx_dropped);
    assert_eq!(stream.recorded(EventKind::Consumed), tx_packets);

    let cfg = SimConfig {
        ring_size: stream.ring_size,
        cache_batch: X86_64_BATCH,
        qdisc_limit: stream.ring_size,
        plot_points: 0,
    };
    let m = simulate(&stream.ops, &cfg, Policy::TailDrop);
    eprintln!("replay: {m:?}");
    assert_eq!(m.arrivals, FRAMES);
    let diff = m.ring_full_drops.abs_diff(tx_dropped);
    assert!(
        diff * 1000 <= tx_dropped * 5,
        "predicted {} ring-full drops, the kernel counted {tx_dropped} (off by {diff}, more \
         than 0.5%)",
        m.ring_full_drops
    );
    // The patched policies lose nothing at the ring on the same arrivals.
    let sw = simulate(&stream.ops, &cfg, Policy::StopWake(0.5));
    assert_eq!(sw.ring_full_drops, 0);
}

/// Starts `tap-probe record` on the test's tap and waits until it has attached ("recording
/// ..." on stderr). The thread returns everything it printed.
fn start_recorder(
    trace: &std::path::Path,
    netns: &str,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut recorder = Command::new(env!("CARGO_BIN_EXE_tap-probe"))
        .args(["record", "-o"])
        .arg(trace)
        .args(["--dev", DEV, "--netns", netns, "--duration", "120"])
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    // Wait for "recording ..." (attached), with a timeout.
    let stderr = recorder.stderr.take().unwrap();
    let (tx, rx) = mpsc::channel();
    let pump = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if line.starts_with("recording ") {
                let _ = tx.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    if rx.recv_timeout(Duration::from_secs(30)).is_err() {
        let _ = recorder.kill();
        let _ = recorder.wait();
        panic!("the recorder did not start: {}", pump.join().unwrap());
    }

    (recorder, pump)
}
