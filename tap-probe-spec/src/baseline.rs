//! The baseline file: what an earlier `check --save-baseline FILE` measured, per scenario,
//! so that `check --baseline FILE` can compare with it (`baseline.NAME`).
//!
//! ```json
//! {
//!   "format": "tap-probe-check-baseline",
//!   "version": 1,
//!   "kernel_release": "7.3.0-1-cloud-amd64",
//!   "scenarios": {
//!     "fq_codel with backpressure": { "delivered_pps": 183512.5, "sent": 50000, ... }
//!   }
//! }
//! ```
//!
//! Counts are JSON integers and rates JSON numbers with a fraction, so counts read back
//! exactly. A file of a newer version is refused rather than half understood.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{Context, Result, anyhow, bail};
use serde::{Deserialize, Serialize};
use tap_probe_common::echo::{MAX_CHARS, clip_quoted, clipped, quoted};

use crate::measured::{Measured, MeasuredValue};

const FORMAT: &str = "tap-probe-check-baseline";
const VERSION: u64 = 1;

/// The largest baseline read, in bytes: a run of [`crate::spec::MAX_SCENARIOS`] scenarios
/// saves some 10 MB. A larger file (or a device that never ends) is refused before it is read.
pub const MAX_BYTES: u64 = 16 << 20;
/// The most of its scenarios a message names when the baseline lacks one.
const HAS_SHOWN: usize = 10;

/// A baseline file's contents: per scenario, the values an earlier run measured.
#[derive(Clone, Debug, PartialEq)]
pub struct SavedBaseline {
    /// Where it was read from, for messages.
    source: String,
    kernel_release: String,
    scenarios: BTreeMap<String, Measured>,
}

#[derive(Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    format: String,
    version: u64,
    kernel_release: String,
    scenarios: BTreeMap<String, Measured>,
}

impl SavedBaseline {
    /// A baseline of what a run measured (`--save-baseline`), per scenario.
    #[must_use]
    pub fn new(kernel_release: String, scenarios: BTreeMap<String, Measured>) -> Self {
        Self {
            source: String::new(),
            kernel_release,
            scenarios,
        }
    }

    /// The file's text.
    #[must_use]
    pub fn to_json(&self) -> String {
        let file = File {
            format: FORMAT.to_owned(),
            version: VERSION,
            kernel_release: self.kernel_release.clone(),
            scenarios: self.scenarios.clone(),
        };
        // String keys and finite numbers (`Measured` holds no others): cannot fail.
        let mut text = serde_json::to_string_pretty(&file).unwrap_or_default();
        text.push('\n');
        text
    }

    /// Reads a baseline from its text; `source` names it in messages.
    ///
    /// # Errors
    /// When the text is not a baseline of this version, saying what to do.
    pub fn parse(text: &str, source: &str) -> Result<Self> {
        let redo = "write it with `tap-probe check --save-baseline FILE`";
        // serde_json's messages quote what they read: cut, as every echo is.
        let reader = |err: serde_json::Error| anyhow!(clip_quoted(&err.to_string()));
        let value: serde_json::Value = serde_json::from_str(text)
            .map_err(reader)
            .with_context(|| format!("baseline {source} is not JSON; {redo}"))?;
        if value.get("format").and_then(serde_json::Value::as_str) != Some(FORMAT) {
            bail!(
                "{source} is not a tap-probe check baseline (no \"format\": \"{FORMAT}\"); {redo}"
            );
        }
        match value.get("version").and_then(serde_json::Value::as_u64) {
            Some(VERSION) => {}
            Some(v) if v > VERSION => bail!(
                "baseline {source} has version {v}, written by a newer tap-probe; this one \
                 reads version {VERSION}: use the newer tap-probe or save the baseline again"
            ),
            _ => bail!(
                "baseline {source} has no valid \"version\" (this tap-probe reads {VERSION}); {redo}"
            ),
        }
        let file: File = serde_json::from_value(value)
            .map_err(reader)
            .with_context(|| format!("baseline {source} is damaged; {redo}"))?;
        Ok(Self {
            source: source.to_owned(),
            kernel_release: file.kernel_release,
            scenarios: file.scenarios,
        })
    }

    /// The kernel the baseline was measured on.
    #[must_use]
    pub fn kernel_release(&self) -> &str {
        &self.kernel_release
    }

