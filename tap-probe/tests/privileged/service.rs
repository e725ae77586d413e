//! The systemd unit's way of running tap-probe, without systemd: its `ExecStart` command
//! line, as a user of its own (`DynamicUser`) with exactly its capabilities, ambient, in the
//! bounding set and nothing else, and no new privileges (util-linux's `setpriv` does what
//! systemd would), its web config and the certificate and key it names handed over as
//! systemd hands over `LoadCredential=` files: copied from a directory only root can read
//! into one only the service's user can. It must serve over TLS with basic auth, attach and
//! count a tap, name the VM holding it, log only lines journald reads, answer `/healthz`,
//! keep a departed tap's series for the grace and drop them after it, and leave nothing in
//! the kernel on SIGTERM. Where strace and systemd-analyze exist, every system call it
//! makes must pass the unit's `SystemCallFilter`.

use std::collections::BTreeSet;
use std::os::fd::AsRawFd as _;
use std::os::unix::fs::PermissionsExt as _;
use std::os::unix::process::CommandExt as _;
use std::path::Path;
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_observer::os::tap::Tap;
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::BIN;
use crate::common::oracle::{Checks, Gate, Oracle};
use crate::common::service::{self, Service, left_behind, programs, sample};
use crate::common::web::{self, PASSWORD, Pki, USER};

const UNIT: &str = include_str!("../../../deploy/systemd/tap-probe.service");
/// The user the test runs it as: systemd's `DynamicUser` gives it one of its own; any user
/// without privileges of its own stands for it.
const NOBODY: u32 = 65534;
const FRAMES: u32 = 1_000;
/// The grace the test gives departed devices (the unit's is 300 s).
const FORGET_AFTER: Duration = Duration::from_secs(2);
/// Refreshes in the test (the unit's are 5 s apart).
const INTERVAL: &str = "0.2";
/// The VM the tap's holder says it runs, as libvirt writes a domain's name.
const VM: &str = "guest=vm-unit,debug-threads=on";

/// Every value of `key` in the unit, space-separated values split.
fn directive(key: &str) -> Vec<&'static str> {
    UNIT.lines()
        .filter_map(|line| line.strip_prefix(key)?.strip_prefix('='))
        .flat_map(str::split_whitespace)
        .collect()
}

/// The unit's capabilities as setpriv names them (`bpf`, `perfmon`, ...).
fn unit_capabilities() -> BTreeSet<String> {
    let ambient: BTreeSet<String> = directive("AmbientCapabilities")
        .iter()
        .map(|c| c.to_lowercase().trim_start_matches("cap_").to_owned())
        .collect();
    let bounding: BTreeSet<String> = directive("CapabilityBoundingSet")
        .iter()
        .map(|c| c.to_lowercase().trim_start_matches("cap_").to_owned())
        .collect();
    assert_eq!(ambient, bounding, "the unit grants what it bounds");
    ambient
}

/// The capabilities tap-probe's own error asks for (docs/watch.md lists the same), without any.
fn capabilities_asked_for(binary: &Path) -> BTreeSet<String> {
    let out = Command::new("setpriv")
        .args(["--bounding-set=-all", "--"])
        .arg(binary)
        .args(["serve", "--listen", "127.0.0.1:0"])
        .output()
        .expect("setpriv runs");
    assert!(!out.status.success());
    let stderr = String::from_utf8_lossy(&out.stderr);
    let advice = stderr
        .split("setcap ")
        .nth(1)
        .and_then(|rest| rest.split("+ep").next())
        .unwrap_or_else(|| panic!("a setcap line: {stderr}"));
    advice
        .split(',')
        .map(|c| c.trim_start_matches("cap_").to_owned())
        .collect()
}

/// `GET path` over TLS with the basic auth of the test's web config: the status code and the
/// body.
fn get(service: &Service, pki: &Pki, path: &str) -> (u16, String) {
    let response = web::https(
        &service.addr,
        pki.client(None),
        &web::get(path, Some((USER, PASSWORD)), true),
    )
    .unwrap_or_else(|err| panic!("GET {path}: {err}"));
    (response.status, response.body)
}

fn service_user() -> nix::unistd::Uid {
    nix::unistd::Uid::from_raw(NOBODY)
}

fn service_group() -> nix::unistd::Gid {
    nix::unistd::Gid::from_raw(NOBODY)
}

