//! Tests that skipped themselves, read from libtest's output. A test that cannot run here
//! (no kprobes, no `fq_codel`, ...) prints a line starting with `skipping` and returns; run
//! with `--show-output`, libtest prints each passed test's output under a
//! `---- NAME stdout ----` header, so every skip can be named by its test.

/// One test that skipped itself, or part of itself.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Skip {
    pub(crate) test: String,
    /// The line it printed.
    pub(crate) line: String,
}

impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{}: {}", self.test, self.line)
    }
}

/// The skips in `lines`, libtest output of one or more test binaries. A `skipping` line
/// outside any test's output (none is expected) is kept under the name `?`, so it is not
/// lost.
pub(crate) fn read<S: AsRef<str>>(lines: &[S]) -> Vec<Skip> {
    let mut test: Option<&str> = None;
    let mut out = Vec::new();
    for line in lines {
        let line = line.as_ref();
        if let Some(name) = line
            .strip_prefix("---- ")
            .and_then(|rest| rest.strip_suffix(" stdout ----"))
        {
            test = Some(name);
        } else if line.starts_with("test result: ")
            || line == "successes:"
            || line == "failures:"
            || line.starts_with("running ")
        {
            test = None;
        } else if line.trim_start().starts_with("skipping") {
            out.push(Skip {
                test: test.unwrap_or("?").to_owned(),
                line: line.trim().to_owned(),
            });
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn skips_are_named_by_the_test_that_printed_them() {
        let lines = [
            "running 3 tests",
            "test exactness::a ... ok",
            "test b ... ok",
            "test c ... ok",
            "",
            "successes:",
            "",
            "---- exactness::a stdout ----",
            "skipping test - fq_codel: no such qdisc",
            "---- b stdout ----",
            "kernel tx_dropped 3",
            "skipping backend Kprobe - no kprobes",
            "",
            "successes:",
            "    exactness::a",
            "test result: ok. 3 passed; 0 failed",
        ];
        let skips: Vec<String> = read(&lines).iter().map(ToString::to_string).collect();
        assert_eq!(
            skips,
            [
                "exactness::a: skipping test - fq_codel: no such qdisc",
                "b: skipping backend Kprobe - no kprobes"
            ]
        );
    }
}