    /// The baseline's value of `name` in `scenario`.
    ///
    /// # Errors
    /// When the baseline lacks the scenario or the value; the message names both.
    pub fn value(&self, scenario: &str, name: &str) -> Result<f64, BaselineError> {
        let measured = self
            .scenarios
            .get(scenario)
            .ok_or_else(|| BaselineError::NoScenario {
                source: self.source.clone(),
                scenario: scenario.to_owned(),
                has: self.scenarios.keys().take(HAS_SHOWN).cloned().collect(),
                of: self.scenarios.len(),
            })?;
        measured
            .get(name)
            .map(MeasuredValue::as_f64)
            .ok_or_else(|| BaselineError::NoValue {
                source: self.source.clone(),
                scenario: scenario.to_owned(),
                name: name.to_owned(),
            })
    }
}

/// A `baseline.NAME` the baseline cannot answer.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum BaselineError {
    NoScenario {
        source: String,
        scenario: String,
        /// The first of the scenarios it has, at most [`HAS_SHOWN`].
        has: Vec<String>,
        /// How many it has.
        of: usize,
    },
    NoValue {
        source: String,
        scenario: String,
        name: String,
    },
}

impl fmt::Display for BaselineError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::NoScenario {
                source,
                scenario,
                has,
                of,
            } => {
                write!(
                    f,
                    "baseline {source} has no scenario {}",
                    quoted(scenario, MAX_CHARS)
                )?;
                if has.is_empty() {
                    f.write_str(" (it has none)")?;
                } else {
                    let mut names: Vec<String> = has.iter().map(|s| quoted(s, MAX_CHARS)).collect();
                    if *of > has.len() {
                        names.push(format!("and {} more", of - has.len()));
                    }
                    write!(f, " (it has {})", names.join(", "))?;
                }
                f.write_str(
                    "; save a baseline from a run of this spec with --save-baseline, or fix \
                     the scenario's name",
                )
            }
            Self::NoValue {
                source,
                scenario,
                name,
            } => {
                let name = clipped(name, MAX_CHARS);
                write!(
                    f,
                    "baseline {source} has no `{name}` for scenario {}; the run that saved it \
                     did not measure `{name}`: save the baseline again",
                    quoted(scenario, MAX_CHARS)
                )
            }
        }
    }
}

impl std::error::Error for BaselineError {}

#[cfg(test)]
mod tests {
    use super::*;

    /// What a run of the README's two scenarios saved: a count beyond 2^53 too.
    pub(crate) fn saved() -> SavedBaseline {
        let mut stock = Measured::default();
        stock.insert_count("sent", (1 << 53) + 1);
        stock.insert_real("delivered_pps", 0.1).unwrap();
        let mut backpressure = Measured::default();
        backpressure.insert_count("sent", 50_000);
        backpressure.insert_real("delivered_pps", 99_980.0).unwrap();
        SavedBaseline::new(
            "7.3.0-1-cloud-amd64".to_owned(),
            BTreeMap::from([
                ("stock".to_owned(), stock),
                ("fq_codel with backpressure".to_owned(), backpressure),
            ]),
        )
    }

    #[test]
    fn round_trip_keeps_counts_exact() {
        let baseline = saved();
        let text = baseline.to_json();
        let read = SavedBaseline::parse(&text, "base.json").unwrap();
        assert_eq!(read.kernel_release(), "7.3.0-1-cloud-amd64");
        assert_eq!(read.scenarios, baseline.scenarios);
        assert_eq!(
            read.scenarios["stock"].get("sent"),
            Some(MeasuredValue::Count((1 << 53) + 1))
        );
        assert_eq!(read.value("stock", "delivered_pps"), Ok(0.1));
        assert_eq!(
            read.value("fq_codel with backpressure", "sent"),
            Ok(50_000.0)
        );
        let json: serde_json::Value = serde_json::from_str(&text).unwrap();
        assert_eq!(json["format"], "tap-probe-check-baseline");
        assert_eq!(json["version"], 1);
        assert_eq!(
            json["scenarios"]["stock"]["sent"],
            9_007_199_254_740_993_u64
        );
    }

