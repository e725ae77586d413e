//! The A/B harness every throughput benchmark shares: variants run in rounds, in an order
//! that alternates between rounds so that drift over time does not favour one (an unmeasured
//! warm-up round first where first use is costly); each run is valid, invalid (it ran, but
//! what it measured cannot be trusted) or failed; per variant the medians of its valid runs
//! and the ratio of its throughput to the baseline's; goals, met or not or not measurable;
//! and a table.
//!
//! Where the runs happen is the benchmark's business: [`run_on_host`] runs them here, a
//! guest benchmark schedules the same [`Schedule`] in its guest and builds [`Run`]s from
//! what the guest reports. [`Results`] then summarises, prints and writes either alike.

use std::collections::BTreeMap;
use std::fmt::{self, Write as _};
use std::path::Path;

use serde::{Deserialize, Serialize};

use super::{kernel_release, median, round_order, write_json};

/// The order of a benchmark's runs.
#[derive(Clone, Debug)]
pub(crate) struct Schedule<V> {
    /// The variants in forward order; the first is the baseline of the ratios.
    pub(crate) variants: Vec<V>,
    /// Measured rounds.
    pub(crate) rounds: u32,
    /// Whether an unmeasured round comes first.
    pub(crate) warm_up: bool,
}

impl<V: Copy> Schedule<V> {
    /// Every run in order: the warm-up round (`None`), then each round's variants, forward
    /// on even rounds (counted from 0) and reversed on odd ones.
    pub(crate) fn runs(&self) -> Vec<(Option<u32>, V)> {
        let warm_up: Vec<(Option<u32>, V)> = if self.warm_up {
            self.variants.iter().map(|&v| (None, v)).collect()
        } else {
            Vec::new()
        };
        let rounds = (0..self.rounds).flat_map(|round| {
            round_order(self.variants.clone(), round)
                .into_iter()
                .map(move |v| (Some(round), v))
        });
        warm_up.into_iter().chain(rounds).collect()
    }

    pub(crate) fn baseline(&self) -> V {
        self.variants[0]
    }
}

/// What became of a run.
#[derive(Clone, Debug, PartialEq, Serialize, Deserialize)]
#[serde(tag = "status", content = "reason", rename_all = "kebab-case")]
pub(crate) enum Status {
    Valid,
    /// It ran, but what it measured cannot be trusted (a probe that missed packets would
    /// look cheaper than it is).
    Invalid(String),
    /// It did not run to its end.
    Failed(String),
    /// What it measures cannot run on this kernel (a probe backend it lacks): reported,
    /// neither measured nor a problem.
    Unavailable(String),
}

/// One run: its place in the schedule, its status and what it measured.
#[derive(Clone, Debug, Serialize, Deserialize)]
pub(crate) struct Run<V, R> {
    /// `None` in the warm-up round.
    pub(crate) round: Option<u32>,
    pub(crate) variant: V,
    #[serde(flatten)]
    pub(crate) status: Status,
    #[serde(flatten)]
    pub(crate) data: R,
}

/// A number each run reports, summarised per variant by its median.
pub(crate) struct Measure<R> {
    pub(crate) name: &'static str,
    pub(crate) value: fn(&R) -> Option<f64>,
    /// Decimals in the table.
    pub(crate) digits: usize,
}

/// Runs `schedule` on this host, one run after another, printing progress. A run that
/// returns an error fails the benchmark at once (its processes are cleaned up by their
/// guards); an invalid run is recorded and reported at the end.
///
/// # Errors
/// The first run that fails.
pub(crate) fn run_on_host<V: Copy + fmt::Display, R>(
    bench: &str,
    schedule: &Schedule<V>,
    mut run: impl FnMut(Option<u32>, V) -> anyhow::Result<(Status, R)>,
) -> anyhow::Result<Vec<Run<V, R>>> {
    let mut runs = Vec::new();
    for (round, variant) in schedule.runs() {
        let label = round.map_or_else(|| "warm-up".to_owned(), |r| format!("round {}", r + 1));
        eprintln!("==> bench {bench}: {label}/{}: {variant}", schedule.rounds);
        let (status, data) =
            run(round, variant).map_err(|err| err.context(format!("{label}, {variant}")))?;
        if let Status::Invalid(why) = &status {
            eprintln!("    INVALID: {why}");
        }
        runs.push(Run {
            round,
            variant,
            status,
            data,
        });
    }
    Ok(runs)
}

