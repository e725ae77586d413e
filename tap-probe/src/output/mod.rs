//! What tap-probe shows: tables for people (`table`; `compact`, which fits the window,
//! from `columns` and `lines`, explained once by `legend`), the full-screen view (`tui`),
//! JSON for programs (`json`), the Prometheus exposition (`prometheus`), a status line
//! for long commands (`progress`), log lines for people or journald (`logging`), and
//! [`Output`], which shows `watch`'s refreshes in the chosen format.
//!
//! [`stdout`] is the one way results reach stdout. A reader that went away (`tap-probe ...
//! | head`) makes writes fail with `EPIPE` (Rust ignores SIGPIPE); that is
//! [`StdoutClosed`], which ends the program quietly instead of with an error or a panic.

pub(crate) mod columns;
pub(crate) mod compact;
pub(crate) mod json;
pub(crate) mod legend;
pub(crate) mod lines;
pub(crate) mod logging;
pub(crate) mod progress;
pub(crate) mod prometheus;
pub(crate) mod table;
pub(crate) mod term;
pub(crate) mod tui;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;

use crate::cli::Format;
use crate::host::report::Report;
use crate::output::columns::Column;
use crate::output::lines::Gone;
use crate::output::table::{Align, Table};

/// Stdout was closed by its reader.
#[derive(Debug)]
pub(crate) struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to stdout and flushes it.
///
/// # Errors
/// [`StdoutClosed`] when the reader went away; the I/O error otherwise.
pub(crate) fn stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(err) => Err(anyhow::Error::new(err).context("writing to stdout")),
    }
}

/// Whether `err` is, or was caused by, [`StdoutClosed`].
#[must_use]
pub(crate) fn is_closed_stdout(err: &anyhow::Error) -> bool {
    err.chain().any(<dyn std::error::Error>::is::<StdoutClosed>)
}

/// How `watch` shows its table.
#[derive(Clone, Debug)]
pub(crate) enum View {
    /// These columns, fitted to the window.
    Compact(Vec<&'static Column>),
    /// Every counter in a column, however wide.
    Wide,
}

/// Shows `watch`'s refreshes and its final summary.
///
/// On a terminal the table is redrawn in place below the legend: the cursor goes back up
/// over the last frame, which is cleared, so the legend stays above it, nothing is left
/// to restore on exit, and the summary follows the last frame. Frames are cut to the
/// window's height, so the lines to go back over are all on the screen.
pub(crate) struct Output {
    format: Format,
    view: View,
    terminal: bool,
    shown: RefCell<Shown>,
}

/// What has been shown so far.
#[derive(Debug, Default)]
struct Shown {
    legend: bool,
    /// The terminal's lines the last frame took, and the width it was drawn for.
    frame: Option<(usize, Option<usize>)>,
    gone: Gone,
}

impl Output {
    /// The compact table with its default columns (or JSON).
    #[must_use]
    pub(crate) fn new(format: Format) -> Self {
        Self::with_view(format, View::Compact(columns::defaults()))
    }

    #[must_use]
    pub(crate) fn with_view(format: Format, view: View) -> Self {
        Self {
            format,
            view,
            terminal: crate::output::term::interactive(&std::io::stdout()),
            shown: RefCell::default(),
        }
    }

    /// Keeps what the final summary needs of a refresh that is not shown here (the
    /// full-screen view shows it): the devices that went away.
    pub(crate) fn remember(&self, report: &Report) {
        self.shown.borrow_mut().gone.keep(report);
    }

    /// The window's width, and its height where frames are redrawn in place; the width
    /// asked for (`$COLUMNS`) when stdout is no terminal or one of unknown size (a serial
    /// line). A terminal that cannot redraw (`TERM=dumb`) still has a width to fit.
    fn size(&self) -> (Option<usize>, Option<usize>) {
        match term::size(&std::io::stdout()) {
            Some((width, height)) => (Some(width), self.terminal.then_some(height)),
            None => (term::columns_env(), None),
        }
    }

