//! What a privileged test tells `cargo xtask test`: the checks it made against oracles, and
//! what it could not run here or ran again.
//!
//! A test counts its comparisons with witnesses that are not tap-probe (the kernel's own
//! counters, the reader's and the sender's counts, the qdisc) and, when it ends, prints one
//! [`Tally`] per oracle, backend and outcome as a JSON line after [`PREFIX`]:
//!
//! ```text
//! oracle: {"outcome":"gated","count":6,"oracle":"qdisc","backend":"kprobe","why":"the kernel skipped runs of its programs"}
//! ```
//!
//! A test (or a part of it) that cannot run here prints a [`Skip`] after [`SKIP_PREFIX`]
//! and a scenario run again a [`Retry`] after [`RETRY_PREFIX`], each a JSON line too;
//! `xtask/expected.toml` names a skip as its [`Display`](std::fmt::Display) words it.
//!
//! xtask reads the same type back, so an oracle or a field renamed on one side fails to
//! compile on the other, and no spelling of a line has to be parsed by hand. (The shape is
//! Retis's: one events crate shared by every writer and reader of events.)
//!
//! Each test runs as a process of its own, so everything it prints is its own, and how it
//! ended is the process's: a [`Verdict`], which a guest's init prints after each test as a
//! JSON line after [`VERDICT_PREFIX`] and xtask makes itself on the host. Nothing reads
//! libtest's own report of the run.

use serde::{Deserialize, Serialize};

/// What starts a tally's line in a test's output.
pub const PREFIX: &str = "oracle: ";

/// What starts a verdict's line in a guest's console.
pub const VERDICT_PREFIX: &str = "verdict: ";

/// What starts a skip's line in a test's output.
pub const SKIP_PREFIX: &str = "skip: ";

/// What starts a retry's line in a test's output.
pub const RETRY_PREFIX: &str = "retry: ";

/// `value`'s line: `prefix` and its JSON.
fn json_line(prefix: &str, value: &impl Serialize) -> String {
    // Structs of strings, numbers and unit enums always serialize.
    let json = serde_json::to_string(value).unwrap_or_default();
    format!("{prefix}{json}")
}

/// A test, or a part of one, that cannot run on this kernel or machine, and why. The test
/// goes on without it (a part) or returns and passes (the whole test): xtask holds every
/// kernel's skips to `xtask/expected.toml`.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Skip {
    /// What it skipped (`backend Kprobe`, `ring occupancy`); none for the whole test.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub part: Option<String>,
    pub why: String,
}

impl Skip {
    /// The whole test is skipped.
    #[must_use]
    pub fn test(why: impl Into<String>) -> Self {
        Self {
            part: None,
            why: why.into(),
        }
    }

    /// `part` of the test is skipped.
    #[must_use]
    pub fn part(part: impl Into<String>, why: impl Into<String>) -> Self {
        Self {
            part: Some(part.into()),
            why: why.into(),
        }
    }

    /// The line a test prints: [`SKIP_PREFIX`] and the skip's JSON.
    #[must_use]
    pub fn line(&self) -> String {
        json_line(SKIP_PREFIX, self)
    }

    /// Prints its line, for xtask (and a reader).
    pub fn print(&self) {
        eprintln!("{}", self.line());
    }

    /// A skip from its JSON (the part of a line after [`SKIP_PREFIX`]).
    ///
    /// # Errors
    /// If it is not a skip's JSON.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

/// `skipping test - WHY`, `skipping PART - WHY`: how summaries word it and
/// `xtask/expected.toml` names it.
impl std::fmt::Display for Skip {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let part = self.part.as_deref().unwrap_or("test");
        write!(f, "skipping {part} - {}", self.why)
    }
}

/// A scenario a test ran again, because a run could not be checked exactly, and why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Retry {
    /// The scenario, as the test names it.
    pub scenario: String,
    /// The attempt that is ending, from 1, of `attempts`.
    pub attempt: u32,
    pub attempts: u32,
    pub why: String,
}

impl Retry {
    /// The line a test prints: [`RETRY_PREFIX`] and the retry's JSON.
    #[must_use]
    pub fn line(&self) -> String {
        json_line(RETRY_PREFIX, self)
    }

    /// Prints its line, for xtask (and a reader).
    pub fn print(&self) {
        eprintln!("{}", self.line());
    }

    /// A retry from its JSON (the part of a line after [`RETRY_PREFIX`]).
    ///
    /// # Errors
    /// If it is not a retry's JSON.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

/// `retrying - SCENARIO: attempt N of M: WHY`, as summaries word it.
impl std::fmt::Display for Retry {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "retrying - {}: attempt {} of {}: {}",
            self.scenario, self.attempt, self.attempts, self.why
        )
    }
}

