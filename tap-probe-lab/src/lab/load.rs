//! A fresh tap in a private network namespace with a reader thread playing the VM, fed
//! bounded traffic: [`LoadSession`] (the demo drives it directly) and
//! [`run_load_with_stop`], a whole `tap-probe load` run as a function.

use std::os::fd::AsFd as _;
use std::path::PathBuf;
use std::sync::Arc;
use std::sync::atomic::{AtomicBool, AtomicU32, Ordering};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result, anyhow};

use crate::lab::traffic::{self, ReadReport, ReaderConfig, SendReport, SenderConfig};
use crate::lab::vhost::{
    Counters as VhostCounters, RunConfig, RunReport, VhostConfig, VhostReader,
};
use tap_probe_observer::os::netlink::{LinkStats, QdiscStats, RootQdisc, Rtnl};
use tap_probe_observer::os::netns::{self, NamedNetns};
use tap_probe_observer::os::tap::{Tap, TapOptions};
use tap_probe_spec::load::{LoadNumber, LoadNumbers};
use tap_probe_spec::traffic::{Qdisc, ReaderKind};

/// The tap's name inside its private namespace.
pub(crate) const TAP_NAME: &str = "tp-load0";
/// How long draining the ring after traffic may take at most.
const DRAIN_LIMIT: Duration = Duration::from_secs(2);
/// vhost-net has delivered everything once nothing arrived for this long with every
/// receive buffer posted.
const VHOST_QUIET: Duration = Duration::from_millis(100);
/// The reader outlives the sender by at most this (it is normally stopped explicitly).
const READER_GRACE: Duration = Duration::from_secs(10);

/// The root qdisc a tap gets: the spec's choice, in the observer's terms.
#[must_use]
pub fn root_qdisc(qdisc: Qdisc) -> RootQdisc {
    match qdisc {
        Qdisc::Noqueue => RootQdisc::Noqueue,
        Qdisc::PfifoFast => RootQdisc::PfifoFast,
        Qdisc::Pfifo => RootQdisc::Pfifo { limit: None },
        Qdisc::FqCodel => RootQdisc::FqCodel,
    }
}

/// The tap's setup.
#[derive(Debug, Clone, Default)]
pub struct SessionConfig {
    /// Root qdisc to install; the kernel default (`pfifo_fast`) when `None`.
    pub qdisc: Option<RootQdisc>,
    pub tx_queue_len: Option<u32>,
    /// Open the tap with `IFF_BACKPRESSURE` (refused where the kernel lacks it).
    pub backpressure: bool,
    pub reader: ReaderKind,
    /// Reader pace; unlimited when `None`.
    pub reader_pps: Option<u64>,
    /// The reader stops by itself after this long (it is normally stopped by
    /// [`LoadSession::drain`] or drop); `None` means an hour.
    pub reader_deadline: Option<Duration>,
}

/// A whole `load` run.
#[derive(Debug, Clone)]
pub struct LoadConfig {
    pub session: SessionConfig,
    pub packets: u64,
    pub duration: Duration,
    pub frame_len: usize,
    /// In all, split evenly over the sender threads.
    pub pps: Option<u64>,
    pub batch: usize,
    pub start_delay: Duration,
    /// Threads sending at once, each with its own socket (`packets` and `pps` are split
    /// evenly among them): several CPUs transmitting into one tap, as several guest
    /// flows or several host applications do.
    pub sender_threads: u32,
    /// Flows each sender spreads its frames over (numbered per flow, see `traffic`).
    pub flows: u32,
}

impl Default for LoadConfig {
    fn default() -> Self {
        Self {
            session: SessionConfig::default(),
            packets: 2_000_000,
            duration: Duration::from_secs(5),
            frame_len: 64,
            pps: None,
            batch: 64,
            start_delay: Duration::ZERO,
            sender_threads: 1,
            flows: 1,
        }
    }
}

