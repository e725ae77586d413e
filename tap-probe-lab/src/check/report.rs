//! What a `check` run found: per scenario the values it measured, each expectation's
//! verdict with both sides' values, and the exit code. Printed as text, as JSON
//! (`--format json`) and as `JUnit` XML (`junit.rs`).
//!
//! Exit codes: 0 when every expectation holds, 1 when one fails, 2 when the spec or the
//! kernel is the problem (a scenario could not run, or an expectation could not be
//! evaluated) or the run could not be completed (an output could not be written). A run
//! with both a failure and a problem exits 2: part of it is unknown, so the failures may
//! not be all there is. A run stopped by a signal ends with that signal once it has
//! reported, which a shell shows as 128 + N; its report says so.

use std::fmt::{self, Write as _};

use nix::sys::signal::Signal;
use serde::{Deserialize, Serialize};

use tap_probe_common::MetricId;
use tap_probe_spec::baseline::SavedBaseline;
use tap_probe_spec::expr::{Expectation, Name};
use tap_probe_spec::load::LoadNumber;
use tap_probe_spec::measured::{Measured, MeasuredValue};
use tap_probe_spec::spec::{Scenario, Traffic};

/// A value a scenario measured, by its table: a number of the load report or a counter of
/// the watch.
#[derive(Clone, Copy, Debug)]
pub(crate) enum Measure {
    Load(LoadNumber),
    Counter(MetricId),
}

impl Measure {
    /// Its name in [`Measured`] and in an expectation.
    pub(crate) fn name(self) -> &'static str {
        match self {
            Self::Load(id) => id.name(),
            Self::Counter(id) => id.metric().name,
        }
    }
}

/// The counters that say where a run's packets went, in the order a packet meets them:
/// the sender, the qdisc, the driver, the reader, the kernel's own device counters. A
/// failed expectation shows those of them that are not zero, beside the names it uses.
pub(crate) const PACKET_FATE: &[Measure] = &[
    Measure::Load(LoadNumber::Attempted),
    Measure::Load(LoadNumber::Sent),
    Measure::Load(LoadNumber::Enobufs),
    Measure::Load(LoadNumber::QdiscDrops),
    Measure::Load(LoadNumber::QdiscRequeues),
    Measure::Load(LoadNumber::QdiscBacklog),
    Measure::Counter(MetricId::XmitCalls),
    Measure::Counter(MetricId::Enqueued),
    Measure::Counter(MetricId::Busy),
    Measure::Counter(MetricId::DroppedFullRing),
    Measure::Counter(MetricId::DroppedOther),
    Measure::Counter(MetricId::Consumed),
    Measure::Load(LoadNumber::ReadByReader),
    Measure::Load(LoadNumber::Drained),
    Measure::Load(LoadNumber::KernelTxPackets),
    Measure::Load(LoadNumber::KernelTxDropped),
];

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize, Deserialize)]
#[serde(rename_all = "lowercase")]
pub enum Verdict {
    Pass,
    Fail,
    /// The spec or the kernel is the problem: the expectation could not be judged.
    Error,
}

impl Verdict {
    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Pass => "PASS",
            Self::Fail => "FAIL",
            Self::Error => "ERROR",
        }
    }
}

/// Named values in a chosen order (a JSON object that keeps it).
#[derive(Clone, Debug, Default, PartialEq)]
pub(crate) struct NamedValues(pub(crate) Vec<(String, MeasuredValue)>);

impl Serialize for NamedValues {
    fn serialize<S: serde::Serializer>(&self, s: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeMap;
        let mut map = s.serialize_map(Some(self.0.len()))?;
        for (k, v) in &self.0 {
            map.serialize_entry(k, v)?;
        }
        map.end()
    }
}

impl fmt::Display for NamedValues {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, (name, value)) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str(", ")?;
            }
            write!(f, "{name} = {value}")?;
        }
        Ok(())
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ExpectationReport {
    /// The expectation as written.
    pub(crate) expect: String,
    pub(crate) verdict: Verdict,
    pub(crate) left: Option<MeasuredValue>,
    pub(crate) right: Option<MeasuredValue>,
    /// Why it failed (both sides and their values) or could not be evaluated.
    pub(crate) message: Option<String>,
    /// The values of the names the expectation uses (`baseline.NAME` included).
    pub(crate) values: NamedValues,
    /// For a failure: the counters of [`PACKET_FATE`] that are not zero and not among
    /// `values`, i.e. where the packets went.
    pub(crate) packets: NamedValues,
}

