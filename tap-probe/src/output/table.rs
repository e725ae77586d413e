//! Aligned text columns, for every table tap-probe prints: each column as wide as its
//! widest cell, two spaces between columns, no trailing blanks. Also `watch --wide`, every
//! counter in a column.

use std::fmt::Write as _;

use crate::output::notices::notices;
use tap_probe_common::units::count;
use tap_probe_common::{METRICS, Metric, Source, Unit};

use tap_probe_observer::host::report::{Report, Row, Value};

/// How a column's cells are padded.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Align {
    Left,
    Right,
}

/// Rows of cells. Rows may be shorter than others; a row's last cell is not padded when it
/// is left-aligned, so long free text at the end of a row does not widen the others.
#[derive(Debug, Default)]
pub(crate) struct Table {
    indent: &'static str,
    /// Alignment per column; columns beyond are left-aligned.
    align: Vec<Align>,
    rows: Vec<Vec<String>>,
}

impl Table {
    /// A table whose columns are aligned as `align` says (left beyond it).
    #[must_use]
    pub(crate) fn new(align: &[Align]) -> Self {
        Self {
            indent: "",
            align: align.to_vec(),
            rows: Vec::new(),
        }
    }

    /// Every line starts with `indent`.
    #[must_use]
    pub(crate) fn indent(mut self, indent: &'static str) -> Self {
        self.indent = indent;
        self
    }

    pub(crate) fn row(&mut self, cells: Vec<String>) {
        self.rows.push(cells);
    }

    /// The lines, each ending in a newline.
    #[must_use]
    pub(crate) fn render(&self) -> String {
        let columns = self.rows.iter().map(Vec::len).max().unwrap_or(0);
        let widths: Vec<usize> = (0..columns)
            .map(|c| {
                self.rows
                    .iter()
                    .filter_map(|row| row.get(c))
                    .map(|cell| cell.chars().count())
                    .max()
                    .unwrap_or(0)
            })
            .collect();
        let mut out = String::new();
        for row in &self.rows {
            let mut line = String::from(self.indent);
            for (c, cell) in row.iter().enumerate() {
                if c > 0 {
                    line.push_str("  ");
                }
                let pad = widths[c].saturating_sub(cell.chars().count());
                match self.align.get(c).copied().unwrap_or(Align::Left) {
                    Align::Right => {
                        line.extend(std::iter::repeat_n(' ', pad));
                        line.push_str(cell);
                    }
                    Align::Left => {
                        line.push_str(cell);
                        if c + 1 < row.len() {
                            line.extend(std::iter::repeat_n(' ', pad));
                        }
                    }
                }
            }
            out.push_str(line.trim_end());
            out.push('\n');
        }
        out
    }
}

