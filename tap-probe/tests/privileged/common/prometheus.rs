//! A Prometheus server of the test's own (Debian's package, on loopback, with the
//! repository's alert rules loaded) that scrapes a `tap-probe` exporter, and its query API.

use std::collections::BTreeMap;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use serde_json::Value;

use super::service::http_get;

/// The alert rules the server evaluates.
pub(crate) const RULES: &str = include_str!("../../../../deploy/prometheus/tap-probe-rules.yml");
/// Debian's package installs the server as this.
pub(crate) const PROMETHEUS: &str = "prometheus";
/// Seconds between the server's scrapes, and its rule evaluations.
pub(crate) const SCRAPE: f64 = 1.0;

/// Whether the server is installed here (`cargo xtask setup` installs it).
pub(crate) fn installed() -> bool {
    Command::new(PROMETHEUS).arg("--version").output().is_ok()
}

/// One series of a query's result.
#[derive(Debug, Clone)]
pub(crate) struct Series {
    pub(crate) labels: BTreeMap<String, String>,
    pub(crate) value: f64,
}

impl Series {
    /// Whether it is a series of the device `name` in the namespace `netns`.
    pub(crate) fn of(&self, netns: &str, name: &str) -> bool {
        self.labels.get("netns").map(String::as_str) == Some(netns)
            && self.labels.get("device").map(String::as_str) == Some(name)
    }
}

/// The kernel's count of skipped runs of an exporter's programs (their `recursion_misses`),
/// read around what Prometheus stored of it: `TapProbeCountsShort` fires on an increase of
/// the exported count within its window, whose first sample held at most `first` (read once
/// the first samples were stored) and whose last held from `last.0` (read before the last
/// sample's refresh) to `last.1` (read after the last sample).
#[derive(Clone, Copy, Debug)]
pub(crate) struct Misses {
    pub(crate) first: u64,
    pub(crate) last: (u64, u64),
}

impl Misses {
    /// Whether `TapProbeCountsShort` must fire (`Some(true)`), must not (`Some(false)`), or
    /// may go either way (`None`): the kernel skipped runs only while its window's first or
    /// last sample was taken.
    pub(crate) fn short_fires(self) -> Option<bool> {
        if self.last.0 > self.first {
            Some(true)
        } else if self.last.1 == 0 {
            Some(false)
        } else {
            None
        }
    }

    /// Why the alert's check is gated off, when it is.
    pub(crate) fn uncertain(self) -> Option<&'static str> {
        self.short_fires().is_none().then_some(
            "the kernel skipped runs of the programs only while Prometheus took the samples \
             the alert compares",
        )
    }
}

/// A scrape target as the server last saw it.
#[derive(Debug, Clone)]
pub(crate) struct Target {
    pub(crate) job: String,
    /// `up`, `down` or `unknown` (not scraped yet).
    pub(crate) health: String,
    /// Why its last scrape failed; empty when it did not.
    pub(crate) error: String,
}

/// A Prometheus server on loopback (a free port of its own, its storage in `dir`), stopped
/// on drop.
pub(crate) struct Prometheus {
    child: Child,
    pub(crate) addr: String,
    dir: tempfile::TempDir,
}

impl Prometheus {
    /// Starts one that scrapes `target` every second and evaluates `RULES`.
    pub(crate) fn start(target: &str) -> Self {
        Self::with_jobs(&format!(
            "  - job_name: tap-probe\n    static_configs: [{{targets: [\"{target}\"]}}]\n"
        ))
    }

