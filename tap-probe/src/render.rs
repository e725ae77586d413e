//! Output: a live table for people, one JSON object per refresh for programs.

use std::fmt::Write as _;
use std::io::IsTerminal as _;

use crate::cli::Format;
use tap_probe_common::{METRICS, Metric, Source, Unit};

use crate::report::{Report, Row, Value};
use crate::table::{Align, Table};

pub(crate) struct Output {
    format: Format,
    redraw: bool,
}

impl Output {
    #[must_use]
    pub(crate) fn new(format: Format) -> Self {
        Self {
            format,
            redraw: format == Format::Table && std::io::stdout().is_terminal(),
        }
    }

    /// Shows one refresh; `previous` gives the rates.
    ///
    /// # Errors
    /// When stdout is closed.
    pub(crate) fn show(&self, report: &Report, previous: Option<&Report>) -> anyhow::Result<()> {
        let text = match self.format {
            Format::Json => json_line(report, false)?,
            Format::Table => {
                let mut t = String::new();
                if self.redraw {
                    // Home the cursor and clear the screen: a plain redraw, no raw mode or
                    // alternate screen, so there is nothing to restore on exit.
                    t.push_str("\x1b[H\x1b[2J");
                }
                t.push_str(&table(report, previous));
                t
            }
        };
        crate::output::stdout(&text)
    }

    /// The final summary after detaching.
    ///
    /// # Errors
    /// When stdout is closed.
    pub(crate) fn summary(&self, report: &Report) -> anyhow::Result<()> {
        let text = match self.format {
            Format::Json => json_line(report, true)?,
            Format::Table => {
                let mut t = format!(
                    "\nFinal counters after {:.1} s:\n{}",
                    report.elapsed_s,
                    table(report, None)
                );
                let mut programs = Table::new(&[Align::Left, Align::Left, Align::Right]);
                for p in report.programs.iter().flatten() {
                    programs.row(vec![
                        "program".to_owned(),
                        p.program.clone(),
                        format!("{} runs", p.runs),
                        format!("{} ns/run", p.mean_ns),
                    ]);
                }
                t.push_str(&programs.render());
                t
            }
        };
        crate::output::stdout(&text)
    }
}

/// One report as a JSON line; `final` marks the summary written after detaching.
///
/// # Errors
/// Never in practice (serialising plain data).
pub(crate) fn json_line(report: &Report, last: bool) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(report)?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("final".to_owned(), serde_json::Value::Bool(last));
    }
    Ok(format!("{value}\n"))
}

/// The columns that name the row, before those of [`METRICS`].
const LABELS: [&str; 5] = ["DEVICE", "NETNS", "KIND", "Q", "OWNER"];

/// The table: a column per metric that has one, notes for those that do not, and
/// per-second rates beside the packet counters of the probes when `previous` is given.
#[must_use]
pub(crate) fn table(report: &Report, previous: Option<&Report>) -> String {
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
        (Value::Count(n), Unit::Packets) if matches!(metric.source, Source::Programs(_)) => {
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
        (Value::Flag(false) | Value::Ratio(None), _) => String::new(),
    }
}

/// Below the table: what it cannot show in columns, and where the counters come from.
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
    let _ = writeln!(
        out,
        "{:.1} s since attach; STOPPED * = stopped now; SLEEPS = times the reader slept \
         between two packets (each ended by a wake-up)\nsources: {}",
        report.elapsed_s, report.sources
    );
}

/// A count in at most 6 characters: 999, 12.3k, 4.56M.
#[expect(clippy::cast_precision_loss, reason = "a display rounded to 3 digits")]
fn count(n: u64) -> String {
    match n {
        0..=99_999 => n.to_string(),
        100_000..=99_999_999 => format!("{:.1}k", n as f64 / 1e3),
        _ => format!("{:.2}M", n as f64 / 1e6),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_are_short() {
        assert_eq!(count(0), "0");
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123.5k");
        assert_eq!(count(4_560_000_000), "4560.00M");
    }
}
