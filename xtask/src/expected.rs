//! What each kernel of the test matrix is expected to show, kept in `xtask/expected.toml`:
//! the backends it runs, whether it reports kprobe misses, and every test that skips itself
//! (or a part of itself) there. A run of the whole suite is held to it: a skip the file does
//! not list, an expected skip that did not happen, or a kind of exact check that a kernel's
//! backends support and that no test made there, fails the run.

use std::collections::BTreeMap;
use std::fmt::Write as _;

use anyhow::{Context as _, bail};
use serde::Deserialize;

use tap_probe_verdict::{Oracle, Outcome};

use crate::output::Output;

/// The file, relative to the workspace root.
pub(crate) const FILE: &str = "xtask/expected.toml";

/// The place the host's expectations are kept under.
pub(crate) const HOST: &str = "host";

/// Oracles every backend a kernel runs must be checked against exactly.
const PER_BACKEND: &[Oracle] = &[
    Oracle::DeviceStats,
    Oracle::Qdisc,
    Oracle::Reader,
    Oracle::Sender,
    Oracle::Scheduler,
];
/// Oracles every kernel must be checked against exactly, by whichever backend (or none).
const PER_KERNEL: &[Oracle] = &[Oracle::Sysfs, Oracle::Tc, Oracle::TcpStack];
/// Where a kernel counts the runs of a program it skipped (Linux 5.12+).
const PROGRAM_MISSES: Oracle = Oracle::ProgramMisses;
/// Where a kernel runs two backends or more: each against the other.
const BACKENDS_AGREE: Oracle = Oracle::OtherBackend;
/// Where a kernel reports what a kprobe missed.
const KPROBE_MISSES: Oracle = Oracle::KprobeMisses;
/// Oracles the host must be checked against exactly: what the tests that only the host runs
/// compare (see `suite::HOST_ONLY`).
const HOST_ORACLES: &[Oracle] = &[Oracle::MapMemory];

#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct File {
    kernel: BTreeMap<String, Kernel>,
}

/// One kernel's expectations.
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
pub(crate) struct Kernel {
    /// The host's: the start of the release they were written for (this machine kind's).
    #[serde(default)]
    release: Option<String>,
    /// The backends it runs, as the tests name them (`tracepoint`, `kprobe`).
    backends: Vec<String>,
    /// Whether it counts the runs of a program it skipped (`recursion_misses`, Linux 5.12+).
    program_misses: bool,
    /// Whether it reports what a kprobe missed (Linux 6.7+).
    kprobe_misses: bool,
    /// The tests that skip themselves there.
    #[serde(default)]
    skip: Vec<Skip>,
}

/// An expected skip: the test (`LABEL::TEST`) and a part of its words
/// ([`tap_probe_verdict::Skip`]'s `Display`: `skipping PART - WHY`).
#[derive(Debug, Deserialize)]
#[serde(deny_unknown_fields)]
struct Skip {
    test: String,
    line: String,
    /// A skip that depends on how much the machine's load lets happen (its line gives the
    /// figure measured): allowed, not required.
    #[serde(default)]
    may: bool,
}

impl Skip {
    /// Whether `said` is this skip: its test (any, for `*`) and its line.
    fn matches(&self, said: &crate::output::Said<tap_probe_verdict::Skip>) -> bool {
        (self.test == "*" || self.test == said.test) && said.what.to_string().contains(&self.line)
    }
}

/// Every kernel's expectations.
#[derive(Debug)]
pub(crate) struct Expected(BTreeMap<String, Kernel>);

impl Expected {
    /// Reads [`FILE`].
    ///
    /// # Errors
    /// If it cannot be read or parsed.
    pub(crate) fn load() -> anyhow::Result<Self> {
        let path = crate::cmd::workspace_root().join(FILE);
        let text = std::fs::read_to_string(&path)
            .with_context(|| format!("reading {}", path.display()))?;
        Self::parse(&text).with_context(|| format!("parsing {}", path.display()))
    }

    fn parse(text: &str) -> anyhow::Result<Self> {
        let file: File = toml::from_str(text)?;
        Ok(Self(file.kernel))
    }

