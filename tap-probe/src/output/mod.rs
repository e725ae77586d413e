//! What tap-probe shows: tables for people (`table`; `compact`, which fits the window,
//! from `columns` and `lines`, explained once by `legend`; what to notice besides the
//! counts, worded once in `notices`), the full-screen view (`tui`),
//! JSON for programs (`json`), the Prometheus exposition (`prometheus`), a status line
//! for long commands (`progress`), log lines for people or journald (`logging`), and
//! [`Output`], which shows `watch`'s refreshes in the chosen format.
//!
//! [`stdout`] is the one way results reach stdout. A reader that went away (`tap-probe ...
//! | head`) makes writes fail with `EPIPE` (Rust ignores SIGPIPE), a terminal that hung up
//! with `EIO`; either stops the run as a signal would ([`tap_probe_observer::os::signals::end`]) and is
//! [`StdoutClosed`], which ends the command without an error message or a panic.

pub(crate) mod columns;
pub(crate) mod compact;
pub(crate) mod json;
pub(crate) mod legend;
pub(crate) mod lines;
pub(crate) mod logging;
pub(crate) mod notices;
pub(crate) mod progress;
pub(crate) mod prometheus;
pub(crate) mod table;
pub(crate) mod term;
pub(crate) mod tui;

use std::cell::RefCell;
use std::fmt::Write as _;
use std::io::Write as _;
use std::os::fd::AsFd as _;
use std::time::{Duration, Instant};

use nix::poll::PollFlags;

use crate::output::columns::Column;
use crate::output::lines::Gone;
use crate::output::table::{Align, Table};
use tap_probe_observer::host::report::Report;
use tap_probe_observer::os::signals::{Stop, Why, Woke};

/// How a subcommand prints its results (`--format`).
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub(crate) enum Format {
    /// Aligned text for people (`watch` redraws it in place on a terminal).
    #[default]
    Table,
    /// JSON for programs (`watch`: one object per line and refresh).
    Json,
}

/// Stdout's other end went away: its reader, or its terminal.
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
/// [`StdoutClosed`] when the reader or the terminal went away (the run is then stopping);
/// the I/O error otherwise.
pub(crate) fn stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(err) => Err(stdout_failed(err)),
    }
}

/// Waits `wait` for the next refresh; true, sooner, when the run is to stop: also when
/// stdout's other end goes away meanwhile (a terminal that hangs up, a pipe's reader
/// that leaves), which `poll` tells at once however long the interval.
pub(crate) fn sleep(stop: &Stop, wait: Duration) -> bool {
    let end = Instant::now() + wait;
    let stdout = std::io::stdout();
    // Only an open stdout is watched: a closed one (`>&-`) polls POLLNVAL at once,
    // every time, and writes to it go nowhere anyway.
    let watched = nix::fcntl::fcntl(&stdout, nix::fcntl::FcntlArg::F_GETFD).is_ok();
    loop {
        let left = end.saturating_duration_since(Instant::now());
        // No events asked for: poll reports POLLHUP and POLLERR regardless.
        match stop.wait(watched.then(|| (stdout.as_fd(), PollFlags::empty())), left) {
            Woke::Stopped => return true,
            Woke::Ready(_) => {
                tap_probe_observer::os::signals::end(if stdout_is_char_device() {
                    Why::TerminalGone
                } else {
                    Why::OutputClosed
                });
                return true;
            }
            Woke::Timeout if left.is_zero() || Instant::now() >= end => return false,
            Woke::Timeout => {}
        }
    }
}

/// What a failed write to stdout means: a lost reader or terminal stops the run and is
/// [`StdoutClosed`]; anything else (a full disk) is an error of its own.
pub(crate) fn stdout_failed(err: std::io::Error) -> anyhow::Error {
    let why = match err.raw_os_error() {
        Some(libc::EPIPE) => Why::OutputClosed,
        // A hung-up terminal answers writes with EIO (`hung_up_tty_write`); a file on a
        // failing disk may too, so only a character device counts as a terminal gone.
        Some(libc::EIO) if stdout_is_char_device() => Why::TerminalGone,
        _ => return anyhow::Error::new(err).context("writing to stdout"),
    };
    tap_probe_observer::os::signals::end(why);
    StdoutClosed.into()
}

/// Whether stdout is a character device (a terminal, hung up or not; `isatty` fails on a
/// hung-up one).
fn stdout_is_char_device() -> bool {
    use nix::sys::stat::SFlag;
    use std::os::fd::AsFd as _;
    nix::sys::stat::fstat(std::io::stdout().as_fd()).is_ok_and(|st| {
        SFlag::from_bits_truncate(st.st_mode & SFlag::S_IFMT.bits()) == SFlag::S_IFCHR
    })
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
    /// run included, in the table (marked gone) and in the JSON object (`"retired": true`),
    /// with the counts each had when it went.
    ///
    /// # Errors
    /// When stdout is closed.
    pub(crate) fn summary(&self, report: &Report) -> anyhow::Result<()> {
        self.remember(report);
        let shown = self.shown.borrow();
        let all = shown.gone.added_to(report);
        if self.format == Format::Json {
            return crate::output::stdout(&json::json_line(&all, true)?);
        }
        let (width, _) = self.size();
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
        if report.programs.is_some()
            && let Some(memory) = &report.memory
        {
            push_lines(&mut t, &memory_lines(memory));
        }
        crate::output::stdout(&t)
    }
}

