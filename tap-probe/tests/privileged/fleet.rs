//! The deployment files against a live exporter. A real Prometheus server (Debian's
//! package, on loopback, with the repository's alert rules loaded) scrapes `tap-probe serve`
//! while `tap-probe load` runs a tap whose reader falls behind (tail-drop: this kernel's tun
//! never stops its queue) and a veth whose peer is slow (veth stops its queue and answers
//! `NETDEV_TX_BUSY`: the backpressure the tun fix adds, which this kernel's tun lacks). Every
//! dashboard query and every alert expression is then evaluated by Prometheus, and each must
//! return the series the kernel's own counters predict: the loads' `tx_dropped`,
//! `tx_packets`, the qdiscs' requeues, the ring's size, the programs' `recursion_misses`.
//!
//! Each comparison with the kernel is counted through [`common::oracle::Checks`], exact where
//! the kernel skipped none of `serve`'s programs' runs. The scenario runs twice: with
//! `serve`'s default series (one per device and family) and with the detailed ones
//! (`--per-queue --occupancy-histogram`); the dashboard and the rules must hold for both.
//!
//! Rate queries are evaluated at the time of a scrape, over a window that holds every
//! sample: Prometheus then extrapolates nothing past the last sample, and to the first
//! only down to zero (where every series starts, the devices being counted from birth), so
//! a rate times its window is the counter's increase, exactly. The test requires both of
//! every series the dashboard rates, and one series per device queue and family, before it
//! holds any rate to the kernel's count.

use std::collections::{BTreeMap, BTreeSet};
use std::os::unix::process::CommandExt as _;
use std::path::PathBuf;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant, SystemTime};

use serde_json::Value;
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::BIN;
use crate::common::oracle::{Checks, Gate, Oracle};
use crate::common::prometheus::{Misses, PROMETHEUS, Prometheus, SCRAPE, Series, encode};
use crate::common::service::{self, Service, left_behind};

const DASHBOARD: &str = include_str!("../../../deploy/grafana/tap-probe.json");
/// Seconds the loads wait before sending: `serve` has found their devices by then (it
/// refreshes every half second), so they are counted from birth, and Prometheus has stored
/// them at zero. With no wait the first stored sample is above zero, and the tap's rate
/// came to 33,640 of its 43,982 drops (Prometheus extrapolates to zero only within 1.1
/// scrape intervals of the first sample, and half an interval otherwise).
const START_DELAY: &str = "4";
const LOAD_SECS: &str = "3";
/// The backend `serve` runs with: the one this host's kernel has (no kprobes, no fentry).
const BACKEND: Backend = Backend::Tracepoint;
/// Seconds between `serve`'s refreshes.
const REFRESH: f64 = 0.5;

/// Which series `serve` serves.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Form {
    /// One series per device and family.
    Default,
    /// A series per queue, and the occupancy histogram.
    Detailed,
}

impl Form {
    fn args(self) -> &'static [&'static str] {
        match self {
            Self::Default => &[],
            Self::Detailed => &["--per-queue", "--occupancy-histogram"],
        }
    }
}

/// A device of a load, and what the kernel counted on it.
#[derive(Debug)]
struct Device {
    netns: String,
    name: String,
    tx_packets: f64,
    tx_dropped: f64,
    /// The root qdisc's requeues: every busy return and packet put back while stopped.
    requeues: f64,
}

/// A `tap-probe load` beside the test, ended with SIGTERM (which removes what it made) if
/// the test fails first.
struct Load(Option<Child>);

impl Load {
    fn start(args: &[&str]) -> Self {
        let child = common::stoppable(&mut Command::new(BIN))
            .arg("load")
            .args(args)
            .args(["--start-delay", START_DELAY, "--duration", LOAD_SECS])
            .args(["--format", "json"])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("load starts");
        Self(Some(child))
    }

    /// Its report.
    fn report(mut self) -> Value {
        let out = self.0.take().unwrap().wait_with_output().unwrap();
        assert!(
            out.status.success(),
            "load failed: {}",
            String::from_utf8_lossy(&out.stderr)
        );
        serde_json::from_slice(&out.stdout).expect("the load's JSON report")
    }
}