    /// The expectations of `place` (`host`, or a guest of the matrix); the host's only if
    /// they were written for the kernel it runs.
    ///
    /// # Errors
    /// If the file has none for it.
    pub(crate) fn of(&self, place: &str, release: &str) -> anyhow::Result<&Kernel> {
        let kernel = self
            .0
            .get(place)
            .with_context(|| format!("{FILE} has no [kernel.\"{place}\"]"))?;
        if let Some(prefix) = &kernel.release
            && !release.starts_with(prefix.as_str())
        {
            bail!(
                "{FILE}: the expectations for {place} are for kernel {prefix}*, and this one \
                 runs {release}: write down what this kernel is expected to skip and run"
            );
        }
        Ok(kernel)
    }
}

impl Kernel {
    /// What went otherwise than expected on this kernel, one sentence each; empty when all
    /// is as expected.
    pub(crate) fn problems(&self, said: &Output) -> Vec<String> {
        let mut problems = Vec::new();
        for skip in &said.skips {
            if !self.skip.iter().any(|e| e.matches(skip)) {
                problems.push(format!("a skip {FILE} does not expect: {skip}"));
            }
        }
        for expected in self.skip.iter().filter(|e| !e.may) {
            if !said.skips.iter().any(|s| expected.matches(s)) {
                problems.push(format!(
                    "an expected skip did not happen: {}: {} (remove it from {FILE} if the \
                     test now runs)",
                    expected.test, expected.line
                ));
            }
        }
        for line in &said.malformed {
            problems.push(format!(
                "a test's line that does not read as what it starts like: {line}"
            ));
        }
        for (oracle, backend) in self.required() {
            let made: u64 = said
                .tallies
                .iter()
                .map(|t| &t.what)
                .filter(|t| t.outcome == Outcome::Exact && t.oracle == oracle)
                .filter(|t| backend.is_none_or(|b| t.backend.as_deref() == Some(b)))
                .map(|t| t.count)
                .sum();
            if made == 0 {
                let by = backend.map_or_else(String::new, |b| format!(" of the {b} backend"));
                problems.push(format!(
                    "no exact check{by} against {} was made on this kernel",
                    oracle.name()
                ));
            }
        }
        problems
    }

    /// The kinds of exact check this kernel must make: an oracle, and the backend that
    /// must make it (`None`: any).
    fn required(&self) -> Vec<(Oracle, Option<&str>)> {
        let mut required = Vec::new();
        for backend in &self.backends {
            for oracle in PER_BACKEND {
                required.push((*oracle, Some(backend.as_str())));
            }
        }
        for oracle in PER_KERNEL {
            required.push((*oracle, None));
        }
        if self.backends.len() >= 2 {
            required.push((BACKENDS_AGREE, None));
        }
        if self.program_misses {
            required.push((PROGRAM_MISSES, None));
        }
        if self.kprobe_misses {
            required.push((KPROBE_MISSES, None));
        }
        // Only the host's expectations name its release.
        if self.release.is_some() {
            required.extend(HOST_ORACLES.iter().map(|oracle| (*oracle, None)));
        }
        required
    }
}

/// Checks summed by outcome, oracle, backend and why they were gated.
type Kinds<'a> = (Outcome, Oracle, &'a str, Option<&'a str>);

