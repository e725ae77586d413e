//! Checking one scenario table: every key, its range, and every expression's syntax and
//! names, with every problem pushed rather than the first returned.

use std::ops::Range;
use std::time::Duration;

use tap_probe_common::echo::{MAX_CHARS, quoted};
use toml::Spanned;

use super::source::Source;
use super::{
    DEFAULT_TX_QUEUE_LEN, MAX_DURATION, MAX_PACKETS, MAX_PPS, MAX_SENDER_THREADS, MAX_TX_QUEUE_LEN,
    RawScenario, ReaderKind, Scenario, ScenarioRef, SpecError, SpecErrors, Traffic,
};
use crate::baseline::SavedBaseline;
use crate::expr::{Expectation, Name};

/// Validates one raw scenario, pushing every problem; `None` when there was one.
pub(super) struct Checker<'a> {
    pub(super) source: &'a Source<'a>,
    pub(super) at: &'a ScenarioRef,
    /// The `[[scenario]]` header: where a missing key is reported.
    pub(super) header: Range<usize>,
    pub(super) errors: &'a mut SpecErrors,
}

impl Checker<'_> {
    pub(super) fn push(
        &mut self,
        key: Option<&str>,
        span: Option<Range<usize>>,
        message: String,
        detail: Option<String>,
    ) {
        let source = self.source;
        let at = self.at;
        self.errors.push(|| SpecError {
            scenario: Some(at.clone()),
            key: key.map(str::to_owned),
            line: span.as_ref().map(|s| source.line_of(s.start)),
            message,
            detail: detail.or_else(|| span.map(|s| source.snippet(&s))),
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

    pub(super) fn scenario(
        &mut self,
        raw: RawScenario,
        known: &[&str],
        baseline: Option<&SavedBaseline>,
    ) -> Option<Scenario> {
        let before = self.errors.total;
        let stop_present = raw.packets.is_some() || raw.duration.is_some();
        let name = self.name(raw.name);
        let qdisc = raw.qdisc.map(Spanned::into_inner);
        if qdisc.is_none() {
            self.missing(
                "qdisc",
                "the tap's root qdisc, one of \"noqueue\", \"pfifo-fast\", \"pfifo\", \"fq-codel\" (or \
                 tc's \"pfifo_fast\", \"fq_codel\")",
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
        if self.errors.total > before {
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
                reader: raw.reader.map_or(ReaderKind::Read, Spanned::into_inner),
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
pub(super) fn parse_duration(text: &str) -> Result<Duration, String> {
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
            "{} is not a whole number of milliseconds above 0; use e.g. \"1ms\" or more",
            quoted(text, MAX_CHARS)
        ));
    }
    Ok(duration)
}
