//! Test hosts: each test builds its own network namespace and devices, removed by guards on
//! drop (also when an assertion fails).

pub(crate) mod prometheus;
pub(crate) mod running;
pub(crate) mod service;
pub(crate) mod web;

use std::path::Path;
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::Duration;

use anyhow::{Context as _, Result};
use tap_probe_common::{Kind, METRICS, Requires, Unit};
use tap_probe_lab::lab::{Drive, Driven, ReaderConfig, SendReport, SenderConfig};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::bpf::probe::Occupancy;
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::report::{Row, Value};
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::{KernelInfo, TunBackpressure};
use tap_probe_observer::os::netlink::{RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{NamedNetns, run_in};
use tap_probe_observer::os::tap::{Tap, TapOptions};
use tap_probe_verdict::Skip;

pub(crate) mod oracle;
pub(crate) mod second_reading;

pub(crate) use oracle::{Checks, Gate, Oracle};

/// What a test watches: the devices `glob` matches in `ns`, macvtaps not included.
pub(crate) fn filter(ns: &NamedNetns, glob: &str) -> Filter {
    Filter {
        globs: vec![glob.to_owned()],
        netns: Some(ns.name().to_owned()),
        macvtap: false,
    }
}

/// The tap-probe binary cargo built for these tests.
pub(crate) const BIN: &str = env!("CARGO_BIN_EXE_tap-probe");

/// The names of every program in the probe object, as the embedded object gives them, so
/// that a test can find every one left loaded after a run (the kernel keeps the first 15
/// bytes of a program's name, `BPF_OBJ_NAME_LEN` with the NUL) and tell them from others.
///
/// # Errors
/// When the embedded object cannot be parsed (a build with `AYA_BUILD_SKIP` has none).
pub(crate) fn probe_program_names() -> Result<std::collections::BTreeSet<String>> {
    let object = aya_obj::Object::parse(tap_probe_observer::bpf::object::Object::Probe.bytes())
        .context("parsing the embedded probe object")?;
    Ok(object.programs.keys().cloned().collect())
}

/// A namespace name no other test or run uses.
pub(crate) fn unique(tag: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    format!(
        "tp-{tag}-{}-{}",
        std::process::id(),
        N.fetch_add(1, Ordering::Relaxed)
    )
}

/// A private namespace with IPv6 off, so the kernel sends nothing of its own (router
/// solicitations, MLD) into the devices: every frame in them is the test's.
pub(crate) fn quiet_netns(tag: &str) -> Result<NamedNetns> {
    let ns = NamedNetns::create(&unique(tag))?;
    run_in(ns.path(), || {
        for knob in ["all", "default"] {
            std::fs::write(format!("/proc/sys/net/ipv6/conf/{knob}/disable_ipv6"), "1")
                .with_context(|| format!("disabling IPv6 ({knob})"))?;
        }
        Ok(())
    })?;
    Ok(ns)
}

/// A tap in `ns` with the given root qdisc, up. Dropping the tap removes the device.
pub(crate) fn tap_in(ns: &NamedNetns, name: &str, qdisc: RootQdisc) -> Result<Tap> {
    tap_with(ns, name, qdisc, TapOptions::default())
}

/// As [`tap_in`], with `opts`.
pub(crate) fn tap_with(
    ns: &NamedNetns,
    name: &str,
    qdisc: RootQdisc,
    opts: TapOptions,
) -> Result<Tap> {
    run_in(ns.path(), || {
        let tap = Tap::create(name, opts)?;
        let mut rtnl = Rtnl::open()?;
        rtnl.replace_root_qdisc(tap.ifindex(), qdisc)?;
        rtnl.set_up(tap.ifindex())?;
        Ok(tap)
    })
}

/// Whether this kernel has the qdisc `kind`, built in or as a module: tried on a dummy
/// tap, so a test that needs it can say it skips and why.
pub(crate) fn has_qdisc(qdisc: RootQdisc) -> bool {
    let ns = quiet_netns("qdisc").unwrap();
    let tried = tap_in(&ns, "tpq0", qdisc);
    match tried {
        Ok(_) => true,
        Err(err) => {
            let text = format!("{err:#}");
            assert!(
                text.contains("qdisc"),
                "only a missing qdisc may fail here: {text}"
            );
            Skip::test(text).print();
            false
        }
    }
}

/// Sends `frames` frames through `tap` from inside `netns`, one a sendmsg at 5,000 a
/// second, slow enough for a reader to keep up with, while a reader at full speed takes
/// them until it has them all (or its deadline passes).
pub(crate) fn paced_and_read(netns: &Path, tap: &Tap, frames: u64) -> Driven {
    Drive {
        netns,
        tap,
        sender: SenderConfig {
            batch: 1,
            pps: Some(5_000),
            ..SenderConfig::new(0, frames, Duration::from_secs(20))
        },
        reader: ReaderConfig {
            pps: None,
            deadline: Duration::from_secs(30),
            max_packets: Some(frames),
        },
        queues: 1,
        linger: Duration::ZERO,
    }
    .run()
    .unwrap()
}

/// Sends `frames` frames through `tap` from inside `netns` as fast as it can, one a
/// sendmsg so that every drop the stack reports is the sender's, while a reader takes 4,000
/// a second, far fewer: the ring fills. The reader goes on for `linger` after the sender is
/// done. What the sender did.
pub(crate) fn flood_slow_reader(
    netns: &Path,
    tap: &Tap,
    frames: u64,
    linger: Duration,
) -> SendReport {
    Drive {
        netns,
        tap,
        sender: SenderConfig {
            batch: 1,
            ..SenderConfig::new(0, frames, Duration::from_secs(20))
        },
        reader: ReaderConfig {
            pps: Some(4_000),
            deadline: Duration::from_secs(30),
            max_packets: None,
        },
        queues: 1,
        linger,
    }
    .run()
    .unwrap()
    .sent
}

/// The kernel's facts, read as `watch` reads them.
pub(crate) fn kernel() -> KernelInfo {
    KernelInfo::load().expect("the kernel's facts")
}

/// Whether this kernel's tun stops `tap`'s queue instead of tail-dropping when its ring
/// fills under `qdisc`: decided by the kernel (TUNGETFEATURES, kallsyms) and the tap's own
/// flags, as the kernel keeps them. Without a qdisc there is nothing to push back into.
pub(crate) fn stops_instead_of_dropping(kernel: &KernelInfo, tap: &Tap, qdisc: RootQdisc) -> bool {
    let mode = kernel
        .tun_backpressure
        .expect("TUNGETFEATURES answers on /dev/net/tun");
    qdisc != RootQdisc::Noqueue && mode.of_tap(tap.tun_flags().expect("TUNGETIFF"))
}

/// Whether this kernel takes `IFF_BACKPRESSURE` (TUNGETFEATURES lists it).
pub(crate) fn has_backpressure_flag(kernel: &KernelInfo) -> bool {
    kernel.tun_backpressure == Some(TunBackpressure::OptIn)
}

/// As [`has_backpressure_flag`], asked of the kernel on its own
/// ([`KernelInfo::tun_backpressure_now`]): for a test that starts no probe of its own and
/// so needs neither BTF nor the tun/tap read path that [`kernel`] requires.
///
/// # Errors
/// When `/dev/net/tun` cannot be asked, or kallsyms cannot be read.
pub(crate) fn tun_has_backpressure() -> Result<bool> {
    Ok(KernelInfo::tun_backpressure_now()? == TunBackpressure::OptIn)
}

/// A watcher for each backend this kernel can run, all attached at once so they count the
/// same traffic, sampling the rings at every driver call and take (`Occupancy::Exact`), so
/// that the samples can be counted against the packets. Every backend the kernel has what it needs for must attach (one that fails
/// there fails the test): kprobes, and the tracepoints with `consume_skb`'s `location`
/// (6.3+). The others are skipped, visibly.
pub(crate) fn watchers(filter: &Filter) -> Vec<(Backend, Watcher)> {
    let kernel = kernel();
    let expected = Backend::available(&kernel);
    let mut all = Vec::new();
    for backend in [Backend::Tracepoint, Backend::Kprobe] {
        match Watcher::with_occupancy(&kernel, filter, backend, Occupancy::Exact) {
            Ok(w) => all.push((backend, w)),
            Err(err) if !expected.contains(&backend) => {
                Skip::part(format!("backend {backend:?}"), format!("{err:#}")).print();
            }
            Err(err) => panic!("backend {backend:?} does not attach on this kernel: {err:#}"),
        }
    }
    assert_eq!(
        all.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        expected,
        "every backend this kernel runs is attached, so they can be compared"
    );
    all
}

/// Why `watcher` samples no ring, as its sources say it, when it samples none: where the
/// kernel says nowhere where tun keeps its ring (no BTF for tun), a test says which of its
/// checks it could not make, in a line `cargo xtask test` lists (once per test).
pub(crate) fn ring_unsampled(watcher: &Watcher, said: &mut bool) -> bool {
    let sources = watcher.sources();
    if sources.ring_sampled() {
        return false;
    }
    if !std::mem::replace(said, true) {
        Skip::part("ring occupancy", sources.ring.to_string()).print();
    }
    true
}

/// Why `watcher`'s counts may be short, if they may: the kernel skipped runs of its
/// programs. A kprobe program does not run while another one runs on its CPU, e.g. when a
/// softirq drains a queue on an interrupt's exit inside the reader's kprobe program; a raw
/// tracepoint program does not run nested in itself, e.g. a softirq's `kfree_skb` inside a
/// process-context one. The kernel counts those (kprobes' own misses since 6.7) and the
/// backend's counts are then short, which a test says rather than hides: its exact checks
/// of that backend are gated off (see [`oracle::Gate`]).
pub(crate) fn short(watcher: &Watcher) -> Option<String> {
    let missed = watcher.missed_runs();
    if missed == 0 {
        return None;
    }
    let by_program: Vec<String> = watcher
        .missed()
        .iter()
        .filter(|p| p.total() > 0)
        .map(|p| {
            let runs = p.runs.unwrap_or(0);
            match p.kprobe {
                Some(hits) if hits > 0 => format!("{} {runs} runs, {hits} kprobe hits", p.program),
                _ => format!("{} {runs}", p.program),
            }
        })
        .collect();
    eprintln!(
        "the kernel skipped {missed} runs of the programs ({}): counts may be short",
        by_program.join(", ")
    );
    Some("the kernel skipped runs of its programs".to_owned())
}

/// As [`short`], for traffic the driver sees in a softirq that can interrupt the reader's
/// programs (a qdisc that releases packets from a timer, as netem does): a kprobe hit
/// nested in a kprobe handler runs nothing, and before Linux 6.7 the kernel does not say
/// so (seen on 6.1: 3 of 20,000 driver calls). A backend that counts through kprobes is
/// exact there only where the kernel reports their misses.
pub(crate) fn short_under_softirq(watcher: &Watcher) -> Option<String> {
    if watcher.kprobe_misses_unreported() {
        return Some(
            "counts through kprobes whose misses this kernel does not report, under softirq \
             traffic"
                .to_owned(),
        );
    }
    short(watcher)
}

/// Every backend counted the same traffic identically: every value both know, but the
/// times (two backends see a stop at slightly different instants). Where one backend's
/// source may miss some (`requeued_stopped` from dequeues, which cannot see a packet put
/// back from the qdisc's bypass; any count of a backend whose runs the kernel skipped, see
/// [`short`]) it may count fewer, never more: that bound is checked, the equality gated
/// off. A ring's level is sampled by each backend a moment apart, so its samples and its
/// level at rest are compared.
///
/// Where the kernel runs two backends, fewer than two rows fail: a comparison of one
/// backend with itself proves nothing.
pub(crate) fn assert_backends_agree(
    checks: &mut Checks,
    rows: &[(Backend, Row)],
    watchers: &[(Backend, Watcher)],
) {
    assert_eq!(
        rows.iter().map(|(b, _)| *b).collect::<Vec<_>>(),
        Backend::available(&kernel()),
        "rows of every backend this kernel runs"
    );
    let gate_of = |backend: Backend| {
        let (_, watcher) = watchers
            .iter()
            .find(|(b, _)| *b == backend)
            .expect("a watcher per row");
        Gate::of(backend, watcher)
    };
    let (base_backend, base) = &rows[0];
    let base_gate = gate_of(*base_backend);
    for (backend, row) in &rows[1..] {
        let own_gate = gate_of(*backend);
        let gate = own_gate.shut_by(&base_gate);
        for metric in METRICS.iter().filter(|m| m.unit != Unit::Nanoseconds) {
            let (a, b) = (row.value(metric), base.value(metric));
            if metric.requires == Requires::WakeSources
                && (a == Value::Missing || b == Value::Missing)
            {
                // Only the kprobe backend tells wakes apart; where both do, they agree.
                continue;
            }
            let what = format!(
                "{}: {backend:?} and {base_backend:?} saw the same traffic",
                metric.name
            );
            if !gate.is_open() {
                let at_most = |lossy: Value, full: Value| match (lossy, full) {
                    (Value::Count(x), Value::Count(y)) => x <= y,
                    (Value::Distribution(x), Value::Distribution(y)) => x.samples <= y.samples,
                    _ => true,
                };
                // One backend short: it counted at most what the other did. Both short
                // (each missed runs of its own programs): neither bounds the other, and
                // only the comparison gated off, with why, is left.
                if own_gate.is_open() || base_gate.is_open() {
                    let short_one_counted_less = if own_gate.is_open() {
                        at_most(b, a)
                    } else {
                        at_most(a, b)
                    };
                    checks.bound(
                        gate.backend(),
                        Oracle::OtherBackend,
                        short_one_counted_less,
                        format!("{what}: a short backend counted more: {a:?} vs {b:?}"),
                    );
                }
                checks.eq(&gate, Oracle::OtherBackend, a, b, &what);
                continue;
            }
            match (metric.name, a, b) {
                ("requeued_stopped", Value::Count(x), Value::Count(y)) => {
                    let (kprobe, tracepoint) = if *backend == Backend::Kprobe {
                        (x, y)
                    } else {
                        (y, x)
                    };
                    checks.that(
                        &gate,
                        Oracle::OtherBackend,
                        tracepoint <= kprobe,
                        format!("{what}: {a:?} vs {b:?}"),
                    );
                }
                (_, Value::Distribution(x), Value::Distribution(y))
                    if metric.kind == Kind::Distribution =>
                {
                    checks.eq(
                        &gate,
                        Oracle::OtherBackend,
                        x.samples,
                        y.samples,
                        format!("{what}: samples"),
                    );
                    checks.eq(
                        &gate,
                        Oracle::OtherBackend,
                        x.current,
                        y.current,
                        format!("{what}: level at rest"),
                    );
                }
                _ => checks.eq(&gate, Oracle::OtherBackend, a, b, &what),
            }
        }
    }
}

/// Has `command` start with SIGINT and SIGTERM at their default actions, as a shell starts a
/// command in the foreground. A test runner started as a background job (the shell ignores
/// SIGINT there) or under nohup passes its ignored signals on, and tap-probe keeps a signal
/// that was ignored at its start ignored (what nohup asks for): a test that stops a run with
/// one of them must not depend on how the runner was started.
pub(crate) fn stoppable(command: &mut std::process::Command) -> &mut std::process::Command {
    use std::os::unix::process::CommandExt as _;
    // SAFETY: between fork and exec only signal(2), which is async-signal-safe.
    unsafe {
        command.pre_exec(|| {
            for signal in [libc::SIGINT, libc::SIGTERM] {
                libc::signal(signal, libc::SIG_DFL);
            }
            Ok(())
        })
    }
}

/// Whether `status` is the end of a run that `signal` stopped in order: tap-probe undoes
/// what it made, finishes what it writes, then ends with that signal, so that its wait
/// status says why.
pub(crate) fn stopped_by(
    status: std::process::ExitStatus,
    signal: nix::sys::signal::Signal,
) -> bool {
    use std::os::unix::process::ExitStatusExt as _;
    status.signal() == Some(signal as i32)
}

/// How many times longer than on a real CPU a wait may take here: a guest under QEMU's TCG
/// (its kernel command line says `tap_probe.accel=tcg`) runs the kernel and the programs
/// emulated, ten to thirty times slower. Bounds on how long something takes to end are
/// scaled by it; what is counted never is.
pub(crate) fn slowdown() -> u32 {
    let cmdline = std::fs::read_to_string("/proc/cmdline").unwrap_or_default();
    if cmdline
        .split_whitespace()
        .any(|arg| arg == "tap_probe.accel=tcg")
    {
        10
    } else {
        1
    }
}
