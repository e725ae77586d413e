//! `cargo xtask bench KIND`: benchmarks. A benchmark reports whether tap-probe meets its
//! goals; it fails only when a run fails, never on a missed goal.
//!
//! Each kind is a module under `bench/` with its own `Args` and `run`; what they share
//! (building, background processes with bounded waits, the load runs, medians, JSON
//! output) lives here, and the A/B harness (variants, rounds, medians, goals, the table)
//! in `ab`.

mod ab;
mod backends;
mod overhead;
mod probed;
mod record;
mod replay;
mod serve;
pub(crate) mod stream;

use std::fmt::Write as _;
use std::fs::File;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Deserialize as _;
use tap_probe_common::MetricId;
use tap_probe_spec::load::LoadNumbers;

use crate::{cmd, setup};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    #[command(subcommand)]
    kind: BenchKind,
}

#[derive(Debug, clap::Subcommand)]
enum BenchKind {
    /// Throughput of `tap-probe load` with no probe, with `tap-probe watch`, and with an
    /// equivalent bpftrace one-liner.
    Overhead(overhead::Args),
    /// Throughput of `tap-probe load` with no probe and with `tap-probe record`, and
    /// whether the recording kept every event.
    Record(record::Args),
    /// Replay harness speed: in-memory replay events/s on one core, `--live` items/s.
    Replay(replay::Args),
    /// What `tap-probe serve` costs on a dense host: CPU, memory, time to its first good
    /// refresh and scrapes, with a thousand multi-queue taps held open.
    Serve(serve::Args),
    /// Per-packet cost of each probe backend (kprobe, auto, tracepoint) as
    /// throughput of `tap-probe load` relative to no probe, measured in a QEMU guest (whose
    /// kernel has kprobes) in one boot.
    Backends(backends::Args),
}

/// The guest side of a guest benchmark (`xtask` runs inside the guest).
#[derive(Debug, clap::Args)]
pub(crate) struct GuestArgs {
    #[command(subcommand)]
    kind: GuestKind,
}

#[derive(Debug, clap::Subcommand)]
enum GuestKind {
    Backends(backends::GuestArgs),
}

/// Runs a guest benchmark's guest side.
///
/// # Errors
/// If a run cannot be run at all.
pub(crate) fn guest(args: &GuestArgs) -> anyhow::Result<()> {
    match &args.kind {
        GuestKind::Backends(args) => backends::guest(args),
    }
}

/// What the host A/B benchmarks (`overhead`, `record`) take.
#[derive(Debug, clap::Args)]
pub(crate) struct RoundArgs {
    /// Rounds; each runs every variant once, in alternating order.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(5..))]
    pairs: u32,
    /// Seconds of traffic per run.
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(1..))]
    duration: u32,
    /// Where to write the JSON results [default: target/bench/KIND.json].
    #[arg(long)]
    out: Option<PathBuf>,
}

/// Runs `cargo xtask bench`.
///
/// # Errors
/// If setup, the build or any run fails.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let out = match &args.kind {
        BenchKind::Overhead(args) => overhead::out(args),
        BenchKind::Record(args) => record::out(args),
        BenchKind::Replay(args) => replay::out(args),
        BenchKind::Serve(args) => serve::out(args),
        BenchKind::Backends(args) => backends::out(args),
    };
    // Before the setup, the build and any run: results that could not be written at the
    // end would cost the whole benchmark.
    check_out(&out)?;
    setup::run(&setup::Args {})?;
    // The guest benchmark builds its own tap-probe.
    let tap_probe = || cmd::build_release_bin("tap-probe", "tap-probe");
    // The floor is built by the benchmark alone: it is not part of tap-probe.
    let floor = || cmd::build_release_example("tap-probe-observer", "floor");
    match &args.kind {
        BenchKind::Overhead(args) => overhead::run(args, &out, &tap_probe()?, &floor()?),
        BenchKind::Record(args) => record::run(args, &out, &tap_probe()?, &floor()?),
        BenchKind::Replay(args) => replay::run(args, &out, &tap_probe()?),
        BenchKind::Serve(args) => serve::run(args, &out, &tap_probe()?),
        BenchKind::Backends(args) => backends::run(args, &out),
    }
}

