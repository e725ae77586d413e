//! Our counters against the kernel's own, exactly, on a real tap with a slow reader; under
//! every backend this kernel runs, attached at once to the same traffic.
//!
//! Each test asks the kernel what to expect (TUNGETFEATURES, kallsyms, the tap's own flags,
//! the qdisc in front of it): a tap whose ring fills either tail-drops (a stock kernel, a
//! tap without `IFF_BACKPRESSURE` on 7.3, or no qdisc at all) or stops its queue so the
//! qdisc holds the packets (the fix). The identities that hold for both are checked on
//! every run, then those of the behaviour the kernel has.

use std::time::Duration;

use tap_probe_lab::lab::{self, SendReport, SenderConfig};
use tap_probe_observer::bpf::backend::Sources;
use tap_probe_observer::host::report::Row;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::netlink::{QdiscStats, RootQdisc, Rtnl};
use tap_probe_observer::os::netns::run_in;
use tap_probe_observer::os::tap::TapOptions;

use crate::common;
use crate::common::{Checks, Gate, Oracle};

/// Frames sent; the tap's ring holds `tx_queue_len` entries (1000 by default), the reader
/// takes a few thousand per second, so most of these are dropped: at the ring on a stock
/// kernel, at the qdisc with the fix.
const FRAMES: u64 = 20_000;

/// How a run was set up, for the assertions that depend on it.
#[derive(Clone, Copy, Debug)]
struct Setup {
    qdisc: RootQdisc,
    /// The tap was opened with `IFF_BACKPRESSURE`.
    flag: bool,
}

fn tap_with_slow_reader(setup: Setup) {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    if setup.qdisc == RootQdisc::FqCodel && !common::has_qdisc(RootQdisc::FqCodel) {
        return;
    }
    let ns = common::quiet_netns("exact").unwrap();
    let opts = TapOptions {
        backpressure: setup.flag,
        ..TapOptions::default()
    };
    let created = common::tap_with(&ns, "tpx0", setup.qdisc, opts);
    if setup.flag && !common::has_backpressure_flag(&kernel) {
        // Not a skip: a kernel that would ignore the flag must refuse it, saying why.
        let err = format!("{:#}", created.expect_err("IFF_BACKPRESSURE refused"));
        assert!(err.contains("does not support IFF_BACKPRESSURE"), "{err}");
        assert!(err.contains(&kernel_release()), "names the kernel: {err}");
        return;
    }
    let tap = created.unwrap();
    let stops = common::stops_instead_of_dropping(&kernel, &tap, setup.qdisc);
    eprintln!("{setup:?}: this kernel's tap stops instead of dropping: {stops}");
    let filter = common::filter(&ns, "tpx0");
    let mut watchers = common::watchers(&filter);
    for (backend, w) in &mut watchers {
        let start = w.refresh().unwrap();
        assert_eq!(
            start.rows.len(),
            1,
            "{backend:?}: one single-queue tap: {:?}",
            start.rows
        );
    }
    let qdisc_stats =
        || run_in(ns.path(), || Rtnl::open()?.root_qdisc_stats(tap.ifindex())).unwrap();
    // noqueue has no counters of its own.
    let qdisc_before = (setup.qdisc != RootQdisc::Noqueue).then(qdisc_stats);

    let sent = common::flood_slow_reader(ns.path(), &tap, FRAMES, Duration::ZERO);
    let qdisc = qdisc_before.map(|before| delta(&before, &qdisc_stats()));
    eprintln!("sent {sent:?}\nqdisc {qdisc:?}");
    assert_eq!(sent.attempted, FRAMES, "{sent:?}");

    let mut checks = common::Checks::new();
    let mut rows = Vec::new();
    let mut unsampled_said = false;
    for (backend, w) in &mut watchers {
        common::ring_unsampled(w, &mut unsampled_said);
        let end = w.refresh().unwrap();
        let row = end.rows[0].clone();
        eprintln!("{backend:?} ({}):\n{row:#?}", end.sources);
        let gate = Gate::of(*backend, w);
        let run = Run {
            setup,
            sent: &sent,
            qdisc: qdisc.as_ref(),
            sources: &end.sources,
        };
        always(&mut checks, &gate, &row, &run);
        if stops {
            stopping(&gate, &row, &kernel);
        } else {
            tail_dropping(&mut checks, &gate, &row, &run);
        }
        rows.push((*backend, row));
    }
    common::assert_backends_agree(&mut checks, &rows, &watchers);
    common::second_reading::check(&mut checks, &ns, "tpx0", setup.qdisc != RootQdisc::Noqueue);
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// What a run was and what the kernel and the sender say of it.
struct Run<'a> {
    setup: Setup,
    sent: &'a SendReport,
    /// The root qdisc's counters over the run; `None` without a qdisc.
    qdisc: Option<&'a QdiscStats>,
    sources: &'a Sources,
}

