//! The metrics endpoint as it goes onto a network: TLS and basic auth from a web config file
//! in the Prometheus exporter toolkit's format, scraped by a real Prometheus server (Debian's
//! package, on loopback) with the `scrape_configs` docs/service.md shows, the certificates
//! made here. Over TLS with basic auth it stores the same series as over plain HTTP, each
//! holding the frames the kernel counted; a wrong password, plain HTTP to the TLS port, a
//! missing or foreign client certificate get no series. The file is read again when it
//! changes. The limits hold: a request head too large gets 431, a method other than GET and
//! HEAD 405, keep-alive keeps one connection, and a thousand idle connections with fifty
//! clients sending a byte a second neither fail a scrape nor grow the server past 100 MB.

use std::collections::{BTreeMap, BTreeSet};
use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant, SystemTime};

use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::BIN;
use crate::common::oracle::{Checks, Gate, Oracle};
use crate::common::prometheus::{PROMETHEUS, Prometheus, SCRAPE, Series, Target};
use crate::common::service::{self, Service};
use crate::common::web::{self, PASSWORD, Pki, USER};

const FRAMES: u32 = 500;
/// The families whose samples count the test's frames, each its kernel's figure.
const COUNTED: &[&str] = &[
    "tap_probe_xmit_calls_total",
    "tap_probe_enqueued_total",
    "tap_probe_consumed_total",
    "tap_probe_kernel_tx_packets_total",
];

/// Whether the test can run here: as root (`serve` attaches), with Prometheus installed.
fn can_run() -> bool {
    if !tap_probe_verdict::root() {
        return false;
    }
    if !common::prometheus::installed() {
        Skip::test(format!(
            "no {PROMETHEUS} here (Debian's prometheus package; cargo xtask \
             setup installs it)"
        ))
        .print();
        return false;
    }
    true
}

/// `serve` over the namespace `ns`, refreshing every 0.2 s, with `extra` arguments; with the
/// programs it loaded.
fn serve(ns: &str, extra: &[&str]) -> (Service, BTreeSet<u32>) {
    let binary: PathBuf = std::fs::canonicalize(BIN).unwrap();
    let mut args = vec!["--interval", "0.2", "--netns", ns];
    args.extend(extra);
    Service::tracepoints(&binary, &args)
}

fn web_config(path: &Path) -> [&str; 2] {
    ["--web.config.file", path.to_str().unwrap()]
}

/// A scrape job of `target`, as docs/service.md writes them: `extra` lines indented under it.
fn job(name: &str, target: &str, extra: &[String]) -> String {
    let mut text =
        format!("  - job_name: {name}\n    static_configs: [{{targets: [\"{target}\"]}}]\n");
    for line in extra {
        let _ = writeln!(text, "    {line}");
    }
    text
}

/// `scheme: https` with the test's CA, and as `identity` (`client`, `stranger`) where given.
fn https(pki: &Pki, identity: Option<&str>) -> Vec<String> {
    let mut tls = format!("tls_config: {{ca_file: {}", pki.path("ca.crt").display());
    if let Some(name) = identity {
        let _ = write!(
            tls,
            ", cert_file: {}, key_file: {}",
            pki.path(&format!("{name}.crt")).display(),
            pki.path(&format!("{name}.key")).display()
        );
    }
    tls.push('}');
    vec!["scheme: https".to_owned(), tls]
}

/// `basic_auth` as the test's user, its password read from `file`.
fn basic_auth(pki: &Pki, file: &str) -> String {
    format!(
        "basic_auth: {{username: {USER}, password_file: {}}}",
        pki.path(file).display()
    )
}

fn now() -> f64 {
    SystemTime::now()
        .duration_since(SystemTime::UNIX_EPOCH)
        .unwrap()
        .as_secs_f64()
}

/// Waits (bounded) until every target was scraped at least once since `after` (Unix s).
fn scraped(prometheus: &Prometheus, jobs: usize, after: f64) -> Vec<Target> {
    let deadline = Instant::now() + Duration::from_mins(1) * common::slowdown();
    loop {
        let targets = prometheus.targets();
        let seen = prometheus
            .query(&format!("timestamp(up) > {after}"), now())
            .len();
        if targets.len() == jobs && seen == jobs {
            return targets;
        }
        assert!(
            Instant::now() < deadline,
            "prometheus never scraped every target: {targets:?}"
        );
        std::thread::sleep(Duration::from_millis(250));
    }
}

