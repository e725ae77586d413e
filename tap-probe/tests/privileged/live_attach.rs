//! Attaching to a device that is busy: the kernel's columns are read while packets flow, yet
//! once the traffic stops they agree with the probes' exactly where the baseline was read
//! exactly, and within the skew the watcher shows otherwise, under every backend.

use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use tap_probe_lab::lab::{Drive, ReaderConfig, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::report::Row;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::run_in;

use crate::common;
use crate::common::{Checks, Gate, Oracle};

/// The load: paced, with a reader slower than the sender so that the ring fills and drops
/// too. It runs this long before the watchers attach, and after they have attached for as
/// long as they refresh (attaching takes seconds in a slow guest), then stops.
const LOAD: Duration = Duration::from_secs(4);
/// The tap's ring.
const RING: u32 = 100;
/// The bound on the whole load, however slow attaching is.
const LOAD_BOUND: Duration = Duration::from_mins(2);

#[test]
fn attached_under_load_the_kernel_columns_agree_once_traffic_stops() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("live").unwrap();
    let tap = common::tap_in(&ns, "tpl0", RootQdisc::Noqueue).unwrap();
    // A short ring fills at once even at a slow guest's rates.
    run_in(ns.path(), || {
        Rtnl::open()?.set_tx_queue_len(tap.ifindex(), RING)
    })
    .unwrap();
    // Paced so that packets leave gaps in which an exact baseline can be read, also where
    // reading the kernel's statistics is ten times slower (an emulated guest).
    let slowdown = common::slowdown();
    let filter = common::filter(&ns, "tpl0");
    let attached = AtomicBool::new(false);
    let stop = Arc::new(AtomicBool::new(false));
    let mut checks = common::Checks::new();
    let mut watchers = std::thread::scope(|s| {
        let load = s.spawn(|| {
            Drive {
                netns: ns.path(),
                tap: &tap,
                sender: SenderConfig {
                    batch: 1,
                    pps: Some(6_000 / u64::from(slowdown)),
                    stop: Some(Arc::clone(&stop)),
                    ..SenderConfig::new(0, u64::MAX, LOAD_BOUND)
                },
                reader: ReaderConfig {
                    pps: Some(4_000 / u64::from(slowdown)),
                    deadline: LOAD_BOUND,
                    max_packets: None,
                },
                queues: 1,
                linger: Duration::ZERO,
            }
            .run()
            .unwrap()
        });
        std::thread::sleep(LOAD / 4);
        let mut watchers = common::watchers(&filter);
        for (backend, w) in &mut watchers {
            let rows = w.refresh().unwrap().rows;
            assert_eq!(rows.len(), 1, "{backend:?}");
        }
        attached.store(true, Ordering::Relaxed);
        // Refreshes while the load runs: the difference stays within the skew shown.
        for _ in 0..4 {
            std::thread::sleep(LOAD / 8);
            for (backend, w) in &mut watchers {
                let row = w.refresh().unwrap().rows.remove(0);
                within_skew(
                    &mut checks,
                    *backend,
                    &row,
                    READ_IN_FLIGHT,
                    "the skew shown",
                );
            }
        }
        assert!(
            !load.is_finished(),
            "the load ended before the watchers were done"
        );
        stop.store(true, Ordering::Relaxed);
        let driven = load.join().unwrap();
        eprintln!("sent {:?}, drained {:?}", driven.sent, driven.drained);
        assert!(
            driven.sent.enobufs > 0,
            "the ring never filled: {:?}",
            driven.sent
        );
        watchers
    });
    assert!(attached.load(Ordering::Relaxed));
    settled(&mut checks, &mut watchers, slowdown);
    drop(watchers);
    drop(tap);
    drop(ns);
}

/// Holds the kernel's columns of `row` to the probes' counts within the skew the watcher
/// shows (`what` names it) and `in_flight` packets more, as a bound.
fn within_skew(checks: &mut Checks, backend: Backend, row: &Row, in_flight: u64, what: &str) {
    let off = row.counters.consumed.abs_diff(row.kernel.tx_packets)
        + row
            .counters
            .dropped_full_ring
            .abs_diff(row.kernel.tx_dropped);
    checks.bound(
        Some(backend),
        Oracle::DeviceStats,
        off <= row.kernel.skew + in_flight,
        format!("off by no more than {what} and {in_flight} in flight: {row:#?}"),
    );
}

/// A read of the test's one reader thread in flight at a refresh under load: tun counted
/// it (`tun_put_user`) and its `consume_skb` has not run yet, because the thread was
/// paused in between for longer than the watcher waits after reading the kernel's
/// statistics (as under emulation beside other guests). The skew shown cannot see it
/// (`kernel.skew` in docs/counters.md); once the traffic stops there is none.
const READ_IN_FLIGHT: u64 = 1;

/// The gate of a row's kernel columns once the traffic stopped: exact where the watcher's
/// baseline was (skew 0). A baseline read while the load never paused (none of its attempts
/// found the probes' counters still at zero, as under emulation beside other guests) is off
/// by at most the skew the watcher shows, and says so; the columns are then held to that.
fn baseline_gate(backend: Backend, row: &Row) -> Gate {
    Gate::always(backend).unless(
        (row.kernel.skew > 0).then_some("baseline read under a load that never paused (bounded)"),
    )
}

/// Once the traffic stopped: every backend counted what the kernel did, exactly where its
/// baseline was, and they differ by what the kernel counted between their starts.
fn settled(checks: &mut Checks, watchers: &mut [(Backend, Watcher)], slowdown: u32) {
    let mut rows = Vec::new();
    for (backend, w) in watchers.iter_mut() {
        let row = w.refresh().unwrap().rows.remove(0);
        eprintln!("{backend:?}: {row:#?}");
        Gate::always(*backend).holds(
            row.counters.consumed > 1000 / u64::from(slowdown),
            "counted under load",
        );
        // No traffic: all the skew left is the baseline's.
        within_skew(checks, *backend, &row, 0, "the baseline's skew");
        let gate = baseline_gate(*backend, &row);
        checks.eq(
            &gate,
            Oracle::DeviceStats,
            row.counters.consumed,
            row.kernel.tx_packets,
            "consumed vs kernel tx_packets",
        );
        checks.eq(
            &gate,
            Oracle::DeviceStats,
            row.counters.dropped_full_ring,
            row.kernel.tx_dropped,
            "ring-full drops vs kernel tx_dropped",
        );
        rows.push((*backend, row));
    }
    // The backends attached one after the other while packets flowed, so each counted from
    // its own start: what one counted more than another, the kernel counted more between
    // their starts.
    let (base_backend, base) = &rows[0];
    for (backend, row) in &rows[1..] {
        let gate = baseline_gate(*backend, row).shut_by(&baseline_gate(*base_backend, base));
        for (what, ours, base_ours, kernel, base_kernel) in [
            (
                "consumed",
                row.counters.consumed,
                base.counters.consumed,
                row.kernel.tx_packets,
                base.kernel.tx_packets,
            ),
            (
                "dropped_full_ring",
                row.counters.dropped_full_ring,
                base.counters.dropped_full_ring,
                row.kernel.tx_dropped,
                base.kernel.tx_dropped,
            ),
        ] {
            checks.eq(
                &gate,
                Oracle::OtherBackend,
                i128::from(ours) - i128::from(base_ours),
                i128::from(kernel) - i128::from(base_kernel),
                format!("{what}: {backend:?} beyond {base_backend:?}, as the kernel counted"),
            );
        }
    }
}
