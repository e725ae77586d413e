//! Every way a run can end ends it in order, within a bound, with an exit status that says
//! why, and leaves nothing behind: a terminal that closes under each view of `watch`
//! (compact, wide, JSON, full-screen), SIGINT, SIGTERM and SIGHUP in each view and in
//! `record`, `load`, `demo` and `check`, stdin at end of file from the start (systemd,
//! `nohup`), and `vm`, whose QEMU goes with it whatever ends it. After each run: none of its
//! processes runs (by PID, everything under it included), none of its BPF programs is loaded
//! or attached (bpf(2)), and no namespace, device or qdisc it made is left. Bad input
//! (`bad_input`) ends a run before it starts, and leaves nothing either.
mod bad_input;
mod leftovers;
mod run;

use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use nix::sys::signal::Signal;
use nix::sys::termios::LocalFlags;

use leftovers::{Held, Host};
use run::{Io, Run, Start};

use crate::common;
use crate::common::stopped_by;
use tap_probe_verdict::Skip;

/// How the tests here begin: without root, nothing (the test returns); with it, the test
/// process made the subreaper of everything it starts, and the host as it was before.
fn host_before_as_root() -> Option<Host> {
    if !tap_probe_verdict::root() {
        return None;
    }
    leftovers::subreaper();
    Some(Host::now())
}

/// How soon a run must end once told to: the bound the users were promised, for a run
/// under load on a real CPU (scaled where the CPU is emulated).
fn promptly() -> Duration {
    Duration::from_secs(2) * common::slowdown()
}

/// How long a command may take to get under way (attach, set up its namespace).
fn under_way() -> Duration {
    Duration::from_secs(30) * common::slowdown()
}

/// The signals a user or the system stops a run with.
const SIGNALS: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// `watch`'s views, by their options.
const VIEWS: [(&str, &[&str]); 4] = [
    ("compact", &[]),
    ("wide", &["--wide"]),
    ("json", &["--format", "json"]),
    ("tui", &["--tui"]),
];

fn args(args: &[&str]) -> Vec<String> {
    args.iter().map(|&a| a.to_owned()).collect()
}

/// Packets per second for a load, and for its reader (a slow VM: the ring fills).
fn rates() -> (String, String) {
    let slowdown = u64::from(common::slowdown());
    (
        (20_000 / slowdown).to_string(),
        (5_000 / slowdown).to_string(),
    )
}

/// `tap-probe load` on a tap whose ring tail-drops, long enough to outlast the test.
fn start_load(name: &str) -> Run {
    let (pps, reader_pps) = rates();
    Run::start(
        name,
        &args(&[
            "load",
            "--duration",
            "120",
            "--pps",
            &pps,
            "--reader-pps",
            &reader_pps,
            "--tx-queue-len",
            "100",
            "--qdisc",
            "noqueue",
            "--format",
            "json",
        ]),
        Io::Pipes,
        Start::default(),
    )
}

/// [`start_load`], once the load is under way (its namespace made); that namespace.
fn load_under_way(name: &str) -> (Run, String) {
    let load = start_load(name);
    let netns = netns_of(&load);
    wait_until(under_way(), "the load's namespace", || netns_exists(&netns));
    (load, netns)
}

/// The namespace a run of `load`, `demo` or `check` makes (its first).
fn netns_of(run: &Run) -> String {
    format!("tap-probe-load-{}", run.pid())
}

/// Waits for `run` to end, within [`promptly`], and checks that `signal` ended it; how long
/// it took.
fn ends_promptly_by(run: &mut Run, signal: Signal) -> Duration {
    let (status, took) = run.exit_within(promptly());
    assert!(
        stopped_by(status, signal),
        "{}: {status:?}\n{}",
        run.name,
        run.said()
    );
    took
}

/// Waits, bounded, until `done` holds.
fn wait_until(within: Duration, what: &str, done: impl Fn() -> bool) {
    let deadline = Instant::now() + within;
    while !done() {
        assert!(Instant::now() < deadline, "not {what} within {within:?}");
        std::thread::sleep(Duration::from_millis(50));
    }
}

