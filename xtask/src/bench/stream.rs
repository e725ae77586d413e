//! The other traffic of `cargo xtask bench overhead --traffic other`: a UDP stream of small
//! datagrams over the loopback device of a private network namespace, which no probe
//! watches. Every datagram fires the transmit tracepoints (on `lo`), and its free at the
//! receiver (or its drop when the socket is full) the free tracepoints, as any socket's
//! traffic on a host does: the probes must leave it alone at their first comparison.
//!
//! `run` starts this same xtask in a namespace of its own (`unshare --net`: the namespace
//! goes with the process, whatever way it ends), as the hidden `bench-stream` command,
//! which sends for the duration and prints a report with the fields of `tap-probe load`'s
//! that the benchmarks read.

use std::net::UdpSocket;
use std::path::Path;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};

use super::{Proc, create, read_report};
use crate::cmd;

/// Bytes of each datagram's payload: small, so that the per-packet work dominates.
const PAYLOAD: usize = 64;

/// How long the receiver waits for a datagram before it looks at the clock again.
const RECV_TIMEOUT: Duration = Duration::from_millis(50);

/// `cargo xtask bench-stream`: the stream itself, run by [`run`] in its own namespace.
#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Seconds to send.
    #[arg(long, value_parser = clap::value_parser!(u32).range(1..))]
    duration: u32,
}

/// Runs the stream for `duration` seconds in a private network namespace, its report into
/// `dir/TAG-stream.json`, and returns the report.
///
/// # Errors
/// When the stream cannot be started, fails, hangs, or prints no report.
pub(crate) fn run(dir: &Path, tag: &str, duration: u32) -> anyhow::Result<serde_json::Value> {
    let report = dir.join(format!("{tag}-stream.json"));
    let xtask = std::env::current_exe().context("finding the xtask binary")?;
    let mut stream = cmd::new("unshare");
    stream
        .arg("--net")
        .arg("--")
        .arg(xtask)
        .args(["bench-stream", "--duration", &duration.to_string()])
        .stdout(create(&report)?);
    // Generous: the stream bounds itself; this only catches a hang.
    Proc::spawn(&mut stream)?.wait(Duration::from_secs(u64::from(duration) + 60))?;
    read_report(&report)
}

/// What the stream did, as `bench-stream` prints it and the benchmark reads it.
#[derive(Clone, Copy, Debug, Serialize, Deserialize)]
pub(crate) struct StreamReport {
    /// Datagrams the sender's socket took.
    pub(crate) sent: u64,
    /// Datagrams the receiver read.
    pub(crate) delivered: u64,
    pub(crate) elapsed_secs: f64,
    pub(crate) sender_pps: f64,
    pub(crate) delivered_pps: f64,
}

/// Sends datagrams from one socket to another over `lo` for `args.duration` seconds and
/// prints a [`StreamReport`].
///
/// # Errors
/// When `lo` cannot be brought up or a socket cannot be made.
#[expect(
    clippy::cast_precision_loss,
    reason = "datagram counts far below 2^52, as rates"
)]
pub(crate) fn stream(args: &Args) -> anyhow::Result<()> {
    // A new namespace's loopback device is down.
    cmd::run(cmd::new("ip").args(["link", "set", "lo", "up"]))?;
    let receiver = UdpSocket::bind("127.0.0.1:0").context("binding the receiver")?;
    receiver.set_read_timeout(Some(RECV_TIMEOUT))?;
    let sender = UdpSocket::bind("127.0.0.1:0").context("binding the sender")?;
    sender.connect(receiver.local_addr()?)?;
    let done = Arc::new(AtomicBool::new(false));
    let reader = {
        let done = Arc::clone(&done);
        std::thread::spawn(move || {
            let mut buf = [0u8; PAYLOAD];
            let mut delivered = 0u64;
            loop {
                match receiver.recv(&mut buf) {
                    Ok(_) => delivered += 1,
                    // A timeout: the sender has finished once it says so and nothing came.
                    Err(_) if done.load(Ordering::Relaxed) => return delivered,
                    Err(_) => {}
                }
            }
        })
    };
    let payload = [0x5au8; PAYLOAD];
    let start = Instant::now();
    let end = start + Duration::from_secs(u64::from(args.duration));
    let mut sent = 0u64;
    while Instant::now() < end {
        for _ in 0..64 {
            // A full socket buffer at the receiver drops the datagram there; a send that
            // fails (ENOBUFS) is simply not counted.
            if sender.send(&payload).is_ok() {
                sent += 1;
            }
        }
    }
    let elapsed = start.elapsed().as_secs_f64();
    done.store(true, Ordering::Relaxed);
    let delivered = reader
        .join()
        .map_err(|_| anyhow::anyhow!("the receiver panicked"))?;
    let report = StreamReport {
        sent,
        delivered,
        elapsed_secs: elapsed,
        sender_pps: sent as f64 / elapsed,
        delivered_pps: delivered as f64 / elapsed,
    };
    println!("{}", serde_json::to_string(&report)?);
    Ok(())
}
