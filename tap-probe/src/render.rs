//! Output: a live table for people, one JSON object per refresh for programs.

use std::fmt::Write as _;
use std::io::IsTerminal as _;

use crate::cli::Format;
use crate::report::{Report, Row};
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

const HEADER: [&str; 17] = [
    "DEVICE",
    "NETNS",
    "KIND",
    "Q",
    "OWNER",
    "XMIT",
    "ENQUEUED",
    "BUSY",
    "FULL_RING",
    "OTHER",
    "CONSUMED",
    "STOPS",
    "WAKES",
    "STOPPED",
    "SLEEPS",
    "K_TX_PKTS",
    "K_TX_DROP",
];

/// The table: totals, with per-second rates beside the packet counters when `previous` is
/// given.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "rates and seconds for display"
)]
pub(crate) fn table(report: &Report, previous: Option<&Report>) -> String {
    let dt = previous
        .map(|p| report.elapsed_s - p.elapsed_s)
        .filter(|dt| *dt > 0.0);
    let mut lines: Vec<Vec<String>> = vec![HEADER.iter().map(|s| (*s).to_owned()).collect()];
    for row in &report.rows {
        let before = previous.and_then(|p| {
            p.rows
                .iter()
                .find(|r| r.ifname == row.ifname && r.netns == row.netns && r.queue == row.queue)
        });
        let rate = |now: u64, then: fn(&Row) -> u64| match (dt, before) {
            (Some(dt), Some(b)) => format!(
                "{} ({}/s)",
                count(now),
                count(((now.saturating_sub(then(b))) as f64 / dt).round() as u64)
            ),
            _ => count(now),
        };
        let owner = row
            .owner
            .as_ref()
            .map_or_else(|| "-".to_owned(), |o| format!("{}/{}", o.comm, o.pid));
        let mut name = row.ifname.clone();
        if row.retired {
            name.push_str(" (gone)");
        }
        lines.push(vec![
            name,
            row.netns.clone(),
            format!("{:?}", row.kind).to_lowercase(),
            row.queue.to_string(),
            owner,
            rate(row.xmit_calls, |r| r.xmit_calls),
            rate(row.enqueued, |r| r.enqueued),
            rate(row.busy, |r| r.busy),
            rate(row.dropped_full_ring, |r| r.dropped_full_ring),
            rate(row.dropped_other, |r| r.dropped_other),
            rate(row.consumed, |r| r.consumed),
            count(row.queue_stops),
            count(row.queue_wakes),
            format!(
                "{:.3}s{}",
                row.stopped_ns as f64 / 1e9,
                if row.stopped { "*" } else { "" }
            ),
            match row.wakeups_per_packet {
                Some(per_packet) => format!("{} ({per_packet:.2}/pkt)", count(row.reader_sleeps)),
                None => count(row.reader_sleeps),
            },
            count(row.kernel.tx_packets),
            count(row.kernel.tx_dropped),
        ]);
    }
    let mut align = [Align::Right; HEADER.len()];
    align[..5].fill(Align::Left);
    let mut table = Table::new(&align);
    for line in lines {
        table.row(line);
    }
    let mut out = table.render();
    footer(report, &mut out);
    out
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
