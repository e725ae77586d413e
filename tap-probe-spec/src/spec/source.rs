//! Where in a spec's text a problem is: its line, the scenario and key it falls in, and
//! the line itself with carets under the spot. The TOML reader gives a byte span; the rest
//! is worked out from the text, also for TOML that does not parse.

use std::ops::Range;

use serde::Deserialize;
use toml::Spanned;

use super::{ScenarioRef, SpecError};

/// A problem the TOML reader found (syntax, unknown key, wrong type), with its scenario
/// and key worked out from where it is.
pub(super) fn toml_error(text: &str, message: &str, span: Option<Range<usize>>) -> SpecError {
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
pub(super) fn line_of(text: &str, offset: usize) -> usize {
    text.as_bytes()[..offset.min(text.len())]
        .split(|&b| b == b'\n')
        .count()
}

/// The line holding `span` with a caret line under it (up to its end of line). Control
/// characters show as spaces so that the carets stay under their columns.
pub(super) fn snippet(text: &str, span: &Range<usize>) -> String {
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
