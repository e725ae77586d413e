//! Devices that appear while tap-probe watches are counted from their first packet, and
//! tracking that begins mid-life says so: a tap created during `watch --wait` and flooded at
//! once, in a namespace that was there and in one that was not; and a queue already stopped
//! when tracking began. The oracles are the kernel's own counters, read with iproute2 (`ip
//! -s -j link`, `tc -s -j qdisc`), and the reader's count.

use std::process::Command;
use std::time::{Duration, Instant};

use tap_probe_lab::lab::{Drive, ReaderConfig, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{Tap, TapOptions};
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::oracle::{Checks, Gate, Oracle};
use crate::common::running::{Lines, Running};

/// Frames of the flood: many times a new tap's ring (its `tx_queue_len`, 1000).
const FRAMES: u64 = 20_000;
/// The reader's rate: far below what the sender manages, so the ring fills at once.
const READER_PPS: u64 = 2_000;

/// What `ip` with `args` prints, parsed: the args ask for JSON (`-j`, to `ip` or the command
/// it runs).
fn ip_json(args: &[&str]) -> serde_json::Value {
    let out = Command::new("ip").args(args).output().unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    serde_json::from_slice(&out.stdout).unwrap()
}

/// The kernel's `tx_packets` and `tx_dropped` of `dev` in `ns`, read by iproute2.
fn ip_stats(ns: &NamedNetns, dev: &str) -> (u64, u64) {
    let links = ip_json(&["-n", ns.name(), "-s", "-j", "link", "show", "dev", dev]);
    let tx = &links[0]["stats64"]["tx"];
    (
        tx["packets"].as_u64().unwrap(),
        tx["dropped"].as_u64().unwrap(),
    )
}

/// The root qdisc's `packets`, `requeues` and `qlen` of `dev` in `ns`, read by `tc`.
fn tc_stats(ns: &NamedNetns, dev: &str) -> (u64, u64, u64) {
    let qdiscs = ip_json(&[
        "netns",
        "exec",
        ns.name(),
        "tc",
        "-s",
        "-j",
        "qdisc",
        "show",
        "dev",
        dev,
    ]);
    let root = qdiscs
        .as_array()
        .unwrap()
        .iter()
        .find(|q| q["root"] == true)
        .unwrap_or_else(|| panic!("no root qdisc on {dev}: {qdiscs}"));
    let n = |field: &str| {
        root[field]
            .as_u64()
            .unwrap_or_else(|| panic!("{field}: {root}"))
    };
    (n("packets"), n("requeues"), n("qlen"))
}

/// The next JSON report of `watch`, within the time a report may take here.
fn next_report(watch: &Running) -> serde_json::Value {
    let line = watch
        .lines
        .recv_timeout(Duration::from_secs(30) * common::slowdown())
        .expect("watch reports within its interval");
    serde_json::from_str(&line).unwrap()
}

/// Creates a tap in `ns` while `watch` runs (it has reported once, so the programs register
/// new devices), floods it at once into a full ring with a slow reader of its own, and
/// checks that every packet of its life is counted: each take and each drop equals the
/// kernel's count and the reader's, and the driver calls equal `tx_packets + tx_dropped`.
fn flood_a_new_tap(watch: &Running, ns: &NamedNetns, name: &str) {
    // No qdisc: every kernel tail-drops beyond the ring, with or without the fix.
    let tap = common::tap_in(ns, name, RootQdisc::Noqueue).unwrap();
    let driven = Drive {
        netns: ns.path(),
        tap: &tap,
        sender: SenderConfig::new(0, FRAMES, Duration::from_secs(20) * common::slowdown()),
        reader: ReaderConfig {
            pps: Some(READER_PPS),
            deadline: Duration::from_mins(1),
            max_packets: None,
        },
        queues: 1,
        linger: Duration::ZERO,
    }
    .run()
    .unwrap();
    let read = driven.read[0].packets + driven.drained[0];
    let (tx_packets, tx_dropped) = ip_stats(ns, name);
    assert!(
        tx_dropped > 0,
        "the ring never filled ({tx_packets} read, none dropped): this run proves nothing"
    );
    // A report after the traffic, when the kernel's columns were read with nothing in flight.
    let deadline = Instant::now() + Duration::from_mins(1) * common::slowdown();
    let (row, report) = loop {
        let report = next_report(watch);
        let row = report["rows"]
            .as_array()
            .unwrap()
            .iter()
            .find(|r| r["ifname"] == name)
            .cloned();
        if let Some(row) = row
            && row["consumed"] == read
            && row["kernel"]["skew"] == 0
        {
            break (row, report);
        }
        assert!(
            Instant::now() < deadline,
            "no report showed all {read} takes of {name}: {report}"
        );
    };
    eprintln!("{name}: {row}");
    check_new_tap_row(
        &row,
        &report,
        read,
        (tx_packets, tx_dropped),
        driven.sent.attempted,
    );
}

/// The row of a tap flooded from birth against the reader's count (`read`), the kernel's
/// statistics and the sender's attempts: every take, drop and driver call of its life.
fn check_new_tap_row(
    row: &serde_json::Value,
    report: &serde_json::Value,
    read: u64,
    (tx_packets, tx_dropped): (u64, u64),
    attempted: u64,
) {
    // The watch's own backend choice counts this device; its counts are held to exactness
    // unless the kernel skipped runs of its programs, which the report says.
    let gate = if report["counts_may_be_short"] == false {
        Gate::none()
    } else {
        Gate::short("the kernel skipped runs of the watch's programs")
    };
    let mut checks = Checks::new();
    checks.eq(
        &Gate::none(),
        Oracle::Reader,
        tx_packets,
        read,
        "the kernel counts each frame the reader took",
    );
    checks.eq(
        &Gate::none(),
        Oracle::Sender,
        tx_packets + tx_dropped,
        attempted,
        "without a qdisc each frame sent is one driver call",
    );
    gate.same(
        row["from_birth"].as_bool(),
        Some(true),
        "counted from birth",
    );
    let kernel = Oracle::DeviceStats;
    let expected = [
        (
            "kernel.tx_packets_at_start",
            kernel,
            0,
            "nothing before tracking",
        ),
        (
            "kernel.tx_dropped_at_start",
            kernel,
            0,
            "nothing before tracking",
        ),
        (
            "kernel.tx_packets",
            kernel,
            tx_packets,
            "the row's kernel column",
        ),
        (
            "kernel.tx_dropped",
            kernel,
            tx_dropped,
            "the row's kernel column",
        ),
        (
            "consumed",
            Oracle::Reader,
            read,
            "every take, from the first",
        ),
        ("consumed", kernel, tx_packets, "every take, from the first"),
        (
            "dropped_full_ring",
            kernel,
            tx_dropped,
            "every drop, at the ring",
        ),
        ("dropped_other", kernel, 0, "every drop at the ring"),
        (
            "xmit_calls",
            kernel,
            tx_packets + tx_dropped,
            "every driver call",
        ),
        ("xmit_calls", Oracle::Sender, attempted, "every driver call"),
        ("enqueued", kernel, tx_packets, "every frame the ring took"),
    ];
    for (field, oracle, theirs, what) in expected {
        let ours = field
            .split('.')
            .fold(row, |v, key| &v[key])
            .as_u64()
            .unwrap_or_else(|| panic!("no {field} in {row}"));
        checks.eq(&gate, oracle, ours, theirs, format!("{field}: {what}"));
    }
}

/// A tap created in a namespace being watched, flooded the moment it exists.
#[test]
fn a_tap_created_while_watching_is_counted_from_its_first_packet() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("born").unwrap();
    let watch = Running::watch(
        &["--netns", ns.name()],
        &["--wait", "--format", "json", "--interval", "0.5"],
        Lines::Stdout,
    );
    let first = next_report(&watch);
    assert_eq!(first["rows"], serde_json::json!([]), "{first}");
    flood_a_new_tap(&watch, &ns, "tpb0");
    let (clean, _) = watch.terminate();
    assert!(clean, "watch stops in order on SIGTERM");
}

