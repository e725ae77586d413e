//! Fidelity of the replay: record a real tap with a slow reader, replay the recording with
//! the recorded ring size, and compare the prediction with what the kernel did: under
//! `tail-drop`, the ring-full drops against the kernel's own `tx_dropped`; under the fix's
//! `stop-wake:1/2`, the stops, wakes and qdisc drops against a run of the same workload on
//! a tap with the fix (where the kernel has it). That run's own recording shows the fix's
//! threshold: between a stop and its wake the reader took half the ring.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::Duration;

use tap_probe_common::{EventKind, WakeClass};
use tap_probe_lab::lab::SenderConfig;
use tap_probe_observer::host::discovery::Discovery;
use tap_probe_observer::kernel::TunBackpressure;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::run_in;
use tap_probe_observer::os::tap::{Tap, TapOptions};
use tap_probe_replay::policy::Policy;
use tap_probe_replay::ring::X86_64_BATCH;
use tap_probe_replay::sim::{SimConfig, simulate};
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::BIN;
use crate::common::{Gate, Oracle};

const FRAMES: u64 = 20_000;
const DEV: &str = "tprr0";

#[test]
fn replayed_tail_drops_match_kernel_tx_dropped() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("rr").unwrap();
    let tap = common::tap_in(&ns, DEV, RootQdisc::Noqueue).unwrap();
    let filter = common::filter(&ns, DEV);
    let stats = || {
        let devs = Discovery::new(&filter).unwrap().matching().unwrap();
        assert_eq!(devs.len(), 1, "{devs:?}");
        (devs[0].stats, devs[0].tx_queue_len)
    };
    let (before, _) = stats();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.trace");

    let (recorder, pump) = start_recorder(&trace, DEV, ns.name());

    // The reader works on a full ring for a while after the burst.
    let sent = common::flood_slow_reader(ns.path(), &tap, FRAMES, Duration::from_millis(300));

    let log = stop_recorder(recorder, pump);
    let (after, tx_queue_len) = stats();
    let tx_dropped = after.tx_dropped - before.tx_dropped;
    let tx_packets = after.tx_packets - before.tx_packets;
    eprintln!("sent {sent:?}\nkernel tx_dropped {tx_dropped} tx_packets {tx_packets}\n{log}");

    let rec = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
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
    let mut checks = common::Checks::new();
    checks.eq(
        &Gate::none(),
        Oracle::DeviceStats,
        stream.recorded(EventKind::DroppedFullRing),
        tx_dropped,
        "ring-full drops recorded vs kernel tx_dropped",
    );
    checks.eq(
        &Gate::none(),
        Oracle::DeviceStats,
        stream.recorded(EventKind::Consumed),
        tx_packets,
        "takes recorded vs kernel tx_packets",
    );

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
    // What the fix would have done with these arrivals is checked against a kernel with the
    // fix (`the_fix_wakes_at_half_the_ring_and_the_replay_predicts_it`), and the replay's
    // policies against a transcription of the kernel's C (`replay::reference`): a check
    // here that stop-wake drops nothing at the ring would only restate the model.
}

/// Starts `tap-probe record` on `dev` and waits until it has attached ("recording ..." on
/// stderr). The thread returns everything it printed.
fn start_recorder(
    trace: &std::path::Path,
    dev: &str,
    netns: &str,
) -> (std::process::Child, std::thread::JoinHandle<String>) {
    let mut recorder = common::stoppable(&mut Command::new(BIN))
        .args(["record", "-o"])
        .arg(trace)
        .args(["--dev", dev, "--netns", netns, "--duration", "120"])
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
    if rx
        .recv_timeout(Duration::from_secs(30) * common::slowdown())
        .is_err()
    {
        let _ = recorder.kill();
        let _ = recorder.wait();
        panic!("the recorder did not start: {}", pump.join().unwrap());
    }

    (recorder, pump)
}

/// Stops a recorder from [`start_recorder`] a moment after the traffic, for its last events
/// to reach it, with SIGINT: it completes the file and ends with that signal. Everything it
/// printed.
fn stop_recorder(
    mut recorder: std::process::Child,
    pump: std::thread::JoinHandle<String>,
) -> String {
    std::thread::sleep(Duration::from_millis(100));
    let child = nix::unistd::Pid::from_raw(i32::try_from(recorder.id()).unwrap());
    nix::sys::signal::kill(child, nix::sys::signal::Signal::SIGINT).unwrap();
    let exit = recorder.wait().unwrap();
    let log = pump.join().unwrap();
    assert!(
        common::stopped_by(exit, nix::sys::signal::Signal::SIGINT),
        "record failed: {exit}\n{log}"
    );
    log
}