/// Where the session's tap lives: enough to find it from a probe before traffic starts.
#[derive(Debug, Clone, Default, PartialEq, Eq, serde::Serialize)]
pub struct DeviceIdentity {
    pub(crate) netns_inode: u32,
    pub netns_name: String,
    pub(crate) netns_path: PathBuf,
    pub(crate) ifindex: u32,
    pub name: String,
}

/// Counters after a drain, relative to when the session started.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct DrainReport {
    pub reader: ReadReport,
    /// Frames left in the ring when the reader stopped, read by the drain.
    pub drained: u64,
    /// Change of the tap's interface counters.
    pub link: LinkStats,
    /// Change of the root qdisc's counters (`qlen`/`backlog` are current values); `None`
    /// when the tap has no qdisc that reports any.
    pub qdisc: Option<QdiscStats>,
    /// The vhost-net reader's own totals, when it read.
    pub vhost: Option<VhostCounters>,
}

/// A namespace with an up tap in it and a reader thread on its queue. Dropping it stops
/// the reader and removes the tap and the namespace.
#[derive(Debug)]
pub struct LoadSession {
    stop: Arc<AtomicBool>,
    reader_stop: Arc<AtomicBool>,
    reader: Option<Reader>,
    device: DeviceIdentity,
    qdisc_kind: String,
    tx_queue_len: u32,
    baseline: LinkStats,
    baseline_qdisc: Option<QdiscStats>,
    // Declared (and so dropped) in this order: socket, tap, then the namespace.
    rtnl: Rtnl,
    tap: Option<Tap>,
    netns: Option<NamedNetns>,
}

impl LoadSession {
    /// Creates the namespace `tap-probe-load-<pid>[-<n>]` with the tap [`TAP_NAME`] up in
    /// it, and starts the reader. `stop` ends the reader (and sends through
    /// [`LoadSession::send`]) early, e.g. from a signal handler.
    ///
    /// # Errors
    /// When any step fails; whatever was created is removed again.
    pub fn start(cfg: &SessionConfig, stop: Arc<AtomicBool>) -> Result<Self> {
        static SESSIONS: AtomicU32 = AtomicU32::new(0);
        let n = SESSIONS.fetch_add(1, Ordering::Relaxed);
        let pid = std::process::id();
        let name = if n == 0 {
            format!("tap-probe-load-{pid}")
        } else {
            format!("tap-probe-load-{pid}-{n}")
        };
        let netns = NamedNetns::create(&name)?;
        let (tap, mut rtnl) = netns::run_in(netns.path(), || setup_tap(cfg))
            .with_context(|| format!("cannot set up the tap in network namespace {name}"))?;
        let link = rtnl.link_by_index(tap.ifindex())?;
        let baseline_qdisc = rtnl.root_qdisc_stats(tap.ifindex()).ok();
        let reader_stop = Arc::new(AtomicBool::new(false));
        let reader = Reader::start(&tap, cfg, Arc::clone(&reader_stop))?;
        Ok(Self {
            stop,
            reader_stop,
            reader: Some(reader),
            device: DeviceIdentity {
                netns_inode: netns.inode(),
                netns_name: name,
                netns_path: netns.path().to_owned(),
                ifindex: tap.ifindex(),
                name: tap.name().to_owned(),
            },
            qdisc_kind: link.qdisc.clone().unwrap_or_default(),
            tx_queue_len: link.tx_queue_len,
            baseline: link.stats,
            baseline_qdisc,
            rtnl,
            tap: Some(tap),
            netns: Some(netns),
        })
    }

    #[must_use]
    pub fn device(&self) -> &DeviceIdentity {
        &self.device
    }

