use std::cell::RefCell;
use std::collections::BTreeMap;

use tap_probe_common::QueueCounters;

use super::*;
use crate::bpf::backend::Sources;
use crate::bpf::probe::{DeviceCounters, Origin, RingOccupancy};
use crate::host::discovery::DeviceKind;
use crate::os::netlink::LinkStats;

/// A host whose devices and counters the test sets, and which records what the
/// tracker asked of it (the recording's tests use it too).
pub(crate) struct FakeHost {
    pub(crate) devices: Vec<Device>,
    /// Devices of the counted drivers that the filter leaves out.
    left_out: Vec<DeviceKey>,
    /// Devices the programs registered at their first packet (once registering).
    registered: Vec<DeviceKey>,
    registering: bool,
    /// Devices the programs were told to skip.
    ignored: Vec<DeviceKey>,
    counters: HashMap<DeviceKey, DeviceCounters>,
    tracked: HashMap<DeviceKey, u32>,
    /// Every call, in order: `refresh`, `track IFINDEX N`, `untrack IFINDEX`.
    pub(crate) calls: Vec<String>,
    now_ns: u64,
    sources: Sources,
    /// How many devices the probe has room for.
    pub(crate) room: usize,
    wire: RefCell<Option<Wire>>,
    /// What the kernel skipped of each program, as the next reads find it.
    missed: Vec<ProgramMissed>,
    modules: Vec<ModuleChange>,
}

/// Traffic on one device while the tracker works: each call into the host lets the next
/// number of `per_call` packets (cycling) through, which the kernel counts and, once the
/// device is tracked, the probes too (as takes by the reader).
struct Wire {
    key: DeviceKey,
    per_call: Vec<u64>,
    calls: usize,
    kernel: u64,
    ours: u64,
    /// Each packet reaches the probes only at the next `settle`, after the kernel
    /// counted it (as tun counts `tx_packets` before the reader's free).
    lag: bool,
    /// Counted by the kernel, not yet by the probes.
    in_flight: u64,
}

impl FakeHost {
    fn tick(&self) {
        if let Some(w) = self.wire.borrow_mut().as_mut() {
            let n = w.per_call[w.calls % w.per_call.len()];
            w.calls += 1;
            w.kernel += n;
            if w.lag {
                w.in_flight += n;
            } else if self.tracked.contains_key(&w.key) {
                w.ours += n;
            }
        }
    }

    /// The packets in flight reach the probes (counted then if the device is tracked).
    fn land(&self) {
        if let Some(w) = self.wire.borrow_mut().as_mut() {
            if self.tracked.contains_key(&w.key) {
                w.ours += w.in_flight;
            }
            w.in_flight = 0;
        }
    }

    /// The kernel's extra count of `key`, and the probes'.
    fn on_wire(&self, key: DeviceKey) -> (u64, u64) {
        self.wire
            .borrow()
            .as_ref()
            .filter(|w| w.key == key)
            .map_or((0, 0), |w| (w.kernel, w.ours))
    }

    fn stats(&self, key: DeviceKey) -> Option<LinkStats> {
        let mut stats = self.devices.iter().find(|d| d.key == key)?.stats;
        stats.tx_packets += self.on_wire(key).0;
        Some(stats)
    }
}

impl FakeHost {
    pub(crate) fn new() -> Self {
        Self {
            devices: Vec::new(),
            left_out: Vec::new(),
            registered: Vec::new(),
            registering: false,
            ignored: Vec::new(),
            counters: HashMap::new(),
            tracked: HashMap::new(),
            calls: Vec::new(),
            now_ns: 1_000_000_000,
            sources: crate::host::report::tests::sources(),
            room: usize::MAX,
            wire: RefCell::new(None),
            missed: Vec::new(),
            modules: Vec::new(),
        }
    }
}

impl Host for FakeHost {
    fn devices(&mut self) -> anyhow::Result<Scan> {
        self.tick();
        let matching: Vec<Device> = self
            .devices
            .iter()
            .map(|d| Device {
                stats: self.stats(d.key).unwrap(),
                ..d.clone()
            })
            .collect();
        let namespaces = matching
            .iter()
            .map(|d| d.key.netns_inode)
            .chain(self.left_out.iter().map(|k| k.netns_inode))
            .chain([7])
            .map(|ns| (ns, true))
            .collect();
        Ok(Scan {
            matching,
            left_out: self.left_out.clone(),
            namespaces,
        })
    }