/// The workload both runs of the fix's test get: a sender at twice the reader's pace into a
/// small ring, so the fix stops and wakes the queue many times.
const FIX_RING: u32 = 100;
const FIX_SENDER_PPS: u64 = 2_000;
const FIX_READER_PPS: u64 = 1_000;
const FIX_SECONDS: u64 = 4;

/// One recorded run of the workload on a fresh tap `dev` with `qdisc` (`flag`: with
/// `IFF_BACKPRESSURE`): the recording, the qdisc's drops, and when sending ended
/// (`CLOCK_MONOTONIC` ns, the clock of the events).
fn recorded_run(dev: &str, qdisc: RootQdisc, flag: bool) -> (Recording, u64, u64) {
    let ns = common::quiet_netns("fix").unwrap();
    let tap = run_in(ns.path(), || {
        let tap = Tap::create(
            dev,
            TapOptions {
                backpressure: flag,
                ..TapOptions::default()
            },
        )?;
        let mut rtnl = Rtnl::open()?;
        rtnl.set_tx_queue_len(tap.ifindex(), FIX_RING)?;
        rtnl.replace_root_qdisc(tap.ifindex(), qdisc)?;
        rtnl.set_up(tap.ifindex())?;
        Ok(tap)
    })
    .unwrap();
    let qdisc_stats = || run_in(ns.path(), || Rtnl::open()?.root_qdisc_stats(tap.ifindex()));
    let before = qdisc_stats().unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("run.trace");
    let (recorder, pump) = start_recorder(&trace, dev, ns.name());
    let sender = SenderConfig {
        batch: 1,
        pps: Some(FIX_SENDER_PPS),
        ..SenderConfig::new(
            tap.ifindex(),
            FIX_SENDER_PPS * FIX_SECONDS,
            Duration::from_secs(30),
        )
    };
    let started = monotonic_ns();
    let stop = std::sync::atomic::AtomicBool::new(false);
    let (sent, reads) = std::thread::scope(|scope| {
        let reader = scope.spawn(|| paced_reads(&tap, &stop));
        let sent = run_in(ns.path(), || tap_probe_lab::lab::send(&sender)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        (sent, reader.join().unwrap())
    });
    let sending_ended = started + u64::try_from(sent.elapsed.as_nanos()).unwrap();
    let log = stop_recorder(recorder, pump);
    let after = qdisc_stats().unwrap();
    eprintln!(
        "{dev}: {qdisc:?} flag {flag}: sent {sent:?}, read {}\nqdisc {after:?}\n{log}",
        reads.len()
    );
    let rec = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    assert_eq!(
        rec.trailer.lost, 0,
        "events were lost: nothing exact follows"
    );
    let events = read_events(&trace);
    drop(tap);
    drop(ns);
    (
        Recording { rec, events, reads },
        after.drops - before.drops,
        sending_ended,
    )
}

/// Reads the tap at the workload's pace until `stop`, then drains it; returns when each read
/// began (`CLOCK_MONOTONIC` ns), in order: the reader's take of a frame is decided after
/// that instant and before the take's own event.
fn paced_reads(tap: &Tap, stop: &std::sync::atomic::AtomicBool) -> Vec<u64> {
    tap.set_nonblocking(true).unwrap();
    let fd = tap.queue_fd(0);
    let mut buf = vec![0u8; 65_536];
    let mut reads = Vec::new();
    let start = monotonic_ns();
    let period = 1_000_000_000 / FIX_READER_PPS;
    let mut idle_since_stop = 0;
    loop {
        let stopping = stop.load(std::sync::atomic::Ordering::Relaxed);
        if !stopping {
            // The next read is due at start + n * period (an absolute schedule).
            let due = start + reads.len() as u64 * period;
            let now = monotonic_ns();
            if due > now {
                std::thread::sleep(Duration::from_nanos(due - now));
            }
        }
        let began = monotonic_ns();
        match nix::unistd::read(fd, &mut buf) {
            Ok(_) => {
                reads.push(began);
                idle_since_stop = 0;
            }
            Err(nix::errno::Errno::EAGAIN) => {
                if stopping {
                    idle_since_stop += 1;
                    if idle_since_stop > 20 {
                        return reads;
                    }
                    std::thread::sleep(Duration::from_millis(10));
                } else {
                    std::thread::sleep(Duration::from_micros(100));
                }
            }
            Err(err) => panic!("reading the tap: {err}"),
        }
    }
}

struct Recording {
    rec: tap_probe_replay::Recording,
    /// Every event, in time order.
    events: Vec<tap_probe_trace::Event>,
    /// When each of the reader's reads began, in order.
    reads: Vec<u64>,
}

fn read_events(trace: &std::path::Path) -> Vec<tap_probe_trace::Event> {
    let reader = tap_probe_trace::TraceReader::new(std::fs::File::open(trace).unwrap()).unwrap();
    let mut events: Vec<_> = reader
        .map(|r| match r.unwrap() {
            tap_probe_trace::Record::Event(e) => e,
            tap_probe_trace::Record::Lost { count, .. } => {
                panic!("the recorder lost {count} events: the comparison needs every one")
            }
        })
        .collect();
    events.sort_by_key(|e| e.ts_ns);
    events
}

fn monotonic_ns() -> u64 {
    let t = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC).unwrap();
    u64::try_from(t.tv_sec()).unwrap() * 1_000_000_000 + u64::try_from(t.tv_nsec()).unwrap()
}

