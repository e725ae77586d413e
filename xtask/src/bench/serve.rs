//! `cargo xtask bench serve`: what `tap-probe serve` costs on a dense host. The benchmark
//! holds taps by the thousand open as VMs' holders do (a file per queue, multi-queue) in a
//! namespace of its own, starts `serve` on them with its defaults, and measures: how long
//! until `/healthz` says a refresh went well, the CPU it takes over a window of refreshes
//! (from `/proc/PID/stat`), its resident memory (`VmRSS`, and the peak `VmHWM`), the kernel
//! memory its maps hold (its own `tap_probe_kernel_memory_bytes`), and scrapes of
//! `/metrics`: their time and size. It holds serve to tracking every tap.

use std::fmt::Write as _;
use std::io::{Read as _, Write as _};
use std::os::fd::{AsRawFd as _, FromRawFd as _, OwnedFd};
use std::path::{Path, PathBuf};
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use serde::Serialize;

use super::ab::Goal;
use super::{Proc, create, default_out, ip_batch, median, runs_dir, write_json};
use crate::cmd;

/// Goals for a dense host: what an operator leaves on, at a thousand VMs.
const GOAL_CPU_SHARE: f64 = 0.01;
const GOAL_RSS_BYTES: f64 = 100e6;
const GOAL_FIRST_HEALTHY_S: f64 = 5.0;
const GOAL_SCRAPE_S: f64 = 0.1;
const GOAL_SCRAPE_BYTES: f64 = 5e6;

/// How long serve may take to say where it serves.
const START_WAIT: Duration = Duration::from_mins(1);

/// Scrapes timed, once the CPU window is over.
const SCRAPES: usize = 10;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Taps to hold open.
    #[arg(long, default_value_t = 1_000)]
    taps: u32,
    /// Queues of each (a file each; multi-queue from 2).
    #[arg(long, default_value_t = 8, value_parser = clap::value_parser!(u16).range(1..=256))]
    queues: u16,
    /// serve's `--interval`, in seconds.
    #[arg(long, default_value_t = 5)]
    interval: u32,
    /// Seconds over which serve's CPU is measured, after its first good refresh.
    #[arg(long, default_value_t = 60, value_parser = clap::value_parser!(u32).range(10..))]
    window: u32,
    /// Where to write the JSON results [default: target/bench/serve.json].
    #[arg(long)]
    out: Option<std::path::PathBuf>,
}

#[derive(Debug, Serialize)]
struct Results {
    bench: &'static str,
    kernel: String,
    taps: u32,
    queues: u16,
    interval_s: u32,
    window_s: u32,
    /// From serve's start to the first `/healthz` that answers 200.
    first_healthy_s: f64,
    /// Taps serve shows in the scrape after the window, and those it says are untracked.
    taps_served: usize,
    untracked: Option<f64>,
    /// serve's CPU time over the window, as a share of one CPU.
    cpu_share: f64,
    /// Resident memory at the end of the window, and the peak.
    rss_bytes: u64,
    peak_rss_bytes: u64,
    /// What serve says its maps hold.
    kernel_memory_bytes: Option<f64>,
    /// Scrapes of `/metrics` after the window.
    scrape_s_median: f64,
    scrape_s_max: f64,
    scrape_bytes: usize,
    goals: Vec<Goal>,
}

/// Where the results go: `--out`, or `target/bench/serve.json`.
pub(crate) fn out(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| default_out("serve"))
}

