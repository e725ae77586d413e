//! `NETDEV_TX_BUSY`, queue stops and wakes, on a veth whose peer reads slowly: veth has had
//! the stop/wake backpressure that the tun series adds since upstream commit dc82a33297fc,
//! so it is this kernel's test bed for those counters.

use std::time::{Duration, Instant};

use tap_probe_common::MetricId;
use tap_probe_lab::lab::{self, SenderConfig, SlowConsumer};
use tap_probe_observer::host::report::{Row, Value};
use tap_probe_observer::os::netlink::{QdiscStats, RootQdisc, Rtnl};
use tap_probe_observer::os::netns::run_in;
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::{Gate, Oracle};

const FRAMES: u64 = 20_000;
/// Per packet on the peer: about 5 kpps, far below what one sender pushes even in an
/// emulated guest with kprobes attached (about 16 kpps under TCG), so the ring always fills.
const HOLD_NS: u64 = 200_000;

/// One transmit queue: the root qdisc is then `TCQ_F_ONETXQUEUE` (`qdisc_create` in
/// `net/sched/sch_api.c`), stops dequeuing while the queue is stopped and dequeues one packet
/// at a time (`dequeue_skb`, `net/sched/sch_generic.c)`: every requeue is a busy return.
#[test]
fn veth_busy_matches_qdisc_requeues_and_stops_pair_with_wakes() {
    veth_with_slow_peer(1);
}

