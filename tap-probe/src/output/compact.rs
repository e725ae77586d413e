//! The compact table: a few columns, rates first, sized to the window. Rendering is a pure
//! function of a report (and the one before it, for the rates), the columns and a width:
//! columns are shortened, then dropped (least needed first), then the device names cut, so
//! that no line is ever wider than the window and none wraps.

use std::collections::HashMap;
use std::fmt::Write as _;

use tap_probe_common::{Metric, MetricId, Unit};

use crate::output::columns::{Column, KEEP, What};
use crate::output::lines::{Line, LineId, lines};
use crate::output::notices::notices;
use tap_probe_common::units::count;
use tap_probe_observer::host::report::{Report, Value};

/// What the numbers are: rates since the refresh before, or totals since tracking began
/// (the final summary).
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mode {
    Rates,
    Totals,
}

/// How a cell sorts: by rank, the variants' order, then by value within a rank.
#[derive(Clone, Debug, PartialEq)]
pub(crate) enum Key {
    /// No figure (`-`, `?`), or the line of all a device's queues (`all`): before any.
    Missing,
    Number(f64),
    /// A queue stopped now, and the share of the interval its line spent stopped: after
    /// every line whose queues run.
    StoppedNow(f64),
    /// Stopped with nothing taken since: after every line merely stopped.
    Stuck,
    Text(String),
}

impl Key {
    /// The rank, the variants' order.
    fn rank(&self) -> u8 {
        match self {
            Self::Missing => 0,
            Self::Number(_) => 1,
            Self::StoppedNow(_) => 2,
            Self::Stuck => 3,
            Self::Text(_) => 4,
        }
    }

    /// By rank, then numbers by value and text alphabetically.
    #[must_use]
    pub(crate) fn order(&self, other: &Self) -> std::cmp::Ordering {
        match (self, other) {
            (Self::Number(a), Self::Number(b)) | (Self::StoppedNow(a), Self::StoppedNow(b)) => {
                a.total_cmp(b)
            }
            (Self::Text(a), Self::Text(b)) => a.cmp(b),
            _ => self.rank().cmp(&other.rank()),
        }
    }
}

/// What a line needs a reader to notice.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Mark {
    Plain,
    /// A queue is stopped now.
    Stopped,
    /// A queue is stopped with no reader take for too long (where the counters say so).
    Stuck,
    /// The device disappeared.
    Gone,
}

/// One line of the table, every requested column's cell and sort key.
#[derive(Clone, Debug)]
pub(crate) struct GridLine {
    pub(crate) id: LineId,
    pub(crate) cells: Vec<String>,
    pub(crate) keys: Vec<Key>,
    pub(crate) mark: Mark,
    /// A queue line folded under its device's line.
    pub(crate) folded: bool,
}

/// The cells of a report for some columns, before they are fitted to a width.
#[derive(Clone, Debug)]
pub(crate) struct Grid {
    pub(crate) columns: Vec<&'static Column>,
    pub(crate) mode: Mode,
    pub(crate) lines: Vec<GridLine>,
}

/// Which columns a width shows, with which headers and widths.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Fit {
    /// Indexes into [`Grid::columns`], in their order.
    pub(crate) shown: Vec<usize>,
    pub(crate) headers: Vec<String>,
    pub(crate) widths: Vec<usize>,
    /// The window's width, which no line exceeds; `None`: no limit.
    pub(crate) width: Option<usize>,
}

/// Columns are two spaces apart.
pub(crate) const GAP: usize = 2;
/// The device column is not cut below this.
const MIN_DEVICE: usize = 6;
/// Namespaces and owners are cut beyond this: long ones would crowd out the numbers.
const MAX_LABEL: usize = 24;

