//! What one refresh shows: a row per (device, queue) with our counters and the kernel's own,
//! shared by the table, the JSON lines and the final summary.

use std::collections::BTreeMap;

use serde::Serialize;
use tap_probe_common::{KernelStat, Metric, QueueCounters, Requires, Source};

use crate::bpf::probe::{DeviceCounters, RingOccupancy};
use crate::host::discovery::{Device, DeviceKind, Owner};
use crate::kernel::ReasonNames;

/// A device that matches the filter but is not counted.
#[derive(Clone, Debug, PartialEq, Eq, serde::Serialize)]
pub struct Untracked {
    pub ifname: String,
    pub netns: String,
    pub reason: String,
}

/// The kernel's own counters of a device, as deltas since tap-probe started tracking it.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelDeltas {
    /// tun/tap count a packet here when the reader takes it (`tun_put_user`).
    pub tx_packets: u64,
    /// Drops inside the driver's transmit (`tun_net_xmit`'s `drop:` path).
    pub tx_dropped: u64,
    /// How many packets the two above may be off from the probes' counters: counted while
    /// the kernel's statistics were read, or before its baseline could be taken.
    pub skew: u64,
}

/// The kernel's own counters of a device when tap-probe started tracking it: what tracking
/// did not see. Zero for a device tracked from birth.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct KernelAtStart {
    pub tx_packets: u64,
    pub tx_dropped: u64,
}

/// One device queue in one refresh. Its values are read through [`Row::value`], by the
/// descriptors of [`tap_probe_common::METRICS`]; the outputs iterate those.
#[derive(Clone, Debug)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts of one queue, each shown and serialized by name"
)]
pub struct Row {
    pub ifname: String,
    pub ifindex: u32,
    pub netns: String,
    pub kind: DeviceKind,
    pub queue: u32,
    pub owner: Option<Owner>,
    /// Cumulative since tracking began; `stopped_ns` includes a stop still running.
    pub counters: QueueCounters,
    /// Whether the queue is stopped as last observed.
    pub stopped: bool,
    /// Stopped, and the reader took nothing for longer than the watcher's stuck limit.
    pub stuck: bool,
    /// The ring's occupancy samples; `None` where the ring is not sampled (not a tun/tap,
    /// or no BTF for its offsets).
    pub occupancy: Option<RingOccupancy>,
    /// Whether the device stops its queue instead of tail-dropping; `None` for devices
    /// that are not tun/tap, or whose flags could not be read.
    pub backpressure: Option<bool>,
    /// Whether the wakes were told apart by who woke (`Requires::WakeSources`).
    pub wake_sources: bool,
    /// Whether reader takes are counted (`Requires::ReaderTakes`).
    pub reader_takes: bool,
    /// Whether flows' order was followed (`Requires::Flows`).
    pub flows: bool,
    /// `dropped_other` by `enum skb_drop_reason` name (lower case, without the prefix).
    pub drop_reasons: BTreeMap<String, u64>,
    /// Per device: the same on every queue row of the device, since the kernel keeps no
    /// per-queue transmit statistics for these devices.
    pub kernel: KernelDeltas,
    /// The kernel's counters of the device when tracking began.
    pub kernel_at_start: KernelAtStart,
    /// Counted since the device's first packet (it was created after attach).
    pub from_birth: bool,
    /// The device disappeared; these are its last counters.
    pub retired: bool,
}

/// A value of a row, as its [`Metric`] describes it.
#[derive(Clone, Copy, Debug, PartialEq)]
pub enum Value {
    Count(u64),
    Flag(bool),
    /// Undefined (`None`) before there is anything to divide by.
    Ratio(Option<f64>),
    /// Samples of a level.
    Distribution(RingOccupancy),
    /// Not known here: what the value needs is missing (see [`Requires`]).
    Missing,
}

impl Row {
    /// The value `metric` describes.
    #[must_use]
    pub fn value(&self, metric: &Metric) -> Value {
        let available = match metric.requires {
            Requires::Nothing => true,
            Requires::WakeSources => self.wake_sources,
            Requires::ReaderTakes => self.reader_takes,
            Requires::Tun => self.kind.is_tun(),
            Requires::TunRing => self.occupancy.is_some(),
            Requires::Flows => self.flows,
        };
        if !available {
            return Value::Missing;
        }
        match metric.source {
            Source::Programs { get, .. } => Value::Count(get(&self.counters)),
            Source::Counters(compute) => Value::Ratio(compute(&self.counters)),
            Source::QueueState => Value::Flag(self.stopped),
            Source::Stuck => Value::Flag(self.stuck),
            Source::Backpressure => self.backpressure.map_or(Value::Missing, Value::Flag),
            Source::RingOccupancy => self.occupancy.map_or(Value::Missing, Value::Distribution),
            Source::Kernel(KernelStat::TxPackets) => Value::Count(self.kernel.tx_packets),
            Source::Kernel(KernelStat::TxDropped) => Value::Count(self.kernel.tx_dropped),
            Source::Kernel(KernelStat::Skew) => Value::Count(self.kernel.skew),
            Source::Kernel(KernelStat::TxPacketsAtStart) => {
                Value::Count(self.kernel_at_start.tx_packets)
            }
            Source::Kernel(KernelStat::TxDroppedAtStart) => {
                Value::Count(self.kernel_at_start.tx_dropped)
            }
            Source::FromBirth => Value::Flag(self.from_birth),
        }
    }
}