    /// Found by the fuzzer (`check_baseline`): an integer too large for a count is read as a
    /// real, which must read back from the file's own text as the same real, as every rate
    /// must: JSON's decimal digits rounded correctly, not nearly.
    #[test]
    fn reals_read_back_exactly() {
        let text = r#"{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "7.3",
            "scenarios": {"s": {"qdisc_drops": 111111110191111111111, "delivered_pps": 183512.5,
            "elapsed_secs": 0.30000000000000004}}}"#;
        let read = SavedBaseline::parse(text, "b.json").unwrap();
        assert_eq!(
            read.value("s", "qdisc_drops"),
            Ok(1.111_111_101_911_111_1e20)
        );
        let again = SavedBaseline::parse(&read.to_json(), "b.json").unwrap();
        assert_eq!(again, read);
    }

    #[test]
    fn missing_scenario_or_value_names_both() {
        let read = SavedBaseline::parse(&saved().to_json(), "base.json").unwrap();
        assert_eq!(
            read.value("renamed", "sent").unwrap_err().to_string(),
            "baseline base.json has no scenario \"renamed\" (it has \"fq_codel with \
             backpressure\", \"stock\"); save a baseline from a run of this spec with \
             --save-baseline, or fix the scenario's name"
        );
        assert_eq!(
            read.value("stock", "stuck").unwrap_err().to_string(),
            "baseline base.json has no `stuck` for scenario \"stock\"; the run that saved it \
             did not measure `stuck`: save the baseline again"
        );
        let empty = SavedBaseline::parse(
            r#"{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "x", "scenarios": {}}"#,
            "e.json",
        )
        .unwrap();
        assert!(
            empty
                .value("a", "b")
                .unwrap_err()
                .to_string()
                .contains("(it has none)")
        );
    }

    #[test]
    fn bad_files_say_what_to_do() {
        for (text, message) in [
            ("", "is not JSON"),
            ("[1, 2]", "is not a tap-probe check baseline"),
            (
                r#"{"format": "other", "version": 1}"#,
                "is not a tap-probe check baseline",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": 2}"#,
                "version 2, written by a newer tap-probe",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": 0}"#,
                "no valid \"version\"",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": "1"}"#,
                "no valid \"version\"",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "x"}"#,
                "is damaged",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "x", "scenarios": {"a": {"sent": "many"}}}"#,
                "is damaged",
            ),
            (
                r#"{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "x", "scenarios": {}, "extra": 1}"#,
                "is damaged",
            ),
        ] {
            let err = format!("{:#}", SavedBaseline::parse(text, "b.json").unwrap_err());
            assert!(err.contains(message), "{text}: {err}");
            assert!(err.contains("b.json"), "{text}: {err}");
        }
    }

    #[test]
    fn what_a_message_quotes_is_bounded() {
        // A baseline of many scenarios: ten are named, the others counted.
        let many: BTreeMap<String, Measured> = (0..10_000)
            .map(|i| (format!("scenario {i:05}"), Measured::default()))
            .collect();
        let err = SavedBaseline::new("7.3".to_owned(), many)
            .value("renamed", "sent")
            .unwrap_err()
            .to_string();
        assert!(
            err.contains("\"scenario 00009\", and 9990 more); save a baseline"),
            "{err}"
        );
        assert!(!err.contains("scenario 00010"), "{err}");
        // A name of a megabyte, asked for or found in the file, is cut.
        let long = "n".repeat(1_000_000);
        let err = saved().value(&long, &long).unwrap_err().to_string();
        assert!(
            err.len() < 1000 && err.contains("(1000000 characters)"),
            "{err}"
        );
        let err = saved().value("stock", &long).unwrap_err().to_string();
        assert!(
            err.len() < 1000 && err.contains("(1000000 characters)`"),
            "{err}"
        );
        let text = format!(
            r#"{{"format": "tap-probe-check-baseline", "version": 1, "kernel_release": "x",
            "scenarios": {{"s": {{"sent": "{long}"}}}}}}"#
        );
        let err = format!("{:#}", SavedBaseline::parse(&text, "b.json").unwrap_err());
        assert!(err.len() < 1000 && err.contains("is damaged"), "{err}");
        let err = format!("{:#}", SavedBaseline::parse(&long, "b.json").unwrap_err());
        assert!(err.len() < 1000 && err.contains("is not JSON"), "{err}");
    }
}
