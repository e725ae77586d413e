//! The scenario file of `tap-probe check`: TOML `[[scenario]]` tables, each a traffic run and
//! the expectations that must hold after it.
//!
//! ```toml
//! [[scenario]]
//! name = "fq_codel with backpressure"   # required, unique
//! qdisc = "fq-codel"          # required: noqueue | pfifo-fast | pfifo | fq-codel (or tc's
//!                             # pfifo_fast, fq_codel)
//! backpressure = true         # open the tap with IFF_BACKPRESSURE (default false)
//! tx_queue_len = 1000         # the tap's ring size, 1..=524288 (default 1000)
//! packets = 50000             # and/or duration = "10s" (10, 10s, 500ms, 2m); at least one
//! sender_threads = 1          # 1..=16 (default 1)
//! pps = 0                     # 0: as fast as possible (default)
//! reader = "read"             # read | vhost (default read)
//! reader_pps = 5000           # omit: as fast as it can
//! expect = ["dropped_full_ring == 0", "consumed + qdisc_drops == sent"]
//! ```
//!
//! Everything is checked before any traffic runs: the TOML, every key and range, every
//! expression's syntax and names, and that a baseline holds what `baseline.NAME` asks for.
//! All problems are reported at once, each saying which scenario (index and name), which
//! key, what is wrong, what would be right, and the TOML line.

mod checker;
mod source;
#[cfg(test)]
mod tests;

use std::collections::BTreeMap;
use std::fmt;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::baseline::SavedBaseline;
use super::expr::Expectation;
use checker::Checker;
use source::{Source, toml_error};
use tap_probe_common::echo::{MAX_CHARS, clipped, quoted};

/// The largest ring tun allocates on x86-64: `__ptr_ring_init_queue_alloc` refuses more
/// than `KMALLOC_MAX_SIZE / sizeof(void *)` entries (`include/linux/ptr_ring.h`), 4 MiB / 8.
/// Beyond it the kernel's resize fails, so a larger value is a mistake in the spec.
const MAX_TX_QUEUE_LEN: i64 = 524_288;
/// Runs are bounded in count and time; these bounds keep one scenario within a CI job.
const MAX_PACKETS: i64 = 100_000_000;
const MAX_DURATION: Duration = Duration::from_hours(1);
const MAX_SENDER_THREADS: i64 = 16;
/// One frame every 10 ns: beyond what a tap can take, so a larger rate is a typo.
const MAX_PPS: i64 = 100_000_000;
const DEFAULT_TX_QUEUE_LEN: u32 = 1000;

/// The largest spec read, in bytes: some 200,000 scenarios of the README's size, far beyond
/// [`MAX_SCENARIOS`]. A larger file (or a device that never ends, `/dev/zero`) is refused
/// before it is read.
pub const MAX_BYTES: u64 = 16 << 20;
/// The most scenarios one check runs. Each builds a namespace and a tap of its own and runs
/// its traffic, one after another: ten thousand take hours at the least.
pub const MAX_SCENARIOS: usize = 10_000;
/// The most problems a message shows in full; the others are counted, as compilers do.
pub const MAX_SHOWN: usize = 20;

pub use crate::traffic::{Qdisc, ReaderKind};

/// What traffic a scenario runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Traffic {
    pub qdisc: Qdisc,
    pub backpressure: bool,
    pub tx_queue_len: u32,
    /// Stop after this many packets (with `duration`: whichever comes first).
    pub packets: Option<u64>,
    /// Stop after this long (with `packets`: whichever comes first).
    #[serde(rename = "duration_secs", serialize_with = "secs")]
    pub duration: Option<Duration>,
    pub sender_threads: u32,
    /// `None`: as fast as possible (`pps = 0` in the file).
    pub pps: Option<u64>,
    pub reader: ReaderKind,
    /// `None`: the reader takes packets as fast as it can.
    pub reader_pps: Option<u64>,
}

#[expect(
    clippy::ref_option,
    reason = "the signature serde's `serialize_with` calls"
)]
fn secs<S: serde::Serializer>(d: &Option<Duration>, s: S) -> Result<S::Ok, S::Error> {
    d.map(|d| d.as_secs_f64()).serialize(s)
}