/// Hands the unit's credentials (`LoadCredential=ID:PATH`) over as systemd does, from `pki`:
/// the file named as PATH's file name, in a directory of the test's that only root may read
/// (standing for `/etc/tap-probe`), copied to `ID` in `credentials`, a directory of the
/// service's user, read-only and closed to others (systemd's `$CREDENTIALS_DIRECTORY`).
/// Returns the credentials' IDs.
fn hand_over_credentials(pki: &Pki, credentials: &Path) -> BTreeSet<String> {
    let sources = tempfile::tempdir().unwrap();
    std::fs::set_permissions(sources.path(), std::fs::Permissions::from_mode(0o700)).unwrap();
    std::fs::create_dir(credentials).unwrap();
    let mut ids = BTreeSet::new();
    for entry in directive("LoadCredential") {
        let (id, path) = entry.split_once(':').expect("LoadCredential=ID:PATH");
        let path = Path::new(path);
        assert!(
            path.starts_with("/etc/tap-probe"),
            "the unit's credentials come from /etc/tap-probe: {entry}"
        );
        let name = path.file_name().unwrap().to_str().unwrap();
        let source = sources.path().join(name);
        std::fs::copy(pki.path(name), &source)
            .unwrap_or_else(|err| panic!("the test has no {name} for {entry}: {err}"));
        std::fs::set_permissions(&source, std::fs::Permissions::from_mode(0o600)).unwrap();
        // Only root reads the original: the service's user is refused it.
        let read = Command::new("setpriv")
            .args([
                format!("--reuid={NOBODY}"),
                format!("--regid={NOBODY}"),
                "--clear-groups".to_owned(),
                "cat".to_owned(),
            ])
            .arg(&source)
            .output()
            .expect("setpriv runs");
        assert!(
            !read.status.success(),
            "the service's user reads {}",
            source.display()
        );
        let copy = credentials.join(id);
        std::fs::copy(&source, &copy).unwrap();
        std::fs::set_permissions(&copy, std::fs::Permissions::from_mode(0o400)).unwrap();
        nix::unistd::chown(&copy, Some(service_user()), Some(service_group())).unwrap();
        ids.insert(id.to_owned());
    }
    std::fs::set_permissions(credentials, std::fs::Permissions::from_mode(0o500)).unwrap();
    nix::unistd::chown(credentials, Some(service_user()), Some(service_group())).unwrap();
    ids
}

/// The unit's `ExecStart` arguments with the test's values for `overrides` (appended where
/// the unit does not give the flag), and `%d` (the credentials directory) as `credentials`.
fn exec_start_args(overrides: &[(&str, &str)], credentials: &Path) -> Vec<String> {
    let exec = directive("ExecStart");
    assert!(
        exec[0].ends_with("/tap-probe") && exec[1] == "serve",
        "{exec:?}"
    );
    let mut args: Vec<String> = exec[1..]
        .iter()
        .map(|&a| a.replace("%d", credentials.to_str().unwrap()))
        .collect();
    for (flag, value) in overrides {
        match args.iter().position(|a| a == flag) {
            Some(i) => (*value).clone_into(&mut args[i + 1]),
            None => args.extend([(*flag).to_owned(), (*value).to_owned()]),
        }
    }
    args
}

/// `setpriv` doing what the unit asks of systemd: the user, the capabilities (inheritable,
/// ambient and bounding: nothing else is left), no new privileges.
fn as_the_unit_runs_it(caps: &BTreeSet<String>) -> Vec<String> {
    assert_eq!(directive("DynamicUser"), ["yes"], "a user of its own");
    assert_eq!(directive("NoNewPrivileges"), ["yes"]);
    let list: String = std::iter::once("-all".to_owned())
        .chain(caps.iter().map(|c| format!("+{c}")))
        .collect::<Vec<_>>()
        .join(",");
    vec![
        "setpriv".to_owned(),
        format!("--reuid={NOBODY}"),
        format!("--regid={NOBODY}"),
        "--clear-groups".to_owned(),
        format!("--inh-caps={list}"),
        format!("--ambient-caps={list}"),
        format!("--bounding-set={list}"),
        "--no-new-privs".to_owned(),
        "--".to_owned(),
    ]
}

/// A process that holds the tap open under a VM's command line (`sh -c 'read _' sh -name
/// guest=...`): the tap's owner as `serve` should name it. It ends when its stdin closes.
fn holder(tap: &Tap) -> std::process::Child {
    let fd = tap.queue_fd(0).as_raw_fd();
    let mut command = Command::new("sh");
    command
        .args(["-c", "read _", "sh", "-name", VM])
        .stdin(Stdio::piped());
    // SAFETY: dup2 is async-signal-safe; the child keeps the tap's queue as fd 3.
    unsafe {
        command.pre_exec(move || {
            if libc::dup2(fd, 3) < 0 {
                return Err(std::io::Error::last_os_error());
            }
            Ok(())
        });
    }
    command.spawn().expect("sh runs")
}

