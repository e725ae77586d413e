//! `tap-probe record` when things go wrong: a load it cannot keep up with, a stop signal
//! during it, a kill, a full disk. The file must end at a whole record, say what it lacks,
//! and the recorder must stop when told.

use std::io::{BufRead as _, BufReader};
use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, mpsc};
use std::time::{Duration, Instant};

use tap_probe_lab::lab::{Drive, ReaderConfig, SenderConfig};
use tap_probe_observer::os::netlink::RootQdisc;
use tap_probe_observer::os::netns::run_in;
use tap_probe_observer::os::tap::{Tap, TapOptions};

use crate::common;
use crate::common::BIN;
use crate::common::running::ChildGuard;

/// A running `tap-probe record`: the process, the thread that collects what it prints on
/// stderr, and a channel that carries `()` once it printed its summary (its file is then
/// complete, and only its exit is left).
struct Recorder {
    guard: ChildGuard,
    stderr: std::thread::JoinHandle<String>,
    summary: mpsc::Receiver<()>,
}

/// Starts `tap-probe record` on `dev` in `netns`, writing `trace`, with `extra` arguments,
/// and waits until it has attached ("recording ..." on stderr).
fn start_recorder(trace: &Path, netns: &str, dev: &str, extra: &[&str]) -> Recorder {
    let mut child = common::stoppable(&mut Command::new(BIN))
        .args(["record", "-o"])
        .arg(trace)
        .args(["--dev", dev, "--netns", netns])
        .args(extra)
        .stdin(Stdio::null())
        .stderr(Stdio::piped())
        .spawn()
        .unwrap();
    let stderr = child.stderr.take().unwrap();
    let (started, attached) = mpsc::channel();
    let (summed_up, summary) = mpsc::channel();
    let stderr = std::thread::spawn(move || {
        let mut all = String::new();
        for line in BufReader::new(stderr).lines() {
            let line = line.unwrap_or_default();
            if line.starts_with("recording ") {
                let _ = started.send(());
            }
            if line.starts_with("recorded ") {
                let _ = summed_up.send(());
            }
            all.push_str(&line);
            all.push('\n');
        }
        all
    });
    let guard = ChildGuard(Some(child));
    if attached.recv_timeout(Duration::from_mins(1)).is_err() {
        drop(guard);
        panic!("the recorder did not start: {}", stderr.join().unwrap());
    }
    Recorder {
        guard,
        stderr,
        summary,
    }
}

/// Moves every thread of `pid` to CPU 0 at the lowest priority, where the test's sender runs
/// at normal priority: it then gets far less CPU than draining the events takes.
fn starve(pid: u32) {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    for task in std::fs::read_dir(format!("/proc/{pid}/task")).unwrap() {
        let tid: i32 = task.unwrap().file_name().to_str().unwrap().parse().unwrap();
        nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set).unwrap();
        // SAFETY: plain setpriority(2) on a thread id.
        let rc = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid.cast_unsigned(), 19) };
        assert_eq!(rc, 0, "{}", std::io::Error::last_os_error());
    }
}

/// Undoes [`starve`]: every CPU, normal priority.
fn unstarve(pid: u32) {
    let mut set = nix::sched::CpuSet::new();
    for cpu in 0..nix::sched::CpuSet::count() {
        // Past the machine's CPUs the set refuses nothing; the kernel ignores them.
        let _ = set.set(cpu);
    }
    for task in std::fs::read_dir(format!("/proc/{pid}/task"))
        .into_iter()
        .flatten()
    {
        let Some(tid) = task
            .ok()
            .and_then(|t| t.file_name().to_str().and_then(|t| t.parse::<i32>().ok()))
        else {
            continue;
        };
        // A thread (or the whole process) that ended meanwhile is no error.
        let _ = nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(tid), &set);
        // SAFETY: plain setpriority(2) on a thread id.
        let _ = unsafe { libc::setpriority(libc::PRIO_PROCESS, tid.cast_unsigned(), 0) };
    }
}

/// Pins the calling thread (and the threads it starts) to CPU 0.
fn pin_to_cpu0() {
    let mut set = nix::sched::CpuSet::new();
    set.set(0).unwrap();
    nix::sched::sched_setaffinity(nix::unistd::Pid::from_raw(0), &set).unwrap();
}

