//! Where in a spec's text a problem is: its line, the scenario and key it falls in, and
//! the line itself with carets under the spot. The TOML reader gives a byte span; the rest
//! is worked out from the text, also for TOML that does not parse.

use std::ops::Range;

use serde::Deserialize;
use tap_probe_common::echo::clip_quoted;
use toml::Spanned;

use super::{ScenarioRef, SpecError};

/// A problem the TOML reader found (syntax, unknown key, wrong type), with its scenario
/// and key worked out from where it is. What the reader quotes of the text is cut.
pub(super) fn toml_error(text: &str, message: &str, span: Option<Range<usize>>) -> SpecError {
    let message = clip_quoted(message.trim_end());
    let Some(span) = span else {
        return SpecError {
            scenario: None,
            key: None,
            line: None,
            message,
            detail: None,
        };
    };
    let source = Source::new(text);
    SpecError {
        scenario: scenario_at(text, span.start),
        key: key_at(text, &span),
        line: Some(source.line_of(span.start)),
        message,
        detail: Some(source.snippet(&span)),
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

/// A spec's text with where its lines start, found once: every problem's line and snippet
/// is then a binary search away, however many problems and lines there are.
pub(super) struct Source<'a> {
    text: &'a str,
    /// Byte offset of each line's first byte.
    starts: Vec<usize>,
}

impl<'a> Source<'a> {
    pub(super) fn new(text: &'a str) -> Self {
        let starts = std::iter::once(0)
            .chain(text.match_indices('\n').map(|(at, _)| at + 1))
            .collect();
        Self { text, starts }
    }

    /// The 1-based line of byte `offset`.
    pub(super) fn line_of(&self, offset: usize) -> usize {
        self.starts.partition_point(|&start| start <= offset).max(1)
    }

    /// The line holding `span` with a caret line under it (up to its end of line), cut
    /// around the span when the line is long ([`crate::caret`]).
    pub(super) fn snippet(&self, span: &Range<usize>) -> String {
        let number = self.line_of(span.start);
        let line_start = self.starts[number - 1];
        let line_end = self
            .starts
            .get(number)
            .map_or(self.text.len(), |next| next - 1);
        let Some(line) = self.text.get(line_start..line_end) else {
            return String::new();
        };
        let line = line.strip_suffix('\r').unwrap_or(line);
        let start = span.start.clamp(line_start, line_start + line.len());
        let column = self
            .text
            .get(line_start..start)
            .map_or(0, |s| s.chars().count());
        let width = self
            .text
            .get(start..span.end.clamp(start, line_start + line.len()))
            .map_or(0, |s| s.chars().count());
        crate::caret::under(line, column, width, &format!("    {number} | "))
    }
}
