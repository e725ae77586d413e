//! `reordered`, against witnesses that are not tap-probe: a tap reader that counts the
//! frames it reads out of their flow's order (netem reordering on purpose), and the
//! receiving TCP stack's own out-of-order counter (`TcpExtTCPOFOQueue`) behind a veth whose
//! peer reads slowly, where a busy driver and the qdisc's requeue reorder TCP (the seeds'
//! "net/sched: fix packet reordering on requeue").
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

mod common;

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tap_probe::lab::{
    self, Drive, Filter, QdiscStats, ReaderConfig, RootQdisc, Rtnl, SENDER_DEV, SenderConfig,
    TcpCounters, VethConfig, VethLink, run_in,
};
use tap_probe_common::QueueCounters;

/// Per packet on the veth peer: slow enough that one TCP sender fills the ring, on this host
/// and under TCG alike.
const HOLD_NS: u64 = 20_000;
/// TCP streams, as in the seed's measurement.
const STREAMS: u32 = 4;
const SECS: u64 = 5;

/// netem sends a quarter of the frames (and half of those right after one) at once and holds
/// the rest 2 ms: at 10 kpps about 20 frames are overtaken each time. Every frame the driver
/// takes is read (the reader keeps up, nothing drops), in the order the driver took them: the
/// probe and the reader count the same frames as late, exactly.
#[test]
fn netem_reordering_is_counted_as_the_reader_sees_it() {
    if !lab::root() {
        return;
    }
    let ns = common::quiet_netns("ro-netem").unwrap();
    let tap = common::tap_in(&ns, "tpro0", RootQdisc::Pfifo { limit: None }).unwrap();
    let tc = run_in(ns.path(), || {
        Ok(Command::new("tc")
            .args(["qdisc", "replace", "dev", "tpro0", "root", "netem"])
            .args(["delay", "2ms", "reorder", "25%", "50%", "limit", "100000"])
            .output()?)
    })
    .unwrap();
    if !tc.status.success() {
        let err = String::from_utf8_lossy(&tc.stderr);
        assert!(err.contains("unknown"), "tc refused netem: {err}");
        eprintln!("skipping test - this kernel has no sch_netem: {err}");
        return;
    }
    let filter = Filter {
        globs: vec!["tpro0".to_owned()],
        netns: Some(ns.name().to_owned()),
        macvtap: false,
    };
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        assert!(!w.refresh().unwrap().rows.is_empty());
    }
    let driven = Drive {
        netns: ns.path(),
        tap: &tap,
        sender: SenderConfig {
            pps: Some(10_000),
            batch: 8,
            flows: 4,
            ..SenderConfig::new(tap.ifindex(), 20_000, Duration::from_secs(20))
        },
        reader: ReaderConfig {
            pps: None,
            deadline: Duration::from_secs(30),
            max_packets: None,
        },
        queues: 1,
        linger: Duration::from_millis(500),
    }
    .run()
    .unwrap();
    let read = driven.read[0];
    eprintln!("{driven:?}");
    assert_eq!(driven.drained, [0], "the reader read every frame itself");
    assert!(
        read.reordered > 0,
        "netem reordered nothing: this run proves nothing"
    );
    for (backend, w) in &mut watchers {
        let c = total(&w.refresh().unwrap().rows);
        eprintln!("{backend:?}: {c:?}");
        if !common::exact_under_softirq(*backend, w) {
            assert!(c.enqueued <= read.packets, "{backend:?}");
            assert!(c.reordered <= read.reordered, "{backend:?}");
            continue;
        }
        assert_eq!(
            c.enqueued, read.packets,
            "{backend:?}: every frame taken was read"
        );
        assert_eq!(
            c.reordered, read.reordered,
            "{backend:?}: the probe and the reader count the same late frames"
        );
    }
}