/// The fix, recorded: where the kernel has it, a tap that stops its queue wakes it when the
/// reader has taken half the ring since the stop, or emptied it. And the replay of the same
/// workload recorded on a tail-dropping tap predicts the fix's stops, wakes and qdisc drops.
#[test]
fn the_fix_wakes_at_half_the_ring_and_the_replay_predicts_it() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    let mode = kernel.tun_backpressure.expect("TUNGETFEATURES");
    if mode == TunBackpressure::Never {
        Skip::test(
            "this kernel's tun has no tail-drop fix: no stop to record, no \
             run to compare the replay with",
        )
        .print();
        return;
    }
    // The qdisc holds as many as the ring, as the replay's pfifo does by default.
    let qdisc = RootQdisc::Pfifo {
        limit: Some(FIX_RING),
    };
    let (fixed, qdisc_drops, fixed_end) =
        recorded_run("tpfix0", qdisc, mode == TunBackpressure::OptIn);
    let half = u64::from(FIX_RING / 2);
    let cycles = check_wakes_at_half(&fixed.events, &fixed.reads, half);
    assert!(
        cycles.threshold > 10,
        "too few stops to show anything: {cycles:?}"
    );

    // The same workload on a tap that tail-drops (no qdisc: every kernel drops at the
    // ring then), recorded; its arrivals and reads replayed under the fix's policy.
    let (plain, _, plain_end) = recorded_run("tpfix1", RootQdisc::Noqueue, false);
    let stream = &plain.rec.streams[0];
    assert_eq!(stream.ring_size, FIX_RING);
    assert!(
        stream.recorded(EventKind::DroppedFullRing) > 0,
        "the plain run tail-dropped"
    );
    // Up to the end of sending: afterwards the two runs differ by what was left queued.
    let mut ops = stream.ops.clone();
    let keep = ops.times.iter().take_while(|&&t| t <= plain_end).count();
    ops.times.truncate(keep);
    ops.ops.truncate(keep);
    let cfg = SimConfig {
        ring_size: FIX_RING,
        cache_batch: X86_64_BATCH,
        qdisc_limit: FIX_RING,
        plot_points: 0,
    };
    let predicted = simulate(&ops, &cfg, Policy::StopWake(0.5));
    let count = |kind: EventKind| {
        fixed
            .events
            .iter()
            .filter(|e| e.kind == kind && e.ts_ns <= fixed_end)
            .count() as u64
    };
    let kernel = [
        ("stops", predicted.stops, count(EventKind::QueueStop)),
        ("wakes", predicted.wakes, count(EventKind::QueueWake)),
        ("qdisc drops", predicted.qdisc_drops, qdisc_drops),
    ];
    let mut worst: f64 = 0.0;
    for (what, model, real) in kernel {
        #[expect(clippy::cast_precision_loss, reason = "a ratio")]
        let off = model.abs_diff(real) as f64 / real.max(1) as f64;
        eprintln!(
            "replay agreement: {what}: predicted {model}, kernel {real} ({:.1}% off)",
            off * 100.0
        );
        worst = worst.max(off);
    }
    eprintln!(
        "replay agreement: worst {:.1}% ({predicted:?})",
        worst * 100.0
    );
    assert!(
        worst <= 0.05,
        "the replay of the tail-drop recording is more than 5% off the fix's own run"
    );
}