/// What holds whatever the kernel does with a full ring.
fn always(checks: &mut Checks, gate: &Gate, row: &Row, run: &Run<'_>) {
    let c = &row.counters;
    gate.holds(c.consumed > 0, "the reader took nothing");
    gate.same(
        c.xmit_calls,
        c.enqueued + c.busy + c.dropped_full_ring + c.dropped_other,
        "every driver call ends enqueued, busy or dropped",
    );
    checks.eq(
        gate,
        Oracle::DeviceStats,
        c.dropped_full_ring + c.dropped_other,
        row.kernel.tx_dropped,
        "drops in the driver vs kernel tx_dropped",
    );
    gate.same(c.dropped_other, 0, format!("{:?}", row.drop_reasons));
    checks.eq(
        gate,
        Oracle::DeviceStats,
        c.consumed,
        row.kernel.tx_packets,
        "consumed vs kernel tx_packets",
    );
    gate.same(c.enqueued, c.consumed, "after the drain the ring is empty");
    gate.holds(!row.stopped, "the drain woke the queue");
    gate.same(
        c.queue_stops,
        c.queue_wakes,
        "every stop seen was followed by a wake",
    );
    if row.wake_sources {
        gate.same(
            c.wakes_reader + c.wakes_vhost + c.wakes_forced + c.wakes_other,
            c.queue_wakes,
            "each wake seen has one waker",
        );
        gate.same(c.wakes_other, 0, "tun wakes from its own paths");
        gate.same(c.wakes_vhost, 0, "no vhost-net here");
    }
    if run.sources.ring_sampled() {
        let ring = row.occupancy.expect("a tap's ring is sampled");
        gate.same(
            ring.samples,
            c.xmit_calls + c.consumed,
            "one sample per driver call and per take",
        );
        gate.same(
            ring.current,
            c.enqueued.checked_sub(c.consumed),
            "at rest, the ring holds what went in and was not taken",
        );
    } else {
        assert_eq!(row.occupancy, None, "not sampled: unknown, not 0");
    }
    match run.qdisc {
        // Without a qdisc every send is one driver call.
        None => {
            assert_eq!(run.setup.qdisc, RootQdisc::Noqueue);
            checks.eq(
                gate,
                Oracle::Sender,
                c.xmit_calls,
                run.sent.attempted,
                "a driver call per frame sent",
            );
        }
        Some(q) => qdisc_accounting(checks, gate, row, run, q),
    }
}

/// What a run through a qdisc leaves in its counters: every packet handed out, every frame
/// sent accounted for, every requeue explained.
fn qdisc_accounting(checks: &mut Checks, gate: &Gate, row: &Row, run: &Run<'_>, q: &QdiscStats) {
    let c = &row.counters;
    // The qdisc hands each packet out once; one the driver sent back (busy) is handed to it
    // again from the requeue list, unseen by the qdisc's count.
    checks.eq(
        gate,
        Oracle::Qdisc,
        c.xmit_calls,
        q.packets + c.busy,
        format!("a driver call per packet the qdisc handed out, again after busy: {q:?}"),
    );
    gate.holds(q.qlen == 0, "the qdisc drained");
    // Every frame sent is accounted for: taken by the reader, dropped by the qdisc or at
    // the ring; nothing is left in either.
    checks.eq(
        gate,
        Oracle::Qdisc,
        c.consumed + q.drops + c.dropped_full_ring,
        run.sent.attempted,
        format!("every frame sent accounted for: {q:?}"),
    );
    // Every requeue is a busy return or a packet put back while stopped.
    let requeues = c.busy + c.requeued_stopped;
    if run.sources.requeues_may_be_short() {
        checks.that(
            gate,
            Oracle::Qdisc,
            requeues <= q.requeues,
            format!("busy + requeued_stopped, from dequeues: {requeues} vs {q:?}"),
        );
    } else {
        checks.eq(
            gate,
            Oracle::Qdisc,
            requeues,
            q.requeues,
            "busy + requeued_stopped",
        );
    }
}