    /// Sends through the tap from inside its namespace. `ifindex` and `stop` of `cfg` are
    /// filled in by the session.
    ///
    /// # Errors
    /// When the sender fails.
    pub fn send(&self, cfg: &SenderConfig) -> Result<SendReport> {
        let cfg = SenderConfig {
            ifindex: self.device.ifindex,
            stop: Some(Arc::clone(&self.stop)),
            ..cfg.clone()
        };
        netns::run_in(&self.device.netns_path, || traffic::send(&cfg))
    }

    /// The tap's interface counters now (absolute, not relative to the start).
    ///
    /// # Errors
    /// When the netlink request fails.
    pub(crate) fn link_stats(&mut self) -> Result<LinkStats> {
        Ok(self.rtnl.link_by_index(self.device.ifindex)?.stats)
    }

    /// Stops the reader, empties the ring and returns the counters since the start. Call
    /// once, after sending; a second call finds the reader gone and reports it as idle.
    ///
    /// # Errors
    /// When the reader failed or reading the counters fails.
    pub fn drain(&mut self) -> Result<DrainReport> {
        self.reader_stop.store(true, Ordering::Relaxed);
        let tap = self
            .tap
            .as_ref()
            .ok_or_else(|| anyhow!("the tap is gone"))?;
        let (reader, drained, vhost) = match self.reader.take() {
            None => (ReadReport::default(), 0, None),
            Some(reader) => reader.drain(tap).context("the reader thread failed")?,
        };
        let now = self.link_stats()?;
        let link = LinkStats {
            tx_packets: now.tx_packets.saturating_sub(self.baseline.tx_packets),
            tx_bytes: now.tx_bytes.saturating_sub(self.baseline.tx_bytes),
            tx_dropped: now.tx_dropped.saturating_sub(self.baseline.tx_dropped),
            rx_packets: now.rx_packets.saturating_sub(self.baseline.rx_packets),
            rx_dropped: now.rx_dropped.saturating_sub(self.baseline.rx_dropped),
        };
        let qdisc = self
            .rtnl
            .root_qdisc_stats(self.device.ifindex)
            .ok()
            .map(|q| {
                let base = self
                    .baseline_qdisc
                    .clone()
                    .filter(|b| b.kind == q.kind)
                    .unwrap_or_default();
                QdiscStats {
                    packets: q.packets.saturating_sub(base.packets),
                    bytes: q.bytes.saturating_sub(base.bytes),
                    drops: q.drops.saturating_sub(base.drops),
                    requeues: q.requeues.saturating_sub(base.requeues),
                    overlimits: q.overlimits.saturating_sub(base.overlimits),
                    ..q
                }
            });
        Ok(DrainReport {
            reader,
            drained,
            link,
            qdisc,
            vhost,
        })
    }

    fn stop_reader(&mut self) -> Result<()> {
        self.reader_stop.store(true, Ordering::Relaxed);
        match self.reader.take() {
            None => Ok(()),
            Some(reader) => reader.join().map(drop),
        }
    }
}

/// The reader thread playing the VM, and what it hands back when it stops.
#[derive(Debug)]
enum Reader {
    Read(JoinHandle<Result<ReadReport>>),
    /// The vhost reader comes back from its thread so that the drain can take what is left
    /// and release the backend.
    Vhost(JoinHandle<Result<(VhostReader, ReadReport)>>),
}

impl Reader {
    fn start(tap: &Tap, cfg: &SessionConfig, stop: Arc<AtomicBool>) -> Result<Self> {
        let deadline = cfg.reader_deadline.unwrap_or(Duration::from_hours(1));
        let thread = std::thread::Builder::new().name("tap-reader".into());
        Ok(match cfg.reader {
            ReaderKind::Read => {
                let fd = tap.clone_queue_fd(0)?;
                let reader_cfg = ReaderConfig {
                    pps: cfg.reader_pps,
                    deadline,
                    max_packets: None,
                };
                Self::Read(
                    thread
                        .spawn(move || traffic::read(fd.as_fd(), &reader_cfg, &stop))
                        .context("cannot start the reader thread")?,
                )
            }
            ReaderKind::Vhost => {
                // Attached here, so that a missing /dev/vhost-net is an error before any
                // traffic; any thread of this process may then drive it.
                let mut vhost = VhostReader::attach(tap.queue_fd(0), &VhostConfig::default())?;
                let run_cfg = RunConfig {
                    pps: cfg.reader_pps,
                    deadline,
                    max_frames: None,
                    idle_stop: None,
                };
                Self::Vhost(
                    thread
                        .spawn(move || {
                            let run = vhost.run(&run_cfg, &stop, &mut |_| {})?;
                            Ok((vhost, read_report(run)))
                        })
                        .context("cannot start the vhost reader thread")?,
                )
            }
        })
    }