/// The series of the namespace `ns` a job stored, by their labels but the job's and the
/// instance's.
fn series_of(prometheus: &Prometheus, job: &str, ns: &str) -> BTreeMap<String, f64> {
    prometheus
        .query(&format!("{{job=\"{job}\",netns=\"{ns}\"}}"), now())
        .into_iter()
        .map(|Series { mut labels, value }| {
            labels.remove("job");
            labels.remove("instance");
            (format!("{labels:?}"), value)
        })
        .collect()
}

/// The client ports of the established TCP connections to `port` on loopback.
fn clients_of(port: u16) -> BTreeSet<u16> {
    let table = std::fs::read_to_string("/proc/net/tcp").unwrap();
    table
        .lines()
        .skip(1)
        .filter_map(|line| {
            let fields: Vec<&str> = line.split_whitespace().collect();
            let port_of = |addr: &str| u16::from_str_radix(addr.split(':').nth(1)?, 16).ok();
            // 01: ESTABLISHED; the client's end has the server's port as its remote one.
            (fields.get(3) == Some(&"01") && port_of(fields[2]) == Some(port))
                .then(|| port_of(fields[1]))
                .flatten()
        })
        .collect()
}

fn port(addr: &str) -> u16 {
    addr.rsplit(':').next().unwrap().parse().unwrap()
}

