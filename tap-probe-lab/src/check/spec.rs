//! The scenario file of `tap-probe check`: TOML `[[scenario]]` tables, each a traffic run and
//! the expectations that must hold after it.
//!
//! ```toml
//! [[scenario]]
//! name = "fq_codel with backpressure"   # required, unique
//! qdisc = "fq-codel"          # required: noqueue | pfifo-fast | pfifo | fq-codel
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

use std::collections::BTreeMap;
use std::fmt;
use std::ops::Range;
use std::time::Duration;

use serde::{Deserialize, Serialize};
use toml::Spanned;

use super::baseline::SavedBaseline;
use super::expr::{Expectation, Name};

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

pub use crate::lab::load::Qdisc;
pub use crate::lab::load::ReaderKind as Reader;

/// What traffic a scenario runs.
#[derive(Clone, Debug, PartialEq, Eq, Serialize)]
pub struct Traffic {
    pub(crate) qdisc: Qdisc,
    pub(crate) backpressure: bool,
    pub(crate) tx_queue_len: u32,
    /// Stop after this many packets (with `duration`: whichever comes first).
    pub(crate) packets: Option<u64>,
    /// Stop after this long (with `packets`: whichever comes first).
    #[serde(rename = "duration_secs", serialize_with = "secs")]
    pub duration: Option<Duration>,
    pub(crate) sender_threads: u32,
    /// `None`: as fast as possible (`pps = 0` in the file).
    pub(crate) pps: Option<u64>,
    pub(crate) reader: Reader,
    /// `None`: the reader takes packets as fast as it can.
    pub(crate) reader_pps: Option<u64>,
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
    pub(crate) expect: Vec<Expectation>,
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
            .map_err(|err| SpecErrors(vec![toml_error(text, err.message(), err.span())]))?;
        if raw.scenario.is_empty() {
            return Err(SpecErrors(vec![SpecError {
                scenario: None,
                key: None,
                line: None,
                message: "the spec has no scenarios; add at least one `[[scenario]]` table, \
                          e.g.\n    [[scenario]]\n    name = \"stock tail-drop\"\n    \
                          qdisc = \"pfifo-fast\"\n    packets = 50000\n    \
                          expect = [\"consumed + dropped_full_ring == sent\"]"
                    .to_owned(),
                detail: None,
            }]));
        }
        let mut errors = Vec::new();
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
                text,
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
        if errors.is_empty() {
            Ok(Spec { scenarios })
        } else {
            Err(SpecErrors(errors))
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
            write!(f, " ({name:?})")?;
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
            context.push(format!("key `{key}`"));
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

/// Every problem found in a spec, in file order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct SpecErrors(pub(crate) Vec<SpecError>);

impl fmt::Display for SpecErrors {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        for (i, err) in self.0.iter().enumerate() {
            if i > 0 {
                f.write_str("\n")?;
            }
            write!(f, "{err}")?;
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
    name: Option<Spanned<String>>,
    qdisc: Option<Spanned<Qdisc>>,
    backpressure: Option<bool>,
    tx_queue_len: Option<Spanned<i64>>,
    packets: Option<Spanned<i64>>,
    duration: Option<Spanned<DurationText>>,
    sender_threads: Option<Spanned<i64>>,
    pps: Option<Spanned<i64>>,
    reader: Option<Spanned<Reader>>,
    reader_pps: Option<Spanned<i64>>,
    expect: Option<Spanned<Vec<Spanned<String>>>>,
}

/// A duration as written: a string (`"10s"`, `"500ms"`) or a bare number of seconds, both
/// parsed by [`tap_probe_common::duration`] as on the command line.
struct DurationText(String);

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

/// Validates one raw scenario, pushing every problem; `None` when there was one.
struct Checker<'a> {
    text: &'a str,
    at: &'a ScenarioRef,
    /// The `[[scenario]]` header: where a missing key is reported.
    header: Range<usize>,
    errors: &'a mut Vec<SpecError>,
}

impl Checker<'_> {
    fn push(
        &mut self,
        key: Option<&str>,
        span: Option<Range<usize>>,
        message: String,
        detail: Option<String>,
    ) {
        let line = span.as_ref().map(|s| line_of(self.text, s.start));
        let detail = detail.or_else(|| span.map(|s| snippet(self.text, &s)));
        self.errors.push(SpecError {
            scenario: Some(self.at.clone()),
            key: key.map(str::to_owned),
            line,
            message,
            detail,
        });
    }

    fn missing(&mut self, key: &str, message: &str) {
        self.push(
            Some(key),
            Some(self.header.clone()),
            format!("missing key `{key}`: {message}"),
            None,
        );
    }

    /// The integer if it is given and in `range`; a value out of range is a problem that
    /// says so with `why`.
    fn int(
        &mut self,
        key: &str,
        value: Option<Spanned<i64>>,
        range: std::ops::RangeInclusive<i64>,
        why: &str,
    ) -> Option<u64> {
        let value = value?;
        let v = *value.get_ref();
        if range.contains(&v) {
            // Every range here lies within 0..=i64::MAX, so the conversion holds.
            u64::try_from(v).ok()
        } else {
            self.push(
                Some(key),
                Some(value.span()),
                format!(
                    "{v} is out of range: use {}..={} ({why})",
                    range.start(),
                    range.end()
                ),
                None,
            );
            None
        }
    }

    fn scenario(
        &mut self,
        raw: RawScenario,
        known: &[&str],
        baseline: Option<&SavedBaseline>,
    ) -> Option<Scenario> {
        let before = self.errors.len();
        let stop_present = raw.packets.is_some() || raw.duration.is_some();
        let name = self.name(raw.name);
        let qdisc = raw.qdisc.map(Spanned::into_inner);
        if qdisc.is_none() {
            self.missing(
                "qdisc",
                "the tap's root qdisc, one of \"noqueue\", \"pfifo-fast\", \"pfifo\", \"fq-codel\"",
            );
        }
        let tx_queue_len = self.int(
            "tx_queue_len",
            raw.tx_queue_len,
            1..=MAX_TX_QUEUE_LEN,
            &format!(
                "the tap's ring holds tx_queue_len packets; 0 would hold none, and the kernel \
                 allocates no ring larger than {MAX_TX_QUEUE_LEN}"
            ),
        );
        let packets = self.int(
            "packets",
            raw.packets,
            1..=MAX_PACKETS,
            "packets to send; use `duration` for longer runs",
        );
        let duration = raw.duration.and_then(|d| {
            let span = d.span();
            match parse_duration(&d.get_ref().0) {
                Ok(d) => Some(d),
                Err(message) => {
                    self.push(Some("duration"), Some(span), message, None);
                    None
                }
            }
        });
        if !stop_present {
            self.missing(
                "packets",
                "say when to stop sending with `packets` (e.g. packets = 50000), \
                 `duration` (e.g. duration = \"10s\"), or both",
            );
        }
        let sender_threads = self.int(
            "sender_threads",
            raw.sender_threads,
            1..=MAX_SENDER_THREADS,
            "threads sending at once",
        );
        let pps = self.int(
            "pps",
            raw.pps,
            0..=MAX_PPS,
            "packets per second to send; 0 sends as fast as possible",
        );
        let reader_pps = self.int(
            "reader_pps",
            raw.reader_pps,
            1..=MAX_PPS,
            "packets per second the reader takes; omit the key for a reader as fast as it can",
        );
        let expect = self.expectations(raw.expect, known, baseline, name.as_deref());
        // From here on, an absent value is one the file left out: a bad one was reported.
        if self.errors.len() > before {
            return None;
        }
        Some(Scenario {
            name: name?,
            traffic: Traffic {
                qdisc: qdisc?,
                backpressure: raw.backpressure.unwrap_or(false),
                tx_queue_len: tx_queue_len
                    .map_or(Some(DEFAULT_TX_QUEUE_LEN), |v| u32::try_from(v).ok())?,
                packets,
                duration,
                sender_threads: sender_threads.map_or(Some(1), |v| u32::try_from(v).ok())?,
                pps: pps.filter(|&v| v > 0),
                reader: raw.reader.map_or(Reader::Read, Spanned::into_inner),
                reader_pps,
            },
            expect,
        })
    }

    fn name(&mut self, name: Option<Spanned<String>>) -> Option<String> {
        let Some(name) = name else {
            self.missing(
                "name",
                "every scenario needs a unique name, e.g. name = \"fq_codel with backpressure\"",
            );
            return None;
        };
        let span = name.span();
        let name = name.into_inner();
        let problem = if name.trim().is_empty() {
            Some("the name is empty; give the scenario a name that says what it runs")
        } else if name.chars().any(char::is_control) {
            Some("the name has control characters; use one line of printable text")
        } else if name.chars().count() > 200 {
            Some("the name is longer than 200 characters; shorten it")
        } else if name != name.trim() {
            Some("the name starts or ends with white space; remove it")
        } else {
            None
        };
        if let Some(problem) = problem {
            self.push(Some("name"), Some(span), problem.to_owned(), None);
            return None;
        }
        Some(name)
    }

    fn expectations(
        &mut self,
        expect: Option<Spanned<Vec<Spanned<String>>>>,
        known: &[&str],
        baseline: Option<&SavedBaseline>,
        scenario: Option<&str>,
    ) -> Vec<Expectation> {
        let Some(expect) = expect else {
            self.missing(
                "expect",
                "list what must hold after the traffic, e.g. \
                 expect = [\"dropped_full_ring == 0\"]",
            );
            return Vec::new();
        };
        if expect.get_ref().is_empty() {
            self.push(
                Some("expect"),
                Some(expect.span()),
                "the list is empty; a scenario without expectations checks nothing, add one \
                 such as \"dropped_full_ring == 0\""
                    .to_owned(),
                None,
            );
            return Vec::new();
        }
        let mut out = Vec::new();
        for (i, entry) in expect.into_inner().into_iter().enumerate() {
            let key = format!("expect[{i}]");
            let span = entry.span();
            let parsed = match Expectation::parse(entry.get_ref()) {
                Ok(parsed) => parsed,
                Err(err) => {
                    let detail = err.to_string();
                    // The message's first line is the error, the rest the caret lines.
                    let (message, carets) = detail.split_once('\n').unwrap_or((&detail, ""));
                    self.push(
                        Some(&key),
                        Some(span),
                        message.to_owned(),
                        Some(carets.to_owned()),
                    );
                    continue;
                }
            };
            if let Err(unknown) = parsed.check_names(known) {
                let mut message = unknown.to_string();
                if unknown.0.iter().any(|u| u.suggestion.is_none()) {
                    message.push_str("; the known names are ");
                    message.push_str(&known.join(", "));
                }
                self.push(Some(&key), Some(span), message, None);
                continue;
            }
            if let Err(message) = check_baseline(&parsed, baseline, scenario) {
                self.push(Some(&key), Some(span), message, None);
                continue;
            }
            out.push(parsed);
        }
        out
    }
}

/// Every `baseline.NAME` of `expectation` must be in the baseline's record of `scenario`.
fn check_baseline(
    expectation: &Expectation,
    baseline: Option<&SavedBaseline>,
    scenario: Option<&str>,
) -> Result<(), String> {
    for name in expectation.names() {
        let Name::Baseline(base) = name else {
            continue;
        };
        let Some(baseline) = baseline else {
            return Err(format!(
                "`{name}` needs a baseline: pass --baseline FILE, a file written by an earlier \
                 `tap-probe check --save-baseline FILE`"
            ));
        };
        // Without a valid name the scenario has a problem reported already.
        if let Some(scenario) = scenario {
            baseline.value(scenario, base).map_err(|e| e.to_string())?;
        }
    }
    Ok(())
}

/// A scenario's duration ([`tap_probe_common::duration`]): more than 0, at most an hour, in whole
/// milliseconds (the sender's clock).
fn parse_duration(text: &str) -> Result<Duration, String> {
    let duration = tap_probe_common::duration::within(text, &(Duration::ZERO..=MAX_DURATION))
        .map_err(|err| {
            if err.contains("longer than") {
                format!("{err}; split longer runs into several scenarios")
            } else {
                err
            }
        })?;
    if duration.is_zero() || !duration.as_nanos().is_multiple_of(1_000_000) {
        return Err(format!(
            "{text:?} is not a whole number of milliseconds above 0; use e.g. \"1ms\" or more"
        ));
    }
    Ok(duration)
}

/// A problem the TOML reader found (syntax, unknown key, wrong type), with its scenario
/// and key worked out from where it is.
fn toml_error(text: &str, message: &str, span: Option<Range<usize>>) -> SpecError {
    let Some(span) = span else {
        return SpecError {
            scenario: None,
            key: None,
            line: None,
            message: message.to_owned(),
            detail: None,
        };
    };
    SpecError {
        scenario: scenario_at(text, span.start),
        key: key_at(text, &span),
        line: Some(line_of(text, span.start)),
        message: message.trim_end().to_owned(),
        detail: Some(snippet(text, &span)),
    }
}

/// The scenario whose table holds byte `offset`: the last `[[scenario]]` before it. Names
/// come from a lenient second reading, which works whenever the TOML itself is valid.
fn scenario_at(text: &str, offset: usize) -> Option<ScenarioRef> {
    #[derive(Deserialize)]
    struct Lenient {
        #[serde(default)]
        scenario: Vec<Spanned<LenientScenario>>,
    }
    #[derive(Deserialize)]
    struct LenientScenario {
        name: Option<String>,
    }
    let starts: Vec<(usize, Option<String>)> = match toml::from_str::<Lenient>(text) {
        Ok(lenient) => lenient
            .scenario
            .into_iter()
            .map(|s| (s.span().start, s.into_inner().name))
            .collect(),
        // Invalid TOML: count the headers by their text.
        Err(_) => line_starts(text)
            .filter(|&(_, line)| {
                let line = line.split('#').next().unwrap_or("");
                line.chars()
                    .filter(|c| !c.is_whitespace())
                    .collect::<String>()
                    == "[[scenario]]"
            })
            .map(|(start, _)| (start, None))
            .collect(),
    };
    let index = starts.iter().rposition(|(start, _)| *start <= offset)?;
    Some(ScenarioRef {
        index: index + 1,
        name: starts[index].1.clone(),
    })
}

/// The key a TOML error is about: the span itself when it is a key (an unknown or
/// duplicate key), else the nearest `key =` before the span, on its line or on the lines
/// of the array it is in.
fn key_at(text: &str, span: &Range<usize>) -> Option<String> {
    let spanned = text.get(span.clone())?;
    let after = text.get(span.end..)?.trim_start_matches([' ', '\t']);
    if is_bare_key(spanned) && after.starts_with('=') {
        return Some(spanned.to_owned());
    }
    let lines: Vec<(usize, &str)> = line_starts(text)
        .take_while(|(start, _)| *start <= span.start)
        .collect();
    for (i, (start, line)) in lines.iter().enumerate().rev() {
        let part = if i + 1 == lines.len() {
            line.get(..span.start - start)?
        } else {
            line
        };
        if let Some(key) = key_before(part) {
            return Some(key);
        }
        // A table header ends the search: the key would be another table's.
        if part.trim_start().starts_with('[') {
            return None;
        }
    }
    None
}

/// The last `key =` in `part`; an `=` inside a string (`"a == b"`) has no bare key
/// before it and is passed over.
fn key_before(part: &str) -> Option<String> {
    part.match_indices('=').rev().find_map(|(eq, _)| {
        let before = &part[..eq];
        let key = before
            .rfind(['{', ',', '['])
            .map_or(before, |d| &before[d + 1..])
            .trim();
        let key = key
            .strip_prefix('"')
            .and_then(|k| k.strip_suffix('"'))
            .unwrap_or(key);
        is_bare_key(key).then(|| key.to_owned())
    })
}

fn is_bare_key(s: &str) -> bool {
    !s.is_empty()
        && s.chars()
            .all(|c| c.is_ascii_alphanumeric() || c == '_' || c == '-')
}

/// Byte offset and text of every line.
fn line_starts(text: &str) -> impl Iterator<Item = (usize, &str)> {
    text.split('\n').scan(0, |start, line| {
        let this = *start;
        *start += line.len() + 1;
        Some((this, line.strip_suffix('\r').unwrap_or(line)))
    })
}

/// The 1-based line of byte `offset`.
fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .split(|&b| b == b'\n')
        .count()
}

