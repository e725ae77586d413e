//! `NETDEV_TX_BUSY`, queue stops and wakes, on a veth whose peer reads slowly: veth has had
//! the stop/wake backpressure that the tun series adds since upstream commit dc82a33297fc,
//! so it is this kernel's test bed for those counters.
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

mod common;

use std::time::{Duration, Instant};

use tap_probe::lab::Filter;
use tap_probe::lab::SlowConsumer;
use tap_probe::lab::run_in;
use tap_probe::lab::{self, SenderConfig};
use tap_probe::lab::{QdiscStats, RootQdisc, Rtnl};

const FRAMES: u64 = 20_000;
/// Per packet on the peer: about 5 kpps, far below what one sender pushes even in an
/// emulated guest with kprobes attached (about 16 kpps under TCG), so the ring always fills.
const HOLD_NS: u64 = 200_000;

#[test]
fn veth_busy_matches_qdisc_requeues_and_stops_pair_with_wakes() {
    if !tap_probe::lab::root() {
        return;
    }
    let ns = common::quiet_netns("bp").unwrap();
    let (ifindex, consumer) = run_in(ns.path(), || {
        let mut rtnl = Rtnl::open()?;
        // One transmit queue: then the root qdisc is TCQ_F_ONETXQUEUE and stops dequeuing while
        // the queue is stopped (dequeue_skb, net/sched/sch_generic.c). With several, it
        // dequeues anyway and sch_direct_xmit requeues without calling the driver, so the
        // qdisc's requeue count would exceed the driver's BUSY returns.
        rtnl.add_veth("tpva", "tpvb", Some(1))?;
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
    let filter = Filter {
        globs: vec!["tpva".to_owned()],
        netns: Some(ns.name().to_owned()),
    };
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        assert_eq!(w.refresh().unwrap().rows.len(), 1);
    }
    let before = qdisc();

    let cfg = SenderConfig {
        batch: 1,
        ..SenderConfig::new(ifindex, FRAMES, Duration::from_secs(20))
    };
    let sent = run_in(ns.path(), || lab::send(&cfg)).unwrap();
    let after = settle(&qdisc);

    let mut rows = Vec::new();
    for (backend, w) in &mut watchers {
        let end = w.refresh().unwrap();
        let row = end.rows[0].clone();
        if row.counters.busy == 0
            && row.counters.dropped_other > 0
            && row.counters.xmit_calls == row.counters.enqueued + row.counters.dropped_other
        {
            // This kernel's veth drops when its ring is full instead of pushing back: it
            // predates upstream commit dc82a33297fc. The drops show the ring did fill.
            eprintln!(
                "skipping test - this kernel's veth tail-drops (no qdisc backpressure): {row:?}"
            );
            return;
        }
        eprintln!(
            "{backend:?} ({}):\nsent {sent:?}\nrow {row:#?}\nqdisc {before:?} -> {after:?}",
            end.sources
        );
        assert!(
            row.counters.busy > 0,
            "{backend:?}: the veth ring never filled: this run proves nothing"
        );
        assert_eq!(
            row.counters.busy,
            after.requeues - before.requeues,
            "{backend:?}: every NETDEV_TX_BUSY is one requeue"
        );
        assert_eq!(
            row.counters.xmit_calls,
            row.counters.enqueued
                + row.counters.busy
                + row.counters.dropped_full_ring
                + row.counters.dropped_other,
            "{backend:?}: every driver call ends enqueued, busy or dropped"
        );
        assert_eq!(
            row.counters.enqueued, sent.sent,
            "{backend:?}: with a qdisc nothing accepted is lost"
        );
        assert!(
            row.counters.queue_stops > 0,
            "{backend:?}: BUSY without a stop: {row:?}"
        );
        assert_eq!(
            row.counters.queue_wakes, row.counters.queue_stops,
            "{backend:?}: the queue runs again once drained"
        );
        assert!(!row.stopped, "{backend:?}");
        assert!(row.counters.stopped_ns > 0, "{backend:?}");
        rows.push((*backend, row));
    }
    common::assert_backends_agree(&rows);
    drop(watchers);
    drop(consumer);
    drop(ns);
}

/// Waits (at most 10 s) until the qdisc is empty, i.e. the peer took everything.
fn settle(qdisc: &dyn Fn() -> QdiscStats) -> QdiscStats {
    let deadline = Instant::now() + Duration::from_secs(10);
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
