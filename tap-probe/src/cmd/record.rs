//! `tap-probe record -o FILE`: per-packet events from the eBPF programs, streamed to a trace
//! file (`docs/trace-format.md`) until Ctrl-C, SIGTERM or `--duration`.
//!
//! The programs write `TraceEvent`s into their CPU's ring buffer in `EVENTS`; events that do
//! not fit are counted per CPU in `EVENTS_LOST`, and that count goes into the file (as it grows, and
//! in the trailer) and into the summary. [`Recorder`] orders them on their way to the file.

use std::fs::File;
use std::io::Write;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use aya::maps::{MapData, RingBuf};
use tap_probe_common::EventKind;

use crate::output::progress::{Progress, Status};
use tap_probe_common::units::bytes;
use tap_probe_observer::bpf::probe::Probe;
use tap_probe_observer::host::LiveHost;
use tap_probe_observer::host::discovery::Discovery;
use tap_probe_observer::host::recorder::{REORDER_WINDOW_NS, Recorder, TraceFile};
use tap_probe_observer::host::recording::{self, Followed, Following};
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::clock::monotonic_ns;
use tap_probe_observer::os::signals::Stop;
use tap_probe_trace::{DeviceInfo, Header, Trailer};

/// How long the loop waits at most once a pass has emptied the ring buffers. It wakes
/// sooner when a program asks (once per `EVENTS_PER_WAKEUP` events of its CPU): going
/// straight on would take the few events that arrived meanwhile, pass after pass, and spend
/// a CPU the traffic needs. The wait bounds how late a trickle of events is written.
const RING_WAIT: Duration = Duration::from_millis(50);
/// How often `--wait` looks for matching devices.
const WAIT_POLL: Duration = Duration::from_millis(50);
/// How often the lost-event counter is read.
const LOST_EVERY: Duration = Duration::from_millis(100);
/// The longest the loop drains the rings before it looks at the clock and the stop signal
/// again.
const PASS_BUDGET: Duration = Duration::from_millis(50);
/// How long the events left in the rings after the stop may take to write.
const FINAL_BUDGET: Duration = Duration::from_secs(1);

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The trace file to write.
    #[arg(short = 'o', long = "output", value_name = "FILE")]
    pub(crate) output: PathBuf,
    #[command(flatten)]
    pub(crate) devices: crate::cli::DeviceArgs,
    /// Stop after this long (seconds, or with a unit: 500ms, 2m; default: until Ctrl-C or
    /// SIGTERM).
    #[arg(long, value_name = "DURATION", value_parser = crate::cli::duration)]
    pub(crate) duration: Option<Duration>,
    /// Start even if no device matches yet: attach, then wait for the first matching
    /// devices to appear and record those (devices that appear later are not added).
    #[arg(long)]
    pub(crate) wait: bool,
}