/// Checks that the results can be written at `out`, changing nothing but making its
/// directory (which the benchmark makes anyway): an existing file is opened for writing
/// without truncating it, a missing one is created and removed again.
///
/// # Errors
/// When `out` is a directory, or cannot be opened or created for writing.
fn check_out(out: &Path) -> anyhow::Result<()> {
    let refuse = |why: String| anyhow::anyhow!("--out {} {why}", out.display());
    if out.is_dir() {
        return Err(refuse("is a directory; name a file".to_owned()));
    }
    if let Some(dir) = out.parent().filter(|dir| !dir.as_os_str().is_empty()) {
        std::fs::create_dir_all(dir).map_err(|err| {
            refuse(format!(
                "cannot be written: {} cannot be made: {err}",
                dir.display()
            ))
        })?;
    }
    if out.exists() {
        std::fs::OpenOptions::new()
            .write(true)
            .open(out)
            .map_err(|err| refuse(format!("cannot be written: {err}")))?;
    } else {
        std::fs::OpenOptions::new()
            .write(true)
            .create_new(true)
            .open(out)
            .map_err(|err| refuse(format!("cannot be created: {err}")))?;
        std::fs::remove_file(out)
            .map_err(|err| refuse(format!("was created but cannot be removed: {err}")))?;
    }
    Ok(())
}

/// The namespaces `tap-probe load` creates.
const LOAD_NETNS_GLOB: &str = "tap-probe-load-*";

/// The tap `tap-probe load` creates in its namespace.
const LOAD_IFNAME: &str = "tp-load0";

/// `tap-probe` arguments for a load that sends for `duration` seconds after waiting
/// `start_delay` seconds (for a probe started beforehand to find its tap), and prints its
/// report as JSON.
fn load_args(duration: u32, start_delay: u32) -> [String; 7] {
    [
        "load".to_owned(),
        "--format".to_owned(),
        "json".to_owned(),
        "--duration".to_owned(),
        duration.to_string(),
        "--start-delay".to_owned(),
        start_delay.to_string(),
    ]
}

/// `tap-probe` arguments for watching the load's tap: `--wait` because its namespace does
/// not exist yet when the watch starts; JSON lines.
const WATCH_LOAD_ARGS: [&str; 6] = [
    "watch",
    "--netns",
    LOAD_NETNS_GLOB,
    "--wait",
    "--format",
    "json",
];

/// The watch's refresh (which is also when new devices are found), unless a run says
/// otherwise: every half second, well inside the load's start delay.
const WATCH_INTERVAL: [&str; 2] = ["--interval", "0.5"];

/// Taps the benchmark holds beside the load, in a namespace the load's watch matches, so
/// that the watch tracks them all: persistent taps with one queue each, no traffic.
struct OtherTaps {
    netns: String,
}

impl OtherTaps {
    /// Creates `n` of them.
    ///
    /// # Errors
    /// When iproute2 cannot create them.
    fn create(n: usize) -> anyhow::Result<Self> {
        let netns = LOAD_NETNS_GLOB.replace('*', &format!("others-{}", std::process::id()));
        cmd::run(cmd::new("ip").args(["netns", "add", &netns]))?;
        let taps = Self { netns };
        let mut batch = String::new();
        for i in 0..n {
            let _ = writeln!(batch, "tuntap add dev tpo{i} mode tap");
        }
        ip_batch(&taps.netns, &batch)?;
        Ok(taps)
    }
}

/// Runs `commands` through `ip -n NETNS -force -batch -`.
///
/// # Errors
/// When iproute2 cannot run or a command fails.
fn ip_batch(netns: &str, commands: &str) -> anyhow::Result<()> {
    let mut ip = cmd::new("ip")
        .args(["-n", netns, "-force", "-batch", "-"])
        .stdin(Stdio::piped())
        .spawn()
        .context("running ip")?;
    std::io::Write::write_all(
        &mut ip.stdin.take().context("ip's stdin")?,
        commands.as_bytes(),
    )?;
    let status = ip.wait()?;
    if !status.success() {
        bail!("ip -batch failed ({status})");
    }
    Ok(())
}

