//! A multi-queue tap with a reader per queue: counters land on the queue whose reader took
//! the packets.
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

mod common;

use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tap_probe::lab::Filter;
use tap_probe::lab::run_in;
use tap_probe::lab::{self, ReaderConfig, SenderConfig};
use tap_probe::lab::{RootQdisc, Rtnl};
use tap_probe::lab::{Tap, TapOptions};

const FRAMES: u64 = 5_000;

#[test]
fn per_queue_consumed_matches_each_readers_count() {
    if common::skip_unless_root() {
        return;
    }
    let ns = common::quiet_netns("mq").unwrap();
    let tap = two_queue_tap(&ns);
    let filter = Filter {
        globs: vec!["tpm0".to_owned()],
        netns: Some(ns.name().to_owned()),
    };
    let mut watchers = common::watchers(&filter);
    for (backend, w) in &mut watchers {
        let rows = w.refresh().unwrap().rows;
        assert_eq!(
            rows.len(),
            2,
            "{backend:?}: one row per attached queue: {rows:?}"
        );
    }

    let stop = AtomicBool::new(false);
    let reads: Vec<u64> = std::thread::scope(|s| {
        let readers: Vec<_> = (0..2)
            .map(|q| {
                let (tap, stop) = (&tap, &stop);
                s.spawn(move || {
                    let cfg = ReaderConfig {
                        pps: None,
                        deadline: Duration::from_secs(30),
                        max_packets: None,
                    };
                    lab::read(tap.queue_fd(q), &cfg, stop)
                })
            })
            .collect();
        let cfg = SenderConfig {
            batch: 1,
            ..SenderConfig::new(tap.ifindex(), FRAMES, Duration::from_secs(20))
        };
        run_in(ns.path(), || lab::send(&cfg)).unwrap();
        std::thread::sleep(Duration::from_millis(200));
        stop.store(true, Ordering::Relaxed);
        readers
            .into_iter()
            .map(|r| r.join().unwrap().unwrap().packets)
            .collect()
    });
    tap.set_nonblocking(true).unwrap();
    let drained: Vec<u64> = (0..2)
        .map(|q| lab::drain(tap.queue_fd(q), Duration::from_secs(5)).unwrap())
        .collect();

    let mut per_queue: [Vec<_>; 2] = [Vec::new(), Vec::new()];
    for (backend, w) in &mut watchers {
        let rows = w.refresh().unwrap().rows;
        eprintln!("{backend:?}: reads {reads:?} drained {drained:?}\n{rows:#?}");
        assert_eq!(rows.len(), 2, "{backend:?}");
        for (q, row) in rows.iter().enumerate() {
            assert_eq!(row.queue as usize, q);
            assert_eq!(
                row.counters.consumed,
                reads[q] + drained[q],
                "{backend:?}: queue {q}"
            );
            assert_eq!(
                row.counters.xmit_calls,
                row.counters.enqueued
                    + row.counters.busy
                    + row.counters.dropped_full_ring
                    + row.counters.dropped_other,
                "{backend:?}: queue {q}"
            );
        }
        let consumed: u64 = rows.iter().map(|r| r.counters.consumed).sum();
        assert_eq!(
            consumed, rows[0].kernel.tx_packets,
            "{backend:?}: per-device kernel count"
        );
        assert_eq!(
            rows.iter().map(|r| r.counters.xmit_calls).sum::<u64>(),
            FRAMES,
            "{backend:?}"
        );
        for (q, row) in rows.into_iter().enumerate() {
            per_queue[q].push((*backend, row));
        }
    }
    for rows in &per_queue {
        common::assert_backends_agree(rows);
    }
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// A tap with two queues (one fd each) in `ns`, without a qdisc, up.
fn two_queue_tap(ns: &tap_probe::lab::NamedNetns) -> Tap {
    run_in(ns.path(), || {
        let opts = TapOptions {
            multi_queue: true,
            queues: 2,
            tun: false,
        };
        let tap = Tap::create("tpm0", opts)?;
        let mut rtnl = Rtnl::open()?;
        rtnl.replace_root_qdisc(tap.ifindex(), RootQdisc::Noqueue)?;
        rtnl.set_up(tap.ifindex())?;
        Ok(tap)
    })
    .unwrap()
}