/// Runs `tap-probe record`.
///
/// # Errors
/// Missing privileges, no matching device, a failure to attach, or a write error. On a
/// signal the file is completed (trailer included) before returning.
#[expect(
    clippy::too_many_lines,
    reason = "set-up, the loop and the orderly end read best in one place"
)]
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    // Before anything is attached or waited for: a trace that cannot be written costs one
    // line (exit status 2), not a wait for devices and an attach.
    tap_probe_observer::os::files::check_output(&args.output, "-o")?;
    tap_probe_observer::kernel::privileges::check()?;
    let stop = Stop::install()?;
    let mut discovery = Discovery::new(&args.devices.filter())?;
    let devices = discovery.matching()?;
    if devices.is_empty() && !args.wait {
        bail!(
            "no tun, tap, veth or macvtap device matches the filter; `tap-probe watch` lists \
             what is there (or pass --wait)"
        );
    }
    // Attach before waiting: attaching is the slow part (BTF), so a device that appears
    // later is tracked within one poll, before its first packet in the usual case.
    let kernel = KernelInfo::load()?;
    let mut host = LiveHost {
        discovery,
        probe: Probe::attach_recording(&kernel)?,
        modules: kernel.modules.clone(),
    };
    let mut progress = Progress::stderr();
    let devices = if devices.is_empty() {
        progress.note("attached; waiting for a device that matches the filter");
        recording::wait_for_devices(&mut host, || stop.sleep(WAIT_POLL))?
            .context("stopped before any device matched the filter; nothing was recorded")?
    } else {
        devices
    };
    let file = File::create(&args.output)
        .with_context(|| format!("creating {}", args.output.display()))?;
    // Track first: a device the maps have no room for is left out (and said so), and the
    // kernel's counters are read once tracking has begun.
    let Following { followed, refused } = recording::follow(&mut host, devices);
    for (d, err) in refused {
        eprintln!(
            "tap-probe: warning: not recording {} (netns {}): {err:#}",
            d.name, d.netns
        );
    }
    if followed.is_empty() {
        bail!("none of the matching devices could be tracked; nothing was recorded");
    }
    let header = Header {
        kernel_release: kernel.release.clone(),
        backend: host.probe.sources().hooks(),
        start_ns: monotonic_ns(),
        devices: followed
            .iter()
            .map(|f| DeviceInfo {
                netns: f.device.key.netns_inode,
                ifindex: f.device.key.ifindex,
                queues: f.queues,
                ring_size: f.device.tx_queue_len,
                name: f.device.name.clone(),
            })
            .collect(),
    };
    // The trace writer buffers 64 KiB itself and must see each write's outcome (a full disk
    // is cut back to a whole record), so the file gets no buffer of its own.
    let (cpus, mut rings) = host.probe.take_events()?;
    let mut recorder = Recorder::new(TraceFile::new(file), &header, &cpus, |key, queue| {
        host.probe.slot(key, queue)
    })
    .with_context(|| format!("writing {}", args.output.display()))?;

    for Followed { device: d, .. } in &followed {
        progress.note(&format!(
            "recording {} (netns {}, ring {} entries) to {}",
            d.name,
            d.netns,
            d.tx_queue_len,
            args.output.display()
        ));
    }
    let deadline = args.duration.map(|d| Instant::now() + d);
    let mut lost_seen = 0u64;
    let looped = (|| -> anyhow::Result<()> {
        let mut lost_checked = Instant::now();
        let mut taken = 0u64;
        loop {
            // A bounded pass: under a load the rings never run dry, so the stop signal and
            // the deadline are looked at between passes, not only when the rings are empty.
            let Drained { n, dry } = drain(&mut rings, &mut recorder, PASS_BUDGET)?;
            taken += n as u64;
            host.probe.flush_log();
            if lost_checked.elapsed() >= LOST_EVERY {
                lost_checked = Instant::now();
                let lost = host.probe.events_lost()?;
                recorder.lost(monotonic_ns(), lost.saturating_sub(lost_seen))?;
                lost_seen = lost_seen.max(lost);
                // What reached the file so far (the writer's buffer not yet flushed aside).
                let written = std::fs::metadata(&args.output).map_or(0, |m| m.len());
                progress.update(&Status {
                    what: "recording",
                    left: deadline.map(|d| d.saturating_duration_since(Instant::now())),
                    detail: &format!(
                        "{taken} events taken, {} written, {lost_seen} lost; Ctrl-C stops",
                        bytes(written)
                    ),
                    ..Status::default()
                });
            }
            if deadline.is_some_and(|d| Instant::now() >= d) || stop.stopped() {
                return Ok(());
            }
            if dry {
                let fds: Vec<_> = rings.iter().map(std::os::fd::AsFd::as_fd).collect();
                if stop.wait_readable(&fds, RING_WAIT) {
                    return Ok(());
                }
            }
        }
    })();
    // A write that failed (a full disk) ends the recording; any other error still ends the
    // file properly before it is reported.
    let (mut failed, mut error) = match looped {
        Ok(()) => (None, None),
        Err(err) => match err.downcast::<std::io::Error>() {
            Ok(io) => (Some(io), None),
            Err(other) => (None, Some(other)),
        },
    };
    // Detach first, so that what is left in the rings is finite, then take it out: within
    // FINAL_BUDGET into the file, beyond it only counted (a recorder that cannot keep up
    // must still end when told), and that count is written as lost.
    let lost_counter = host.probe.take_events_lost()?;
    let LiveHost {
        mut discovery,
        probe,
        ..
    } = host;
    drop(probe);
    progress.finish();
    if failed.is_none()
        && let Err(err) = drain(&mut rings, &mut recorder, FINAL_BUDGET)
    {
        match err.downcast::<std::io::Error>() {
            Ok(io) => failed = Some(io),
            Err(other) => error = error.or(Some(other)),
        }
    }
    let mut left = 0u64;
    for ring in &mut rings {
        while ring.next().is_some() {
            left += 1;
        }
    }
    let lost = lost_counter.total()?.saturating_sub(lost_seen) + left;
    let (foreign, malformed, late) = (recorder.foreign, recorder.malformed, recorder.late);
    let closed = recorder.close(monotonic_ns(), lost, failed);
    let synced = closed.sink.sync_all();
    if let Some(failure) = closed.failure {
        bail!(
            "{}",
            failure_message(&args.output, &failure, closed.trailer.as_ref())
        );
    }
    synced.with_context(|| format!("syncing {}", args.output.display()))?;
    let trailer = closed
        .trailer
        .context("the trailer was not written, yet no write failed")?;

    let after = discovery.matching().unwrap_or_default();
    eprint!(
        "{}",
        summary(&trailer, &recording::counted_since(&followed, &after))
    );
    if left > 0 {
        eprintln!(
            "  {left} events were still in the kernel's rings {} s after the stop and were not \
             written (counted as lost): the recorder could not keep up with the load",
            FINAL_BUDGET.as_secs_f64()
        );
    }
    if foreign + malformed + late > 0 {
        eprintln!(
            "  ignored: {foreign} events of untracked devices, {malformed} malformed; {late} \
             written out of order (older than the {} ms window)",
            REORDER_WINDOW_NS / 1_000_000
        );
    }
    error.map_or(Ok(()), Err)
}