/// Two transmit queues under one root qdisc: not `TCQ_F_ONETXQUEUE`, so the qdisc dequeues
/// up to nine packets of a queue at once (`try_bulk_dequeue_skb_slow`). When the driver
/// answers busy in the middle, the rest of the batch goes back to the qdisc without a
/// driver call: `requeued_stopped`, which both backends see here (a veth never leaves its
/// qdisc empty while stopped: the busy packet stays in it, so nothing bypasses).
#[test]
fn veth_bulk_dequeue_requeues_the_rest_behind_a_busy() {
    veth_with_slow_peer(2);
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario: set up, drive, and check each identity against the kernel"
)]
fn veth_with_slow_peer(queues: u32) {
    if !tap_probe_verdict::root() {
        return;
    }
    if let Some(why) = SlowConsumer::unavailable() {
        Skip::test(why).print();
        return;
    }
    let ns = common::quiet_netns("bp").unwrap();
    let (ifindex, consumer) = run_in(ns.path(), || {
        let mut rtnl = Rtnl::open()?;
        rtnl.add_veth("tpva", "tpvb", Some(queues))?;
        let a = rtnl.link_by_name("tpva")?.ifindex;
        let b = rtnl.link_by_name("tpvb")?.ifindex;
        rtnl.replace_root_qdisc(a, RootQdisc::Pfifo { limit: None })?;
        rtnl.set_up(b)?;
        rtnl.set_up(a)?;
        let consumer = SlowConsumer::attach(b, "tpvb", HOLD_NS)?;
        Ok((a, consumer))
    })
    .unwrap();
    let qdisc = || run_in(ns.path(), || Rtnl::open()?.root_qdisc_stats(ifindex)).unwrap();
    let dropped = || {
        run_in(ns.path(), || {
            Ok(Rtnl::open()?.link_by_name("tpva")?.stats.tx_dropped)
        })
        .unwrap()
    };
    let filter = common::filter(&ns, "tpva");
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        assert!(!w.refresh().unwrap().rows.is_empty());
    }
    let before = qdisc();
    let dropped_before = dropped();

    let cfg = SenderConfig {
        batch: 1,
        ..SenderConfig::new(ifindex, FRAMES, Duration::from_secs(20))
    };
    let sent = run_in(ns.path(), || lab::send(&cfg)).unwrap();
    let after = settle(&qdisc);
    let requeues = after.requeues - before.requeues;
    let kernel_dropped = dropped() - dropped_before;
    eprintln!("sent {sent:?}\nqdisc {before:?} -> {after:?}\nveth tx_dropped {kernel_dropped}");

    let mut checks = common::Checks::new();
    // What this kernel's veth does with a full ring, as the kernel tells: a veth with qdisc
    // backpressure (upstream commit dc82a33297fc) answers busy, so its qdisc requeues; one
    // without drops, which its own tx_dropped counts. Neither: the ring never filled.
    if requeues == 0 {
        assert!(
            kernel_dropped > 0,
            "the qdisc requeued nothing and the veth dropped nothing: the ring never filled, \
             this run proves nothing"
        );
        for (backend, w) in &mut watchers {
            let gate = Gate::of(*backend, w);
            let c = total(&w.refresh().unwrap().rows);
            checks.eq(
                &gate,
                Oracle::Qdisc,
                c.busy,
                0,
                "busy where the qdisc requeued nothing",
            );
        }
        Skip::test(format!(
            "this kernel's veth tail-drops (no qdisc backpressure): its qdisc \
             requeued nothing, the device dropped {kernel_dropped}"
        ))
        .print();
        return;
    }

    let mut rows = Vec::new();
    for (backend, w) in &mut watchers {
        let end = w.refresh().unwrap();
        // The queue the sender's flow hashed to: the one that carried the traffic.
        let row = end
            .rows
            .iter()
            .max_by_key(|r| r.counters.xmit_calls)
            .unwrap()
            .clone();
        for other in end.rows.iter().filter(|r| r.queue != row.queue) {
            assert_eq!(
                other.counters.xmit_calls, 0,
                "one flow, one queue: {other:?}"
            );
        }
        eprintln!("{backend:?} ({}):\nrow {row:#?}", end.sources);
        let gate = Gate::of(*backend, w);
        let c = &row.counters;
        gate.holds(c.busy > 0, "the qdisc requeued, yet no busy was counted");
        // Both sources are exact here: nothing bypasses a veth's qdisc while it is stopped.
        checks.eq(
            &gate,
            Oracle::Qdisc,
            c.busy + c.requeued_stopped,
            requeues,
            "every requeue is a busy return or a packet put back behind one",
        );
        if queues == 1 {
            gate.same(c.requeued_stopped, 0, "one packet per dequeue");
        } else {
            gate.holds(
                c.requeued_stopped > 0,
                "no bulk dequeue was cut short: this run proves nothing",
            );
        }
        gate.same(
            c.xmit_calls,
            c.enqueued + c.busy + c.dropped_full_ring + c.dropped_other,
            "every driver call ends enqueued, busy or dropped",
        );
        checks.eq(
            &gate,
            Oracle::Sender,
            c.enqueued,
            sent.sent,
            "with a qdisc nothing accepted is lost",
        );
        checks.eq(
            &gate,
            Oracle::DeviceStats,
            c.dropped_full_ring + c.dropped_other,
            kernel_dropped,
            "drops in the driver vs the veth's tx_dropped",
        );
        gate.holds(c.queue_stops > 0, format!("BUSY without a stop: {row:?}"));
        gate.same(
            c.queue_wakes,
            c.queue_stops,
            "the queue runs again once drained",
        );
        gate.holds(!row.stopped, "stopped");
        gate.holds(!row.stuck, "stuck");
        gate.holds(c.stopped_ns > 0, "stopped for no time");
        if row.wake_sources {
            // veth's peer wakes the queue from its NAPI poll: the reader.
            gate.same(c.wakes_reader, c.queue_wakes, format!("{c:?}"));
            gate.same(c.wakes_recheck, 0, "veth has no re-check");
        }
        // A veth has no tap ring, nor the tap's flag.
        assert_eq!(
            row.value(MetricId::RingOccupancy.metric()),
            Value::Missing,
            "{backend:?}"
        );
        assert_eq!(row.backpressure, None, "{backend:?}");
        rows.push((row.queue, *backend, row));
    }
    let queue = rows[0].0;
    assert!(
        rows.iter().all(|(q, _, _)| *q == queue),
        "every backend saw the traffic on one queue"
    );
    let rows: Vec<_> = rows.into_iter().map(|(_, b, r)| (b, r)).collect();
    common::assert_backends_agree(&mut checks, &rows, &watchers);
    drop(watchers);
    drop(consumer);
    drop(ns);
}

/// A device's counters summed over its queues.
fn total(rows: &[Row]) -> tap_probe_common::QueueCounters {
    let mut sum = tap_probe_common::QueueCounters::default();
    for row in rows {
        sum += row.counters;
    }
    sum
}

/// Waits (at most 10 s, ten times that under emulation) until the qdisc is empty, i.e. the
/// peer took everything.
fn settle(qdisc: &dyn Fn() -> QdiscStats) -> QdiscStats {
    let deadline = Instant::now() + Duration::from_secs(10) * common::slowdown();
    loop {
        let stats = qdisc();
        if stats.qlen == 0 || Instant::now() > deadline {
            // One more interval for the last wake to be seen at a dequeue.
            std::thread::sleep(Duration::from_millis(100));
            return qdisc();
        }
        std::thread::sleep(Duration::from_millis(20));
    }
}
