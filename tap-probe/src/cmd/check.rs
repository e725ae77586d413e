//! `tap-probe check SPEC`: runs the scenarios of a spec on the running kernel, one after
//! another, and judges their expectations; exit 0 when all hold, 1 when one fails, 2 when
//! the spec or the kernel is the problem. The CI gate, typically inside a guest:
//! `tap-probe vm --kernel bzImage --out out -- check lab.toml --junit out/junit.xml`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::{Context as _, Result};

use crate::output::Format;
use crate::output::progress::{Progress, Status};
use tap_probe_lab::check::report::{CheckReport, Exit, ScenarioReport};
use tap_probe_lab::check::{junit, run};
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::signals::Stop;
use tap_probe_spec::baseline::SavedBaseline;
use tap_probe_spec::spec::Spec;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// The scenario file (TOML `[[scenario]]` tables; see docs/check-and-bench.md).
    spec: PathBuf,
    /// Values of an earlier run (`--save-baseline`), for `baseline.NAME` in expectations.
    #[arg(long, value_name = "FILE")]
    baseline: Option<PathBuf>,
    /// Also write this run's values, for a later `--baseline`.
    #[arg(long, value_name = "FILE")]
    save_baseline: Option<PathBuf>,
    /// Also write a `JUnit` XML report: a test suite per scenario, a test case per expectation.
    #[arg(long, value_name = "FILE")]
    junit: Option<PathBuf>,
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Runs `tap-probe check`.
///
/// # Errors
/// When a report cannot be written; problems of the spec or the kernel are reported and
/// give exit code 2 instead.
pub(crate) fn run(args: &Args) -> Result<ExitCode> {
    let spec = match read_spec(args) {
        Ok(spec) => spec,
        Err(problem) => {
            eprintln!("tap-probe check: {problem:#}");
            if let Some(junit) = &args.junit {
                write(
                    junit,
                    &junit::spec_problem(&args.spec.display().to_string(), &format!("{problem:#}")),
                )?;
            }
            return Ok(ExitCode::from(Exit::Problem.code()));
        }
    };
    let baseline = args
        .baseline
        .as_deref()
        .map(SavedBaseline::read)
        .transpose()?;
    if let Some(baseline) = &baseline {
        let here = tap_probe_observer::kernel::release();
        if baseline.kernel_release() != here {
            eprintln!(
                "tap-probe check: the baseline was measured on {}, this is {here}",
                baseline.kernel_release()
            );
        }
    }
    let report = match run_scenarios(&spec, baseline.as_ref()) {
        Ok(report) => report,
        Err(problem) => {
            // The kernel (or the machine) cannot run tap-probe at all: every scenario is
            // an error, so CI sees which ones did not run and why.
            let message = format!("{problem:#}");
            eprintln!("tap-probe check: {message}");
            CheckReport {
                kernel_release: tap_probe_observer::kernel::release(),
                scenarios: spec
                    .scenarios
                    .iter()
                    .map(|s| ScenarioReport::errored(s, message.clone(), None, 0.0))
                    .collect(),
            }
        }
    };
    crate::output::stdout(&match args.format {
        Format::Table => report.text(),
        Format::Json => report.to_json() + "\n",
    })?;
    if let Some(junit) = &args.junit {
        write(junit, &junit::render(&report))?;
    }
    if let Some(path) = &args.save_baseline {
        report.baseline().write(path)?;
    }
    Ok(ExitCode::from(report.exit().code()))
}

/// The spec, checked completely (its names against what tap-probe measures, `baseline.NAME`
/// against the baseline) before any traffic runs.
fn read_spec(args: &Args) -> Result<Spec> {
    let text = std::fs::read_to_string(&args.spec)
        .with_context(|| format!("cannot read the spec {}", args.spec.display()))?;
    let baseline = args
        .baseline
        .as_deref()
        .map(SavedBaseline::read)
        .transpose()?;
    Spec::parse(&text, &run::known_names(), baseline.as_ref()).map_err(|errors| {
        anyhow::anyhow!("{} is not a usable spec:\n{errors}", args.spec.display())
    })
}

/// Every scenario in turn; a scenario the kernel refuses is an error of its own and the
/// others still run.
fn run_scenarios(spec: &Spec, baseline: Option<&SavedBaseline>) -> Result<CheckReport> {
    tap_probe_observer::kernel::privileges::check()?;
    let kernel = KernelInfo::load()?;
    let stop = Stop::install()?;
    let total = spec.scenarios.len();
    let mut progress = Progress::stderr();
    let mut scenarios = Vec::with_capacity(total);
    for (i, scenario) in spec.scenarios.iter().enumerate() {
        // A stopped run still reports every scenario: those done with their verdicts, the
        // one cut short and the rest as errors that say so, so CI sees how far it got.
        if stop.stopped() {
            let why = tap_probe_observer::os::signals::why()
                .map_or_else(String::new, |why| format!(": {why}"));
            scenarios.push(ScenarioReport::errored(
                scenario,
                format!("not run, the check was stopped{why}"),
                None,
                0.0,
            ));
            continue;
        }
        progress.update(&Status {
            what: &scenario.name,
            step: Some((i as u64, total as u64)),
            left: scenario.traffic.duration,
            detail: "",
        });
        let started = Instant::now();
        let report = match run::run(&scenario.traffic, &kernel, &stop.flag()) {
            Ok(measured) => ScenarioReport::judged(
                scenario,
                measured,
                baseline,
                started.elapsed().as_secs_f64(),
            ),
            Err(err) => ScenarioReport::errored(
                scenario,
                format!("{err:#}"),
                None,
                started.elapsed().as_secs_f64(),
            ),
        };
        progress.note(&format!(
            "{}/{total} {}: {}",
            i + 1,
            scenario.name,
            report.verdict.label()
        ));
        scenarios.push(report);
    }
    progress.finish();
    Ok(CheckReport {
        kernel_release: kernel.release.clone(),
        scenarios,
    })
}

fn write(path: &Path, text: &str) -> Result<()> {
    std::fs::write(path, text).with_context(|| format!("cannot write {}", path.display()))
}
