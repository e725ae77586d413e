//! What the views' columns mean, said once: at the start of `watch` (and behind `?` in the
//! full-screen view), wrapped to the window.

use crate::output::columns::Column;
use tap_probe_observer::bpf::backend::Sources;

/// The legend of the compact table: what the numbers are, a line per column, and where
/// the counters come from.
#[must_use]
pub(crate) fn legend(columns: &[&Column], sources: &Sources, width: Option<usize>) -> Vec<String> {
    let mut out = columns_lines(columns, width);
    out.extend(sources_lines(sources, width));
    out
}

/// What the numbers are, and a line per column.
#[must_use]
pub(crate) fn columns_lines(columns: &[&Column], width: Option<usize>) -> Vec<String> {
    let mut out = wrap(
        "",
        "Rates are per second over the last refresh; a device with several queues has a line \
         of its own and one per queue under it. The final summary shows totals, devices that \
         went away included.",
        width,
        "",
    );
    let headers: Vec<String> = columns.iter().map(|c| c.header(false, true)).collect();
    let pad = headers.iter().map(String::len).max().unwrap_or(0) + 2;
    for (column, header) in columns.iter().zip(&headers) {
        let first = format!("  {header:<pad$}");
        let short = column.header(true, true);
        let help = if short == *header {
            column.help.to_owned()
        } else {
            format!("{} ({short} when narrow)", column.help)
        };
        out.extend(wrap(&first, &help, width, &" ".repeat(pad + 2)));
    }
    out
}

/// The legend of `--wide`, today's full table.
#[must_use]
pub(crate) fn wide(sources: &Sources, width: Option<usize>) -> Vec<String> {
    let mut out = wrap(
        "",
        "Counters are totals since tracking began, with rates per second beside the packet \
         counters; STOPPED * = stopped now; SLEEPS = times the reader slept between two \
         packets (each ended by a wake-up).",
        width,
        "",
    );
    out.extend(sources_lines(sources, width));
    out
}

/// Where the counters come from, and why a backend was not used.
fn sources_lines(sources: &Sources, width: Option<usize>) -> Vec<String> {
    let mut out = wrap("sources: ", &sources.to_string(), width, "  ");
    for note in &sources.notes {
        out.extend(wrap("  ", note, width, "    "));
    }
    out
}

/// `text` in lines of at most `width` characters, broken between words: the first line
/// starts with `first`, the others with `indent`. A word longer than a line is cut.
#[must_use]
pub(crate) fn wrap(first: &str, text: &str, width: Option<usize>, indent: &str) -> Vec<String> {
    let Some(width) = width else {
        return vec![format!("{first}{text}")];
    };
    let mut lines = Vec::new();
    let mut line = first.to_owned();
    let mut empty = true;
    for word in text.split_whitespace() {
        if !empty && line.chars().count() + 1 + word.chars().count() > width {
            lines.push(std::mem::replace(&mut line, indent.to_owned()));
            empty = true;
        }
        if !empty {
            line.push(' ');
        }
        line.push_str(word);
        empty = false;
    }
    lines.push(line);
    lines
        .into_iter()
        .map(|l| crate::output::compact::clip(&l, width))
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn wrapping_breaks_between_words_and_indents() {
        assert_eq!(
            wrap("  X  ", "ab cd ef", Some(10), "    "),
            ["  X  ab cd", "    ef"]
        );
        assert_eq!(wrap("", "abcdefghij", Some(4), ""), ["abc…"]);
        assert_eq!(wrap("- ", "a b", None, ""), ["- a b"]);
    }

    #[test]
    fn every_legend_line_fits() {
        let sources = crate::output::lines::tests::report(0.0, Vec::new()).sources;
        for width in [40, 80, 100, 120] {
            let columns: Vec<_> = crate::output::columns::COLUMNS.iter().collect();
            for line in legend(&columns, &sources, Some(width)) {
                assert!(line.chars().count() <= width, "{width}: {line:?}");
            }
            for line in wide(&sources, Some(width)) {
                assert!(line.chars().count() <= width, "{width}: {line:?}");
            }
        }
    }
}