/// The system calls the traced process made after it became `binary`, from `strace -f`'s
/// output (`PID name(args) = ret` lines).
fn syscalls_after_exec(trace: &str, binary: &Path) -> BTreeSet<String> {
    let exec = format!("execve(\"{}\"", binary.display());
    trace
        .lines()
        .skip_while(|line| !line.contains(&exec))
        .filter_map(|line| {
            let call = line.split_once(' ')?.1.trim_start();
            let name: String = call
                .chars()
                .take_while(|c| c.is_ascii_alphanumeric() || *c == '_')
                .collect();
            (!name.is_empty() && call[name.len()..].starts_with('(')).then_some(name)
        })
        .collect()
}

/// The system calls `SystemCallFilter` allows, groups expanded by `systemd-analyze
/// syscall-filter`; `None` where systemd-analyze is missing.
fn allowed_syscalls(filter: &[&str]) -> Option<BTreeSet<String>> {
    let mut allowed = BTreeSet::new();
    let mut pending: Vec<String> = filter.iter().map(|&f| f.to_owned()).collect();
    let mut expanded = BTreeSet::new();
    while let Some(item) = pending.pop() {
        if !item.starts_with('@') {
            allowed.insert(item);
            continue;
        }
        if !expanded.insert(item.clone()) {
            continue;
        }
        let out = Command::new("systemd-analyze")
            .args(["syscall-filter", &item])
            .output()
            .ok()?;
        assert!(
            out.status.success(),
            "systemd-analyze syscall-filter {item}"
        );
        for line in String::from_utf8_lossy(&out.stdout).lines().skip(1) {
            let entry = line.trim();
            if !entry.is_empty() && !entry.starts_with('#') {
                pending.push(entry.to_owned());
            }
        }
    }
    Some(allowed)
}