#[derive(Clone, Debug, PartialEq)]
pub struct Scenario {
    pub name: String,
    pub traffic: Traffic,
    /// Never empty.
    pub expect: Vec<Expectation>,
}

#[derive(Clone, Debug, PartialEq)]
pub struct Spec {
    /// Never empty; names are unique.
    pub scenarios: Vec<Scenario>,
}

impl Spec {
    /// Reads a spec and checks it completely: the expressions' names against `known` (the
    /// names a measurement provides, without `baseline.`), and every `baseline.NAME`
    /// against `baseline` (the file given with `--baseline`, if any).
    ///
    /// # Errors
    /// Every problem found; nothing has run yet, so the caller exits with 2.
    pub fn parse(
        text: &str,
        known: &[&str],
        baseline: Option<&SavedBaseline>,
    ) -> Result<Spec, SpecErrors> {
        let raw: RawSpec = toml::from_str(text)
            .map_err(|err| SpecErrors::one(toml_error(text, err.message(), err.span())))?;
        if raw.scenario.is_empty() {
            return Err(SpecErrors::one(SpecError::general(
                "the spec has no scenarios; add at least one `[[scenario]]` table, \
                 e.g.\n    [[scenario]]\n    name = \"stock tail-drop\"\n    \
                 qdisc = \"pfifo-fast\"\n    packets = 50000\n    \
                 expect = [\"consumed + dropped_full_ring == sent\"]"
                    .to_owned(),
            )));
        }
        if raw.scenario.len() > MAX_SCENARIOS {
            return Err(SpecErrors::one(SpecError::general(format!(
                "the spec has {} scenarios; one check runs at most {MAX_SCENARIOS} (each builds \
                 a namespace and a tap of its own and runs its traffic, one after another): \
                 split it into several specs",
                raw.scenario.len()
            ))));
        }
        let source = Source::new(text);
        let mut errors = SpecErrors::default();
        let mut scenarios = Vec::new();
        let mut first_with_name: BTreeMap<String, usize> = BTreeMap::new();
        for (i, raw) in raw.scenario.into_iter().enumerate() {
            let header = raw.span();
            let raw = raw.into_inner();
            let at = ScenarioRef {
                index: i + 1,
                name: raw.name.as_ref().map(|n| n.get_ref().clone()),
            };
            let mut check = Checker {
                source: &source,
                at: &at,
                header: header.clone(),
                errors: &mut errors,
            };
            let scenario = check.scenario(raw, known, baseline);
            if let Some(scenario) = scenario {
                if let Some(first) = first_with_name.get(&scenario.name) {
                    check.push(
                        Some("name"),
                        Some(header),
                        format!(
                            "the name is also scenario {first}'s; give each scenario its own \
                             name (names key the baseline and the JUnit test suites)"
                        ),
                        None,
                    );
                } else {
                    first_with_name.insert(scenario.name.clone(), i + 1);
                    scenarios.push(scenario);
                }
            }
        }
        if errors.total == 0 {
            Ok(Spec { scenarios })
        } else {
            Err(errors)
        }
    }
}

/// Which scenario a problem is in: 1-based, as the `[[scenario]]` tables are counted.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct ScenarioRef {
    pub(crate) index: usize,
    pub(crate) name: Option<String>,
}

impl fmt::Display for ScenarioRef {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "scenario {}", self.index)?;
        if let Some(name) = &self.name {
            write!(f, " ({})", quoted(name, MAX_CHARS))?;
        }
        Ok(())
    }
}

/// One problem with a spec.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct SpecError {
    pub(crate) scenario: Option<ScenarioRef>,
    pub(crate) key: Option<String>,
    /// 1-based line of the TOML file.
    pub(crate) line: Option<usize>,
    /// What is wrong and what would be right.
    pub(crate) message: String,
    /// Lines shown under the message: the TOML line, or the expression, with a caret.
    pub(crate) detail: Option<String>,
}