    fn registered(&mut self) -> anyhow::Result<Vec<DeviceKey>> {
        let new: Vec<DeviceKey> = self
            .registered
            .iter()
            .filter(|k| !self.tracked.contains_key(k))
            .copied()
            .collect();
        for key in &new {
            self.tracked.insert(*key, 1);
        }
        Ok(new)
    }

    fn track(&mut self, key: DeviceKey, queues: u32, _flags: u32) -> anyhow::Result<Origin> {
        self.tick();
        if self.tracked.contains_key(&key) {
            self.calls.push(format!("adopt {}", key.ifindex));
            return Ok(Origin::Probes);
        }
        if self.tracked.len() >= self.room {
            self.calls.push(format!("full {}", key.ifindex));
            return Err(Full::Devices.into());
        }
        self.calls.push(format!("track {} {queues}", key.ifindex));
        self.tracked.insert(key, queues);
        Ok(Origin::Loader)
    }

    fn ignore(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        self.calls.push(format!("ignore {}", key.ifindex));
        self.tracked.remove(&key);
        self.ignored.push(key);
        Ok(())
    }

    fn untrack(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        self.calls.push(format!("untrack {}", key.ifindex));
        self.tracked.remove(&key);
        self.ignored.retain(|k| *k != key);
        Ok(())
    }

    fn start_registering(&mut self) -> anyhow::Result<()> {
        self.calls.push("registering".to_owned());
        self.registering = true;
        Ok(())
    }

    fn no_room(&self) -> u64 {
        0
    }

    fn counters(&self, key: DeviceKey) -> anyhow::Result<DeviceCounters> {
        let queues = *self
            .tracked
            .get(&key)
            .ok_or_else(|| anyhow::anyhow!("{key:?} is not tracked"))?;
        self.tick();
        let mut counters = self.counters.get(&key).cloned().unwrap_or_default();
        // The queues tracked, and any other the programs registered at its first packet.
        let queues = usize::try_from(queues).unwrap().max(counters.queues.len());
        counters.queues.resize(queues, QueueCounters::default());
        counters.stopped_since.resize(queues, None);
        counters.occupancy.resize(queues, RingOccupancy::default());
        counters.queues[0].consumed += self.on_wire(key).1;
        Ok(counters)
    }

    fn queue_counters(&self, key: DeviceKey) -> anyhow::Result<Vec<QueueCounters>> {
        Ok(self.counters(key)?.queues)
    }

    fn reset(&mut self, key: DeviceKey) -> anyhow::Result<()> {
        self.calls.push(format!("reset {}", key.ifindex));
        self.counters.remove(&key);
        if let Some(w) = self.wire.get_mut().as_mut().filter(|w| w.key == key) {
            w.ours = 0;
        }
        Ok(())
    }

    fn kernel_stats(&mut self, key: DeviceKey) -> anyhow::Result<LinkStats> {
        self.tick();
        self.stats(key)
            .ok_or_else(|| anyhow::anyhow!("no device {key:?}"))
    }

    fn settle(&self, _read_took: std::time::Duration) {
        self.land();
    }

    fn refresh_started(&mut self) {
        self.calls.push("refresh".to_owned());
        // Between refreshes, whatever the kernel counted has reached the probes.
        self.land();
    }

    fn sources(&self) -> &Sources {
        &self.sources
    }

    fn now_ns(&self) -> u64 {
        self.now_ns
    }

    fn missed(&self) -> Vec<ProgramMissed> {
        self.missed.clone()
    }

    fn module_changes(&self) -> Vec<ModuleChange> {
        self.modules.clone()
    }

    fn memory(&self) -> Option<crate::bpf::probe::Memory> {
        None
    }
}

pub(crate) fn device(ifindex: u32, name: &str, tx_packets: u64, tx_dropped: u64) -> Device {
    Device {
        key: DeviceKey {
            netns_inode: 7,
            ifindex,
        },
        name: name.to_owned(),
        netns: "ns".to_owned(),
        kind: DeviceKind::Tap,
        queues: 1,
        active_queues: 1,
        tx_queue_len: 1000,
        owners: Vec::new(),
        stats: LinkStats {
            tx_packets,
            tx_dropped,
            ..LinkStats::default()
        },
        tun_flags: Some(0x1002),
    }
}