/// The checks of one kernel, for the summary: exact ones and bounds by oracle and backend,
/// and the gated ones with why and in which tests.
pub(crate) fn tally_lines(said: &Output) -> String {
    let mut counts: BTreeMap<Kinds<'_>, (u64, Vec<&str>)> = BTreeMap::new();
    for said in &said.tallies {
        let t = &said.what;
        let entry = counts
            .entry((t.outcome, t.oracle, t.by(), t.why.as_deref()))
            .or_default();
        entry.0 += t.count;
        if !entry.1.contains(&said.test.as_str()) {
            entry.1.push(&said.test);
        }
    }
    let mut out = String::new();
    for (label, outcome) in [("exact checks", Outcome::Exact), ("bounds", Outcome::Bound)] {
        let items: Vec<String> = counts
            .iter()
            .filter(|((o, ..), _)| *o == outcome)
            .map(|((_, oracle, backend, _), (n, _))| format!("{} by {backend} {n}", oracle.name()))
            .collect();
        let total: u64 = counts
            .iter()
            .filter(|((o, ..), _)| *o == outcome)
            .map(|(_, (n, _))| n)
            .sum();
        let _ = write!(out, "\n    {label}: {total}");
        if !items.is_empty() {
            let _ = write!(out, " ({})", items.join(", "));
        }
    }
    let gated: Vec<_> = counts
        .iter()
        .filter(|((o, ..), _)| *o == Outcome::Gated)
        .collect();
    let total: u64 = gated.iter().map(|(_, (n, _))| n).sum();
    let _ = write!(out, "\n    gated off: {total}");
    for ((_, oracle, backend, why), (n, tests)) in gated {
        let _ = write!(
            out,
            "\n      {n} {} by {backend}: {} (in {})",
            oracle.name(),
            why.unwrap_or("?"),
            tests.join(", ")
        );
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::read;

    const FILE_TEXT: &str = r#"
[kernel.host]
release = "6.18."
backends = ["tracepoint"]
program_misses = true
kprobe_misses = false
[[kernel.host.skip]]
test = "misses::kprobe"
line = "no kprobes"
[[kernel.host.skip]]
test = "*"
line = "skipping backend Kprobe"
[[kernel.host.skip]]
test = "misses::busy"
line = "fewer requeues"
may = true
"#;

    /// The line of `count` exact checks against `oracle` by `backend`.
    fn exact(count: u64, oracle: Oracle, backend: Option<&str>) -> String {
        tap_probe_verdict::Tally {
            outcome: Outcome::Exact,
            count,
            oracle,
            backend: backend.map(str::to_owned),
            why: None,
        }
        .line()
    }

    fn all_required(backend: &str) -> Vec<String> {
        PER_BACKEND
            .iter()
            .map(|o| exact(1, *o, Some(backend)))
            .chain(
                PER_KERNEL
                    .iter()
                    .chain([&PROGRAM_MISSES])
                    .map(|o| exact(2, *o, None)),
            )
            .chain(HOST_ORACLES.iter().map(|o| exact(1, *o, None)))
            .collect()
    }

    #[test]
    fn a_run_as_expected_has_no_problems() {
        let expected = Expected::parse(FILE_TEXT).unwrap();
        let host = expected.of(HOST, "6.18.44-x").unwrap();
        let mut said = read(
            "misses::kprobe",
            &[tap_probe_verdict::Skip::test("this kernel has no kprobes").line()],
        );
        // What the whole kernel lacks, in any test.
        let mut other =
            vec![tap_probe_verdict::Skip::part("backend Kprobe", "no kprobes here").line()];
        other.extend(all_required("tracepoint"));
        said.extend(read("misses::other", &other));
        // A skip that may happen is not required...
        assert_eq!(host.problems(&said), Vec::<String>::new());
        // ...and allowed where it does.
        let mut with_may = said.clone();
        with_may.extend(read(
            "misses::busy",
            &[tap_probe_verdict::Skip::part("part", "fewer requeues than 50000").line()],
        ));
        assert_eq!(host.problems(&with_may), Vec::<String>::new());
        let summary = tally_lines(&said);
        assert!(summary.contains("exact checks: 14"), "{summary}");
        assert!(summary.contains("gated off: 0"), "{summary}");
    }

    #[test]
    fn new_and_vanished_skips_and_missing_oracles_are_problems() {
        let expected = Expected::parse(FILE_TEXT).unwrap();
        assert!(expected.of(HOST, "6.1.0").is_err(), "another host kernel");
        let host = expected.of(HOST, "6.18.1").unwrap();
        let mut lines = vec![tap_probe_verdict::Skip::test("no fq_codel").line()];
        lines.push(tap_probe_verdict::Skip::part("backend Kprobe", "no kprobes here").line());
        lines.extend(all_required("tracepoint").into_iter().skip(1));
        lines.push(
            r#"oracle: {"outcome":"exact","count":1,"oracle":"astrology","backend":null}"#
                .to_owned(),
        );
        lines.push(
            tap_probe_verdict::Tally {
                outcome: Outcome::Gated,
                count: 4,
                oracle: Oracle::Qdisc,
                backend: Some("tracepoint".to_owned()),
                why: Some("short".to_owned()),
            }
            .line(),
        );
        let problems = host.problems(&read("misses::other", &lines));
        assert_eq!(problems.len(), 4, "{problems:#?}");
        assert!(problems[0].contains("does not expect: misses::other"));
        assert!(problems[1].contains("did not happen: misses::kprobe"));
        assert!(problems[2].contains("astrology"));
        assert!(problems[3].contains("tracepoint backend against device-stats"));
    }

    #[test]
    fn the_committed_file_parses() {
        let expected = Expected::load().unwrap();
        assert!(expected.0.contains_key(HOST));
    }
}