impl Grid {
    /// The cells of `report` in `mode` (rates against `previous`).
    #[must_use]
    pub(crate) fn new(
        report: &Report,
        previous: Option<&Report>,
        columns: &[&'static Column],
        mode: Mode,
    ) -> Self {
        let before: HashMap<LineId, Line<'_>> = previous
            .map(|p| lines(p).into_iter().map(|l| (l.id.clone(), l)).collect())
            .unwrap_or_default();
        let dt = previous
            .map(|p| report.elapsed_s - p.elapsed_s)
            .filter(|dt| *dt > 0.0);
        let lines = lines(report)
            .iter()
            .map(|line| {
                let ctx = Ctx {
                    line,
                    before: before.get(&line.id).zip(dt),
                    mode,
                };
                let (cells, keys) = columns.iter().map(|c| ctx.cell(c)).unzip();
                GridLine {
                    id: line.id.clone(),
                    cells,
                    keys,
                    mark: ctx.mark(),
                    folded: line.under,
                }
            })
            .collect();
        Self {
            columns: columns.to_vec(),
            mode,
            lines,
        }
    }

    /// The columns, headers and widths that fit in `width`: full headers if they fit, then
    /// short ones, then without the least needed columns, and at last with the device
    /// names cut.
    #[must_use]
    pub(crate) fn fit(&self, width: Option<usize>) -> Fit {
        let rates = self.mode == Mode::Rates;
        let natural = |i: usize, short: bool| {
            self.lines
                .iter()
                .map(|l| l.cells[i].chars().count())
                .chain([self.columns[i].header(short, rates).chars().count()])
                .max()
                .unwrap_or(0)
        };
        let total =
            |widths: &[usize]| widths.iter().sum::<usize>() + GAP * widths.len().saturating_sub(1);
        let make = |shown: &[usize], short: bool| {
            let widths: Vec<usize> = shown.iter().map(|&i| natural(i, short)).collect();
            Fit {
                shown: shown.to_vec(),
                headers: shown
                    .iter()
                    .map(|&i| self.columns[i].header(short, rates))
                    .collect(),
                widths,
                width,
            }
        };
        // The least needed first; of two as needed, the one further right.
        let mut drops: Vec<usize> = (0..self.columns.len())
            .filter(|&i| self.columns[i].keep != KEEP)
            .collect();
        drops.sort_by_key(|&i| (self.columns[i].keep, std::cmp::Reverse(i)));
        let mut drops = drops.into_iter();
        let mut shown: Vec<usize> = (0..self.columns.len()).collect();
        loop {
            for short in [false, true] {
                let fit = make(&shown, short);
                if width.is_none_or(|w| total(&fit.widths) <= w) {
                    return fit;
                }
            }
            match drops.next() {
                Some(i) => shown.retain(|&s| s != i),
                None => break,
            }
        }
        let mut fit = make(&shown, true);
        if let (Some(w), Some(device)) = (
            width,
            shown
                .iter()
                .position(|&i| self.columns[i].what == What::Device),
        ) {
            let excess = total(&fit.widths).saturating_sub(w);
            fit.widths[device] = fit.widths[device]
                .saturating_sub(excess)
                .max(MIN_DEVICE.min(fit.widths[device]));
        }
        fit
    }

    /// The header line and `lines`, as `fit` shows them; none wider than its width.
    #[must_use]
    pub(crate) fn render<'g>(
        &self,
        fit: &Fit,
        lines: impl IntoIterator<Item = &'g GridLine>,
    ) -> Vec<String> {
        let mut out = vec![self.line(fit, &fit.headers)];
        for line in lines {
            let cells: Vec<String> = fit.shown.iter().map(|&i| line.cells[i].clone()).collect();
            out.push(self.line(fit, &cells));
        }
        out
    }

