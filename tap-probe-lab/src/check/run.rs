//! Running a scenario on the running kernel: its traffic through a fresh tap in a private
//! namespace, read by its reader, watched by tap-probe's probes from before the first packet
//! to after the drain; and the values its expectations are judged on.

use std::sync::Arc;
use std::sync::atomic::AtomicBool;
use std::time::Duration;

use anyhow::{Context as _, Result, bail};
use tap_probe_common::{METRICS, Source};

use crate::lab::load::{
    DeviceIdentity, LoadConfig, Observer, SessionConfig, root_qdisc, run_load_observed,
};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::discovery::Filter;
use tap_probe_observer::host::report::{Row, Value};
use tap_probe_observer::host::watcher::Watcher;
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_spec::load::LoadNumber;
use tap_probe_spec::measured::{Measured, MeasuredValue};
use tap_probe_spec::spec::Traffic;

/// A scenario given only a packet count still ends by then.
const PACKETS_ONLY_LIMIT: Duration = Duration::from_mins(10);

/// Every name an expectation may use: the watch's per-queue counters and flags (summed over
/// the tap's queues; a flag counts the queues where it holds), and the load report's
/// numbers. From the counter table and the load report's table, so a new counter or number
/// is usable here once it is in its table.
#[must_use]
pub fn known_names() -> Vec<&'static str> {
    let mut names: Vec<&'static str> = METRICS
        .iter()
        .filter(|metric| matches!(metric.source, Source::Programs { .. } | Source::QueueState))
        .map(|metric| metric.name)
        .collect();
    names.extend(LoadNumber::ALL.iter().map(|id| id.name()));
    names
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
    for &id in LoadNumber::ALL {
        match load.numbers.value(id) {
            Some(MeasuredValue::Count(n)) => measured.insert_count(id.name(), n),
            Some(MeasuredValue::Real(x)) => measured.insert_real(id.name(), x)?,
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
    use crate::lab::load::LoadReport;

    /// A number put in the load report beside the table's, rather than in it, would be
    /// neither known to expectations nor read by the benchmarks.
    #[test]
    fn every_number_of_the_load_report_is_in_its_table() {
        let json = serde_json::to_value(LoadReport::default()).expect("serialises");
        let settings = [
            "tx_queue_len",
            "frame_len",
            "sender_threads",
            "pps_limit",
            "reader_pps_limit",
        ];
        let known = known_names();
        for (field, value) in json.as_object().expect("an object") {
            let numeric = value.is_number() || value.is_null() && field != "vhost";
            if numeric && !settings.contains(&field.as_str()) {
                assert!(
                    LoadNumber::ALL.iter().any(|id| id.name() == field),
                    "{field} is not in the load report's table"
                );
                assert!(known.contains(&field.as_str()), "{field}");
            }
        }
        assert!(known.contains(&"xmit_calls") && known.contains(&"stopped"));
    }
}