/// What a device's rows carry besides the counters: judged by the watcher.
#[derive(Clone, Copy, Debug, Default)]
#[expect(
    clippy::struct_excessive_bools,
    reason = "independent facts of one device, each copied into its rows"
)]
pub(crate) struct RowContext {
    pub(crate) backpressure: Option<bool>,
    /// Whether the ring is sampled (a tun/tap, with the offsets known).
    pub(crate) ring: bool,
    pub(crate) wake_sources: bool,
    pub(crate) reader_takes: bool,
    pub(crate) flows: bool,
    pub(crate) retired: bool,
    pub(crate) from_birth: bool,
    pub(crate) at_start: KernelAtStart,
}

/// The rows of one device: its queues in use, and any other queue that counted something.
/// `stuck` says per queue whether it is stuck.
#[must_use]
pub(crate) fn device_rows(
    device: &Device,
    counters: &DeviceCounters,
    kernel: KernelDeltas,
    names: &ReasonNames,
    now_ns: u64,
    context: RowContext,
    stuck: &[bool],
) -> Vec<Row> {
    counters
        .queues
        .iter()
        .zip(&counters.stopped_since)
        .enumerate()
        .filter(|(queue, (c, since))| {
            u32::try_from(*queue).is_ok_and(|q| q < device.active_queues.max(1))
                || **c != QueueCounters::default()
                || since.is_some()
        })
        .map(|(index, (c, since))| {
            let queue = u32::try_from(index).unwrap_or(u32::MAX);
            let occupancy = context
                .ring
                .then(|| counters.occupancy.get(index).copied())
                .flatten();
            let drop_reasons = counters
                .drop_reasons
                .iter()
                .filter(|((q, _), _)| *q == queue)
                .map(|((_, reason), n)| (names.name(*reason), *n))
                .collect();
            let mut counters = *c;
            // The programs add a stop's time when it ends; show the one running too.
            counters.stopped_ns += since.map_or(0, |s| now_ns.saturating_sub(s));
            Row {
                ifname: device.name.clone(),
                ifindex: device.key.ifindex,
                netns: device.netns.clone(),
                kind: device.kind,
                queue,
                owner: device.owners.first().cloned(),
                counters,
                stopped: since.is_some(),
                stuck: stuck.get(index).copied().unwrap_or(false),
                occupancy,
                backpressure: context.backpressure,
                wake_sources: context.wake_sources,
                reader_takes: context.reader_takes,
                flows: context.flows,
                drop_reasons,
                kernel,
                kernel_at_start: context.at_start,
                from_birth: context.from_birth,
                retired: context.retired,
            }
        })
        .collect()
}

/// One refresh.
#[derive(Clone, Debug, Serialize)]
pub struct Report {
    /// Seconds since tap-probe attached.
    pub elapsed_s: f64,
    /// Which kernel hooks feed the counters.
    pub sources: crate::bpf::backend::Sources,
    /// The programs' own cost, in the final report of `watch --program-stats`.
    #[serde(skip_serializing_if = "Option::is_none")]
    pub programs: Option<Vec<crate::bpf::probe::ProgramStats>>,
    pub rows: Vec<Row>,
    /// Devices that match the filter but are not counted, and why.
    pub untracked: Vec<Untracked>,
    /// What the kernel skipped of each attached program: when any is not 0, the counts may
    /// be short (see [`Report::may_be_short`]).
    pub missed: Vec<crate::bpf::missed::ProgramMissed>,
    /// Modules located at attach that were loaded, unloaded or reloaded since: counts of
    /// their devices may be wrong.
    pub modules_changed: Vec<crate::kernel::modules::ModuleChange>,
    /// Events of devices created since attach that found no spare counter slots (too many
    /// new devices at once): their counts are short.
    #[serde(rename = "events_without_slots")]
    pub no_room: u64,
    /// Devices the programs counted from their first packet that came and went between two
    /// refreshes: gone before a scan could name them, they are in no row.
    #[serde(rename = "devices_gone_unnamed")]
    pub gone_unnamed: u64,
    /// The kernel memory the probe's maps hold; `None` where it could not be read.
    #[serde(
        rename = "kernel_memory",
        serialize_with = "memory_summary",
        skip_serializing_if = "Option::is_none"
    )]
    pub memory: Option<crate::bpf::probe::Memory>,
}

