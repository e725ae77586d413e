//! `tap-probe watch` end to end: discovery across namespaces, owners, devices that vanish,
//! the JSON schema, and bad input.

use std::os::unix::fs::PermissionsExt as _;
use std::process::Command;

use std::time::Duration;

use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::discovery::DeviceKind;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::Tap;
use tap_probe_spec::load::LoadNumbers;

use crate::common;
use crate::common::BIN;
use crate::common::running::{Lines, Running};
use crate::common::{Gate, Oracle};

#[test]
fn finds_tap_in_other_namespace_with_owner_and_retires_it_when_removed() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("disc").unwrap();
    let tap = common::tap_in(&ns, "tpd0", RootQdisc::PfifoFast).unwrap();
    let filter = common::filter(&ns, "tpd*");
    let kernel = KernelInfo::load().unwrap();
    let mut watcher = Watcher::with_backend(&kernel, &filter, Backend::Auto).unwrap();
    let report = watcher.refresh().unwrap();
    assert_eq!(report.rows.len(), 1, "{:?}", report.rows);
    let row = &report.rows[0];
    assert_eq!(row.ifname, "tpd0");
    assert_eq!(row.netns, ns.name());
    assert_eq!(row.kind, DeviceKind::Tap);
    assert_eq!(
        row.owner.as_ref().map(|o| o.pid),
        Some(std::process::id()),
        "the test holds the tap open"
    );
    assert!(!row.retired);

    drop(tap);
    let report = watcher.refresh().unwrap();
    assert_eq!(
        report.rows.len(),
        1,
        "the vanished device is reported once more"
    );
    assert!(report.rows[0].retired);
    let report = watcher.refresh().unwrap();
    assert!(report.rows.is_empty(), "then it is gone: {:?}", report.rows);
}

#[test]
fn json_lines_carry_every_field() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("json").unwrap();
    let _tap = common::tap_in(&ns, "tpj0", RootQdisc::Noqueue).unwrap();
    // Flows' order is followed only when asked for: its two counters are null without.
    for flows in [false, true] {
        json_lines_of_one_run(&ns, flows);
    }
}

/// One `watch --format json` of the tap `tpj0` in `ns`, with `--flows` or not.
fn json_lines_of_one_run(ns: &NamedNetns, flows: bool) {
    let out = Command::new(BIN)
        .args([
            "watch",
            "--dev",
            "tpj0",
            "--netns",
            ns.name(),
            "--format",
            "json",
        ])
        .args(["--interval", "0.2", "--duration", "1"])
        .args(flows.then_some("--flows"))
        .output()
        .unwrap();
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let lines: Vec<serde_json::Value> = String::from_utf8(out.stdout)
        .unwrap()
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    assert!(lines.len() >= 3, "refreshes and a final summary: {lines:?}");
    assert_eq!(lines.last().unwrap()["final"], true);
    for line in &lines {
        let rows = line["rows"].as_array().unwrap();
        assert_eq!(rows.len(), 1);
        let row = &rows[0];
        for field in [
            "ifname",
            "ifindex",
            "netns",
            "kind",
            "queue",
            "owner",
            "xmit_calls",
            "enqueued",
            "busy",
            "dropped_full_ring",
            "dropped_other",
            "drop_reasons",
            "consumed",
            "queue_stops",
            "queue_wakes",
            "stopped_ns",
            "reader_sleeps",
            "wakeups_per_packet",
            "requeued_stopped",
            "wakes_reader",
            "wakes_vhost",
            "wakes_forced",
            "wakes_other",
            "wakes_recheck",
            "stuck",
            "ring_occupancy",
            "backpressure",
        ] {
            assert!(row.get(field).is_some(), "missing {field} in {row}");
        }
        // A tap's flag is known on every backend, its ring wherever BTF says where it is.
        assert!(row["backpressure"].is_boolean(), "{row}");
        let ring_known = line["sources"]["ring_occupancy"]
            .as_str()
            .is_some_and(|s| s.starts_with("ptr_ring"));
        if ring_known {
            assert!(row["ring_occupancy"]["histogram"].is_array(), "{row}");
        } else {
            assert!(row["ring_occupancy"].is_null(), "unknown, not 0: {row}");
        }
        assert!(row["stuck"].is_boolean(), "{row}");
        // Wakes by source need the wake kprobe: numbers with it, null without.
        let wakes_known = line["sources"]["wakes"]
            .as_str()
            .is_some_and(|s| s.starts_with("kprobe"));
        assert_eq!(row["wakes_reader"].is_u64(), wakes_known, "{row}");
        assert_eq!(row["reordered"].is_u64(), flows, "{row}");
        assert_eq!(row["flows_joined"].is_u64(), flows, "{row}");
        assert_eq!(row["ifname"], "tpj0");
        assert_eq!(row["kind"], "tap");
        assert!(row["kernel"]["tx_packets"].is_u64());
        assert!(row["kernel"]["tx_dropped"].is_u64());
        assert_eq!(row["owner"]["pid"], std::process::id());
    }
}

