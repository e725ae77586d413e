//! The alerts that only a kernel whose tun takes `IFF_BACKPRESSURE` (Linux 7.3) can fire,
//! fired by a real Prometheus (Debian's package, on loopback, with the repository's rules)
//! that scrapes `tap-probe serve`: a tap that tail-drops at its ring where the flag would
//! have let a qdisc hold the packets (`TapRingTailDrop`, `TapBackpressureUnused`), and a tap
//! opened with the flag whose queue stopped and whose reader has taken nothing since
//! (`TapQueueStuck`). Which devices each alert's expression returns is predicted from the
//! kernel: the devices' `tx_dropped` and flags, the stuck tap's qdisc (frames held back) and
//! `tx_packets` (none taken), the programs' `recursion_misses`. Elsewhere `fleet` evaluates
//! every alert and dashboard query against a kernel without the flag.

use std::collections::BTreeSet;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime};

use tap_probe_lab::lab::{self, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{IFF_BACKPRESSURE, Tap, TapOptions};
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::BIN;
use crate::common::oracle::{Checks, Gate, Oracle};
use crate::common::prometheus::{Misses, Prometheus, Series};
use crate::common::service::{self, Service};

/// The backend `serve` runs with: the cheaper one, which every kernel with the flag has.
const BACKEND: Backend = Backend::Tracepoint;
/// The taps' rings (their default `tx_queue_len`), and the frames sent beyond them.
const RING: u64 = 1000;
const BEYOND: u64 = 500;
/// `serve --stuck-after`, in seconds.
const STUCK_AFTER: f64 = 1.0;

/// A device of the test, and what the kernel says of it.
#[derive(Debug)]
struct Device {
    netns: String,
    name: String,
    /// Opened with `IFF_BACKPRESSURE`.
    flag: bool,
    tx_packets: u64,
    tx_dropped: u64,
    /// Frames its root qdisc holds.
    held: u32,
}

impl Device {
    fn of(ns: &NamedNetns, tap: &Tap, name: &str) -> Self {
        let (link, qdisc) = run_in(ns.path(), || {
            let mut rtnl = Rtnl::open()?;
            Ok((
                rtnl.link_by_name(name)?,
                rtnl.root_qdisc_stats(tap.ifindex())?,
            ))
        })
        .unwrap();
        Self {
            netns: ns.name().to_owned(),
            name: name.to_owned(),
            flag: tap.tun_flags().unwrap() & IFF_BACKPRESSURE != 0,
            tx_packets: link.stats.tx_packets,
            tx_dropped: link.stats.tx_dropped,
            held: qdisc.qlen,
        }
    }
}

/// The devices among `devices` that `series` holds.
fn names<'a>(series: &[Series], devices: &'a [Device]) -> BTreeSet<&'a str> {
    devices
        .iter()
        .filter(|d| series.iter().any(|s| s.of(&d.netns, &d.name)))
        .map(|d| d.name.as_str())
        .collect()
}