/// The line holding `span` with a caret line under it (up to its end of line). Control
/// characters show as spaces so that the carets stay under their columns.
fn snippet(text: &str, span: &Range<usize>) -> String {
    let Some((line_start, line)) = line_starts(text)
        .take_while(|(start, _)| *start <= span.start)
        .last()
    else {
        return String::new();
    };
    let number = line_of(text, span.start).to_string();
    let column = text
        .get(line_start..span.start)
        .map_or(0, |s| s.chars().count());
    let width = text
        .get(span.start..span.end.min(line_start + line.len()).max(span.start))
        .map_or(0, |s| s.chars().count())
        .max(1);
    let shown: String = line
        .chars()
        .map(|c| if c.is_control() { ' ' } else { c })
        .collect();
    format!(
        "    {number} | {}\n    {} | {}{}",
        shown.trim_end(),
        " ".repeat(number.len()),
        " ".repeat(column),
        "^".repeat(width)
    )
}

#[cfg(test)]
mod tests {
    use proptest::prelude::*;

    use super::*;
    use crate::check::report::{CheckReport, Measured, ScenarioReport};

    const KNOWN: &[&str] = &[
        "sent",
        "consumed",
        "dropped_full_ring",
        "qdisc_drops",
        "delivered_pps",
        "stuck",
    ];

