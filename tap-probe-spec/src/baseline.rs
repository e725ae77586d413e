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
use std::path::Path;

use anyhow::{Context, Result, bail};
use serde::{Deserialize, Serialize};

use crate::measured::{Measured, MeasuredValue};

const FORMAT: &str = "tap-probe-check-baseline";
const VERSION: u64 = 1;

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
        let value: serde_json::Value = serde_json::from_str(text)
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
            .with_context(|| format!("baseline {source} is damaged; {redo}"))?;
        Ok(Self {
            source: source.to_owned(),
            kernel_release: file.kernel_release,
            scenarios: file.scenarios,
        })
    }

    /// Reads `--baseline FILE`.
    ///
    /// # Errors
    /// When the file cannot be read or is not a baseline.
    pub fn read(path: &Path) -> Result<Self> {
        let text = std::fs::read_to_string(path).with_context(|| {
            format!(
                "cannot read baseline {}; pass a file written by `tap-probe check \
                 --save-baseline FILE`",
                path.display()
            )
        })?;
        Self::parse(&text, &path.display().to_string())
    }

    /// Writes `--save-baseline FILE`.
    ///
    /// # Errors
    /// When the file cannot be written.
    pub fn write(&self, path: &Path) -> Result<()> {
        std::fs::write(path, self.to_json())
            .with_context(|| format!("cannot write baseline {}", path.display()))
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
                has: self.scenarios.keys().cloned().collect(),
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
        has: Vec<String>,
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
            } => {
                write!(f, "baseline {source} has no scenario {scenario:?}")?;
                if has.is_empty() {
                    f.write_str(" (it has none)")?;
                } else {
                    let has: Vec<String> = has.iter().map(|s| format!("{s:?}")).collect();
                    write!(f, " (it has {})", has.join(", "))?;
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
            } => write!(
                f,
                "baseline {source} has no `{name}` for scenario {scenario:?}; the run that \
                 saved it did not measure `{name}`: save the baseline again"
            ),
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
        assert_eq!(read.value("s", "qdisc_drops"), Ok(1.111_111_101_911_111_1e20));
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
    fn files_are_written_and_read() {
        let dir = std::env::temp_dir().join(format!("check-baseline-{}", std::process::id()));
        std::fs::create_dir_all(&dir).unwrap();
        let path = dir.join("base.json");
        let baseline = saved();
        baseline.write(&path).unwrap();
        let read = SavedBaseline::read(&path).unwrap();
        assert_eq!(read.scenarios, baseline.scenarios);
        assert!(read.source.ends_with("base.json"));
        let err = format!(
            "{:#}",
            SavedBaseline::read(&dir.join("missing.json")).unwrap_err()
        );
        assert!(
            err.contains("missing.json") && err.contains("--save-baseline"),
            "{err}"
        );
        let err = format!(
            "{:#}",
            baseline.write(&dir.join("no/such/dir.json")).unwrap_err()
        );
        assert!(err.contains("cannot write baseline"), "{err}");
        std::fs::remove_dir_all(&dir).unwrap();
    }
}