fn netns_exists(name: &str) -> bool {
    Path::new("/run/netns").join(name).exists()
}

/// `watch` on the load's tap in `view`.
fn watch(view: &[&str], netns: &str) -> Vec<String> {
    let mut watch = args(&[
        "watch",
        "--dev",
        "tp-load0",
        "--netns",
        netns,
        "--interval",
        "0.2",
        "--duration",
        "120",
    ]);
    watch.extend(args(view));
    watch
}

/// Waits until each run shows the load's tap, then reads what each holds.
fn frames(runs: &mut [Run]) -> Vec<Held> {
    runs.iter_mut()
        .map(|run| {
            run.wait_for(under_way(), "showing the load's tap", |out, _| {
                out.contains("tp-load0")
            });
            let held = Held::of(run.pid());
            assert!(
                !held.programs.is_empty() && !held.links.is_empty(),
                "{} holds no BPF program or link: the checks after it would prove nothing",
                run.name
            );
            held
        })
        .collect()
}

/// The JSON objects among the lines of `text` (a terminal's end their lines with `\r`).
fn json_lines(text: &str) -> Vec<serde_json::Value> {
    text.lines()
        .filter_map(|l| serde_json::from_str(l.trim_end_matches('\r')).ok())
        .collect()
}

/// Stops the load with `signal` and checks it ended in order: its report of the traffic
/// so far, marked interrupted, its namespace removed.
fn stop_load(mut load: Run, signal: Signal) {
    let netns = netns_of(&load);
    let held = Held::of(load.pid());
    load.signal(signal);
    let took = ends_promptly_by(&mut load, signal);
    let report = json_lines(&load.output())
        .pop()
        .unwrap_or_else(|| panic!("{}", load.said()));
    assert_eq!(report["interrupted"], true, "{report}");
    assert!(load.errors().contains("cut short"), "{}", load.said());
    assert!(!netns_exists(&netns), "{netns} left behind");
    held.assert_gone(&load.name);
    eprintln!("{} ended {took:?} after {signal}", load.name);
}

#[test]
fn every_view_ends_within_2s_when_its_terminal_closes_under_load() {
    let Some(host) = host_before_as_root() else {
        return;
    };
    let (load, netns) = load_under_way("load");
    // The terminal is no controlling terminal of these: nothing sends them SIGHUP, only
    // reads and writes tell them it went away. The last one leads a session on it, as a
    // shell's job in a terminal window does, and gets SIGHUP from the kernel too.
    let mut runs: Vec<Run> = VIEWS
        .iter()
        .map(|(view, options)| {
            Run::start(
                view,
                &watch(options, &netns),
                Io::Pty { controlling: false },
                Start::default(),
            )
        })
        .collect();
    runs.push(Run::start(
        "tui, its controlling terminal",
        &watch(&["--tui"], &netns),
        Io::Pty { controlling: true },
        Start::default(),
    ));
    let held = frames(&mut runs);
    for run in &mut runs {
        run.hang_up();
    }
    for (run, held) in runs.iter_mut().zip(&held) {
        // A terminal gone ends the run as the SIGHUP it is.
        let took = ends_promptly_by(run, Signal::SIGHUP);
        held.assert_gone(&run.name);
        eprintln!("{} ended {took:?} after its terminal closed", run.name);
    }
    stop_load(load, Signal::SIGINT);
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("the views and the load");
}