    const GOOD: &str = r#"
# Stock behaviour first.
[[scenario]]
name = "stock"
qdisc = "pfifo-fast"
packets = 50000
expect = ["consumed + dropped_full_ring == sent"]

[[scenario]]
name = "fq_codel with backpressure"
qdisc = "fq-codel"          # noqueue | pfifo-fast | pfifo | fq-codel
backpressure = true         # open the tap with IFF_BACKPRESSURE
tx_queue_len = 256
packets = 50000             # and/or duration = "10s"
duration = "1.5s"
sender_threads = 2
pps = 200000
reader = "vhost"
reader_pps = 5000
expect = ["dropped_full_ring == 0", "consumed + qdisc_drops == sent", "stuck == 0"]
"#;

    fn parse(text: &str) -> Result<Spec, SpecErrors> {
        Spec::parse(text, KNOWN, None)
    }

    fn errors(text: &str) -> Vec<SpecError> {
        match parse(text) {
            Ok(spec) => panic!("parsed: {spec:?}"),
            Err(SpecErrors(errors)) => errors,
        }
    }

    fn only_error(text: &str) -> SpecError {
        let mut errors = errors(text);
        assert_eq!(errors.len(), 1, "{errors:#?}");
        errors.remove(0)
    }

    /// One scenario with `line` added to the keys every scenario needs.
    fn with(line: &str) -> String {
        format!(
            "[[scenario]]\nname = \"s\"\nqdisc = \"pfifo\"\npackets = 10\nexpect = [\"sent == 10\"]\n{line}\n"
        )
    }

