//! What a test said, read from its own process's output: each test runs alone (on the host
//! and in a guest), so every line it printed is its own, and nothing of libtest's report
//! around it is read. The lines kept are the JSON lines of `tap-probe-verdict`, read back
//! as its types:
//! - `skip: {...}`: the test (or a part of it) cannot run here, and why
//!   ([`tap_probe_verdict::Skip`]);
//! - `retry: {...}`: the test ran its scenario again, and why
//!   ([`tap_probe_verdict::Retry`]);
//! - `oracle: {...}`: the checks it made against an oracle ([`tap_probe_verdict::Tally`],
//!   see `tap-probe/tests/privileged/common/oracle.rs`);
//!
//! and the standard panic hook's `thread 'NAME' (TID) panicked at FILE:LINE:COL:` with the
//! message's first lines, in a failed test's output: where and why it failed, for the
//! last line of a failed run.

use std::fmt;

use tap_probe_verdict::{Retry, Skip, Tally};

/// One thing a test said that the summary keeps, and which test said it.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Said<T> {
    /// `LABEL::TEST`.
    pub(crate) test: String,
    pub(crate) what: T,
}

impl<T: fmt::Display> fmt::Display for Said<T> {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(f, "{}: {}", self.test, self.what)
    }
}

/// Everything one or more test binaries said.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct Output {
    pub(crate) skips: Vec<Said<Skip>>,
    pub(crate) retries: Vec<Said<Retry>>,
    pub(crate) tallies: Vec<Said<Tally>>,
    /// Lines that start like one of the test's JSON lines but do not read as one, and why.
    pub(crate) malformed: Vec<Said<String>>,
    /// Per failed test, where it panicked and the message's first lines.
    pub(crate) panics: Vec<Said<String>>,
}

impl Output {
    pub(crate) fn extend(&mut self, other: Self) {
        self.skips.extend(other.skips);
        self.retries.extend(other.retries);
        self.tallies.extend(other.tallies);
        self.malformed.extend(other.malformed);
        self.panics.extend(other.panics);
    }

    /// The panics, one per test, for an error message: `LABEL::TEST: panicked at ...: MESSAGE`.
    pub(crate) fn failures(&self) -> String {
        let panics: Vec<String> = self.panics.iter().map(ToString::to_string).collect();
        panics.join("; ")
    }
}

/// What the test `test` (`LABEL::TEST`) said in `lines`, its process's output.
pub(crate) fn read<S: AsRef<str>>(test: &str, lines: &[S]) -> Output {
    let mut out = Output::default();
    let mut lines = lines.iter().map(AsRef::as_ref).peekable();
    while let Some(line) = lines.next() {
        let trimmed = line.trim_start();
        if let Some(at) = panicked_at(trimmed) {
            // The message's first lines (an assert_eq's left and right), each cut short.
            let mut message = vec![format!("panicked at {at}")];
            while message.len() <= PANIC_LINES {
                let Some(next) = lines.next_if(|next| !ends_panic_message(next)) else {
                    break;
                };
                message.push(next.trim().chars().take(PANIC_LINE_CHARS).collect());
            }
            out.panics.push(Said {
                test: test.to_owned(),
                what: message.join(" "),
            });
        } else if let Some(json) = trimmed.strip_prefix(tap_probe_verdict::SKIP_PREFIX) {
            keep(
                &mut out.skips,
                &mut out.malformed,
                test,
                line,
                Skip::parse(json),
            );
        } else if let Some(json) = trimmed.strip_prefix(tap_probe_verdict::RETRY_PREFIX) {
            keep(
                &mut out.retries,
                &mut out.malformed,
                test,
                line,
                Retry::parse(json),
            );
        } else if let Some(json) = trimmed.strip_prefix(tap_probe_verdict::PREFIX) {
            keep(
                &mut out.tallies,
                &mut out.malformed,
                test,
                line,
                Tally::parse(json),
            );
        }
    }
    out
}

/// What `test` said in `line`, read as `read` says: kept, or malformed and why.
fn keep<T, E: fmt::Display>(
    kept: &mut Vec<Said<T>>,
    malformed: &mut Vec<Said<String>>,
    test: &str,
    line: &str,
    read: Result<T, E>,
) {
    match read {
        Ok(what) => kept.push(Said {
            test: test.to_owned(),
            what,
        }),
        Err(e) => malformed.push(Said {
            test: test.to_owned(),
            what: format!("{}: {e}", line.trim()),
        }),
    }
}

/// How much of a panic's message an error line carries.
const PANIC_LINES: usize = 3;
const PANIC_LINE_CHARS: usize = 200;

