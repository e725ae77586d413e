//! A line of what was read with carets under the part a message is about. A long line (a
//! name of a megabyte, a whole spec on one line) is cut to a window around that part, and
//! the caret line says how long the whole line is, so a message stays a few lines.

use std::fmt::Write as _;

/// The most characters of a line shown; longer lines are cut around the part.
const WINDOW: usize = 100;
/// Characters shown before the part when the line is cut.
const BEFORE: usize = 20;

/// `line` and a caret line under its characters `column..column + width` (counted in
/// characters, `width` at least one), each after `margin`. Control characters show as
/// spaces, so that the carets stay under their columns.
pub(crate) fn under(line: &str, column: usize, width: usize, margin: &str) -> String {
    let total = line.chars().count();
    let width = width.max(1);
    let (start, end) = if total <= WINDOW {
        (0, total)
    } else {
        let start = column.min(total).saturating_sub(BEFORE);
        (start, (start + WINDOW).min(total))
    };
    let mut shown: String = if start > 0 {
        "…".to_owned()
    } else {
        String::new()
    };
    let lead = shown.chars().count();
    shown.extend(
        line.chars()
            .skip(start)
            .take(end - start)
            .map(|c| if c.is_control() { ' ' } else { c }),
    );
    if end < total {
        shown.push('…');
    }
    let caret_column = column.saturating_sub(start) + lead;
    let carets = width.min(end.saturating_sub(column).max(1));
    let mut out = format!(
        "{margin}{}\n{}{}{}",
        shown.trim_end(),
        margin_blank(margin),
        " ".repeat(caret_column),
        "^".repeat(carets)
    );
    if end - start < total {
        let _ = write!(
            out,
            " (column {} of a line of {total} characters)",
            column + 1
        );
    }
    out
}

/// `margin` with its text blanked but a `|` kept, so the caret line lines up:
/// `"    3 | "` gives `"      | "`.
fn margin_blank(margin: &str) -> String {
    margin
        .chars()
        .map(|c| if c == '|' { '|' } else { ' ' })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_short_line_is_shown_whole() {
        assert_eq!(
            under("packets = -1", 10, 2, "    4 | "),
            "    4 | packets = -1\n      |           ^^"
        );
        assert_eq!(under("a\tb", 2, 1, ""), "a b\n  ^");
    }

    #[test]
    fn a_long_line_is_cut_around_the_part() {
        let line = format!("name = \"{}\"", "x".repeat(1_000_000));
        let shown = under(&line, 7, 1_000_002, "    2 | ");
        assert!(shown.len() < 400, "{shown}");
        let (text, carets) = shown.split_once('\n').unwrap();
        assert!(
            text.starts_with("    2 | name = \"xxx") && text.ends_with("x…"),
            "{text}"
        );
        assert!(
            carets.ends_with("^ (column 8 of a line of 1000009 characters)"),
            "{carets}"
        );
        let shown = under(&line, 500_000, 3, "");
        let (text, carets) = shown.split_once('\n').unwrap();
        assert!(text.starts_with('…') && text.ends_with('…'), "{text}");
        assert_eq!(carets.find('^'), Some(21), "{carets}");
        assert!(
            carets.contains("^^^ (column 500001 of a line of"),
            "{carets}"
        );
    }
}