impl ExpectationReport {
    /// The failure or error line with the values that explain it, on one line.
    pub(crate) fn explanation(&self) -> String {
        let mut out = self.message.clone().unwrap_or_default();
        if !self.values.0.is_empty() && self.verdict == Verdict::Error {
            let _ = write!(out, "; values: {}", self.values);
        }
        if !self.packets.0.is_empty() {
            let _ = write!(out, "; where the packets went: {}", self.packets);
        }
        out
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct ScenarioReport {
    pub name: String,
    pub verdict: Verdict,
    pub traffic: Traffic,
    /// Why the scenario could not run or finish (the kernel refused a setting, vhost-net is
    /// missing, ...).
    pub error: Option<String>,
    pub expectations: Vec<ExpectationReport>,
    /// What the run measured; `None` when it did not get that far.
    pub measured: Option<Measured>,
    /// Wall-clock seconds of the whole scenario: setup, traffic, drain.
    pub(crate) duration_secs: f64,
}

impl ScenarioReport {
    /// Judges every expectation of `scenario` on what its run measured; `baseline.NAME`
    /// resolves to the baseline's value for the same scenario.
    #[must_use]
    pub fn judged(
        scenario: &Scenario,
        measured: Measured,
        baseline: Option<&SavedBaseline>,
        duration_secs: f64,
    ) -> Self {
        let lookup = |name: &Name| -> Option<f64> {
            match name {
                Name::Measured(n) => measured.get(n).map(MeasuredValue::as_f64),
                Name::Baseline(n) => baseline.and_then(|b| b.value(&scenario.name, n).ok()),
            }
        };
        let expectations: Vec<ExpectationReport> = scenario
            .expect
            .iter()
            .map(|e| judge(e, &lookup, &measured))
            .collect();
        Self {
            name: scenario.name.clone(),
            verdict: expectations
                .iter()
                .map(|e| e.verdict)
                .max()
                .unwrap_or(Verdict::Pass),
            traffic: scenario.traffic.clone(),
            error: None,
            expectations,
            measured: Some(measured),
            duration_secs,
        }
    }

    /// A scenario that could not run or finish: every expectation is an error, since
    /// nothing can be said about it.
    #[must_use]
    pub fn errored(
        scenario: &Scenario,
        error: String,
        measured: Option<Measured>,
        duration_secs: f64,
    ) -> Self {
        Self {
            name: scenario.name.clone(),
            verdict: Verdict::Error,
            traffic: scenario.traffic.clone(),
            expectations: scenario
                .expect
                .iter()
                .map(|e| ExpectationReport {
                    expect: e.text().to_owned(),
                    verdict: Verdict::Error,
                    left: None,
                    right: None,
                    message: Some(format!(
                        "not evaluated: the scenario failed to run: {error}"
                    )),
                    values: NamedValues::default(),
                    packets: NamedValues::default(),
                })
                .collect(),
            error: Some(error),
            measured,
            duration_secs,
        }
    }
}

fn judge(
    expectation: &Expectation,
    lookup: &dyn Fn(&Name) -> Option<f64>,
    measured: &Measured,
) -> ExpectationReport {
    let values = NamedValues(
        expectation
            .names()
            .into_iter()
            .filter_map(|name| Some((name.to_string(), MeasuredValue::from_f64(lookup(name)?))))
            .collect(),
    );
    match expectation.evaluate(lookup) {
        Ok(outcome) if outcome.holds => ExpectationReport {
            expect: expectation.text().to_owned(),
            verdict: Verdict::Pass,
            left: Some(MeasuredValue::from_f64(outcome.left)),
            right: Some(MeasuredValue::from_f64(outcome.right)),
            message: None,
            values,
            packets: NamedValues::default(),
        },
        Ok(outcome) => {
            let packets = PACKET_FATE
                .iter()
                .map(|measure| measure.name())
                .filter(|name| !values.0.iter().any(|(n, _)| n == name))
                .filter_map(|name| {
                    let value = measured.get(name)?;
                    (value.as_f64() != 0.0).then(|| (name.to_owned(), value))
                })
                .collect();
            ExpectationReport {
                expect: expectation.text().to_owned(),
                verdict: Verdict::Fail,
                left: Some(MeasuredValue::from_f64(outcome.left)),
                right: Some(MeasuredValue::from_f64(outcome.right)),
                message: Some(expectation.failure_message(&outcome)),
                values,
                packets: NamedValues(packets),
            }
        }
        Err(err) => ExpectationReport {
            expect: expectation.text().to_owned(),
            verdict: Verdict::Error,
            left: None,
            right: None,
            message: Some(format!(
                "`{}` could not be evaluated: {err}",
                expectation.text()
            )),
            values,
            packets: NamedValues::default(),
        },
    }
}

/// How `check` exits.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Exit {
    /// Every expectation holds.
    Holds,
    /// At least one expectation fails, and everything could be judged.
    Fails,
    /// The spec or the kernel is the problem, or the run could not be completed.
    Problem,
    /// A signal stopped the run: the process ends with it, once it has reported.
    Stopped(Signal),
}

impl Exit {
    /// The exit status a shell shows: for a signal, 128 + its number.
    #[must_use]
    pub fn code(self) -> u8 {
        match self {
            Self::Holds => 0,
            Self::Fails => 1,
            Self::Problem => 2,
            // Every signal that stops a run (SIGINT, SIGTERM, SIGHUP, SIGPIPE) is below 128.
            Self::Stopped(signal) => 128 + u8::try_from(signal as i32).unwrap_or(0),
        }
    }
}

impl fmt::Display for Exit {
    /// As the report's last line ends: `exit 1`, `stopped by SIGTERM: exit 143`.
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        if let Self::Stopped(signal) = self {
            write!(f, "stopped by {signal}: ")?;
        }
        write!(f, "exit {}", self.code())
    }
}

