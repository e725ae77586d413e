//! A long-running `watch --prometheus` while thousands of devices come and go: more than the
//! probe's tables hold. It must keep serving, say which devices it does not count, and count
//! a device that lives through it all exactly.

use std::io::{BufRead as _, BufReader};
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{Tap, TapOptions};

use crate::common;
use crate::common::BIN;
use crate::common::running::ChildGuard;

/// Rounds of churn: each fills a namespace with taps and veths and deletes it.
const ROUNDS: usize = 3;
/// Per round: taps (one queue each) and veth pairs (two devices, one queue per possible CPU
/// each): together well beyond the [`MAX_QUEUES`] watch is told to count at once.
const TAPS: usize = 700;
const VETH_PAIRS: usize = 400;
/// The queues watch counts at once (`--max-queues`): what it holds, well below the churn.
const MAX_QUEUES: &str = "1024";
/// Frames through the device that lives through the churn.
const FRAMES: u32 = 2_000;

/// One scrape of `/metrics`: the status line and the body.
fn scrape(addr: &str) -> (String, String) {
    use std::io::{Read as _, Write as _};
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(Duration::from_secs(10) * common::slowdown()))
        .unwrap();
    write!(
        stream,
        "GET /metrics HTTP/1.1\r\nHost: {addr}\r\nConnection: close\r\n\r\n"
    )
    .unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The value of the sample of `family` for `device` (any device when `None`).
fn sample(body: &str, family: &str, device: Option<&str>) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .find(|l| device.is_none_or(|d| l.contains(&format!("device=\"{d}\""))))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}

/// Lets this process hold a tap file per device.
fn raise_open_files() {
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, hard, hard).unwrap();
}