/// `(name, value)` pairs as two aligned columns (`load`'s report).
#[must_use]
pub(crate) fn name_values(fields: Vec<(&'static str, String)>) -> String {
    let mut table = Table::new(&[Align::Left, Align::Left]);
    for (name, value) in fields {
        table.row(vec![name.to_owned(), value]);
    }
    table.render()
}

/// The columns that name the row, before those of [`METRICS`].
const LABELS: [&str; 5] = ["DEVICE", "NETNS", "KIND", "Q", "OWNER"];

/// The table: a column per metric that has one, notes for those that do not, and
/// per-second rates beside the packet counters of the probes when `previous` is given.
#[must_use]
pub(crate) fn rows(report: &Report, previous: Option<&Report>) -> String {
    let dt = previous
        .map(|p| report.elapsed_s - p.elapsed_s)
        .filter(|dt| *dt > 0.0);
    let mut header: Vec<String> = LABELS.map(str::to_owned).to_vec();
    header.extend(METRICS.iter().filter_map(|m| m.column).map(str::to_owned));
    let mut align = vec![Align::Left; LABELS.len()];
    align.resize(header.len(), Align::Right);
    let mut table = Table::new(&align);
    table.row(header);
    for row in &report.rows {
        let before = previous.and_then(|p| {
            p.rows
                .iter()
                .find(|r| r.ifname == row.ifname && r.netns == row.netns && r.queue == row.queue)
        });
        let owner = row
            .owner
            .as_ref()
            .map_or_else(|| "-".to_owned(), |o| format!("{}/{}", o.comm, o.pid));
        let mut name = row.ifname.clone();
        if row.retired {
            name.push_str(" (gone)");
        }
        let mut cells = vec![
            name,
            row.netns.clone(),
            format!("{:?}", row.kind).to_lowercase(),
            row.queue.to_string(),
            owner,
        ];
        for metric in METRICS {
            let value = row.value(metric);
            match (metric.column, cells.last_mut()) {
                (None, Some(last)) => last.push_str(&note(metric, value)),
                _ => cells.push(cell(metric, value, before.zip(dt))),
            }
        }
        table.row(cells);
    }
    let mut out = table.render();
    footer(report, &mut out);
    out
}

/// A metric's own cell: a count (with its rate since `before`, `dt` seconds ago, for the
/// probes' packet counters) or a time.
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "rates and seconds for display"
)]
fn cell(metric: &Metric, value: Value, before: Option<(&Row, f64)>) -> String {
    match (value, metric.unit) {
        (Value::Count(ns), Unit::Nanoseconds) => format!("{:.3}s", ns as f64 / 1e9),
        (Value::Count(n), Unit::Packets) if matches!(metric.source, Source::Programs { .. }) => {
            match before.map(|(row, dt)| (row.value(metric), dt)) {
                Some((Value::Count(then), dt)) => format!(
                    "{} ({}/s)",
                    count(n),
                    count((n.saturating_sub(then) as f64 / dt).round() as u64)
                ),
                _ => count(n),
            }
        }
        (Value::Count(n), _) => count(n),
        // A level: now / the highest seen.
        (Value::Distribution(d), _) => match d.current {
            Some(now) => format!("{}/{}", count(now), count(d.max)),
            None => "-".to_owned(),
        },
        (Value::Flag(flag), _) => if flag { "yes" } else { "no" }.to_owned(),
        (Value::Missing, _) => "-".to_owned(),
        (value, _) => note(metric, value).trim_start().to_owned(),
    }
}

/// A metric shown beside the column before it: a mark for a flag that is set, a ratio in
/// parentheses.
fn note(metric: &Metric, value: Value) -> String {
    match (value, metric.unit) {
        (Value::Flag(true), _) => "*".to_owned(),
        (Value::Ratio(Some(ratio)), Unit::PerPacket) => format!(" ({ratio:.2}/pkt)"),
        (Value::Ratio(Some(ratio)), _) => format!(" ({ratio:.2})"),
        (Value::Count(n), _) => format!(" ({})", count(n)),
        (Value::Flag(false) | Value::Ratio(None) | Value::Missing | Value::Distribution(_), _) => {
            String::new()
        }
    }
}

/// Below the table: what it cannot show in columns. What the columns mean and where the
/// counters come from is said once, in the legend.
fn footer(report: &Report, out: &mut String) {
    if report.rows.is_empty() {
        out.push_str("(no matching device yet)\n");
    }
    let reasons: Vec<String> = report
        .rows
        .iter()
        .flat_map(|r| {
            r.drop_reasons
                .iter()
                .map(move |(k, v)| format!("{}/q{}: {k} {v}", r.ifname, r.queue))
        })
        .collect();
    if !reasons.is_empty() {
        let _ = writeln!(out, "other drops by reason: {}", reasons.join(", "));
    }
    for notice in notices(report) {
        let _ = writeln!(out, "{notice}");
    }
    let _ = writeln!(out, "{:.1} s since attach", report.elapsed_s);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn columns_align_and_lines_do_not_trail() {
        let mut t = Table::new(&[Align::Left, Align::Right]).indent("  ");
        t.row(vec!["a".into(), "1".into(), "x".into()]);
        t.row(vec!["bbb".into(), "100".into(), "long text".into()]);
        t.row(vec!["c".into()]);
        assert_eq!(t.render(), "  a      1  x\n  bbb  100  long text\n  c\n");
    }
}
