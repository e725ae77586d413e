//! Checks against oracles, counted. A privileged test is worth what it compares tap-probe's
//! figures with: the kernel's own counters, the reader's and the sender's counts, the qdisc,
//! the TCP stack. Each such comparison goes through [`Checks`], which asserts it where the
//! backend's counts can be held to exactness and otherwise only counts it as gated, with
//! why. When the test ends, [`Checks`] prints one [`Tally`] per oracle, backend and outcome,
//! a JSON line of the type `cargo xtask test` reads back (the tests run with
//! `--show-output`); it fails a kernel on which no exact check of a kind its backends
//! support was made.

use std::collections::BTreeMap;
use std::fmt::{Debug, Display};

use tap_probe_observer::bpf::backend::Backend;
use tap_probe_observer::host::watcher::Watcher;
pub(crate) use tap_probe_verdict::Oracle;
use tap_probe_verdict::{Outcome, Tally};

/// Whose counts a check is about, and whether they can be held to exactness: a backend
/// whose programs the kernel skipped counts short, and its checks are gated off, saying why.
#[derive(Clone, Debug)]
pub(crate) struct Gate {
    backend: Option<Backend>,
    shut: Option<String>,
}

impl Gate {
    /// Checks of figures no backend counted (the kernel's against another reading).
    pub(crate) fn none() -> Self {
        Self {
            backend: None,
            shut: None,
        }
    }

    /// Checks of figures no backend counted alone (a `watch`'s report, its sources chosen
    /// counter by counter) that the report says may be short: gated off, saying why.
    pub(crate) fn short(why: &str) -> Self {
        Self {
            backend: None,
            shut: Some(why.to_owned()),
        }
    }

    /// Checks of `backend`'s counts, exact where the kernel skipped none of its programs'
    /// runs (see [`super::exact`]).
    pub(crate) fn of(backend: Backend, watcher: &Watcher) -> Self {
        Self {
            backend: Some(backend),
            shut: super::short(watcher),
        }
    }

    /// Checks of `backend`'s counts made by programs another process loaded (`tap-probe
    /// serve`), of whose runs the kernel skipped `missed` (their `recursion_misses`, read by
    /// program id): exact where it skipped none, as [`Gate::of`] for a watcher of the test's.
    pub(crate) fn of_programs(backend: Backend, missed: u64) -> Self {
        Self {
            backend: Some(backend),
            shut: (missed > 0).then(|| "the kernel skipped runs of its programs".to_owned()),
        }
    }

    /// Checks of `backend`'s counts that hold whatever the kernel skipped, or fail: a test
    /// that asserted them before misses were read keeps asserting them.
    pub(crate) fn always(backend: Backend) -> Self {
        Self {
            backend: Some(backend),
            shut: None,
        }
    }

    /// As [`Gate::of`], for traffic the driver sees in a softirq that can interrupt the
    /// reader's programs (see [`super::exact_under_softirq`]).
    pub(crate) fn under_softirq(backend: Backend, watcher: &Watcher) -> Self {
        Self {
            backend: Some(backend),
            shut: super::short_under_softirq(watcher),
        }
    }

    /// This gate, shut for `why` if there is one and it was open: a reason the test knows
    /// that makes the comparison's oracle uncertain.
    pub(crate) fn unless(mut self, why: Option<&str>) -> Self {
        if self.shut.is_none() {
            self.shut = why.map(str::to_owned);
        }
        self
    }

    /// Shuts the gate for another reason than the backend's own: the other side of a
    /// comparison counts short.
    pub(crate) fn shut_by(&self, other: &Self) -> Self {
        Self {
            backend: self.backend,
            shut: self.shut.clone().or_else(|| other.shut.clone()),
        }
    }

    /// Whether the checks behind this gate are asserted.
    pub(crate) fn is_open(&self) -> bool {
        self.shut.is_none()
    }

    pub(crate) fn backend(&self) -> Option<Backend> {
        self.backend
    }

    /// An identity between tap-probe's own figures, asserted where the gate is open; no
    /// oracle, so not counted.
    #[track_caller]
    pub(crate) fn same<T: Copy + PartialEq + Debug>(&self, a: T, b: T, what: impl Display) {
        if self.is_open() {
            assert_eq!(a, b, "{what} [{}]", by(self.backend));
        }
    }

    /// A condition on tap-probe's own figures (the run proved something), asserted where
    /// the gate is open; not counted.
    #[track_caller]
    pub(crate) fn holds(&self, holds: bool, what: impl Display) {
        if self.is_open() {
            assert!(holds, "{what} [{}]", by(self.backend));
        }
    }
}

/// What a test compared with which oracle; prints its tally when dropped.
#[derive(Debug, Default)]
pub(crate) struct Checks {
    /// Per kind (outcome, oracle, backend, why gated), how many were made.
    made: BTreeMap<(Outcome, Oracle, Option<String>, Option<String>), u64>,
}

impl Checks {
    pub(crate) fn new() -> Self {
        Self::default()
    }

    /// `ours` (tap-probe's figure) equals `theirs` (the oracle's), asserted where `gate`
    /// is open.
    #[track_caller]
    pub(crate) fn eq<T: Copy + PartialEq + Debug>(
        &mut self,
        gate: &Gate,
        oracle: Oracle,
        ours: T,
        theirs: T,
        what: impl Display,
    ) {
        if self.admit(gate, oracle) {
            assert_eq!(
                ours,
                theirs,
                "{what} [{} against {}]",
                by(gate.backend),
                oracle.name()
            );
        }
    }

    /// A comparison with `oracle` that `holds`, asserted where `gate` is open: an exact
    /// relation that is not an equality of two figures (an implication, a sum).
    #[track_caller]
    pub(crate) fn that(&mut self, gate: &Gate, oracle: Oracle, holds: bool, what: impl Display) {
        if self.admit(gate, oracle) {
            assert!(
                holds,
                "{what} [{} against {}]",
                by(gate.backend),
                oracle.name()
            );
        }
    }

    /// A bound from `oracle` that holds however short the backend's counts are, asserted
    /// always; counted apart from the exact checks, which it does not replace.
    #[track_caller]
    pub(crate) fn bound(
        &mut self,
        backend: Option<Backend>,
        oracle: Oracle,
        holds: bool,
        what: impl Display,
    ) {
        *self
            .made
            .entry((Outcome::Bound, oracle, backend.map(name), None))
            .or_default() += 1;
        assert!(holds, "{what} [{} against {}]", by(backend), oracle.name());
    }

    /// Counts a check: made (true) or gated off.
    fn admit(&mut self, gate: &Gate, oracle: Oracle) -> bool {
        let outcome = if gate.is_open() {
            Outcome::Exact
        } else {
            Outcome::Gated
        };
        *self
            .made
            .entry((outcome, oracle, gate.backend.map(name), gate.shut.clone()))
            .or_default() += 1;
        gate.is_open()
    }
}

impl Drop for Checks {
    fn drop(&mut self) {
        for ((outcome, oracle, backend, why), count) in std::mem::take(&mut self.made) {
            let tally = Tally {
                outcome,
                count,
                oracle,
                backend,
                why,
            };
            println!("{}", tally.line());
        }
    }
}

/// A backend as the tally names it (`tracepoint`, `kprobe`).
fn name(backend: Backend) -> String {
    format!("{backend:?}").to_lowercase()
}

/// A backend as a failed check's message names it; `-` for checks no backend counted.
fn by(backend: Option<Backend>) -> String {
    backend.map_or_else(|| "-".to_owned(), name)
}