/// The gate of a serve's counts: exact where the kernel skipped none of its programs' runs.
fn gate_of(loaded: &BTreeSet<u32>) -> Gate {
    Gate::of_programs(Backend::Tracepoint, service::kernel_misses(loaded))
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one Prometheus, every way to scrape, in order"
)]
fn prometheus_gets_the_same_series_over_tls_with_basic_auth_and_none_without_them() {
    if !can_run() {
        return;
    }
    let pki = Pki::new();
    let ns = common::quiet_netns("web").unwrap();
    let tap = common::tap_in(&ns, "tpw0", RootQdisc::PfifoFast).unwrap();
    let (plain, plain_programs) = serve(ns.name(), &[]);
    let secured = pki.web_config("secured.yml", false, true);
    let (tls, tls_programs) = serve(ns.name(), &web_config(&secured));
    let clients = pki.web_config("clients.yml", true, false);
    let (mtls, mtls_programs) = serve(ns.name(), &web_config(&clients));
    assert!(
        tls.stderr()
            .iter()
            .any(|l| l.contains("serving metrics on https://")
                && l.contains("with TLS, basic auth for 1 user")),
        "{:?}",
        tls.stderr()
    );

    let mut jobs = String::new();
    jobs.push_str(&job("plain", &plain.addr, &[]));
    let mut secured_job = https(&pki, None);
    secured_job.push(basic_auth(&pki, "password"));
    jobs.push_str(&job("tls", &tls.addr, &secured_job));
    let mut wrong = https(&pki, None);
    wrong.push(basic_auth(&pki, "wrong-password"));
    jobs.push_str(&job("wrong-password", &tls.addr, &wrong));
    // Plain HTTP to a TLS port: the client-certificate one, so that the TLS port with
    // basic auth sees only the two jobs whose connections it keeps.
    jobs.push_str(&job("http-to-tls", &mtls.addr, &[]));
    jobs.push_str(&job("no-client-cert", &mtls.addr, &https(&pki, None)));
    jobs.push_str(&job(
        "client-cert",
        &mtls.addr,
        &https(&pki, Some("client")),
    ));
    jobs.push_str(&job(
        "foreign-client-cert",
        &mtls.addr,
        &https(&pki, Some("stranger")),
    ));
    let prometheus = Prometheus::with_jobs(&jobs);
    let started = now();
    scraped(&prometheus, 7, started);

    let driven = common::paced_and_read(ns.path(), &tap, FRAMES.into());
    assert_eq!(driven.read[0].packets, u64::from(FRAMES), "{driven:?}");
    let traffic_done = now();
    // Every job scraped after the last refresh that could still miss a frame.
    scraped(&prometheus, 7, traffic_done + 1.0);
    let deadline = Instant::now() + Duration::from_secs(30) * common::slowdown();
    let (by_plain, by_tls, by_client_cert) = loop {
        let stored = (
            series_of(&prometheus, "plain", ns.name()),
            series_of(&prometheus, "tls", ns.name()),
            series_of(&prometheus, "client-cert", ns.name()),
        );
        let consumed = |series: &BTreeMap<String, f64>| {
            series
                .iter()
                .find(|(labels, _)| labels.contains("\"tap_probe_consumed_total\""))
                .map(|(_, value)| *value)
        };
        let all = [&stored.0, &stored.1, &stored.2]
            .iter()
            .all(|s| consumed(s) == Some(f64::from(FRAMES)));
        if all || Instant::now() > deadline {
            break stored;
        }
        std::thread::sleep(Duration::from_millis(250));
    };

    // The same series, whichever way they came; the frames each serve counted, exactly.
    let names = |series: &BTreeMap<String, f64>| series.keys().cloned().collect::<BTreeSet<_>>();
    // A device's default series: one per family that has a value for it.
    assert!(
        by_plain.len() >= 15,
        "the tap's series, over plain HTTP: {by_plain:?}"
    );
    assert_eq!(
        names(&by_plain),
        names(&by_tls),
        "the same series over TLS with basic auth"
    );
    assert_eq!(
        names(&by_plain),
        names(&by_client_cert),
        "the same series over TLS with a client certificate"
    );
    let mut checks = Checks::new();
    for (job, series, programs) in [
        ("plain", &by_plain, &plain_programs),
        ("tls", &by_tls, &tls_programs),
        ("client-cert", &by_client_cert, &mtls_programs),
    ] {
        let gate = gate_of(programs);
        for family in COUNTED {
            let value = series
                .iter()
                .find(|(labels, _)| labels.contains(&format!("\"{family}\"")))
                .map(|(_, value)| *value);
            checks.eq(
                &gate,
                Oracle::Reader,
                value,
                Some(f64::from(FRAMES)),
                format!("{job}: {family}, every frame read"),
            );
        }
    }

    // Refused: no series at all, and why, as Prometheus saw it.
    let targets: BTreeMap<String, Target> = prometheus
        .targets()
        .into_iter()
        .map(|t| (t.job.clone(), t))
        .collect();
    for (job, why) in [
        ("wrong-password", "401 Unauthorized"),
        ("http-to-tls", "400 Bad Request"),
        ("no-client-cert", "certificate required"),
        // Go's client sends no certificate the server's CA list does not name; rustls
        // refuses one it does send.
        (
            "foreign-client-cert",
            "certificate required|unknown certificate authority",
        ),
    ] {
        let target = &targets[job];
        assert_eq!(target.health, "down", "{target:?}");
        assert!(
            why.split('|').any(|why| target.error.contains(why)),
            "{job}: {why} in {target:?}"
        );
        let stored = prometheus.query(
            &format!("count({{job=\"{job}\",__name__=~\"tap_probe_.*\"}})"),
            now(),
        );
        assert!(stored.is_empty(), "{job} stored series: {stored:?}");
    }
    for job in ["plain", "tls", "client-cert"] {
        assert_eq!(targets[job].health, "up", "{:?}", targets[job]);
    }

    // Keep-alive: Prometheus scrapes the TLS port with basic auth over the same connection,
    // scrape after scrape (the job refused with 401 may connect anew each time: Go's client
    // closes a connection whose error response it did not read).
    let before = clients_of(port(&tls.addr));
    std::thread::sleep(Duration::from_secs_f64(4.0 * SCRAPE));
    let after = clients_of(port(&tls.addr));
    assert!(
        !before.is_disjoint(&after),
        "a connection kept four scrapes long: {before:?}, then {after:?}"
    );

    // The same as a client sees it.
    let response = web::https(
        &tls.addr,
        pki.client(None),
        &web::get("/metrics", Some((USER, "not the password")), true),
    )
    .unwrap();
    assert_eq!(response.status, 401, "{response:?}");
    assert!(
        response.head.contains("www-authenticate: Basic"),
        "{}",
        response.head
    );
    assert!(!response.body.contains("tap_probe_"), "{}", response.body);
    let response = web::plain(
        &tls.addr,
        &web::get("/metrics", Some((USER, PASSWORD)), true),
    )
    .unwrap();
    assert_eq!(response.status, 400, "{response:?}");
    assert!(
        response.body.contains("this port speaks TLS"),
        "{}",
        response.body
    );
    let response = web::https(
        &tls.addr,
        pki.client(None),
        &web::get("/metrics", Some((USER, PASSWORD)), true),
    )
    .unwrap();
    assert_eq!(response.status, 200, "{response:?}");
    assert!(response.body.contains("tap_probe_consumed_total{"));

    drop(prometheus);
    for service in [plain, tls, mtls] {
        let (status, stderr, _) = service.terminate();
        assert!(status.success(), "{}", stderr.join("\n"));
    }
    drop(tap);
}