    fn line(&self, fit: &Fit, cells: &[String]) -> String {
        let mut text = String::new();
        for (n, (cell, (&i, &w))) in cells
            .iter()
            .zip(fit.shown.iter().zip(&fit.widths))
            .enumerate()
        {
            if n > 0 {
                text.push_str(&" ".repeat(GAP));
            }
            let cell = clip(cell, w);
            let pad = w.saturating_sub(cell.chars().count());
            if left_aligned(self.columns[i].what) {
                text.push_str(&cell);
                text.push_str(&" ".repeat(pad));
            } else {
                text.push_str(&" ".repeat(pad));
                text.push_str(&cell);
            }
        }
        let text = text.trim_end();
        match fit.width {
            Some(w) => clip(text, w),
            None => text.to_owned(),
        }
    }
}

/// Labels read left to right; numbers line up on the right.
fn left_aligned(what: What) -> bool {
    matches!(
        what,
        What::Device | What::Netns | What::Kind | What::Owner | What::Queue
    )
}

/// `text` in at most `width` characters, cut with an ellipsis.
#[must_use]
pub(crate) fn clip(text: &str, width: usize) -> String {
    if text.chars().count() <= width {
        return text.to_owned();
    }
    if width == 0 {
        return String::new();
    }
    let mut cut: String = text.chars().take(width - 1).collect();
    cut.push('…');
    cut
}

/// One line's cells.
struct Ctx<'a, 'r> {
    line: &'a Line<'r>,
    /// The same line in the refresh before, and the seconds since.
    before: Option<(&'a Line<'a>, f64)>,
    mode: Mode,
}

impl Ctx<'_, '_> {
    fn cell(&self, column: &Column) -> (String, Key) {
        let row = self.line.first();
        let text = |s: String| (s.clone(), Key::Text(s));
        match column.what {
            What::Device => {
                let key = Key::Text(row.ifname.clone());
                let mut name = match self.line.id.queue {
                    Some(q) if self.line.under => format!("  q{q}"),
                    _ => row.ifname.clone(),
                };
                if self.line.retired() && !self.line.under {
                    name.push_str(" (gone)");
                }
                (name, key)
            }
            What::Netns => text(clip(&row.netns, MAX_LABEL)),
            What::Kind => text(format!("{:?}", row.kind).to_lowercase()),
            What::Owner => text(clip(
                &row.owner
                    .as_ref()
                    .map_or_else(|| "-".to_owned(), |o| format!("{}/{}", o.comm, o.pid)),
                MAX_LABEL,
            )),
            What::Queue => match self.line.id.queue {
                Some(q) => (q.to_string(), Key::Number(f64::from(q))),
                None => ("all".to_owned(), Key::Missing),
            },
            What::Rate(id) => self.rate(id.metric()),
            What::Stopped => self.stopped(),
            What::State(id) => plain(id.metric(), self.line.value(id.metric())),
        }
    }