/// One variant, summarised over its valid measured runs.
#[derive(Debug, Serialize)]
pub(crate) struct VariantSummary<V> {
    pub(crate) variant: V,
    pub(crate) valid_runs: usize,
    /// Medians by measure name; a measure no valid run reported is left out.
    pub(crate) medians: BTreeMap<&'static str, f64>,
    /// Median throughput over the baseline's.
    pub(crate) ratio: Option<f64>,
    /// `1 - ratio`: the share of the baseline's throughput lost.
    pub(crate) loss: Option<f64>,
    /// What each unit of throughput costs over the baseline, in nanoseconds, by
    /// subtraction of the medians: `1e9 / throughput - 1e9 / baseline` (per packet, for a
    /// throughput in packets per second).
    pub(crate) ns_per_unit: Option<f64>,
}

/// A goal: met, not met, or not measurable (`met: None`).
#[derive(Debug, Serialize)]
pub(crate) struct Goal {
    pub(crate) rule: String,
    pub(crate) value: Option<f64>,
    pub(crate) met: Option<bool>,
}

impl Goal {
    /// `value >= min`.
    pub(crate) fn at_least(rule: impl Into<String>, value: Option<f64>, min: f64) -> Self {
        Self {
            rule: rule.into(),
            value,
            met: value.map(|v| v >= min),
        }
    }

    /// `value <= max`.
    pub(crate) fn at_most(rule: impl Into<String>, value: Option<f64>, max: f64) -> Self {
        Self {
            rule: rule.into(),
            value,
            met: value.map(|v| v <= max),
        }
    }

    fn status(&self) -> &'static str {
        match self.met {
            Some(true) => "met",
            Some(false) => "NOT met",
            None => "not measurable",
        }
    }
}

/// A benchmark's results: what it ran, the runs, each variant's summary, the goals, and
/// the problems (failed or invalid runs) that fail it.
#[derive(Debug, Serialize)]
pub(crate) struct Results<V, R, C> {
    pub(crate) bench: &'static str,
    pub(crate) kernel: String,
    pub(crate) config: C,
    pub(crate) runs: Vec<Run<V, R>>,
    pub(crate) variants: Vec<VariantSummary<V>>,
    pub(crate) goals: Vec<Goal>,
    pub(crate) problems: Vec<String>,
}

impl<V: Copy + Eq + fmt::Display + Serialize, R: Serialize, C: Serialize> Results<V, R, C> {
    /// Summarises `runs`: per variant of `schedule` the medians of `measures` over its
    /// valid measured runs, and the ratio of its median `throughput` to the baseline's.
    pub(crate) fn new(
        bench: &'static str,
        config: C,
        schedule: &Schedule<V>,
        runs: Vec<Run<V, R>>,
        measures: &[Measure<R>],
        throughput: &'static str,
    ) -> Self {
        let summarise = |variant: V| {
            let valid: Vec<&R> = runs
                .iter()
                .filter(|r| r.variant == variant && r.round.is_some() && r.status == Status::Valid)
                .map(|r| &r.data)
                .collect();
            let medians: BTreeMap<&'static str, f64> = measures
                .iter()
                .filter_map(|m| {
                    let values: Vec<f64> = valid.iter().filter_map(|r| (m.value)(r)).collect();
                    (!values.is_empty()).then(|| (m.name, median(&values)))
                })
                .collect();
            (valid.len(), medians)
        };
        let baseline = summarise(schedule.baseline()).1.get(throughput).copied();
        let variants = schedule
            .variants
            .iter()
            .map(|&variant| {
                let (valid_runs, medians) = summarise(variant);
                let pair = medians
                    .get(throughput)
                    .copied()
                    .zip(baseline)
                    .filter(|&(value, base)| value > 0.0 && base > 0.0);
                let ratio = pair.map(|(value, base)| value / base);
                VariantSummary {
                    variant,
                    valid_runs,
                    medians,
                    ratio,
                    loss: ratio.map(|r| 1.0 - r),
                    ns_per_unit: pair.map(|(value, base)| 1e9 / value - 1e9 / base),
                }
            })
            .collect();
        let problems = runs
            .iter()
            .filter_map(|run| match &run.status {
                Status::Valid | Status::Unavailable(_) => None,
                Status::Invalid(why) | Status::Failed(why) => Some(format!(
                    "{}, {}: {why}",
                    run.round
                        .map_or_else(|| "warm-up".to_owned(), |r| format!("round {}", r + 1)),
                    run.variant
                )),
            })
            .collect();
        Self {
            bench,
            kernel: kernel_release(),
            config,
            runs,
            variants,
            goals: Vec::new(),
            problems,
        }
    }