    #[test]
    fn reads_every_key_and_defaults() {
        let spec = parse(GOOD).unwrap();
        assert_eq!(spec.scenarios.len(), 2);
        let stock = &spec.scenarios[0];
        assert_eq!(stock.name, "stock");
        assert_eq!(
            stock.traffic,
            Traffic {
                qdisc: Qdisc::PfifoFast,
                backpressure: false,
                tx_queue_len: 1000,
                packets: Some(50_000),
                duration: None,
                sender_threads: 1,
                pps: None,
                reader: Reader::Read,
                reader_pps: None,
            }
        );
        assert_eq!(stock.expect.len(), 1);
        let fq = &spec.scenarios[1];
        assert_eq!(
            fq.traffic,
            Traffic {
                qdisc: Qdisc::FqCodel,
                backpressure: true,
                tx_queue_len: 256,
                packets: Some(50_000),
                duration: Some(Duration::from_millis(1500)),
                sender_threads: 2,
                pps: Some(200_000),
                reader: Reader::Vhost,
                reader_pps: Some(5000),
            }
        );
        let texts: Vec<&str> = fq.expect.iter().map(Expectation::text).collect();
        assert_eq!(
            texts,
            [
                "dropped_full_ring == 0",
                "consumed + qdisc_drops == sent",
                "stuck == 0"
            ]
        );
    }