impl Drop for Load {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(15);
            while child.try_wait().ok().flatten().is_none() && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(50));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

fn count(report: &Value, field: &str) -> f64 {
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    report[field].as_u64().map_or_else(
        || panic!("the load reports no {field}: {report}"),
        |n| n as f64,
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Equal as counts, after a rate was multiplied back by its window.
fn same(a: f64, b: f64) -> bool {
    (a - b).abs() <= 1e-6 * a.abs().max(b.abs()) + 1e-6
}

/// The sum over `device`'s series (its queues) of one target's result.
fn total(series: &[Series], device: &Device) -> Option<f64> {
    let mine: Vec<f64> = series
        .iter()
        .filter(|s| s.of(&device.netns, &device.name))
        .map(|s| s.value)
        .collect();
    (!mine.is_empty()).then(|| mine.iter().sum())
}

/// What the kernel predicts a dashboard panel shows for the tap and the veth; `targets`
/// holds each target's result, by refId, and `window` the seconds rates were taken over.
#[expect(
    clippy::too_many_lines,
    reason = "one prediction per panel, side by side"
)]
#[expect(clippy::too_many_arguments, reason = "the run's figures, each named")]
fn check_panel(
    checks: &mut Checks,
    gate: &Gate,
    form: Form,
    title: &str,
    targets: &BTreeMap<String, Vec<Series>>,
    window: f64,
    tap: &Device,
    veth: &Device,
    ring: f64,
    missed_by_kernel: u64,
) {
    let target = |id: &str| -> &[Series] {
        targets
            .get(id)
            .unwrap_or_else(|| panic!("{title}: no target {id}"))
    };
    // The increase over the run a rate target says for a device (0 where it has no series).
    let increase = |id: &str, device: &Device| total(target(id), device).unwrap_or(0.0) * window;
    let absent = |id: &str, device: &Device| {
        assert!(
            total(target(id), device).is_none(),
            "{title}: {id} has a series for {}: {:?}",
            device.name,
            target(id)
        );
    };
    match title {
        "Packets lost in the driver, per VM" => {
            for device in [tap, veth] {
                let lost = increase("A", device) + increase("B", device);
                checks.that(
                    gate,
                    Oracle::DeviceStats,
                    same(lost, device.tx_dropped),
                    format!(
                        "{title}: {} lost {lost}, the kernel's tx_dropped {}",
                        device.name, device.tx_dropped
                    ),
                );
            }
        }
        "Delivered to the VM" => {
            let delivered = increase("A", tap);
            checks.that(
                gate,
                Oracle::DeviceStats,
                same(delivered, tap.tx_packets),
                format!(
                    "{title}: {delivered}, the kernel's tx_packets {}",
                    tap.tx_packets
                ),
            );
            absent("A", veth);
        }
        "Share of packets lost in the driver" => {
            // A stock tun returns no busy: each driver call was taken (read by the reader,
            // tx_packets, the ring drained at the end) or dropped (tx_dropped).
            let share = total(target("A"), tap).expect("the tap's share");
            let predicted = tap.tx_dropped / (tap.tx_dropped + tap.tx_packets);
            checks.that(
                gate,
                Oracle::DeviceStats,
                same(share, predicted),
                format!("{title}: {share}, predicted {predicted}"),
            );
            let share = total(target("A"), veth).expect("the veth's share");
            // veth's driver calls are its tx_packets, its drops and its busy returns, which
            // are some of the qdisc's requeues.
            let most = veth.tx_dropped / (veth.tx_dropped + veth.tx_packets);
            let least = veth.tx_dropped / (veth.tx_dropped + veth.tx_packets + veth.requeues);
            checks.bound(
                gate.backend(),
                Oracle::Qdisc,
                least - 1e-9 <= share && share <= most + 1e-9,
                format!("{title}: veth {share}, predicted {least}..{most}"),
            );
        }
        "Queue stops and wakes, per queue" => {
            assert!(
                same(increase("A", tap) + increase("B", tap), 0.0),
                "{title}: the tap"
            );
            let (stops, wakes) = (increase("A", veth), increase("B", veth));
            gate.same(
                same(stops, wakes),
                true,
                format!("{title}: stops {stops}, wakes {wakes}"),
            );
            // Each stop comes with a busy return, which the qdisc requeues.
            checks.bound(
                gate.backend(),
                Oracle::Qdisc,
                stops >= 1.0 - 1e-6 && stops <= veth.requeues + 1e-6,
                format!("{title}: {stops} stops, {} requeues", veth.requeues),
            );
        }
        "Time stopped, per queue" => {
            assert!(same(increase("A", tap), 0.0), "{title}: the tap");
            let stopped = increase("A", veth);
            assert!(
                stopped > 0.0 && stopped < window,
                "{title}: veth stopped {stopped} s"
            );
        }
        "Requeues, per queue" => {
            for device in [tap, veth] {
                let requeues = increase("A", device) + increase("B", device);
                checks.that(
                    gate,
                    Oracle::Qdisc,
                    same(requeues, device.requeues),
                    format!(
                        "{title}: {} {requeues}, the qdisc's requeues {}",
                        device.name, device.requeues
                    ),
                );
            }
        }
        "Stuck queues" => {
            for device in [tap, veth] {
                assert_eq!(total(target("A"), device), Some(0.0), "{title}: {device:?}");
            }
        }
        "Ring occupancy, latest sample" => {
            let now = total(target("A"), tap).expect("the tap's ring");
            assert!((0.0..=ring).contains(&now), "{title}: {now} of {ring}");
            absent("A", veth);
        }
        "Ring occupancy, highest" => {
            // A tail-drop happens at a full ring: the device's tx_queue_len.
            checks.eq(
                gate,
                Oracle::DeviceStats,
                total(target("A"), tap),
                Some(ring),
                title,
            );
            absent("A", veth);
        }
        "Ring occupancy, 99th percentile of samples" if form == Form::Default => {
            // The histogram is served only when asked for.
            absent("A", tap);
            absent("A", veth);
        }
        "Ring occupancy, 99th percentile of samples" => {
            // Sampled once per refresh, the ring was full through the flood: the bucket
            // that holds its size.
            let p99 = total(target("A"), tap).expect("the tap's ring");
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a ring size"
            )]
            let upper = f64::from(((ring as u32) + 1).next_power_of_two() - 1);
            let lower = (upper - 1.0) / 2.0;
            assert!(
                lower < p99 && p99 <= upper,
                "{title}: {p99}, predicted ({lower}, {upper}]"
            );
            absent("A", veth);
        }
        "Events the probes missed" => {
            let missed: f64 = target("A").iter().map(|s| s.value * window).sum();
            #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
            let missed_by_kernel = missed_by_kernel as f64;
            // The kernel's count is read after the last scrape: it can only have grown.
            checks.bound(
                gate.backend(),
                Oracle::ProgramMisses,
                missed <= missed_by_kernel + 1e-6 && (missed_by_kernel > 0.0 || missed == 0.0),
                format!("{title}: {missed}, the kernel's recursion_misses {missed_by_kernel}"),
            );
            let no_slots: f64 = target("B").iter().map(|s| s.value).sum();
            assert!(same(no_slots, 0.0), "{title}: three devices fit the tables");
        }
        "Devices not counted" => {
            assert!(target("A").iter().all(|s| s.value == 0.0), "{title}");
        }
        other => panic!("the dashboard's panel {other:?} has no prediction here: add one"),
    }
}

