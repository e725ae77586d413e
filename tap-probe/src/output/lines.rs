//! The lines of the views for people: a device's queues folded under it (one line for a
//! device with one queue, a sum and a line per queue otherwise), each line's values read
//! through the counter table's entries, and the devices that went away during a run, kept
//! for the final summary.

use std::collections::BTreeMap;

use tap_probe_common::{Metric, QueueCounters, Source};

use tap_probe_observer::host::report::{Report, Row, Value};

/// One device, the same in every refresh: a name can come back with another ifindex, and
/// two namespaces can hold the same name.
#[derive(Clone, Debug, PartialEq, Eq, Hash, PartialOrd, Ord)]
pub(crate) struct DeviceId {
    pub(crate) netns: String,
    pub(crate) ifname: String,
    pub(crate) ifindex: u32,
}

impl DeviceId {
    fn of(row: &Row) -> Self {
        Self {
            netns: row.netns.clone(),
            ifname: row.ifname.clone(),
            ifindex: row.ifindex,
        }
    }
}

/// A line: a device (all its queues) or one queue of a device with several.
#[derive(Clone, Debug, PartialEq, Eq, Hash)]
pub(crate) struct LineId {
    pub(crate) device: DeviceId,
    /// `None` for the device's own line.
    pub(crate) queue: Option<u32>,
}

/// A line of a report, with the rows it sums.
#[derive(Clone, Debug)]
pub(crate) struct Line<'a> {
    pub(crate) id: LineId,
    pub(crate) rows: Vec<&'a Row>,
    /// The device's line of a device with several queues, whose queue lines follow it.
    pub(crate) folds: bool,
    /// A queue line under its device's line.
    pub(crate) under: bool,
}

impl Line<'_> {
    /// The first row: the device's labels (name, kind, owner) are the same on every row.
    #[must_use]
    pub(crate) fn first(&self) -> &Row {
        self.rows[0]
    }

    /// The device disappeared; these are its last counters.
    #[must_use]
    pub(crate) fn retired(&self) -> bool {
        self.first().retired
    }

    /// The value of `metric` over the line's rows: counts add up, a state is set when it is
    /// set on any queue, a ratio is computed on the summed counters, and the kernel's
    /// per-device statistics, the same on every row, are taken once.
    #[must_use]
    pub(crate) fn value(&self, metric: &Metric) -> Value {
        if let [row] = self.rows.as_slice() {
            return row.value(metric);
        }
        match metric.source {
            Source::Kernel(_) => self.first().value(metric),
            Source::Counters(compute) => Value::Ratio(compute(&self.counters())),
            _ => self
                .rows
                .iter()
                .map(|r| r.value(metric))
                .reduce(combine)
                .unwrap_or(Value::Count(0)),
        }
    }

    /// The queues' counters, summed.
    #[must_use]
    pub(crate) fn counters(&self) -> QueueCounters {
        let mut sum = QueueCounters::default();
        for row in &self.rows {
            sum += row.counters;
        }
        sum
    }

    /// `dropped_other` by reason, summed over the queues.
    #[must_use]
    pub(crate) fn drop_reasons(&self) -> BTreeMap<&str, u64> {
        let mut reasons = BTreeMap::new();
        for row in &self.rows {
            for (reason, n) in &row.drop_reasons {
                *reasons.entry(reason.as_str()).or_default() += n;
            }
        }
        reasons
    }
}

/// Two queues' values of one metric as one device's.
fn combine(a: Value, b: Value) -> Value {
    match (a, b) {
        (Value::Count(a), Value::Count(b)) => Value::Count(a.saturating_add(b)),
        (Value::Flag(a), Value::Flag(b)) => Value::Flag(a || b),
        // A ratio per queue does not add up; its device value is computed above.
        (other, _) => other,
    }
}