impl fmt::Display for SpecError {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        let mut context = Vec::new();
        if let Some(scenario) = &self.scenario {
            context.push(scenario.to_string());
        }
        if let Some(key) = &self.key {
            context.push(format!("key `{}`", clipped(key, MAX_CHARS)));
        }
        if let Some(line) = self.line {
            context.push(format!("line {line}"));
        }
        if !context.is_empty() {
            write!(f, "{}: ", context.join(", "))?;
        }
        f.write_str(&self.message)?;
        if let Some(detail) = &self.detail {
            write!(f, "\n{detail}")?;
        }
        Ok(())
    }
}

impl SpecError {
    /// A problem of the whole spec, in no scenario.
    fn general(message: String) -> Self {
        Self {
            scenario: None,
            key: None,
            line: None,
            message,
            detail: None,
        }
    }
}

/// The problems found in a spec, in file order: the first [`MAX_SHOWN`] in full, and how
/// many there are in all. Those beyond are only counted, so that neither the message nor the
/// memory grows with the spec.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub struct SpecErrors {
    pub(crate) shown: Vec<SpecError>,
    pub(crate) total: usize,
}

impl SpecErrors {
    fn one(error: SpecError) -> Self {
        Self {
            shown: vec![error],
            total: 1,
        }
    }

    /// Counts a problem, and keeps `error()` while fewer than [`MAX_SHOWN`] are kept.
    pub(crate) fn push(&mut self, error: impl FnOnce() -> SpecError) {
        if self.shown.len() < MAX_SHOWN {
            self.shown.push(error());
        }
        self.total += 1;
    }

    /// How many problems there are, shown or not.
    #[must_use]
    pub fn total(&self) -> usize {
        self.total
    }
}

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.shown.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{err}")?;
        }
        let more = self.total - self.shown.len();
        if more > 0 {
            write!(
                f,
                "\n... and {more} more problem{} ({} in all); fix these and check again",
                if more == 1 { "" } else { "s" },
                self.total
            )?;
        }
        Ok(())
    }
}

impl std::error::Error for SpecErrors {}

#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawSpec {
    #[serde(default)]
    scenario: Vec<Spanned<RawScenario>>,
}

/// Integers are read as TOML's own `i64` and range-checked here, so that a message can say
/// which range is right rather than "expected u32".
#[derive(Deserialize)]
#[serde(deny_unknown_fields)]
struct RawScenario {
    pub(super) name: Option<Spanned<String>>,
    pub(super) qdisc: Option<Spanned<Qdisc>>,
    pub(super) backpressure: Option<bool>,
    pub(super) tx_queue_len: Option<Spanned<i64>>,
    pub(super) packets: Option<Spanned<i64>>,
    pub(super) duration: Option<Spanned<DurationText>>,
    pub(super) sender_threads: Option<Spanned<i64>>,
    pub(super) pps: Option<Spanned<i64>>,
    pub(super) reader: Option<Spanned<ReaderKind>>,
    pub(super) reader_pps: Option<Spanned<i64>>,
    pub(super) expect: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A duration as written: a string (`"10s"`, `"500ms"`) or a bare number of seconds, both
/// parsed by [`tap_probe_common::duration`] as on the command line.
struct DurationText(pub(super) String);

impl<'de> Deserialize<'de> for DurationText {
    fn deserialize<D: serde::Deserializer<'de>>(d: D) -> Result<Self, D::Error> {
        struct Visitor;
        impl serde::de::Visitor<'_> for Visitor {
            type Value = DurationText;
            fn expecting(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
                f.write_str(
                    "seconds, or a string with a unit, e.g. duration = 10, \"10s\", \"500ms\", \
                     \"2m\"",
                )
            }
            fn visit_str<E: serde::de::Error>(self, v: &str) -> Result<DurationText, E> {
                Ok(DurationText(v.to_owned()))
            }
            fn visit_i64<E: serde::de::Error>(self, v: i64) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
            fn visit_f64<E: serde::de::Error>(self, v: f64) -> Result<DurationText, E> {
                Ok(DurationText(v.to_string()))
            }
        }
        d.deserialize_any(Visitor)
    }
}