/// A password, a certificate or the file itself changed: the next request or connection
/// gets what the files say now, without a restart; a file made unusable refuses everything
/// until it is fixed.
#[test]
fn the_web_config_is_read_again_when_it_changes() {
    if !can_run() {
        return;
    }
    let pki = Pki::new();
    let ns = common::quiet_netns("webre").unwrap();
    let config = pki.web_config("web.yml", false, true);
    let (service, _) = serve(ns.name(), &web_config(&config));
    let request = |password: &str| {
        web::https(
            &service.addr,
            pki.client(None),
            &web::get("/healthz", Some((USER, password)), true),
        )
        .map(|response| response.status)
    };
    assert_eq!(request(PASSWORD).unwrap(), 200);

    // A new password: the old one is refused from the next request on.
    let tls = "tls_server_config:\n  cert_file: tls.crt\n  key_file: tls.key\n";
    pki.write("web.yml", &format!("{tls}{}", web::users("new password")));
    assert_eq!(request(PASSWORD).unwrap(), 401);
    assert_eq!(request("new password").unwrap(), 200);

    // The certificate renewed at the same paths: the next handshake presents the new one.
    let renewed = std::fs::read(pki.path("renewed.crt")).unwrap();
    pki.write("tls.crt", &String::from_utf8(renewed.clone()).unwrap());
    pki.write(
        "tls.key",
        &std::fs::read_to_string(pki.path("renewed.key")).unwrap(),
    );
    let stream = web::tls(&service.addr, pki.client(None)).unwrap();
    let presented = stream.conn.peer_certificates().unwrap()[0].to_vec();
    let expected: Vec<u8> = {
        use tokio_rustls::rustls::pki_types::{CertificateDer, pem::PemObject as _};
        CertificateDer::from_pem_slice(&renewed).unwrap().to_vec()
    };
    assert_eq!(presented, expected, "the renewed certificate");
    drop(stream);

    // Unusable: every handshake fails until it is fixed, and the log says why.
    pki.write(
        "web.yml",
        &format!("{tls}basic_auth_users:\n  {USER}: plain\n"),
    );
    assert!(
        request("new password").is_err(),
        "no handshake with an unusable file"
    );
    pki.write("web.yml", &format!("{tls}{}", web::users(PASSWORD)));
    assert_eq!(request(PASSWORD).unwrap(), 200);

    let (status, stderr, _) = service.terminate();
    assert!(status.success(), "{}", stderr.join("\n"));
    let said: Vec<&String> = stderr
        .iter()
        .filter(|l| l.contains("basic_auth_users.prometheus: not a bcrypt hash"))
        .collect();
    assert_eq!(said.len(), 1, "once per change: {stderr:?}");
    assert!(said[0].starts_with("<3>"), "an error: {said:?}");
}