    #[test]
    fn every_qdisc_and_reader_spelling() {
        for (text, qdisc) in [
            ("noqueue", Qdisc::Noqueue),
            ("pfifo-fast", Qdisc::PfifoFast),
            ("pfifo", Qdisc::Pfifo),
            ("fq-codel", Qdisc::FqCodel),
        ] {
            let spec = parse(&with("").replace("\"pfifo\"", &format!("{text:?}"))).unwrap();
            assert_eq!(spec.scenarios[0].traffic.qdisc, qdisc);
        }
        let spec = parse(&with("reader = \"read\"")).unwrap();
        assert_eq!(spec.scenarios[0].traffic.reader, Reader::Read);
    }

    #[test]
    fn duration_alone_is_enough() {
        let text = "[[scenario]]\nname = \"d\"\nqdisc = \"noqueue\"\nduration = \"2m\"\nexpect = [\"sent > 0\"]\n";
        let t = &parse(text).unwrap().scenarios[0].traffic;
        assert_eq!(t.packets, None);
        assert_eq!(t.duration, Some(Duration::from_mins(2)));
    }

    #[test]
    fn durations() {
        for (text, ms) in [
            ("10s", 10_000),
            ("500ms", 500),
            ("2m", 120_000),
            ("1h", 3_600_000),
            ("1.5s", 1500),
            ("0.001s", 1),
            (" 3s ", 3000),
            ("60m", 3_600_000),
            ("10", 10_000),
            ("2.5", 2_500),
        ] {
            assert_eq!(
                parse_duration(text),
                Ok(Duration::from_millis(ms)),
                "{text}"
            );
        }
        for (text, message) in [
            ("s", "not a duration"),
            ("10 s", "not a duration"),
            ("10sec", "not a duration"),
            ("1.s", "not a duration"),
            (".5s", "not a duration"),
            ("1.2.3s", "not a duration"),
            ("-1s", "not a duration"),
            ("", "not a duration"),
            ("99999999999999999999s", "not a duration"),
            ("0s", "above 0"),
            ("0.0001s", "whole number of milliseconds"),
            ("61m", "longer than 1h"),
            ("1.001h", "longer than 1h; split longer runs"),
        ] {
            let err = parse_duration(text).unwrap_err();
            assert!(err.contains(message), "{text}: {err}");
        }
        for (toml, ms) in [("duration = 10", 10_000), ("duration = 2.5", 2_500)] {
            let text = format!(
                "[[scenario]]\nname = \"d\"\nqdisc = \"noqueue\"\n{toml}\nexpect = [\"sent > 0\"]\n"
            );
            let t = &parse(&text).unwrap().scenarios[0].traffic;
            assert_eq!(t.duration, Some(Duration::from_millis(ms)), "{toml}");
        }
        let err = only_error(&with("duration = -1"));
        assert_eq!(err.key.as_deref(), Some("duration"));
        assert!(err.message.contains("not a duration"), "{err}");
        let err = only_error(&with("duration = true"));
        assert!(err.message.contains("a string with a unit"), "{err}");
        let err = only_error(&with("duration = \"61m\""));
        assert_eq!(err.line, Some(6));
    }