/// Whether this process runs as root, which the privileged tests need; elsewhere each says
/// so with a [`Skip`] and passes (the form aya's tests use), so that a plain run of them
/// without root shows what it did not test.
#[must_use]
pub fn root() -> bool {
    let root = nix::unistd::geteuid().is_root();
    if !root {
        Skip::test("not root").print();
    }
    root
}

/// How one test's process ended. In a guest its times are the guest's uptime, on the host
/// seconds since the stage began.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Verdict {
    /// Its test binary, as the summary labels it (`exactness`, `tap_probe_lab-lib`).
    pub binary: String,
    /// The test, as `--list` names it (`module::name`).
    pub test: String,
    /// Its exit status (a signal's as a shell gives it, 128 + N): 0 when it passed.
    pub exit: i32,
    /// Ended by the runner for running too long.
    pub timed_out: bool,
    pub started_s: f64,
    pub ended_s: f64,
}

impl Verdict {
    #[must_use]
    pub fn passed(&self) -> bool {
        self.exit == 0 && !self.timed_out
    }

    /// Seconds it ran.
    #[must_use]
    pub fn secs(&self) -> f64 {
        self.ended_s - self.started_s
    }

    /// A verdict from its JSON (the part of a line after [`VERDICT_PREFIX`]).
    ///
    /// # Errors
    /// If it is not a verdict's JSON.
    pub fn parse(json: &str) -> Result<Self, serde_json::Error> {
        serde_json::from_str(json)
    }
}

/// A witness that is not tap-probe.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Oracle {
    /// The device's statistics as the kernel keeps them (`tx_packets`, `tx_dropped`).
    DeviceStats,
    /// The root qdisc's statistics: packets handed out, drops, requeues, backlog.
    Qdisc,
    /// What the test's reader took from the device, and in what order.
    Reader,
    /// What the test's sender handed to the kernel, and what the kernel refused.
    Sender,
    /// The reader thread's voluntary context switches, as the scheduler counts them.
    Scheduler,
    /// The TCP stacks' own counters (`/proc/net/netstat`, `/proc/net/snmp`).
    TcpStack,
    /// Another backend, attached to the same traffic.
    OtherBackend,
    /// Runs of a program the kernel skipped, caused on purpose.
    ProgramMisses,
    /// Hits of a kprobe that ran no program, caused on purpose.
    KprobeMisses,
    /// `/sys/class/net/DEV/statistics`, read beside rtnetlink.
    Sysfs,
    /// `tc -s -j`, read beside rtnetlink.
    Tc,
    /// The kernel memory charged for each eBPF map (`memlock` in its fdinfo).
    MapMemory,
}

impl Oracle {
    /// Every oracle, in order.
    pub const ALL: [Self; 12] = [
        Self::DeviceStats,
        Self::Qdisc,
        Self::Reader,
        Self::Sender,
        Self::Scheduler,
        Self::TcpStack,
        Self::OtherBackend,
        Self::ProgramMisses,
        Self::KprobeMisses,
        Self::Sysfs,
        Self::Tc,
        Self::MapMemory,
    ];

    /// Its name in messages and summaries: the one its JSON carries.
    #[must_use]
    pub const fn name(self) -> &'static str {
        match self {
            Self::DeviceStats => "device-stats",
            Self::Qdisc => "qdisc",
            Self::Reader => "reader",
            Self::Sender => "sender",
            Self::Scheduler => "scheduler",
            Self::TcpStack => "tcp-stack",
            Self::OtherBackend => "other-backend",
            Self::ProgramMisses => "program-misses",
            Self::KprobeMisses => "kprobe-misses",
            Self::Sysfs => "sysfs",
            Self::Tc => "tc",
            Self::MapMemory => "map-memory",
        }
    }
}

/// How a counted check went.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
pub enum Outcome {
    /// Asserted exactly.
    Exact,
    /// A bound asserted where exactness could not be (it does not count as exact).
    Bound,
    /// Not asserted: the counts may be short, for the reason given.
    Gated,
}

/// Checks of one kind a test made: how they went, how many, against which oracle, whose
/// counts, and for gated ones why.
#[derive(Clone, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct Tally {
    pub outcome: Outcome,
    pub count: u64,
    pub oracle: Oracle,
    /// The backend whose counts were checked, as the tests name it (`tracepoint`,
    /// `kprobe`); none for figures no single backend counted.
    pub backend: Option<String>,
    /// Why the checks were gated off; only for [`Outcome::Gated`].
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub why: Option<String>,
}