/// A whole `check` run.
#[derive(Clone, Debug, PartialEq)]
pub struct CheckReport {
    /// `uname -r` of the kernel the scenarios ran on.
    pub kernel_release: String,
    pub scenarios: Vec<ScenarioReport>,
    /// The signal that stopped the run, which the process ends with.
    pub stopped_by: Option<Signal>,
    /// The outputs that could not be written (`--junit FILE`): the run could not be
    /// completed.
    pub unwritten: Vec<String>,
}

impl CheckReport {
    /// The worst verdict; a run without scenarios proved nothing and is an error.
    #[must_use]
    pub fn verdict(&self) -> Verdict {
        self.scenarios
            .iter()
            .map(|s| s.verdict)
            .max()
            .unwrap_or(Verdict::Error)
    }

    /// A run of `scenarios`, neither stopped nor short of an output yet.
    #[must_use]
    pub fn new(kernel_release: String, scenarios: Vec<ScenarioReport>) -> Self {
        Self {
            kernel_release,
            scenarios,
            stopped_by: None,
            unwritten: Vec::new(),
        }
    }

    /// How the process exits: with the signal that stopped it, 2 when an output could not
    /// be written, else by the worst verdict.
    #[must_use]
    pub fn exit(&self) -> Exit {
        if let Some(signal) = self.stopped_by {
            return Exit::Stopped(signal);
        }
        if !self.unwritten.is_empty() {
            return Exit::Problem;
        }
        match self.verdict() {
            Verdict::Pass => Exit::Holds,
            Verdict::Fail => Exit::Fails,
            Verdict::Error => Exit::Problem,
        }
    }

    /// The values this run measured, for `--save-baseline`. Scenarios that measured nothing
    /// (they failed to run) are left out: a later run comparing with them gets an error
    /// naming the scenario, not a comparison with nothing.
    #[must_use]
    pub fn baseline(&self) -> SavedBaseline {
        SavedBaseline::new(
            self.kernel_release.clone(),
            self.scenarios
                .iter()
                .filter_map(|s| Some((s.name.clone(), s.measured.clone()?)))
                .filter(|(_, measured)| !measured.is_empty())
                .collect(),
        )
    }