/// `demo --format json` ends with one object that holds the final rows and what the
/// load did, by the sender's and the kernel's own counts; the rows agree with the kernel.
#[test]
fn demo_json_ends_with_the_rows_and_the_load_report() {
    if !tap_probe_verdict::root() {
        return;
    }
    let out = Command::new(BIN)
        .args([
            "demo",
            "--format",
            "json",
            "--duration",
            "2",
            "--interval",
            "0.5",
        ])
        .args(["--qdisc", "pfifo", "--pps", "10000", "--reader-pps", "3000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let lines: Vec<serde_json::Value> = stdout
        .lines()
        .map(|l| serde_json::from_str(l).expect("each line is one JSON object"))
        .collect();
    let last = lines.last().unwrap();
    assert_eq!(last["final"], true);
    assert_eq!(
        lines.iter().filter(|l| l.get("load").is_some()).count(),
        1,
        "only the last line carries the load report"
    );
    let load = &last["load"];
    let row = &last["rows"][0];
    assert_eq!(load["qdisc"], "pfifo", "{load}");
    let numbers: LoadNumbers = serde_json::from_value(load.clone()).unwrap();
    let n = |v: &serde_json::Value| v.as_u64().unwrap();
    assert_eq!(
        n(&row["consumed"]),
        numbers.kernel_tx_packets,
        "{row}\n{load}"
    );
    assert_eq!(
        n(&row["dropped_full_ring"]),
        numbers.kernel_tx_dropped,
        "{row}\n{load}"
    );
    assert_eq!(
        numbers.attempted,
        numbers.kernel_tx_packets + numbers.kernel_tx_dropped + numbers.qdisc_drops.unwrap(),
        "every frame the demo sent is accounted for: {load}"
    );
    assert!(
        numbers.qdisc_requeues.unwrap() >= n(&row["busy"]),
        "{row}\n{load}"
    );
}

/// `demo --backpressure` opens its tap with `IFF_BACKPRESSURE` where the kernel lists the
/// flag: the queue stops instead of the ring dropping, and the row says the tap runs the
/// fix. Where the kernel lacks the flag, the demo refuses before it makes anything.
#[test]
fn demo_with_backpressure_stops_the_queue_or_refuses() {
    if !tap_probe_verdict::root() {
        return;
    }
    let out = Command::new(BIN)
        .args(["demo", "--backpressure", "--format", "json"])
        .args(["--duration", "2", "--interval", "0.5", "--qdisc", "pfifo"])
        .args(["--pps", "10000", "--reader-pps", "3000"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    if !common::tun_has_backpressure().unwrap() {
        assert!(!out.status.success(), "{stderr}");
        assert!(
            stderr.contains("does not support IFF_BACKPRESSURE"),
            "{stderr}"
        );
        assert!(!stderr.contains("panicked"), "{stderr}");
        return;
    }
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let row = &last["rows"][0];
    let load = &last["load"];
    assert_eq!(load["backpressure"], true, "{load}");
    assert_eq!(row["backpressure"], true, "the tap runs the fix: {row}");
    assert_eq!(row["dropped_full_ring"], 0, "{row}\n{load}");
    assert_eq!(load["kernel_tx_dropped"], 0, "{load}");
    assert!(row["queue_stops"].as_u64().unwrap() > 0, "{row}");
}

#[test]
fn unmatched_glob_is_an_error_that_lists_devices() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("nomatch").unwrap();
    let _tap = common::tap_in(&ns, "tpn0", RootQdisc::Noqueue).unwrap();
    let out = Command::new(BIN)
        .args(["watch", "--dev", "no-such-dev*", "--duration", "1"])
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("no tun, tap, veth or macvtap device matches"),
        "{stderr}"
    );
    assert!(stderr.contains("tpn0"), "lists what exists: {stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn without_privileges_the_error_names_the_capabilities() {
    if !tap_probe_verdict::root() {
        return;
    }
    // setpriv (util-linux) drops to an unprivileged user with no capabilities; that user
    // may not reach the build directory, so it runs a copy in a world-readable place.
    let dir = tempfile::tempdir().unwrap();
    let bin = dir.path().join("tap-probe");
    std::fs::copy(BIN, &bin).unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    std::fs::set_permissions(&bin, std::fs::Permissions::from_mode(0o755)).unwrap();
    let out = Command::new("setpriv")
        .args([
            "--reuid=65534",
            "--regid=65534",
            "--clear-groups",
            "--inh-caps=-all",
        ])
        .arg(&bin)
        .args(["watch", "--duration", "1"])
        .output()
        .expect("setpriv runs");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    for cap in ["CAP_BPF", "CAP_PERFMON", "CAP_NET_ADMIN"] {
        assert!(stderr.contains(cap), "{cap} named: {stderr}");
    }
    assert!(!stderr.contains("panicked"), "{stderr}");
}

#[test]
fn forcing_an_unavailable_backend_is_a_clear_error_and_auto_falls_back() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("backend").unwrap();
    let _tap = common::tap_in(&ns, "tpb0", RootQdisc::Noqueue).unwrap();
    let watch = |backend: &str| {
        Command::new(BIN)
            .args([
                "watch",
                "--dev",
                "tpb0",
                "--netns",
                ns.name(),
                "--format",
                "json",
            ])
            .args([
                "--duration",
                "0.5",
                "--interval",
                "0.2",
                "--backend",
                backend,
            ])
            .output()
            .unwrap()
    };
    // No kernel here can run fentry programs on tun (see tap_probe_observer's bpf::backend), so
    // fentry is no value of --backend at all.
    let out = watch("fentry");
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    assert!(
        stderr.contains("invalid value 'fentry'")
            && stderr.contains("[possible values: auto, kprobe, tracepoint]"),
        "{stderr}"
    );
    assert!(!stderr.contains("panicked"), "{stderr}");

    let out = watch("auto");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let sources = &last["sources"];
    assert!(
        sources["notes"]
            .as_array()
            .unwrap()
            .iter()
            .any(|n| n.as_str().unwrap().starts_with("fentry:")),
        "auto says why it did not use fentry: {sources}"
    );
    for counter in ["xmit", "drops", "consumed", "queue_state"] {
        assert!(
            sources[counter].as_str().is_some_and(|s| !s.is_empty()),
            "{counter}: {sources}"
        );
    }
}

/// Sends `frames` frames through `tap` from inside `ns` while a reader takes them all.
fn send_and_read(ns: &NamedNetns, tap: &Tap, frames: u64) {
    let driven = common::paced_and_read(ns.path(), tap, frames);
    assert_eq!(driven.sent.sent, frames, "{:?}", driven.sent);
    assert_eq!(driven.read[0].packets, frames);
}

/// One scrape: the status line and the body.
fn scrape(addr: &str, path: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(5) * common::slowdown()))
        .unwrap();
    write!(
        stream,
        "GET {path} HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample of `family` for `device`, if the body has one.
fn sample(body: &str, family: &str, device: &str) -> Option<u64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| l.contains(&format!("device=\"{device}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}

#[test]
fn prometheus_endpoint_serves_the_counters() {
    const FRAMES: u64 = 500;
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("prom").unwrap();
    let tap = common::tap_in(&ns, "tpp0", RootQdisc::Noqueue).unwrap();
    let watch = Running::watch(
        &["--dev", "tpp0", "--netns", ns.name()],
        &["--interval", "0.2", "--prometheus", "127.0.0.1:0"],
        Lines::Stderr,
    );
    let addr = loop {
        let line = watch
            .lines
            .recv_timeout(Duration::from_secs(30) * common::slowdown())
            .expect("watch announces its metrics address");
        if let Some(rest) = line.split_once("serving metrics on http://") {
            break rest.1.trim_end_matches("/metrics").to_owned();
        }
    };

    send_and_read(&ns, &tap, FRAMES);

    // The exporter serves the last refresh: wait (bounded) for one after the traffic.
    let deadline = std::time::Instant::now() + Duration::from_secs(10) * common::slowdown();
    let body = loop {
        let (status, body) = scrape(&addr, "/metrics");
        assert_eq!(status, "HTTP/1.1 200 OK");
        if sample(&body, "tap_probe_kernel_tx_packets_total", "tpp0") == Some(FRAMES) {
            break body;
        }
        assert!(
            std::time::Instant::now() < deadline,
            "the scrape never showed the traffic:\n{body}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let mut checks = common::Checks::new();
    for family in [
        "tap_probe_xmit_calls_total",
        "tap_probe_enqueued_total",
        "tap_probe_consumed_total",
    ] {
        checks.eq(
            &Gate::none(),
            Oracle::Reader,
            sample(&body, family, "tpp0"),
            Some(FRAMES),
            format!("{family}, every frame read:\n{body}"),
        );
    }
    assert_eq!(
        sample(&body, "tap_probe_dropped_full_ring_total", "tpp0"),
        Some(0)
    );
    assert_eq!(scrape(&addr, "/").0, "HTTP/1.1 404 Not Found");

    assert!(watch.terminate().0, "watch stops in order on SIGTERM");
    drop(tap);
    drop(ns);
}

/// `--occupancy off` leaves the rings unread, says so in the sources, and changes no count.
#[test]
fn without_occupancy_the_ring_is_left_unread_and_the_counts_stay_exact() {
    const FRAMES: u64 = 500;
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("noocc").unwrap();
    let tap = common::tap_in(&ns, "tpo0", RootQdisc::Noqueue).unwrap();
    let watch = Running::watch(
        &["--dev", "tpo0", "--netns", ns.name()],
        &[
            "--format",
            "json",
            "--interval",
            "0.2",
            "--occupancy",
            "off",
        ],
        Lines::Stdout,
    );
    // The first report: the tap is tracked before the first frame.
    let first = watch
        .lines
        .recv_timeout(Duration::from_secs(30) * common::slowdown())
        .expect("watch reports within its attach time");
    let first: serde_json::Value = serde_json::from_str(&first).unwrap();
    assert_eq!(first["rows"][0]["ifname"], "tpo0", "{first}");

    send_and_read(&ns, &tap, FRAMES);

    let (clean, rest) = watch.terminate();
    assert!(clean, "watch stops in order on SIGTERM");
    let last: serde_json::Value =
        serde_json::from_str(rest.last().expect("a final summary")).unwrap();
    assert_eq!(last["final"], true, "{last}");
    let ring = last["sources"]["ring_occupancy"]
        .as_str()
        .unwrap_or_default();
    assert!(ring.contains("--occupancy off"), "{last}");
    let row = &last["rows"][0];
    assert!(row["ring_occupancy"].is_null(), "{row}");
    let mut checks = common::Checks::new();
    for counter in ["xmit_calls", "enqueued", "consumed"] {
        checks.eq(
            &Gate::none(),
            Oracle::Reader,
            row[counter].as_u64(),
            Some(FRAMES),
            format!("{counter}, every frame read: {row}"),
        );
    }
    assert_eq!(row["dropped_full_ring"], 0, "{row}");
    assert_eq!(row["kernel"]["tx_packets"], FRAMES, "{row}");
    drop(tap);
    drop(ns);
}

/// A device that goes away during a `--format json` run stays in the final object, with
/// `"retired": true` and the counts it had when it went: every frame its reader took, as the
/// kernel counted them (`tx_packets`), though the last refreshes found no device at all.
#[test]
fn the_final_json_object_keeps_a_device_that_went_away() {
    const FRAMES: u64 = 300;
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("gonejson").unwrap();
    let tap = common::tap_in(&ns, "tpg0", RootQdisc::Noqueue).unwrap();
    let watch = Running::watch(
        &["--dev", "tpg0", "--netns", ns.name()],
        &["--format", "json", "--interval", "0.2"],
        Lines::Stdout,
    );
    let next = || -> serde_json::Value {
        let line = watch
            .lines
            .recv_timeout(Duration::from_secs(30) * common::slowdown())
            .expect("watch reports every interval");
        serde_json::from_str(&line).unwrap()
    };
    assert_eq!(
        next()["rows"][0]["ifname"],
        "tpg0",
        "tracked before the frames"
    );
    send_and_read(&ns, &tap, FRAMES);
    // A refresh that read the kernel's count of every frame while the tap was there: the
    // kernel's statistics of a device that is gone cannot be read.
    while next()["rows"][0]["kernel"]["tx_packets"] != FRAMES {}
    drop(tap);
    // The refresh that finds it gone reports it once more, retired; the next has no row.
    while !next()["rows"][0]["retired"].as_bool().unwrap_or_default() {}
    assert_eq!(next()["rows"], serde_json::json!([]), "then it is gone");

    let (clean, rest) = watch.terminate();
    assert!(clean, "watch stops in order on SIGTERM");
    let last: serde_json::Value =
        serde_json::from_str(rest.last().expect("a final summary")).unwrap();
    assert_eq!(last["final"], true, "{last}");
    let rows = last["rows"].as_array().unwrap();
    assert_eq!(rows.len(), 1, "the departed device, once: {last}");
    let row = &rows[0];
    assert_eq!(
        (&row["ifname"], &row["retired"]),
        (&serde_json::json!("tpg0"), &serde_json::json!(true)),
        "{row}"
    );
    // The run's own report says whether the kernel skipped runs of its programs.
    let gate = if last["counts_may_be_short"] == true {
        Gate::short("the kernel skipped runs of watch's programs")
    } else {
        Gate::none()
    };
    let mut checks = common::Checks::new();
    checks.eq(
        &gate,
        Oracle::DeviceStats,
        row["consumed"].as_u64(),
        row["kernel"]["tx_packets"].as_u64(),
        format!("its totals, as the kernel counted them when it went: {row}"),
    );
    checks.eq(
        &gate,
        Oracle::Reader,
        row["consumed"].as_u64(),
        Some(FRAMES),
        format!("every frame its reader took: {row}"),
    );
    drop(ns);
}

/// The final JSON object of one `watch --format json` run over `ns`, and its stderr.
fn watch_json(ns: &str, extra: &[&str]) -> (serde_json::Value, String) {
    let out = Command::new(BIN)
        .args(["watch", "--netns", ns, "--format", "json"])
        .args(["--interval", "0.2", "--duration", "0.5"])
        .args(extra)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr).into_owned();
    assert!(out.status.success(), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    assert_eq!(last["final"], true);
    (last, stderr)
}

/// A macvtap's ring is filled by the rx handler of its lower device, which the
/// transmit-side counters do not see: it is left out unless asked for, and then watched
/// with a warning that says what is not exact.
#[test]
fn macvtap_is_watched_only_when_asked_for_and_then_with_a_warning() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("mvtap").unwrap();
    run_in(ns.path(), || {
        let mut rtnl = Rtnl::open()?;
        rtnl.add_veth("tpm-v0", "tpm-v1", Some(1))?;
        let lower = rtnl.link_by_name("tpm-v0")?.ifindex;
        rtnl.add_macvtap("tpm-mt0", lower)?;
        Ok(())
    })
    .unwrap();
    let kinds = |last: &serde_json::Value| -> Vec<String> {
        let mut kinds: Vec<String> = last["rows"]
            .as_array()
            .unwrap()
            .iter()
            .map(|r| format!("{} {}", r["ifname"].as_str().unwrap(), r["kind"]))
            .collect();
        kinds.sort();
        kinds.dedup();
        kinds
    };
    let (last, stderr) = watch_json(ns.name(), &[]);
    assert_eq!(
        kinds(&last),
        [r#"tpm-v0 "veth""#, r#"tpm-v1 "veth""#],
        "no macvtap by default"
    );
    assert!(!stderr.contains("macvtap"), "{stderr}");
    let (last, stderr) = watch_json(ns.name(), &["--macvtap"]);
    assert_eq!(
        kinds(&last),
        [
            r#"tpm-mt0 "macvtap""#,
            r#"tpm-v0 "veth""#,
            r#"tpm-v1 "veth""#
        ]
    );
    assert!(
        stderr.contains("only their consumed") && stderr.contains("tap_handle_frame"),
        "the warning says what is not exact: {stderr}"
    );
}

/// `tap-probe` run as root with only the capabilities `caps` (lower case, without `cap_`)
/// in its bounding set, hence in its effective set.
fn with_capabilities(caps: &[&str], args: &[&str]) -> std::process::Output {
    let bounding: String = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    Command::new("setpriv")
        .arg(format!("--bounding-set={bounding}"))
        .arg("--")
        .arg(BIN)
        .args(args)
        .output()
        .expect("setpriv runs")
}

/// The advice the error gives works: with exactly the capabilities it names, `watch` finds a
/// tap in a namespace of its own, with the process holding it; without any one of them it
/// refuses, naming that one (but for `CAP_BPF` and `CAP_PERFMON`, which `CAP_SYS_ADMIN`
/// stands in for).
#[test]
fn the_capabilities_the_error_names_are_enough_and_each_is_needed() {
    if !tap_probe_verdict::root() {
        return;
    }
    let out = with_capabilities(&[], &["watch", "--duration", "1"]);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(!out.status.success());
    let advice = stderr
        .split("setcap ")
        .nth(1)
        .and_then(|rest| rest.split("+ep").next())
        .unwrap_or_else(|| panic!("a setcap line: {stderr}"));
    let caps: Vec<&str> = advice
        .split(',')
        .map(|c| c.strip_prefix("cap_").unwrap())
        .collect();

    let ns = common::quiet_netns("caps").unwrap();
    let _tap = common::tap_in(&ns, "tpc0", RootQdisc::Noqueue).unwrap();
    let watch = [
        "watch",
        "--netns",
        ns.name(),
        "--format",
        "json",
        "--interval",
        "0.2",
        "--duration",
        "0.5",
    ];
    let out = with_capabilities(&caps, &watch);
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "with {caps:?}: {stderr}");
    assert!(!stderr.contains("cannot enter"), "{stderr}");
    let stdout = String::from_utf8(out.stdout).unwrap();
    let last: serde_json::Value = serde_json::from_str(stdout.lines().last().unwrap()).unwrap();
    let row = &last["rows"][0];
    assert_eq!(row["ifname"], "tpc0", "{last}");
    assert_eq!(row["owner"]["pid"], std::process::id(), "{last}");

    for missing in &caps {
        let fewer: Vec<&str> = caps.iter().copied().filter(|c| c != missing).collect();
        let out = with_capabilities(&fewer, &watch);
        let stderr = String::from_utf8_lossy(&out.stderr);
        if ["bpf", "perfmon"].contains(missing) {
            // The kernel takes CAP_SYS_ADMIN for either (bpf_capable, perfmon_capable).
            assert!(out.status.success(), "without {missing}: {stderr}");
            continue;
        }
        assert!(!out.status.success(), "without {missing}: {stderr}");
        let named = format!("CAP_{}", missing.to_uppercase());
        assert!(
            stderr.contains(&format!("lacks {named}:")),
            "without {missing}, {named} is named: {stderr}"
        );
    }
}

/// Every refresh reads what the kernel skipped of each attached program, for every backend
/// this kernel runs, and a quiet run (a tap nobody sends to) reads 0 for each: runs the
/// kernel refused where it counts them (`bpf_prog_info.recursion_misses`, Linux 5.12+, as
/// BTF says; unknown, `null`, where it does not), and a kprobe's own misses where the kernel
/// reports them (its perf link, Linux 6.7+, as BTF says). That the reading is of the right
/// field is proven in `misses.rs`, which causes misses and counts them with the same code.
#[test]
fn what_the_kernel_skipped_is_read_for_every_program() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = KernelInfo::load().unwrap();
    let counted = tap_probe_observer::kernel::btf::has_member(
        &tap_probe_observer::kernel::btf::load_vmlinux().unwrap(),
        "bpf_prog_info",
        "recursion_misses",
    );
    let names = common::probe_program_names().unwrap();
    let ns = common::quiet_netns("missed").unwrap();
    let _tap = common::tap_in(&ns, "tpmi0", RootQdisc::Noqueue).unwrap();
    for backend in Backend::available(&kernel) {
        let name = format!("{backend:?}").to_lowercase();
        let (last, stderr) = watch_json(ns.name(), &["--backend", &name]);
        assert_eq!(last["rows"].as_array().unwrap().len(), 1, "{stderr}");
        let missed = last["missed"].as_array().unwrap();
        assert!(missed.len() >= 3, "{backend:?}: {missed:?}");
        for m in missed {
            let program = m["program"].as_str().unwrap();
            assert!(
                names.contains(program),
                "{backend:?}: {program} is not a program of the probe object: {names:?}"
            );
            if counted {
                assert_eq!(m["runs"], 0, "{backend:?}: a quiet run: {m}");
            } else {
                assert!(m["runs"].is_null(), "{backend:?}: unknown, not 0: {m}");
            }
            if !m["kprobe"].is_null() {
                assert_eq!(m["kprobe"], 0, "{backend:?}: a quiet run: {m}");
            }
        }
        assert_eq!(last["counts_may_be_short"], false, "{backend:?}: {last}");
        let said = last["sources"]["missed"].as_str().unwrap_or_default();
        assert_eq!(said.starts_with("unknown"), !counted, "{backend:?}: {said}");
        // The kprobe backend's programs on kprobes; the others are raw tracepoints.
        let on_kprobes = |m: &&serde_json::Value| {
            backend == Backend::Kprobe
                && [
                    "xmit_entry",
                    "xmit_return",
                    "direct_xmit_entry",
                    "direct_xmit_return",
                ]
                .contains(&m["program"].as_str().unwrap())
        };
        for m in missed.iter().filter(on_kprobes) {
            // What a kprobe missed is known exactly where the kernel reports it.
            assert_eq!(
                m["kprobe"].is_u64(),
                kernel.reports_kprobe_misses(),
                "{backend:?}: {missed:?}"
            );
        }
        assert_eq!(
            missed.iter().filter(on_kprobes).count(),
            if backend == Backend::Kprobe { 4 } else { 0 },
            "{missed:?}"
        );
        if !kernel.reports_kprobe_misses() {
            assert!(missed.iter().all(|m| m["kprobe"].is_null()), "{missed:?}");
        }
    }
}