/// Limits that need no load to see: a request head over 8 KiB gets 431 and its connection
/// closed; methods but GET and HEAD get 405 with `Allow`; HEAD gets the head alone;
/// requests on one connection are answered one after another (keep-alive); a head sent a
/// byte a second is cut off at the head timeout.
#[test]
fn request_limits_and_keep_alive() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("weblim").unwrap();
    let (service, _) = serve(ns.name(), &[]);
    let addr = service.addr.clone();

    // 8 KiB, all of it read, and no end of the head in sight. (Bytes sent beyond what the
    // server reads would make its close a reset, which may overtake the 431.)
    let mut stream = web::connect(&addr);
    let mut huge = "GET /metrics HTTP/1.1\r\nHost: x\r\nX-Filler: ".to_owned();
    huge.push_str(&"a".repeat(8 * 1024 - huge.len()));
    stream.write_all(huge.as_bytes()).unwrap();
    let response = web::read_response(&mut stream).unwrap();
    assert_eq!(response.status, 431, "{response:?}");
    assert!(web::closed(&mut stream), "closed after the 431");

    for method in ["POST", "PUT", "DELETE", "OPTIONS", "PATCH"] {
        let response = web::plain(
            &addr,
            &format!("{method} /metrics HTTP/1.1\r\nHost: x\r\nConnection: close\r\n\r\n"),
        )
        .unwrap();
        assert_eq!(response.status, 405, "{method}: {response:?}");
        assert!(
            response.head.contains("allow: GET, HEAD"),
            "{}",
            response.head
        );
    }

    // Keep-alive: three requests, one connection, each answered.
    let mut stream = web::connect(&addr);
    for path in ["/metrics", "/healthz", "/metrics"] {
        stream
            .write_all(web::get(path, None, false).as_bytes())
            .unwrap();
        let response = web::read_response(&mut stream).unwrap();
        assert!(
            [200, 503].contains(&response.status),
            "{path}: {response:?}"
        );
    }
    stream
        .write_all(b"HEAD /metrics HTTP/1.1\r\nHost: x\r\n\r\n")
        .unwrap();
    let mut head = Vec::new();
    let mut byte = [0u8; 1];
    while !head.ends_with(b"\r\n\r\n") {
        assert_eq!(stream.read(&mut byte).unwrap(), 1);
        head.push(byte[0]);
    }
    let head = String::from_utf8(head).unwrap();
    assert!(head.starts_with("HTTP/1.1 200 OK\r\n"), "{head}");
    // No body follows the head: the next request's answer is the next thing on the wire.
    stream
        .write_all(web::get("/nowhere", None, true).as_bytes())
        .unwrap();
    let response = web::read_response(&mut stream).unwrap();
    assert_eq!(response.status, 404, "{response:?}");

    // A byte a second: closed at the head timeout, with nothing answered.
    let mut slow = web::connect(&addr);
    slow.set_read_timeout(Some(Duration::from_millis(50)))
        .unwrap();
    let started = Instant::now();
    let head = b"GET /metrics HTTP/1.1\r\nHost: 127.0.0.1\r\nUser-Agent: slow\r\n\r\n";
    let mut sent: usize = 0;
    let closed_after = loop {
        let mut buf = [0u8; 64];
        match slow.read(&mut buf) {
            Ok(0) => break started.elapsed(),
            Ok(n) => panic!("answered a head never completed: {:?}", &buf[..n]),
            Err(err) if err.kind() == std::io::ErrorKind::WouldBlock => {}
            Err(err) => {
                assert_eq!(err.kind(), std::io::ErrorKind::ConnectionReset, "{err}");
                break started.elapsed();
            }
        }
        if started.elapsed().as_secs() >= sent as u64 && sent < head.len() {
            if slow.write_all(&head[sent..=sent]).is_err() {
                break started.elapsed();
            }
            sent += 1;
        }
        assert!(
            started.elapsed() < Duration::from_secs(30),
            "a slow head was never cut off"
        );
    };
    assert!(
        closed_after >= Duration::from_secs(9) && sent < head.len(),
        "cut off after {closed_after:?}, {sent} bytes sent"
    );
    println!("a head sent a byte a second was cut off after {closed_after:.1?}");

    let (status, stderr, _) = service.terminate();
    assert!(status.success(), "{}", stderr.join("\n"));
}

/// What the clients of the starvation test did.
#[derive(Debug, Default)]
struct Attack {
    /// Idle connections open at once, at most, as the clients counted them.
    idle_open_max: usize,
    /// Idle connections the server closed (each connected again).
    idle_closed: usize,
    /// Slow heads the server cut off (each started again).
    slow_cut: usize,
    /// Bytes of request heads the slow clients sent.
    slow_bytes: usize,
}