/// The lines of `report`, devices in the report's order (namespace, name), each device
/// followed by its queues when it has several.
#[must_use]
pub(crate) fn lines(report: &Report) -> Vec<Line<'_>> {
    let mut devices: Vec<(DeviceId, Vec<&Row>)> = Vec::new();
    for row in &report.rows {
        let id = DeviceId::of(row);
        match devices
            .iter_mut()
            .find(|(d, rows)| *d == id && rows[0].retired == row.retired)
        {
            Some((_, rows)) => rows.push(row),
            None => devices.push((id, vec![row])),
        }
    }
    let mut lines = Vec::new();
    for (id, rows) in devices {
        let folds = rows.len() > 1;
        lines.push(Line {
            id: LineId {
                device: id.clone(),
                queue: (!folds).then(|| rows[0].queue),
            },
            rows: rows.clone(),
            folds,
            under: false,
        });
        if folds {
            lines.extend(rows.into_iter().map(|row| Line {
                id: LineId {
                    device: id.clone(),
                    queue: Some(row.queue),
                },
                rows: vec![row],
                folds: false,
                under: true,
            }));
        }
    }
    lines
}

/// Devices that disappeared during a run, with their last counters: the watcher reports a
/// device once more, marked retired, in the refresh after it went away, and not again; the
/// final summary still lists it.
#[derive(Debug, Default)]
pub(crate) struct Gone {
    rows: BTreeMap<(DeviceId, u32), Row>,
}

impl Gone {
    /// Keeps the retired rows of `report`.
    pub(crate) fn keep(&mut self, report: &Report) {
        for row in report.rows.iter().filter(|r| r.retired) {
            self.rows
                .insert((DeviceId::of(row), row.queue), row.clone());
        }
    }

    /// How many devices went away.
    #[must_use]
    pub(crate) fn devices(&self) -> usize {
        let mut ids: Vec<&DeviceId> = self.rows.keys().map(|(id, _)| id).collect();
        ids.dedup();
        ids.len()
    }

