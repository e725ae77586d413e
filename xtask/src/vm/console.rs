//! What a guest's console says of the test binaries it ran: libtest's `test result:` line
//! and failed tests per binary, the init's lines that report a failure, and what the tests
//! said (read by [`crate::output`]). `init: running /tests/LABEL` begins each binary's output.

use crate::output::{self, Output};

/// One test binary's run, as the console showed it.
#[derive(Debug, Default, PartialEq, Eq)]
pub(crate) struct Binary {
    pub(crate) label: String,
    /// Its `test result:` line, after the prefix; none if it never printed one.
    pub(crate) result: Option<String>,
    /// The tests libtest reported `FAILED`.
    pub(crate) failed: Vec<String>,
}

/// What the console said of the test binaries a guest ran.
#[derive(Debug, Default)]
pub(crate) struct Console {
    pub(crate) binaries: Vec<Binary>,
    /// The init's lines that report a failure (a binary's non-zero exit, a timeout, a step
    /// that failed), as they read after `init: ` and before ` (uptime`.
    pub(crate) init_failures: Vec<String>,
    pub(crate) said: Output,
}

impl Console {
    /// Reads a guest's console, line by line.
    pub(crate) fn read(lines: &[String]) -> Self {
        let mut console = Self::default();
        let mut output: Vec<&str> = Vec::new();
        for line in lines {
            if let Some(path) = line.strip_prefix("init: running ") {
                console.flush(&mut output);
                let label = path
                    .split(' ')
                    .next()
                    .and_then(|path| path.rsplit('/').next())
                    .unwrap_or(path);
                console.binaries.push(Binary {
                    label: label.to_owned(),
                    ..Binary::default()
                });
            } else if let Some(name) = line
                .strip_prefix("test ")
                .and_then(|rest| rest.strip_suffix(" ... FAILED"))
                && let Some(binary) = console.binaries.last_mut()
            {
                binary.failed.push(name.to_owned());
            } else if let Some(result) = line.strip_prefix("test result: ")
                && let Some(binary) = console.binaries.last_mut()
            {
                binary.result = Some(result.to_owned());
            } else if let Some(rest) = line
                .strip_prefix("init: ")
                .filter(|rest| rest.ends_with("failed") || failed_exit(rest))
            {
                let failure = rest.split(" (uptime").next().unwrap_or(rest);
                console.init_failures.push(failure.to_owned());
            }
            output.push(line);
        }
        console.flush(&mut output);
        console
    }

    /// Reads what the tests of the binary running now said in `output`, and clears it.
    fn flush(&mut self, output: &mut Vec<&str>) {
        if let Some(binary) = self.binaries.last() {
            self.said.extend(output::read(&binary.label, output));
        }
        output.clear();
    }
}

/// Whether an init line reports a non-zero exit: `PATH exited RC (uptime ...)`.
fn failed_exit(line: &str) -> bool {
    line.split_once(" exited ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .is_some_and(|rc| rc != "0")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_binary_is_reported_with_what_its_tests_said() {
        let lines: Vec<String> = [
            "init: running /tests/exactness --exact a b (uptime 9.50 s)",
            "test a ... ok",
            "test b ... FAILED",
            "successes:",
            "---- a stdout ----",
            "skipping test - no kprobes",
            r#"oracle: {"outcome":"exact","count":3,"oracle":"qdisc","backend":"kprobe"}"#,
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "init: /tests/exactness exited 101 (uptime 12.00 s)",
            "init: running /tests/ring --exact c (uptime 12.10 s)",
            "---- c stdout ----",
            r#"oracle: {"outcome":"exact","count":2,"oracle":"reader","backend":"kprobe"}"#,
            "test result: ok. 1 passed; 0 failed; 0 ignored",
            "init: /tests/ring exited 0 (uptime 13.00 s)",
        ]
        .map(str::to_owned)
        .to_vec();
        let console = Console::read(&lines);
        assert_eq!(console.init_failures, ["/tests/exactness exited 101"]);
        assert_eq!(
            console.binaries,
            [
                Binary {
                    label: "exactness".to_owned(),
                    result: Some("FAILED. 1 passed; 1 failed; 0 ignored".to_owned()),
                    failed: vec!["b".to_owned()],
                },
                Binary {
                    label: "ring".to_owned(),
                    result: Some("ok. 1 passed; 0 failed; 0 ignored".to_owned()),
                    failed: Vec::new(),
                },
            ]
        );
        let said = &console.said;
        assert_eq!(said.skips.len(), 1);
        assert_eq!(said.skips[0].test, "exactness::a");
        let tests: Vec<&str> = said.tallies.iter().map(|t| t.test.as_str()).collect();
        assert_eq!(tests, ["exactness::a", "ring::c"]);
    }
}