/// The fix: the ring never drops, the queue stops and the qdisc holds the packets.
fn stopping(gate: &Gate, row: &Row, kernel: &KernelInfo) {
    let c = &row.counters;
    assert_eq!(row.backpressure, Some(true), "{:?}", gate.backend());
    gate.holds(
        c.queue_stops >= 1,
        "the ring never filled: this run proves nothing",
    );
    gate.same(
        c.dropped_full_ring,
        0,
        "one sender never races a stop: no packet lost at the ring",
    );
    if common::has_backpressure_flag(kernel) {
        // The merged fix drops rather than return NETDEV_TX_BUSY after it changed the skb.
        gate.same(c.busy, 0, "7.3 never returns NETDEV_TX_BUSY");
    }
    let ring = row.occupancy.unwrap();
    gate.holds(ring.max > 0, format!("{ring:?}"));
}

/// A stock ring: a full ring drops, the queue never stops.
fn tail_dropping(checks: &mut Checks, gate: &Gate, row: &Row, run: &Run<'_>) {
    let c = &row.counters;
    gate.holds(
        c.dropped_full_ring > 0,
        "the ring never filled: this run proves nothing",
    );
    // A tail-dropping tap drops at its ring alone: told apart by the reason the kernel
    // gives, or where it gives none by the driver call's path.
    checks.eq(
        gate,
        Oracle::DeviceStats,
        c.dropped_full_ring,
        row.kernel.tx_dropped,
        "ring-full drops vs kernel tx_dropped",
    );
    gate.same(c.busy, 0, "a tail-dropping tun never returns BUSY");
    gate.same(c.queue_stops, 0, "no stop");
    gate.same(c.requeued_stopped, 0, "no requeue");
    if run.setup.qdisc == RootQdisc::Noqueue {
        // Without a qdisc a ring-full drop is the sender's ENOBUFS.
        checks.eq(
            gate,
            Oracle::Sender,
            c.dropped_full_ring,
            run.sent.enobufs,
            "ring-full drops vs the sender's ENOBUFS",
        );
    }
}

/// The counters of a qdisc between two reads (`qlen` and `backlog` are the later ones).
fn delta(before: &QdiscStats, after: &QdiscStats) -> QdiscStats {
    QdiscStats {
        packets: after.packets - before.packets,
        bytes: after.bytes - before.bytes,
        drops: after.drops - before.drops,
        requeues: after.requeues - before.requeues,
        overlimits: after.overlimits - before.overlimits,
        ..after.clone()
    }
}

fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .unwrap()
        .trim()
        .to_owned()
}

#[test]
fn tap_noqueue_counters_match_kernel() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::Noqueue,
        flag: false,
    });
}

#[test]
fn tap_pfifo_fast_counters_match_kernel() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::PfifoFast,
        flag: false,
    });
}

#[test]
fn tap_fq_codel_counters_match_kernel() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::FqCodel,
        flag: false,
    });
}

/// With `IFF_BACKPRESSURE` where the kernel has it (the fix as merged); elsewhere the
/// flag must be refused.
#[test]
fn tap_backpressure_pfifo_counters_match_kernel() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::Pfifo { limit: None },
        flag: true,
    });
}

#[test]
fn tap_backpressure_fq_codel_counters_match_kernel() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::FqCodel,
        flag: true,
    });
}

/// The flag without a qdisc: nothing to push back into, so the ring tail-drops as before.
#[test]
fn tap_backpressure_noqueue_tail_drops() {
    tap_with_slow_reader(Setup {
        qdisc: RootQdisc::Noqueue,
        flag: true,
    });
}