/// What the probe's maps hold of the kernel's memory, for people: the total, what the same
/// maps would take on a host with 256 CPUs, and the maps that hold most.
pub(crate) fn memory_lines(memory: &tap_probe_observer::bpf::probe::Memory) -> Vec<String> {
    use tap_probe_common::units::bytes;
    let chunks: Vec<_> = memory
        .maps
        .iter()
        .filter(|m| m.name.starts_with("chunk "))
        .collect();
    let mut out = vec![format!(
        "kernel memory: {} in {} maps ({} possible CPUs); {} with 256 CPUs",
        bytes(memory.bytes()),
        memory.maps.len(),
        memory.possible_cpus,
        bytes(memory.bytes_at(256)),
    )];
    if !chunks.is_empty() {
        out.push(format!(
            "  per-queue chunks: {} maps, {} ({} of it per CPU)",
            chunks.len(),
            bytes(chunks.iter().map(|m| m.bytes).sum()),
            bytes(
                chunks.iter().map(|m| m.per_cpu_bytes).sum::<u64>() * memory.possible_cpus as u64
            ),
        ));
    }
    let mut largest: Vec<_> = memory
        .maps
        .iter()
        .filter(|m| !m.name.starts_with("chunk "))
        .collect();
    largest.sort_by_key(|m| std::cmp::Reverse(m.bytes));
    for m in largest.iter().take(5) {
        out.push(format!("  {}: {}", m.name, bytes(m.bytes)));
    }
    out
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
    use tap_probe_observer::bpf::missed::ProgramMissed;
    use tap_probe_observer::kernel::modules::{Change, ModuleChange};

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

    /// A report whose programs the kernel skipped says its counts may be short, per
    /// program: in the table, the status line, the JSON and the Prometheus text.
    #[test]
    fn skipped_program_runs_are_shown_per_program_and_mark_the_counts_short() {
        let mut report = lines::tests::report(1.0, vec![lines::tests::row("tap0", 0, 1, 0)]);
        report.missed = vec![
            ProgramMissed {
                program: "consume_entry".to_owned(),
                runs: Some(0),
                kprobe: Some(0),
            },
            ProgramMissed {
                program: "kfree_skb".to_owned(),
                runs: Some(0),
                kprobe: None,
            },
        ];
        let json: serde_json::Value =
            serde_json::from_str(&json::json_line(&report, false).unwrap()).unwrap();
        assert_eq!(json["counts_may_be_short"], false);
        assert_eq!(json["missed"][0]["program"], "consume_entry");
        assert!(!table::rows(&report, None).contains("SHORT"));

        report.missed[0].kprobe = Some(2);
        report.missed[1].runs = Some(5);
        let table = table::rows(&report, None);
        assert!(
            table.contains(
                "COUNTS MAY BE SHORT: the kernel skipped program runs: consume_entry 2, kfree_skb 5"
            ),
            "{table}"
        );
        let status = compact::status(&report, None);
        assert!(status.contains("COUNTS MAY BE SHORT"), "{status}");
        let json: serde_json::Value =
            serde_json::from_str(&json::json_line(&report, false).unwrap()).unwrap();
        assert_eq!(json["counts_may_be_short"], true);
        assert_eq!(json["missed"][0]["kprobe"], 2);
        assert_eq!(json["missed"][1]["runs"], 5);
        let text = prometheus::exposition(&report, prometheus::Series::default());
        for sample in [
            r#"tap_probe_missed_total{program="consume_entry",why="recursion"} 0"#,
            r#"tap_probe_missed_total{program="consume_entry",why="kprobe"} 2"#,
            r#"tap_probe_missed_total{program="kfree_skb",why="recursion"} 5"#,
        ] {
            assert!(text.lines().any(|l| l == sample), "{sample} in\n{text}");
        }
    }

    /// Where the kernel does not count the runs it skips (before Linux 5.12), the misses are
    /// unknown, not 0: `null` in the JSON, no sample in the Prometheus text, and the sources
    /// say so wherever they are shown.
    #[test]
    fn misses_the_kernel_does_not_count_are_unknown_not_zero() {
        let mut report = lines::tests::report(1.0, vec![lines::tests::row("tap0", 0, 1, 0)]);
        report.missed = vec![ProgramMissed {
            program: "kfree_skb".to_owned(),
            runs: None,
            kprobe: None,
        }];
        report.sources.misses.runs = false;
        let json: serde_json::Value =
            serde_json::from_str(&json::json_line(&report, false).unwrap()).unwrap();
        assert_eq!(json["missed"][0]["runs"], serde_json::Value::Null);
        let said = json["sources"]["missed"].as_str().unwrap();
        assert!(
            said.starts_with("unknown: this kernel does not count"),
            "{said}"
        );
        let text = prometheus::exposition(&report, prometheus::Series::default());
        assert!(!text.contains(r#"why="recursion"} "#), "{text}");
        assert!(
            text.lines().any(|l| l.starts_with(
                r#"tap_probe_source_info{counters="missed",source="unknown: this kernel"#
            )),
            "{text}"
        );
        let legend = legend::wide(&report.sources, None).join("\n");
        assert!(legend.contains("skipped runs: unknown"), "{legend}");
    }

    /// A module that changed since attach is shown in the table and the Prometheus text.
    #[test]
    fn a_module_changed_since_attach_is_shown() {
        let mut report = lines::tests::report(1.0, vec![lines::tests::row("tap0", 0, 1, 0)]);
        report.modules_changed = vec![ModuleChange {
            module: "veth",
            change: Change::Loaded,
        }];
        let table = table::rows(&report, None);
        assert!(table.contains("veth.ko loaded since attach"), "{table}");
        assert!(
            prometheus::exposition(&report, prometheus::Series::default())
                .contains("\ntap_probe_modules_changed 1\n")
        );
    }
}