impl Drop for OtherTaps {
    /// The namespace goes, and its taps with it (none is held open).
    fn drop(&mut self) {
        let _ = cmd::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

/// The driver calls `tap-probe watch --format json` counted on the load's tap, from its
/// output lines: the largest count, since counters only grow and the row of a device that
/// went away carries its last count.
fn watched_xmit_calls<'a>(lines: impl IntoIterator<Item = &'a serde_json::Value>) -> u64 {
    lines
        .into_iter()
        .filter_map(|line| line["rows"].as_array())
        .flatten()
        .filter(|row| row["ifname"] == LOAD_IFNAME)
        .filter_map(|row| row[MetricId::XmitCalls.metric().name].as_u64())
        .max()
        .unwrap_or(0)
}

/// Runs `tap-probe load` (`binary`) for `duration` seconds after `start_delay`, its report
/// into `dir/TAG-load.json`, and returns the report.
///
/// # Errors
/// When the load fails, hangs, or prints no report.
fn load(
    binary: &Path,
    dir: &Path,
    tag: &str,
    duration: u32,
    start_delay: u32,
) -> anyhow::Result<serde_json::Value> {
    let report = dir.join(format!("{tag}-load.json"));
    let mut load = cmd::new(binary);
    load.args(load_args(duration, start_delay))
        .stdout(create(&report)?);
    // Generous: the load bounds itself; this only catches a hang.
    let timeout = Duration::from_secs(u64::from(duration + start_delay) + 60);
    Proc::spawn(&mut load)?.wait(timeout)?;
    read_report(&report)
}

/// The numbers of a `tap-probe load` report, read as the report's own type: a number
/// renamed in its table fails to compile here too.
fn load_numbers(report: &serde_json::Value) -> Result<LoadNumbers, serde_json::Error> {
    LoadNumbers::deserialize(report)
}

/// Default output path for a benchmark: `target/bench/NAME.json`.
fn default_out(name: &str) -> PathBuf {
    cmd::target_dir().join("bench").join(format!("{name}.json"))
}

/// Where a benchmark keeps each run's raw output: beside `out`, `<stem>-runs/`.
fn runs_dir(out: &Path) -> anyhow::Result<PathBuf> {
    let stem = out
        .file_stem()
        .map_or_else(|| "bench".into(), |s| s.to_string_lossy());
    let dir = out.with_file_name(format!("{stem}-runs"));
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    Ok(dir)
}

fn create(path: &Path) -> anyhow::Result<File> {
    File::create(path).with_context(|| format!("creating {}", path.display()))
}

/// Writes `value` as pretty JSON to `path`, creating its directory.
fn write_json(path: &Path, value: &impl serde::Serialize) -> anyhow::Result<()> {
    if let Some(dir) = path.parent() {
        std::fs::create_dir_all(dir).with_context(|| format!("creating {}", dir.display()))?;
    }
    let mut text = serde_json::to_string_pretty(value)?;
    text.push('\n');
    std::fs::write(path, text).with_context(|| format!("writing {}", path.display()))
}

/// `forward` in the order round `round` (counted from 0) runs it: as given on even rounds,
/// reversed on odd ones, so that drift over time does not favour one variant.
fn round_order<T, A: AsMut<[T]>>(mut forward: A, round: u32) -> A {
    if round % 2 == 1 {
        forward.as_mut().reverse();
    }
    forward
}

/// The median of `values` (the mean of the middle two for an even count); NaN if empty.
fn median(values: &[f64]) -> f64 {
    let mut sorted = values.to_vec();
    sorted.sort_by(f64::total_cmp);
    let n = sorted.len();
    match n {
        0 => f64::NAN,
        _ if n % 2 == 1 => sorted[n / 2],
        _ => f64::midpoint(sorted[n / 2 - 1], sorted[n / 2]),
    }
}

/// The running kernel's release.
fn kernel_release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

/// How long a process gets to exit after SIGINT before it is killed and the run fails.
const INTERRUPT_GRACE: Duration = Duration::from_secs(10);

/// A child process whose waits are bounded. Dropping it kills the process if it still
/// runs, so an error anywhere leaves nothing behind.
struct Proc {
    shown: String,
    child: Child,
}

impl Proc {
    /// Echoes and starts `command` with stdin closed.
    fn spawn(command: &mut Command) -> anyhow::Result<Self> {
        cmd::echo(command);
        let shown = cmd::display(command);
        let child = command
            .stdin(Stdio::null())
            .spawn()
            .with_context(|| format!("could not run `{shown}`"))?;
        Ok(Self { shown, child })
    }

    /// Whether it has exited, and how.
    fn exited(&mut self) -> anyhow::Result<Option<ExitStatus>> {
        Ok(self.child.try_wait()?)
    }

    /// Waits for it to exit by itself within `timeout` and checks it exited zero.
    fn wait(mut self, timeout: Duration) -> anyhow::Result<()> {
        if let Some(status) = self.wait_until(Instant::now() + timeout)? {
            return self.check(status);
        }
        let _ = self.stop();
        bail!("`{}` still ran after {} s", self.shown, timeout.as_secs())
    }

    /// Stops it with SIGINT, as Ctrl-C would, and checks it stopped in order: tap-probe ends
    /// with the signal that stopped it once its output is complete, bpftrace exits zero. If
    /// it has already exited, that exit is checked.
    fn interrupt(mut self) -> anyhow::Result<()> {
        let status = self.stop()?;
        if std::os::unix::process::ExitStatusExt::signal(&status) == Some(libc::SIGINT) {
            return Ok(());
        }
        self.check(status)
    }