    /// Waits for the (stopped) reader, then takes what is left on the queue: frames in the
    /// tap's ring and, for vhost-net, in its batch and the receive ring; vhost-net's backend
    /// is released last, so that its count ends equal to the tap's `tx_packets`.
    fn drain(self, tap: &Tap) -> Result<(ReadReport, u64, Option<VhostCounters>)> {
        match self {
            Self::Read(handle) => {
                let report = join(handle)?;
                let drained = traffic::drain_until_quiet(tap.queue_fd(0), DRAIN_LIMIT)?;
                Ok((report, drained, None))
            }
            Self::Vhost(handle) => {
                let (mut vhost, report) = join(handle)?;
                let never = AtomicBool::new(false);
                let rest = vhost.run(
                    &RunConfig::drain(VHOST_QUIET, DRAIN_LIMIT),
                    &never,
                    &mut |_| {},
                )?;
                let last = vhost.detach(&mut |_| {})?;
                Ok((report, rest.frames + last.frames, Some(vhost.counters())))
            }
        }
    }

    fn join(self) -> Result<ReadReport> {
        match self {
            Self::Read(handle) => join(handle),
            Self::Vhost(handle) => join(handle).map(|(_, report)| report),
        }
    }
}

fn join<T>(handle: JoinHandle<Result<T>>) -> Result<T> {
    handle
        .join()
        .map_err(|_| anyhow!("the reader thread panicked"))?
}

/// A vhost reader's run as the `read(2)` reader reports it.
fn read_report(run: RunReport) -> ReadReport {
    ReadReport {
        packets: run.frames,
        bytes: run.bytes,
        // vhost-net copies the frames into guest buffers the reader does not look into.
        reordered: 0,
        elapsed: run.elapsed,
    }
}

impl Drop for LoadSession {
    fn drop(&mut self) {
        if let Err(err) = self.stop_reader() {
            log::warn!("reader thread of {}: {err:#}", self.device.name);
        }
        // The tap goes first (closing its fd deletes the device), then the namespace.
        drop(self.tap.take());
        drop(self.netns.take());
    }
}

/// Creates the tap in the calling thread's namespace and configures it.
fn setup_tap(cfg: &SessionConfig) -> Result<(Tap, Rtnl)> {
    let tap = Tap::create(
        TAP_NAME,
        TapOptions {
            backpressure: cfg.backpressure,
            ..TapOptions::default()
        },
    )?;
    let mut rtnl = Rtnl::open()?;
    // IPv6 would send router and multicast-listener solicitations into the tap when it
    // comes up, polluting the counts. /proc/sys/net resolves against the opener's
    // namespace, i.e. this thread's. Absent IPv6 is fine.
    let _ = std::fs::write(
        format!("/proc/sys/net/ipv6/conf/{}/disable_ipv6", tap.name()),
        "1",
    );
    // Before `up`, so the default qdisc is created with this limit (the ring is resized
    // either way, `tun_queue_resize`).
    if let Some(len) = cfg.tx_queue_len {
        rtnl.set_tx_queue_len(tap.ifindex(), len)?;
    }
    rtnl.set_up(tap.ifindex())?;
    if let Some(qdisc) = cfg.qdisc {
        rtnl.replace_root_qdisc(tap.ifindex(), qdisc)?;
    }
    Ok((tap, rtnl))
}