    #[test]
    fn unknown_keys_are_named_with_the_right_ones() {
        let text = GOOD.replace("reader_pps = 5000", "reader_pps = 5000\nqueue_len = 5");
        let err = only_error(&text);
        assert_eq!(
            err.scenario,
            Some(ScenarioRef {
                index: 2,
                name: Some("fq_codel with backpressure".to_owned())
            })
        );
        assert_eq!(err.key.as_deref(), Some("queue_len"));
        assert_eq!(err.line, Some(20));
        assert!(err.message.contains("unknown field `queue_len`"), "{err}");
        assert!(err.message.contains("`tx_queue_len`"), "{err}");
        assert_eq!(
            err.to_string(),
            "scenario 2 (\"fq_codel with backpressure\"), key `queue_len`, line 20: unknown \
             field `queue_len`, expected one of `name`, `qdisc`, `backpressure`, \
             `tx_queue_len`, `packets`, `duration`, `sender_threads`, `pps`, `reader`, \
             `reader_pps`, `expect`\n    20 | queue_len = 5\n       | ^^^^^^^^^"
        );
        let err = only_error("[[scenarios]]\nname = \"x\"\n");
        assert!(err.message.contains("expected `scenario`"), "{err}");
        assert_eq!(err.scenario, None);
        let err = only_error("title = \"x\"\n[[scenario]]\nname = \"x\"\n");
        assert_eq!(err.key.as_deref(), Some("title"));
        assert_eq!(err.scenario, None);
    }

    #[test]
    fn wrong_types_name_the_key() {
        let err = only_error(&with("").replace("\"pfifo\"", "\"htb\""));
        assert_eq!(err.key.as_deref(), Some("qdisc"));
        assert!(
            err.message.contains(
                "unknown variant `htb`, expected one of `noqueue`, `pfifo-fast`, `pfifo`, `fq-codel`"
            ),
            "{err}"
        );
        assert_eq!(err.scenario.unwrap().name.as_deref(), Some("s"));
        let err = only_error(&with("backpressure = \"yes\""));
        assert_eq!(err.key.as_deref(), Some("backpressure"));
        assert!(err.message.contains("expected a boolean"), "{err}");
        let err = only_error(&with("reader = \"qemu\""));
        assert!(err.message.contains("expected `read` or `vhost`"), "{err}");
        let err = only_error(&with("").replace("[\"sent == 10\"]", "\"sent == 10\""));
        assert_eq!(err.key.as_deref(), Some("expect"));
        assert!(err.message.contains("expected a sequence"), "{err}");
    }

    #[test]
    fn keys_are_found_in_arrays_and_inline_tables() {
        let err = only_error(
            "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\nexpect = [\n  \"a == b\",\n  3,\n]\n",
        );
        assert_eq!(err.key.as_deref(), Some("expect"), "{err}");
        assert_eq!(err.line, Some(7));
        let err = only_error("scenario = [{name = \"a\", foo = 1}]\n");
        assert_eq!(err.key.as_deref(), Some("foo"), "{err}");
        assert_eq!(err.scenario.map(|s| s.index), Some(1));
        let err = only_error("scenario = [{name = \"a\", packets = \"x\"}]\n");
        assert_eq!(err.key.as_deref(), Some("packets"), "{err}");
        let err = only_error("[[scenario]]\nname = \"a\"\n[scenario.x]\n");
        assert_eq!(err.key, None, "{err}");
        assert!(err.message.contains("unknown field `x`"), "{err}");
    }

    #[test]
    fn toml_syntax_errors_give_the_line() {
        let err = only_error("[[scenario]]\nname = \"a\"\n\n[[scenario]]\nname = \"b\nqdisc = 1\n");
        assert_eq!(err.line, Some(5));
        assert_eq!(err.scenario.map(|s| s.index), Some(2));
        let err = only_error("[[scenario]]\nname = \"a\"\nname = \"b\"\n");
        assert!(err.message.contains("duplicate key"), "{err}");
        assert_eq!(err.line, Some(3));
    }