#[test]
fn every_view_stops_in_order_on_sigint_sigterm_and_sighup() {
    let Some(host) = host_before_as_root() else {
        return;
    };
    let (load, netns) = load_under_way("load");
    for signal in SIGNALS {
        let mut runs: Vec<Run> = VIEWS
            .iter()
            .map(|(view, options)| {
                Run::start(
                    &format!("{view} ({signal})"),
                    &watch(options, &netns),
                    Io::Pty { controlling: false },
                    Start::default(),
                )
            })
            .collect();
        let held = frames(&mut runs);
        for run in &mut runs {
            run.signal(signal);
        }
        for ((run, held), (view, _)) in runs.iter_mut().zip(&held).zip(VIEWS) {
            let took = ends_promptly_by(run, signal);
            // The terminal lives on (SIGHUP from `kill`): the run ends what it writes there.
            let out = run.output();
            match view {
                "json" => {
                    let last = json_lines(&out)
                        .pop()
                        .unwrap_or_else(|| panic!("{}", run.said()));
                    assert_eq!(last["final"], true, "{}", run.said());
                }
                "tui" => {
                    let left = out
                        .rfind("\x1b[?1049l")
                        .unwrap_or_else(|| panic!("left the alternate screen:\n{}", run.said()));
                    assert!(
                        out[left..].contains("Final counters after"),
                        "{}",
                        run.said()
                    );
                    let modes = run.termios().local_flags;
                    assert!(
                        modes.contains(LocalFlags::ICANON | LocalFlags::ECHO),
                        "{modes:?}"
                    );
                }
                _ => assert!(out.contains("Final counters after"), "{}", run.said()),
            }
            assert!(!out.contains("panicked"), "{}", run.said());
            held.assert_gone(&run.name);
            eprintln!("{} ended {took:?} after {signal}", run.name);
        }
    }
    stop_load(load, Signal::SIGTERM);
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("the views and the load");
}

/// Two long scenarios: the first is under way when the stop comes, the second never runs.
const SPEC: &str = r#"
[[scenario]]
name = "first"
qdisc = "pfifo-fast"
duration = "120s"
pps = PPS
reader_pps = READER_PPS
expect = ["xmit_calls >= 0"]

[[scenario]]
name = "second"
qdisc = "pfifo-fast"
duration = "120s"
expect = ["xmit_calls >= 0"]
"#;

/// `record` on the traffic's tap, and `load`, `demo` and `check` each with a tap of its own,
/// started side by side for one signal.
struct Commands {
    record: Run,
    load: Run,
    demo: Run,
    check: Run,
    trace: PathBuf,
    junit: PathBuf,
}

impl Commands {
    fn start(signal: Signal, dir: &Path, spec: &str, traffic: &str) -> Self {
        let (pps, reader_pps) = rates();
        let trace = dir.join(format!("{signal}.trace"));
        let junit = dir.join(format!("{signal}.xml"));
        let pipes = |name: &str, command: &[&str]| {
            Run::start(
                &format!("{name} ({signal})"),
                &args(command),
                Io::Pipes,
                Start::default(),
            )
        };
        Self {
            record: pipes(
                "record",
                &[
                    "record",
                    "-o",
                    trace.to_str().unwrap(),
                    "--dev",
                    "tp-load0",
                    "--netns",
                    traffic,
                ],
            ),
            load: start_load(&format!("load ({signal})")),
            demo: pipes(
                "demo",
                &[
                    "demo",
                    "--duration",
                    "120",
                    "--format",
                    "json",
                    "--interval",
                    "0.2",
                    "--pps",
                    &pps,
                    "--reader-pps",
                    &reader_pps,
                ],
            ),
            check: pipes(
                "check",
                &[
                    "check",
                    spec,
                    "--junit",
                    junit.to_str().unwrap(),
                    "--format",
                    "json",
                ],
            ),
            trace,
            junit,
        }
    }

    fn all(&mut self) -> [&mut Run; 4] {
        [
            &mut self.record,
            &mut self.load,
            &mut self.demo,
            &mut self.check,
        ]
    }

    /// Waits until each is under way: recording, showing its tap, its namespace made; then
    /// a moment of traffic.
    fn under_way(&mut self) {
        self.record.wait_for(under_way(), "recording", |_, err| {
            err.contains("recording tp-load0")
        });
        self.demo
            .wait_for(under_way(), "showing its tap", |out, _| {
                out.contains("tp-load0")
            });
        for run in [&self.load, &self.check] {
            let netns = netns_of(run);
            wait_until(under_way(), &format!("{}'s namespace", run.name), || {
                netns_exists(&netns)
            });
        }
        std::thread::sleep(Duration::from_millis(500) * common::slowdown());
    }