    /// The summary of `variant`.
    pub(crate) fn variant(&self, variant: V) -> Option<&VariantSummary<V>> {
        self.variants.iter().find(|v| v.variant == variant)
    }

    /// Prints the tables and the goals, writes the JSON to `out`, and fails if a run did.
    ///
    /// # Errors
    /// When the results cannot be written, or a run failed or was invalid.
    pub(crate) fn finish(&self, measures: &[Measure<R>], out: &Path) -> anyhow::Result<()> {
        print!("{}", self.table(measures));
        write_json(out, self)?;
        eprintln!("xtask bench {}: results in {}", self.bench, out.display());
        if self.problems.is_empty() {
            Ok(())
        } else {
            anyhow::bail!("{}", self.problems.join("; "))
        }
    }

    /// Every run, then every variant, then the goals and the problems.
    pub(crate) fn table(&self, measures: &[Measure<R>]) -> String {
        let num = |value: Option<f64>, digits: usize| {
            value.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
        };
        let mut runs = vec![
            ["round", "variant"]
                .into_iter()
                .chain(measures.iter().map(|m| m.name))
                .chain(["status"])
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        ];
        for run in &self.runs {
            let mut row = vec![
                run.round
                    .map_or_else(|| "warm-up".to_owned(), |r| (r + 1).to_string()),
                run.variant.to_string(),
            ];
            row.extend(measures.iter().map(|m| num((m.value)(&run.data), m.digits)));
            row.push(match &run.status {
                Status::Valid => "valid".to_owned(),
                Status::Invalid(why) => format!("INVALID: {why}"),
                Status::Failed(why) => format!("FAILED: {why}"),
                Status::Unavailable(why) => format!("unavailable: {why}"),
            });
            runs.push(row);
        }
        let mut variants = vec![
            ["variant", "valid"]
                .into_iter()
                .chain(measures.iter().map(|m| m.name))
                .chain(["ratio", "loss", "ns_each"])
                .map(str::to_owned)
                .collect::<Vec<_>>(),
        ];
        for v in &self.variants {
            let mut row = vec![v.variant.to_string(), v.valid_runs.to_string()];
            row.extend(
                measures
                    .iter()
                    .map(|m| num(v.medians.get(m.name).copied(), m.digits)),
            );
            row.push(num(v.ratio, 4));
            row.push(num(v.loss, 4));
            row.push(num(v.ns_per_unit, 1));
            variants.push(row);
        }
        let mut out = columns(&runs);
        out.push_str(
            "\nmedians of the valid runs (ns_each: nanoseconds each unit of throughput costs \
             over the baseline, 1e9/X - 1e9/baseline):\n",
        );
        out.push_str(&columns(&variants));
        out.push('\n');
        for goal in &self.goals {
            let _ = writeln!(
                out,
                "goal {}: {}{}",
                goal.rule,
                goal.status(),
                goal.value
                    .map_or_else(String::new, |v| format!(" ({v:.4})"))
            );
        }
        for problem in &self.problems {
            let _ = writeln!(out, "problem: {problem}");
        }
        out
    }
}

