//! What a guest's console says of the tests it ran. The init runs each test as a process of
//! its own between two lines of its own: `init: running LABEL TEST (uptime ...)` before, and
//! after, how it ended, a [`Verdict`] in JSON after [`VERDICT_PREFIX`]. The lines between
//! the two are the test's, and what it said there is read by [`crate::output`]; nothing of
//! libtest's report is read. The init's other lines that report a failure are kept too.

use tap_probe_verdict::{VERDICT_PREFIX, Verdict};

use crate::output::{self, Output};

/// How a verdict line that does not read as one is reported.
pub(crate) const UNREAD: &str = "a verdict that does not read";

/// What the console said of the tests a guest ran.
#[derive(Debug, Default)]
pub(crate) struct Console {
    /// How each test that ended did, in the order they ran.
    pub(crate) verdicts: Vec<Verdict>,
    /// The test that was running when the console ended, if one was (`BINARY::TEST`).
    pub(crate) unfinished: Option<String>,
    /// The init's lines that report a failure (a step that failed, `doctor`'s non-zero
    /// exit, a verdict that does not read), as they read after `init: ` and before
    /// ` (uptime`.
    pub(crate) init_failures: Vec<String>,
    pub(crate) said: Output,
}

impl Console {
    /// Reads a guest's console, line by line.
    pub(crate) fn read(lines: &[String]) -> Self {
        let mut console = Self::default();
        let mut test: Option<String> = None;
        let mut output: Vec<&str> = Vec::new();
        for line in lines {
            if let Some(rest) = line.strip_prefix("init: running ") {
                console.flush(test.take(), &mut output);
                let mut words = rest.split(' ');
                if let (Some(label), Some(name)) = (words.next(), words.next()) {
                    test = Some(format!("{label}::{name}"));
                }
            } else if let Some(json) = line.strip_prefix(VERDICT_PREFIX) {
                console.flush(test.take(), &mut output);
                match Verdict::parse(json) {
                    Ok(verdict) => console.verdicts.push(verdict),
                    Err(err) => console
                        .init_failures
                        .push(format!("{UNREAD} ({err}): {json}")),
                }
            } else if let Some(rest) = line
                .strip_prefix("init: ")
                .filter(|rest| rest.ends_with("failed") || failed_exit(rest))
            {
                let failure = rest.split(" (uptime").next().unwrap_or(rest);
                console.init_failures.push(failure.to_owned());
            } else if test.is_some() {
                output.push(line);
            }
        }
        console.unfinished.clone_from(&test);
        console.flush(test, &mut output);
        console
    }

    /// Reads what `test` said in `output`, and clears it.
    fn flush(&mut self, test: Option<String>, output: &mut Vec<&str>) {
        if let Some(test) = test {
            self.said.extend(output::read(&test, output));
        }
        output.clear();
    }

    /// The tests that did not pass, each with how it ended, and the one that never ended.
    pub(crate) fn failed(&self) -> Vec<String> {
        let mut failed: Vec<String> = self
            .verdicts
            .iter()
            .filter(|v| !v.passed())
            .map(|v| {
                if v.timed_out {
                    format!("{}::{} timed out after {:.0} s", v.binary, v.test, v.secs())
                } else {
                    format!("{}::{} exited {}", v.binary, v.test, v.exit)
                }
            })
            .collect();
        failed.extend(
            self.unfinished
                .as_ref()
                .map(|test| format!("{test} never ended")),
        );
        failed
    }
}

/// Whether an init line reports a non-zero exit: `WHAT exited RC (uptime ...)`.
fn failed_exit(line: &str) -> bool {
    line.split_once(" exited ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .is_some_and(|rc| rc != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    fn verdict(binary: &str, test: &str, exit: i32) -> String {
        format!(
            r#"verdict: {{"binary":"{binary}","test":"{test}","exit":{exit},"timed_out":false,"started_s":9.5,"ended_s":12.0}}"#
        )
    }

    #[test]
    fn each_test_is_reported_with_what_it_said() {
        let lines: Vec<String> = [
            "init: tap-probe doctor exited 0 (uptime 9.00 s)".to_owned(),
            "init: running exactness a (uptime 9.50 s)".to_owned(),
            "running 1 test".to_owned(),
            tap_probe_verdict::Skip::test("no kprobes").line(),
            r#"oracle: {"outcome":"exact","count":3,"oracle":"qdisc","backend":"kprobe"}"#
                .to_owned(),
            "test result: ok. 1 passed".to_owned(),
            verdict("exactness", "a", 0),
            "init: running exactness b (uptime 12.00 s)".to_owned(),
            "thread 'b' (7) panicked at tap-probe/tests/privileged/exactness.rs:1:2:".to_owned(),
            "consumed".to_owned(),
            String::new(),
            verdict("exactness", "b", 101),
            "init: running ring c (uptime 13.00 s)".to_owned(),
            r#"oracle: {"outcome":"exact","count":2,"oracle":"reader","backend":"kprobe"}"#
                .to_owned(),
        ]
        .to_vec();
        let console = Console::read(&lines);
        assert!(
            console.init_failures.is_empty(),
            "{:?}",
            console.init_failures
        );
        assert_eq!(console.verdicts.len(), 2);
        assert_eq!(
            console.failed(),
            ["exactness::b exited 101", "ring::c never ended"]
        );
        let said = &console.said;
        assert_eq!(said.skips.len(), 1);
        assert_eq!(said.skips[0].test, "exactness::a");
        let tests: Vec<&str> = said.tallies.iter().map(|t| t.test.as_str()).collect();
        assert_eq!(tests, ["exactness::a", "ring::c"]);
        assert_eq!(
            said.failures(),
            "exactness::b: panicked at tap-probe/tests/privileged/exactness.rs:1:2: consumed"
        );
    }

    #[test]
    fn a_failed_step_and_a_verdict_that_does_not_read_are_failures() {
        let lines = [
            "init: tap-probe doctor exited 2 (uptime 9.00 s)",
            "verdict: {\"binary\":\"ring\"}",
        ]
        .map(str::to_owned);
        let console = Console::read(&lines);
        assert_eq!(console.init_failures.len(), 2);
        assert_eq!(console.init_failures[0], "tap-probe doctor exited 2");
        assert!(console.init_failures[1].starts_with(UNREAD));
    }
}
