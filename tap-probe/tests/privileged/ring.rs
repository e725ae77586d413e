//! The tap's ring as the programs read it: its occupancy against what went in and came out,
//! and a stopped queue whose reader takes nothing called stuck. Each test asks the kernel
//! what its tun does with a full ring (or an empty one) and checks that.

use std::time::Duration;

use tap_probe_lab::lab::{self, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::report::Row;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::TunBackpressure;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{Tap, TapOptions};

use crate::common;
use crate::common::{Gate, Oracle};

/// The tap's ring: `tx_queue_len`, the default of a new tap.
const RING: u64 = 1000;

fn watch(ns: &NamedNetns, name: &str) -> Vec<(Backend, Watcher)> {
    let filter = common::filter(ns, name);
    let mut watchers = common::watchers(&filter);
    for (_, w) in &mut watchers {
        w.set_stuck_after(Duration::from_secs(1));
        assert_eq!(w.refresh().unwrap().rows.len(), 1);
    }
    watchers
}

fn rows(watchers: &mut [(Backend, Watcher)]) -> Vec<(Backend, Row)> {
    watchers
        .iter_mut()
        .map(|(b, w)| (*b, w.refresh().unwrap().rows.remove(0)))
        .collect()
}

fn send(ns: &NamedNetns, tap: &Tap, frames: u64) -> lab::SendReport {
    let cfg = SenderConfig {
        batch: 1,
        ..SenderConfig::new(tap.ifindex(), frames, Duration::from_secs(20))
    };
    run_in(ns.path(), || lab::send(&cfg)).unwrap()
}

/// Reads `n` frames from the tap's queue (non-blocking: they are there).
fn read(tap: &Tap, n: u64) {
    tap.set_nonblocking(true).unwrap();
    let mut buf = vec![0u8; 65_536];
    for i in 0..n {
        nix::unistd::read(tap.queue_fd(0), &mut buf)
            .unwrap_or_else(|err| panic!("frame {i} of {n}: {err}"));
    }
}

/// At rest the ring holds what went in and was not taken: with the reader paused it fills
/// to its size (no take yet, so no slot waits for its batched zeroing), then each take
/// frees one.
#[test]
fn ring_occupancy_follows_what_went_in_and_out() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("ring").unwrap();
    // No qdisc: every kernel tail-drops beyond the ring, with or without the fix.
    let tap = common::tap_in(&ns, "tpr0", RootQdisc::Noqueue).unwrap();
    let mut watchers = watch(&ns, "tpr0");
    let sent = send(&ns, &tap, RING + 500);
    assert_eq!(sent.attempted, RING + 500);
    let mut checks = common::Checks::new();
    let mut unsampled_said = false;
    let mut check = |rows: &[(Backend, Row)], watchers: &[(Backend, Watcher)], read: u64| {
        for ((backend, row), (_, w)) in rows.iter().zip(watchers) {
            let gate = Gate::of(*backend, w);
            let c = &row.counters;
            eprintln!("{backend:?}: {c:?}\n{:?}", row.occupancy);
            checks.eq(&gate, Oracle::Reader, c.consumed, read, "consumed vs reads");
            // What went in and was not taken is in the ring, sampled or not.
            checks.eq(
                &gate,
                Oracle::Reader,
                c.enqueued.checked_sub(c.consumed),
                Some(sent.sent - read),
                "what went in and was not taken vs what was sent and not read",
            );
            if common::ring_unsampled(w, &mut unsampled_said) {
                assert_eq!(row.occupancy, None, "not sampled: unknown, not 0");
            } else {
                let ring = row.occupancy.expect("a tap's ring is sampled");
                gate.same(
                    ring.current,
                    c.enqueued.checked_sub(c.consumed),
                    "the ring holds what went in and was not taken",
                );
                checks.eq(
                    &gate,
                    Oracle::Reader,
                    ring.current,
                    Some(sent.sent - read),
                    "the ring holds what was sent and not read",
                );
                gate.same(ring.max, RING, "it filled to its size");
                gate.same(
                    ring.samples,
                    c.xmit_calls + c.consumed,
                    "a sample per driver call and take",
                );
            }
            checks.eq(
                &gate,
                Oracle::Sender,
                c.dropped_full_ring,
                sent.enobufs,
                "ring-full drops vs the sender's ENOBUFS",
            );
            gate.same(c.dropped_full_ring, 500, "what did not fit the ring");
        }
        common::assert_backends_agree(&mut checks, rows, watchers);
    };
    let now = rows(&mut watchers);
    check(&now, &watchers, 0);
    read(&tap, 300);
    let now = rows(&mut watchers);
    check(&now, &watchers, 300);
    read(&tap, RING - 300);
    let end = rows(&mut watchers);
    check(&end, &watchers, RING);
    for ((backend, row), (_, w)) in end.iter().zip(&watchers) {
        let gate = Gate::of(*backend, w);
        let Some(ring) = row.occupancy else {
            continue;
        };
        // The produces sample 1 up to the size, the drops the size, the takes walk back
        // down: the ring is seen empty once, after the last take.
        gate.same(
            ring.histogram.iter().sum::<u64>(),
            ring.samples,
            "every sample in the histogram",
        );
        gate.same(ring.histogram[0], 1, "empty again once, at the end");
    }
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// A reader that stops taking while its queue is stopped leaves the queue stuck: on a
/// kernel with the fix the ring fills, the queue stops and nothing wakes it until the
/// reader comes back. Without the fix the ring drops and the queue never stops.
#[test]
fn a_stopped_queue_whose_reader_pauses_is_stuck() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    let ns = common::quiet_netns("stuck").unwrap();
    let opts = TapOptions {
        backpressure: common::has_backpressure_flag(&kernel),
        ..TapOptions::default()
    };
    // A qdisc with room for what does not fit the ring.
    let qdisc = RootQdisc::Pfifo { limit: Some(2000) };
    let tap = common::tap_with(&ns, "tpst0", qdisc, opts).unwrap();
    let stops = common::stops_instead_of_dropping(&kernel, &tap, qdisc);
    let mut watchers = watch(&ns, "tpst0");
    let sent = send(&ns, &tap, RING + 500);
    let first = rows(&mut watchers);
    std::thread::sleep(Duration::from_millis(1200));
    let later = rows(&mut watchers);
    let mut checks = common::Checks::new();
    for (((backend, row), (_, before)), (_, w)) in later.iter().zip(&first).zip(&watchers) {
        let gate = Gate::of(*backend, w);
        eprintln!("{backend:?}: stops instead of dropping: {stops}\n{row:#?}");
        gate.holds(!before.stuck, "not stuck before the limit");
        gate.same(row.stuck, stops, "stuck");
        gate.same(row.stopped, stops, "stopped");
        checks.eq(
            &gate,
            Oracle::Reader,
            row.counters.consumed,
            0,
            "nothing read yet",
        );
        if stops {
            gate.same(row.counters.dropped_full_ring, 0, "no ring drop");
        } else {
            // The qdisc took every frame (the sender saw no drop): the ring dropped what
            // did not fit, counted by the device.
            assert_eq!(sent.enobufs, 0, "{sent:?}");
            checks.eq(
                &gate,
                Oracle::DeviceStats,
                row.counters.dropped_full_ring,
                row.kernel.tx_dropped,
                "ring-full drops vs kernel tx_dropped",
            );
            gate.same(row.counters.dropped_full_ring, 500, "beyond the ring");
        }
    }
    // The reader comes back: the queue wakes and is no longer stuck.
    tap.set_nonblocking(true).unwrap();
    let drained = lab_drain(&tap);
    assert_eq!(drained, RING + if stops { 500 } else { 0 });
    let end = rows(&mut watchers);
    for ((backend, row), (_, w)) in end.iter().zip(&watchers) {
        let gate = Gate::of(*backend, w);
        gate.holds(!row.stuck, format!("{row:?}"));
        gate.holds(!row.stopped, "stopped");
        gate.same(
            row.counters.queue_stops,
            row.counters.queue_wakes,
            "every stop woken",
        );
        checks.eq(
            &gate,
            Oracle::Reader,
            row.counters.consumed,
            drained,
            "consumed vs reads",
        );
    }
    common::assert_backends_agree(&mut checks, &end, &watchers);
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// A tap whose ring has no room at all (`tx_queue_len` 0) under a qdisc: the series as
/// posted stops the queue on the first packet and nothing ever wakes it (no take can make
/// room), a stall the stuck flag shows; the fix as merged and a stock kernel drop at the
/// ring instead (`__ptr_ring_check_produce` is -EINVAL, not -ENOSPC, for a ring of size 0).
#[test]
fn a_ring_without_room_stalls_only_the_posted_series() {
    const FRAMES: u64 = 300;
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    let mode = kernel.tun_backpressure.expect("TUNGETFEATURES");
    let ns = common::quiet_netns("stall").unwrap();
    let qdisc = RootQdisc::Pfifo { limit: Some(1000) };
    let tap = run_in(ns.path(), || {
        let tap = Tap::create(
            "tpz0",
            TapOptions {
                backpressure: mode == TunBackpressure::OptIn,
                ..TapOptions::default()
            },
        )?;
        let mut rtnl = Rtnl::open()?;
        rtnl.set_tx_queue_len(tap.ifindex(), 0)?;
        rtnl.replace_root_qdisc(tap.ifindex(), qdisc)?;
        rtnl.set_up(tap.ifindex())?;
        Ok(tap)
    })
    .unwrap();
    let stalls = mode == TunBackpressure::Always;
    let mut watchers = watch(&ns, "tpz0");
    let sent = send(&ns, &tap, FRAMES);
    assert_eq!(sent.attempted, FRAMES);
    std::thread::sleep(Duration::from_millis(1200));
    let end = rows(&mut watchers);
    let mut checks = common::Checks::new();
    let mut unsampled_said = false;
    for ((backend, row), (_, w)) in end.iter().zip(&watchers) {
        eprintln!("{backend:?}: {mode:?}\n{row:#?}");
        let gate = Gate::of(*backend, w);
        let c = &row.counters;
        gate.same(row.stuck, stalls, "stuck");
        gate.same(c.enqueued, 0, "a ring of size 0 takes nothing");
        if stalls {
            // The first packet found no room and went back (busy); the queue stopped and
            // the qdisc holds the rest.
            gate.same(c.xmit_calls, 1, "one driver call");
            gate.same(c.busy, 1, "busy");
            gate.same(c.queue_stops, 1, "stops");
            gate.same(c.queue_wakes, 0, "wakes");
            gate.holds(row.stopped, "stopped");
        } else {
            checks.eq(
                &gate,
                Oracle::Sender,
                c.dropped_full_ring,
                sent.attempted,
                "every frame dropped at the ring",
            );
            gate.same(c.queue_stops, 0, "no stop");
        }
        if let Some(ring) = row.occupancy {
            gate.same(ring.max, 0, "never anything in the ring");
        } else {
            common::ring_unsampled(w, &mut unsampled_said);
        }
    }
    common::assert_backends_agree(&mut checks, &end, &watchers);
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// Reads until the queue stays empty a moment; the frames read.
fn lab_drain(tap: &Tap) -> u64 {
    let mut buf = vec![0u8; 65_536];
    let mut n = 0;
    let mut idle = 0;
    while idle < 20 {
        match nix::unistd::read(tap.queue_fd(0), &mut buf) {
            Ok(_) => {
                n += 1;
                idle = 0;
            }
            Err(nix::errno::Errno::EAGAIN) => {
                idle += 1;
                std::thread::sleep(Duration::from_millis(10));
            }
            Err(err) => panic!("reading the tap: {err}"),
        }
    }
    n
}