/// A tap created in a namespace that did not exist when the watch began (a VM's own
/// namespace), flooded the moment it exists.
#[test]
fn a_tap_in_a_new_namespace_is_counted_from_its_first_packet() {
    if !tap_probe_verdict::root() {
        return;
    }
    let tag = format!("tp-bornns-{}", std::process::id());
    let watch = Running::watch(
        &["--netns", &format!("{tag}-*")],
        &["--wait", "--format", "json", "--interval", "0.5"],
        Lines::Stdout,
    );
    let first = next_report(&watch);
    assert_eq!(first["rows"], serde_json::json!([]), "{first}");
    let ns = NamedNetns::create(&format!("{tag}-0")).unwrap();
    run_in(ns.path(), || {
        for knob in ["all", "default"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1")?;
        }
        Ok(())
    })
    .unwrap();
    flood_a_new_tap(&watch, &ns, "tpb1");
    let (clean, _) = watch.terminate();
    assert!(clean, "watch stops in order on SIGTERM");
}

/// Reads `n` frames from the tap's only queue, waiting for them at most `limit`.
fn read_frames(tap: &Tap, n: u64, limit: Duration) -> u64 {
    tap.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 65_536];
    let end = Instant::now() + limit;
    let mut read = 0;
    while read < n && Instant::now() < end {
        match nix::unistd::read(tap.queue_fd(0), &mut buf) {
            Ok(_) => read += 1,
            Err(nix::errno::Errno::EAGAIN) => std::thread::sleep(Duration::from_millis(1)),
            Err(err) => panic!("reading frame {read} of {n}: {err}"),
        }
    }
    read
}