    #[test]
    fn ranges_are_checked_with_the_right_range() {
        for (line, key, message) in [
            (
                "tx_queue_len = 0",
                "tx_queue_len",
                "0 is out of range: use 1..=524288",
            ),
            ("tx_queue_len = 524289", "tx_queue_len", "use 1..=524288"),
            ("tx_queue_len = -1", "tx_queue_len", "-1 is out of range"),
            ("sender_threads = 0", "sender_threads", "use 1..=16"),
            ("sender_threads = 17", "sender_threads", "use 1..=16"),
            ("pps = -5", "pps", "use 0..=100000000"),
            ("pps = 100000001", "pps", "use 0..=100000000"),
            (
                "reader_pps = 0",
                "reader_pps",
                "omit the key for a reader as fast as it can",
            ),
        ] {
            let err = only_error(&with(line));
            assert_eq!(err.key.as_deref(), Some(key), "{line}: {err}");
            assert!(err.message.contains(message), "{line}: {err}");
            assert_eq!(err.line, Some(6), "{line}");
            assert!(err.detail.unwrap().contains(line), "{line}");
        }
        let err = only_error(&with("").replace("packets = 10", "packets = 100000001"));
        assert!(err.message.contains("use 1..=100000000"), "{err}");
        let err = only_error(&with("").replace("packets = 10", "packets = 0"));
        assert!(err.message.contains("0 is out of range"), "{err}");
        let spec = parse(&with("tx_queue_len = 524288\nsender_threads = 16\npps = 0")).unwrap();
        let t = &spec.scenarios[0].traffic;
        assert_eq!(
            (t.tx_queue_len, t.sender_threads, t.pps),
            (524_288, 16, None)
        );
    }

    #[test]
    fn missing_keys_point_at_the_scenario() {
        let text = "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\nexpect = [\"sent == 1\"]\n\n[[scenario]]\nexpect = []\n";
        let errors = errors(text);
        let described: Vec<(Option<&str>, Option<usize>)> =
            errors.iter().map(|e| (e.key.as_deref(), e.line)).collect();
        assert_eq!(
            described,
            [
                (Some("name"), Some(7)),
                (Some("qdisc"), Some(7)),
                (Some("packets"), Some(7)),
                (Some("expect"), Some(8)),
            ]
        );
        assert!(errors.iter().all(|e| e.scenario
            == Some(ScenarioRef {
                index: 2,
                name: None
            })));
        assert!(errors[2].message.contains("duration"), "{}", errors[2]);
        assert!(
            errors[3].message.contains("the list is empty"),
            "{}",
            errors[3]
        );
        let err = only_error("[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 1\n");
        assert!(err.message.contains("missing key `expect`"), "{err}");
    }

    #[test]
    fn no_scenarios_is_an_error() {
        for text in ["", "# nothing\n", "scenario = []\n"] {
            let err = only_error(text);
            assert!(err.message.contains("no scenarios"), "{err}");
        }
    }

    #[test]
    fn names_are_unique_and_printable() {
        let first = GOOD.split("[[scenario]]").nth(1).unwrap();
        let err = only_error(&format!("{GOOD}[[scenario]]{first}"));
        assert!(err.message.contains("also scenario 1's"), "{err}");
        assert_eq!(err.key.as_deref(), Some("name"));
        assert_eq!(
            err.scenario,
            Some(ScenarioRef {
                index: 3,
                name: Some("stock".to_owned())
            })
        );
        for (name, message) in [
            ("", "empty"),
            ("  ", "empty"),
            ("a\\u0007b", "control characters"),
            (" a", "white space"),
        ] {
            let err = only_error(&with("").replace("name = \"s\"", &format!("name = \"{name}\"")));
            assert!(err.message.contains(message), "{name}: {err}");
        }
        let long = "x".repeat(201);
        let err = only_error(&with("").replace("name = \"s\"", &format!("name = \"{long}\"")));
        assert!(err.message.contains("longer than 200"), "{err}");
    }

    #[test]
    fn expression_errors_show_the_column() {
        let err = only_error(
            &with("").replace("\"sent == 10\"", "\"sent == 10\", \"consumed + == sent\""),
        );
        assert_eq!(err.key.as_deref(), Some("expect[1]"));
        assert_eq!(err.line, Some(5));
        assert_eq!(
            err.to_string(),
            "scenario 1 (\"s\"), key `expect[1]`, line 5: expected a number, a name or `(`, \
             found `==` at column 12\n    consumed + == sent\n               ^^"
        );
    }

    #[test]
    fn unknown_names_are_found_before_traffic() {
        let err = only_error(&with("").replace("sent == 10", "droped_full_ring == 0"));
        assert_eq!(err.key.as_deref(), Some("expect[0]"));
        assert_eq!(
            err.message,
            "unknown name `droped_full_ring` (did you mean `dropped_full_ring`?)"
        );
        let err = only_error(&with("").replace("sent == 10", "bogus == 0"));
        assert!(
            err.message.ends_with(
                "the known names are sent, consumed, dropped_full_ring, \
                                   qdisc_drops, delivered_pps, stuck"
            ),
            "{err}"
        );
        // The known names are the caller's.
        let text = with("").replace("sent == 10", "bogus == 0");
        assert!(Spec::parse(&text, &["bogus"], None).is_ok());
    }