    /// What each was writing, finished: the trace with its trailer, the load's report of
    /// the traffic so far, the demo's final object, the check's report and `JUnit` file, with
    /// the scenario cut short and the one not run.
    fn assert_finished(&self) {
        let (record, load, demo, check) = (&self.record, &self.load, &self.demo, &self.check);
        let recording = tap_probe_replay::load_recording(std::fs::File::open(&self.trace).unwrap())
            .unwrap_or_else(|err| panic!("the trace is not complete: {err:#}\n{}", record.said()));
        assert!(recording.trailer.events > 0, "{}", record.said());
        assert!(record.errors().contains("recorded "), "{}", record.said());
        let report = json_lines(&load.output())
            .pop()
            .unwrap_or_else(|| panic!("{}", load.said()));
        assert_eq!(report["interrupted"], true, "{}", load.said());
        assert!(load.errors().contains("cut short"), "{}", load.said());
        let last = json_lines(&demo.output())
            .pop()
            .unwrap_or_else(|| panic!("{}", demo.said()));
        assert_eq!(last["final"], true, "{}", demo.said());
        assert!(last["load"]["sent"].as_u64() > Some(0), "{}", demo.said());
        assert!(demo.errors().contains("cut short"), "{}", demo.said());
        let report: serde_json::Value = serde_json::from_str(&check.output())
            .unwrap_or_else(|err| panic!("{err}: {}", check.said()));
        let scenarios = report["scenarios"].as_array().unwrap();
        assert_eq!(scenarios[0]["error"], "interrupted", "{report}");
        let second = scenarios[1]["error"].as_str().unwrap_or_default();
        assert!(
            second.starts_with("not run, the check was stopped"),
            "{report}"
        );
        let junit = std::fs::read_to_string(&self.junit).unwrap();
        assert!(junit.contains("not run, the check was stopped"), "{junit}");
    }

    /// The check's report states the status the process ended with: the signal's.
    fn assert_check_states(&self, signal: Signal) {
        let report: serde_json::Value = serde_json::from_str(&self.check.output()).unwrap();
        assert_eq!(report["exit_code"], 128 + signal as i32, "{report}");
        assert_eq!(report["stopped_by"], signal.as_str(), "{report}");
    }
}

#[test]
fn record_load_demo_and_check_stop_in_order_on_each_signal() {
    let Some(host) = host_before_as_root() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (pps, reader_pps) = rates();
    let spec = dir.path().join("lab.toml");
    std::fs::write(
        &spec,
        SPEC.replace("READER_PPS", &reader_pps).replace("PPS", &pps),
    )
    .unwrap();
    // What `record` records.
    let (traffic, netns) = load_under_way("traffic");
    for signal in SIGNALS {
        let mut commands = Commands::start(signal, dir.path(), spec.to_str().unwrap(), &netns);
        commands.under_way();
        let held = commands.all().map(|run| Held::of(run.pid()));
        for (run, held) in commands.all().iter().zip(&held) {
            // `load` attaches nothing; the others must, or the check after proves nothing.
            assert!(
                run.name.starts_with("load") || !held.programs.is_empty(),
                "{} holds no program: {held:?}",
                run.name
            );
        }
        let namespaces = [&commands.load, &commands.demo, &commands.check].map(netns_of);
        for run in commands.all() {
            run.signal(signal);
        }
        for (run, held) in commands.all().into_iter().zip(&held) {
            let took = ends_promptly_by(run, signal);
            assert!(!run.errors().contains("panicked"), "{}", run.said());
            held.assert_gone(&run.name);
            eprintln!("{} ended {took:?} after {signal}", run.name);
        }
        for netns in namespaces {
            assert!(!netns_exists(&netns), "{netns} left behind");
        }
        commands.assert_finished();
        commands.assert_check_states(signal);
    }
    stop_load(traffic, Signal::SIGTERM);
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("record, load, demo and check");
}