/// What a `load` run did (and a `demo`'s traffic, in its final JSON): its settings, then
/// the numbers it measured, which the table of [`LoadNumbers`] declares.
#[derive(Debug, Clone, Default, serde::Serialize)]
pub struct LoadReport {
    pub(crate) device: DeviceIdentity,
    pub(crate) reader: ReaderKind,
    /// The root qdisc's kind, as the kernel names it.
    pub qdisc: String,
    pub(crate) tx_queue_len: u32,
    /// The tap was opened with `IFF_BACKPRESSURE`.
    pub(crate) backpressure: bool,
    pub(crate) frame_len: usize,
    pub(crate) sender_threads: u32,
    pub(crate) pps_limit: Option<u64>,
    pub(crate) reader_pps_limit: Option<u64>,
    #[serde(flatten)]
    pub numbers: LoadNumbers,
    pub interrupted: bool,
    /// The vhost-net reader's own totals (`--reader vhost`): frames, buffers, kicks, waits.
    pub(crate) vhost: Option<VhostCounters>,
}

impl LoadReport {
    /// The report of a session's run: `cfg` as it ran, what its senders sent and what its
    /// drain found.
    #[must_use]
    pub fn of_run(
        session: &LoadSession,
        cfg: &LoadConfig,
        sent: &SendReport,
        drained: &DrainReport,
        interrupted: bool,
    ) -> Self {
        let secs = sent.elapsed.as_secs_f64();
        #[expect(
            clippy::cast_precision_loss,
            reason = "a rate; 52 bits of packet count are plenty"
        )]
        let per_sec = |n: u64| if secs > 0.0 { n as f64 / secs } else { 0.0 };
        Self {
            device: session.device().clone(),
            reader: cfg.session.reader,
            qdisc: drained
                .qdisc
                .as_ref()
                .map_or_else(|| session.qdisc_kind.clone(), |q| q.kind.clone()),
            tx_queue_len: session.tx_queue_len,
            backpressure: cfg.session.backpressure,
            frame_len: cfg.frame_len,
            sender_threads: cfg.sender_threads,
            pps_limit: cfg.pps,
            reader_pps_limit: cfg.session.reader_pps,
            numbers: LoadNumbers {
                attempted: sent.attempted,
                sent: sent.sent,
                enobufs: sent.enobufs,
                read_by_reader: drained.reader.packets,
                reordered_by_reader: (cfg.session.reader == ReaderKind::Read)
                    .then_some(drained.reader.reordered),
                drained: drained.drained,
                kernel_tx_packets: drained.link.tx_packets,
                kernel_tx_dropped: drained.link.tx_dropped,
                qdisc_drops: drained.qdisc.as_ref().map(|q| q.drops),
                qdisc_requeues: drained.qdisc.as_ref().map(|q| q.requeues),
                qdisc_backlog: drained.qdisc.as_ref().map(|q| u64::from(q.qlen)),
                elapsed_secs: secs,
                sender_pps: per_sec(sent.sent),
                delivered_pps: per_sec(drained.reader.packets),
            },
            interrupted,
            vhost: drained.vhost,
        }
    }

    /// The report as `(label, value)` pairs, in the order a reader wants them (the binary
    /// aligns them into a table).
    #[must_use]
    pub fn fields(&self) -> Vec<(&'static str, String)> {
        let opt = |v: Option<u64>| v.map_or_else(|| "-".to_owned(), |v| v.to_string());
        let mut fields = vec![
            (
                "device",
                format!(
                    "{} (ifindex {}, netns {} inode {})",
                    self.device.name,
                    self.device.ifindex,
                    self.device.netns_name,
                    self.device.netns_inode
                ),
            ),
            (
                "reader",
                match self.reader {
                    ReaderKind::Read => "read(2)".to_owned(),
                    ReaderKind::Vhost => "vhost-net".to_owned(),
                },
            ),
            ("qdisc", self.qdisc.clone()),
            ("tx_queue_len", self.tx_queue_len.to_string()),
            ("backpressure", self.backpressure.to_string()),
            ("frame_len", self.frame_len.to_string()),
            ("sender threads", self.sender_threads.to_string()),
            ("pps limit", opt(self.pps_limit)),
            ("reader pps limit", opt(self.reader_pps_limit)),
        ];
        fields.extend(
            LoadNumber::ALL
                .iter()
                .map(|&id| (id.label(), self.numbers.shown(id))),
        );
        fields
    }
}

