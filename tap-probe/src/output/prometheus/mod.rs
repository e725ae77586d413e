//! `watch --prometheus ADDR` and `serve`: the latest refresh as a Prometheus scrape target.
//!
//! The text exposition format (version 0.0.4) is written by hand: the counters are a few
//! families of labelled integers, so a metrics crate would not earn its weight. The HTTP
//! side (`server`) is hyper and rustls. Each scrape gets the text of the last refresh, so
//! scraping never touches the eBPF maps.
//!
//! By default a device has one series per family, whatever its queues ([`Series`]): its
//! queues' counts summed, the queues stopped or stuck counted, its fullest ring's samples.
//! Series are labelled `netns`, `device`, `kind`, and where a process holds the tap open,
//! `owner_pid`, `owner_comm` and, where its command line names one, `vm` (QEMU's `-name`,
//! libvirt's domain): which VM a series is about. `--per-queue` labels per-queue values with
//! `queue` too, one series per queue, and adds the families that break others down;
//! `--occupancy-histogram` adds the histogram of the ring samples.

use std::fmt::Write as _;

mod about;
mod departed;
#[cfg(test)]
mod queried;
mod server;

pub(crate) use about::About;
pub(crate) use server::web_config::BadWebConfig;
pub(crate) use server::{Exporter, LiveConfig, Settings};
use tap_probe_common::{DIRECTION, Export, Kind, METRICS, Metric, Source, Unit};

use tap_probe_observer::bpf::probe::RingOccupancy;
use tap_probe_observer::host::report::{Report, Row, Value};

/// Which series the exposition holds. See docs/service.md for what each costs.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub(crate) struct Series {
    /// A series per queue for per-queue values (label `queue`), and the families marked
    /// [`Export::Detail`].
    pub(crate) per_queue: bool,
    /// The ring samples' histogram (`ring_occupancy_samples`): 20 series per device, or per
    /// queue with `per_queue`.
    pub(crate) histogram: bool,
}

impl Series {
    /// Everything: what the tests compare.
    #[cfg(test)]
    pub(crate) const ALL: Self = Self {
        per_queue: true,
        histogram: true,
    };
}

/// The exposition text of `report` alone, as tests compare it: devices that disappeared
/// are left out, and nothing is said about the exporter.
#[cfg(test)]
#[must_use]
pub(crate) fn exposition(report: &Report, series: Series) -> String {
    exposition_with(report, &[], None, series)
}

/// The exposition text of `report` with the rows of devices that went away but are still
/// served (`departed`), and what the exporter says about itself.
#[must_use]
pub(crate) fn exposition_with(
    report: &Report,
    departed: &[Row],
    about: Option<&About>,
    series: Series,
) -> String {
    let rows: Vec<&Row> = report
        .rows
        .iter()
        .filter(|r| !r.retired)
        .chain(departed)
        .collect();
    let mut out = families(report, &devices(&rows), series);
    if let Some(about) = about {
        about.write(&mut out);
    }
    out
}

/// The rows of one device, and its labels.
struct Device<'a> {
    rows: Vec<&'a Row>,
    labels: String,
}

/// `rows` by device, in their order (a device's rows are together: the report sorts them).
fn devices<'a>(rows: &[&'a Row]) -> Vec<Device<'a>> {
    let mut out: Vec<Device<'a>> = Vec::new();
    for &row in rows {
        match out.last_mut() {
            Some(d) if same_device(d.rows[0], row) => d.rows.push(row),
            _ => out.push(Device {
                rows: vec![row],
                labels: labels(row, false),
            }),
        }
    }
    out
}

fn same_device(a: &Row, b: &Row) -> bool {
    a.ifindex == b.ifindex && a.netns == b.netns && a.ifname == b.ifname
}

/// Whether a value is the device's own (the same on each of its queues) rather than a
/// queue's.
fn per_device(metric: &Metric) -> bool {
    matches!(
        metric.source,
        Source::Kernel(_) | Source::Backpressure | Source::FromBirth
    )
}

