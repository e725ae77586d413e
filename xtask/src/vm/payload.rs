//! What a guest runs: per test binary of the suite, the tests whose outcome depends on the
//! kernel (of those the passthrough arguments select, and of those the guest's subset
//! names), the host tools they need, and the init's script that runs them.

use anyhow::Context as _;
use tap_probe_guest::Image;
use tap_probe_guest::image::sh_quote;

use crate::suite::{self, Subset, Suite};

/// Host tools (copied in with their libraries) the tests run: some lib tests check the
/// rtnetlink code against `ip -j` and `tc -j`, which busybox's applets cannot print, and a
/// test reads the kernel's figures a second way through `ip netns exec`; `watch_cli` drops
/// privileges with util-linux's `setpriv --reuid`; `alerts` has Prometheus (Debian's
/// package) evaluate the alert rules where tun takes `IFF_BACKPRESSURE`.
const HOST_TOOLS: &[&str] = &[
    "/usr/sbin/ip",
    "/usr/sbin/tc",
    "/usr/bin/setpriv",
    "/usr/bin/prometheus",
];

/// Each test binary still running after this long is ended, so one hung test fails its
/// binary and the rest still run (the whole suite takes about 4 minutes under TCG here).
const BINARY_TIMEOUT_S: u32 = 8 * 60;

/// The init script's start: `tap-probe doctor`, then `run`, which runs one test binary one
/// test at a time (they share the guest's tracepoints) under the timeout in `$timeout_s`,
/// and says when it starts and how it ended, for [`super::console`].
const PRELUDE: &str = r#"echo "init: tap-probe doctor"
/bin/tap-probe doctor
echo "init: tap-probe doctor exited $?"
run() {
    read -r up _ < /proc/uptime
    echo "init: running $1 (uptime $up s)"
    timeout "$timeout_s" "$@" --test-threads=1 --show-output
    rc=$?
    read -r up _ < /proc/uptime
    # busybox timeout ends the binary with SIGTERM: exit status 128 + 15.
    [ "$rc" -eq 143 ] && echo "init: $1 timed out after $timeout_s s"
    echo "init: $1 exited $rc (uptime $up s)"
    [ "$rc" -eq 0 ] || status=1
}
"#;

/// What a guest runs.
pub(crate) struct Payload {
    /// Index into the suite's binaries, and the tests of it to run.
    pub(crate) runs: Vec<(usize, Vec<String>)>,
    /// The passthrough arguments each binary also gets (but `--exact`, which the selection
    /// already sets).
    args: Vec<String>,
}

/// One test binary's run in the guest.
struct BinaryRun<'a> {
    /// Its path in the guest.
    path: &'a str,
    tests: &'a [String],
    args: &'a [String],
}

impl Payload {
    /// What a guest runs: of what `passthrough` selects, the tests that depend on the
    /// kernel, and of those its `subset`'s (see [`suite::SUBSETS`]).
    pub(crate) fn select(
        suite: &Suite,
        passthrough: &[String],
        subset: Option<&Subset>,
    ) -> anyhow::Result<Self> {
        let mut runs = Vec::new();
        for (index, binary) in suite.binaries.iter().enumerate() {
            if !binary.for_guests() {
                continue;
            }
            let tests: Vec<String> = suite::for_guests(binary, passthrough)?
                .into_iter()
                .filter(|test| subset.is_none_or(|subset| subset.runs(&binary.label, test)))
                .collect();
            if !tests.is_empty() {
                runs.push((index, tests));
            }
        }
        let args = passthrough
            .iter()
            .filter(|arg| *arg != "--exact")
            .cloned()
            .collect();
        Ok(Self { runs, args })
    }

    /// How many tests it runs.
    pub(crate) fn tests(&self) -> usize {
        self.runs.iter().map(|(_, tests)| tests.len()).sum()
    }

    /// Puts the binaries, the host tools and the script into `image`.
    pub(crate) fn add_to(&self, image: &mut Image, suite: &Suite) -> anyhow::Result<()> {
        for tool in HOST_TOOLS {
            image.host_tool(tool)?;
        }
        let tap_probe = suite.tap_probe.to_str().context("non-UTF-8 target path")?;
        image.executable(tap_probe, &suite.tap_probe)?;
        image.executable("/bin/tap-probe", &suite.tap_probe)?;
        let mut paths = Vec::new();
        for (index, _) in &self.runs {
            let binary = &suite.binaries[*index];
            let path = format!("/tests/{}", binary.label);
            image.executable(&path, &binary.path)?;
            paths.push(path);
        }
        let runs: Vec<BinaryRun<'_>> = self
            .runs
            .iter()
            .zip(&paths)
            .map(|((_, tests), path)| BinaryRun {
                path,
                tests,
                args: &self.args,
            })
            .collect();
        image.script(&script(&runs));
        Ok(())
    }
}

/// The init's script: the prelude, then each binary with exactly its selected tests.
fn script(runs: &[BinaryRun<'_>]) -> String {
    let mut script = format!("timeout_s={BINARY_TIMEOUT_S}\n{PRELUDE}");
    for run in runs {
        let words: Vec<String> = ["run", run.path, "--exact"]
            .into_iter()
            .map(str::to_owned)
            .chain(run.tests.iter().chain(run.args).map(|word| sh_quote(word)))
            .collect();
        script.push_str(&words.join(" "));
        script.push('\n');
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn each_binary_runs_exactly_its_tests_quoted() {
        let tests = ["a_test".to_owned(), "it's".to_owned()];
        let args = ["--skip".to_owned(), "b c".to_owned()];
        let script = script(&[BinaryRun {
            path: "/tests/ring",
            tests: &tests,
            args: &args,
        }]);
        assert!(script.starts_with(&format!("timeout_s={BINARY_TIMEOUT_S}\n")));
        let last = script.lines().last().unwrap();
        assert_eq!(
            last,
            r"run /tests/ring --exact 'a_test' 'it'\''s' '--skip' 'b c'"
        );
    }
}