/// Why a line after [`PREFIX`] is not a tally.
#[derive(Debug)]
pub enum Malformed {
    /// Not the JSON of a tally (an unknown oracle or outcome, a count that is not one).
    Json(serde_json::Error),
    /// Gated without a reason, or a reason on a check that was not gated.
    Why,
}

impl std::fmt::Display for Malformed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Json(e) => write!(f, "not a tally: {e}"),
            Self::Why => f.write_str("a reason is given exactly for gated checks"),
        }
    }
}

impl std::error::Error for Malformed {}

impl Tally {
    /// The line a test prints: [`PREFIX`] and the tally's JSON.
    #[must_use]
    pub fn line(&self) -> String {
        json_line(PREFIX, self)
    }

    /// A tally from its JSON (the part of a line after [`PREFIX`]).
    ///
    /// # Errors
    /// If it is not a tally's JSON, or gives a reason exactly where the checks were not
    /// gated.
    pub fn parse(json: &str) -> Result<Self, Malformed> {
        let tally: Self = serde_json::from_str(json).map_err(Malformed::Json)?;
        if (tally.outcome == Outcome::Gated) != tally.why.is_some() {
            return Err(Malformed::Why);
        }
        Ok(tally)
    }

    /// The backend as a summary names it: `-` for none.
    #[must_use]
    pub fn by(&self) -> &str {
        self.backend.as_deref().unwrap_or("-")
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_tally_reads_back_as_written() {
        let gated = Tally {
            outcome: Outcome::Gated,
            count: 9,
            oracle: Oracle::DeviceStats,
            backend: None,
            why: Some("the kernel skipped runs - of the watch's programs".to_owned()),
        };
        let line = gated.line();
        let json = line.strip_prefix(PREFIX).unwrap();
        assert_eq!(Tally::parse(json).unwrap(), gated);
        for oracle in Oracle::ALL {
            let json = serde_json::to_string(&oracle).unwrap();
            assert_eq!(json, format!("\"{}\"", oracle.name()));
        }
    }

    /// The line a guest's init prints (`xtask/src/vm/payload.rs`, by `printf`) reads as a
    /// verdict, uptimes and all.
    #[test]
    fn a_verdict_reads_from_the_inits_line() {
        let line = r#"{"binary":"ring","test":"a::b","exit":101,"timed_out":false,"started_s":12.50,"ended_s":20.75}"#;
        let verdict = Verdict::parse(line).unwrap();
        assert_eq!(verdict.test, "a::b");
        assert!(!verdict.passed());
        assert!((verdict.secs() - 8.25).abs() < 1e-9);
    }

    /// A skip and a retry read back as written, and word themselves as summaries and
    /// `xtask/expected.toml` name them.
    #[test]
    fn skips_and_retries_read_back_as_written() {
        for skip in [
            Skip::test("this kernel has no kprobes"),
            Skip::part("backend Kprobe", "no kprobes: \"quoted\"\nand a new line"),
        ] {
            let line = skip.line();
            assert!(!line.contains('\n'), "{line}");
            let json = line.strip_prefix(SKIP_PREFIX).unwrap();
            assert_eq!(Skip::parse(json).unwrap(), skip);
        }
        assert_eq!(
            Skip::test("no fq_codel").to_string(),
            "skipping test - no fq_codel"
        );
        assert_eq!(
            Skip::part("ring occupancy", "no BTF for tun").to_string(),
            "skipping ring occupancy - no BTF for tun"
        );
        let retry = Retry {
            scenario: "multiqueue".to_owned(),
            attempt: 1,
            attempts: 4,
            why: "the kernel skipped runs".to_owned(),
        };
        let line = retry.line();
        assert_eq!(
            Retry::parse(line.strip_prefix(RETRY_PREFIX).unwrap()).unwrap(),
            retry
        );
        assert_eq!(
            retry.to_string(),
            "retrying - multiqueue: attempt 1 of 4: the kernel skipped runs"
        );
        assert!(Skip::parse(r#"{"why":"x","test":"y"}"#).is_err());
    }

    #[test]
    fn what_is_not_a_tally_says_so() {
        for json in [
            r#"{"outcome":"gated","count":3,"oracle":"qdisc","backend":"kprobe"}"#,
            r#"{"outcome":"exact","count":3,"oracle":"qdisc","backend":"kprobe","why":"x"}"#,
            r#"{"outcome":"exact","count":-1,"oracle":"qdisc","backend":null}"#,
            r#"{"outcome":"exact","count":1,"oracle":"astrology","backend":null}"#,
            "exact 12 device-stats tracepoint",
        ] {
            assert!(Tally::parse(json).is_err(), "{json}");
        }
    }
}