/// Whether `line`, after a panic's message, is no longer part of it.
fn ends_panic_message(line: &str) -> bool {
    let line = line.trim();
    line.is_empty()
        || ["stack backtrace:", "note: ", "---- ", "thread '"]
            .iter()
            .any(|start| line.starts_with(start))
}

/// `FILE:LINE:COL:` of the standard panic hook's `thread 'NAME' (TID) panicked at
/// FILE:LINE:COL:`.
fn panicked_at(line: &str) -> Option<&str> {
    let rest = line.strip_prefix("thread '")?;
    let (_, at) = rest.split_once(" panicked at ")?;
    Some(at)
}

#[cfg(test)]
mod tests {
    use tap_probe_verdict::{Oracle, Outcome};

    use super::*;

    #[test]
    fn a_tests_lines_are_its_own() {
        let lines = [
            "running 1 test",
            "test b ... ok",
            "---- b stdout ----",
            "kernel tx_dropped 3",
            // Words alone are not read: a test says what it skipped as a JSON line.
            "skipping test - in words",
            r#"skip: {"part":"backend Kprobe","why":"no kprobes"}"#,
            r#"retry: {"scenario":"ro-rq","attempt":1,"attempts":3,"why":"every backend short"}"#,
            r#"skip: {"what":"backend Kprobe"}"#,
            r#"oracle: {"outcome":"exact","count":12,"oracle":"device-stats","backend":"tracepoint"}"#,
            r#"oracle: {"outcome":"bound","count":2,"oracle":"reader","backend":"kprobe"}"#,
            r#"oracle: {"outcome":"gated","count":3,"oracle":"qdisc","backend":null,"why":"the kernel skipped runs - of its programs"}"#,
            r#"oracle: {"outcome":"gated","count":3,"oracle":"qdisc","backend":"kprobe"}"#,
            r#"oracle: {"outcome":"exact","count":"many","oracle":"qdisc","backend":"kprobe"}"#,
            "test result: ok. 1 passed; 0 failed",
        ];
        let out = read("exactness::b", &lines);
        let skips: Vec<String> = out.skips.iter().map(ToString::to_string).collect();
        assert_eq!(
            skips,
            ["exactness::b: skipping backend Kprobe - no kprobes"]
        );
        let retries: Vec<String> = out.retries.iter().map(ToString::to_string).collect();
        assert_eq!(
            retries,
            ["exactness::b: retrying - ro-rq: attempt 1 of 3: every backend short"]
        );
        let tally = |outcome, count, oracle, backend: Option<&str>, why: Option<&str>| Said {
            test: "exactness::b".to_owned(),
            what: Tally {
                outcome,
                count,
                oracle,
                backend: backend.map(str::to_owned),
                why: why.map(str::to_owned),
            },
        };
        assert_eq!(
            out.tallies,
            [
                tally(
                    Outcome::Exact,
                    12,
                    Oracle::DeviceStats,
                    Some("tracepoint"),
                    None
                ),
                tally(Outcome::Bound, 2, Oracle::Reader, Some("kprobe"), None),
                tally(
                    Outcome::Gated,
                    3,
                    Oracle::Qdisc,
                    None,
                    Some("the kernel skipped runs - of its programs")
                ),
            ]
        );
        // A skip without its reason, a gated tally without its, and a count that is not one.
        assert_eq!(out.malformed.len(), 3, "{:?}", out.malformed);
    }

    #[test]
    fn a_failed_tests_panic_is_named_by_the_test() {
        let lines = [
            "running 1 test",
            "test b ... FAILED",
            "",
            "failures:",
            "",
            "---- b stdout ----",
            r#"oracle: {"outcome":"exact","count":2,"oracle":"reader","backend":"tracepoint"}"#,
            "thread 'b' (676) panicked at tap-probe/tests/privileged/multiqueue.rs:230:24:",
            "assertion `left == right` failed: consumed",
            "  left: 2500",
            " right: 1936",
            "stack backtrace:",
            "",
            "failures:",
            "    b",
            "",
            "test result: FAILED. 0 passed; 1 failed",
        ];
        let out = read("multiqueue::b", &lines);
        assert_eq!(
            out.failures(),
            "multiqueue::b: panicked at tap-probe/tests/privileged/multiqueue.rs:230:24: assertion `left == \
             right` failed: consumed left: 2500 right: 1936"
        );
        assert_eq!(out.tallies.len(), 1);
        assert_eq!(read("multiqueue::b", &lines[..3]).failures(), "");
    }
}