    /// A counter: its rate, or its total in the final summary.
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "rates for display"
    )]
    fn rate(&self, metric: &Metric) -> (String, Key) {
        let now = self.line.value(metric);
        match (self.mode, now) {
            // Totals are exact: the summary is what people compare with other counters.
            (Mode::Totals, Value::Count(n)) => (n.to_string(), Key::Number(n as f64)),
            (Mode::Rates, Value::Count(n)) => {
                match self.before.map(|(l, dt)| (l.value(metric), dt)) {
                    Some((Value::Count(then), dt)) => {
                        let rate = n.saturating_sub(then) as f64 / dt;
                        (count(rate.round() as u64), Key::Number(rate))
                    }
                    _ => ("-".to_owned(), Key::Missing),
                }
            }
            (_, value) => plain(metric, value),
        }
    }

    /// Stuck, stopped now, or the share of the interval (of the run, in the summary) the
    /// line's queues spent stopped.
    #[expect(clippy::cast_precision_loss, reason = "a share of time for display")]
    fn stopped(&self) -> (String, Key) {
        if self.flag(MetricId::Stuck) {
            return ("STUCK".to_owned(), Key::Stuck);
        }
        let ns_metric = MetricId::StoppedNs.metric();
        let Value::Count(ns) = self.line.value(ns_metric) else {
            return ("?".to_owned(), Key::Missing);
        };
        let now = self.flag(MetricId::Stopped);
        match self.mode {
            Mode::Totals => {
                let secs = ns as f64 / 1e9;
                (format!("{secs:.1}s"), Key::Number(secs))
            }
            Mode::Rates => {
                let share = self.before.and_then(|(l, dt)| match l.value(ns_metric) {
                    Value::Count(then) => Some(
                        ns.saturating_sub(then) as f64 / (dt * 1e9 * self.line.rows.len() as f64),
                    ),
                    _ => None,
                });
                let share = share.map(|s| s.min(1.0));
                let key = if now {
                    Key::StoppedNow(share.unwrap_or(0.0))
                } else {
                    share.map_or(Key::Missing, Key::Number)
                };
                if now {
                    ("now".to_owned(), key)
                } else {
                    match share {
                        Some(s) => (format!("{:.0}%", s * 100.0), key),
                        None => ("-".to_owned(), key),
                    }
                }
            }
        }
    }

    /// Whether the flag `id` is set on the line.
    fn flag(&self, id: MetricId) -> bool {
        matches!(self.line.value(id.metric()), Value::Flag(true))
    }

    fn mark(&self) -> Mark {
        if self.line.retired() {
            Mark::Gone
        } else if self.flag(MetricId::Stuck) {
            Mark::Stuck
        } else if self.flag(MetricId::Stopped) {
            Mark::Stopped
        } else {
            Mark::Plain
        }
    }
}

/// A value as it is: a count, seconds, on or off, a ratio.
#[expect(clippy::cast_precision_loss, reason = "values for display")]
pub(crate) fn plain(metric: &Metric, value: Value) -> (String, Key) {
    match (value, metric.unit) {
        (Value::Count(ns), Unit::Nanoseconds) => {
            let secs = ns as f64 / 1e9;
            (format!("{secs:.3}s"), Key::Number(secs))
        }
        (Value::Count(n), _) => (count(n), Key::Number(n as f64)),
        (Value::Flag(flag), _) => (
            if flag { "on" } else { "off" }.to_owned(),
            Key::Number(f64::from(u8::from(flag))),
        ),
        (Value::Ratio(Some(ratio)), _) => (format!("{ratio:.2}"), Key::Number(ratio)),
        (Value::Ratio(None) | Value::Missing, _) => ("-".to_owned(), Key::Missing),
        // A level: now / the highest seen.
        (Value::Distribution(d), _) => match d.current {
            Some(now) => (
                format!("{}/{}", count(now), count(d.max)),
                Key::Number(now as f64),
            ),
            None => ("-".to_owned(), Key::Missing),
        },
    }
}

