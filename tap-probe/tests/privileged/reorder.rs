//! `reordered`, against witnesses that are not tap-probe: a tap reader that counts the
//! frames it reads out of their flow's order (netem reordering on purpose), and the
//! receiving TCP stack's own out-of-order counter (`TcpExtTCPOFOQueue`) behind a veth whose
//! peer reads slowly, where a busy driver and the qdisc's requeue reorder TCP (the seeds'
//! "net/sched: fix packet reordering on requeue").

use std::process::Command;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use tap_probe_common::QueueCounters;
use tap_probe_lab::lab::{
    self, Drive, ReaderConfig, SENDER_DEV, SenderConfig, TcpCounters, VethConfig, VethLink,
};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::report::Row;
use tap_probe_observer::os::netlink::{QdiscStats, RootQdisc, Rtnl};
use tap_probe_observer::os::netns::run_in;
use tap_probe_verdict::{Retry, Skip};

use crate::common;
use crate::common::{Checks, Gate, Oracle};

/// Per packet on the veth peer: slow enough that one TCP sender fills the ring, on this host
/// and under TCG alike.
const HOLD_NS: u64 = 20_000;
/// Requeues in one run beyond which reordering is certain where the qdisc appends a
/// requeued segment list behind the ones parked in `gso_skb` (every kernel up to 7.3):
/// measured, 4 streams for 5 s, this host: 76,668 and 91,294 requeues, 76 and 255 segments
/// late; under TCG, 7.3: 18,827 requeues, 5 late; 6.12: 9 requeues (one busy), none late.
/// Below it a run may reorder nothing, and says so.
const REORDERING_CERTAIN: u64 = 50_000;
/// TCP streams, as in the seed's measurement.
const STREAMS: u32 = 4;
const SECS: u64 = 5;

/// netem sends a quarter of the frames (and half of those right after one) at once and holds
/// the rest 2 ms: at 10 kpps about 20 frames are overtaken each time. Every frame the driver
/// takes is read (the reader keeps up, nothing drops), in the order the driver took them: the
/// probe and the reader count the same frames as late, exactly.
#[test]
fn netem_reordering_is_counted_as_the_reader_sees_it() {
    if !tap_probe_verdict::root() {
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
        Skip::test(format!("this kernel has no sch_netem: {err}")).print();
        return;
    }
    let filter = common::filter(&ns, "tpro0");
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
    let mut checks = common::Checks::new();
    for (backend, w) in &mut watchers {
        let c = total(&w.refresh().unwrap().rows);
        eprintln!("{backend:?}: {c:?}");
        let gate = Gate::under_softirq(*backend, w);
        checks.eq(
            &gate,
            Oracle::Reader,
            c.enqueued,
            read.packets,
            "every frame taken was read",
        );
        checks.eq(
            &gate,
            Oracle::Reader,
            c.reordered,
            read.reordered,
            "the probe and the reader count the same late frames",
        );
        if !gate.is_open() {
            bounded_by_the_reader(&mut checks, *backend, &c, &read);
        }
    }
}

/// Counts that may be short, bounded by the reader's: a driver call the programs missed is a
/// frame taken but not counted, and it takes at most its own place in its flow's order with
/// it (a frame not seen moves no flow's next number, so it makes no other frame late).
fn bounded_by_the_reader(
    checks: &mut Checks,
    backend: Backend,
    c: &QueueCounters,
    read: &lab::ReadReport,
) {
    let b = Some(backend);
    let missed = read.packets.saturating_sub(c.enqueued);
    checks.bound(
        b,
        Oracle::Reader,
        c.enqueued <= read.packets,
        "taken <= read",
    );
    checks.bound(
        b,
        Oracle::Reader,
        c.enqueued * 100 >= read.packets * 99,
        format!(
            "at most 1% of the frames unseen: {missed} of {}",
            read.packets
        ),
    );
    checks.bound(
        b,
        Oracle::Reader,
        c.reordered <= read.reordered,
        "late frames <= the reader's",
    );
    checks.bound(
        b,
        Oracle::Reader,
        read.reordered - c.reordered.min(read.reordered) <= missed,
        format!(
            "late frames short by at most the frames unseen: {} vs {}, {missed} unseen",
            c.reordered, read.reordered
        ),
    );
    checks.bound(b, Oracle::Reader, c.reordered > 0, "late frames counted");
}