fn families(report: &Report, devices: &[Device<'_>], series: Series) -> String {
    let mut out = String::new();
    for metric in METRICS {
        let Some(name) = metric.prometheus else {
            continue;
        };
        if metric.export == Export::Detail && !series.per_queue {
            continue;
        }
        let kind = match metric.kind {
            Kind::Counter => "counter",
            Kind::Gauge | Kind::Derived => "gauge",
            Kind::Distribution => {
                distribution(&mut out, name, metric, devices, series);
                continue;
            }
        };
        let _ = writeln!(out, "# HELP tap_probe_{name} {}", metric.help);
        let _ = writeln!(out, "# TYPE tap_probe_{name} {kind}");
        for device in devices {
            if series.per_queue && !per_device(metric) {
                for row in &device.rows {
                    // A value not known here has no sample: a series absent, not a made-up
                    // zero.
                    if let Some(value) = sample(metric, row.value(metric)) {
                        let _ = writeln!(out, "tap_probe_{name}{{{}}} {value}", labels(row, true));
                    }
                }
            } else if let Some(value) = device_sample(metric, &device.rows) {
                let _ = writeln!(out, "tap_probe_{name}{{{}}} {value}", device.labels);
            }
        }
    }
    if series.per_queue {
        drop_reasons(&mut out, devices);
    }
    exporter(&mut out, report);
    out
}

/// The drop reasons, per queue.
fn drop_reasons(out: &mut String, devices: &[Device<'_>]) {
    let _ = write!(
        out,
        "# HELP tap_probe_drop_reason_total {DIRECTION}packets freed inside the driver, by skb \
         drop reason (other than a full ring).\n# TYPE tap_probe_drop_reason_total counter\n"
    );
    for row in devices.iter().flat_map(|d| &d.rows) {
        for (reason, n) in &row.drop_reasons {
            let _ = writeln!(
                out,
                "tap_probe_drop_reason_total{{{},reason=\"{}\"}} {n}",
                labels(row, true),
                escape(reason)
            );
        }
    }
}

/// What the exporter says of itself: devices it does not count, what its programs missed,
/// its modules, its age and its kernel memory.
fn exporter(out: &mut String, report: &Report) {
    let _ = write!(
        out,
        "# HELP tap_probe_untracked_devices Devices that match but are not counted (the probe's \
         tables are full).\n# TYPE tap_probe_untracked_devices gauge\n\
         tap_probe_untracked_devices {}\n",
        report.untracked.len()
    );
    out.push_str(
        "# HELP tap_probe_missed_total Runs of an eBPF program the kernel skipped (why=\"recursion\": \
         it, or for a kprobe any kprobe program, was running on the CPU) and hits of its kprobes \
         that ran nothing (why=\"kprobe\"); counts the program feeds may be short by them.\n\
         # TYPE tap_probe_missed_total counter\n",
    );
    for m in &report.missed {
        let program = escape(&m.program);
        // Where the kernel does not count them, unknown: no sample (the sources say so).
        if let Some(runs) = m.runs {
            let _ = writeln!(
                out,
                "tap_probe_missed_total{{program=\"{program}\",why=\"recursion\"}} {runs}"
            );
        }
        if let Some(kprobe) = m.kprobe {
            let _ = writeln!(
                out,
                "tap_probe_missed_total{{program=\"{program}\",why=\"kprobe\"}} {kprobe}"
            );
        }
    }
    out.push_str(
        "# HELP tap_probe_source_info What feeds each group of counters on this kernel, as \
         watch's legend and the JSON sources say it (a counter whose source is missing has no \
         sample).\n# TYPE tap_probe_source_info gauge\n",
    );
    for (group, _, source) in report.sources.groups() {
        let _ = writeln!(
            out,
            "tap_probe_source_info{{counters=\"{group}\",source=\"{}\"}} 1",
            escape(&source)
        );
    }
    let _ = write!(
        out,
        "# HELP tap_probe_events_without_slots_total Events of devices created since attach \
         that found no spare counter slots (too many new devices at once): their counts are \
         short by them.\n# TYPE tap_probe_events_without_slots_total counter\n\
         tap_probe_events_without_slots_total {}\n",
        report.no_room
    );
    let _ = write!(
        out,
        "# HELP tap_probe_devices_gone_unnamed_total Devices counted from their first packet \
         that came and went between two refreshes: gone before a refresh could name them, \
         they are in no series.\n# TYPE tap_probe_devices_gone_unnamed_total counter\n\
         tap_probe_devices_gone_unnamed_total {}\n",
        report.gone_unnamed
    );
    let _ = write!(
        out,
        "# HELP tap_probe_modules_changed Modules tap-probe located at attach that were loaded, \
         unloaded or reloaded since (counts of their devices may be wrong: restart it).\n\
         # TYPE tap_probe_modules_changed gauge\ntap_probe_modules_changed {}\n",
        report.modules_changed.len()
    );
    let _ = write!(
        out,
        "# HELP tap_probe_elapsed_seconds Seconds since tap-probe attached.\n\
         # TYPE tap_probe_elapsed_seconds gauge\ntap_probe_elapsed_seconds {}\n",
        report.elapsed_s
    );
    if let Some(memory) = &report.memory {
        let _ = write!(
            out,
            "# HELP tap_probe_kernel_memory_bytes Kernel memory the probe's eBPF maps hold, as \
             the kernel charges it (memlock); it follows the queues tracked.\n\
             # TYPE tap_probe_kernel_memory_bytes gauge\ntap_probe_kernel_memory_bytes {}\n",
            memory.bytes()
        );
    }
}

/// A sample's value: seconds for times, 1 or 0 for flags; `None` for a value not known.
#[expect(clippy::cast_precision_loss, reason = "Prometheus samples are floats")]
fn sample(metric: &Metric, value: Value) -> Option<f64> {
    Some(match (value, metric.unit) {
        (Value::Count(ns), Unit::Nanoseconds) => ns as f64 / 1e9,
        (Value::Count(n), _) => n as f64,
        (Value::Flag(flag), _) => f64::from(u8::from(flag)),
        (Value::Ratio(ratio), _) => ratio.unwrap_or(f64::NAN),
        (Value::Distribution(_) | Value::Missing, _) => return None,
    })
}

/// A device's one sample of `metric`: its own value, or over its queues the sum (a flag's
/// sum counts the queues it holds for); `None` where no queue knows the value.
fn device_sample(metric: &Metric, rows: &[&Row]) -> Option<f64> {
    if per_device(metric) {
        return sample(metric, rows.first()?.value(metric));
    }
    rows.iter()
        .filter_map(|row| sample(metric, row.value(metric)))
        .reduce(|a, b| a + b)
}

/// The ring samples of one series: a queue's, or a device's over its queues (the latest
/// and the highest of its fullest ring, and all samples together).
fn occupancy_over(metric: &Metric, rows: &[&Row]) -> Option<RingOccupancy> {
    rows.iter()
        .filter_map(|row| match row.value(metric) {
            Value::Distribution(d) => Some(d),
            _ => None,
        })
        .reduce(|mut all, d| {
            all.current = all.current.max(d.current);
            all.max = all.max.max(d.max);
            all.samples += d.samples;
            all.sum += d.sum;
            for (total, n) in all.histogram.iter_mut().zip(d.histogram) {
                *total += n;
            }
            all
        })
}

/// A sampled level as three families: the latest sample (a gauge named `name`), the
/// highest (`name_max`) and, where asked for, all samples by level (the histogram
/// `name_samples`, with a bucket per power of two).
fn distribution(
    out: &mut String,
    name: &str,
    metric: &Metric,
    devices: &[Device<'_>],
    series: Series,
) {
    let samples: Vec<(String, RingOccupancy)> = devices
        .iter()
        .flat_map(|device| {
            if series.per_queue {
                device
                    .rows
                    .iter()
                    .filter_map(|row| Some((labels(row, true), occupancy_over(metric, &[row])?)))
                    .collect::<Vec<_>>()
            } else {
                occupancy_over(metric, &device.rows)
                    .map(|d| (device.labels.clone(), d))
                    .into_iter()
                    .collect()
            }
        })
        .collect();
    let _ = writeln!(
        out,
        "# HELP tap_probe_{name} {} The latest sample.\n# TYPE tap_probe_{name} gauge",
        metric.help
    );
    for (labels, d) in &samples {
        if let Some(now) = d.current {
            let _ = writeln!(out, "tap_probe_{name}{{{labels}}} {now}");
        }
    }
    let _ = writeln!(
        out,
        "# HELP tap_probe_{name}_max The highest sample since tracking began.\n\
         # TYPE tap_probe_{name}_max gauge"
    );
    for (labels, d) in &samples {
        if d.samples > 0 {
            let _ = writeln!(out, "tap_probe_{name}_max{{{labels}}} {}", d.max);
        }
    }
    if !series.histogram {
        return;
    }
    let _ = writeln!(
        out,
        "# HELP tap_probe_{name}_samples All samples since tracking began, by level.\n\
         # TYPE tap_probe_{name}_samples histogram"
    );
    for (labels, d) in &samples {
        let mut cumulative = 0;
        for (k, n) in d.histogram.iter().enumerate() {
            cumulative += n;
            if let Some(bound) = RingOccupancy::bucket_bound(k) {
                let _ = writeln!(
                    out,
                    "tap_probe_{name}_samples_bucket{{{labels},le=\"{bound}\"}} {cumulative}"
                );
            }
        }
        let _ = writeln!(
            out,
            "tap_probe_{name}_samples_bucket{{{labels},le=\"+Inf\"}} {}\n\
             tap_probe_{name}_samples_sum{{{labels}}} {}\n\
             tap_probe_{name}_samples_count{{{labels}}} {}",
            d.samples, d.sum, d.samples
        );
    }
}

/// A row's labels: where its device is (and with `queue`, which queue), and who holds the
/// device open.
fn labels(row: &Row, queue: bool) -> String {
    let mut out = format!(
        "netns=\"{}\",device=\"{}\",kind=\"{}\"",
        escape(&row.netns),
        escape(&row.ifname),
        format!("{:?}", row.kind).to_lowercase(),
    );
    if queue {
        let _ = write!(out, ",queue=\"{}\"", row.queue);
    }
    if let Some(owner) = &row.owner {
        let _ = write!(
            out,
            ",owner_pid=\"{}\",owner_comm=\"{}\"",
            owner.pid,
            escape(&owner.comm)
        );
        if let Some(vm) = &owner.vm {
            let _ = write!(out, ",vm=\"{}\"", escape(vm));
        }
    }
    out
}

/// Escapes a label value: backslash, double quote and newline, as the format requires.
fn escape(value: &str) -> String {
    let mut out = String::with_capacity(value.len());
    for c in value.chars() {
        match c {
            '\\' => out.push_str(r"\\"),
            '"' => out.push_str("\\\""),
            '\n' => out.push_str(r"\n"),
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    /// A row with every field set, of device `name` in a namespace whose name needs
    /// escaping.
    fn row(name: &str, queue: u32) -> Row {
        Row {
            ifname: name.to_owned(),
            netns: "vm \"a\"\\b\nc".to_owned(),
            queue,
            owner: None,
            ..crate::output::lines::tests::full_row()
        }
    }

    fn report(rows: Vec<Row>) -> Report {
        crate::output::lines::tests::report(2.5, rows)
    }

    /// The families of the per-queue form: each declared once, a per-queue value with a
    /// sample per live queue, a device's own value with one per device.
    #[test]
    fn every_family_is_declared_once_with_one_sample_per_live_row() {
        let mut gone = row("tap1", 0);
        gone.retired = true;
        let text = exposition(
            &report(vec![row("tap0", 0), row("tap0", 1), gone]),
            Series::ALL,
        );
        for metric in METRICS {
            let Some(name) = metric.prometheus else {
                continue;
            };
            let name = format!("tap_probe_{name}");
            assert_eq!(
                text.matches(&format!("# TYPE {name} ")).count(),
                1,
                "{name}"
            );
            let samples = text
                .lines()
                .filter(|l| l.starts_with(&format!("{name}{{")))
                .count();
            let expected = if per_device(metric) { 1 } else { 2 };
            assert_eq!(
                samples, expected,
                "{name}: two live queue rows of one device, the retired one left out"
            );
        }
        assert!(!text.contains("tap1"), "a retired device has no series");
    }

    /// By default a device has one series per family whatever its queues, at most 21 (the
    /// issue's budget is 24): its queues' counts summed, the queues stopped or stuck
    /// counted, its fullest ring's samples; no breakdowns, no histogram.
    #[test]
    fn by_default_a_device_has_one_series_per_family_whatever_its_queues() {
        let queues: Vec<Row> = (0..8).map(|q| row("tap0", q)).collect();
        let text = exposition(&report(queues), Series::default());
        let samples: Vec<&str> = text
            .lines()
            .filter(|l| l.contains("device=\"tap0\""))
            .collect();
        assert!(
            samples.len() <= 21,
            "{} series: {samples:#?}",
            samples.len()
        );
        assert!(
            samples.iter().all(|l| !l.contains("queue=")),
            "{samples:#?}"
        );
        let labels = r#"netns="vm \"a\"\\b\nc",device="tap0",kind="tap""#;
        for expected in [
            format!("tap_probe_xmit_calls_total{{{labels}}} 80"),
            format!("tap_probe_stopped_seconds_total{{{labels}}} 12"),
            format!("tap_probe_queue_stopped{{{labels}}} 8"),
            format!("tap_probe_queue_stuck{{{labels}}} 8"),
            format!("tap_probe_ring_occupancy{{{labels}}} 3"),
            format!("tap_probe_ring_occupancy_max{{{labels}}} 8"),
            format!("tap_probe_kernel_tx_packets_total{{{labels}}} 6"),
            format!("tap_probe_backpressure{{{labels}}} 1"),
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "{expected} in:\n{text}"
            );
        }
        for absent in [
            "tap_probe_wakes_reader_total",
            "tap_probe_drop_reason_total",
            "tap_probe_kernel_tx_packets_at_start",
            "tap_probe_ring_occupancy_samples",
        ] {
            assert!(
                !text.contains(&format!("# TYPE {absent} ")),
                "{absent} in:\n{text}"
            );
        }
        let with_histogram = exposition(
            &report((0..8).map(|q| row("tap0", q)).collect()),
            Series {
                histogram: true,
                ..Series::default()
            },
        );
        assert!(
            with_histogram
                .lines()
                .any(|l| l == format!("tap_probe_ring_occupancy_samples_count{{{labels}}} 32"))
        );
    }

    #[test]
    fn samples_carry_escaped_labels_and_values() {
        let text = exposition(&report(vec![row("tap0", 1)]), Series::ALL);
        let device = r#"netns="vm \"a\"\\b\nc",device="tap0",kind="tap""#;
        let labels = format!("{device},queue=\"1\"");
        for expected in [
            format!("tap_probe_xmit_calls_total{{{labels}}} 10"),
            format!("tap_probe_stopped_seconds_total{{{labels}}} 1.5"),
            format!("tap_probe_queue_stopped{{{labels}}} 1"),
            format!("tap_probe_reader_sleeps_total{{{labels}}} 4"),
            format!("tap_probe_drop_reason_total{{{labels},reason=\"xmit_error\"}} 3"),
            format!("tap_probe_kernel_tx_packets_total{{{device}}} 6"),
            "tap_probe_elapsed_seconds 2.5".to_owned(),
        ] {
            assert!(
                text.lines().any(|l| l == expected),
                "{expected} in:\n{text}"
            );
        }
    }

    #[test]
    fn series_name_the_process_and_the_vm_holding_the_tap() {
        let mut held = row("vnet3", 0);
        held.netns = "init".to_owned();
        held.owner = Some(tap_probe_observer::host::discovery::Owner {
            pid: 4242,
            comm: "qemu-system-x86".to_owned(),
            vm: Some("web \"01\"".to_owned()),
        });
        let mut nameless = held.clone();
        nameless.ifname = "vnet4".to_owned();
        if let Some(owner) = &mut nameless.owner {
            owner.vm = None;
        }
        let text = exposition(&report(vec![held, nameless]), Series::default());
        let sample = |device: &str| {
            text.lines()
                .find(|l| {
                    l.starts_with(&format!(
                        "tap_probe_consumed_total{{netns=\"init\",device=\"{device}\""
                    ))
                })
                .unwrap_or_else(|| panic!("{device} in\n{text}"))
                .to_owned()
        };
        assert_eq!(
            sample("vnet3"),
            r#"tap_probe_consumed_total{netns="init",device="vnet3",kind="tap",owner_pid="4242",owner_comm="qemu-system-x86",vm="web \"01\""} 6"#
        );
        assert!(
            sample("vnet4").ends_with(r#"owner_pid="4242",owner_comm="qemu-system-x86"} 6"#),
            "no vm label where the command line names none"
        );
    }

    #[test]
    fn departed_rows_and_the_facts_are_served_beside_the_live_ones() {
        let mut gone = row("tap1", 0);
        gone.retired = true;
        let departed = vec![gone.clone()];
        let about = About {
            version: "1.0.0",
            commit: "abc",
            release: "6.18".to_owned(),
            tun_backpressure: None,
        };
        let text = exposition_with(
            &report(vec![row("tap0", 0), gone]),
            &departed,
            Some(&about),
            Series::default(),
        );
        let consumed: Vec<&str> = text
            .lines()
            .filter(|l| l.starts_with("tap_probe_consumed_total{"))
            .collect();
        assert_eq!(
            consumed.len(),
            2,
            "the live row and the departed one: {consumed:?}"
        );
        assert!(consumed[1].contains("device=\"tap1\""));
        assert!(
            text.ends_with(
                "tap_probe_kernel_info{release=\"6.18\",tun_backpressure=\"unknown\"} 1\n"
            )
        );
    }

    /// The per-queue exposition, byte for byte: scrapers and dashboards depend on the names,
    /// the order does not hurt to keep. New families come in between; none that was there
    /// changed but for the wording of its help, which begins with the direction. (A
    /// device's own values, the same on each queue, carry no `queue` label.)
    #[test]
    #[expect(clippy::too_many_lines, reason = "the golden exposition, whole")]
    fn exposition_is_unchanged() {
        const GOLDEN: &str = r#"# HELP tap_probe_xmit_calls_total Host to guest (the host's transmit, the guest's receive): calls into the driver's ndo_start_xmit.
# TYPE tap_probe_xmit_calls_total counter
tap_probe_xmit_calls_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 10
# HELP tap_probe_enqueued_total Host to guest (the host's transmit, the guest's receive): packets the driver took into its ring.
# TYPE tap_probe_enqueued_total counter
tap_probe_enqueued_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 7
# HELP tap_probe_busy_total Host to guest (the host's transmit, the guest's receive): NETDEV_TX_BUSY returns (the packet goes back to the qdisc).
# TYPE tap_probe_busy_total counter
tap_probe_busy_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_requeued_stopped_total Host to guest (the host's transmit, the guest's receive): packets the qdisc put back without a driver call because the queue was stopped.
# TYPE tap_probe_requeued_stopped_total counter
tap_probe_requeued_stopped_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 2
# HELP tap_probe_dropped_full_ring_total Host to guest (the host's transmit, the guest's receive): packets freed inside the driver because the ring was full (tail-drop).
# TYPE tap_probe_dropped_full_ring_total counter
tap_probe_dropped_full_ring_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 2
# HELP tap_probe_dropped_other_total Host to guest (the host's transmit, the guest's receive): packets freed inside the driver for another reason (see tap_probe_drop_reason_total).
# TYPE tap_probe_dropped_other_total counter
tap_probe_dropped_other_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 0
# HELP tap_probe_reordered_total Host to guest (the host's transmit, the guest's receive): packets the driver took out of their flow's order (TCP by IPv4 ID, tap-probe's UDP frames by sequence number).
# TYPE tap_probe_reordered_total counter
tap_probe_reordered_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 5
# HELP tap_probe_flows_joined_total Host to guest (the host's transmit, the guest's receive): flows whose order was taken up mid-way: evicted from the flow table, or begun before tracking.
# TYPE tap_probe_flows_joined_total counter
tap_probe_flows_joined_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 0
# HELP tap_probe_consumed_total Host to guest (the host's transmit, the guest's receive): packets the reader (a VM's QEMU or vhost-net, a veth's peer) took out of the ring.
# TYPE tap_probe_consumed_total counter
tap_probe_consumed_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 6
# HELP tap_probe_queue_stops_total Host to guest (the host's transmit, the guest's receive): transitions of the transmit queue to stopped (DRV_XOFF set).
# TYPE tap_probe_queue_stops_total counter
tap_probe_queue_stops_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_queue_wakes_total Host to guest (the host's transmit, the guest's receive): transitions of the transmit queue to running (DRV_XOFF cleared).
# TYPE tap_probe_queue_wakes_total counter
tap_probe_queue_wakes_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_wakes_reader_total Host to guest (the host's transmit, the guest's receive): queue wakes by the reader as it took packets (__tun_wake_queue from a read, veth_poll).
# TYPE tap_probe_wakes_reader_total counter
tap_probe_wakes_reader_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_wakes_vhost_total Host to guest (the host's transmit, the guest's receive): queue wakes by vhost-net after a batched take (tun_wake_queue).
# TYPE tap_probe_wakes_vhost_total counter
tap_probe_wakes_vhost_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 0
# HELP tap_probe_wakes_forced_total Host to guest (the host's transmit, the guest's receive): queue wakes on attach, TUNSETIFF or resize (tun_force_wake_queue).
# TYPE tap_probe_wakes_forced_total counter
tap_probe_wakes_forced_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 0
# HELP tap_probe_wakes_other_total Host to guest (the host's transmit, the guest's receive): queue wakes from any other caller of netif_tx_wake_queue.
# TYPE tap_probe_wakes_other_total counter
tap_probe_wakes_other_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 0
# HELP tap_probe_wakes_recheck_total Host to guest (the host's transmit, the guest's receive): stops undone by the driver's own re-check within the driver call (a lost race).
# TYPE tap_probe_wakes_recheck_total counter
tap_probe_wakes_recheck_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 3
# HELP tap_probe_stopped_seconds_total Host to guest (the host's transmit, the guest's receive): time the transmit queue spent stopped, including a stop still running.
# TYPE tap_probe_stopped_seconds_total counter
tap_probe_stopped_seconds_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1.5
# HELP tap_probe_queue_stopped Host to guest (the host's transmit, the guest's receive): 1 while the transmit queue is stopped, as last observed.
# TYPE tap_probe_queue_stopped gauge
tap_probe_queue_stopped{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_queue_stuck Host to guest (the host's transmit, the guest's receive): 1 while the transmit queue is stopped and its reader took nothing for longer than --stuck-after.
# TYPE tap_probe_queue_stuck gauge
tap_probe_queue_stuck{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 1
# HELP tap_probe_reader_sleeps_total Host to guest (the host's transmit, the guest's receive): times the queue's reader slept between two packets it took.
# TYPE tap_probe_reader_sleeps_total counter
tap_probe_reader_sleeps_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 4
# HELP tap_probe_ring_occupancy Host to guest (the host's transmit, the guest's receive): entries in the tap's ptr_ring, sampled at every driver call and reader take. The latest sample.
# TYPE tap_probe_ring_occupancy gauge
tap_probe_ring_occupancy{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 3
# HELP tap_probe_ring_occupancy_max The highest sample since tracking began.
# TYPE tap_probe_ring_occupancy_max gauge
tap_probe_ring_occupancy_max{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 8
# HELP tap_probe_ring_occupancy_samples All samples since tracking began, by level.
# TYPE tap_probe_ring_occupancy_samples histogram
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="0"} 0
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="1"} 1
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="3"} 3
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="7"} 3
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="15"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="31"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="63"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="127"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="255"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="511"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="1023"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="2047"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="4095"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="8191"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="16383"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="32767"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="65535"} 4
tap_probe_ring_occupancy_samples_bucket{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",le="+Inf"} 4
tap_probe_ring_occupancy_samples_sum{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 14
tap_probe_ring_occupancy_samples_count{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1"} 4
# HELP tap_probe_backpressure Host to guest (the host's transmit, the guest's receive): 1 when the tap stops its transmit queue instead of tail-dropping (IFF_BACKPRESSURE).
# TYPE tap_probe_backpressure gauge
tap_probe_backpressure{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 1
# HELP tap_probe_kernel_tx_packets_total Host to guest (the host's transmit, the guest's receive): the device's own tx_packets (on a tap: packets its guest received) since tracking began (per device, on every queue).
# TYPE tap_probe_kernel_tx_packets_total counter
tap_probe_kernel_tx_packets_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 6
# HELP tap_probe_kernel_tx_dropped_total Host to guest (the host's transmit, the guest's receive): the device's own tx_dropped (on a tap: packets lost before its guest received them) since tracking began (per device, on every queue).
# TYPE tap_probe_kernel_tx_dropped_total counter
tap_probe_kernel_tx_dropped_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 2
# HELP tap_probe_tracked_from_birth Host to guest (the host's transmit, the guest's receive): 1 when the device is counted since its first packet (created after tap-probe attached); 0 when tracking began mid-life.
# TYPE tap_probe_tracked_from_birth gauge
tap_probe_tracked_from_birth{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 0
# HELP tap_probe_kernel_tx_packets_at_start Host to guest (the host's transmit, the guest's receive): the device's own tx_packets when tracking began: what tap-probe did not see (0 from birth).
# TYPE tap_probe_kernel_tx_packets_at_start gauge
tap_probe_kernel_tx_packets_at_start{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 0
# HELP tap_probe_kernel_tx_dropped_at_start Host to guest (the host's transmit, the guest's receive): the device's own tx_dropped when tracking began (0 from birth).
# TYPE tap_probe_kernel_tx_dropped_at_start gauge
tap_probe_kernel_tx_dropped_at_start{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 0
# HELP tap_probe_kernel_skew_packets Host to guest (the host's transmit, the guest's receive): packets the kernel's columns may be off from tap-probe's by, as they cannot be read at the same instant (0 once traffic stops); while traffic flows, also by a read its reader is paused in between tun's count and consume_skb, one per reader thread at most.
# TYPE tap_probe_kernel_skew_packets gauge
tap_probe_kernel_skew_packets{netns="vm \"a\"\\b\nc",device="tap0",kind="tap"} 0
# HELP tap_probe_drop_reason_total Host to guest (the host's transmit, the guest's receive): packets freed inside the driver, by skb drop reason (other than a full ring).
# TYPE tap_probe_drop_reason_total counter
tap_probe_drop_reason_total{netns="vm \"a\"\\b\nc",device="tap0",kind="tap",queue="1",reason="xmit_error"} 3
# HELP tap_probe_untracked_devices Devices that match but are not counted (the probe's tables are full).
# TYPE tap_probe_untracked_devices gauge
tap_probe_untracked_devices 0
# HELP tap_probe_missed_total Runs of an eBPF program the kernel skipped (why="recursion": it, or for a kprobe any kprobe program, was running on the CPU) and hits of its kprobes that ran nothing (why="kprobe"); counts the program feeds may be short by them.
# TYPE tap_probe_missed_total counter
# HELP tap_probe_source_info What feeds each group of counters on this kernel, as watch's legend and the JSON sources say it (a counter whose source is missing has no sample).
# TYPE tap_probe_source_info gauge
tap_probe_source_info{counters="xmit",source="tracepoints net:net_dev_start_xmit, net:net_dev_xmit"} 1
tap_probe_source_info{counters="drops",source="tracepoint skb:kfree_skb"} 1
tap_probe_source_info{counters="consumed",source="tracepoint skb:consume_skb (location)"} 1
tap_probe_source_info{counters="queue_state",source="after each driver call, and tracepoint qdisc:qdisc_dequeue"} 1
tap_probe_source_info{counters="requeued_stopped",source="tracepoint qdisc:qdisc_dequeue followed to the driver (may be short by bypass requeues)"} 1
tap_probe_source_info{counters="wakes",source="not told apart (no kprobes): wakes only as DRV_XOFF transitions (queue_wakes)"} 1
tap_probe_source_info{counters="ring_occupancy",source="not sampled: not in this test"} 1
tap_probe_source_info{counters="missed",source="the programs' recursion_misses"} 1
# HELP tap_probe_events_without_slots_total Events of devices created since attach that found no spare counter slots (too many new devices at once): their counts are short by them.
# TYPE tap_probe_events_without_slots_total counter
tap_probe_events_without_slots_total 0
# HELP tap_probe_devices_gone_unnamed_total Devices counted from their first packet that came and went between two refreshes: gone before a refresh could name them, they are in no series.
# TYPE tap_probe_devices_gone_unnamed_total counter
tap_probe_devices_gone_unnamed_total 0
# HELP tap_probe_modules_changed Modules tap-probe located at attach that were loaded, unloaded or reloaded since (counts of their devices may be wrong: restart it).
# TYPE tap_probe_modules_changed gauge
tap_probe_modules_changed 0
# HELP tap_probe_elapsed_seconds Seconds since tap-probe attached.
# TYPE tap_probe_elapsed_seconds gauge
tap_probe_elapsed_seconds 2.5
"#;
        assert_eq!(
            exposition(&report(vec![row("tap0", 1)]), Series::ALL),
            GOLDEN
        );
    }
}
