//! `tap-probe check SPEC`: runs the scenarios of a spec on the running kernel, one after
//! another, and judges their expectations; exit 0 when all hold, 1 when one fails, 2 when
//! the spec or the kernel is the problem or the run could not be completed (an output that
//! cannot be written), and, stopped by a signal, that signal. The CI gate, typically inside
//! a guest:
//! `tap-probe vm --kernel bzImage --out out -- check lab.toml --junit out/junit.xml`.

use std::path::{Path, PathBuf};
use std::process::ExitCode;
use std::time::Instant;

use anyhow::Result;
use tap_probe_common::echo::{MAX_CHARS, quoted};

use crate::output::Format;
use crate::output::progress::{Progress, Status};
use tap_probe_lab::check::report::{CheckReport, Exit, ScenarioReport};
use tap_probe_lab::check::{junit, run};
use tap_probe_observer::kernel::KernelInfo;
use tap_probe_observer::os::files;
use tap_probe_observer::os::signals::{Stop, Why};
use tap_probe_spec::baseline::{self, SavedBaseline};
use tap_probe_spec::spec::{self, Spec};

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
/// When stdout's reader or terminal went away (the process then ends with its signal);
/// problems of the spec, the kernel or an output are reported and give exit code 2 instead.
pub(crate) fn run(args: &Args) -> Result<ExitCode> {
    // Before anything is read or made: an output that cannot be written costs one line.
    let mut unusable = false;
    for (flag, path) in outputs(args) {
        if let Err(problem) = files::check_output(path, flag) {
            eprintln!("tap-probe check: {problem}");
            unusable = true;
        }
    }
    if unusable {
        return Ok(ExitCode::from(Exit::Problem.code()));
    }
    let (spec, baseline) = match read_inputs(args) {
        Ok(inputs) => inputs,
        Err(problem) => {
            eprintln!("tap-probe check: {problem:#}");
            if let Some(junit) = &args.junit {
                let problem =
                    junit::spec_problem(&args.spec.display().to_string(), &format!("{problem:#}"));
                if let Err(err) = write(junit, "--junit", &problem) {
                    eprintln!("tap-probe check: {err}");
                }
            }
            return Ok(ExitCode::from(Exit::Problem.code()));
        }
    };
    if let Some(baseline) = &baseline {
        let here = tap_probe_observer::kernel::release();
        if baseline.kernel_release() != here {
            eprintln!(
                "tap-probe check: the baseline was measured on {}, this is {here}",
                quoted(baseline.kernel_release(), MAX_CHARS)
            );
        }
    }
    let mut report = match run_scenarios(&spec, baseline.as_ref()) {
        Ok(report) => report,
        Err(problem) => {
            // The kernel (or the machine) cannot run tap-probe at all: every scenario is
            // an error, so CI sees which ones did not run and why.
            let message = format!("{problem:#}");
            eprintln!("tap-probe check: {message}");
            CheckReport::new(
                tap_probe_observer::kernel::release(),
                spec.scenarios
                    .iter()
                    .map(|s| ScenarioReport::errored(s, message.clone(), None, 0.0))
                    .collect(),
            )
        }
    };
    report.stopped_by = tap_probe_observer::os::signals::why().map(Why::signal);
    // The files first, so that the report's last line states the status they leave: a file
    // that cannot be written after all (a full disk, `/dev/full`) means the run could not be
    // completed, exit 2, not that an expectation failed.
    if let Some(path) = &args.junit
        && let Err(err) = write(path, "--junit", &junit::render(&report))
    {
        eprintln!("tap-probe check: {err}");
        report.unwritten.push(format!("--junit {}", path.display()));
    }
    if let Some(path) = &args.save_baseline
        && let Err(err) = write(path, "--save-baseline", &report.baseline().to_json())
    {
        eprintln!("tap-probe check: {err}");
        report
            .unwritten
            .push(format!("--save-baseline {}", path.display()));
    }
    let shown = crate::output::stdout(&match args.format {
        Format::Table => report.text(),
        Format::Json => report.to_json() + "\n",
    });
    match shown {
        Ok(()) => Ok(ExitCode::from(report.exit().code())),
        // Its reader or terminal is gone: the process ends with the signal that says so.
        Err(err) if crate::output::is_closed_stdout(&err) => Err(err),
        Err(err) => {
            eprintln!("tap-probe check: {err:#}");
            Ok(ExitCode::from(Exit::Problem.code()))
        }
    }
}

/// The files the run writes, by the flag that names them.
fn outputs(args: &Args) -> impl Iterator<Item = (&'static str, &Path)> {
    [
        ("--junit", &args.junit),
        ("--save-baseline", &args.save_baseline),
    ]
    .into_iter()
    .filter_map(|(flag, path)| Some((flag, path.as_deref()?)))
}

/// The baseline and the spec, read within their bounds and checked completely (the spec's
/// names against what tap-probe measures, `baseline.NAME` against the baseline) before
/// any traffic runs.
fn read_inputs(args: &Args) -> Result<(Spec, Option<SavedBaseline>)> {
    let baseline = args
        .baseline
        .as_deref()
        .map(|path| {
            let text = files::read_input(
                path,
                "--baseline",
                baseline::MAX_BYTES,
                "pass a file written by `tap-probe check --save-baseline FILE`",
            )?;
            SavedBaseline::parse(&text, &path.display().to_string())
        })
        .transpose()?;
    let text = files::read_input(
        &args.spec,
        "the spec",
        spec::MAX_BYTES,
        "give a TOML file of [[scenario]] tables (docs/check-and-bench.md)",
    )?;
    let spec = Spec::parse(&text, &run::known_names(), baseline.as_ref()).map_err(|errors| {
        anyhow::anyhow!("{} is not a usable spec:\n{errors}", args.spec.display())
    })?;
    Ok((spec, baseline))
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
    Ok(CheckReport::new(kernel.release.clone(), scenarios))
}

/// Writes the output `flag` names.
fn write(path: &Path, flag: &str, text: &str) -> Result<(), String> {
    std::fs::write(path, text)
        .map_err(|err| format!("{flag} {} could not be written: {err}", path.display()))
}