    /// The `--format json` document.
    #[must_use]
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct CheckDocument<'a> {
            kernel_release: &'a str,
            verdict: Verdict,
            exit_code: u8,
            /// The signal the process ends with (`exit_code` is 128 + its number).
            stopped_by: Option<&'a str>,
            unwritten: &'a [String],
            scenarios: &'a [ScenarioReport],
        }
        let document = CheckDocument {
            kernel_release: &self.kernel_release,
            verdict: self.verdict(),
            exit_code: self.exit().code(),
            stopped_by: self.stopped_by.map(Signal::as_str),
            unwritten: &self.unwritten,
            scenarios: &self.scenarios,
        };
        // Plain data with string keys and finite numbers: serialising cannot fail.
        serde_json::to_string_pretty(&document).unwrap_or_default()
    }

    /// The text report: a verdict line per scenario, and under it every expectation that
    /// did not hold, with both sides' values and where the packets went.
    #[must_use]
    pub fn text(&self) -> String {
        let mut out = String::new();
        for scenario in &self.scenarios {
            let _ = writeln!(
                out,
                "{:<5} {} ({} of {} expectations hold, {:.1} s)",
                scenario.verdict.label(),
                scenario.name,
                scenario
                    .expectations
                    .iter()
                    .filter(|e| e.verdict == Verdict::Pass)
                    .count(),
                scenario.expectations.len(),
                scenario.duration_secs
            );
            if let Some(error) = &scenario.error {
                let _ = writeln!(out, "      {error}");
                continue;
            }
            for e in scenario
                .expectations
                .iter()
                .filter(|e| e.verdict != Verdict::Pass)
            {
                let _ = writeln!(out, "      {}", e.message.as_deref().unwrap_or_default());
                if e.verdict == Verdict::Error && !e.values.0.is_empty() {
                    let _ = writeln!(out, "        values: {}", e.values);
                }
                if !e.packets.0.is_empty() {
                    let _ = writeln!(out, "        where the packets went: {}", e.packets);
                }
            }
        }
        let count = |v: Verdict| self.scenarios.iter().filter(|s| s.verdict == v).count();
        let _ = write!(
            out,
            "{} scenarios: {} passed, {} failed, {} errors",
            self.scenarios.len(),
            count(Verdict::Pass),
            count(Verdict::Fail),
            count(Verdict::Error),
        );
        if !self.unwritten.is_empty() {
            let _ = write!(out, "; not written: {}", self.unwritten.join(", "));
        }
        let _ = writeln!(out, " ({})", self.exit());
        out
    }
}

#[cfg(test)]
pub(crate) mod tests {
    use super::*;
    use crate::check::run::known_names;
    use tap_probe_spec::spec::Spec;

    pub(crate) const SPEC: &str = r#"
[[scenario]]
name = "stock"
qdisc = "pfifo-fast"
packets = 50000
expect = ["consumed + dropped_full_ring == sent", "dropped_full_ring == 0"]

[[scenario]]
name = "fq_codel with backpressure"
qdisc = "fq-codel"
backpressure = true
packets = 50000
expect = ["dropped_full_ring == 0", "consumed + qdisc_drops == sent",
          "delivered_pps >= 0.5 * sent / elapsed_secs"]
"#;

    pub(crate) fn spec() -> Spec {
        Spec::parse(SPEC, &known_names(), None).unwrap()
    }

    /// A tail-dropping run: 50000 sent, 1000 read, 49000 dropped at the full ring. Two
    /// queues' rows, summed.
    pub(crate) fn tail_drop() -> Measured {
        let mut m = Measured::default();
        for (queue_enqueued, queue_dropped) in [(600, 30_000), (400, 19_000)] {
            m.add_count("xmit_calls", queue_enqueued + queue_dropped);
            m.add_count("enqueued", queue_enqueued);
            m.add_count("dropped_full_ring", queue_dropped);
            m.add_count("consumed", queue_enqueued);
            m.add_count("busy", 0);
            m.add_count("dropped_other", 0);
        }
        m.insert_count("kernel_tx_packets", 1000);
        m.insert_count("kernel_tx_dropped", 49_000);
        m.insert_count("sent", 50_000);
        m.insert_count("attempted", 50_000);
        m.insert_count("qdisc_drops", 0);
        m.insert_real("delivered_pps", 1000.0 / 0.25).unwrap();
        m.insert_real("elapsed_secs", 0.25).unwrap();
        m
    }

    /// A run with backpressure: nothing dropped at the ring, 10 dropped by the qdisc.
    pub(crate) fn backpressure() -> Measured {
        let mut m = Measured::default();
        m.add_count("xmit_calls", 49_990);
        m.add_count("enqueued", 49_990);
        m.add_count("dropped_full_ring", 0);
        m.add_count("consumed", 49_990);
        m.insert_count("sent", 50_000);
        m.insert_count("qdisc_drops", 10);
        m.insert_real("delivered_pps", 49_990.0 / 0.5).unwrap();
        m.insert_real("elapsed_secs", 0.5).unwrap();
        m
    }