/// `check` stopped by SIGTERM in its table view: its summary's last line states the status
/// the process ends with, 143 as a shell shows it (not the 2 of a problem of the spec or
/// the kernel), and the process does end with SIGTERM, leaving nothing behind.
#[test]
fn a_stopped_check_states_the_status_it_ends_with() {
    let Some(host) = host_before_as_root() else {
        return;
    };
    let dir = tempfile::tempdir().unwrap();
    let (pps, reader_pps) = rates();
    let spec = dir.path().join("lab.toml");
    std::fs::write(
        &spec,
        SPEC.replace("READER_PPS", &reader_pps).replace("PPS", &pps),
    )
    .unwrap();
    let mut check = Run::start(
        "check (table)",
        &args(&["check", spec.to_str().unwrap()]),
        Io::Pipes,
        Start::default(),
    );
    let netns = netns_of(&check);
    wait_until(under_way(), "the check's namespace", || {
        netns_exists(&netns)
    });
    let pid = check.pid();
    wait_until(under_way(), "the check's probes attached", || {
        !Held::of(pid).programs.is_empty()
    });
    let held = Held::of(pid);
    check.signal(Signal::SIGTERM);
    ends_promptly_by(&mut check, Signal::SIGTERM);
    held.assert_gone(&check.name);
    let out = check.output();
    let last = out.lines().last().unwrap_or_default();
    assert_eq!(
        last,
        "2 scenarios: 0 passed, 0 failed, 2 errors (stopped by SIGTERM: exit 143)",
        "{}",
        check.said()
    );
    assert!(!check.errors().contains("panicked"), "{}", check.said());
    assert!(!netns_exists(&netns), "{netns} left behind");
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("check");
}

/// CPU time (user and system, all threads) of `pid` so far, in clock ticks (1/100 s).
fn cpu_ticks(pid: u32) -> u64 {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
    let fields: Vec<u64> = stat
        .rsplit_once(')')
        .unwrap()
        .1
        .split_whitespace()
        .filter_map(|f| f.parse().ok())
        .collect();
    // utime and stime are fields 14 and 15; after the name, the state (not a number) is
    // left out, so they are the 11th and 12th numbers.
    fields[10] + fields[11]
}

#[test]
fn with_stdin_at_end_of_file_from_the_start_nothing_spins_and_nohup_holds() {
    let Some(host) = host_before_as_root() else {
        return;
    };
    let quiet = &["--wait", "--dev", "tp-none0"];
    // As under systemd, and nohup (SIGHUP ignored): stdin at end of file, pipes out.
    let mut watch = Run::start(
        "json, stdin at end of file, SIGHUP ignored",
        &args(
            &[
                &[
                    "watch",
                    "--format",
                    "json",
                    "--interval",
                    "10",
                    "--duration",
                    "120",
                ],
                &quiet[..],
            ]
            .concat(),
        ),
        Io::Pipes,
        Start {
            sighup_ignored: true,
        },
    );
    watch.wait_for(under_way(), "its first refresh", |out, _| {
        out.contains("\"final\":false")
    });
    let held = Held::of(watch.pid());
    // Between two refreshes 10 s apart there is nothing to do: a loop reading stdin's end
    // of file would burn a CPU (100 ticks a second).
    std::thread::sleep(Duration::from_millis(500));
    let before = cpu_ticks(watch.pid());
    std::thread::sleep(Duration::from_secs(2));
    let spent = cpu_ticks(watch.pid()) - before;
    assert!(
        spent <= 20,
        "{spent} ticks of CPU in 2 s of waiting: it spins\n{}",
        watch.said()
    );
    // nohup's SIGHUP is ignored; SIGTERM still stops it.
    watch.signal(Signal::SIGHUP);
    std::thread::sleep(Duration::from_secs(1));
    assert!(
        watch.running(),
        "SIGHUP ended it under nohup:\n{}",
        watch.said()
    );
    watch.signal(Signal::SIGTERM);
    ends_promptly_by(&mut watch, Signal::SIGTERM);
    assert_eq!(json_lines(&watch.output()).pop().unwrap()["final"], true);
    held.assert_gone(&watch.name);

    // The full-screen view reads keys from the terminal: with stdin at end of file it takes
    // them from its controlling terminal, and without one it says so before attaching.
    let tui = |name: &str, controlling: bool| {
        Run::start(
            name,
            &args(&[&["watch", "--tui", "--interval", "0.2"], &quiet[..]].concat()),
            Io::PtyOutput { controlling },
            Start::default(),
        )
    };
    let mut orphan = tui("tui, stdin at end of file, no controlling terminal", false);
    let (status, _) = orphan.exit_within(under_way());
    assert_eq!(status.code(), Some(1), "{}", orphan.said());
    assert!(
        orphan.output().contains("reads its keys from the terminal"),
        "{}",
        orphan.said()
    );
    let mut keyed = tui("tui, stdin at end of file, keys from /dev/tty", true);
    keyed.wait_for(under_way(), "drawn", |out, _| {
        out.contains("tap-probe watch")
    });
    let held = Held::of(keyed.pid());
    keyed.type_keys(b"q");
    let (status, _) = keyed.exit_within(promptly());
    assert!(status.success(), "q quits: {status:?}\n{}", keyed.said());
    held.assert_gone(&keyed.name);
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("watch with stdin at end of file");
}