/// Starts `watch --prometheus` on the namespaces matching `netns_glob`, and waits for the
/// address it serves on. The thread returns everything it printed on stderr.
fn start_watch(netns_glob: &str) -> (ChildGuard, String, std::thread::JoinHandle<String>) {
    let mut child = common::stoppable(&mut Command::new(BIN))
        .args(["watch", "--netns", netns_glob, "--interval", "0.2"])
        .args(["--max-queues", MAX_QUEUES])
        // The per-queue form: the kernel's skew, which says when a refresh saw no traffic in
        // flight, is one of its families.
        .args(["--prometheus", "127.0.0.1:0", "--per-queue"])
        .stdout(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let guard = ChildGuard(Some(child));
    let (tx, rx) = mpsc::channel();
    let log = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines().map_while(Result::ok) {
            let _ = tx.send(line.clone());
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let addr = loop {
        let line = rx
            .recv_timeout(Duration::from_mins(1) * common::slowdown())
            .expect("watch announces its metrics address");
        if let Some((_, rest)) = line.split_once("serving metrics on http://") {
            break rest.trim_end_matches("/metrics").to_owned();
        }
    };
    (guard, addr, log)
}

/// Fills a fresh namespace with taps and veths, scrapes through a few refreshes, deletes it;
/// [`ROUNDS`] times. Returns the most devices a scrape said were not counted.
fn churn(scrape_ok: &dyn Fn() -> String) -> f64 {
    let mut most_untracked = 0.0f64;
    for round in 0..ROUNDS {
        let churn = common::quiet_netns("chc").unwrap();
        let taps: Vec<Tap> = run_in(churn.path(), || {
            let mut rtnl = Rtnl::open()?;
            for i in 0..VETH_PAIRS {
                rtnl.add_veth(&format!("tpcv{i}a"), &format!("tpcv{i}b"), None)?;
            }
            (0..TAPS)
                .map(|i| Tap::create(&format!("tpct{i}"), TapOptions::default()))
                .collect()
        })
        .unwrap();
        // A few refreshes with the namespace full of devices, scraped all along: at least
        // 3 s, and until a refresh has seen it full (one refresh scans every device, which
        // takes a while in a slow guest), within a bound.
        let until = Instant::now() + Duration::from_secs(3);
        let give_up = Instant::now() + Duration::from_mins(1) * common::slowdown();
        let mut seen_full = false;
        while Instant::now() < give_up && (Instant::now() < until || !seen_full) {
            let body = scrape_ok();
            if let Some(n) = sample(&body, "tap_probe_untracked_devices", None) {
                most_untracked = most_untracked.max(n);
                seen_full |= n > 0.0;
            }
            std::thread::sleep(Duration::from_millis(200));
        }
        eprintln!("round {round}: at most {most_untracked} devices untracked");
        drop(taps);
        drop(churn);
    }
    most_untracked
}

/// Frames through the survivor after the churn: once a refresh after them has been served,
/// every counter of the survivor equals what the sender sent and the reader read. The
/// served body of that refresh.
fn survivor_counted_exactly(
    keep: &NamedNetns,
    survivor: &Tap,
    scrape_ok: &dyn Fn() -> String,
) -> String {
    let driven = common::paced_and_read(keep.path(), survivor, FRAMES.into());
    let sent = driven.sent.sent;
    assert_eq!(sent, u64::from(FRAMES), "{:?}", driven.sent);
    // Under emulation the churn's namespaces are still being torn down in the background,
    // which can keep the reader off the CPU until the ring fills (21 of 2,000 frames once,
    // in 6.1): a frame tail-dropped then must be counted as such, exactly. A reader still
    // behind when the sender is done leaves frames in the ring, which the drain after it
    // takes (383 of 2,000 once, in 5.10): those were read too.
    let read = driven.read[0].packets + driven.drained[0];
    if read < sent {
        eprintln!("the reader took {read} of {sent}: the ring dropped the rest");
    }
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let (sent_f, read_f) = (sent as f64, read as f64);
    // Exact once a refresh after the traffic has been served: the first refresh that sees
    // all of it may have read the kernel's columns while it flowed (its skew says by how
    // much); the next one has nothing in flight, and no skew.
    let deadline = Instant::now() + Duration::from_secs(30) * common::slowdown();
    let body = loop {
        let body = scrape_ok();
        let consumed = sample(&body, "tap_probe_consumed_total", Some("tpck0"));
        let kernel = sample(&body, "tap_probe_kernel_tx_packets_total", Some("tpck0"));
        let skew = sample(&body, "tap_probe_kernel_skew_packets", Some("tpck0"));
        if consumed == Some(read_f) && skew == Some(0.0) {
            break body;
        }
        assert!(
            Instant::now() < deadline,
            "the survivor's counts never settled at the {read} frames read: consumed \
             {consumed:?}, kernel {kernel:?}, skew {skew:?}"
        );
        std::thread::sleep(Duration::from_millis(200));
    };
    let mut checks = common::Checks::new();
    for (family, oracle, expected, what) in [
        (
            "tap_probe_xmit_calls_total",
            common::Oracle::Sender,
            sent_f,
            "every frame sent",
        ),
        (
            "tap_probe_enqueued_total",
            common::Oracle::Reader,
            read_f,
            "every frame read",
        ),
        (
            "tap_probe_kernel_tx_packets_total",
            common::Oracle::Reader,
            read_f,
            "every frame read",
        ),
        (
            "tap_probe_dropped_full_ring_total",
            common::Oracle::Sender,
            sent_f - read_f,
            "every frame sent and not read",
        ),
        (
            "tap_probe_kernel_tx_dropped_total",
            common::Oracle::Sender,
            sent_f - read_f,
            "every frame sent and not read",
        ),
    ] {
        checks.eq(
            &common::Gate::none(),
            oracle,
            sample(&body, family, Some("tpck0")),
            Some(expected),
            format!("{family}, {what}"),
        );
    }
    body
}

#[test]
fn watch_survives_churn_beyond_its_tables_and_stays_exact() {
    if !tap_probe_verdict::root() {
        return;
    }
    raise_open_files();
    let keep = common::quiet_netns("chk").unwrap();
    let survivor = common::tap_in(&keep, "tpck0", RootQdisc::Noqueue).unwrap();
    let (mut guard, addr, log) = start_watch(&format!("tp-ch*-{}-*", std::process::id()));
    let scrape_ok = || {
        let (status, body) = scrape(&addr);
        assert_eq!(status, "HTTP/1.1 200 OK", "{body}");
        body
    };
    // The survivor is tracked before the churn begins.
    let deadline = Instant::now() + Duration::from_secs(30) * common::slowdown();
    while sample(&scrape_ok(), "tap_probe_consumed_total", Some("tpck0")).is_none() {
        assert!(Instant::now() < deadline, "the survivor was never tracked");
        std::thread::sleep(Duration::from_millis(100));
    }
    let most_untracked = churn(&scrape_ok);
    assert!(
        most_untracked > 0.0,
        "the churn never filled the probe's tables: this run proves nothing"
    );

    let body = survivor_counted_exactly(&keep, &survivor, &scrape_ok);
    assert_eq!(
        sample(&body, "tap_probe_untracked_devices", None),
        Some(0.0)
    );

    let child = guard.0.take().unwrap();
    let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
    let out = child.wait_with_output().unwrap();
    let log = log.join().unwrap();
    assert!(
        common::stopped_by(out.status, nix::sys::signal::Signal::SIGTERM),
        "watch stops in order on SIGTERM:\n{log}"
    );
    assert!(
        log.contains("not tracking"),
        "watch says which devices it does not count:\n{log}"
    );
    drop(survivor);
    drop(keep);
}