/// Runs `cargo xtask bench serve` with the release `tap_probe`.
///
/// # Errors
/// When the taps cannot be made, serve does not start or stops, or it leaves a tap
/// untracked.
pub(crate) fn run(args: &Args, out: &Path, tap_probe: &Path) -> anyhow::Result<()> {
    let dir = runs_dir(out)?;
    raise_open_files()?;
    let netns = format!("tp-bench-serve-{}", std::process::id());
    let taps = Taps::create(&netns, args.taps, args.queues)?;
    eprintln!(
        "holding {} taps of {} queues in {netns} ({} files)",
        args.taps,
        args.queues,
        taps.files.len()
    );
    let (proc, addr, first_healthy) = start(tap_probe, args, &netns, &dir)?;
    let pid = proc.child.id();
    let (cpu0, at0) = (cpu_seconds(pid)?, Instant::now());
    std::thread::sleep(Duration::from_secs(u64::from(args.window)));
    let (cpu1, at1) = (cpu_seconds(pid)?, Instant::now());
    let cpu_share = (cpu1 - cpu0) / (at1 - at0).as_secs_f64();
    let (rss_bytes, peak_rss_bytes) = (
        status_kb(pid, "VmRSS")? * 1024,
        status_kb(pid, "VmHWM")? * 1024,
    );
    let mut times = Vec::with_capacity(SCRAPES);
    let mut body = String::new();
    for _ in 0..SCRAPES {
        let at = Instant::now();
        let (status, text) = get(&addr, "/metrics")?;
        times.push(at.elapsed().as_secs_f64());
        if !status.contains(" 200 ") {
            bail!("a scrape answered {status}");
        }
        body = text;
    }
    proc.interrupt()?;
    drop(taps);
    std::fs::write(dir.join("scrape.txt"), &body)?;
    let value = |family: &str| {
        body.lines().find_map(|l| {
            l.strip_prefix(family)?
                .strip_prefix(' ')?
                .parse::<f64>()
                .ok()
        })
    };
    let taps_served = body
        .lines()
        .filter(|l| l.starts_with("tap_probe_xmit_calls_total{"))
        .filter(|l| l.contains(&format!("netns=\"{netns}\"")))
        .count();
    let goals = goals(
        args,
        cpu_share,
        peak_rss_bytes,
        first_healthy,
        median(&times),
        body.len(),
    );
    let results = Results {
        bench: "serve",
        kernel: super::kernel_release(),
        taps: args.taps,
        queues: args.queues,
        interval_s: args.interval,
        window_s: args.window,
        first_healthy_s: first_healthy.as_secs_f64(),
        taps_served,
        untracked: value("tap_probe_untracked_devices"),
        cpu_share,
        rss_bytes,
        peak_rss_bytes,
        kernel_memory_bytes: value("tap_probe_kernel_memory_bytes"),
        scrape_s_median: median(&times),
        scrape_s_max: times.iter().copied().fold(0.0, f64::max),
        scrape_bytes: body.len(),
        goals,
    };
    println!("{}", serde_json::to_string_pretty(&results)?);
    write_json(out, &results)?;
    eprintln!("xtask bench serve: results in {}", out.display());
    if taps_served != args.taps as usize || results.untracked != Some(0.0) {
        bail!(
            "serve showed {taps_served} of {} taps ({:?} untracked)",
            args.taps,
            results.untracked
        );
    }
    Ok(())
}

/// The goals serve's figures are held to.
#[expect(clippy::cast_precision_loss, reason = "byte counts far below 2^52")]
fn goals(
    args: &Args,
    cpu_share: f64,
    peak_rss_bytes: u64,
    first_healthy: Duration,
    scrape_s_median: f64,
    scrape_bytes: usize,
) -> Vec<Goal> {
    vec![
        Goal::at_most(
            format!(
                "serve's CPU share over {} s <= {GOAL_CPU_SHARE}",
                args.window
            ),
            Some(cpu_share),
            GOAL_CPU_SHARE,
        ),
        Goal::at_most(
            format!("serve's peak resident memory <= {GOAL_RSS_BYTES:.0} bytes"),
            Some(peak_rss_bytes as f64),
            GOAL_RSS_BYTES,
        ),
        Goal::at_most(
            format!("first good refresh within {GOAL_FIRST_HEALTHY_S} s of start"),
            Some(first_healthy.as_secs_f64()),
            GOAL_FIRST_HEALTHY_S,
        ),
        Goal::at_most(
            format!("a scrape's median time <= {GOAL_SCRAPE_S} s"),
            Some(scrape_s_median),
            GOAL_SCRAPE_S,
        ),
        Goal::at_most(
            format!("a scrape's size <= {GOAL_SCRAPE_BYTES:.0} bytes"),
            Some(scrape_bytes as f64),
            GOAL_SCRAPE_BYTES,
        ),
    ]
}