fn consumed(n: u64) -> DeviceCounters {
    DeviceCounters {
        queues: vec![QueueCounters {
            consumed: n,
            ..QueueCounters::default()
        }],
        stopped_since: vec![None],
        occupancy: vec![RingOccupancy::default()],
        drop_reasons: BTreeMap::new(),
    }
}

fn tracker() -> Tracker<FakeHost> {
    Tracker::on(FakeHost::new(), ReasonNames::default())
}

const TAP0: DeviceKey = DeviceKey {
    netns_inode: 7,
    ifindex: 3,
};

/// A device there at attach began before tracking: the kernel's counters then are its
/// baseline, shown as `kernel.*_at_start`, and the rows show the growth since.
#[test]
fn a_device_there_at_attach_is_tracked_mid_life() {
    let mut t = tracker();
    t.host.devices = vec![device(3, "tap0", 100, 40)];
    let rows = t.refresh().unwrap().rows;
    assert_eq!(t.host.tracked.get(&TAP0), Some(&1));
    assert_eq!(rows.len(), 1);
    assert!(!rows[0].from_birth);
    assert_eq!(
        (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
        (0, 0)
    );
    assert_eq!(
        (
            rows[0].kernel_at_start.tx_packets,
            rows[0].kernel_at_start.tx_dropped
        ),
        (100, 40)
    );
    // Later the kernel's counters have grown: the rows show the growth since tracking.
    t.host.devices = vec![device(3, "tap0", 150, 45)];
    t.host.counters.insert(TAP0, consumed(50));
    let rows = t.refresh().unwrap().rows;
    assert_eq!(
        (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
        (50, 5)
    );
    assert_eq!(rows[0].counters.consumed, 50);
    assert!(!rows[0].retired);
    let tracks = t
        .host
        .calls
        .iter()
        .filter(|c| c.starts_with("track"))
        .count();
    assert_eq!(tracks, 1, "tracked once: {:?}", t.host.calls);
    // The programs register new devices only once every device there was tracked.
    let registering = t.host.calls.iter().position(|c| c == "registering");
    let tracked = t.host.calls.iter().position(|c| c == "track 3 1");
    assert!(tracked < registering, "{:?}", t.host.calls);
}

/// A device created after attach is counted from its first packet: the programs
/// registered it, the watcher takes it over without zeroing anything, and the kernel's
/// counters count from zero, all of them.
#[test]
fn a_device_created_after_attach_is_counted_from_birth() {
    let mut t = tracker();
    assert!(t.refresh().unwrap().rows.is_empty());
    assert!(t.host.registering);
    // It sent 100 packets before this refresh, which the programs counted.
    t.host.registered = vec![TAP0];
    t.host.devices = vec![device(3, "tap0", 100, 40)];
    t.host.counters.insert(TAP0, consumed(100));
    let rows = t.refresh().unwrap().rows;
    assert_eq!(rows.len(), 1);
    assert!(rows[0].from_birth);
    assert_eq!(
        (rows[0].kernel.tx_packets, rows[0].kernel.tx_dropped),
        (100, 40)
    );
    assert_eq!(rows[0].kernel_at_start, KernelAtStart::default());
    assert_eq!(rows[0].counters.consumed, 100);
    assert!(
        !t.host.calls.iter().any(|c| c.starts_with("reset")),
        "nothing the programs counted is zeroed: {:?}",
        t.host.calls
    );
    assert!(t.host.calls.contains(&"adopt 3".to_owned()));
    // A quiet one (no packet yet, so not registered) is from birth too.
    t.host.devices.push(device(4, "tap1", 0, 0));
    let rows = t.refresh().unwrap().rows;
    assert!(rows.iter().all(|r| r.from_birth), "{rows:?}");
}

/// A namespace that went away may give its inode to one created later, whose first device
/// takes ifindex 2 again: a new device, counted from its first packet, not the one seen
/// before under the same key.
#[test]
fn a_namespace_whose_inode_comes_back_holds_new_devices() {
    let mut t = tracker();
    let key = DeviceKey {
        netns_inode: 9,
        ifindex: 2,
    };
    let mut old = device(2, "old0", 500, 0);
    old.key = key;
    t.host.devices = vec![old];
    let rows = t.refresh().unwrap().rows;
    assert!(!rows[0].from_birth, "there at attach");
    // The namespace goes, with its device: no scan lists it.
    t.host.devices.clear();
    let rows = t.refresh().unwrap().rows;
    assert!(rows.iter().all(|r| r.retired), "{rows:?}");
    // A namespace with the same inode, whose device sent 100 packets the programs counted.
    let mut new = device(2, "new0", 100, 0);
    new.key = key;
    t.host.devices = vec![new];
    t.host.registered = vec![key];
    t.host.counters.insert(key, consumed(100));
    let rows = t.refresh().unwrap().rows;
    assert_eq!(rows.len(), 1, "{rows:?}");
    assert_eq!(rows[0].ifname, "new0");
    assert!(rows[0].from_birth, "a new device: {rows:?}");
    assert_eq!(rows[0].counters.consumed, 100);
    assert_eq!(rows[0].kernel.tx_packets, 100);
    assert_eq!(rows[0].kernel_at_start, KernelAtStart::default());
}

/// Devices the filter leaves out are skipped by the programs (so not registered), and
/// forgotten once gone; one registered before the watcher knew is left out too.
#[test]
fn devices_left_out_are_skipped_and_forgotten_once_gone() {
    let mut t = tracker();
    let other = DeviceKey {
        netns_inode: 7,
        ifindex: 9,
    };
    t.host.left_out = vec![other];
    t.refresh().unwrap();
    assert_eq!(t.host.ignored, [other]);
    let ignores = |t: &Tracker<FakeHost>| {
        t.host
            .calls
            .iter()
            .filter(|c| c.starts_with("ignore"))
            .count()
    };
    let once = ignores(&t);
    t.refresh().unwrap();
    assert_eq!(ignores(&t), once, "left out once");
    t.host.left_out.clear();
    t.refresh().unwrap();
    assert!(t.host.ignored.is_empty());
    assert!(t.host.calls.contains(&"untrack 9".to_owned()));
    // Registered by the programs, then found left out by the filter.
    t.host.registered = vec![other];
    t.host.left_out = vec![other];
    let report = t.refresh().unwrap();
    assert!(report.rows.is_empty());
    assert_eq!(t.host.ignored, [other]);
    assert!(!t.host.tracked.contains_key(&other));
}

/// A device registered by the programs that came and went between two refreshes, in a
/// namespace that was read, is forgotten (its slots go back) and counted as gone unnamed.
#[test]
fn a_device_gone_before_any_scan_found_it_is_forgotten() {
    let mut t = tracker();
    t.refresh().unwrap();
    t.host.registered = vec![TAP0];
    let report = t.refresh().unwrap();
    assert!(!t.host.tracked.contains_key(&TAP0));
    assert!(t.host.calls.contains(&"untrack 3".to_owned()));
    assert!(t.pending.is_empty());
    // It is in no row, and the report says so.
    assert!(report.rows.is_empty());
    assert_eq!(report.gone_unnamed, 1);
    assert!(
        report
            .caveats()
            .contains(&crate::host::report::Caveat::GoneUnnamed(1))
    );
}

#[test]
fn a_gone_device_is_reported_once_more_with_its_last_counters_then_forgotten() {
    let mut t = tracker();
    let key = DeviceKey {
        netns_inode: 7,
        ifindex: 3,
    };
    t.host.devices = vec![device(3, "tap0", 10, 0), device(4, "tap1", 0, 0)];
    t.refresh().unwrap();
    t.host.devices = vec![device(3, "tap0", 30, 0), device(4, "tap1", 0, 0)];
    t.host.counters.insert(key, consumed(20));
    t.refresh().unwrap();
    // tap0 goes; its slots still hold its last counters.
    t.host.devices = vec![device(4, "tap1", 0, 0)];
    t.host.counters.insert(key, consumed(25));
    let rows = t.refresh().unwrap().rows;
    let gone: Vec<_> = rows.iter().filter(|r| r.retired).collect();
    assert_eq!(gone.len(), 1);
    assert_eq!(gone[0].ifname, "tap0");
    // The fake refuses to read an untracked device: these were read before untracking.
    assert_eq!(gone[0].counters.consumed, 25);
    assert_eq!(
        gone[0].kernel.tx_packets, 20,
        "the kernel's last known delta"
    );
    let untracks = t.host.calls.iter().filter(|c| *c == "untrack 3").count();
    assert_eq!(untracks, 1, "{:?}", t.host.calls);
    assert!(!t.host.tracked.contains_key(&key));
    let rows = t.refresh().unwrap().rows;
    assert_eq!(rows.len(), 1);
    assert_eq!(rows[0].ifname, "tap1", "then it is gone: {rows:?}");
}

#[test]
fn queues_in_use_are_tracked_and_shown_with_those_counting() {
    let mut t = tracker();
    let key = DeviceKey {
        netns_inode: 7,
        ifindex: 5,
    };
    // A multi-queue tap: 256 queues allocated, 2 attached.
    let mut mq = device(5, "tapmq", 0, 0);
    mq.queues = 256;
    mq.active_queues = 2;
    t.host.devices = vec![mq];
    let rows = t.refresh().unwrap().rows;
    assert_eq!(
        t.host.tracked.get(&key),
        Some(&2),
        "the attached queues, not the 256 allocated: the programs add any other"
    );
    assert_eq!(rows.iter().map(|r| r.queue).collect::<Vec<_>>(), [0, 1]);
    // Queue 9 counted something (attached since; the programs registered it): it shows too.
    let mut counters = DeviceCounters::default();
    counters.queues.resize(10, QueueCounters::default());
    counters.queues[9].enqueued = 3;
    counters.stopped_since.resize(10, None);
    t.host.counters.insert(key, counters);
    let rows = t.refresh().unwrap().rows;
    assert_eq!(rows.iter().map(|r| r.queue).collect::<Vec<_>>(), [0, 1, 9]);
}

#[test]
fn a_stopped_queue_shows_the_stop_still_running() {
    let mut t = tracker();
    let key = DeviceKey {
        netns_inode: 7,
        ifindex: 3,
    };
    t.host.devices = vec![device(3, "tap0", 0, 0)];
    t.refresh().unwrap();
    let mut counters = consumed(0);
    counters.queues[0].stopped_ns = 1_000;
    counters.stopped_since[0] = Some(t.host.now_ns - 500);
    t.host.counters.insert(key, counters);
    let row = t.refresh().unwrap().rows.remove(0);
    assert!(row.stopped);
    assert_eq!(row.counters.stopped_ns, 1_500);
}

#[test]
fn rows_are_sorted_by_namespace_device_and_queue() {
    let mut t = tracker();
    let mut b = device(2, "b", 0, 0);
    b.netns = "a-ns".to_owned();
    t.host.devices = vec![device(3, "z", 0, 0), device(4, "a", 0, 0), b];
    let rows = t.refresh().unwrap().rows;
    let order: Vec<(&str, &str)> = rows
        .iter()
        .map(|r| (r.netns.as_str(), r.ifname.as_str()))
        .collect();
    assert_eq!(order, [("a-ns", "b"), ("ns", "a"), ("ns", "z")]);
}

/// A tracker of one tap that has sent 5,000 packets, on which `per_call[i]` more pass
/// at the i-th read of any counter (cycling).
fn under_load(per_call: Vec<u64>) -> Tracker<FakeHost> {
    let mut t = tracker();
    t.host.devices = vec![device(3, "tap0", 5_000, 0)];
    *t.host.wire.get_mut() = Some(Wire {
        key: DeviceKey {
            netns_inode: 7,
            ifindex: 3,
        },
        per_call,
        calls: 0,
        kernel: 0,
        ours: 0,
        lag: false,
        in_flight: 0,
    });
    t
}

/// Refreshes under `t`'s load, each within the skew it shows; then stops the traffic:
/// the refresh after it has counted something, with no skew, and the kernel's column and
/// the probes' agree exactly.
fn assert_within_skew_then_exact(t: &mut Tracker<FakeHost>) {
    for _ in 0..5 {
        let row = t.refresh().unwrap().rows.remove(0);
        assert!(
            row.kernel.tx_packets.abs_diff(row.counters.consumed) <= row.kernel.skew,
            "under load the difference is within the skew shown: {row:?}"
        );
    }
    t.host.wire.get_mut().as_mut().unwrap().per_call = vec![0];
    let row = t.refresh().unwrap().rows.remove(0);
    assert!(row.counters.consumed > 0, "{row:?}");
    assert_eq!(row.kernel.skew, 0, "{row:?}");
    assert_eq!(
        row.kernel.tx_packets, row.counters.consumed,
        "once traffic stops the two agree: {row:?}"
    );
}

/// Attached while a load runs (packets flow between any two reads, in bursts): once the
/// traffic stops, the kernel's column and the probes' agree exactly, and the skew says so.
#[test]
fn attached_under_load_the_kernel_columns_agree_once_traffic_stops() {
    let mut t = under_load(vec![2, 0, 3, 0, 0, 1, 0]);
    assert_within_skew_then_exact(&mut t);
}

/// The kernel counts each packet a moment before the probes do: one caught between the
/// two when the kernel's statistics are read reaches the probes before their counters
/// are read, so it is bracketed, and once traffic stops the two agree exactly.
#[test]
fn packets_the_kernel_counted_first_are_bracketed() {
    let mut t = under_load(vec![2, 0, 3, 0, 0, 1, 0]);
    t.host.wire.get_mut().as_mut().unwrap().lag = true;
    assert_within_skew_then_exact(&mut t);
}

/// A load that never pauses: no exact baseline can be read, and the skew bounds the
/// difference instead of hiding it.
#[test]
fn a_load_without_pauses_shows_its_skew() {
    let mut t = under_load(vec![1]);
    t.refresh().unwrap();
    t.host.wire.get_mut().as_mut().unwrap().per_call = vec![0];
    let row = t.refresh().unwrap().rows.remove(0);
    assert!(row.kernel.skew > 0, "{row:?}");
    let diff = row.counters.consumed - row.kernel.tx_packets;
    assert!(diff > 0 && diff <= row.kernel.skew, "{row:?}");
}

/// When the probe's tables are full, the devices left out are listed, the refresh goes
/// on, and they are tracked once a device goes away and makes room.
#[test]
fn devices_beyond_the_tables_are_listed_and_tracked_once_room_is_made() {
    let mut t = tracker();
    t.host.room = 2;
    t.host.devices = vec![
        device(3, "tap0", 0, 0),
        device(4, "tap1", 0, 0),
        device(5, "tap2", 0, 0),
    ];
    let report = t.refresh().unwrap();
    assert_eq!(report.rows.len(), 2);
    assert_eq!(report.untracked.len(), 1, "{:?}", report.untracked);
    assert!(report.untracked[0].reason.contains("tracked already"));
    // Full: no attempt is made again until something goes away.
    let attempts = |t: &Tracker<FakeHost>| {
        t.host
            .calls
            .iter()
            .filter(|c| c.starts_with("full"))
            .count()
    };
    let before = attempts(&t);
    let report = t.refresh().unwrap();
    assert_eq!((report.rows.len(), report.untracked.len()), (2, 1));
    assert_eq!(attempts(&t), before);
    // One of the tracked ones goes: the untracked one takes its place.
    let gone = report.rows[0].ifindex;
    t.host.devices.retain(|d| d.key.ifindex != gone);
    let report = t.refresh().unwrap();
    assert!(report.untracked.is_empty(), "{:?}", report.untracked);
    assert_eq!(report.rows.iter().filter(|r| !r.retired).count(), 2);
}

/// Every refresh reads what the kernel skipped of each program, and a report that has
/// a skip says its counts may be short (the outputs show it: see the output's tests).
#[test]
fn skipped_program_runs_are_reported_per_program_and_mark_the_counts_short() {
    let mut t = tracker();
    t.host.devices = vec![device(3, "tap0", 0, 0)];
    let quiet = vec![
        ProgramMissed {
            program: "consume_entry".to_owned(),
            runs: Some(0),
            kprobe: Some(0),
        },
        ProgramMissed {
            program: "kfree_skb".to_owned(),
            runs: Some(0),
            kprobe: None,
        },
    ];
    t.host.missed.clone_from(&quiet);
    let report = t.refresh().unwrap();
    assert!(!report.may_be_short());
    assert_eq!(report.missed, quiet);

    t.host.missed = quiet;
    t.host.missed[0].kprobe = Some(2);
    t.host.missed[1].runs = Some(5);
    let report = t.refresh().unwrap();
    assert!(report.may_be_short());
    assert_eq!(report.missed, t.host.missed);
}

/// A module located at attach that changes later is reported in every refresh, and
/// warned about once.
#[test]
fn a_module_loaded_after_attach_is_reported() {
    use crate::kernel::modules::Change;
    let mut t = tracker();
    t.host.devices = vec![device(3, "tap0", 0, 0)];
    assert!(t.refresh().unwrap().modules_changed.is_empty());
    t.host.modules = vec![ModuleChange {
        module: "veth",
        change: Change::Loaded,
    }];
    for _ in 0..2 {
        let report = t.refresh().unwrap();
        assert_eq!(report.modules_changed, t.host.modules);
    }
    assert_eq!(t.warned.len(), 1);
}