    /// `report` with every device kept here that it does not show, sorted as the watcher
    /// sorts (namespace, device, queue).
    #[must_use]
    pub(crate) fn added_to(&self, report: &Report) -> Report {
        let mut all = report.clone();
        for ((id, queue), row) in &self.rows {
            let shown = report
                .rows
                .iter()
                .any(|r| r.retired && r.queue == *queue && DeviceId::of(r) == *id);
            if !shown {
                all.rows.push(row.clone());
            }
        }
        all.rows.sort_by(|a, b| {
            (&a.netns, &a.ifname, a.retired, a.ifindex, a.queue)
                .cmp(&(&b.netns, &b.ifname, b.retired, b.ifindex, b.queue))
        });
        all
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use tap_probe_common::{MetricId, QueueCounters};

    use super::*;
    use tap_probe_observer::bpf::backend::{
        Consume, Drops, Misses, Requeues, Ring, Sources, Wakes, Xmit,
    };
    use tap_probe_observer::bpf::probe::RingOccupancy;
    use tap_probe_observer::host::discovery::{DeviceKind, Owner};
    use tap_probe_observer::host::report::KernelDeltas;

    /// A row of device `name`, queue `queue`, with `consumed` and `full` counted.
    pub(crate) fn row(name: &str, queue: u32, consumed: u64, full: u64) -> Row {
        Row {
            ifname: name.to_owned(),
            ifindex: 7,
            netns: "tap-probe-load-4242".to_owned(),
            kind: DeviceKind::Tap,
            queue,
            owner: Some(Owner {
                pid: 4242,
                comm: "qemu-system-x86".to_owned(),
                vm: None,
            }),
            counters: QueueCounters {
                xmit_calls: consumed + full,
                enqueued: consumed,
                dropped_full_ring: full,
                consumed,
                ..QueueCounters::default()
            },
            stopped: false,
            stuck: false,
            occupancy: None,
            backpressure: Some(false),
            wake_sources: true,
            reader_takes: true,
            flows: true,
            drop_reasons: BTreeMap::new(),
            kernel: KernelDeltas {
                tx_packets: consumed,
                tx_dropped: full,
                skew: 0,
            },
            kernel_at_start: tap_probe_observer::host::report::KernelAtStart::default(),
            from_birth: false,
            retired: false,
        }
    }

    /// A row with every field set, most counters not zero.
    pub(crate) fn full_row() -> Row {
        Row {
            ifname: "tap0".to_owned(),
            ifindex: 7,
            netns: "ns".to_owned(),
            kind: DeviceKind::Tap,
            queue: 1,
            owner: Some(Owner {
                pid: 42,
                comm: "qemu".to_owned(),
                vm: None,
            }),
            counters: QueueCounters {
                xmit_calls: 10,
                enqueued: 7,
                busy: 1,
                dropped_full_ring: 2,
                dropped_other: 0,
                reordered: 5,
                flows_joined: 0,
                consumed: 6,
                queue_stops: 1,
                queue_wakes: 1,
                stopped_ns: 1_500_000_000,
                reader_sleeps: 4,
                requeued_stopped: 2,
                wakes_reader: 1,
                wakes_vhost: 0,
                wakes_forced: 0,
                wakes_other: 0,
                wakes_recheck: 3,
            },
            stopped: true,
            stuck: true,
            occupancy: Some(RingOccupancy {
                current: Some(3),
                max: 8,
                samples: 4,
                sum: 14,
                histogram: {
                    // Samples 1, 2, 3 and 8.
                    let mut h = [0; tap_probe_common::OCCUPANCY_BUCKETS];
                    h[1] = 1;
                    h[2] = 2;
                    h[4] = 1;
                    h
                },
            }),
            backpressure: Some(true),
            wake_sources: true,
            reader_takes: true,
            flows: true,
            drop_reasons: [("xmit_error".to_owned(), 3)].into(),
            kernel: KernelDeltas {
                tx_packets: 6,
                tx_dropped: 2,
                skew: 0,
            },
            kernel_at_start: tap_probe_observer::host::report::KernelAtStart::default(),
            from_birth: false,
            retired: false,
        }
    }

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

    pub(crate) fn report(elapsed_s: f64, rows: Vec<Row>) -> Report {
        Report {
            elapsed_s,
            sources: sources(),
            programs: None,
            untracked: Vec::new(),
            missed: Vec::new(),
            modules_changed: Vec::new(),
            no_room: 0,
            gone_unnamed: 0,
            memory: None,
            rows,
        }
    }

    #[test]
    fn one_queue_is_one_line_and_several_fold_under_their_device() {
        let r = report(
            1.0,
            vec![row("a", 0, 1, 0), row("mq", 0, 10, 1), row("mq", 1, 20, 2)],
        );
        let lines = lines(&r);
        let ids: Vec<(&str, Option<u32>, bool, bool)> = lines
            .iter()
            .map(|l| (l.id.device.ifname.as_str(), l.id.queue, l.folds, l.under))
            .collect();
        assert_eq!(
            ids,
            [
                ("a", Some(0), false, false),
                ("mq", None, true, false),
                ("mq", Some(0), false, true),
                ("mq", Some(1), false, true)
            ]
        );
        let value = |id: MetricId| lines[1].value(id.metric());
        assert_eq!(value(MetricId::Consumed), Value::Count(30));
        // The kernel's statistics are per device, the same on each row: taken once.
        assert_eq!(value(MetricId::KernelTxPackets), Value::Count(10));
        assert_eq!(value(MetricId::Stopped), Value::Flag(false));
    }

    #[test]
    fn a_gone_device_is_kept_once_with_its_last_counters() {
        let mut gone = Gone::default();
        let mut last = row("tp-load0", 0, 500, 70);
        last.retired = true;
        gone.keep(&report(2.0, vec![last.clone(), row("b", 0, 1, 0)]));
        assert_eq!(gone.devices(), 1);
        // Shown by the report itself: not twice.
        let same = gone.added_to(&report(2.0, vec![last, row("b", 0, 1, 0)]));
        assert_eq!(same.rows.len(), 2);
        // Later reports no longer carry it: it is added back.
        let later = gone.added_to(&report(3.0, vec![row("b", 0, 2, 0)]));
        let names: Vec<(&str, bool)> = later
            .rows
            .iter()
            .map(|r| (r.ifname.as_str(), r.retired))
            .collect();
        assert_eq!(names, [("b", false), ("tp-load0", true)]);
        assert_eq!(later.rows[1].counters.consumed, 500);
    }
}
