//! Our counters against the kernel's own, exactly, on a real tap with a slow reader; under
//! every backend this kernel runs, attached at once to the same traffic.
#![expect(
    unused_crate_dependencies,
    reason = "a test binary uses a few of the package's dependencies"
)]

mod common;

use std::time::Duration;

use tap_probe::lab::Filter;
use tap_probe::lab::run_in;
use tap_probe::lab::{self, Drive, ReaderConfig, SenderConfig};
use tap_probe::lab::{RootQdisc, Rtnl};

/// Frames sent; the tap's ring holds `tx_queue_len` entries (1000 by default), the reader
/// takes a few thousand per second, so most of these are tail-dropped on a stock kernel.
const FRAMES: u64 = 20_000;

fn tap_with_slow_reader(qdisc: RootQdisc) {
    if !tap_probe::lab::root() {
        return;
    }
    let ns = common::quiet_netns("exact").unwrap();
    let tap = common::tap_in(&ns, "tpx0", qdisc).unwrap();
    let filter = Filter {
        globs: vec!["tpx0".to_owned()],
        netns: Some(ns.name().to_owned()),
    };
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
    let qdisc_before = run_in(ns.path(), || Rtnl::open()?.root_qdisc_stats(tap.ifindex())).unwrap();

    let sent = Drive {
        netns: ns.path(),
        tap: &tap,
        // One frame per sendmsg: sendmmsg drops the error of a frame that failed mid-batch
        // (tun answers a full ring with NET_XMIT_DROP, ENOBUFS to the sender), which would
        // blur the count of driver calls.
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
        linger: Duration::ZERO,
    }
    .run()
    .unwrap()
    .sent;
    let qdisc_after = run_in(ns.path(), || Rtnl::open()?.root_qdisc_stats(tap.ifindex())).unwrap();

    let mut rows = Vec::new();
    for (backend, w) in &mut watchers {
        let end = w.refresh().unwrap();
        let row = end.rows[0].clone();
        eprintln!("{backend:?} ({}):\n{row:#?}", end.sources);
        assert!(
            row.counters.dropped_full_ring > 0,
            "{backend:?}: the ring never filled: this run proves nothing"
        );
        assert!(
            row.counters.consumed > 0,
            "{backend:?}: the reader took nothing"
        );
        assert_eq!(
            row.counters.dropped_full_ring, row.kernel.tx_dropped,
            "{backend:?}: ring-full drops vs kernel tx_dropped"
        );
        assert_eq!(
            row.counters.consumed, row.kernel.tx_packets,
            "{backend:?}: consumed vs kernel tx_packets"
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
            row.counters.enqueued, row.counters.consumed,
            "{backend:?}: after the drain the ring is empty"
        );
        assert_eq!(
            row.counters.busy, 0,
            "{backend:?}: a stock tun never returns NETDEV_TX_BUSY"
        );
        assert_eq!(
            row.counters.dropped_other, 0,
            "{backend:?}: {:?}",
            row.drop_reasons
        );
        match qdisc {
            // Without a qdisc every send is one driver call, and a ring-full drop is the
            // sender's ENOBUFS.
            RootQdisc::Noqueue => {
                assert_eq!(row.counters.xmit_calls, FRAMES, "{backend:?}");
                assert_eq!(sent.sent + sent.enobufs, FRAMES);
                assert_eq!(row.counters.dropped_full_ring, sent.enobufs, "{backend:?}");
            }
            // With one, the qdisc counts what it handed the driver.
            _ => assert_eq!(
                row.counters.xmit_calls,
                qdisc_after.packets - qdisc_before.packets,
                "{backend:?}"
            ),
        }
        rows.push((*backend, row));
    }
    common::assert_backends_agree(&rows);
    drop(watchers);
    drop(tap);
    drop(ns);
}

#[test]
fn tap_noqueue_counters_match_kernel() {
    tap_with_slow_reader(RootQdisc::Noqueue);
}

#[test]
fn tap_pfifo_fast_counters_match_kernel() {
    tap_with_slow_reader(RootQdisc::PfifoFast);
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
    if !tap_probe::lab::root() {
        return;
    }
    let ns = common::quiet_netns("sleep").unwrap();
    let tap = common::tap_in(&ns, "tps0", RootQdisc::Noqueue).unwrap();
    let filter = Filter {
        globs: vec!["tps0".to_owned()],
        netns: Some(ns.name().to_owned()),
    };
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
        let cfg = SenderConfig {
            batch: 1,
            pps: Some(2_000),
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

    let mut rows = Vec::new();
    for (backend, w) in &mut watchers {
        let row = w.refresh().unwrap().rows[0].clone();
        eprintln!("{backend:?}: {row:#?}");
        assert_eq!(row.counters.consumed, reads, "{backend:?}");
        assert_eq!(row.counters.consumed, row.kernel.tx_packets, "{backend:?}");
        assert_eq!(
            row.counters.reader_sleeps, switches,
            "{backend:?}: reader sleeps vs the reader's voluntary context switches"
        );
        rows.push((*backend, row));
    }
    common::assert_backends_agree(&rows);
    drop(watchers);
    drop(tap);
    drop(ns);
}