    pub(crate) fn report() -> CheckReport {
        let spec = spec();
        CheckReport::new(
            "7.3.0-1-cloud-amd64".to_owned(),
            vec![
                ScenarioReport::judged(&spec.scenarios[0], tail_drop(), None, 1.25),
                ScenarioReport::judged(&spec.scenarios[1], backpressure(), None, 2.5),
            ],
        )
    }

    #[test]
    fn a_failure_shows_both_sides_and_where_the_packets_went() {
        let report = report();
        let stock = &report.scenarios[0];
        assert_eq!(stock.verdict, Verdict::Fail);
        assert_eq!(stock.expectations[0].verdict, Verdict::Pass);
        let failed = &stock.expectations[1];
        assert_eq!(failed.verdict, Verdict::Fail);
        assert_eq!(failed.left, Some(MeasuredValue::Count(49_000)));
        assert_eq!(failed.right, Some(MeasuredValue::Count(0)));
        assert_eq!(
            failed.message.as_deref(),
            Some("`dropped_full_ring == 0` failed: left `dropped_full_ring` = 49000, right = 0")
        );
        assert_eq!(failed.values.to_string(), "dropped_full_ring = 49000");
        assert_eq!(
            failed.packets.to_string(),
            "attempted = 50000, sent = 50000, xmit_calls = 50000, enqueued = 1000, \
             consumed = 1000, kernel_tx_packets = 1000, kernel_tx_dropped = 49000"
        );
        assert_eq!(
            failed.explanation(),
            "`dropped_full_ring == 0` failed: left `dropped_full_ring` = 49000, right = 0; \
             where the packets went: attempted = 50000, sent = 50000, xmit_calls = 50000, \
             enqueued = 1000, consumed = 1000, kernel_tx_packets = 1000, \
             kernel_tx_dropped = 49000"
        );
        let fq = &report.scenarios[1];
        assert_eq!(fq.verdict, Verdict::Pass, "{fq:#?}");
        assert!(fq.expectations.iter().all(|e| e.packets.0.is_empty()));
        assert_eq!(report.exit(), Exit::Fails);
        assert_eq!(report.exit().code(), 1);
    }

    #[test]
    fn exit_codes() {
        let spec = spec();
        let mut report = report();
        report.scenarios[0] = ScenarioReport::judged(&spec.scenarios[0], backpressure(), None, 1.0);
        // consumed + dropped_full_ring == sent fails there (10 went to the qdisc).
        assert_eq!(report.exit(), Exit::Fails);
        report.scenarios.remove(0);
        assert_eq!(report.verdict(), Verdict::Pass);
        assert_eq!(report.exit().code(), 0);
        report.scenarios.push(ScenarioReport::errored(
            &spec.scenarios[0],
            "the kernel refused IFF_BACKPRESSURE (EINVAL): boot a kernel with the series"
                .to_owned(),
            None,
            0.1,
        ));
        assert_eq!(report.exit(), Exit::Problem);
        assert_eq!(report.exit().code(), 2);
        report.scenarios.insert(
            0,
            ScenarioReport::judged(&spec.scenarios[0], tail_drop(), None, 1.0),
        );
        // A failure and a problem: the problem decides.
        assert_eq!(report.exit(), Exit::Problem);
        report.scenarios.clear();
        assert_eq!(report.exit(), Exit::Problem);
        assert_eq!(Exit::Holds.code(), 0);
    }

    #[test]
    fn an_unmeasured_or_broken_value_is_an_error_not_a_failure() {
        let spec = spec();
        let mut m = backpressure();
        m.insert_real("elapsed_secs", 0.0).unwrap();
        let s = ScenarioReport::judged(&spec.scenarios[1], m, None, 1.0);
        assert_eq!(s.verdict, Verdict::Error);
        let e = &s.expectations[2];
        assert_eq!(e.verdict, Verdict::Error);
        assert_eq!((e.left, e.right), (None, None));
        let message = e.message.as_deref().unwrap();
        assert!(message.contains("division by zero"), "{message}");
        assert!(
            e.explanation().contains("elapsed_secs = 0"),
            "{}",
            e.explanation()
        );
        let mut m = Measured::default();
        for (name, value) in backpressure().iter().filter(|(n, _)| *n != "qdisc_drops") {
            match value {
                MeasuredValue::Count(n) => m.insert_count(name, n),
                MeasuredValue::Real(v) => m.insert_real(name, v).unwrap(),
            }
        }
        let s = ScenarioReport::judged(&spec.scenarios[1], m, None, 1.0);
        assert_eq!(s.expectations[1].verdict, Verdict::Error);
        assert!(
            s.expectations[1]
                .message
                .as_deref()
                .unwrap()
                .contains("`qdisc_drops` has no value"),
            "{s:#?}"
        );
    }