#[test]
#[expect(
    clippy::too_many_lines,
    reason = "one service life, start to stop, in order"
)]
fn the_unit_runs_it_with_its_capabilities_alone() {
    if !tap_probe_verdict::root() {
        return;
    }
    // A copy the unprivileged user can reach (the build directory may be private).
    let dir = tempfile::tempdir().unwrap();
    std::fs::set_permissions(dir.path(), std::fs::Permissions::from_mode(0o755)).unwrap();
    let binary = dir.path().join("tap-probe");
    std::fs::copy(BIN, &binary).unwrap();
    std::fs::set_permissions(&binary, std::fs::Permissions::from_mode(0o755)).unwrap();

    let caps = unit_capabilities();
    assert_eq!(
        caps,
        capabilities_asked_for(&binary),
        "the unit grants what tap-probe asks for"
    );

    // The web config the unit reads from its credentials (TLS and basic auth, the
    // certificate and key by their credential IDs), and those credentials, handed over.
    let pki = Pki::new();
    pki.web_config("web-config.yml", false, true);
    let credentials = dir.path().join("credentials");
    let ids = hand_over_credentials(&pki, &credentials);
    let exec = directive("ExecStart");
    let config = exec
        .iter()
        .position(|&a| a == "--web.config.file")
        .map(|i| exec[i + 1])
        .expect("the unit serves with a web config");
    let id = config
        .strip_prefix("%d/")
        .expect("the unit reads its web config from its credentials (%d)");
    assert!(ids.contains(id), "{id} is a credential: {ids:?}");
    for named in ["tls.crt", "tls.key"] {
        assert!(
            ids.contains(named),
            "{named}, which the web config names, is a credential"
        );
    }

    let ns = common::quiet_netns("unit").unwrap();
    let tap = common::tap_in(&ns, "tpu0", RootQdisc::PfifoFast).unwrap();
    let mut vm = holder(&tap);

    let args = exec_start_args(
        &[
            ("--listen", "127.0.0.1:0"),
            ("--interval", INTERVAL),
            ("--forget-after", "2"),
            ("--netns", ns.name()),
        ],
        &credentials,
    );
    let filter = directive("SystemCallFilter");
    let allowed = allowed_syscalls(&filter);
    let strace = Command::new("strace").arg("-V").output().is_ok();
    let trace = dir.path().join("trace");
    let mut wrapped: Vec<String> = Vec::new();
    if strace && allowed.is_some() {
        wrapped.extend(["strace", "-f", "-qq", "-o"].map(str::to_owned));
        wrapped.push(trace.display().to_string());
    } else {
        Skip::test(
            "the unit's SystemCallFilter is not checked here: strace or \
             systemd-analyze is missing",
        )
        .print();
    }
    wrapped.extend(as_the_unit_runs_it(&caps));
    wrapped.push(binary.display().to_string());
    wrapped.extend(args);
    let mut command = Command::new(&wrapped[0]);
    command.args(&wrapped[1..]);
    let before = programs();
    let service = Service::start(command, &binary);
    assert!(
        service
            .stderr()
            .iter()
            .any(|line| line.contains("serving metrics on https://")
                && line.contains("with TLS, basic auth for 1 user")),
        "{:?}",
        service.stderr()
    );

    // Its programs, as the kernel lists them: what must be gone after SIGTERM.
    let loaded: BTreeSet<u32> = programs().difference(&before).copied().collect();
    assert!(!loaded.is_empty(), "serve loaded no program");

    // Tracked, held by the VM's process, counted exactly.
    let owner = format!("owner_pid=\"{}\"", vm.id());
    let labels = [
        "device=\"tpu0\"",
        owner.as_str(),
        "owner_comm=\"sh\"",
        "vm=\"vm-unit\"",
    ];
    let deadline = Instant::now() + Duration::from_secs(30);
    while sample(
        &get(&service, &pki, "/metrics").1,
        "tap_probe_consumed_total",
        &labels,
    )
    .is_none()
    {
        assert!(
            Instant::now() < deadline,
            "the tap was never served with its VM's labels:\n{}",
            get(&service, &pki, "/metrics").1
        );
        std::thread::sleep(Duration::from_millis(100));
    }
    let driven = common::paced_and_read(ns.path(), &tap, FRAMES.into());
    assert_eq!(driven.read[0].packets, u64::from(FRAMES), "{driven:?}");
    // Once serve has read the kernel's count of every frame, every later refresh reads the
    // probes' count of them all: the reader had taken the last frame before the drive ended.
    let deadline = Instant::now() + Duration::from_secs(30);
    let body = loop {
        let body = get(&service, &pki, "/metrics").1;
        let kernel = sample(&body, "tap_probe_kernel_tx_packets_total", &labels);
        if kernel == Some(f64::from(FRAMES)) {
            // Two refreshes later: none begun before the drive ended is served any more.
            std::thread::sleep(Duration::from_millis(500));
            break get(&service, &pki, "/metrics").1;
        }
        assert!(
            Instant::now() < deadline,
            "serve never read the kernel's tx_packets of {FRAMES}: {kernel:?}"
        );
        std::thread::sleep(Duration::from_millis(100));
    };
    let consumed = sample(&body, "tap_probe_consumed_total", &labels);
    let missed_runs = service::kernel_misses(&loaded);
    // The unit leaves the backend to serve: what this kernel has.
    let gate = Gate::of_programs(Backend::Auto, missed_runs);
    let mut checks = Checks::new();
    checks.eq(
        &gate,
        Oracle::Reader,
        consumed,
        Some(f64::from(FRAMES)),
        "frames the reader took, as serve counted them",
    );
    checks.eq(
        &gate,
        Oracle::DeviceStats,
        consumed,
        sample(&body, "tap_probe_kernel_tx_packets_total", &labels),
        "the tap's tx_packets",
    );
    let (status, body) = get(&service, &pki, "/healthz");
    assert_eq!(status, 200, "{body}");
    assert!(body.starts_with("ok: refreshed"), "{body}");

    // The VM goes: its series stay for the grace, with their last counts, then go.
    drop(vm.stdin.take());
    vm.wait().unwrap();
    drop(tap);
    let gone_from = Instant::now();
    let served_for = loop {
        if sample(
            &get(&service, &pki, "/metrics").1,
            "tap_probe_consumed_total",
            &labels,
        )
        .is_none()
        {
            break gone_from.elapsed();
        }
        assert!(
            gone_from.elapsed() < FORGET_AFTER + Duration::from_secs(10),
            "a departed tap's series outlived the grace"
        );
        std::thread::sleep(Duration::from_millis(50));
    };
    assert!(
        served_for >= FORGET_AFTER,
        "a departed tap's series went after {served_for:?}, before the grace of {FORGET_AFTER:?}"
    );

    let (status, stderr, stdout) = service.terminate();
    assert!(
        status.success(),
        "serve exits cleanly on SIGTERM: {status:?}\n{}",
        stderr.join("\n")
    );
    assert_eq!(stdout, "", "a service writes nothing on stdout");
    for line in &stderr {
        let priority = line
            .strip_prefix('<')
            .and_then(|rest| rest.split_once('>'))
            .and_then(|(n, _)| n.parse::<u8>().ok());
        assert!(
            priority.is_some_and(|p| p <= 7),
            "a line journald reads without its priority: {line:?}"
        );
    }
    assert!(
        stderr
            .iter()
            .any(|l| l.starts_with("<6>") && l.contains("stopped")),
        "{stderr:?}"
    );
    assert_eq!(
        left_behind(&loaded),
        (Vec::new(), Vec::new()),
        "programs and links left behind after SIGTERM"
    );

    if let (true, Some(allowed)) = (strace, allowed) {
        let trace = std::fs::read_to_string(&trace).unwrap();
        let made = syscalls_after_exec(&trace, &binary);
        assert!(
            made.contains("bpf"),
            "the trace has serve's calls: {made:?}"
        );
        let refused: Vec<&String> = made.difference(&allowed).collect();
        assert!(
            refused.is_empty(),
            "the unit's SystemCallFilter ({}) would refuse {refused:?}",
            filter.join(" ")
        );
    }
}