/// Waits, starved, at most `limit` for the starved recorder to finish its file (its
/// summary); then lets it have the CPU it wants and waits, at most [`EXIT`], for it to
/// exit. Its exit status, or what it had not done in time.
fn wait_for_end(
    recorder: &mut Recorder,
    limit: Duration,
) -> Result<std::process::ExitStatus, String> {
    let waited = Instant::now();
    match recorder.summary.recv_timeout(limit) {
        // Disconnected: it closed stderr, so it ended without a summary (an error).
        Ok(()) | Err(mpsc::RecvTimeoutError::Disconnected) => {}
        Err(mpsc::RecvTimeoutError::Timeout) => {
            return Err(format!(
                "no summary {limit:?} after the stop: still recording"
            ));
        }
    }
    let summed_up = waited.elapsed();
    if let Some(child) = &recorder.guard.0 {
        unstarve(child.id());
    }
    recorder
        .guard
        .wait_within(EXIT * common::slowdown())
        .ok_or_else(|| {
            format!("summary {summed_up:?} after the stop, but no exit {EXIT:?} after that")
        })
}

/// Starts a recorder on a fresh tap with `extra` arguments, starves it once it has attached,
/// and floods the tap (a fast reader takes what the ring holds) for `seconds`, while
/// `during` runs on another thread with the recorder and returns what it measured.
fn recorder_under_flood<T: Send>(
    tag: &str,
    trace: &Path,
    extra: &[&str],
    seconds: u64,
    during: impl FnOnce(&mut Recorder) -> T + Send,
) -> (T, String) {
    let ns = common::quiet_netns(tag).unwrap();
    let dev = format!("tpf{}", std::process::id() % 10_000);
    let tap = common::tap_in(&ns, &dev, RootQdisc::Noqueue).unwrap();
    let mut recorder = start_recorder(trace, ns.name(), &dev, extra);
    starve(recorder.guard.0.as_ref().unwrap().id());
    // Set once `during` is done: the flood has no more to prove.
    let flooded = Arc::new(AtomicBool::new(false));
    let measured = std::thread::scope(|s| {
        let measure = s.spawn(|| {
            // Let the flood fill the event ring first.
            std::thread::sleep(Duration::from_millis(300));
            let measured = during(&mut recorder);
            flooded.store(true, Ordering::Relaxed);
            measured
        });
        pin_to_cpu0();
        Drive {
            netns: ns.path(),
            tap: &tap,
            sender: SenderConfig {
                stop: Some(Arc::clone(&flooded)),
                ..SenderConfig::new(0, u64::MAX, Duration::from_secs(seconds))
            },
            reader: ReaderConfig {
                pps: None,
                deadline: Duration::from_secs(seconds + 5),
                max_packets: None,
            },
            queues: 1,
            linger: Duration::ZERO,
        }
        .run()
        .unwrap();
        measure.join().unwrap()
    });
    drop(recorder.guard);
    (measured, recorder.stderr.join().unwrap())
}

/// How long the recorder, starved, may take past its deadline or signal to finish its file
/// (its summary). Starved as [`starve`] does, it gets about 1/70 of one CPU (nice 19 beside
/// the sender's nice 0), and its end is bounded work done that slowly: the last second of
/// draining, counting what is left in the kernel's ring (some 400,000 events), syncing the
/// file, one scan of the devices. That took 2.6 to 3.3 s on an idle 2-CPU machine. What
/// the tests tell apart is a recorder that ends on its own from one that drains until the
/// ring runs dry, which ends only with the flood: the flood lasts twice the bound.
fn grace() -> Duration {
    Duration::from_secs(20) * common::slowdown()
}

/// How long the recorder may take to exit once it printed its summary and has the CPU again.
const EXIT: Duration = Duration::from_secs(10);

/// How long the flood may last: twice what the recorder may take; it ends as soon as the
/// recorder's end is measured.
fn flood_secs() -> u64 {
    2 * (3 + grace().as_secs() + EXIT.as_secs() * u64::from(common::slowdown()))
}

#[test]
fn record_honours_duration_under_a_load_it_cannot_keep_up_with() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("flood.trace");
    let (status, log) = recorder_under_flood(
        "rdur",
        &trace,
        &["--duration", "3"],
        flood_secs(),
        |recorder| {
            // The duration runs from the "recording" line, 300 ms before this.
            wait_for_end(recorder, Duration::from_secs(3) + grace())
        },
    );
    eprintln!("{log}");
    let status = status
        .unwrap_or_else(|why| panic!("record --duration 3 under load did not end: {why}:\n{log}"));
    assert!(status.success(), "{status}\n{log}");
    let rec = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    assert!(rec.trailer.events > 0, "{log}");
}

#[test]
fn record_honours_sigterm_under_a_load_it_cannot_keep_up_with() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("flood.trace");
    let (status, log) = recorder_under_flood("rterm", &trace, &[], flood_secs(), |recorder| {
        std::thread::sleep(Duration::from_secs(2));
        let pid = recorder.guard.0.as_ref().unwrap().id();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(pid).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        wait_for_end(recorder, grace())
    });
    eprintln!("{log}");
    let status = status
        .unwrap_or_else(|why| panic!("record under load did not end on SIGTERM: {why}:\n{log}"));
    assert!(
        common::stopped_by(status, nix::sys::signal::Signal::SIGTERM),
        "{status}\n{log}"
    );
    let rec = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    assert!(rec.trailer.events > 0, "{log}");
}