    /// SIGINT unless it has exited already, then a bounded wait for its exit status.
    fn stop(&mut self) -> anyhow::Result<ExitStatus> {
        if let Some(status) = self.exited()? {
            return Ok(status);
        }
        let pid = libc::pid_t::try_from(self.child.id()).context("pid out of range")?;
        // SAFETY: kill(2) on our own child, which has not been reaped (try_wait saw it run).
        if unsafe { libc::kill(pid, libc::SIGINT) } != 0 {
            return Err(std::io::Error::last_os_error())
                .with_context(|| format!("sending SIGINT to `{}`", self.shown));
        }
        self.wait_until(Instant::now() + INTERRUPT_GRACE)?
            .with_context(|| {
                format!(
                    "`{}` did not exit within {} s of SIGINT",
                    self.shown,
                    INTERRUPT_GRACE.as_secs()
                )
            })
    }

    fn wait_until(&mut self, deadline: Instant) -> anyhow::Result<Option<ExitStatus>> {
        loop {
            if let Some(status) = self.exited()? {
                return Ok(Some(status));
            }
            if Instant::now() >= deadline {
                return Ok(None);
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    fn check(&self, status: ExitStatus) -> anyhow::Result<()> {
        if status.success() {
            Ok(())
        } else {
            bail!("`{}` failed ({status})", self.shown)
        }
    }
}

impl Drop for Proc {
    fn drop(&mut self) {
        if matches!(self.child.try_wait(), Ok(None)) {
            let _ = self.child.kill();
            let _ = self.child.wait();
        }
    }
}

/// A `tap-probe ... --format json` report: the whole of the file, or else its last line that
/// parses as a JSON object.
fn read_report(path: &Path) -> anyhow::Result<serde_json::Value> {
    use serde_json::Value;
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    if let Ok(value @ Value::Object(_)) = serde_json::from_str(&text) {
        return Ok(value);
    }
    text.lines()
        .rev()
        .find_map(|line| match serde_json::from_str(line) {
            Ok(value @ Value::Object(_)) => Some(value),
            _ => None,
        })
        .with_context(|| format!("{} holds no JSON report", path.display()))
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::{check_out, median, round_order, watched_xmit_calls};

    /// `--out` is checked without a trace: a new file is created and removed, an existing
    /// one kept as it was; a directory, or a file under a file, is refused, naming `--out`.
    #[test]
    fn the_results_path_is_checked_before_the_benchmark() {
        let dir = std::env::temp_dir().join(format!("xtask-bench-out-{}", std::process::id()));
        let out = dir.join("a/results.json");
        check_out(&out).unwrap();
        assert!(!out.exists());
        std::fs::write(&out, "kept").unwrap();
        check_out(&out).unwrap();
        assert_eq!(std::fs::read_to_string(&out).unwrap(), "kept");
        let err = check_out(&dir).unwrap_err().to_string();
        assert!(
            err.starts_with("--out ") && err.ends_with("is a directory; name a file"),
            "{err}"
        );
        let err = check_out(&out.join("under-a-file.json"))
            .unwrap_err()
            .to_string();
        assert!(err.contains("cannot be made"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }

    #[test]
    fn rounds_alternate_the_order() {
        assert_eq!(round_order([1, 2, 3], 0), [1, 2, 3]);
        assert_eq!(round_order([1, 2, 3], 1), [3, 2, 1]);
        assert_eq!(round_order(vec![1, 2], 4), [1, 2]);
    }

    #[test]
    fn watched_xmit_calls_takes_the_load_taps_largest_count() {
        let lines = [
            json!({"final": false, "rows": []}),
            json!({"rows": [
                {"ifname": "tp-load0", "xmit_calls": 10},
                {"ifname": "other", "xmit_calls": 99},
            ]}),
            json!({"rows": [{"ifname": "tp-load0", "xmit_calls": 25, "retired": true}]}),
            json!({"final": true, "rows": []}),
        ];
        assert_eq!(watched_xmit_calls(&lines), 25);
        assert_eq!(watched_xmit_calls(None), 0);
    }

    #[test]
    fn median_of_odd_and_even_counts() {
        assert!((median(&[3.0, 1.0, 2.0]) - 2.0).abs() < f64::EPSILON);
        assert!((median(&[4.0, 1.0, 3.0, 2.0]) - 2.5).abs() < f64::EPSILON);
        assert!(median(&[]).is_nan());
    }
}