    #[test]
    fn all_problems_are_reported_at_once() {
        let text = "[[scenario]]\nname = \"a\"\nqdisc = \"pfifo\"\npackets = 0\nsender_threads = 99\nexpect = [\"sent ==\", \"nope == 1\", \"sent == 1\"]\n\n[[scenario]]\nname = \"b\"\nqdisc = \"noqueue\"\nduration = -5\nexpect = [\"sent > 0\"]\n";
        let keys: Vec<String> = errors(text)
            .iter()
            .map(|e| {
                format!(
                    "{}:{}",
                    e.scenario.as_ref().unwrap().index,
                    e.key.clone().unwrap()
                )
            })
            .collect();
        assert_eq!(
            keys,
            [
                "1:packets",
                "1:sender_threads",
                "1:expect[0]",
                "1:expect[1]",
                "2:duration"
            ]
        );
    }

    fn baseline_with(scenario: &str, pairs: &[(&str, u64)]) -> SavedBaseline {
        let text = with("").replace("name = \"s\"", &format!("name = {scenario:?}"));
        let spec = parse(&text).unwrap();
        let mut measured = Measured::default();
        for (k, v) in pairs {
            measured.insert_count(k, *v);
        }
        let report = CheckReport {
            kernel_release: "7.3.0".to_owned(),
            scenarios: vec![ScenarioReport::judged(
                &spec.scenarios[0],
                measured,
                None,
                0.0,
            )],
        };
        SavedBaseline::parse(&SavedBaseline::from_report(&report).to_json(), "base.json").unwrap()
    }

    #[test]
    fn baseline_names_need_a_baseline_that_has_them() {
        let text = with("").replace(
            "sent == 10",
            "delivered_pps >= 0.95 * baseline.delivered_pps",
        );
        let err = only_error(&text);
        assert!(
            err.message
                .contains("`baseline.delivered_pps` needs a baseline: pass --baseline FILE"),
            "{err}"
        );
        let good = baseline_with("s", &[("delivered_pps", 1000)]);
        assert!(Spec::parse(&text, KNOWN, Some(&good)).is_ok());
        let other_scenario = baseline_with("t", &[("delivered_pps", 1000)]);
        let err = Spec::parse(&text, KNOWN, Some(&other_scenario))
            .unwrap_err()
            .0
            .remove(0);
        assert!(err.message.contains("base.json"), "{err}");
        assert!(err.message.contains("\"s\""), "{err}");
        let other_name = baseline_with("s", &[("sent", 1)]);
        let err = Spec::parse(&text, KNOWN, Some(&other_name))
            .unwrap_err()
            .0
            .remove(0);
        assert!(err.message.contains("delivered_pps"), "{err}");
        assert!(err.message.contains("\"s\""), "{err}");
        // An unknown name after `baseline.` is reported as unknown, baseline or not.
        let text = with("").replace("sent == 10", "sent >= baseline.sentt");
        let err = Spec::parse(&text, KNOWN, Some(&good))
            .unwrap_err()
            .0
            .remove(0);
        assert!(
            err.message.contains("did you mean `baseline.sent`?"),
            "{err}"
        );
    }

    #[test]
    fn traffic_serializes_for_the_report() {
        let spec = parse(GOOD).unwrap();
        let json = serde_json::to_value(&spec.scenarios[1].traffic).unwrap();
        assert_eq!(
            json,
            serde_json::json!({
                "qdisc": "fq-codel", "backpressure": true, "tx_queue_len": 256,
                "packets": 50000, "duration_secs": 1.5, "sender_threads": 2, "pps": 200_000,
                "reader": "vhost", "reader_pps": 5000
            })
        );
    }

    proptest! {
        #[test]
        fn never_panics_on_any_text(text in ".{0,300}") {
            let _ = parse(&text).map_err(|e| e.to_string());
        }

        #[test]
        fn never_panics_on_mutated_specs(
            cut in 0usize..600,
            insert in prop::sample::select(vec![
                "", "\n", "[[scenario]]\n", "=", "\"", "[", "]", "#", "name = \"x\"\n",
                "packets = -1\n", "expect = [\"a ==\"]\n", "\u{7}", "é", "\r\n",
            ]),
        ) {
            let mut text = GOOD.to_owned();
            let mut at = cut.min(text.len());
            while !text.is_char_boundary(at) {
                at -= 1;
            }
            text.insert_str(at, insert);
            if let Err(errors) = parse(&text) {
                prop_assert!(!errors.0.is_empty());
                let _ = errors.to_string();
            }
        }
    }
}