/// The flow table holds `MAX_FLOWS` flows: cycled through more flows than that, the least
/// recently seen are forgotten and taken up again at their next frame (`flows_joined`),
/// never at a flow's first frame; within the table, none is.
#[test]
fn flows_beyond_the_table_are_taken_up_again() {
    if !tap_probe_verdict::root() {
        return;
    }
    let table = u64::from(tap_probe_common::MAX_FLOWS);
    for (flows, rounds) in [(100, 3), (table + table / 4, 3)] {
        let ns = common::quiet_netns("ro-flows").unwrap();
        let tap = common::tap_in(&ns, "tpro1", RootQdisc::Pfifo { limit: None }).unwrap();
        let filter = common::filter(&ns, "tpro1");
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
        let mut checks = common::Checks::new();
        for (backend, w) in &mut watchers {
            let c = total(&w.refresh().unwrap().rows);
            eprintln!("{backend:?}: {c:?}");
            checks.eq(
                &Gate::always(*backend),
                Oracle::Reader,
                c.enqueued,
                driven.read[0].packets,
                "every frame taken was read",
            );
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
/// parked in `gso_skb` (every kernel up to 7.3 appends there, `dev_requeue_skb`), segments
/// reach the driver out of order: where the qdisc requeued enough that some segment must
/// have been put back behind others, reordering must be counted (below that the test says
/// it could not require it). Where it requeued nothing (a veth without qdisc backpressure
/// drops instead), nothing can be late. The receiver's `TCPOFOQueue` counts what arrived after a hole, per skb after
/// GRO: a reordered segment opens a hole for every segment that overtook it, and a lost one
/// opens one too, so the two counts differ by design. What holds exactly: a late segment is
/// overtaken by a later one of its stream, which the receiver queues out of order, so
/// `reordered > 0` implies `TCPOFOQueue > 0`; and where nothing was lost (no
/// retransmission) every hole is a reordering, so `TCPOFOQueue > 0` implies
/// `reordered > 0`. The figures are printed.
#[test]
fn requeue_reordering_shows_at_the_receiver() {
    let Some(mut run) = tcp_run(
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
    let requeues = run.requeues.expect("a pfifo qdisc's counters");
    println!(
        "reorder figures: kernel {} | {STREAMS} streams, {secs:.1} s, {:.0} Mbit/s | reordered/s {:.0} | busy/s {:.0} | requeues/s {:.0} | receiver OFO/s {:.0} | retrans/s {:.0} | totals: reordered {} busy {} requeues {} ofo {} retrans {}",
        release(),
        per_sec(run.received * 8) / 1e6,
        per_sec(run.counters.reordered),
        per_sec(run.counters.busy),
        per_sec(requeues),
        per_sec(run.receiver.ofo_queue),
        per_sec(run.sender.retrans_segs),
        run.counters.reordered,
        run.counters.busy,
        requeues,
        run.receiver.ofo_queue,
        run.sender.retrans_segs,
    );
    let gate = run.gate.clone();
    let reordered = run.counters.reordered;
    if requeues >= REORDERING_CERTAIN {
        run.checks.that(
            &gate,
            Oracle::Qdisc,
            reordered > 0,
            format!("the qdisc requeued {requeues} times, yet no segment was counted late"),
        );
    } else {
        Skip::part(
            "reordering required",
            format!(
                "the qdisc requeued {requeues} times, fewer than \
             the {REORDERING_CERTAIN} that make reordering certain"
            ),
        )
        .print();
        if requeues == 0 {
            run.checks.eq(
                &gate,
                Oracle::Qdisc,
                reordered,
                0,
                "the qdisc put nothing back: nothing can be late",
            );
        }
    }
    run.tcp_stack_agrees();
}

/// Without a qdisc nothing can overtake: the socket hands the driver its segments in order,
/// so `reordered` is 0, while the receiver's `TCPOFOQueue` still counts the holes left by
/// segments lost on the way (a veth without a qdisc drops when its ring is full), which the
/// sender retransmits. Where nothing was retransmitted, it is 0 too.
#[test]
fn without_a_qdisc_nothing_is_reordered() {
    let Some(mut run) = tcp_run(
        "ro-nq",
        VethConfig {
            qdisc: RootQdisc::Noqueue,
            tso: false,
            slow_peer_ns: Some(HOLD_NS),
        },
    ) else {
        return;
    };
    run.gate.same(
        run.counters.reordered,
        0,
        "nothing overtakes without a qdisc",
    );
    assert!(
        run.receiver.ofo_queue == 0 || run.sender.retrans_segs > 0,
        "holes at the receiver without a loss nor a reordering"
    );
    run.tcp_stack_agrees();
}

/// A peer that reads as fast as packets come (a plain veth: the peer takes each packet in
/// the sender's own transmit, `veth_xmit` -> `__netif_rx`) never makes veth busy, so no
/// requeue reorders: 0 reordered, and 0 out of order at the receiver unless something was
/// lost (the receive backlog overflowing) and retransmitted.
#[test]
fn a_fast_peer_reorders_nothing() {
    let Some(mut run) = tcp_run(
        "ro-fast",
        VethConfig {
            qdisc: RootQdisc::Pfifo { limit: None },
            tso: false,
            slow_peer_ns: None,
        },
    ) else {
        return;
    };
    assert_eq!(run.requeues, Some(0), "a plain veth is never busy");
    let gate = run.gate.clone();
    run.checks.eq(
        &gate,
        Oracle::Qdisc,
        run.counters.reordered,
        0,
        "the qdisc put nothing back: nothing can be late",
    );
    assert!(
        run.receiver.ofo_queue == 0 || run.sender.retrans_segs > 0,
        "holes at the receiver without a loss nor a reordering"
    );
    run.tcp_stack_agrees();
}

impl TcpRun {
    /// `reordered` against what the receiving TCP stack saw: a late segment is overtaken by
    /// a later one of its stream, which the receiver queues out of order; and where nothing
    /// was lost (no retransmission), every hole at the receiver is a reordering.
    fn tcp_stack_agrees(&mut self) {
        let gate = self.gate.clone();
        let (reordered, ofo) = (self.counters.reordered, self.receiver.ofo_queue);
        self.checks.that(
            &gate,
            Oracle::TcpStack,
            reordered == 0 || ofo > 0,
            "late segments the receiver never saw out of order",
        );
        if self.sender.retrans_segs == 0 {
            self.checks.that(
                &gate,
                Oracle::TcpStack,
                (reordered > 0) == (ofo > 0),
                "nothing lost: every hole at the receiver is a reordering",
            );
        }
    }
}

/// What one TCP run through a veth pair counted, by the probe and by the kernel.
struct TcpRun {
    /// The probe's counters of the sender's end, summed over its queues, from a backend
    /// whose counts are exact.
    counters: QueueCounters,
    /// Checks of those counters go through this gate: it names their backend.
    gate: Gate,
    /// The root qdisc's requeues over the run (none without a qdisc).
    requeues: Option<u64>,
    sender: TcpCounters,
    receiver: TcpCounters,
    received: u64,
    elapsed: Duration,
    /// The checks of every attempt.
    checks: Checks,
}

/// Runs [`STREAMS`] TCP streams for [`SECS`] through a fresh pair set up as `cfg`, watched
/// by every backend this kernel runs; the backends must agree on `reordered`.
fn tcp_run(tag: &str, cfg: VethConfig) -> Option<TcpRun> {
    if !tap_probe_verdict::root() {
        return None;
    }
    if cfg.slow_peer_ns.is_some()
        && let Some(why) = lab::SlowConsumer::unavailable()
    {
        Skip::test(why).print();
        return None;
    }
    let mut checks = Checks::new();
    // A run where the kernel skipped runs of every backend's programs (a softirq's free
    // nested in a process-context one) has no exact count to check: it is run again, and
    // says so in a line `cargo xtask test` lists.
    for attempt in 1..=ATTEMPTS {
        if let Some(run) = tcp_attempt(tag, cfg, &mut checks) {
            return Some(TcpRun { checks, ..run });
        }
        Retry {
            scenario: tag.to_owned(),
            attempt,
            attempts: ATTEMPTS,
            why: "the kernel skipped program runs \
             of every backend"
                .to_owned(),
        }
        .print();
    }
    panic!("{tag}: in {ATTEMPTS} runs the kernel skipped program runs of every backend");
}

/// Runs of a TCP scenario before [`tcp_run`] gives up on an exact count.
const ATTEMPTS: u32 = 3;

/// One run of [`tcp_run`]; `None` when no backend's counts are exact.
fn tcp_attempt(tag: &str, cfg: VethConfig, checks: &mut Checks) -> Option<TcpRun> {
    let link = VethLink::create(&common::unique(tag), cfg).unwrap();
    let filter = common::filter(&link.sender, SENDER_DEV);
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        assert!(!w.refresh().unwrap().rows.is_empty());
    }
    let qdisc = || {
        run_in(link.sender.path(), || {
            Rtnl::open()?.root_qdisc_stats(link.sender_ifindex)
        })
    };
    // Without a qdisc there are no qdisc counters to read.
    let q0: Option<QdiscStats> = (cfg.qdisc != RootQdisc::Noqueue).then(|| qdisc().unwrap());
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
    let requeues = q0.map(|q0| qdisc().unwrap().requeues - q0.requeues);
    let mut exact: Option<(QueueCounters, Gate)> = None;
    for (backend, w) in &mut watchers {
        let c = total(&w.refresh().unwrap().rows);
        eprintln!("{backend:?}: {c:?}");
        let gate = Gate::of(*backend, w);
        if requeues == Some(0) {
            // The segments of a packet segmented in software (TSO is off) reach the driver
            // as new skbs: none of them is a packet put back.
            checks.eq(
                &gate,
                Oracle::Qdisc,
                (c.busy, c.requeued_stopped),
                (0, 0),
                "the qdisc put nothing back",
            );
        }
        if let Some((first, first_gate)) = &exact {
            checks.eq(
                &gate.shut_by(first_gate),
                Oracle::OtherBackend,
                c.reordered,
                first.reordered,
                "the backends agree on reordered",
            );
        } else if gate.is_open() {
            exact = Some((c, gate));
        }
    }
    let (counters, gate) = exact?;
    let run = TcpRun {
        counters,
        gate,
        requeues,
        sender: s1.since(&s0),
        receiver: r1.since(&r0),
        received: streams.received,
        elapsed: streams.elapsed,
        checks: Checks::new(),
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
fn total(rows: &[Row]) -> QueueCounters {
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