    /// Shows one refresh; `previous` gives the rates.
    ///
    /// # Errors
    /// When stdout is closed.
    pub(crate) fn show(&self, report: &Report, previous: Option<&Report>) -> anyhow::Result<()> {
        self.remember(report);
        if self.format == Format::Json {
            return crate::output::stdout(&json::json_line(report, false)?);
        }
        let (width, height) = self.size();
        let mut shown = self.shown.borrow_mut();
        let mut text = String::new();
        if !shown.legend {
            shown.legend = true;
            let legend = match &self.view {
                View::Compact(columns) => legend::legend(columns, &report.sources, width),
                View::Wide => legend::wide(&report.sources, width),
            };
            push_lines(&mut text, &legend);
        }
        if let (true, Some((lines, drawn_for))) = (self.terminal, shown.frame) {
            if drawn_for == width {
                // Back to the first line of the last frame, and clear from there down.
                let _ = write!(text, "\x1b[{lines}F\x1b[J");
            } else {
                // The terminal may have rewrapped the old frame: start on a clear screen.
                text.push_str("\x1b[H\x1b[2J");
            }
        }
        let frame: Vec<String> = match &self.view {
            View::Compact(columns) => compact::frame(report, previous, columns, width, height),
            View::Wide => table::rows(report, previous)
                .lines()
                .map(str::to_owned)
                .collect(),
        };
        push_lines(&mut text, &frame);
        shown.frame = Some((terminal_lines(&frame, width), width));
        drop(shown);
        crate::output::stdout(&text)
    }

    /// The final summary after detaching: totals, the devices that went away during the
    /// run included (the JSON object has the last refresh's rows, as every refresh).
    ///
    /// # Errors
    /// When stdout is closed.
    pub(crate) fn summary(&self, report: &Report) -> anyhow::Result<()> {
        if self.format == Format::Json {
            return crate::output::stdout(&json::json_line(report, true)?);
        }
        self.remember(report);
        let (width, _) = self.size();
        let shown = self.shown.borrow();
        let all = shown.gone.added_to(report);
        let gone = shown.gone.devices();
        let mut t = format!("\nFinal counters after {:.1} s", report.elapsed_s);
        if gone > 0 {
            let _ = write!(
                t,
                " ({gone} device{} went away, marked gone)",
                if gone == 1 { "" } else { "s" }
            );
        }
        t.push_str(":\n");
        match &self.view {
            View::Compact(columns) => {
                if all.rows.is_empty() {
                    t.push_str("(no matching device)\n");
                } else {
                    push_lines(&mut t, &compact::totals(&all, columns, width));
                }
            }
            View::Wide => t.push_str(&table::rows(&all, None)),
        }
        let mut programs = Table::new(&[Align::Left, Align::Left, Align::Right]);
        for p in report.programs.iter().flatten() {
            programs.row(vec![
                "program".to_owned(),
                p.program.clone(),
                format!("{} runs", p.runs),
                format!("{} ns/run", p.mean_ns),
            ]);
        }
        let programs = programs.render();
        let programs: Vec<String> = programs
            .lines()
            .map(|l| width.map_or_else(|| l.to_owned(), |w| compact::clip(l, w)))
            .collect();
        push_lines(&mut t, &programs);
        crate::output::stdout(&t)
    }
}

fn push_lines(text: &mut String, lines: &[String]) {
    for line in lines {
        text.push_str(line);
        text.push('\n');
    }
}

/// The terminal lines `lines` take at `width`: a longer line wraps onto several.
fn terminal_lines(lines: &[String], width: Option<usize>) -> usize {
    lines
        .iter()
        .map(|l| match width {
            Some(w) => l.chars().count().div_ceil(w).max(1),
            None => 1,
        })
        .sum()
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_long_line_takes_several_terminal_lines() {
        let lines = ["a".repeat(80), "b".repeat(81), String::new()];
        assert_eq!(terminal_lines(&lines, Some(80)), 1 + 2 + 1);
        assert_eq!(terminal_lines(&lines, None), 3);
    }

    #[test]
    fn closed_stdout_is_found_under_context() {
        let err = anyhow::Error::new(StdoutClosed).context("showing a refresh");
        assert!(is_closed_stdout(&err));
        assert!(!is_closed_stdout(&anyhow::anyhow!("other")));
    }
}