/// Tracking that begins while the queue is stopped (the ring full, the qdisc holding the
/// rest, the reader away): the stop is counted at the first look, so that the identities
/// hold on every row from then on (`queue_stops = queue_wakes + stopped`; wakes by source
/// summing to `queue_wakes`), and the row says it began mid-life.
#[test]
fn a_queue_stopped_before_tracking_began_keeps_the_identities() {
    const RING: u64 = 1000;
    const HELD: u64 = 300;
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    let ns = common::quiet_netns("stopped").unwrap();
    let opts = TapOptions {
        backpressure: common::has_backpressure_flag(&kernel),
        ..TapOptions::default()
    };
    let qdisc = RootQdisc::Pfifo {
        limit: Some(u32::try_from(2 * RING).unwrap()),
    };
    let tap = common::tap_with(&ns, "tps0", qdisc, opts).unwrap();
    if !common::stops_instead_of_dropping(&kernel, &tap, qdisc) {
        Skip::test(format!(
            "this kernel's tun tail-drops a full ring (tun backpressure {:?}): \
             its queue never stops",
            kernel.tun_backpressure
        ))
        .print();
        return;
    }
    // Nobody reads: the ring fills, the queue stops, the qdisc holds the rest.
    let sent = run_in(ns.path(), || {
        tap_probe_lab::lab::send(&SenderConfig {
            batch: 1,
            ..SenderConfig::new(tap.ifindex(), RING + HELD, Duration::from_secs(30))
        })
    })
    .unwrap();
    assert_eq!(sent.sent, RING + HELD, "{sent:?}");
    let (_, _, qlen) = tc_stats(&ns, "tps0");
    assert_eq!(qlen, HELD, "the stopped queue leaves the rest in the qdisc");
    let (tx_packets, tx_dropped) = ip_stats(&ns, "tps0");
    assert_eq!((tx_packets, tx_dropped), (0, 0));

    // Tracking begins now, with the queue stopped.
    let filter = common::filter(&ns, "tps0");
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        let row = w.refresh().unwrap().rows.remove(0);
        assert!(!row.from_birth, "{row:?}");
        assert_eq!(row.counters.xmit_calls, 0, "{row:?}");
    }
    // The reader comes back and takes everything: the queue wakes, the qdisc drains.
    let read = read_frames(
        &tap,
        RING + HELD,
        Duration::from_secs(30) * common::slowdown(),
    );
    assert_eq!(read, RING + HELD);
    let (tx_packets, tx_dropped) = ip_stats(&ns, "tps0");
    assert_eq!((tx_packets, tx_dropped), (RING + HELD, 0));
    let (_, _, qlen) = tc_stats(&ns, "tps0");
    assert_eq!(qlen, 0, "the qdisc drained");
    let mut checks = Checks::new();
    for (backend, w) in &mut watchers {
        check_stopped_row(&mut checks, *backend, w, read, HELD);
    }
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// A watcher's row after the reader took everything that a stopped queue held when the
/// watcher began: the identities hold, and every take and driver call since is counted.
fn check_stopped_row(checks: &mut Checks, backend: Backend, w: &mut Watcher, read: u64, held: u64) {
    let row = w.refresh().unwrap().rows.remove(0);
    let c = &row.counters;
    eprintln!("{backend:?}: {row:?}");
    let gate = Gate::of(backend, w);
    gate.holds(!row.from_birth, "tracking began mid-life");
    gate.holds(!row.stopped, "the queue runs again");
    gate.same(
        c.queue_stops,
        c.queue_wakes + u64::from(row.stopped),
        "every stop seen is woken or still running",
    );
    if row.wake_sources {
        gate.same(
            c.wakes_reader + c.wakes_vhost + c.wakes_forced + c.wakes_other,
            c.queue_wakes,
            "each wake seen has one waker",
        );
        gate.holds(
            c.queue_wakes >= 1,
            "the stop from before tracking is seen at its wake",
        );
    }
    checks.eq(
        &gate,
        Oracle::DeviceStats,
        row.kernel_at_start.tx_packets,
        0,
        "nothing was read before",
    );
    checks.eq(
        &gate,
        Oracle::Reader,
        c.consumed,
        read,
        "every take since tracking began",
    );
    checks.eq(
        &gate,
        Oracle::DeviceStats,
        c.consumed,
        row.kernel.tx_packets,
        "every take since tracking began",
    );
    // The qdisc held held packets when tracking began: they reached the driver since.
    checks.eq(
        &gate,
        Oracle::Qdisc,
        c.enqueued,
        held,
        "the packets the qdisc held",
    );
    checks.eq(
        &gate,
        Oracle::Qdisc,
        c.xmit_calls,
        held,
        "the packets the qdisc held",
    );
}