/// Paced traffic through a fresh tap with a reader, while `during` runs on another thread.
fn with_traffic<T: Send>(tag: &str, during: impl FnOnce(&str, &str) -> T + Send) -> T {
    let ns = common::quiet_netns(tag).unwrap();
    let dev = format!("tpk{}", std::process::id() % 10_000);
    let tap = common::tap_in(&ns, &dev, RootQdisc::Noqueue).unwrap();
    let stop = std::sync::atomic::AtomicBool::new(false);
    std::thread::scope(|s| {
        let traffic = s.spawn(|| {
            // Bounded: at most 60 s, or until the test is done.
            let deadline = Instant::now() + Duration::from_mins(1);
            while !stop.load(std::sync::atomic::Ordering::Relaxed) && Instant::now() < deadline {
                Drive {
                    netns: ns.path(),
                    tap: &tap,
                    sender: SenderConfig {
                        pps: Some(20_000),
                        ..SenderConfig::new(0, 10_000, Duration::from_secs(2))
                    },
                    reader: ReaderConfig {
                        pps: None,
                        deadline: Duration::from_secs(3),
                        max_packets: None,
                    },
                    queues: 1,
                    linger: Duration::ZERO,
                }
                .run()
                .unwrap();
                tap.set_nonblocking(false).unwrap();
            }
        });
        let out = during(ns.name(), &dev);
        stop.store(true, std::sync::atomic::Ordering::Relaxed);
        traffic.join().unwrap();
        out
    })
}

/// A recorder killed outright leaves a file without a trailer: refused as it is, read up to
/// its last whole record with `--salvage`, which says what is missing.
#[test]
fn a_killed_recording_is_salvaged() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("killed.trace");
    let log = with_traffic("rkill", |netns, dev| {
        let Recorder {
            mut guard, stderr, ..
        } = start_recorder(&trace, netns, dev, &[]);
        std::thread::sleep(Duration::from_secs(2));
        let child = guard.0.as_mut().unwrap();
        child.kill().unwrap();
        child.wait().unwrap();
        guard.0 = None;
        stderr.join().unwrap()
    });
    let size = std::fs::metadata(&trace).unwrap().len();
    assert!(
        size > 64 << 10,
        "the recorder wrote something: {size} bytes\n{log}"
    );
    let strict = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap());
    assert!(strict.is_err(), "a killed recording has no trailer");
    let rec = tap_probe_replay::salvage_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    let cut = rec.cut.expect("the salvage says where the file was cut");
    assert!(cut.events > 0, "{log}");
    assert!(
        cut.offset <= size && size - cut.offset < 64,
        "{cut:?} of {size} bytes"
    );
    let events: u64 = rec.streams.iter().map(|s| s.ops.times.len() as u64).sum();
    assert!(events > 0);
    let out = Command::new(BIN)
        .args(["replay", "--salvage"])
        .arg(&trace)
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(stderr.contains("was cut short"), "{stderr}");
}

/// A process holding a private mount namespace in which `dir` is a tmpfs of `bytes`: the
/// host never sees the mount, and it goes away with the process.
struct SmallDisk(Child);

impl SmallDisk {
    fn mount(dir: &Path, bytes: usize) -> Self {
        use std::os::unix::process::CommandExt as _;
        let dir = dir.to_owned();
        let mut cmd = Command::new("sleep");
        cmd.arg("120").stdin(Stdio::null());
        // SAFETY: between fork and exec only unshare(2) and mount(2).
        unsafe {
            cmd.pre_exec(move || {
                use nix::mount::{MsFlags, mount};
                nix::sched::unshare(nix::sched::CloneFlags::CLONE_NEWNS)?;
                mount(
                    None::<&str>,
                    "/",
                    None::<&str>,
                    MsFlags::MS_REC | MsFlags::MS_PRIVATE,
                    None::<&str>,
                )?;
                mount(
                    Some("tmpfs"),
                    &dir,
                    Some("tmpfs"),
                    MsFlags::empty(),
                    Some(format!("size={bytes}").as_str()),
                )?;
                Ok(())
            });
        }
        Self(common::stoppable(&mut cmd).spawn().unwrap())
    }

    /// `path` as the holder sees it.
    fn path(&self, path: &Path) -> std::path::PathBuf {
        Path::new(&format!("/proc/{}/root", self.0.id())).join(path.strip_prefix("/").unwrap())
    }