/// Starts serve on `netns` and waits for its first good refresh: the process, its address,
/// and how long that took from its start.
fn start(
    tap_probe: &Path,
    args: &Args,
    netns: &str,
    dir: &Path,
) -> anyhow::Result<(Proc, String, Duration)> {
    let log = dir.join("serve.log");
    let mut serve = cmd::new(tap_probe);
    serve
        .args(["serve", "--listen", "127.0.0.1:0", "--netns", netns])
        .args(["--interval", &args.interval.to_string()])
        .stderr(create(&log)?);
    let started = Instant::now();
    let mut proc = Proc::spawn(&mut serve)?;
    let addr = loop {
        if let Some(addr) = std::fs::read_to_string(&log)?
            .lines()
            .find_map(|l| l.split("serving metrics on http://").nth(1))
            .and_then(|rest| rest.split('/').next())
        {
            break addr.to_owned();
        }
        if let Some(status) = proc.exited()? {
            bail!("serve exited ({status}); see {}", log.display());
        }
        if started.elapsed() > START_WAIT {
            bail!("serve did not say where it serves; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    let first_healthy = loop {
        if get(&addr, "/healthz").is_ok_and(|(status, _)| status.contains(" 200 ")) {
            break started.elapsed();
        }
        if let Some(status) = proc.exited()? {
            bail!("serve exited ({status}); see {}", log.display());
        }
        if started.elapsed() > START_WAIT {
            bail!("serve was never healthy; see {}", log.display());
        }
        std::thread::sleep(Duration::from_millis(20));
    };
    Ok((proc, addr, first_healthy))
}

/// One HTTP/1.0 GET: the status line and the body.
fn get(addr: &str, path: &str) -> anyhow::Result<(String, String)> {
    let mut stream = std::net::TcpStream::connect(addr)?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n")?;
    let mut response = String::new();
    stream.read_to_string(&mut response)?;
    let (head, body) = response
        .split_once("\r\n\r\n")
        .context("an HTTP response with no head")?;
    Ok((
        head.lines().next().unwrap_or_default().to_owned(),
        body.to_owned(),
    ))
}

/// The CPU time process `pid` has taken, user and system, in seconds.
fn cpu_seconds(pid: u32) -> anyhow::Result<f64> {
    let stat = std::fs::read_to_string(format!("/proc/{pid}/stat"))?;
    // After the command's closing parenthesis: state is field 3, utime 14, stime 15.
    let fields: Vec<&str> = stat
        .rsplit_once(')')
        .context("/proc/PID/stat")?
        .1
        .split_whitespace()
        .collect();
    let ticks = |i: usize| -> anyhow::Result<f64> {
        Ok(fields
            .get(i - 3)
            .context("/proc/PID/stat")?
            .parse::<f64>()?)
    };
    // SAFETY: sysconf with a valid name.
    let hz = unsafe { libc::sysconf(libc::_SC_CLK_TCK) };
    #[expect(clippy::cast_precision_loss, reason = "a small constant")]
    Ok((ticks(14)? + ticks(15)?) / hz as f64)
}

/// A `kB` field of `/proc/PID/status`.
fn status_kb(pid: u32, field: &str) -> anyhow::Result<u64> {
    std::fs::read_to_string(format!("/proc/{pid}/status"))?
        .lines()
        .find_map(|l| l.strip_prefix(field)?.strip_prefix(':'))
        .and_then(|v| v.trim().trim_end_matches("kB").trim().parse().ok())
        .with_context(|| format!("{field} in /proc/{pid}/status"))
}

/// Lets this process hold a file per tap queue.
fn raise_open_files() -> anyhow::Result<()> {
    let mut limit = libc::rlimit {
        rlim_cur: 0,
        rlim_max: 0,
    };
    // SAFETY: getrlimit and setrlimit with a valid resource and a struct of ours.
    unsafe {
        if libc::getrlimit(libc::RLIMIT_NOFILE, &raw mut limit) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
        limit.rlim_cur = limit.rlim_max;
        if libc::setrlimit(libc::RLIMIT_NOFILE, &raw const limit) != 0 {
            return Err(std::io::Error::last_os_error().into());
        }
    }
    Ok(())
}

/// `TUNSETIFF` and the flags of a tap (`include/uapi/linux/if_tun.h`).
const TUNSETIFF: libc::c_ulong = 0x4004_54ca;
const IFF_TAP: i16 = 0x0002;
const IFF_MULTI_QUEUE: i16 = 0x0100;
const IFF_NO_PI: i16 = 0x1000;

/// `struct ifreq` as TUNSETIFF reads it: the name, then the flags.
#[repr(C)]
struct IfReq {
    name: [u8; libc::IFNAMSIZ],
    flags: i16,
    pad: [u8; 22],
}

/// The benchmark's taps, in a namespace of their own, held open; removed in one batch.
struct Taps {
    netns: String,
    files: Vec<OwnedFd>,
}

impl Taps {
    fn create(netns: &str, taps: u32, queues: u16) -> anyhow::Result<Self> {
        cmd::run(cmd::new("ip").args(["netns", "add", netns]))?;
        let mut made = Self {
            netns: netns.to_owned(),
            files: Vec::new(),
        };
        let path = format!("/run/netns/{netns}");
        // In a thread that joins the namespace: the taps are made there, and the files are
        // the process's.
        let files = std::thread::scope(|scope| {
            scope
                .spawn(|| -> anyhow::Result<Vec<OwnedFd>> {
                    let ns = std::fs::File::open(&path)?;
                    // SAFETY: setns on this thread with a namespace file we hold.
                    if unsafe { libc::setns(ns.as_raw_fd(), libc::CLONE_NEWNET) } != 0 {
                        return Err(std::io::Error::last_os_error())
                            .context("joining the namespace");
                    }
                    let mut files = Vec::new();
                    for tap in 0..taps {
                        for _ in 0..queues {
                            files.push(open_queue(&format!("tpb{tap}"), queues > 1)?);
                        }
                    }
                    Ok(files)
                })
                .join()
                .map_err(|_| anyhow::anyhow!("the tap maker panicked"))?
        })?;
        made.files = files;
        let mut batch = String::new();
        for tap in 0..taps {
            let _ = writeln!(batch, "link set dev tpb{tap} group 4243");
        }
        ip_batch(netns, &batch)?;
        Ok(made)
    }
}

impl Drop for Taps {
    /// The taps go in one batch (closing their files one by one would wait for the kernel
    /// once per tap), then the files and the namespace.
    fn drop(&mut self) {
        let _ = ip_batch(&self.netns, "link del group 4243\n");
        self.files.clear();
        let _ = cmd::new("ip").args(["netns", "del", &self.netns]).status();
    }
}

/// Opens a queue of tap `name` (creating the tap with its first).
fn open_queue(name: &str, multi_queue: bool) -> anyhow::Result<OwnedFd> {
    // SAFETY: open(2) of a path we own, checked below.
    let fd = unsafe { libc::open(c"/dev/net/tun".as_ptr(), libc::O_RDWR | libc::O_CLOEXEC) };
    if fd < 0 {
        return Err(std::io::Error::last_os_error()).context("opening /dev/net/tun");
    }
    // SAFETY: a descriptor we just opened and own.
    let file = unsafe { OwnedFd::from_raw_fd(fd) };
    let mut req = IfReq {
        name: [0; libc::IFNAMSIZ],
        flags: IFF_TAP | IFF_NO_PI | if multi_queue { IFF_MULTI_QUEUE } else { 0 },
        pad: [0; 22],
    };
    req.name[..name.len()].copy_from_slice(name.as_bytes());
    // SAFETY: TUNSETIFF reads an ifreq, which `req` is laid out as.
    if unsafe { libc::ioctl(file.as_raw_fd(), TUNSETIFF, &raw mut req) } != 0 {
        return Err(std::io::Error::last_os_error()).with_context(|| format!("TUNSETIFF {name}"));
    }
    Ok(file)
}
