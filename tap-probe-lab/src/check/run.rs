//! Running a scenario on the running kernel: its traffic through a fresh tap in a private
//! namespace, read by its reader, watched by tap-probe's probes from before the first packet
//! to after the drain; and the values its expectations are judged on.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tap_probe_common::{METRICS, Source};

use crate::lab::load::{
    DeviceIdentity, LoadConfig, LoadReport, Observer, SessionConfig, root_qdisc, run_load_observed,
};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::report::{Row, Value};
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_spec::measured::Measured;
use tap_probe_spec::spec::Traffic;

/// A scenario given only a packet count still ends by then.
const PACKETS_ONLY_LIMIT: Duration = Duration::from_mins(10);

/// Every name an expectation may use: the watch's per-queue counters and flags (summed over
/// the tap's queues; a flag counts the queues where it holds), and the load report's
/// numbers. From the counter table and the load report, so a new counter is usable here
/// once it is in the table.
#[must_use]
pub fn known_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = METRICS
        .iter()
        .filter(|metric| matches!(metric.source, Source::Programs { .. } | Source::QueueState))
        .map(|metric| metric.name)
        .collect();
    names.extend(load_numbers(&LoadReport::default()).map(|(name, _)| name));
    names
}

/// The load report's numbers, by the names of its JSON; `None` where it measured nothing
/// (no qdisc counters under noqueue). Every field is named, so a new one cannot be missed.
fn load_numbers(load: &LoadReport) -> [(&'static str, Option<Number>); 14] {
    let LoadReport {
        device: _,
        reader: _,
        qdisc: _,
        tx_queue_len: _,
        backpressure: _,
        frame_len: _,
        sender_threads: _,
        pps_limit: _,
        reader_pps_limit: _,
        attempted,
        sent,
        enobufs,
        read_by_reader,
        reordered_by_reader,
        drained,
        kernel_tx_packets,
        kernel_tx_dropped,
        qdisc_drops,
        qdisc_requeues,
        qdisc_backlog,
        elapsed_secs,
        sender_pps,
        delivered_pps,
        interrupted: _,
        vhost: _,
    } = load;
    let count = |n: &u64| Some(Number::Count(*n));
    [
        ("attempted", count(attempted)),
        ("sent", count(sent)),
        ("enobufs", count(enobufs)),
        ("read_by_reader", count(read_by_reader)),
        (
            "reordered_by_reader",
            reordered_by_reader.map(Number::Count),
        ),
        ("drained", count(drained)),
        ("kernel_tx_packets", count(kernel_tx_packets)),
        ("kernel_tx_dropped", count(kernel_tx_dropped)),
        ("qdisc_drops", qdisc_drops.map(Number::Count)),
        ("qdisc_requeues", qdisc_requeues.map(Number::Count)),
        ("qdisc_backlog", qdisc_backlog.map(Number::Count)),
        ("elapsed_secs", Some(Number::Real(*elapsed_secs))),
        ("sender_pps", Some(Number::Real(*sender_pps))),
        ("delivered_pps", Some(Number::Real(*delivered_pps))),
    ]
}

/// A number of the load report.
#[derive(Clone, Copy)]
enum Number {
    Count(u64),
    Real(f64),
}

/// Runs `traffic` with `stop` ending it early (a signal) and returns what it measured.
///
/// # Errors
/// When the kernel refuses a setting or a step fails; nothing is left behind.
pub fn run(traffic: &Traffic, kernel: &KernelInfo, stop: &Arc<AtomicBool>) -> Result<Measured> {
    if traffic.backpressure {
        tap_probe_observer::os::tap::require_backpressure()?;
    }
    let cfg = LoadConfig {
        session: SessionConfig {
            qdisc: Some(root_qdisc(traffic.qdisc)),
            tx_queue_len: Some(traffic.tx_queue_len),
            reader: traffic.reader,
            reader_pps: traffic.reader_pps,
            backpressure: traffic.backpressure,
            ..SessionConfig::default()
        },
        packets: traffic.packets.unwrap_or(u64::MAX),
        duration: traffic.duration.unwrap_or(PACKETS_ONLY_LIMIT),
        pps: traffic.pps,
        sender_threads: traffic.sender_threads,
        ..LoadConfig::default()
    };
    let mut watch = Watch {
        kernel,
        watcher: None,
        rows: Vec::new(),
    };
    let load = run_load_observed(&cfg, stop, &mut watch)?;
    if load.interrupted {
        bail!("interrupted");
    }
    let mut measured = Measured::default();
    for row in &watch.rows {
        for metric in METRICS {
            match (metric.source, row.value(metric)) {
                (Source::Programs { .. }, Value::Count(n)) => measured.add_count(metric.name, n),
                (Source::QueueState, Value::Flag(on)) => {
                    measured.add_count(metric.name, u64::from(on));
                }
                _ => {}
            }
        }
    }
    for (name, number) in load_numbers(&load) {
        match number {
            Some(Number::Count(n)) => measured.insert_count(name, n),
            Some(Number::Real(x)) => measured.insert_real(name, x)?,
            None => {}
        }
    }
    Ok(measured)
}

/// The probes on a scenario's tap: attached once the tap is up, read once it is drained.
struct Watch<'k> {
    kernel: &'k KernelInfo,
    watcher: Option<Watcher>,
    rows: Vec<Row>,
}

impl Observer for Watch<'_> {
    fn started(&mut self, device: &DeviceIdentity) -> Result<()> {
        let filter = Filter {
            globs: vec![device.name.clone()],
            netns: Some(device.netns_name.clone()),
            macvtap: false,
        };
        let mut watcher = Watcher::with_backend(self.kernel, &filter, Backend::Auto)?;
        // The first refresh tracks the tap: from then on every packet is counted.
        watcher.refresh().context("tracking the scenario's tap")?;
        self.watcher = Some(watcher);
        Ok(())
    }

    fn finished(&mut self) -> Result<()> {
        let watcher = self
            .watcher
            .as_mut()
            .context("the scenario's tap was never watched")?;
        self.rows = watcher.refresh()?.rows;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_of_the_load_report_is_a_known_name() {
        let json = serde_json::to_value(LoadReport::default()).expect("serialises");
        let known = known_names();
        for (field, value) in json.as_object().expect("an object") {
            let numeric = value.is_number() || (value.is_null() && field.starts_with("qdisc_"));
            let setting = [
                "tx_queue_len",
                "frame_len",
                "sender_threads",
                "pps_limit",
                "reader_pps_limit",
            ];
            if numeric && !setting.contains(&field.as_str()) {
                assert!(
                    known.contains(&field.as_str()),
                    "{field} is not a known name"
                );
            }
        }
        assert!(known.contains(&"xmit_calls") && known.contains(&"stopped"));
    }
}