/// Runs a whole `load`; setting `stop` ends it early with `interrupted` set.
///
/// # Errors
/// When a step fails.
pub fn run_load_with_stop(cfg: &LoadConfig, stop: &Arc<AtomicBool>) -> Result<LoadReport> {
    run_load_observed(cfg, stop, &mut NoObserver)
}

/// Something that watches a load's tap: told when the tap is up (before any traffic) and
/// when the run is over (after the drain).
pub(crate) trait Observer {
    /// # Errors
    /// When it cannot start watching; the run is abandoned.
    fn started(&mut self, device: &DeviceIdentity) -> Result<()>;
    /// # Errors
    /// When it cannot take its last reading.
    fn finished(&mut self) -> Result<()>;
}

struct NoObserver;

impl Observer for NoObserver {
    fn started(&mut self, _: &DeviceIdentity) -> Result<()> {
        Ok(())
    }

    fn finished(&mut self) -> Result<()> {
        Ok(())
    }
}

/// [`run_load_with_stop`] with `observer` told when the tap is up and when the run is over.
///
/// # Errors
/// When a step fails.
pub(crate) fn run_load_observed(
    cfg: &LoadConfig,
    stop: &Arc<AtomicBool>,
    observer: &mut dyn Observer,
) -> Result<LoadReport> {
    let session_cfg = SessionConfig {
        reader_deadline: Some(
            cfg.start_delay
                .saturating_add(cfg.duration)
                .saturating_add(READER_GRACE),
        ),
        ..cfg.session.clone()
    };
    let mut session = LoadSession::start(&session_cfg, Arc::clone(stop))?;
    observer.started(session.device())?;
    sleep_unless(cfg.start_delay, stop);
    let sent = if stop.load(Ordering::Relaxed) {
        SendReport::default()
    } else {
        send_with_threads(&session, cfg)?
    };
    let drained = session.drain()?;
    observer.finished()?;
    Ok(LoadReport::of_run(
        &session,
        cfg,
        &sent,
        &drained,
        stop.load(Ordering::Relaxed),
    ))
}

/// Sends `cfg.packets` through the session's tap from `cfg.sender_threads` threads at once,
/// each with its own share of the packets and of the rate; the report is their sum, over
/// the longest of their times.
fn send_with_threads(session: &LoadSession, cfg: &LoadConfig) -> Result<SendReport> {
    let threads = u64::from(cfg.sender_threads.max(1));
    let share = |total: u64, i: u64| total / threads + u64::from(i < total % threads);
    std::thread::scope(|scope| {
        let senders: Vec<_> = (0..threads)
            .map(|i| {
                let sender = SenderConfig {
                    ifindex: session.device().ifindex,
                    count: share(cfg.packets, i),
                    frame_len: cfg.frame_len,
                    deadline: cfg.duration,
                    pps: cfg.pps.map(|pps| share(pps, i).max(1)),
                    batch: cfg.batch,
                    flows: cfg.flows,
                    stop: None,
                };
                scope.spawn(move || session.send(&sender))
            })
            .collect();
        let mut total = SendReport::default();
        for sender in senders {
            let report = sender
                .join()
                .map_err(|_| anyhow!("a sender thread panicked"))??;
            total.attempted += report.attempted;
            total.sent += report.sent;
            total.enobufs += report.enobufs;
            total.elapsed = total.elapsed.max(report.elapsed);
        }
        Ok(total)
    })
}

