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

/// A test still running after this long is ended, so one hung test fails itself and the
/// rest still run (the longest, `churn`, takes under 2 minutes under TCG here).
const TEST_TIMEOUT_S: u32 = 8 * 60;

/// The init script's start: `tap-probe doctor`, then `run`, which runs one test as a
/// process of its own (one at a time: they share the guest's tracepoints) under the timeout
/// in `$timeout_s`, says when it starts, and prints how it ended as a
/// [`tap_probe_verdict::Verdict`] after `verdict: `, for [`super::console`]. `run LABEL PATH
/// MODULE TEST ARGS...`: a subject of the privileged tests gives its module (`--exact`
/// takes the test's whole path), others `''`. A test's name is a Rust path and a label a
/// module's or a target's name, neither of which JSON must escape.
const PRELUDE: &str = r#"echo "init: tap-probe doctor"
/bin/tap-probe doctor
echo "init: tap-probe doctor exited $?"
run() {
    label=$1 path=$2 module=$3 test=$4
    shift 4
    read -r up _ < /proc/uptime
    echo "init: running $label $test (uptime $up s)"
    timeout "$timeout_s" "$path" --exact "${module:+$module::}$test" --test-threads=1 \
        --show-output "$@"
    rc=$?
    read -r end _ < /proc/uptime
    # busybox timeout ends the test with SIGTERM: exit status 128 + 15.
    timed_out=false
    [ "$rc" -eq 143 ] && timed_out=true
    printf 'verdict: {"binary":"%s","test":"%s","exit":%s,"timed_out":%s,"started_s":%s,"ended_s":%s}\n' \
        "$label" "$test" "$rc" "$timed_out" "$up" "$end"
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
    /// How the summary names it.
    label: &'a str,
    /// Its path in the guest.
    path: &'a str,
    /// A subject's module (see [`suite::Binary::module`]).
    module: Option<&'a str>,
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
        // The subjects of the privileged tests share their binary: it goes in once.
        let mut paths = Vec::new();
        for (index, _) in &self.runs {
            let binary = &suite.binaries[*index];
            let name = binary
                .path
                .file_name()
                .context("a test binary without a name")?;
            let path = format!("/tests/{}", name.to_string_lossy());
            if !paths.contains(&path) {
                image.executable(&path, &binary.path)?;
            }
            paths.push(path);
        }
        let runs: Vec<BinaryRun<'_>> = self
            .runs
            .iter()
            .zip(&paths)
            .map(|((index, tests), path)| BinaryRun {
                label: &suite.binaries[*index].label,
                path,
                module: suite.binaries[*index].module.as_deref(),
                tests,
                args: &self.args,
            })
            .collect();
        image.script(&script(&runs));
        Ok(())
    }
}

/// The init's script: the prelude, then each test of each binary, run alone.
fn script(runs: &[BinaryRun<'_>]) -> String {
    let mut script = format!("timeout_s={TEST_TIMEOUT_S}\n{PRELUDE}");
    for run in runs {
        for test in run.tests {
            let words: Vec<String> = ["run", run.label, run.path]
                .into_iter()
                .map(str::to_owned)
                .chain(
                    [run.module.unwrap_or_default(), test]
                        .into_iter()
                        .chain(run.args.iter().map(String::as_str))
                        .map(sh_quote),
                )
                .collect();
            script.push_str(&words.join(" "));
            script.push('\n');
        }
    }
    script
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The init's `run`, in a real shell, on a stand-in for a test binary that echoes its
    /// arguments and fails: it is given the subject's test by its whole path, and its
    /// verdict line reads as a [`tap_probe_verdict::Verdict`] with the test's exit status.
    #[test]
    fn a_tests_verdict_line_reads_back() {
        use std::os::unix::fs::PermissionsExt as _;
        let stand_in = std::env::temp_dir().join(format!("xtask-stand-in-{}", std::process::id()));
        std::fs::write(&stand_in, "#!/bin/sh\necho \"args: $*\"\nexit 3\n").unwrap();
        std::fs::set_permissions(&stand_in, std::fs::Permissions::from_mode(0o755)).unwrap();
        let script = format!(
            "timeout_s=60\nstatus=0\n{PRELUDE}run ring {} ring 'a::b' --nocapture\necho status=$status\n",
            stand_in.display()
        );
        let out = std::process::Command::new("sh")
            .args(["-c", &script])
            .output()
            .unwrap();
        std::fs::remove_file(&stand_in).unwrap();
        let stdout = String::from_utf8(out.stdout).unwrap();
        assert!(
            stdout
                .contains("args: --exact ring::a::b --test-threads=1 --show-output --nocapture\n"),
            "{stdout}"
        );
        let line = stdout
            .lines()
            .find_map(|line| line.strip_prefix(tap_probe_verdict::VERDICT_PREFIX))
            .unwrap_or_else(|| panic!("no verdict in {stdout}"));
        let verdict = tap_probe_verdict::Verdict::parse(line).unwrap();
        assert_eq!(
            (verdict.binary.as_str(), verdict.test.as_str()),
            ("ring", "a::b")
        );
        assert_eq!(verdict.exit, 3, "{stdout}");
        assert!(!verdict.timed_out && verdict.secs() >= 0.0);
        assert!(
            stdout.contains("init: running ring a::b (uptime "),
            "{stdout}"
        );
        assert!(stdout.ends_with("status=1\n"), "{stdout}");
    }

    #[test]
    fn each_test_runs_alone_quoted() {
        let tests = ["a_test".to_owned(), "it's".to_owned()];
        let args = ["--skip".to_owned(), "b c".to_owned()];
        let script = script(&[
            BinaryRun {
                label: "tap_probe_lab-lib",
                path: "/tests/tap_probe_lab-0123",
                module: None,
                tests: &tests[..1],
                args: &args,
            },
            BinaryRun {
                label: "ring",
                path: "/tests/privileged-4567",
                module: Some("ring"),
                tests: &tests,
                args: &args,
            },
        ]);
        assert!(script.starts_with(&format!("timeout_s={TEST_TIMEOUT_S}\n")));
        let lines: Vec<&str> = script.lines().rev().take(3).collect();
        assert_eq!(
            lines,
            [
                r"run ring /tests/privileged-4567 'ring' 'it'\''s' '--skip' 'b c'",
                r"run ring /tests/privileged-4567 'ring' 'a_test' '--skip' 'b c'",
                r"run tap_probe_lab-lib /tests/tap_probe_lab-0123 '' 'a_test' '--skip' 'b c'",
            ]
        );
    }
}