#[test]
fn vm_takes_its_guest_down_whatever_ends_it() {
    if !tap_probe_verdict::root() {
        return;
    }
    let qemu = tap_probe_guest::qemu::QEMU;
    if std::process::Command::new(qemu)
        .arg("--version")
        .output()
        .is_err()
    {
        Skip::test(format!("{qemu} is not here: vm cannot boot a guest")).print();
        return;
    }
    leftovers::subreaper();
    let host = Host::now();
    let cache = tap_probe_guest::cache_dir().unwrap();
    // One boot per signal, one after the other (an emulated guest takes a whole CPU): the
    // three `vm` handles, and SIGKILL, which it cannot: the kernel ends QEMU then (its
    // parent-death signal).
    for signal in SIGNALS.into_iter().chain([Signal::SIGKILL]) {
        let mut run = Run::start(
            &format!("vm ({signal})"),
            &args(&[
                "vm",
                "--kernel",
                "debian-6.1",
                "--accel",
                "tcg",
                "--cpus",
                "1",
                "--memory",
                "1024",
                "--",
                "watch",
                "--wait",
                "--dev",
                "tp-none0",
                "--format",
                "json",
                "--interval",
                "0.5",
            ]),
            Io::Pipes,
            Start::default(),
        );
        // The guest's command has written to the host's stdout: the partial output to keep.
        run.wait_for(
            Duration::from_mins(5),
            "the guest's first refresh",
            |out, _| out.contains("\"final\":false"),
        );
        let held = Held::of(run.pid());
        assert!(held.has(qemu), "{} runs no QEMU: {held:?}", run.name);
        let work = cache.join("vm").join(format!("run-{}", run.pid()));
        assert!(work.exists(), "{}", work.display());
        let refreshes = json_lines(&run.output()).len();
        run.signal(signal);
        let took = ends_promptly_by(&mut run, signal);
        // QEMU, and anything else it ran, is gone; what the guest said is not.
        held.assert_gone(&run.name);
        assert!(
            json_lines(&run.output()).len() >= refreshes,
            "{}",
            run.said()
        );
        if signal == Signal::SIGKILL {
            // Nothing can clean up after SIGKILL but the kernel: QEMU it ends, the guest's
            // working files stay.
            std::fs::remove_dir_all(&work).unwrap();
        } else {
            assert!(run.errors().contains("was stopped after"), "{}", run.said());
            assert!(run.errors().contains("QEMU killed"), "{}", run.said());
            assert!(!work.exists(), "{} left behind", work.display());
        }
        eprintln!("{} ended {took:?} after {signal}", run.name);
    }
    leftovers::assert_no_strays(&[]);
    host.assert_nothing_added("vm");
}