pub(crate) fn sleep_unless(duration: Duration, stop: &AtomicBool) {
    let end = crate::lab::pacer::deadline_after(Instant::now(), duration);
    while !stop.load(Ordering::Relaxed) {
        let left = end.saturating_duration_since(Instant::now());
        if left.is_zero() {
            break;
        }
        std::thread::sleep(left.min(Duration::from_millis(50)));
    }
}

#[cfg(all(test, feature = "privileged-tests"))]
mod privileged_tests {
    use super::*;

    /// Whether this kernel's tun stops the queue of the load's tap (`cfg`) instead of
    /// dropping at its ring, asked of the kernel itself.
    fn stops_instead_of_dropping(cfg: &SessionConfig) -> bool {
        let kernel = tap_probe_observer::kernel::KernelInfo::load().unwrap();
        let mode = kernel.tun_backpressure.expect("TUNGETFEATURES");
        let flags = if cfg.backpressure {
            tap_probe_observer::os::tap::IFF_BACKPRESSURE
        } else {
            0
        };
        cfg.qdisc != Some(RootQdisc::Noqueue) && mode.of_tap(flags)
    }

    /// Every frame handed to the kernel is accounted for, by the kernel's own counters:
    /// taken by the reader, dropped at the ring, or dropped by the qdisc (at its limit, or
    /// by its AQM: `fq_codel`, the guests' default, drops what waits too long while the
    /// queue is stopped). Frames sent in batches, so a batch cut short by a drop is
    /// counted too.
    #[test]
    fn fast_reader_accounts_for_every_packet() {
        if !tap_probe_verdict::root() {
            return;
        }
        let cfg = LoadConfig {
            packets: 50_000,
            duration: Duration::from_secs(3),
            ..LoadConfig::default()
        };
        let report = run_load_with_stop(&cfg, &Arc::new(AtomicBool::new(false))).unwrap();
        println!("{report:#?}");
        assert!(!report.device.netns_path.exists(), "namespace left behind");
        assert!(report.numbers.sent > 0);
        // tun counts tx_packets when the reader takes a packet: nothing else reads.
        assert_eq!(
            report.numbers.kernel_tx_packets,
            report.numbers.read_by_reader + report.numbers.drained
        );
        assert_eq!(
            report.numbers.attempted,
            report.numbers.kernel_tx_packets
                + report.numbers.kernel_tx_dropped
                + report.numbers.qdisc_drops.unwrap(),
            "every frame taken, dropped at the ring or by the qdisc: {report:?}"
        );
    }