/// Frames of the reader-sleep test, sent at a pace the reader outruns, so that it finds the
/// ring empty and sleeps between most of them.
const PACED_FRAMES: u64 = 600;

/// A thread's voluntary context switches, as the kernel counts them
/// (`voluntary_ctxt_switches` in `/proc/thread-self/status`), read through a file opened in
/// advance so that the reading itself cannot sleep in a path lookup.
fn voluntary_switches(status: &std::fs::File) -> u64 {
    use std::os::unix::fs::FileExt as _;
    let mut buf = vec![0u8; 4096];
    let n = status.read_at(&mut buf, 0).unwrap();
    let text = String::from_utf8_lossy(&buf[..n]);
    text.lines()
        .find_map(|l| l.strip_prefix("voluntary_ctxt_switches:"))
        .expect("voluntary_ctxt_switches in /proc/thread-self/status")
        .trim()
        .parse()
        .unwrap()
}

/// `reader_sleeps` against the reader thread's own voluntary context switches, counted by
/// the kernel from its first take to its last: a reader that blocks in `read` sleeps only
/// when the ring is empty, so the two must be equal.
#[test]
fn reader_sleeps_match_the_readers_context_switches() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("sleep").unwrap();
    let tap = common::tap_in(&ns, "tps0", RootQdisc::Noqueue).unwrap();
    let filter = common::filter(&ns, "tps0");
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        w.refresh().unwrap();
    }

    let (reads, switches, sent) = std::thread::scope(|s| {
        let reader = s.spawn(|| -> anyhow::Result<(u64, u64)> {
            let status = std::fs::File::open("/proc/thread-self/status")?;
            let fd = tap.queue_fd(0);
            let mut buf = vec![0u8; 65_536];
            let mut reads = 0;
            let mut first = None;
            let mut last = 0;
            while reads < PACED_FRAMES {
                // A blocking read; the bounded poll first only keeps a lost frame from
                // hanging the test (it sleeps exactly where the read would have).
                let mut fds = [nix::poll::PollFd::new(fd, nix::poll::PollFlags::POLLIN)];
                if nix::poll::poll(&mut fds, 5_000u16)? == 0 {
                    break;
                }
                nix::unistd::read(fd, &mut buf)?;
                reads += 1;
                last = voluntary_switches(&status);
                first.get_or_insert(last);
            }
            Ok((reads, last - first.unwrap_or(last)))
        });
        // Slow enough that the reader waits on an empty ring between frames, also where the
        // kernel runs emulated.
        let cfg = SenderConfig {
            batch: 1,
            pps: Some(2_000 / u64::from(common::slowdown())),
            ..SenderConfig::new(tap.ifindex(), PACED_FRAMES, Duration::from_secs(20))
        };
        let sent = run_in(ns.path(), || lab::send(&cfg)).unwrap();
        let (reads, switches) = reader.join().unwrap().unwrap();
        (reads, switches, sent)
    });
    assert_eq!(sent.sent, PACED_FRAMES, "{sent:?}");
    assert_eq!(reads, PACED_FRAMES, "the reader took every frame");
    assert!(
        switches > PACED_FRAMES / 10,
        "the reader slept only {switches} times: it never waited on an empty ring"
    );

    let mut checks = common::Checks::new();
    let mut rows = Vec::new();
    for (backend, w) in &mut watchers {
        let row = w.refresh().unwrap().rows[0].clone();
        eprintln!("{backend:?}: {row:#?}");
        let gate = Gate::of(*backend, w);
        checks.eq(
            &gate,
            Oracle::Reader,
            row.counters.consumed,
            reads,
            "consumed vs reads",
        );
        checks.eq(
            &gate,
            Oracle::DeviceStats,
            row.counters.consumed,
            row.kernel.tx_packets,
            "consumed vs kernel tx_packets",
        );
        checks.eq(
            &gate,
            Oracle::Scheduler,
            row.counters.reader_sleeps,
            switches,
            "reader sleeps vs the reader's voluntary context switches",
        );
        rows.push((*backend, row));
    }
    common::assert_backends_agree(&mut checks, &rows, &watchers);
    drop(watchers);
    drop(tap);
    drop(ns);
}