/// Right-aligned columns (the first two left), two spaces apart; the last column is free
/// text.
fn columns(rows: &[Vec<String>]) -> String {
    let count = rows.iter().map(Vec::len).max().unwrap_or(0);
    let widths: Vec<usize> = (0..count)
        .map(|c| {
            rows.iter()
                .filter_map(|r| r.get(c))
                .map(|s| s.chars().count())
                .max()
                .unwrap_or(0)
        })
        .collect();
    let mut out = String::new();
    for row in rows {
        let cells: Vec<String> = row
            .iter()
            .enumerate()
            .map(|(c, cell)| {
                let w = widths[c];
                if c < 2 || c + 1 == row.len() {
                    format!("{cell:<w$}")
                } else {
                    format!("{cell:>w$}")
                }
            })
            .collect();
        out.push_str(cells.join("  ").trim_end());
        out.push('\n');
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    #[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize)]
    enum V {
        Off,
        On,
    }

    impl fmt::Display for V {
        fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
            f.write_str(match self {
                Self::Off => "off",
                Self::On => "on",
            })
        }
    }

    #[test]
    fn rounds_alternate_after_a_warm_up() {
        let schedule = Schedule {
            variants: vec![V::Off, V::On],
            rounds: 3,
            warm_up: true,
        };
        assert_eq!(
            schedule.runs(),
            [
                (None, V::Off),
                (None, V::On),
                (Some(0), V::Off),
                (Some(0), V::On),
                (Some(1), V::On),
                (Some(1), V::Off),
                (Some(2), V::Off),
                (Some(2), V::On),
            ]
        );
    }

    #[test]
    fn medians_ratios_and_problems_come_from_valid_measured_runs() {
        let schedule = Schedule {
            variants: vec![V::Off, V::On],
            rounds: 3,
            warm_up: true,
        };
        let pps = [
            (None, V::Off, 1.0, Status::Valid),
            (Some(0), V::Off, 100.0, Status::Valid),
            (Some(1), V::Off, 110.0, Status::Valid),
            (Some(2), V::Off, 90.0, Status::Valid),
            (Some(0), V::On, 95.0, Status::Valid),
            (
                Some(1),
                V::On,
                1000.0,
                Status::Invalid("counted 0".to_owned()),
            ),
            (Some(2), V::On, 85.0, Status::Valid),
        ];
        let runs = pps
            .into_iter()
            .map(|(round, variant, pps, status)| Run {
                round,
                variant,
                status,
                data: pps,
            })
            .collect();
        let measures = [Measure {
            name: "pps",
            value: |r: &f64| Some(*r),
            digits: 0,
        }];
        let results = Results::new("t", (), &schedule, runs, &measures, "pps");
        let off = results.variant(V::Off).unwrap();
        assert_eq!((off.valid_runs, off.medians["pps"]), (3, 100.0));
        let on = results.variant(V::On).unwrap();
        assert_eq!((on.valid_runs, on.medians["pps"]), (2, 90.0));
        assert!((on.ratio.unwrap() - 0.9).abs() < 1e-12);
        // A packet at 90 pps takes 11.11 ms, at 100 pps 10 ms: 1.11 ms more each.
        assert!(
            (on.ns_per_unit.unwrap() - 1_111_111.111).abs() < 1e-3,
            "{on:?}"
        );
        assert_eq!(off.ns_per_unit, Some(0.0));
        assert_eq!(results.problems, ["round 2, on: counted 0"]);
        let goal = Goal::at_least("on/off >= 0.97", on.ratio, 0.97);
        assert_eq!(goal.met, Some(false));
        assert_eq!(Goal::at_most("x", None, 1.0).status(), "not measurable");
        let text = results.table(&measures);
        assert!(text.contains("INVALID: counted 0"), "{text}");
    }
}