    /// Starts one with the scrape jobs `jobs` (the list under `scrape_configs:`, as YAML),
    /// each scraped every second (timing out after as long), that evaluates `RULES`.
    pub(crate) fn with_jobs(jobs: &str) -> Self {
        let dir = tempfile::tempdir().unwrap();
        let rules = dir.path().join("rules.yml");
        std::fs::write(&rules, RULES).unwrap();
        let config = dir.path().join("prometheus.yml");
        std::fs::write(
            &config,
            format!(
                "global: {{scrape_interval: {SCRAPE}s, evaluation_interval: {SCRAPE}s}}\n\
                 rule_files: [\"{}\"]\n\
                 scrape_configs:\n{jobs}",
                rules.display()
            ),
        )
        .unwrap();
        // A free port: Prometheus does not say which one it took for port 0.
        let addr = std::net::TcpListener::bind("127.0.0.1:0")
            .unwrap()
            .local_addr()
            .unwrap()
            .to_string();
        let child = Command::new(PROMETHEUS)
            .arg(format!("--config.file={}", config.display()))
            .arg(format!(
                "--storage.tsdb.path={}",
                dir.path().join("data").display()
            ))
            .arg(format!("--web.listen-address={addr}"))
            .arg("--log.level=warn")
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .spawn()
            .expect("prometheus starts");
        let mut server = Self { child, addr, dir };
        // Its start reads and compiles the rules: seconds, ten times that under emulation.
        let deadline = Instant::now() + Duration::from_secs(30) * super::slowdown();
        while std::net::TcpStream::connect(&server.addr).is_err()
            || http_get(&server.addr, "/-/ready").0 != "HTTP/1.0 200 OK"
        {
            // One that cannot bind its port (taken since it was picked) exits at once.
            if let Some(status) = server.child.try_wait().unwrap() {
                panic!("prometheus exited before it was ready: {status}");
            }
            assert!(Instant::now() < deadline, "prometheus never became ready");
            std::thread::sleep(Duration::from_millis(100));
        }
        // The server answering is this one, not a system-wide one (Debian's package
        // enables prometheus.service on :9090 where systemd runs): its storage is ours.
        let flags = server.api("/api/v1/status/flags");
        assert_eq!(
            flags["storage.tsdb.path"].as_str(),
            Some(server.dir.path().join("data").to_str().unwrap()),
            "another Prometheus answers on {}",
            server.addr
        );
        server
    }

    /// Each scrape target's job and its last scrape's health and error.
    pub(crate) fn targets(&self) -> Vec<Target> {
        self.api("/api/v1/targets?state=active")["activeTargets"]
            .as_array()
            .unwrap()
            .iter()
            .map(|t| Target {
                job: t["labels"]["job"].as_str().unwrap().to_owned(),
                health: t["health"].as_str().unwrap().to_owned(),
                error: t["lastError"].as_str().unwrap_or_default().to_owned(),
            })
            .collect()
    }

    pub(crate) fn api(&self, path: &str) -> Value {
        let (status, body) = http_get(&self.addr, path);
        let json: Value = serde_json::from_str(&body)
            .unwrap_or_else(|err| panic!("{path}: {status}: {err}: {body}"));
        assert_eq!(json["status"], "success", "{path}: {body}");
        json["data"].clone()
    }

    /// The instant vector `expr` evaluates to at `time` (Unix seconds).
    pub(crate) fn query(&self, expr: &str, time: f64) -> Vec<Series> {
        let data = self.api(&format!(
            "/api/v1/query?query={}&time={time:.3}",
            encode(expr)
        ));
        assert_eq!(data["resultType"], "vector", "{expr}: {data}");
        data["result"]
            .as_array()
            .unwrap()
            .iter()
            .map(|s| Series {
                labels: serde_json::from_value(s["metric"].clone()).unwrap(),
                value: s["value"][1].as_str().unwrap().parse().unwrap(),
            })
            .collect()
    }
}

impl Drop for Prometheus {
    fn drop(&mut self) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.child.id()).unwrap());
        let _ = nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM);
        let deadline = Instant::now() + Duration::from_secs(10);
        while self.child.try_wait().ok().flatten().is_none() {
            if Instant::now() > deadline {
                let _ = self.child.kill();
                let _ = self.child.wait();
                return;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }
}

/// A query string's bytes, percent-encoded but for the unreserved ones.
pub(crate) fn encode(text: &str) -> String {
    text.bytes()
        .map(|b| {
            if b.is_ascii_alphanumeric() || b"-_.~".contains(&b) {
                char::from(b).to_string()
            } else {
                format!("%{b:02X}")
            }
        })
        .collect()
}