/// The devices for which `predicate` holds.
fn those(devices: &[Device], predicate: impl Fn(&Device) -> bool) -> BTreeSet<&str> {
    devices
        .iter()
        .filter(|d| predicate(d))
        .map(|d| d.name.as_str())
        .collect()
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Sends `frames` frames into `tap` from inside `ns`, one a sendmsg; nobody reads them.
fn send(ns: &NamedNetns, tap: &Tap, frames: u64) {
    let cfg = SenderConfig {
        batch: 1,
        ..SenderConfig::new(tap.ifindex(), frames, Duration::from_secs(20))
    };
    let sent = run_in(ns.path(), || lab::send(&cfg)).unwrap();
    assert_eq!(sent.attempted, frames, "{sent:?}");
}

/// Two taps in `ns`, up: one that drops at its ring, one whose queue stops instead.
fn taps(ns: &NamedNetns, kernel: &KernelInfo) -> (Tap, Tap) {
    // No flag and no qdisc: what does not fit the ring is dropped at it.
    let dropping =
        common::tap_with(ns, "tpad0", RootQdisc::Noqueue, TapOptions::default()).unwrap();
    // The flag and a qdisc with room for the rest: the queue stops when the ring is full.
    let qdisc = RootQdisc::Pfifo { limit: Some(2000) };
    let backpressure = TapOptions {
        backpressure: true,
        ..TapOptions::default()
    };
    let held = common::tap_with(ns, "tpah0", qdisc, backpressure).unwrap();
    assert!(common::stops_instead_of_dropping(kernel, &held, qdisc));
    (dropping, held)
}

/// `serve` on the devices of `ns` (the programs it loaded, by id), and a Prometheus that
/// scrapes it.
fn exporter(ns: &NamedNetns) -> (Service, BTreeSet<u32>, Prometheus) {
    let binary: PathBuf = std::fs::canonicalize(BIN).unwrap();
    let stuck_after = STUCK_AFTER.to_string();
    let (service, loaded) = Service::tracepoints(
        &binary,
        &[
            "--interval",
            "0.5",
            "--stuck-after",
            &stuck_after,
            "--netns",
            ns.name(),
        ],
    );
    let prometheus = Prometheus::start(&service.addr);
    (service, loaded, prometheus)
}

/// Each alert's name and expression, as the server loaded them.
fn rules(prometheus: &Prometheus) -> Vec<(String, String)> {
    let alerts: Vec<(String, String)> = prometheus.api("/api/v1/rules")["groups"]
        .as_array()
        .unwrap()
        .iter()
        .flat_map(|g| g["rules"].as_array().unwrap().clone())
        .map(|r| {
            (
                r["name"].as_str().unwrap().to_owned(),
                r["query"].as_str().unwrap().to_owned(),
            )
        })
        .collect();
    assert_eq!(alerts.len(), 4, "{alerts:?}");
    alerts
}

/// Waits, bounded, until Prometheus has stored a counter of both taps of `ns`.
fn wait_stored(prometheus: &Prometheus, ns: &NamedNetns, within: Duration) {
    let stored = format!(
        "tap_probe_dropped_full_ring_total{{netns=\"{}\"}}",
        ns.name()
    );
    let deadline = Instant::now() + within;
    while prometheus.query(&stored, now()).len() < 2 {
        assert!(
            Instant::now() < deadline,
            "Prometheus never stored both taps"
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What the kernel predicts of each device alert's expression, among `devices`.
fn predicted<'a>(name: &str, devices: &'a [Device]) -> BTreeSet<&'a str> {
    match name {
        "TapRingTailDrop" => those(devices, |d| d.tx_dropped > 0),
        "TapBackpressureUnused" => those(devices, |d| d.tx_dropped > 0 && !d.flag),
        "TapQueueStuck" => those(devices, |d| d.held > 0 && d.tx_packets == 0),
        other => panic!("the alert {other:?} has no prediction here: add one"),
    }
}

/// Holds each alert's expression, as last evaluated (`fired`), to what the kernel predicts:
/// the devices' counters and qdiscs, and the programs' misses (`None` if the kernel's count
/// moved while the expressions were evaluated).
fn check(fired: &[(&str, Vec<Series>)], devices: &[Device], misses: Option<Misses>) {
    const MOVED: &str = "the kernel skipped runs of the programs while the alerts were evaluated";
    let gate = misses.map_or_else(
        || Gate::always(BACKEND).unless(Some(MOVED)),
        |m| Gate::of_programs(BACKEND, m.last.1),
    );
    let mut checks = Checks::new();
    for (name, series) in fired {
        let got = names(series, devices);
        eprintln!("{name}: fired for {got:?} ({} series)", series.len());
        let what = format!("{name}: {series:?}");
        match *name {
            "TapRingTailDrop" | "TapBackpressureUnused" => {
                checks.eq(
                    &gate,
                    Oracle::DeviceStats,
                    &got,
                    &predicted(name, devices),
                    what,
                );
            }
            "TapQueueStuck" => {
                checks.eq(&gate, Oracle::Qdisc, &got, &predicted(name, devices), what);
            }
            // The programs' own misses: a series of the exporter, of no device.
            _ => checks.eq(
                &Gate::always(BACKEND).unless(misses.map_or(Some(MOVED), Misses::uncertain)),
                Oracle::ProgramMisses,
                !series.is_empty(),
                misses.and_then(Misses::short_fires).unwrap_or_default(),
                format!("{what}; the kernel's recursion_misses: {misses:?}"),
            ),
        }
    }
}

#[test]
fn the_alerts_of_a_kernel_with_iff_backpressure_fire_where_its_counters_say() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    if !common::has_backpressure_flag(&kernel) {
        Skip::test(
            "this kernel's tun has no IFF_BACKPRESSURE (fleet evaluates the \
             alerts on the host)",
        )
        .print();
        return;
    }
    if !common::prometheus::installed() {
        Skip::test("no prometheus here (cargo xtask setup installs it)").print();
        return;
    }
    let slow = f64::from(common::slowdown());
    let within = |secs: f64| Duration::from_secs_f64(secs * slow);

    let ns = common::quiet_netns("alerts").unwrap();
    let (dropping, held) = taps(&ns, &kernel);

    // serve and Prometheus before any frame: every series starts at zero.
    let (service, loaded, prometheus) = exporter(&ns);
    let kernel_misses = || service::kernel_misses(&loaded);
    wait_stored(&prometheus, &ns, within(30.0));
    // Prometheus's first samples hold no more misses than the kernel counted by now.
    let missed_stored = kernel_misses();

    send(&ns, &dropping, RING + BEYOND);
    send(&ns, &held, RING + BEYOND);
    let sent_at = Instant::now();
    let devices = [
        Device::of(&ns, &dropping, "tpad0"),
        Device::of(&ns, &held, "tpah0"),
    ];
    eprintln!("{devices:#?}");
    assert!(
        devices[0].tx_dropped > 0 && devices[1].held > 0,
        "the ring did not drop, or the qdisc held nothing: this run proves nothing"
    );
    let alerts = rules(&prometheus);
    let holds = |name: &str, series: &[Series], missed: u64| match name {
        "TapProbeCountsShort" => Misses {
            first: missed_stored,
            last: (missed, missed),
        }
        .short_fires()
        .is_none_or(|fires| fires != series.is_empty()),
        _ => names(series, &devices) == predicted(name, &devices),
    };
    // Until every expression says what the kernel predicts (a scrape or two after the queue
    // has been stopped for longer than --stuck-after), bounded; and no sooner than a few
    // refreshes and scrapes after that, so that an alert that fires late is seen.
    let settled = sent_at + Duration::from_secs_f64(STUCK_AFTER + 3.0);
    // Prometheus scrapes in real time, a second apart: half a minute is some twenty scrapes
    // after the queue was stuck, under emulation too.
    let deadline = sent_at + Duration::from_secs_f64(STUCK_AFTER + 30.0);
    // The expressions, and the kernel's misses if they held still while the expressions were
    // evaluated (a miss in between may or may not have reached them).
    let evaluate = || {
        let before = kernel_misses();
        let at = now();
        let fired: Vec<_> = alerts
            .iter()
            .map(|(name, expr)| (name.as_str(), prometheus.query(expr, at)))
            .collect();
        let after = kernel_misses();
        (fired, (before == after).then_some(after))
    };
    let agree = |fired: &[(&str, Vec<Series>)], missed: Option<u64>| {
        missed.is_some_and(|m| fired.iter().all(|(name, series)| holds(name, series, m)))
    };
    let (mut fired, mut missed_then) = evaluate();
    while Instant::now() < settled || (Instant::now() < deadline && !agree(&fired, missed_then)) {
        std::thread::sleep(Duration::from_millis(500));
        (fired, missed_then) = evaluate();
    }
    eprintln!(
        "evaluated {:.1} s after the frames were sent; the kernel's misses: {missed_stored} \
         when Prometheus had its first samples, {missed_then:?} when evaluated",
        sent_at.elapsed().as_secs_f64()
    );
    let misses = missed_then.map(|missed| Misses {
        first: missed_stored,
        last: (missed, missed),
    });
    check(&fired, &devices, misses);
    drop(service);
    drop(prometheus);
    drop((dropping, held));
    drop(ns);
}
