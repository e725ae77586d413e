//! What tap-probe shows: tables for people (`table`), JSON for programs (`json`), the
//! Prometheus exposition (`prometheus`), and [`Output`], which shows `watch`'s refreshes in
//! the chosen format.
//!
//! [`stdout`] is the one way results reach stdout. A reader that went away (`tap-probe ...
//! | head`) makes writes fail with `EPIPE` (Rust ignores SIGPIPE); that is
//! [`StdoutClosed`], which ends the program quietly instead of with an error or a panic.

pub(crate) mod json;
pub(crate) mod prometheus;
pub(crate) mod table;

use std::io::IsTerminal as _;
use std::io::Write as _;

use crate::cli::Format;
use crate::host::report::Report;
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
            Format::Json => json::json_line(report, false)?,
            Format::Table => {
                let mut t = String::new();
                if self.redraw {
                    // Home the cursor and clear the screen: a plain redraw, no raw mode or
                    // alternate screen, so there is nothing to restore on exit.
                    t.push_str("\x1b[H\x1b[2J");
                }
                t.push_str(&table::rows(report, previous));
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
            Format::Json => json::json_line(report, true)?,
            Format::Table => {
                let mut t = format!(
                    "\nFinal counters after {:.1} s:\n{}",
                    report.elapsed_s,
                    table::rows(report, None)
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

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_stdout_is_found_under_context() {
        let err = anyhow::Error::new(StdoutClosed).context("showing a refresh");
        assert!(is_closed_stdout(&err));
        assert!(!is_closed_stdout(&anyhow::anyhow!("other")));
    }
}