/// What the kernel predicts each alert expression returns, among the loads' devices.
fn check_alert(
    checks: &mut Checks,
    gate: &Gate,
    name: &str,
    fired: &[Series],
    (tap, veth): (&Device, &Device),
    misses: Misses,
) {
    let mine: BTreeSet<&str> = [tap, veth]
        .into_iter()
        .filter(|d| fired.iter().any(|s| s.of(&d.netns, &d.name)))
        .map(|d| d.name.as_str())
        .collect();
    let none = BTreeSet::new();
    let tap_only = BTreeSet::from([tap.name.as_str()]);
    match name {
        // The tap's ring dropped (tx_dropped); veth's queue stopped instead.
        "TapRingTailDrop" => checks.eq(
            gate,
            Oracle::DeviceStats,
            &mine,
            &tap_only,
            format!("{name}: {fired:?}"),
        ),
        // Every stop was woken, and the qdiscs were empty after the drain.
        "TapQueueStuck" => assert_eq!(mine, none, "{name}: {fired:?}"),
        "TapBackpressureUnused" => {
            let flag = common::tun_has_backpressure().unwrap();
            let predicted = if flag { tap_only } else { none };
            assert_eq!(
                mine, predicted,
                "{name} (IFF_BACKPRESSURE here: {flag}): {fired:?}"
            );
        }
        // Fires on the programs' own misses, which the kernel counts.
        "TapProbeCountsShort" => checks.eq(
            &Gate::always(BACKEND).unless(misses.uncertain()),
            Oracle::ProgramMisses,
            !fired.is_empty(),
            misses.short_fires().unwrap_or_default(),
            format!("{name}: the kernel's recursion_misses {misses:?}: {fired:?}"),
        ),
        other => panic!("the alert {other:?} has no prediction here: add one"),
    }
}