/// Runs the starvation test's clients against `addr` until `deadline`: `idle` that connect
/// and send nothing, `slow` that finish a TLS handshake as `client` and then send a request
/// head a byte a second; each connects again 100 ms after the server closed it.
fn attack(
    addr: &str,
    client: std::sync::Arc<tokio_rustls::rustls::ClientConfig>,
    idle: usize,
    slow: usize,
    deadline: Instant,
) -> Attack {
    use std::sync::Arc;
    use std::sync::atomic::{AtomicUsize, Ordering};
    use tokio::io::{AsyncReadExt as _, AsyncWriteExt as _};

    #[derive(Default)]
    struct Counts {
        open: AtomicUsize,
        open_max: AtomicUsize,
        closed: AtomicUsize,
        cut: AtomicUsize,
        bytes: AtomicUsize,
    }
    let counts = Arc::new(Counts::default());
    let deadline = tokio::time::Instant::from_std(deadline);
    let runtime = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()
        .unwrap();
    runtime.block_on(async {
        let mut tasks = Vec::new();
        for _ in 0..idle {
            let (addr, counts) = (addr.to_owned(), Arc::clone(&counts));
            tasks.push(tokio::spawn(async move {
                while tokio::time::Instant::now() < deadline {
                    if let Ok(mut stream) = tokio::net::TcpStream::connect(&addr).await {
                        let open = counts.open.fetch_add(1, Ordering::Relaxed) + 1;
                        counts.open_max.fetch_max(open, Ordering::Relaxed);
                        let ended =
                            tokio::time::timeout_at(deadline, stream.read(&mut [0u8; 64])).await;
                        counts.open.fetch_sub(1, Ordering::Relaxed);
                        if ended.is_ok() {
                            counts.closed.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        let connector = tokio_rustls::TlsConnector::from(client);
        let head = web::get("/metrics", Some((USER, PASSWORD)), false);
        for _ in 0..slow {
            let (addr, counts) = (addr.to_owned(), Arc::clone(&counts));
            let (connector, head) = (connector.clone(), head.clone());
            tasks.push(tokio::spawn(async move {
                let name = tokio_rustls::rustls::pki_types::ServerName::IpAddress(
                    std::net::Ipv4Addr::LOCALHOST.into(),
                );
                while tokio::time::Instant::now() < deadline {
                    let Ok(tcp) = tokio::net::TcpStream::connect(&addr).await else {
                        continue;
                    };
                    if let Ok(mut tls) = connector.connect(name.clone(), tcp).await {
                        for byte in head.as_bytes() {
                            let sent = tls.write_all(&[*byte]).await.and(tls.flush().await);
                            if sent.is_err() || tokio::time::Instant::now() >= deadline {
                                break;
                            }
                            counts.bytes.fetch_add(1, Ordering::Relaxed);
                            // A second between bytes, or the server's close, which comes
                            // as a read's end.
                            if let Ok(Ok(_)) = tokio::time::timeout(
                                Duration::from_secs(1),
                                tls.read(&mut [0u8; 64]),
                            )
                            .await
                            {
                                break;
                            }
                        }
                        if tokio::time::Instant::now() < deadline {
                            counts.cut.fetch_add(1, Ordering::Relaxed);
                        }
                    }
                    tokio::time::sleep(Duration::from_millis(100)).await;
                }
            }));
        }
        for task in tasks {
            task.await.unwrap();
        }
    });
    Attack {
        idle_open_max: counts.open_max.load(Ordering::Relaxed),
        idle_closed: counts.closed.load(Ordering::Relaxed),
        slow_cut: counts.cut.load(Ordering::Relaxed),
        slow_bytes: counts.bytes.load(Ordering::Relaxed),
    }
}

/// A thousand clients that connect and send nothing and fifty that send their request head
/// a byte a second (after a TLS handshake), each connecting again as soon as it is closed,
/// for 40 s: every scrape Prometheus makes meanwhile (TLS and basic auth, one a second, a
/// second to answer) succeeds, and `serve` stays within 100 MB resident.
#[test]
fn idle_and_slow_clients_starve_no_scrape() {
    const IDLE: usize = 1_000;
    const SLOW: usize = 50;
    const ATTACK: Duration = Duration::from_secs(40);
    const RESIDENT: u64 = 100 * 1024 * 1024;
    if !can_run() {
        return;
    }
    // The clients' sockets, besides the test's own files.
    let (_, hard) =
        nix::sys::resource::getrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE).unwrap();
    let wanted = (IDLE + SLOW) as u64 + 1024;
    assert!(
        hard >= wanted,
        "the test needs {wanted} open files; the hard limit is {hard}"
    );
    nix::sys::resource::setrlimit(nix::sys::resource::Resource::RLIMIT_NOFILE, wanted, hard)
        .unwrap();

    let pki = Pki::new();
    let ns = common::quiet_netns("webstarve").unwrap();
    let _tap = common::tap_in(&ns, "tps0", RootQdisc::PfifoFast).unwrap();
    let config = pki.web_config("web.yml", false, true);
    let (service, _) = serve(ns.name(), &web_config(&config));
    let pid = service.pid();
    let mut secured = https(&pki, None);
    secured.push(basic_auth(&pki, "password"));
    let prometheus = Prometheus::with_jobs(&job("web", &service.addr, &secured));
    scraped(&prometheus, 1, now());
    let (before, _) = web::resident(pid);

    let started = now();
    let deadline = Instant::now() + ATTACK;
    let addr = service.addr.clone();
    let client = pki.client(None);
    let clients = std::thread::spawn(move || attack(&addr, client, IDLE, SLOW, deadline));
    // From a quarter of the way to half-way, once a second: the most sockets the server
    // held at once, as the clients count the most they held open. One reading may fall
    // where many are between a close and their next connection (a client waits 100 ms,
    // longer on a loaded machine), or where the server is making room.
    std::thread::sleep(ATTACK / 4);
    let mut held = 0;
    for _ in 0..ATTACK.as_secs() / 4 {
        held = held.max(web::sockets(pid));
        std::thread::sleep(Duration::from_secs(1));
    }
    let (during, _) = web::resident(pid);
    let attack = clients.join().unwrap();
    let ended = now();
    // Its peak since it started, the attach included.
    let (_, peak) = web::resident(pid);

    // Every scrape of the attack's last 35 s (its first seconds fill the server up).
    let window = (ended - started - 5.0).floor();
    let at = ended;
    let value = |expr: &str| -> f64 {
        let result = prometheus.query(expr, at);
        assert_eq!(result.len(), 1, "{expr}: {result:?}");
        result[0].value
    };
    let scrapes = value(&format!("count_over_time(up{{job=\"web\"}}[{window}s])"));
    let failed = value(&format!(
        "count_over_time(up{{job=\"web\"}}[{window}s]) - sum_over_time(up{{job=\"web\"}}[{window}s])"
    ));
    let slowest = value(&format!(
        "max_over_time(scrape_duration_seconds{{job=\"web\"}}[{window}s])"
    ));
    #[expect(clippy::cast_precision_loss, reason = "megabytes to show")]
    let mb = |bytes: u64| bytes as f64 / 1_048_576.0;
    println!(
        "under {IDLE} idle and {SLOW} slow clients for {ATTACK:?}: {scrapes} scrapes in the \
         last {window} s, {failed} failed, the slowest {:.0} ms; serve held {held} sockets \
         at most and {:.1} MB resident half-way ({:.1} MB before the clients), its peak {:.1} MB; \
         the clients: {attack:?}",
        slowest * 1e3,
        mb(during),
        mb(before),
        mb(peak),
    );
    assert!(
        attack.idle_open_max >= IDLE * 9 / 10 && held >= IDLE * 9 / 10,
        "the idle clients were held open: {attack:?}, serve held {held} sockets"
    );
    assert!(
        attack.idle_closed >= IDLE,
        "the server closed idle connections (their head timed out, or made room): {attack:?}"
    );
    assert!(
        attack.slow_cut >= SLOW && attack.slow_bytes > SLOW * 5,
        "the slow clients sent heads and were cut off: {attack:?}"
    );
    assert!(
        scrapes >= window / SCRAPE - 2.0,
        "Prometheus scraped {scrapes} times in {window} s"
    );
    assert!(failed < 0.5, "every scrape succeeded: {failed} failed");
    assert!(slowest < SCRAPE, "within the scrape timeout: {slowest} s");
    assert!(
        during <= RESIDENT && peak <= RESIDENT,
        "serve's resident memory is above 100 MB: {during} bytes under the clients, {peak} at \
         its peak"
    );

    drop(prometheus);
    let (status, stderr, _) = service.terminate();
    assert!(status.success(), "{}", stderr.join("\n"));
}