/// The kernel memory as each report line carries it: the total here, the possible CPUs,
/// and the total the same maps would take with 256 of them (the per-map breakdown is
/// `doctor`'s and the final summary's).
#[expect(
    clippy::ref_option,
    reason = "serde's serialize_with passes the field by reference"
)]
fn memory_summary<S: serde::Serializer>(
    memory: &Option<crate::bpf::probe::Memory>,
    s: S,
) -> Result<S::Ok, S::Error> {
    use serde::ser::SerializeStruct as _;
    let Some(memory) = memory else {
        return s.serialize_none();
    };
    let mut st = s.serialize_struct("KernelMemory", 3)?;
    st.serialize_field("bytes", &memory.bytes())?;
    st.serialize_field("possible_cpus", &memory.possible_cpus)?;
    st.serialize_field("bytes_at_256_cpus", &memory.bytes_at(256))?;
    st.end()
}

impl Report {
    /// Whether the kernel skipped runs of a program (or hits of a kprobe): the counts they
    /// feed may then be short.
    #[must_use]
    pub fn may_be_short(&self) -> bool {
        self.missed.iter().any(|m| m.total() > 0) || self.no_room > 0
    }

    /// What makes the counts less than certain or whole, for each view to word: the programs
    /// that missed something (kprobe hits that ran nothing added in), events of new devices
    /// that found no slot, the modules that changed since attach, and devices that came and
    /// went unnamed.
    #[must_use]
    pub fn caveats(&self) -> Vec<Caveat<'_>> {
        let missed: Vec<(&str, u64)> = self
            .missed
            .iter()
            .filter(|m| m.total() > 0)
            .map(|m| (m.program.as_str(), m.total()))
            .collect();
        let mut out = Vec::new();
        if !missed.is_empty() {
            out.push(Caveat::SkippedRuns(missed));
        }
        if self.no_room > 0 {
            out.push(Caveat::NoRoom(self.no_room));
        }
        out.extend(self.modules_changed.iter().map(Caveat::ModuleChanged));
        if self.gone_unnamed > 0 {
            out.push(Caveat::GoneUnnamed(self.gone_unnamed));
        }
        out
    }
}

/// What makes a report's counts less than certain.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Caveat<'a> {
    /// The kernel skipped runs of these programs (or hits of their kprobes), so many times
    /// each: the counts they feed may be short.
    SkippedRuns(Vec<(&'a str, u64)>),
    /// Events of new devices that found no spare counter slot: their counts may be short.
    NoRoom(u64),
    /// A watched module changed since attach: its devices may be counted wrongly.
    ModuleChanged(&'a crate::kernel::modules::ModuleChange),
    /// Devices counted from their first packet that came and went between two refreshes:
    /// gone before a scan could name them, they are in no row.
    GoneUnnamed(u64),
}

impl Serialize for Row {
    /// The labels, then every metric under its name (a dotted name nests), the drop reasons
    /// and whether the device is gone.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde_json::{Map, Value as Json};
        let mut row = Map::new();
        let mut put = |name: &str, value: Json| match name.split_once('.') {
            Some((outer, inner)) => {
                if let Json::Object(nested) = row
                    .entry(outer.to_owned())
                    .or_insert_with(|| Json::Object(Map::new()))
                {
                    nested.insert(inner.to_owned(), value);
                }
            }
            None => {
                row.insert(name.to_owned(), value);
            }
        };
        put("ifname", Json::from(self.ifname.clone()));
        put("ifindex", Json::from(self.ifindex));
        put("netns", Json::from(self.netns.clone()));
        put(
            "kind",
            serde_json::to_value(self.kind).map_err(serde::ser::Error::custom)?,
        );
        put("queue", Json::from(self.queue));
        put(
            "owner",
            serde_json::to_value(&self.owner).map_err(serde::ser::Error::custom)?,
        );
        for metric in tap_probe_common::METRICS {
            let value = match self.value(metric) {
                Value::Count(n) => Json::from(n),
                Value::Flag(flag) => Json::from(flag),
                Value::Ratio(ratio) => ratio.map_or(Json::Null, Json::from),
                Value::Distribution(d) => serde_json::json!({
                    "current": d.current,
                    "max": (d.samples > 0 || d.max > 0).then_some(d.max),
                    "samples": d.samples,
                    "histogram": d.histogram,
                }),
                Value::Missing => Json::Null,
            };
            put(metric.name, value);
        }
        put(
            "drop_reasons",
            serde_json::to_value(&self.drop_reasons).map_err(serde::ser::Error::custom)?,
        );
        put("retired", Json::from(self.retired));
        row.serialize(serializer)
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use crate::bpf::backend::{Consume, Drops, Misses, Requeues, Ring, Sources, Wakes, Xmit};

    /// The sources of a probe that runs on tracepoints alone.
    pub(crate) fn sources() -> Sources {
        Sources {
            xmit: Xmit::Tracepoints,
            drops: Drops::Reason,
            consumed: Consume::Tracepoint,
            requeues: Requeues::DequeuePairs,
            wakes: Wakes::Inferred,
            ring: Ring::Unavailable("not in this test".to_owned()),
            flows: true,
            misses: Misses {
                runs: true,
                kprobes: true,
            },
            notes: Vec::new(),
        }
    }
}