/// What a failed write did to the file, for the error message.
fn failure_message(
    path: &std::path::Path,
    failure: &tap_probe_observer::host::recorder::Failure,
    trailer: Option<&Trailer>,
) -> String {
    let path = path.display();
    let error = &failure.error;
    let bytes = failure.cut.offset;
    match trailer {
        Some(t) => format!(
            "writing {path} failed ({error}): recording stopped; the file was ended cleanly at \
             {bytes} bytes with its trailer: {} events, and {} lost (the {} that did not fit \
             among them); `tap-probe replay {path}` reads it",
            t.events, t.lost, failure.dropped
        ),
        None => format!(
            "writing {path} failed ({error}): recording stopped; no room was left even for the \
             trailer, so the file ends at its last whole record ({bytes} bytes) and {} events \
             did not fit: `tap-probe replay --salvage {path}` reads what it holds",
            failure.dropped
        ),
    }
}

/// What a pass over the ring buffers took.
struct Drained {
    /// Events taken.
    n: usize,
    /// The pass emptied every ring (rather than running out of its budget).
    dry: bool,
}

/// Events taken from one ring before the next ring's turn.
const CHUNK: usize = 4096;

/// Moves events from the rings into the recorder for at most `budget`, a chunk of each
/// ring in turn, so that a busy ring does not hold the others (and the merge) back.
fn drain<W: Write>(
    rings: &mut [RingBuf<MapData>],
    recorder: &mut Recorder<W>,
    budget: Duration,
) -> anyhow::Result<Drained> {
    let started = Instant::now();
    let mut n = 0usize;
    loop {
        let mut dry = true;
        for (i, ring) in rings.iter_mut().enumerate() {
            // Taken before the ring is read: once it reads dry, what was stamped before
            // this is in the recorder (or stamped late, which the window covers).
            let before = monotonic_ns();
            let mut took = 0;
            while took < CHUNK
                && let Some(item) = ring.next()
            {
                recorder.push_bytes(i, &item)?;
                took += 1;
            }
            n += took;
            if took < CHUNK {
                recorder.read_dry(i, before);
            } else {
                dry = false;
            }
        }
        recorder.flush_settled()?;
        if dry || started.elapsed() >= budget {
            return Ok(Drained { n, dry });
        }
    }
}

/// The trailer's counts, and what the kernel counted of each device still there.
fn summary(t: &Trailer, counted: &[(&str, u64, u64)]) -> String {
    use std::fmt::Write as _;
    let mut s = String::new();
    let counts: Vec<String> = EventKind::ALL
        .iter()
        .map(|&kind| {
            let name = kind.counter().map_or("?", |m| m.name);
            format!("{name} {}", t.count(kind))
        })
        .collect();
    let _ = writeln!(
        s,
        "recorded {} events: {}; lost {}",
        t.events,
        counts.join(", "),
        t.lost
    );
    for (name, tx_packets, tx_dropped) in counted {
        let _ = writeln!(
            s,
            "  {name}: kernel tx_packets +{tx_packets}, tx_dropped +{tx_dropped}"
        );
    }
    s
}
