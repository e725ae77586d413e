//! A status line for commands that run long (`record`, `bench`, `check`): one line on
//! stderr, redrawn in place at most a few times a second, cleared at the end. It says
//! nothing when stderr is not a terminal, so logs and pipes get only the results.
//!
//! ```ignore
//! let mut progress = Progress::stderr();
//! for (i, cell) in cells.iter().enumerate() {
//!     progress.note(&format!("cell {}: {}", i + 1, cell.name)); // a line that stays
//!     while running {
//!         progress.update(&Status {
//!             what: &cell.name,
//!             step: Some((i as u64, cells.len() as u64)),
//!             left: Some(time_left),
//!             detail: &format!("{} packets", sent),
//!         });
//!     }
//! }
//! progress.finish();
//! ```

use std::fmt::Write as _;
use std::io::Write as _;
use std::time::{Duration, Instant};

use crate::output::compact::clip;

/// What a long command is doing now.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Status<'a> {
    /// What runs: `recording`, a scenario's name, a benchmark's cell.
    pub(crate) what: &'a str,
    /// Steps done out of all (a bar), when the work comes in steps (cells, scenarios).
    pub(crate) step: Option<(u64, u64)>,
    /// Time left, when known (a `--duration`, the runs still to go).
    pub(crate) left: Option<Duration>,
    /// Figures so far: events and bytes written, packets lost.
    pub(crate) detail: &'a str,
}

/// How often the line is redrawn at most.
const EVERY: Duration = Duration::from_millis(200);
/// The width of the bar of steps.
const BAR: u64 = 20;

/// The status line of one command.
#[derive(Debug)]
pub(crate) struct Progress {
    /// Off when stderr is not a terminal.
    on: bool,
    started: Instant,
    drawn: Option<Instant>,
}

impl Progress {
    /// On stderr, when stderr is a terminal; quiet otherwise.
    #[must_use]
    pub(crate) fn stderr() -> Self {
        Self {
            on: crate::output::term::interactive(&std::io::stderr()),
            started: Instant::now(),
            drawn: None,
        }
    }

    /// Shows `status`, unless the line was drawn less than [`EVERY`] ago. Cheap to call
    /// in a loop.
    pub(crate) fn update(&mut self, status: &Status<'_>) {
        if !self.on || self.drawn.is_some_and(|d| d.elapsed() < EVERY) {
            return;
        }
        self.drawn = Some(Instant::now());
        let width = crate::output::term::size(&std::io::stderr()).map_or(80, |(w, _)| w);
        let text = line(status, self.started.elapsed(), width);
        self.write(&format!("\r\x1b[K{text}"));
    }

    /// Prints `text` on a line of its own above the status line, which the next update
    /// redraws. Also when stderr is not a terminal: a note is part of the record.
    pub(crate) fn note(&mut self, text: &str) {
        self.clear();
        self.write(&format!("{text}\n"));
    }

    /// Clears the status line; later output starts on a clean line.
    pub(crate) fn finish(&mut self) {
        self.clear();
    }

    fn clear(&mut self) {
        if self.drawn.take().is_some() {
            self.write("\r\x1b[K");
        }
    }

    /// Writes to stderr. A status line is not worth an error, the command's results are
    /// what matters; but a terminal that hung up (`EIO`) stops the run, as a signal would.
    fn write(&self, text: &str) {
        if let Err(err) = std::io::stderr().lock().write_all(text.as_bytes())
            && self.on
            && err.raw_os_error() == Some(libc::EIO)
        {
            tap_probe_observer::os::signals::end(
                tap_probe_observer::os::signals::Why::TerminalGone,
            );
        }
    }
}

impl Drop for Progress {
    fn drop(&mut self) {
        self.clear();
    }
}

/// The status line, at most `width - 1` characters (the last column would make some
/// terminals wrap).
#[must_use]
pub(crate) fn line(status: &Status<'_>, elapsed: Duration, width: usize) -> String {
    let mut parts = vec![status.what.to_owned()];
    if let Some((done, all)) = status.step {
        let done = done.min(all);
        let filled = (done * BAR).checked_div(all).unwrap_or(0);
        parts.push(format!(
            "[{}{}] {done}/{all}",
            "#".repeat(usize::try_from(filled).unwrap_or(0)),
            "-".repeat(usize::try_from(BAR - filled).unwrap_or(0))
        ));
    }
    let mut time = clock(elapsed);
    if let Some(left) = status.left {
        let _ = write!(time, ", {} left", clock(left));
    }
    parts.push(time);
    if !status.detail.is_empty() {
        parts.push(status.detail.to_owned());
    }
    clip(&parts.join("  "), width.saturating_sub(1))
}

/// A duration as `m:ss` (or `h:mm:ss`), rounded up to the second.
fn clock(d: Duration) -> String {
    let s = d.as_secs() + u64::from(d.subsec_nanos() > 0);
    if s >= 3600 {
        format!("{}:{:02}:{:02}", s / 3600, s / 60 % 60, s % 60)
    } else {
        format!("{}:{:02}", s / 60, s % 60)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_line_has_the_step_the_time_left_and_the_figures() {
        let status = Status {
            what: "fq_codel with backpressure",
            step: Some((3, 8)),
            left: Some(Duration::from_millis(72_500)),
            detail: "50.0k packets",
        };
        assert_eq!(
            line(&status, Duration::from_secs(5), 120),
            "fq_codel with backpressure  [#######-------------] 3/8  0:05, 1:13 left  \
             50.0k packets"
        );
        let narrow = line(&status, Duration::from_secs(5), 40);
        assert_eq!(narrow.chars().count(), 39);
        assert!(narrow.ends_with('…'));
    }

    #[test]
    fn a_line_without_steps_or_end() {
        let status = Status {
            what: "recording",
            detail: "1.2M events, 34.5 MB, 0 lost",
            ..Status::default()
        };
        assert_eq!(
            line(&status, Duration::from_secs(3725), 80),
            "recording  1:02:05  1.2M events, 34.5 MB, 0 lost"
        );
    }
}