/// One refresh: the table and a status line, in at most `height` lines when given (the
/// lines that do not fit are counted instead).
#[must_use]
pub(crate) fn frame(
    report: &Report,
    previous: Option<&Report>,
    columns: &[&'static Column],
    width: Option<usize>,
    height: Option<usize>,
) -> Vec<String> {
    let grid = Grid::new(report, previous, columns, Mode::Rates);
    let fit = grid.fit(width);
    let mut lines = if report.rows.is_empty() {
        Vec::new()
    } else {
        grid.render(&fit, &grid.lines)
    };
    if let Some(height) = height.filter(|h| *h >= 4 && lines.len() + 1 > *h) {
        let keep = height - 2;
        let more = lines.len() - keep;
        lines.truncate(keep);
        lines.push(clip_to(
            &format!("… {more} more lines (watch --tui scrolls)"),
            width,
        ));
    }
    lines.push(status(report, width));
    lines
}

/// The final summary's table: totals since tracking began, devices that went away marked
/// as gone, and the other drops by reason.
#[must_use]
pub(crate) fn totals(
    report: &Report,
    columns: &[&'static Column],
    width: Option<usize>,
) -> Vec<String> {
    let grid = Grid::new(report, None, columns, Mode::Totals);
    let fit = grid.fit(width);
    let mut lines = grid.render(&fit, &grid.lines);
    let reasons = reasons(report);
    if !reasons.is_empty() {
        lines.extend(crate::output::legend::wrap(
            "other drops by reason: ",
            &reasons.join(", "),
            width,
            "  ",
        ));
    }
    lines
}

/// Below each refresh: the time since attach, the devices, what to notice (stuck queues,
/// devices not counted, caveats), the other drops by reason.
#[must_use]
pub(crate) fn status(report: &Report, width: Option<usize>) -> String {
    let notices = notices(report).iter().fold(String::new(), |mut out, n| {
        let _ = write!(out, "; {n}");
        out
    });
    if report.rows.is_empty() {
        return clip_to(
            &format!(
                "{:.1} s since attach; no matching device now{notices}",
                report.elapsed_s
            ),
            width,
        );
    }
    let devices = lines(report).iter().filter(|l| !l.under).count();
    let mut text = format!(
        "{:.1} s since attach, {devices} device{}",
        report.elapsed_s,
        if devices == 1 { "" } else { "s" }
    );
    text.push_str(&notices);
    let reasons = reasons(report);
    if !reasons.is_empty() {
        let _ = write!(text, "; other drops: {}", reasons.join(", "));
    }
    clip_to(&text, width)
}

/// `dropped_other` by reason, as `device/qN: reason count`.
fn reasons(report: &Report) -> Vec<String> {
    report
        .rows
        .iter()
        .flat_map(|r| {
            r.drop_reasons
                .iter()
                .map(move |(k, v)| format!("{}/q{}: {k} {v}", r.ifname, r.queue))
        })
        .collect()
}

fn clip_to(text: &str, width: Option<usize>) -> String {
    width.map_or_else(|| text.to_owned(), |w| clip(text, w))
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::columns::{COLUMNS, defaults};
    use crate::output::lines::tests::{report, row};

    /// A busy host: long names, a folded multi-queue device, owners, a gone device, other
    /// drops; one refresh after another.
    fn two_reports() -> (Report, Report) {
        let mut before = vec![
            row("tp-load0", 0, 0, 0),
            row("vnet-with-a-long-name", 0, 0, 0),
            row("tapmq", 0, 0, 0),
            row("tapmq", 1, 0, 0),
        ];
        before[1].netns = "vm-namespace-of-a-long-name".to_owned();
        let mut now = before.clone();
        now[0].counters.consumed = 20_123;
        now[0].counters.dropped_full_ring = 80_456;
        now[1].counters.consumed = 1_234_567;
        now[2].counters.busy = 77;
        now[3].stopped = true;
        now[3].counters.stopped_ns = 500_000_000;
        now[3].drop_reasons.insert("xmit_error".to_owned(), 3);
        let mut gone = row("tp-gone", 0, 10, 1);
        gone.retired = true;
        now.push(gone);
        (report(1.0, before), report(2.0, now))
    }

    fn assert_fits(lines: &[String], width: usize) {
        for line in lines {
            assert!(
                line.chars().count() <= width,
                "{} > {width}: {line:?}\n{}",
                line.chars().count(),
                lines.join("\n")
            );
        }
    }

    #[test]
    fn every_line_fits_and_keeps_device_delivered_and_ring_drops() {
        let (before, now) = two_reports();
        for width in [80, 100, 120] {
            for columns in [defaults(), COLUMNS.iter().collect()] {
                let lines = frame(&now, Some(&before), &columns, Some(width), None);
                assert_fits(&lines, width);
                let text = lines.join("\n");
                assert!(
                    lines[0].contains("DELIVERED/s") || lines[0].contains("DELIV/s"),
                    "{text}"
                );
                assert!(
                    lines[0].contains("RING_DROPS/s") || lines[0].contains("RDROP/s"),
                    "{text}"
                );
                let load = lines.iter().find(|l| l.starts_with("tp-load0")).unwrap();
                assert!(load.contains("20123") && load.contains("80456"), "{text}");
                assert!(text.contains("vnet-with"), "{text}");
                assert!(text.contains("tp-gone (gone)"), "{text}");
                assert!(text.contains("xmit_error 3"), "{text}");
                let totals = totals(&now, &columns, Some(width));
                assert_fits(&totals, width);
                assert!(totals.join("\n").contains("80456"));
            }
        }
    }

    #[test]
    fn defaults_at_120_columns_show_every_default_column_in_full() {
        let (before, now) = two_reports();
        let lines = frame(&now, Some(&before), &defaults(), Some(120), None);
        for column in defaults() {
            assert!(
                lines[0].contains(&column.header(false, true)),
                "{}:\n{}",
                column.name,
                lines.join("\n")
            );
        }
    }

    #[test]
    fn narrow_windows_shorten_then_drop_then_cut() {
        let (before, now) = two_reports();
        let all: Vec<&Column> = COLUMNS.iter().collect();
        let grid = Grid::new(&now, Some(&before), &all, Mode::Rates);
        let wide = grid.fit(None);
        assert_eq!(wide.shown.len(), all.len());
        let mut shown = wide.shown.len();
        for width in (20..200).rev() {
            let fit = grid.fit(Some(width));
            assert!(fit.shown.len() <= shown, "fewer columns as it narrows");
            shown = fit.shown.len();
            let names: Vec<&str> = fit.shown.iter().map(|&i| grid.columns[i].name).collect();
            for kept in ["device", "delivered", "ring-drops"] {
                assert!(names.contains(&kept), "{width}: {names:?}");
            }
            assert_fits(&grid.render(&fit, &grid.lines), width);
        }
        // At 30 columns the device names are cut, not wrapped.
        let fit = grid.fit(Some(30));
        let text = grid.render(&fit, &grid.lines).join("\n");
        assert!(text.contains('…'), "{text}");
    }

    #[test]
    fn queues_fold_under_their_device_and_stops_show() {
        let (before, now) = two_reports();
        let lines = frame(&now, Some(&before), &defaults(), Some(120), None);
        let at = lines.iter().position(|l| l.starts_with("tapmq")).unwrap();
        assert!(lines[at].contains("all"), "{}", lines.join("\n"));
        assert!(lines[at].contains("now"), "a queue of it is stopped");
        assert!(lines[at + 1].starts_with("  q0"));
        assert!(lines[at + 2].starts_with("  q1") && lines[at + 2].contains("now"));
        // Queue 0 was not stopped; the share is of the interval.
        assert!(lines[at + 1].contains("0%"), "{}", lines[at + 1]);
    }

    #[test]
    fn the_first_refresh_has_no_rates_and_the_summary_totals() {
        let (_, now) = two_reports();
        let lines = frame(&now, None, &defaults(), Some(100), None);
        let load = lines.iter().find(|l| l.starts_with("tp-load0")).unwrap();
        assert!(load.contains(" -"), "{load}");
        let totals = totals(&now, &defaults(), Some(100));
        assert!(totals[0].contains("DELIVERED") && !totals[0].contains("/s"));
        let tapmq = totals.iter().find(|l| l.starts_with("tapmq")).unwrap();
        assert!(tapmq.contains("0.5s"), "{tapmq}");
    }

    #[test]
    fn a_short_window_counts_the_lines_it_leaves_out() {
        let (before, now) = two_reports();
        let lines = frame(&now, Some(&before), &defaults(), Some(80), Some(5));
        assert_eq!(lines.len(), 5, "{lines:#?}");
        assert!(lines[3].contains("more lines"), "{lines:#?}");
        assert!(lines[4].contains("since attach"));
    }
}