    /// A slow reader and a small ring: on a stock kernel the ring drops most frames; with
    /// the fix the queue stops and the qdisc drops them at its limit instead.
    #[test]
    fn slow_reader_drops_where_the_kernel_says() {
        if !tap_probe_verdict::root() {
            return;
        }
        let session = SessionConfig {
            qdisc: Some(RootQdisc::Pfifo { limit: None }),
            tx_queue_len: Some(100),
            reader_pps: Some(2_000),
            ..SessionConfig::default()
        };
        let stops = stops_instead_of_dropping(&session);
        let cfg = LoadConfig {
            session,
            packets: 20_000,
            duration: Duration::from_secs(1),
            pps: Some(20_000),
            ..LoadConfig::default()
        };
        let report = run_load_with_stop(&cfg, &Arc::new(AtomicBool::new(false))).unwrap();
        println!(
            "stops instead of dropping: {stops}\n{}",
            serde_json::to_string_pretty(&report).unwrap()
        );
        assert_eq!(report.qdisc, "pfifo");
        assert_eq!(report.tx_queue_len, 100);
        let qdisc_drops = report.numbers.qdisc_drops.unwrap();
        // The ring (100) plus a 2000 pps reader cannot take 20000 pps: most frames drop.
        let dropped = if stops {
            assert_eq!(report.numbers.kernel_tx_dropped, 0, "{report:?}");
            qdisc_drops
        } else {
            assert_eq!(qdisc_drops, 0, "{report:?}");
            report.numbers.kernel_tx_dropped
        };
        assert!(dropped > report.numbers.attempted / 2, "{report:?}");
        assert!(report.numbers.read_by_reader <= 2_500, "{report:?}");
        // The pacer never exceeds the rate (a loaded machine may fall short of it).
        assert!(report.numbers.sender_pps <= 21_000.0, "{report:?}");
        assert_eq!(
            report.numbers.attempted,
            report.numbers.kernel_tx_packets + report.numbers.kernel_tx_dropped + qdisc_drops
        );
        // Drops at the qdisc's limit are the sender's ENOBUFS, and so are the ring's when
        // nothing else would report them.
        if stops {
            assert_eq!(report.numbers.enobufs, qdisc_drops, "{report:?}");
        }
    }

    /// `--backpressure` where the kernel has the flag; a clear error, and nothing left
    /// behind, where it has not.
    #[test]
    fn backpressure_is_refused_where_the_kernel_lacks_it() {
        if !tap_probe_verdict::root() {
            return;
        }
        let features = tap_probe_observer::os::tap::tun_features().unwrap();
        let cfg = LoadConfig {
            session: SessionConfig {
                qdisc: Some(RootQdisc::Pfifo { limit: None }),
                reader_pps: Some(5_000),
                backpressure: true,
                ..SessionConfig::default()
            },
            packets: 5_000,
            duration: Duration::from_secs(2),
            pps: Some(10_000),
            ..LoadConfig::default()
        };
        let result = run_load_with_stop(&cfg, &Arc::new(AtomicBool::new(false)));
        if features & tap_probe_observer::os::tap::IFF_BACKPRESSURE == 0 {
            let err = format!("{:#}", result.unwrap_err());
            assert!(err.contains("does not support IFF_BACKPRESSURE"), "{err}");
            assert!(err.contains(&format!("{features:#06x}")), "{err}");
            let leftover = std::fs::read_dir("/run/netns").map_or(0, |dir| {
                dir.filter_map(Result::ok)
                    .filter(|e| {
                        e.file_name()
                            .to_string_lossy()
                            .starts_with(&format!("tap-probe-load-{}", std::process::id()))
                    })
                    .count()
            });
            assert_eq!(leftover, 0, "a namespace was left behind");
        } else {
            let report = result.unwrap();
            assert!(report.backpressure);
            assert_eq!(report.numbers.kernel_tx_dropped, 0, "{report:?}");
            assert_eq!(
                report.numbers.attempted,
                report.numbers.kernel_tx_packets + report.numbers.qdisc_drops.unwrap()
            );
        }
    }

    #[test]
    fn session_exposes_device_before_traffic() {
        if !tap_probe_verdict::root() {
            return;
        }
        let stop = Arc::new(AtomicBool::new(false));
        let mut session = LoadSession::start(&SessionConfig::default(), Arc::clone(&stop)).unwrap();
        let dev = session.device().clone();
        assert_eq!(netns::inode_of(&dev.netns_path).unwrap(), dev.netns_inode);
        assert_eq!(dev.name, TAP_NAME);
        // Stop already set: the sender returns at once.
        stop.store(true, Ordering::Relaxed);
        let sent = session
            .send(&SenderConfig::new(0, 1000, Duration::from_secs(1)))
            .unwrap();
        assert_eq!(sent.attempted, 0);
        let drained = session.drain().unwrap();
        assert_eq!(drained.link.tx_packets, 0);
        drop(session);
        assert!(!dev.netns_path.exists());
    }
}