/// The counter families the dashboard takes a `rate` of.
fn rated_families(dashboard: &Value) -> BTreeSet<String> {
    dashboard["panels"]
        .as_array()
        .unwrap()
        .iter()
        .filter_map(|panel| panel["targets"].as_array())
        .flatten()
        .flat_map(|t| {
            let expr = t["expr"].as_str().unwrap();
            expr.split("rate(")
                .skip(1)
                .map(|rest| {
                    rest.chars()
                        .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                        .collect::<String>()
                })
                .collect::<Vec<_>>()
        })
        .collect()
}

/// Requires what makes a `rate` over `window`, evaluated at `at`, times `window` equal to a
/// counter's last value, exactly (Prometheus' `extrapolatedRate`): each series of the
/// devices' rated counters was first stored at zero (extrapolation to the start stops at
/// zero, and adds nothing), last stored at `at` itself (nothing to extrapolate to the end),
/// and is the device queue's only series of its family (a label that changed, such as the
/// holder's, would split the count between a series ended early and one that starts high).
/// Without this a mismatch with the kernel could be Prometheus' arithmetic; with it, it
/// is the exporter's. Histogram buckets are left out: their samples count refreshes from the
/// device's discovery, and the percentile panel is held to a bucket, not to a count.
fn rates_are_whole(
    prometheus: &Prometheus,
    dashboard: &Value,
    (tap, veth): (&Device, &Device),
    at: f64,
    window: f64,
) {
    let families: Vec<String> = rated_families(dashboard)
        .into_iter()
        .filter(|f| f.ends_with("_total"))
        .collect();
    assert!(!families.is_empty(), "the dashboard rates no counter");
    let stored = prometheus.api(&format!(
        "/api/v1/query?query={}&time={at:.3}",
        encode(&format!(
            "{{__name__=~\"{}\",netns=~\"{}|{}\"}}[{window}s]",
            families.join("|"),
            tap.netns,
            veth.netns
        ))
    ));
    let mut seen: BTreeMap<(String, String, String, String), usize> = BTreeMap::new();
    for series in stored["result"].as_array().unwrap() {
        let metric = &series["metric"];
        let values = series["values"].as_array().unwrap();
        let key = ["__name__", "netns", "device", "queue"]
            .map(|l| metric[l].as_str().unwrap_or_default().to_owned());
        *seen.entry(key.into()).or_default() += 1;
        assert_eq!(
            values[0][1],
            "0",
            "{metric} was first stored above zero (scraped after its traffic began): a \
             rate of it cannot equal the kernel's count: {:?}",
            &values[..values.len().min(3)]
        );
        let last = values.last().unwrap()[0].as_f64().unwrap();
        assert!(
            (last - at).abs() < 5e-4,
            "{metric} was last stored at {last}, before the last scrape at {at}: it went \
             stale, and a rate of it is extrapolated"
        );
    }
    for ((family, _, device, queue), n) in &seen {
        assert_eq!(
            *n, 1,
            "{family} of {device} queue {queue} has {n} series: a label changed under it"
        );
    }
    for device in [tap, veth] {
        assert!(
            seen.keys().any(|(_, _, name, _)| *name == device.name),
            "no rated counter of {} stored: {stored}",
            device.name
        );
    }
}

#[test]
fn the_dashboard_and_the_alerts_show_what_the_kernel_counted() {
    scenario(Form::Default);
}