    #[test]
    fn errored_scenarios_judge_nothing() {
        let spec = spec();
        let s = ScenarioReport::errored(
            &spec.scenarios[1],
            "/dev/vhost-net is missing: load vhost_net (modprobe vhost_net)".to_owned(),
            None,
            0.0,
        );
        assert_eq!(s.verdict, Verdict::Error);
        assert_eq!(s.expectations.len(), 3);
        assert!(s.expectations.iter().all(|e| e.verdict == Verdict::Error
            && e.message.as_deref().unwrap().contains("modprobe vhost_net")));
    }

    #[test]
    fn json_document() {
        let json: serde_json::Value = serde_json::from_str(&report().to_json()).unwrap();
        assert_eq!(json["verdict"], "fail");
        assert_eq!(json["exit_code"], 1);
        assert_eq!(json["kernel_release"], "7.3.0-1-cloud-amd64");
        let stock = &json["scenarios"][0];
        assert_eq!(stock["name"], "stock");
        assert_eq!(stock["verdict"], "fail");
        assert_eq!(stock["traffic"]["qdisc"], "pfifo-fast");
        assert_eq!(stock["error"], serde_json::Value::Null);
        assert_eq!(stock["duration_secs"], 1.25);
        assert_eq!(stock["measured"]["dropped_full_ring"], 49_000);
        assert_eq!(stock["measured"]["delivered_pps"], 4000.0);
        let failed = &stock["expectations"][1];
        assert_eq!(failed["expect"], "dropped_full_ring == 0");
        assert_eq!(failed["verdict"], "fail");
        assert_eq!(failed["left"], 49_000);
        assert_eq!(failed["right"], 0);
        assert_eq!(failed["values"]["dropped_full_ring"], 49_000);
        // The packets object keeps the order a packet travels (`serde_json::Value` sorts its
        // keys, so this looks at the text).
        let text = report().to_json();
        let packets = &text[text.find("\"packets\": {\n").unwrap()..];
        let packets = &packets[..packets.find('}').unwrap()];
        let order: Vec<usize> = [
            "attempted",
            "sent",
            "xmit_calls",
            "enqueued",
            "consumed",
            "kernel_tx_packets",
            "kernel_tx_dropped",
        ]
        .iter()
        .map(|name| packets.find(&format!("\"{name}\"")).unwrap())
        .collect();
        assert!(order.is_sorted(), "{packets}");
        let passed = &json["scenarios"][1]["expectations"][2];
        assert_eq!(passed["verdict"], "pass");
        assert_eq!(passed["message"], serde_json::Value::Null);
        assert_eq!(passed["right"], 50_000.0);
    }

    #[test]
    fn text_report() {
        assert_eq!(
            report().text(),
            "FAIL  stock (1 of 2 expectations hold, 1.2 s)\n      `dropped_full_ring == 0` \
             failed: left `dropped_full_ring` = 49000, right = 0\n        where the packets \
             went: attempted = 50000, sent = 50000, xmit_calls = 50000, enqueued = 1000, \
             consumed = 1000, kernel_tx_packets = 1000, kernel_tx_dropped = 49000\nPASS  \
             fq_codel with backpressure (3 of 3 expectations hold, 2.5 s)\n2 scenarios: 1 \
             passed, 1 failed, 0 errors (exit 1)\n"
        );
        let spec = spec();
        let errored = CheckReport::new(
            String::new(),
            vec![ScenarioReport::errored(
                &spec.scenarios[0],
                "no tun module".to_owned(),
                None,
                0.0,
            )],
        );
        assert_eq!(
            errored.text(),
            "ERROR stock (0 of 2 expectations hold, 0.0 s)\n      no tun module\n1 scenarios: \
             0 passed, 0 failed, 1 errors (exit 2)\n"
        );
    }