/// The flow table holds `MAX_FLOWS` flows: cycled through more flows than that, the least
/// recently seen are forgotten and taken up again at their next frame (`flows_joined`),
/// never at a flow's first frame; within the table, none is.
#[test]
fn flows_beyond_the_table_are_taken_up_again() {
    if !lab::root() {
        return;
    }
    let table = u64::from(tap_probe_common::MAX_FLOWS);
    for (flows, rounds) in [(100, 3), (table + table / 4, 3)] {
        let ns = common::quiet_netns("ro-flows").unwrap();
        let tap = common::tap_in(&ns, "tpro1", RootQdisc::Pfifo { limit: None }).unwrap();
        let filter = Filter {
            globs: vec!["tpro1".to_owned()],
            netns: Some(ns.name().to_owned()),
            macvtap: false,
        };
        let mut watchers = common::watchers(&filter);
        for (_, w) in &mut watchers {
            assert!(!w.refresh().unwrap().rows.is_empty());
        }
        let frames = flows * rounds;
        // A ring that holds every frame: where a full ring drops (6.1's tun, a reader slowed
        // by emulation), a flow whose first frame was dropped would join mid-way.
        run_in(ns.path(), || {
            Rtnl::open()?.set_tx_queue_len(tap.ifindex(), u32::try_from(frames)?)
        })
        .unwrap();
        let driven = Drive {
            netns: ns.path(),
            tap: &tap,
            sender: SenderConfig {
                pps: Some(100_000),
                flows: u32::try_from(flows).unwrap(),
                ..SenderConfig::new(tap.ifindex(), frames, Duration::from_secs(20))
            },
            reader: ReaderConfig {
                pps: None,
                deadline: Duration::from_secs(30),
                max_packets: None,
            },
            queues: 1,
            linger: Duration::from_millis(200),
        }
        .run()
        .unwrap();
        eprintln!("{flows} flows: {driven:?}");
        for (backend, w) in &mut watchers {
            let c = total(&w.refresh().unwrap().rows);
            eprintln!("{backend:?}: {c:?}");
            assert_eq!(c.enqueued, frames, "{backend:?}: every frame taken");
            if flows < table {
                assert_eq!(c.flows_joined, 0, "{backend:?}: every flow fits");
            } else {
                assert!(c.flows_joined > 0, "{backend:?}: nothing was forgotten");
                assert!(
                    c.flows_joined <= frames - flows,
                    "{backend:?}: a flow's first frame never joins"
                );
            }
        }
    }
}

/// The seed's scenario: TCP streams through a veth with a pfifo root qdisc, TSO off, a slow
/// peer. Where veth answers busy and the qdisc puts a segment list back behind the ones
/// parked in `gso_skb`, segments reach the driver out of order. The receiver's
/// `TCPOFOQueue` counts what arrived after a hole, per skb after GRO: a reordered segment
/// opens a hole for every segment that overtook it, and a lost one opens one too, so the two
/// counts differ by design. What holds exactly: a late segment is overtaken by a later one
/// of its stream, which the receiver queues out of order, so `reordered > 0` implies
/// `TCPOFOQueue > 0`; and where nothing was lost (no retransmission) every hole is a
/// reordering, so `TCPOFOQueue > 0` implies `reordered > 0`. The figures are printed.
#[test]
fn requeue_reordering_shows_at_the_receiver() {
    let Some(run) = tcp_run(
        "ro-rq",
        VethConfig {
            qdisc: RootQdisc::Pfifo { limit: None },
            tso: false,
            slow_peer_ns: Some(HOLD_NS),
        },
    ) else {
        return;
    };
    let secs = run.elapsed.as_secs_f64();
    #[expect(clippy::cast_precision_loss, reason = "a rate")]
    let per_sec = |n: u64| n as f64 / secs;
    println!(
        "reorder figures: kernel {} | {STREAMS} streams, {secs:.1} s, {:.0} Mbit/s | reordered/s {:.0} | busy/s {:.0} | requeues/s {:.0} | receiver OFO/s {:.0} | retrans/s {:.0} | totals: reordered {} busy {} requeues {} ofo {} retrans {}",
        release(),
        per_sec(run.received * 8) / 1e6,
        per_sec(run.counters.reordered),
        per_sec(run.counters.busy),
        per_sec(run.requeues),
        per_sec(run.receiver.ofo_queue),
        per_sec(run.sender.retrans_segs),
        run.counters.reordered,
        run.counters.busy,
        run.requeues,
        run.receiver.ofo_queue,
        run.sender.retrans_segs,
    );
    if run.counters.reordered > 0 {
        assert!(
            run.receiver.ofo_queue > 0,
            "late segments the receiver never saw out of order"
        );
    }
    if run.sender.retrans_segs == 0 {
        assert_eq!(
            run.counters.reordered > 0,
            run.receiver.ofo_queue > 0,
            "nothing lost: every hole at the receiver is a reordering"
        );
    }
}

/// Without a qdisc nothing can overtake: the socket hands the driver its segments in order,
/// so `reordered` is 0, while the receiver's `TCPOFOQueue` still counts the holes left by
/// segments lost on the way (a veth without a qdisc drops when its ring is full), which the
/// sender retransmits. Where nothing was retransmitted, it is 0 too.
#[test]
fn without_a_qdisc_nothing_is_reordered() {
    let Some(run) = tcp_run(
        "ro-nq",
        VethConfig {
            qdisc: RootQdisc::Noqueue,
            tso: false,
            slow_peer_ns: Some(HOLD_NS),
        },
    ) else {
        return;
    };
    assert_eq!(run.counters.reordered, 0);
    assert!(
        run.receiver.ofo_queue == 0 || run.sender.retrans_segs > 0,
        "holes at the receiver without a loss nor a reordering"
    );
}