#[test]
fn per_queue_the_dashboard_and_the_alerts_show_what_the_kernel_counted() {
    scenario(Form::Detailed);
}

#[expect(
    clippy::too_many_lines,
    reason = "one scenario, start to stop, in order"
)]
fn scenario(form: Form) {
    if !tap_probe_verdict::root() {
        return;
    }
    if !common::prometheus::installed() {
        Skip::test(format!(
            "no {PROMETHEUS} here (Debian's prometheus package; cargo xtask \
             setup installs it)"
        ))
        .print();
        return;
    }
    let started = now();
    let binary: PathBuf = std::fs::canonicalize(BIN).unwrap();
    let refresh = REFRESH.to_string();
    let mut args = vec![
        "--interval",
        &refresh,
        "--forget-after",
        "600",
        "--netns",
        "tap-probe-load-*",
    ];
    args.extend(form.args());
    let (service, loaded) = Service::tracepoints(&binary, &args);
    let prometheus = Prometheus::start(&service.addr);
    let deadline = Instant::now() + Duration::from_secs(30);
    while prometheus
        .query("up{job=\"tap-probe\"} == 1", now())
        .is_empty()
    {
        assert!(Instant::now() < deadline, "prometheus never scraped serve");
        std::thread::sleep(Duration::from_millis(200));
    }
    let kernel_misses = || service::kernel_misses(&loaded);
    // The first samples hold no more of the programs' misses than the kernel counted by now.
    let missed_stored = kernel_misses();

    let tail_drop = Load::start(&["--pps", "20000", "--reader-pps", "5000"]);
    let backpressure = Load::start(&["--topology", "veth", "--peer-hold-ns", "20000"]);
    let (tail_drop, backpressure) = (tail_drop.report(), backpressure.report());
    let tap = Device {
        netns: tail_drop["device"]["netns_name"]
            .as_str()
            .unwrap()
            .to_owned(),
        name: tail_drop["device"]["name"].as_str().unwrap().to_owned(),
        tx_packets: count(&tail_drop, "kernel_tx_packets"),
        tx_dropped: count(&tail_drop, "kernel_tx_dropped"),
        requeues: count(&tail_drop, "qdisc_requeues"),
    };
    let veth = Device {
        netns: backpressure["netns"].as_str().unwrap().to_owned(),
        name: backpressure["device"].as_str().unwrap().to_owned(),
        tx_packets: count(&backpressure, "kernel_tx_packets"),
        tx_dropped: count(&backpressure, "kernel_tx_dropped"),
        requeues: count(&backpressure, "qdisc_requeues"),
    };
    let ring = count(&tail_drop, "tx_queue_len");
    let ended = now();
    assert!(
        tap.tx_dropped > 0.0 && veth.requeues > 0.0,
        "the loads did not tail-drop and push back: this run proves nothing: {tap:?} {veth:?}"
    );
    // What the kernel skipped of serve's programs decides whether its counts can be held
    // to the kernel's exactly.
    let missed_runs = kernel_misses();
    let gate = Gate::of_programs(BACKEND, missed_runs);
    let mut checks = Checks::new();

    // The departed devices' last counts reach Prometheus: the kernel's, exactly.
    let exact = |time: f64| {
        let value = |expr: String| prometheus.query(&expr, time).first().map(|s| s.value);
        let of = |d: &Device| format!("netns=\"{}\",device=\"{}\"", d.netns, d.name);
        [
            (
                value(format!("sum(tap_probe_consumed_total{{{}}})", of(&tap))),
                tap.tx_packets,
            ),
            (
                value(format!(
                    "sum(tap_probe_dropped_full_ring_total{{{0}}}) + sum(tap_probe_dropped_other_total{{{0}}})",
                    of(&tap)
                )),
                tap.tx_dropped,
            ),
            (
                value(format!(
                    "sum(tap_probe_busy_total{{{0}}}) + sum(tap_probe_requeued_stopped_total{{{0}}})",
                    of(&veth)
                )),
                veth.requeues,
            ),
            (
                value(format!("sum(tap_probe_enqueued_total{{{}}})", of(&veth))),
                veth.tx_packets,
            ),
        ]
    };
    let last_scrape = || prometheus.query("timestamp(tap_probe_elapsed_seconds)", now())[0].value;
    // A refresh of serve after the devices went, and a scrape after it: serve reads the
    // counters of a departed device one last time when it finds it gone.
    let deadline = Instant::now() + Duration::from_secs(30);
    while last_scrape() < ended + 2.0 * (REFRESH + SCRAPE) {
        assert!(
            Instant::now() < deadline,
            "Prometheus stopped scraping serve"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
    // Where the counts can be exact, they may still take a scrape or two to be (Prometheus
    // had them when all match).
    while gate.is_open() && !exact(now()).iter().all(|(got, want)| *got == Some(*want)) {
        if Instant::now() > deadline {
            break;
        }
        std::thread::sleep(Duration::from_millis(250));
    }
    // The time of the last scrape, and a window back to before the devices existed.
    let at = last_scrape();
    let names = [
        (Oracle::DeviceStats, "the tap's packets read, tx_packets"),
        (Oracle::DeviceStats, "the tap's drops, tx_dropped"),
        (
            Oracle::Qdisc,
            "the veth's busy returns and requeues, the qdisc's requeues",
        ),
        (Oracle::DeviceStats, "the veth's packets, tx_packets"),
    ];
    for ((got, want), (oracle, what)) in exact(at).into_iter().zip(names) {
        checks.eq(
            &gate,
            oracle,
            got,
            Some(want),
            format!("Prometheus' {what}"),
        );
    }
    // The samples at `at` were taken after the loads ended, and before this read.
    let misses = Misses {
        first: missed_stored,
        last: (missed_runs, kernel_misses()),
    };
    let window = (at - started).ceil() + 60.0;

    let dashboard: Value = serde_json::from_str(DASHBOARD).unwrap();
    rates_are_whole(&prometheus, &dashboard, (&tap, &veth), at, window);
    let mut panels = 0;
    for panel in dashboard["panels"].as_array().unwrap() {
        let Some(targets) = panel["targets"].as_array() else {
            continue;
        };
        let results: BTreeMap<String, Vec<Series>> = targets
            .iter()
            .map(|t| {
                let expr = t["expr"]
                    .as_str()
                    .unwrap()
                    .replace("$__rate_interval", &format!("{window}s"))
                    .replace("$instance", ".*")
                    .replace("$vm", ".*");
                (
                    t["refId"].as_str().unwrap().to_owned(),
                    prometheus.query(&expr, at),
                )
            })
            .collect();
        let title = panel["title"].as_str().unwrap();
        check_panel(
            &mut checks,
            &gate,
            form,
            title,
            &results,
            window,
            &tap,
            &veth,
            ring,
            misses.last.1,
        );
        panels += 1;
    }
    assert!(panels >= 12, "{panels} panels");
    // The variables: this exporter's instance; no VM among the loads' holders.
    let instances = prometheus.api("/api/v1/label/instance/values?match[]=tap_probe_build_info");
    assert!(
        instances
            .as_array()
            .unwrap()
            .iter()
            .any(|i| i == service.addr.as_str()),
        "{instances}"
    );
    let ours = format!(
        "tap_probe_xmit_calls_total{{netns=~\"{}|{}\"}}",
        tap.netns, veth.netns
    );
    let vms = prometheus.api(&format!(
        "/api/v1/label/vm/values?match[]={}",
        encode(&ours)
    ));
    assert_eq!(vms, Value::Array(Vec::new()), "the loads run no VM");

    let rules = prometheus.api("/api/v1/rules");
    let mut alerts = 0;
    for group in rules["groups"].as_array().unwrap() {
        for rule in group["rules"].as_array().unwrap() {
            let name = rule["name"].as_str().unwrap();
            let fired = prometheus.query(rule["query"].as_str().unwrap(), at);
            check_alert(&mut checks, &gate, name, &fired, (&tap, &veth), misses);
            alerts += 1;
        }
    }
    assert_eq!(alerts, 4, "{rules}");
    drop(prometheus);

    let (status, stderr, _) = service.terminate();
    assert!(status.success(), "{}", stderr.join("\n"));
    assert_eq!(left_behind(&loaded), (Vec::new(), Vec::new()));
}
