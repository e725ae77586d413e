//! A dense hypervisor: taps by the thousand, held open as VMs hold them (a file per queue,
//! multi-queue). Every one is tracked, by the watcher `watch` runs and by `serve`, with
//! nothing said untracked; one series per tap by default, in a scrape of bounded size; the
//! kernel memory the probe's maps hold is what the kernel charges for them (each map's
//! `memlock`), follows the queues present and stays within the budget a 256-CPU host can
//! afford; a sample of the taps counts its traffic exactly, per queue, a queue attached
//! after tracking began included.

use std::collections::{BTreeMap, BTreeSet, HashSet};
use std::fmt::Write as _;
use std::path::{Path, PathBuf};
use std::process::{Command, Stdio};
use std::time::{Duration, Instant};

use tap_probe_lab::lab::{Drive, ReaderConfig, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::report::Report;
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{Tap, TapOptions};

use crate::common;
use crate::common::BIN;
use crate::common::service::Service;
use crate::common::{Checks, Gate, Oracle};

/// The host of the smaller budget: 100 VMs of 4 queues, within 16 MB at 256 CPUs.
const SMALL: (usize, u16, u64) = (100, 4, 16_000_000);
/// The dense one: 1,000 VMs of 8 queues, within 160 MB at 256 CPUs.
const DENSE: (usize, u16, u64) = (1_000, 8, 160_000_000);
/// Single-queue taps by the thousand.
const SINGLE: usize = 2_000;
/// Series a tap may have by default, whatever its queues.
const SERIES_PER_TAP: usize = 24;
/// The most a scrape of the dense host may weigh by default.
const SCRAPE_BYTES: usize = 5_000_000;
/// The CPUs of the host the budgets are for.
const CPUS: u64 = 256;
/// The group the test's taps are put in, so that they go in one batch (one RCU wait for a
/// thousand devices, where closing their files one by one waits once per device).
const GROUP: &str = "4242";
/// Frames through each sampled tap, over flows the tap spreads on its queues.
const FRAMES: u64 = 4_000;
const FLOWS: u32 = 64;

/// Taps held open in a namespace of their own, removed however the test ends.
struct Taps {
    ns: NamedNetns,
    taps: Vec<Tap>,
}

impl Taps {
    /// `n` taps named `PREFIX0..`, each with `queues` queues (multi-queue when more than
    /// one), each file held open as a VM's holder holds it.
    fn create(tag: &str, prefix: &str, n: usize, queues: u16) -> Self {
        let ns = common::quiet_netns(tag).unwrap();
        let taps = run_in(ns.path(), || {
            (0..n)
                .map(|i| {
                    Tap::create(
                        &format!("{prefix}{i}"),
                        TapOptions {
                            multi_queue: queues > 1,
                            queues,
                            ..TapOptions::default()
                        },
                    )
                })
                .collect::<anyhow::Result<Vec<_>>>()
        })
        .unwrap();
        let mut batch = String::new();
        for tap in &taps {
            let _ = writeln!(batch, "link set dev {} group {GROUP}", tap.name());
        }
        ip_batch(ns.name(), &batch);
        Self { ns, taps }
    }
}

impl Drop for Taps {
    fn drop(&mut self) {
        ip_batch(self.ns.name(), &format!("link del group {GROUP}\n"));
    }
}

/// Runs `commands` through `ip -n NS -batch -`.
fn ip_batch(ns: &str, commands: &str) {
    use std::io::Write as _;
    let mut ip = Command::new("ip")
        .args(["-n", ns, "-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .expect("iproute2");
    ip.stdin
        .take()
        .unwrap()
        .write_all(commands.as_bytes())
        .unwrap();
    assert!(ip.wait().unwrap().success(), "ip -batch: {commands:.200}");
}

/// Lets this process hold a file per tap queue.
fn raise_open_files() {
    use nix::sys::resource::{Resource, getrlimit, setrlimit};
    let (_, hard) = getrlimit(Resource::RLIMIT_NOFILE).unwrap();
    setrlimit(Resource::RLIMIT_NOFILE, hard, hard).unwrap();
    assert!(
        hard >= 12_000,
        "the test holds a file per tap queue: the hard limit of open files is {hard}"
    );
}

/// The eBPF maps process `pid` holds, as the kernel charges them: per map (by id, however
/// many descriptors name it), its `memlock` and, for a per-CPU map, the part kept per
/// possible CPU (its entries times the value size rounded up to 8).
fn maps_of(pid: &str) -> BTreeMap<u64, (u64, u64)> {
    let mut maps = BTreeMap::new();
    for fd in std::fs::read_dir(format!("/proc/{pid}/fd")).unwrap() {
        let fd = fd.unwrap();
        if std::fs::read_link(fd.path()).ok().as_deref() != Some(Path::new("anon_inode:bpf-map")) {
            continue;
        }
        let Ok(info) = std::fs::read_to_string(format!(
            "/proc/{pid}/fdinfo/{}",
            fd.file_name().to_string_lossy()
        )) else {
            continue;
        };
        let field = |name: &str| -> u64 {
            info.lines()
                .find_map(|l| l.strip_prefix(name)?.strip_prefix(':'))
                .unwrap_or_else(|| panic!("{name} in {info}"))
                .trim()
                .parse()
                .unwrap()
        };
        // BPF_MAP_TYPE_PERCPU_HASH, _PERCPU_ARRAY, _LRU_PERCPU_HASH, _PERCPU_CGROUP_STORAGE.
        let per_cpu = if [5, 6, 10, 21].contains(&field("map_type")) {
            field("max_entries") * field("value_size").next_multiple_of(8)
        } else {
            0
        };
        maps.insert(field("map_id"), (field("memlock"), per_cpu));
    }
    maps
}

/// The CPUs the kernel sizes per-CPU maps by here.
fn possible_cpus() -> u64 {
    let text = std::fs::read_to_string("/sys/devices/system/cpu/possible").unwrap();
    text.trim()
        .split(',')
        .map(|range| match range.split_once('-') {
            Some((a, b)) => b.parse::<u64>().unwrap() - a.parse::<u64>().unwrap() + 1,
            None => 1,
        })
        .sum()
}

/// The bytes of `maps` here, and what they would be with [`CPUS`] possible CPUs.
fn bytes_here_and_at_256(maps: &BTreeMap<u64, (u64, u64)>) -> (u64, u64) {
    let here = possible_cpus();
    let bytes = maps.values().map(|(b, _)| b).sum();
    let at = maps
        .values()
        .map(|(b, per_cpu)| b - per_cpu * here + per_cpu * CPUS)
        .sum();
    (bytes, at)
}

/// The watcher's maps, counted by the kernel, against what it reports; with the bytes a
/// 256-CPU host would need for them, which must be within `budget`.
fn memory_within(checks: &mut Checks, watcher: &mut Watcher, what: &str, budget: u64) -> u64 {
    let report = watcher.refresh().unwrap();
    let ours = report.memory.expect("the report says what the maps hold");
    let (bytes, at_256) = bytes_here_and_at_256(&maps_of("self"));
    checks.eq(
        &Gate::none(),
        Oracle::MapMemory,
        ours.bytes(),
        bytes,
        format!("{what}: the maps' kernel memory, against each map's memlock"),
    );
    checks.eq(
        &Gate::none(),
        Oracle::MapMemory,
        ours.bytes_at(usize::try_from(CPUS).unwrap()),
        at_256,
        format!("{what}: the same maps with {CPUS} CPUs"),
    );
    eprintln!(
        "{what}: {bytes} bytes of kernel memory here ({} possible CPUs), {at_256} with {CPUS}",
        possible_cpus()
    );
    assert!(
        at_256 <= budget,
        "{what}: {at_256} bytes with {CPUS} CPUs, over the budget of {budget}"
    );
    at_256
}

/// Refreshes until every device of `ns` is tracked (the first refresh tracks all it finds;
/// a second takes over what the programs registered meanwhile); the report then.
fn all_tracked(watcher: &mut Watcher, taps: &Taps, queues: usize) -> Report {
    let names: BTreeSet<&str> = taps.taps.iter().map(Tap::name).collect();
    let report = watcher.refresh().unwrap();
    let live: Vec<_> = report
        .rows
        .iter()
        .filter(|r| !r.retired && r.netns == taps.ns.name())
        .collect();
    let devices: BTreeSet<&str> = live.iter().map(|r| r.ifname.as_str()).collect();
    assert!(
        report.untracked.is_empty(),
        "{} devices untracked: {:?}",
        report.untracked.len(),
        &report.untracked[..report.untracked.len().min(3)]
    );
    assert_eq!(devices, names, "every tap is tracked");
    assert_eq!(
        live.len(),
        names.len() * queues,
        "a row per queue in use: {queues} per tap"
    );
    report
}

/// What `serve` serves once a refresh has seen the devices of `ns`: within a bound, every
/// tap in it has its series and none is untracked. The body.
fn served(service: &Service, ns: &str, taps: usize) -> String {
    let deadline = Instant::now() + Duration::from_mins(2) * common::slowdown();
    loop {
        let (status, body) = service.get("/metrics");
        assert!(status.ends_with(" 200 OK"), "{status}: {body:.500}");
        let devices: HashSet<&str> = body
            .lines()
            .filter(|l| l.starts_with("tap_probe_xmit_calls_total{"))
            .filter(|l| l.contains(&format!("netns=\"{ns}\"")))
            .filter_map(|l| l.split("device=\"").nth(1)?.split('"').next())
            .collect();
        if devices.len() == taps {
            assert!(
                body.lines().any(|l| l == "tap_probe_untracked_devices 0"),
                "serve tracks every tap and says none is untracked"
            );
            return body;
        }
        assert!(
            Instant::now() < deadline,
            "serve shows {} of the {taps} taps of {ns}",
            devices.len()
        );
        std::thread::sleep(Duration::from_millis(500));
    }
}

/// The series of each tap of `ns` in `body`.
fn series_per_tap(body: &str, ns: &str) -> BTreeMap<String, usize> {
    let mut out = BTreeMap::new();
    for line in body.lines().filter(|l| !l.starts_with('#')) {
        if line.contains(&format!("netns=\"{ns}\""))
            && let Some(device) = line
                .split("device=\"")
                .nth(1)
                .and_then(|r| r.split('"').next())
        {
            *out.entry(device.to_owned()).or_default() += 1;
        }
    }
    out
}

/// The value of the sample of `family` for `device` in `body`.
fn sample(body: &str, family: &str, device: &str) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(&format!("{family}{{")))
        .find(|l| l.contains(&format!("device=\"{device}\"")))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}

/// Traffic through `tap` of `ns` over all its `queues`, a reader on each: per queue the
/// watcher's `consumed` equals what its reader took, and over the queues `serve`'s device
/// series equal them too once a refresh after the traffic is served.
fn sample_counts_exactly(
    checks: &mut Checks,
    watcher: &mut Watcher,
    service: &Service,
    ns: &NamedNetns,
    tap: &Tap,
    queues: usize,
) {
    run_in(ns.path(), || {
        let mut rtnl = Rtnl::open()?;
        rtnl.replace_root_qdisc(tap.ifindex(), RootQdisc::Noqueue)?;
        rtnl.set_up(tap.ifindex())
    })
    .unwrap();
    let driven = Drive {
        netns: ns.path(),
        tap,
        sender: SenderConfig {
            batch: 1,
            flows: FLOWS,
            ..SenderConfig::new(0, FRAMES, Duration::from_secs(30))
        },
        reader: ReaderConfig {
            pps: None,
            deadline: Duration::from_mins(1),
            max_packets: None,
        },
        queues,
        linger: Duration::from_millis(200),
    }
    .run()
    .unwrap();
    assert_eq!(driven.sent.attempted, FRAMES, "{:?}", driven.sent);
    let taken: Vec<u64> = driven
        .read
        .iter()
        .zip(&driven.drained)
        .map(|(r, d)| r.packets + d)
        .collect();
    let gate = Gate::of(Backend::Tracepoint, watcher);
    let rows: Vec<_> = watcher
        .refresh()
        .unwrap()
        .rows
        .into_iter()
        .filter(|r| r.ifname == tap.name() && r.netns == ns.name())
        .collect();
    assert_eq!(rows.len(), queues, "{} rows: {rows:#?}", tap.name());
    for (q, row) in rows.iter().enumerate() {
        assert_eq!(row.queue as usize, q);
        checks.eq(
            &gate,
            Oracle::Reader,
            row.counters.consumed,
            taken[q],
            format!("{} queue {q}: consumed vs the queue's reader", tap.name()),
        );
    }
    checks.eq(
        &gate,
        Oracle::Sender,
        rows.iter().map(|r| r.counters.xmit_calls).sum::<u64>(),
        driven.sent.attempted,
        format!(
            "{}: a driver call per frame sent, over its queues",
            tap.name()
        ),
    );
    checks.eq(
        &gate,
        Oracle::DeviceStats,
        rows.iter().map(|r| r.counters.consumed).sum::<u64>(),
        rows[0].kernel.tx_packets,
        format!(
            "{}: consumed on all queues vs the device's tx_packets",
            tap.name()
        ),
    );
    // serve: one series for the device, its queues summed.
    #[expect(clippy::cast_precision_loss, reason = "counts far below 2^52")]
    let total = taken.iter().sum::<u64>() as f64;
    let deadline = Instant::now() + Duration::from_secs(30) * common::slowdown();
    loop {
        let (_, body) = service.get("/metrics");
        let consumed = sample(&body, "tap_probe_consumed_total", tap.name());
        if consumed == Some(total) {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "serve's consumed of {} never reached the {total} frames read: {consumed:?}; its \
             series:\n{}\nits log:\n{}",
            tap.name(),
            body.lines()
                .filter(|l| l.contains(&format!("device=\"{}\"", tap.name())))
                .collect::<Vec<_>>()
                .join("\n"),
            service.stderr().join("\n")
        );
        std::thread::sleep(Duration::from_millis(200));
    }
}

/// What serve's maps hold, as the kernel charges them, is what it says it holds.
fn serve_memory_is_its_maps(checks: &mut Checks, service: &Service) {
    let (bytes, _) = bytes_here_and_at_256(&maps_of(&service.pid().to_string()));
    let (_, body) = service.get("/metrics");
    #[expect(clippy::cast_precision_loss, reason = "bytes far below 2^52")]
    let charged = bytes as f64;
    checks.eq(
        &Gate::none(),
        Oracle::MapMemory,
        body.lines()
            .find_map(|l| l.strip_prefix("tap_probe_kernel_memory_bytes "))
            .map(|v| v.parse::<f64>().unwrap()),
        Some(charged),
        "serve's tap_probe_kernel_memory_bytes, against its maps' memlock",
    );
}

/// Starts `serve` on the test's namespaces, default series, refreshing every 2 s.
fn serve(netns_glob: &str) -> Service {
    let binary = PathBuf::from(BIN);
    Service::tracepoints(&binary, &["--netns", netns_glob, "--interval", "2"]).0
}

#[test]
fn every_tap_of_a_dense_host_is_tracked_within_its_memory_budget() {
    if !tap_probe_verdict::root() {
        return;
    }
    raise_open_files();
    let mut checks = Checks::new();
    let glob = format!("tp-dn*-{}-*", std::process::id());
    let filter = Filter {
        globs: Vec::new(),
        netns: Some(glob.clone()),
        macvtap: false,
    };
    let mut watcher = Watcher::with_backend(&common::kernel(), &filter, Backend::Tracepoint)
        .expect("the watcher attaches");
    let service = serve(&glob);

    // 100 VMs of 4 queues.
    let (n, queues, budget) = SMALL;
    let small = Taps::create("dns", "dns", n, queues);
    all_tracked(&mut watcher, &small, usize::from(queues));
    memory_within(&mut checks, &mut watcher, "100 taps of 4 queues", budget);
    served(&service, small.ns.name(), n);
    drop(small);

    // 1,000 VMs of 8 queues, and the memory they need.
    let (n, queues, budget) = DENSE;
    let dense = Taps::create("dnd", "dnd", n, queues);
    let started = Instant::now();
    all_tracked(&mut watcher, &dense, usize::from(queues));
    eprintln!(
        "1,000 taps of 8 queues tracked in {:.1} s",
        started.elapsed().as_secs_f64()
    );
    let dense_memory = memory_within(&mut checks, &mut watcher, "1,000 taps of 8 queues", budget);
    let body = served(&service, dense.ns.name(), n);
    eprintln!("a scrape of 1,000 taps of 8 queues: {} bytes", body.len());
    assert!(
        body.len() <= SCRAPE_BYTES,
        "a scrape of {} bytes, over {SCRAPE_BYTES}",
        body.len()
    );
    let per_tap = series_per_tap(&body, dense.ns.name());
    assert_eq!(per_tap.len(), n);
    let most = per_tap.values().max().copied().unwrap_or(0);
    assert!(
        most <= SERIES_PER_TAP,
        "{most} series for a tap of 8 queues, over {SERIES_PER_TAP}"
    );
    serve_memory_is_its_maps(&mut checks, &service);

    // A sample counts exactly, each of its queues on its own.
    for tap in [0, n / 2, n - 1].map(|i| &dense.taps[i]) {
        sample_counts_exactly(
            &mut checks,
            &mut watcher,
            &service,
            &dense.ns,
            tap,
            usize::from(queues),
        );
    }
    drop(dense);

    // A tap whose holder attaches a queue after tracking began: every queue counted.
    let mut growing = Taps::create("dng", "dng", 1, 2);
    all_tracked(&mut watcher, &growing, 2);
    let ns = growing.ns.path().to_path_buf();
    let third = run_in(&ns, || growing.taps[0].attach_queue()).unwrap();
    assert_eq!(third, 2);
    sample_counts_exactly(
        &mut checks,
        &mut watcher,
        &service,
        &growing.ns,
        &growing.taps[0],
        3,
    );
    drop(growing);

    // 2,000 single-queue taps, in the chunks the dense host gave back.
    let single = Taps::create("dn1", "dn1", SINGLE, 1);
    all_tracked(&mut watcher, &single, 1);
    // The chunks freed by the dense host are given back a refresh after their slots cool.
    watcher.refresh().unwrap();
    let single_memory = memory_within(&mut checks, &mut watcher, "2,000 single-queue taps", budget);
    assert!(
        single_memory < dense_memory,
        "the memory follows the queues present: {single_memory} bytes for 2,000 queues, \
         {dense_memory} for 8,000"
    );
    served(&service, single.ns.name(), SINGLE);
    drop(single);

    let (status, log, _) = service.terminate();
    assert!(
        status.success(),
        "serve exits cleanly on SIGTERM: {status:?}"
    );
    assert!(
        log.iter().all(|l| !l.contains("not tracking")),
        "serve said it left devices untracked:\n{}",
        log.join("\n")
    );
    assert!(
        log.iter().any(|l| l.contains("of kernel memory")),
        "serve says what memory it holds:\n{}",
        log.join("\n")
    );
    drop(checks);
}