/// A peer that reads as fast as packets come (a plain veth: the peer takes each packet in
/// the sender's own transmit, `veth_xmit` -> `__netif_rx`) never makes veth busy, so no
/// requeue reorders: 0 reordered, and 0 out of order at the receiver unless something was
/// lost (the receive backlog overflowing) and retransmitted.
#[test]
fn a_fast_peer_reorders_nothing() {
    let Some(run) = tcp_run(
        "ro-fast",
        VethConfig {
            qdisc: RootQdisc::Pfifo { limit: None },
            tso: false,
            slow_peer_ns: None,
        },
    ) else {
        return;
    };
    assert_eq!(run.counters.busy, 0, "a plain veth is never busy");
    assert_eq!(run.counters.reordered, 0);
    assert!(
        run.receiver.ofo_queue == 0 || run.sender.retrans_segs > 0,
        "holes at the receiver without a loss nor a reordering"
    );
}

/// What one TCP run through a veth pair counted, by the probe and by the kernel.
struct TcpRun {
    /// The probe's counters of the sender's end, summed over its queues (exact backend).
    counters: QueueCounters,
    requeues: u64,
    sender: TcpCounters,
    receiver: TcpCounters,
    received: u64,
    elapsed: Duration,
}

/// Runs [`STREAMS`] TCP streams for [`SECS`] through a fresh pair set up as `cfg`, watched
/// by every backend this kernel runs; the backends must agree on `reordered`.
fn tcp_run(tag: &str, cfg: VethConfig) -> Option<TcpRun> {
    if !lab::root() {
        return None;
    }
    // A run where the kernel skipped runs of every backend's programs (a softirq's free
    // nested in a process-context one) has no exact count to check: it is run again.
    for attempt in 1..=ATTEMPTS {
        if let Some(run) = tcp_attempt(tag, cfg) {
            return Some(run);
        }
        eprintln!("{tag}: attempt {attempt}: every backend may be short, running it again");
    }
    panic!("{tag}: in {ATTEMPTS} runs the kernel skipped program runs of every backend");
}

/// Runs of a TCP scenario before [`tcp_run`] gives up on an exact count.
const ATTEMPTS: u32 = 3;

/// One run of [`tcp_run`]; `None` when no backend's counts are exact.
fn tcp_attempt(tag: &str, cfg: VethConfig) -> Option<TcpRun> {
    let link = VethLink::create(&common::unique(tag), cfg).unwrap();
    let filter = Filter {
        globs: vec![SENDER_DEV.to_owned()],
        netns: Some(link.sender.name().to_owned()),
        macvtap: false,
    };
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        assert!(!w.refresh().unwrap().rows.is_empty());
    }
    let qdisc = || {
        run_in(link.sender.path(), || {
            Rtnl::open()?.root_qdisc_stats(link.sender_ifindex)
        })
    };
    let q0: Option<QdiscStats> = qdisc().ok();
    let (s0, r0) = link.tcp_counters().unwrap();
    let streams = link
        .tcp_streams(
            STREAMS,
            Duration::from_secs(SECS),
            u64::MAX,
            &AtomicBool::new(false),
        )
        .unwrap();
    assert_eq!(streams.received, streams.sent, "every byte arrived");
    let (s1, r1) = link.tcp_counters().unwrap();
    let q1 = qdisc().ok();
    let requeues = match (q0, q1) {
        (Some(a), Some(b)) => Some(b.requeues - a.requeues),
        _ => None,
    };
    let mut exact: Option<QueueCounters> = None;
    for (backend, w) in &mut watchers {
        let c = total(&w.refresh().unwrap().rows);
        eprintln!("{backend:?}: {c:?}");
        if requeues == Some(0) {
            // The segments of a packet segmented in software (TSO is off) reach the driver
            // as new skbs: none of them is a packet put back.
            assert_eq!(
                (c.busy, c.requeued_stopped),
                (0, 0),
                "{backend:?}: the qdisc put nothing back"
            );
        }
        if !common::exact(*backend, w) {
            continue;
        }
        if let Some(first) = exact {
            assert_eq!(
                c.reordered, first.reordered,
                "{backend:?}: the backends agree"
            );
        } else {
            exact = Some(c);
        }
    }
    let counters = exact?;
    let run = TcpRun {
        counters,
        requeues: requeues.unwrap_or(0),
        sender: s1.since(&s0),
        receiver: r1.since(&r0),
        received: streams.received,
        elapsed: streams.elapsed,
    };
    eprintln!(
        "{tag}: sent {} bytes in {:?}; sender {:?}; receiver {:?}; requeues {requeues:?}",
        streams.sent, streams.elapsed, run.sender, run.receiver
    );
    drop(watchers);
    drop(link);
    Some(run)
}

/// A device's counters summed over its queues.
fn total(rows: &[lab::Row]) -> QueueCounters {
    let mut sum = QueueCounters::default();
    for row in rows {
        sum += row.counters;
    }
    sum
}

fn release() -> String {
    nix::sys::utsname::uname()
        .map(|u| u.release().to_string_lossy().into_owned())
        .unwrap_or_default()
}