/// How the stop..wake cycles of a recording ended.
#[derive(Debug, Default)]
struct Cycles {
    /// Woken by the reader once it had taken `half` since the stop.
    threshold: u64,
    /// ... of those, how many the recording places to the take.
    exact: u64,
    /// Woken by the reader's take that emptied the ring, before `half`.
    emptied: u64,
}

/// Walks the recorded events: between each stop and its wake the reader took exactly
/// `half` entries (the series' threshold), unless the take that woke the queue emptied
/// the ring first.
///
/// What the recording can place: the wake is recorded inside the take that woke the queue
/// (`__tun_wake_queue` runs right after the take, before its copy and its event), so the
/// takes before it are exactly those whose event precedes it. A take is decided after its
/// read began (`reads`, the reader's own clock) and before its event; the stop somewhere in
/// the driver call that stopped, after the previous driver call's event and before its own
/// stop event. A take whose interval overlaps the stop's cannot be placed on either side of
/// it: the check allows for each such take, and counts the cycles without one as exact.
fn check_wakes_at_half(events: &[tap_probe_trace::Event], reads: &[u64], half: u64) -> Cycles {
    struct Stop {
        /// Takes certainly after the stop, and takes that may be.
        certain: u64,
        unsure: u64,
        at: u64,
    }
    let mut cycles = Cycles::default();
    let mut enqueued = 0u64;
    let mut taken = 0u64;
    // The two latest driver call and take events.
    let mut calls = [0u64; 2];
    let mut take_times: Vec<u64> = Vec::new();
    let mut stop: Option<Stop> = None;
    for e in events {
        match e.kind {
            EventKind::Enqueued => {
                enqueued += 1;
                calls = [calls[1], e.ts_ns];
            }
            EventKind::Consumed => {
                let read = reads[usize::try_from(taken).unwrap()];
                assert!(read < e.ts_ns, "read {taken} began after its take's event");
                taken += 1;
                if let Some(s) = &mut stop {
                    if read >= s.at {
                        s.certain += 1;
                    } else {
                        s.unsure += 1;
                    }
                }
                take_times.push(e.ts_ns);
            }
            EventKind::QueueStop => {
                assert!(stop.is_none(), "two stops without a wake at {}", e.ts_ns);
                // The driver call that stopped began after the one before it ended.
                let began = calls[0];
                let unsure = take_times.iter().rev().take_while(|&&t| t > began).count();
                stop = Some(Stop {
                    certain: 0,
                    unsure: u64::try_from(unsure).unwrap(),
                    at: e.ts_ns,
                });
            }
            EventKind::QueueWake => {
                assert_eq!(
                    WakeClass::from_u32(e.reason),
                    Some(WakeClass::Reader),
                    "a wake seen at the wake itself, by the reader: {e:?}"
                );
                let s = stop.take().expect("a wake follows a stop");
                // The waking take is one more than those recorded before the wake.
                let (least, most) = (s.certain + 1, s.certain + s.unsure + 1);
                // Nothing is produced while the queue is stopped: what is left after the
                // waking take is what went in before, less every take up to it.
                let left = enqueued.checked_sub(taken + 1);
                if (least..=most).contains(&half) {
                    cycles.threshold += 1;
                    cycles.exact += u64::from(least == most);
                } else {
                    assert!(
                        most < half && left == Some(0),
                        "woken after {least}..={most} take_times since the stop (not {half}), \
                         {left:?} left in the ring, at {}",
                        e.ts_ns
                    );
                    cycles.emptied += 1;
                }
            }
            _ => {}
        }
    }
    eprintln!("stop..wake cycles: {cycles:?}");
    cycles
}