    /// Runs `cmd` in the holder's mount namespace.
    fn enter(&self, cmd: &mut Command) {
        use std::os::unix::process::CommandExt as _;
        let ns = std::fs::File::open(format!("/proc/{}/ns/mnt", self.0.id())).unwrap();
        // SAFETY: between fork and exec only setns(2).
        unsafe {
            cmd.pre_exec(move || {
                nix::sched::setns(&ns, nix::sched::CloneFlags::CLONE_NEWNS)?;
                Ok(())
            });
        }
    }
}

impl Drop for SmallDisk {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

/// A disk that fills up: the recorder names the file, stops, and ends the file at a whole
/// record with the loss stated; nothing stays attached.
#[test]
fn a_full_disk_ends_the_recording_cleanly() {
    if !tap_probe_verdict::root() {
        return;
    }
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("full.trace");
    // The mount namespace is made after the test's network namespace, so that it sees it.
    let (disk, out) = with_traffic("rfull", |netns, dev| {
        let disk = SmallDisk::mount(dir.path(), 256 << 10);
        // Wait (bounded) until the tmpfs is there.
        let deadline = Instant::now() + Duration::from_secs(10);
        while std::fs::read_to_string(format!("/proc/{}/mounts", disk.0.id()))
            .map_or(true, |m| !m.contains(dir.path().to_str().unwrap()))
        {
            assert!(Instant::now() < deadline, "the tmpfs never appeared");
            std::thread::sleep(Duration::from_millis(20));
        }
        let mut cmd = Command::new(BIN);
        cmd.args(["record", "-o"])
            .arg(&trace)
            .args(["--dev", dev, "--netns", netns, "--duration", "30"])
            .stdin(Stdio::null());
        disk.enter(&mut cmd);
        let out = cmd.output().unwrap();
        (disk, out)
    });
    let stderr = String::from_utf8_lossy(&out.stderr);
    eprintln!("{stderr}");
    assert_eq!(out.status.code(), Some(1), "{stderr}");
    assert!(!stderr.contains("panicked"), "{stderr}");
    let name = trace.display().to_string();
    assert!(
        stderr.contains(&format!("writing {name} failed")),
        "names the file: {stderr}"
    );
    assert!(stderr.contains("No space left on device"), "{stderr}");
    let file = disk.path(&trace);
    let size = std::fs::metadata(&file).unwrap().len();
    assert!(size > 128 << 10, "the disk filled up: {size} bytes");
    if stderr.contains("with its trailer") {
        let rec = tap_probe_replay::load_recording(std::fs::File::open(&file).unwrap())
            .expect("a file ended cleanly reads whole");
        assert!(rec.lost > 0, "what did not fit is counted as lost");
        let events: u64 = rec.streams.iter().map(|s| s.ops.times.len() as u64).sum();
        assert!(events > 0);
    } else {
        assert!(stderr.contains("--salvage"), "{stderr}");
        let rec = tap_probe_replay::salvage_recording(std::fs::File::open(&file).unwrap()).unwrap();
        let cut = rec.cut.expect("no trailer");
        assert_eq!(cut.offset, size, "the file ends at a whole record");
    }
    drop(disk);
}

/// Multi-queue taps for the test below: 70 of 256 transmit queues each would be more than
/// the probe's 16384 queue slots, were every queue the device has given one.
const TAPS: usize = 70;

/// Multi-queue taps have 256 transmit queues each whatever number is attached: recorded as
/// `watch` counts them (the queues in use, one each here), all 70 are recorded.
#[test]
fn multi_queue_taps_are_recorded_within_the_tables() {
    if !tap_probe_verdict::root() {
        return;
    }
    let ns = common::quiet_netns("rmq").unwrap();
    let taps: Vec<Tap> = run_in(ns.path(), || {
        (0..TAPS)
            .map(|i| {
                Tap::create(
                    &format!("tpq{i}"),
                    TapOptions {
                        multi_queue: true,
                        queues: 1,
                        ..TapOptions::default()
                    },
                )
            })
            .collect()
    })
    .unwrap();
    let dir = tempfile::tempdir().unwrap();
    let trace = dir.path().join("mq.trace");
    let out = Command::new(BIN)
        .args(["record", "-o"])
        .arg(&trace)
        .args(["--netns", ns.name(), "--duration", "1"])
        .stdin(Stdio::null())
        .output()
        .unwrap();
    let stderr = String::from_utf8_lossy(&out.stderr);
    assert!(out.status.success(), "{stderr}");
    assert!(!stderr.contains("not recording"), "{stderr}");
    let rec = tap_probe_replay::load_recording(std::fs::File::open(&trace).unwrap()).unwrap();
    assert_eq!(rec.header.devices.len(), TAPS);
    assert!(
        rec.header.devices.iter().all(|d| d.queues == 1),
        "{:?}",
        rec.header.devices
    );
    drop(taps);
}