    /// An output that could not be written makes the run's status 2, whatever the
    /// verdicts, and the report's last line and its JSON name it.
    #[test]
    fn an_unwritten_output_is_a_problem_of_the_run() {
        let mut report = report();
        assert_eq!(report.exit(), Exit::Fails);
        report
            .unwritten
            .push("--save-baseline /dev/full".to_owned());
        assert_eq!(report.exit(), Exit::Problem);
        assert!(
            report.text().ends_with(
                "2 scenarios: 1 passed, 1 failed, 0 errors; not written: --save-baseline \
                 /dev/full (exit 2)\n"
            ),
            "{}",
            report.text()
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["exit_code"], 2);
        assert_eq!(json["unwritten"][0], "--save-baseline /dev/full");
    }

    /// A run stopped by a signal states, on its last line and in its JSON, the status the
    /// process ends with: that signal's, which a shell shows as 128 + N, whatever the
    /// verdicts or the outputs.
    #[test]
    fn a_stopped_run_states_the_status_the_process_ends_with() {
        let mut report = report();
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["stopped_by"], serde_json::Value::Null);
        report
            .unwritten
            .push("--save-baseline /dev/full".to_owned());
        report.stopped_by = Some(Signal::SIGTERM);
        assert_eq!(report.exit(), Exit::Stopped(Signal::SIGTERM));
        assert!(
            report.text().ends_with(
                "2 scenarios: 1 passed, 1 failed, 0 errors; not written: --save-baseline \
                 /dev/full (stopped by SIGTERM: exit 143)\n"
            ),
            "{}",
            report.text()
        );
        let json: serde_json::Value = serde_json::from_str(&report.to_json()).unwrap();
        assert_eq!(json["exit_code"], 143);
        assert_eq!(json["stopped_by"], "SIGTERM");
        for (signal, code) in [
            (Signal::SIGINT, 130),
            (Signal::SIGTERM, 143),
            (Signal::SIGHUP, 129),
            (Signal::SIGPIPE, 141),
        ] {
            assert_eq!(Exit::Stopped(signal).code(), code);
        }
    }

    #[test]
    fn packet_fate_names_are_measured_names() {
        let known = known_names();
        for measure in PACKET_FATE {
            assert!(known.contains(&measure.name()), "{measure:?}");
        }
    }

    #[test]
    fn scenarios_that_measured_nothing_are_left_out() {
        let spec = spec();
        let mut report = report();
        report.scenarios[0] =
            ScenarioReport::errored(&spec.scenarios[0], "no tun".to_owned(), None, 0.0);
        let baseline = report.baseline();
        assert!(baseline.value("stock", "sent").is_err());
        assert_eq!(
            baseline.value("fq_codel with backpressure", "sent"),
            Ok(50_000.0)
        );
    }

    #[test]
    fn a_run_compares_with_its_baseline() {
        let text = r#"
[[scenario]]
name = "fq_codel with backpressure"
qdisc = "fq-codel"
backpressure = true
packets = 50000
expect = ["delivered_pps >= 0.95 * baseline.delivered_pps", "sent == baseline.sent"]
"#;
        let saved = SavedBaseline::parse(&report().baseline().to_json(), "base.json").unwrap();
        let spec = Spec::parse(text, &known_names(), Some(&saved)).unwrap();
        let mut slower = backpressure();
        slower.insert_real("delivered_pps", 90_000.0).unwrap();
        let judged = ScenarioReport::judged(&spec.scenarios[0], slower, Some(&saved), 1.0);
        let e = &judged.expectations[0];
        assert_eq!(
            e.message.as_deref(),
            Some(
                "`delivered_pps >= 0.95 * baseline.delivered_pps` failed: left `delivered_pps` \
                 = 90000, right `0.95 * baseline.delivered_pps` = 94981"
            )
        );
        assert_eq!(
            e.values.to_string(),
            "delivered_pps = 90000, baseline.delivered_pps = 99980"
        );
        assert_eq!(judged.expectations[1].verdict, Verdict::Pass);
        // Without the baseline at evaluation the value is missing: an error, not a pass.
        let spec_without = Spec::parse(text, &known_names(), Some(&saved)).unwrap();
        let judged = ScenarioReport::judged(&spec_without.scenarios[0], backpressure(), None, 1.0);
        assert_eq!(judged.verdict, Verdict::Error);
    }
}
