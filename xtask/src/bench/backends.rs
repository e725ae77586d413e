//! `cargo xtask bench backends`: what each probe backend costs per packet.
//!
//! The backends differ in the kernel hooks they attach to: kprobes on tun's functions,
//! fentry on the same, the `net`/`skb` tracepoints, or `auto`'s pick per counter. This
//! host's kernel has no kprobes, so the comparison runs inside `cargo xtask vm`'s guest
//! (Debian 12's 6.1 kernel), booted once: its init runs, for each round, `tap-probe load`
//! with no probe and with `tap-probe watch --backend X` attached for each backend. The
//! order alternates (forward on even rounds, reversed on odd) so that drift over the boot
//! does not favour one variant. A shorter, unmeasured warm-up round comes first, so that
//! the costs of first use (QEMU translating the guest's code paths, the first BTF parse)
//! do not fall on round 0 alone.
//!
//! The guest prints one `bench: {json}` console line per run (the load's report, the last
//! watch line that counted the load's tap, exit codes) and then the init's verdict; the
//! host reads them back. A probed run counts only if the watch counted exactly one driver
//! call per packet the load sent (a probe that counted nothing must not look free).
//! Throughput is the load's `delivered_pps`; per variant the results are its median, the
//! ratio to the probe-off median and the loss (1 - ratio), plus the sender's wall-clock
//! nanoseconds per packet. A backend whose watch cannot attach (fentry on tun, a module,
//! with aya 0.14; the pure tracepoint backend on 6.1, whose `consume_skb` tracepoint cannot
//! tell reader takes) is recorded once as unavailable, with the watch's error, and skipped
//! in later rounds.
//!
//! Under emulation (TCG) absolute rates are far below a real machine's; the ratios are
//! what the bench is for. A probed variant's cost includes the watch's own refreshes (twice
//! a second), alike for every backend.

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::Context as _;
use serde::{Deserialize, Serialize};
use serde_json::Value;

use super::{
    WATCH_LOAD_ARGS, default_out, load_args, median, round_order, runs_dir, watched_xmit_calls,
    write_json,
};
use tap_probe_guest::image::sh_quote;
use tap_probe_guest::{AccelChoice, Booted, Image, KernelSpec, Launcher, Series, Verdict, launch};

use crate::{cmd, vm};

/// Seconds the load waits before sending: the watch finds the load's tap at its next
/// refresh (every half second), which takes longer in an emulated guest.
const START_DELAY_S: u32 = 3;

/// Seconds of traffic per run in the warm-up round (at most `--duration`).
const WARM_UP_S: u32 = 5;

/// How long the guest waits for a watch's first line (its probes attached). Parsing the
/// kernel's BTF takes seconds under emulation.
const ATTACH_WAIT_S: u32 = 120;

/// How long the guest gives a watch to exit after SIGTERM before killing it.
const STOP_WAIT_S: u32 = 30;

/// How long a load may run past its start delay and duration before the guest kills it.
const LOAD_GRACE_S: u32 = 60;

/// Host timeout allowance for the boot, `tap-probe doctor` and power-off.
const BOOT_ALLOWANCE_S: u64 = 300;

/// Console lines that carry a run's record.
const RECORD_PREFIX: &str = "bench: ";

/// The load's report field read as throughput.
const THROUGHPUT_FIELD: &str = "delivered_pps";

/// Goal: fentry loses at most this share of what kprobe loses.
const GOAL_MAX_LOSS_RATIO: f64 = 0.5;

#[derive(Debug, clap::Args)]
pub(super) struct Args {
    /// Rounds; each runs every variant once (a backend that cannot attach, only once).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(3..=50))]
    rounds: u32,
    /// Seconds of traffic per run (with the defaults the guest runs about 10 minutes under
    /// TCG).
    #[arg(long, default_value_t = 25, value_parser = clap::value_parser!(u32).range(1..=600))]
    duration: u32,
    /// Where to write the JSON results [default: target/bench/backends.json].
    #[arg(long)]
    out: Option<PathBuf>,
    /// Give up on the guest (and kill QEMU) after this many seconds [default: enough for
    /// every run to use its in-guest time limits].
    #[arg(long)]
    timeout: Option<u64>,
}

impl Args {
    fn timeout_s(&self) -> u64 {
        self.timeout.unwrap_or_else(|| {
            // Every run of every round, the warm-up included, at its in-guest limits.
            let per_run = self.duration + START_DELAY_S + LOAD_GRACE_S + ATTACH_WAIT_S;
            let runs = u64::from(self.rounds + 1) * Variant::ALL.len() as u64;
            BOOT_ALLOWANCE_S + runs * u64::from(per_run)
        })
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "kebab-case")]
enum Variant {
    ProbeOff,
    Kprobe,
    Auto,
    Tracepoint,
    Fentry,
}

impl Variant {
    /// The forward order.
    const ALL: [Self; 5] = [
        Self::ProbeOff,
        Self::Kprobe,
        Self::Auto,
        Self::Tracepoint,
        Self::Fentry,
    ];

    /// The `--backend` of its watch; none for probe-off.
    fn backend(self) -> Option<&'static str> {
        match self {
            Self::ProbeOff => None,
            Self::Kprobe => Some("kprobe"),
            Self::Auto => Some("auto"),
            Self::Tracepoint => Some("tracepoint"),
            Self::Fentry => Some("fentry"),
        }
    }
}

impl fmt::Display for Variant {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        f.write_str(self.backend().unwrap_or("probe-off"))
    }
}

/// Runs `cargo xtask bench backends`.
///
/// # Errors
/// If the build or the guest fails, or any run fails or counts wrong; the results are
/// written first.
pub(super) fn run(args: &Args) -> anyhow::Result<()> {
    let started = Instant::now();
    let out = args.out.clone().unwrap_or_else(|| default_out("backends"));
    let dir = runs_dir(&out)?;
    let (kernel, modules) = vm::prepare(&vm::Guest {
        kernel: KernelSpec::Debian(Series::Debian6_1),
        modules: Vec::new(),
        modules_dir: None,
    })?;
    let tap_probe = cmd::build_release_bin("tap-probe", "tap-probe")?;
    let timeout_s = args.timeout_s();
    eprintln!(
        "==> bench backends: {} rounds of {} s runs in the guest (timeout {timeout_s} s)",
        args.rounds, args.duration
    );
    let mut image = Image::new(&kernel.release, modules, &dir.join("scratch"))?;
    image.executable("/bin/tap-probe", &tap_probe)?;
    image.script(&guest_script(args.rounds, args.duration));
    // The records are long; the progress lines around them say what runs.
    let mut echo = |line: &str| {
        if !line.starts_with(RECORD_PREFIX) {
            println!("{line}");
        }
    };
    let ran = tap_probe_guest::boot(
        &mut Launcher::new(AccelChoice::Auto, "xtask bench"),
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 2048,
            timeout: Duration::from_secs(timeout_s),
            echo: &mut echo,
            stdout: None,
            collect_into: None,
        },
    )?;
    let booted = &ran.booted;
    let records = parse_records(&booted.outcome.lines)?;
    let results = summarize(args, &kernel.release, booted, &records);
    print_table(&results);
    write_json(&out, &results)?;
    eprintln!(
        "xtask bench backends: results in {} (console log {}); {}, all {:.1} s",
        out.display(),
        ran.log.display(),
        booted.times(),
        started.elapsed().as_secs_f64()
    );
    let verdict = match &booted.outcome.verdict {
        Verdict::Success => Ok(()),
        other => Err(anyhow::anyhow!(
            "the guest failed: {}",
            launch::describe(other)
        )),
    };
    if !results.problems.is_empty() {
        let problems = results.problems.join("; ");
        return Err(match verdict {
            Ok(()) => anyhow::anyhow!("{problems}"),
            Err(err) => err.context(problems),
        });
    }
    verdict
}

/// The shell functions the guest's payload calls; [`guest_script`] sets the variables they
/// read and calls `bench_run ROUND VARIANT BACKEND` for each run (ROUND `warm-up` for the
/// warm-up round).
const GUEST_FUNCTIONS: &str = include_str!("backends.sh");

/// The init's payload: the settings, the functions, the warm-up round and every round's
/// runs in order.
fn guest_script(rounds: u32, duration: u32) -> String {
    let quote = |words: &[String]| {
        words
            .iter()
            .map(|word| sh_quote(word))
            .collect::<Vec<_>>()
            .join(" ")
    };
    let settings = [
        ("record_prefix", RECORD_PREFIX.to_owned()),
        ("load_args", quote(&load_args(duration, START_DELAY_S))),
        (
            "warm_up_load_args",
            quote(&load_args(duration.min(WARM_UP_S), START_DELAY_S)),
        ),
        ("watch_args", quote(&WATCH_LOAD_ARGS.map(str::to_owned))),
        ("load_ifname", super::LOAD_IFNAME.to_owned()),
        (
            "load_timeout",
            (duration + START_DELAY_S + LOAD_GRACE_S).to_string(),
        ),
        ("attach_wait", ATTACH_WAIT_S.to_string()),
        ("stop_wait", STOP_WAIT_S.to_string()),
    ];
    let mut script = String::new();
    for (name, value) in settings {
        let _ = writeln!(script, "{name}={}", sh_quote(&value));
    }
    script.push_str(GUEST_FUNCTIONS);
    let rounds = std::iter::once(("warm-up".to_owned(), Variant::ALL))
        .chain((0..rounds).map(|round| (round.to_string(), round_order(Variant::ALL, round))));
    for (round, order) in rounds {
        for variant in order {
            let _ = writeln!(
                script,
                "bench_run {round} {variant} {}",
                variant.backend().unwrap_or("''")
            );
        }
    }
    script
}

/// One `bench: {json}` line from the guest.
#[derive(Debug, Deserialize)]
struct Record {
    /// `None` in the warm-up round.
    round: Option<u32>,
    #[serde(default)]
    warm_up: bool,
    variant: Variant,
    /// The watch's error output, when it exited before attaching.
    unavailable: Option<String>,
    /// What went wrong in the guest, when something did.
    error: Option<String>,
    load_rc: Option<i32>,
    watch_rc: Option<i32>,
    /// The load's report.
    load: Option<Value>,
    /// The watch's last line that shows the load's tap.
    watch: Option<Value>,
}

/// The guest's records, in the order they came.
fn parse_records(lines: &[String]) -> anyhow::Result<Vec<Record>> {
    lines
        .iter()
        .filter_map(|line| line.strip_prefix(RECORD_PREFIX))
        .map(|json| {
            serde_json::from_str(json)
                .with_context(|| format!("unreadable guest record `{RECORD_PREFIX}{json}`"))
        })
        .collect()
}

#[derive(Debug, Serialize)]
struct Run {
    /// `None` in the warm-up round.
    round: Option<u32>,
    variant: Variant,
    #[serde(flatten)]
    status: Status,
    delivered_pps: Option<f64>,
    sender_pps: Option<f64>,
    sent: Option<u64>,
    /// Driver calls the watch counted on the load's tap.
    xmit_calls: Option<u64>,
    /// The sender's wall-clock nanoseconds per packet the stack accepted.
    ns_per_packet: Option<f64>,
    load_rc: Option<i32>,
    watch_rc: Option<i32>,
    /// The load's whole report.
    load: Option<Value>,
    /// Which hooks the watch used, as it reports them.
    sources: Option<Value>,
}

#[derive(Debug, PartialEq, Serialize)]
#[serde(tag = "status", content = "reason", rename_all = "kebab-case")]
enum Status {
    Valid,
    /// Ran, but the watch's count does not match the load's.
    Invalid(String),
    Failed(String),
}

/// Checks one record. A probed run is valid only if its watch counted one driver call for
/// each packet the load sent.
fn evaluate(record: &Record) -> Run {
    let load = record.load.as_ref();
    let number = |name: &str| load.and_then(|load| load.get(name)).and_then(Value::as_f64);
    let sent = load
        .and_then(|load| load.get("sent"))
        .and_then(Value::as_u64);
    let probed = record.variant.backend().is_some();
    let xmit_calls = probed.then(|| watched_xmit_calls(record.watch.as_ref()));
    #[expect(
        clippy::cast_precision_loss,
        reason = "a per-packet time; 52 bits of packet count are plenty"
    )]
    let ns_per_packet = number("elapsed_secs")
        .zip(sent)
        .filter(|&(_, sent)| sent > 0)
        .map(|(secs, sent)| secs * 1e9 / sent as f64);
    let status = if let Some(error) = &record.error {
        Status::Failed(error.clone())
    } else if number(THROUGHPUT_FIELD).is_none() || sent.is_none() {
        Status::Failed(format!(
            "the load's report has no `{THROUGHPUT_FIELD}` or `sent`"
        ))
    } else if let Some(counted) = xmit_calls.filter(|&counted| Some(counted) != sent) {
        Status::Invalid(format!(
            "the watch counted {counted} driver calls on the load's tap, the load sent {}",
            sent.unwrap_or_default()
        ))
    } else {
        Status::Valid
    };
    Run {
        round: record.round,
        variant: record.variant,
        status,
        delivered_pps: number(THROUGHPUT_FIELD),
        sender_pps: number("sender_pps"),
        sent,
        xmit_calls,
        ns_per_packet,
        load_rc: record.load_rc,
        watch_rc: record.watch_rc,
        load: record.load.clone(),
        sources: record
            .watch
            .as_ref()
            .and_then(|watch| watch.get("sources").cloned()),
    }
}

#[derive(Debug, Serialize)]
struct Results {
    bench: &'static str,
    /// The guest's kernel release.
    kernel: String,
    accel: &'static str,
    config: Config,
    guest_elapsed_s: f64,
    verdict: String,
    /// Not measured; listed to show that they ran.
    warm_up_runs: Vec<Run>,
    runs: Vec<Run>,
    variants: Vec<VariantResult>,
    goal: Goal,
    /// Failed, invalid or missing runs; the bench fails if there are any.
    problems: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Config {
    rounds: u32,
    duration_s: u32,
    warm_up_duration_s: u32,
    start_delay_s: u32,
    throughput_field: &'static str,
    order: &'static str,
}

#[derive(Debug, Serialize)]
struct VariantResult {
    variant: Variant,
    /// `measured`, `unavailable: <the watch's error>` or `no valid runs`.
    status: String,
    valid_runs: usize,
    median_delivered_pps: Option<f64>,
    median_sender_pps: Option<f64>,
    /// Median delivered throughput over probe-off's.
    ratio: Option<f64>,
    /// 1 - ratio.
    loss: Option<f64>,
    median_ns_per_packet: Option<f64>,
    /// Over probe-off's median.
    added_ns_per_packet: Option<f64>,
    /// Which hooks the watch used (from its first valid run).
    sources: Option<Value>,
}

#[derive(Debug, Serialize)]
struct Goal {
    rule: &'static str,
    /// loss(fentry) / loss(kprobe), when kprobe lost anything.
    value: Option<f64>,
    /// `null` when not measurable.
    met: Option<bool>,
    status: String,
}

fn summarize(args: &Args, kernel: &str, booted: &Booted, records: &[Record]) -> Results {
    let evaluated = |warm_up: bool| -> Vec<Run> {
        records
            .iter()
            .filter(|record| record.unavailable.is_none() && record.warm_up == warm_up)
            .map(evaluate)
            .collect()
    };
    let (warm_up_runs, runs) = (evaluated(true), evaluated(false));
    let unavailable = |variant| {
        records
            .iter()
            .find(|record| record.variant == variant)
            .and_then(|record| record.unavailable.as_deref())
    };
    let mut problems: Vec<String> = warm_up_runs
        .iter()
        .chain(&runs)
        .filter_map(|run| match &run.status {
            Status::Valid => None,
            Status::Invalid(why) | Status::Failed(why) => Some(format!(
                "{}, {}: {why}",
                round_label(run.round),
                run.variant
            )),
        })
        .collect();
    for variant in Variant::ALL {
        let ran = runs.iter().filter(|run| run.variant == variant).count();
        if unavailable(variant).is_none() && ran != args.rounds as usize {
            problems.push(format!(
                "{variant}: {ran} of {} runs reported by the guest",
                args.rounds
            ));
        }
    }
    let variants = variant_results(&runs, unavailable);
    let goal = goal(&variants, unavailable(Variant::Fentry));
    Results {
        bench: "backends",
        kernel: kernel.to_owned(),
        accel: booted.accel.name(),
        config: Config {
            rounds: args.rounds,
            duration_s: args.duration,
            warm_up_duration_s: args.duration.min(WARM_UP_S),
            start_delay_s: START_DELAY_S,
            throughput_field: THROUGHPUT_FIELD,
            order: "probe-off, kprobe, auto, tracepoint, fentry on even rounds (from 0), \
                    reversed on odd ones",
        },
        guest_elapsed_s: booted.outcome.elapsed.as_secs_f64(),
        verdict: format!("{:?}", booted.outcome.verdict),
        warm_up_runs,
        runs,
        variants,
        goal,
        problems,
    }
}

/// Medians over each variant's valid runs, and how they compare with probe-off's.
fn variant_results<'a>(
    runs: &[Run],
    unavailable: impl Fn(Variant) -> Option<&'a str>,
) -> Vec<VariantResult> {
    let median_of = |variant, field: fn(&Run) -> Option<f64>| {
        let values: Vec<f64> = runs
            .iter()
            .filter(|run| run.variant == variant && run.status == Status::Valid)
            .filter_map(field)
            .collect();
        (!values.is_empty()).then(|| median(&values))
    };
    let off_pps = median_of(Variant::ProbeOff, |run| run.delivered_pps);
    let off_ns = median_of(Variant::ProbeOff, |run| run.ns_per_packet);
    Variant::ALL
        .into_iter()
        .map(|variant| {
            let valid: Vec<&Run> = runs
                .iter()
                .filter(|run| run.variant == variant && run.status == Status::Valid)
                .collect();
            let delivered = median_of(variant, |run| run.delivered_pps);
            let ratio = delivered
                .zip(off_pps)
                .filter(|&(_, off)| off > 0.0)
                .map(|(pps, off)| pps / off);
            let ns = median_of(variant, |run| run.ns_per_packet);
            let status = match unavailable(variant) {
                Some(reason) => format!("unavailable: {reason}"),
                None if valid.is_empty() => "no valid runs".to_owned(),
                None => "measured".to_owned(),
            };
            VariantResult {
                variant,
                status,
                valid_runs: valid.len(),
                median_delivered_pps: delivered,
                median_sender_pps: median_of(variant, |run| run.sender_pps),
                ratio,
                loss: ratio.map(|ratio| 1.0 - ratio),
                median_ns_per_packet: ns,
                added_ns_per_packet: ns.zip(off_ns).map(|(ns, off)| ns - off),
                sources: valid.iter().find_map(|run| run.sources.clone()),
            }
        })
        .collect()
}

/// fentry's loss at most half of kprobe's.
fn goal(variants: &[VariantResult], fentry_unavailable: Option<&str>) -> Goal {
    let rule = "loss(fentry) <= loss(kprobe)/2, loss(X) = 1 - X/probe-off";
    let loss = |variant| {
        variants
            .iter()
            .find(|result| result.variant == variant)
            .and_then(|result| result.loss)
    };
    let not_measurable = |why: String| Goal {
        rule,
        value: None,
        met: None,
        status: format!("not measurable: {why}"),
    };
    if let Some(reason) = fentry_unavailable {
        return not_measurable(format!("fentry unavailable ({reason})"));
    }
    let (Some(fentry), Some(kprobe)) = (loss(Variant::Fentry), loss(Variant::Kprobe)) else {
        return not_measurable("no valid fentry or kprobe runs, or none without a probe".into());
    };
    let met = fentry <= kprobe * GOAL_MAX_LOSS_RATIO;
    Goal {
        rule,
        value: (kprobe > 0.0).then(|| fentry / kprobe),
        met: Some(met),
        status: if met { "met" } else { "NOT met" }.to_owned(),
    }
}

fn round_label(round: Option<u32>) -> String {
    round.map_or_else(|| "warm-up".to_owned(), |round| format!("round {round}"))
}

fn print_table(results: &Results) {
    let num = |value: Option<f64>, digits: usize| {
        value.map_or_else(|| "-".to_owned(), |v| format!("{v:.digits$}"))
    };
    let int = |value: Option<u64>| value.map_or_else(|| "-".to_owned(), |v| v.to_string());
    println!(
        "{:>7}  {:<10}  {:>13}  {:>11}  {:>10}  {:>10}  {:>8}  status",
        "round", "variant", "delivered_pps", "sender_pps", "sent", "xmit_calls", "ns/pkt"
    );
    for run in results.warm_up_runs.iter().chain(&results.runs) {
        println!(
            "{:>7}  {:<10}  {:>13}  {:>11}  {:>10}  {:>10}  {:>8}  {}",
            run.round
                .map_or_else(|| "warm-up".to_owned(), |round| round.to_string()),
            run.variant.to_string(),
            num(run.delivered_pps, 0),
            num(run.sender_pps, 0),
            int(run.sent),
            int(run.xmit_calls),
            num(run.ns_per_packet, 0),
            match &run.status {
                Status::Valid => "valid".to_owned(),
                Status::Invalid(why) => format!("INVALID: {why}"),
                Status::Failed(why) => format!("FAILED: {why}"),
            }
        );
    }
    println!();
    println!(
        "{:<10}  {:>5}  {:>13}  {:>7}  {:>7}  {:>8}  {:>9}  status",
        "variant", "valid", "median_pps", "ratio", "loss", "ns/pkt", "+ns/pkt"
    );
    for result in &results.variants {
        println!(
            "{:<10}  {:>5}  {:>13}  {:>7}  {:>7}  {:>8}  {:>9}  {}",
            result.variant.to_string(),
            result.valid_runs,
            num(result.median_delivered_pps, 0),
            num(result.ratio, 4),
            num(result.loss, 4),
            num(result.median_ns_per_packet, 0),
            num(result.added_ns_per_packet, 0),
            result.status
        );
    }
    println!();
    println!(
        "goal {}: {}{}",
        results.goal.rule,
        results.goal.status,
        results
            .goal
            .value
            .map_or_else(String::new, |v| format!(" (ratio of losses {v:.3})"))
    );
    for problem in &results.problems {
        println!("problem: {problem}");
    }
}

#[cfg(test)]
mod tests {
    use serde_json::json;

    use super::*;

    fn lines(lines: &[&str]) -> Vec<String> {
        lines.iter().map(|&line| line.to_owned()).collect()
    }

    fn record(round: u32, variant: Variant, delivered: f64, sent: u64, counted: u64) -> Record {
        Record {
            round: Some(round),
            warm_up: false,
            variant,
            unavailable: None,
            error: None,
            load_rc: Some(0),
            watch_rc: variant.backend().map(|_| 0),
            load: Some(json!({
                "delivered_pps": delivered,
                "sender_pps": delivered,
                "sent": sent,
                "elapsed_secs": 2.0,
            })),
            watch: variant.backend().map(|_| {
                json!({"rows": [{"ifname": "tp-load0", "xmit_calls": counted}],
                       "sources": {"xmit": "kprobe"}})
            }),
        }
    }

    #[test]
    fn guest_script_runs_every_round_in_order() {
        let script = guest_script(3, 7);
        let runs: Vec<&str> = script
            .lines()
            .filter(|line| line.starts_with("bench_run "))
            .collect();
        assert_eq!(runs.len(), 20);
        assert_eq!(runs[0], "bench_run warm-up probe-off ''");
        assert_eq!(runs[4], "bench_run warm-up fentry fentry");
        assert_eq!(runs[5], "bench_run 0 probe-off ''");
        assert_eq!(runs[6], "bench_run 0 kprobe kprobe");
        assert_eq!(runs[10], "bench_run 1 fentry fentry");
        assert_eq!(runs[14], "bench_run 1 probe-off ''");
        assert_eq!(runs[15], "bench_run 2 probe-off ''");
        assert!(script.contains(r"'--duration'\'' '\''7'\'' '\''--start-delay'\'' '\''3'"));
        assert!(script.contains("load_ifname='tp-load0'\n"));
        assert!(script.contains("bench_run() {"));
    }

    #[test]
    fn records_are_read_from_the_console() {
        let console = lines(&[
            "init: bench round 0: fentry (uptime 30.1 s)",
            r#"bench: {"round":null,"warm_up":true,"variant":"fentry","watch_rc":1,"unavailable":"Error: no \"fentry\""}"#,
            r#"bench: {"round":0,"variant":"probe-off","load_rc":0,"watch_rc":null,"error":null,"load":{"sent":5},"watch":null}"#,
            "[   31.000000] some kernel warning",
        ]);
        let records = parse_records(&console).unwrap();
        assert_eq!(records.len(), 2);
        assert_eq!(records[0].variant, Variant::Fentry);
        assert!(records[0].warm_up && records[0].round.is_none());
        assert_eq!(
            records[0].unavailable.as_deref(),
            Some(r#"Error: no "fentry""#)
        );
        assert_eq!(records[1].variant, Variant::ProbeOff);
        assert_eq!(records[1].round, Some(0));
        assert!(records[1].watch.is_none());
        assert!(parse_records(&lines(&["bench: {\"round\":0,\"varia"])).is_err());
    }

    #[test]
    fn a_probe_that_missed_packets_makes_the_run_invalid() {
        assert_eq!(
            evaluate(&record(0, Variant::Kprobe, 100.0, 10, 10)).status,
            Status::Valid
        );
        let missed =
            serde_json::to_value(evaluate(&record(0, Variant::Kprobe, 100.0, 10, 9))).unwrap();
        assert_eq!(missed["status"], "invalid");
        assert!(
            missed["reason"]
                .as_str()
                .unwrap()
                .contains("counted 9 driver calls")
        );
        // Probe-off has no watch to check.
        let off = evaluate(&record(0, Variant::ProbeOff, 100.0, 10, 0));
        assert_eq!(off.status, Status::Valid);
        assert_eq!(off.xmit_calls, None);
        assert_eq!(off.ns_per_packet, Some(2e8));
        let mut failed = record(0, Variant::Auto, 100.0, 10, 10);
        failed.error = Some("tap-probe load exited 1".to_owned());
        assert!(matches!(evaluate(&failed).status, Status::Failed(_)));
    }

    #[test]
    fn medians_ratios_and_goal() {
        let runs: Vec<Run> = [
            record(0, Variant::ProbeOff, 1000.0, 10, 0),
            record(1, Variant::ProbeOff, 1200.0, 10, 0),
            record(2, Variant::ProbeOff, 800.0, 10, 0),
            record(0, Variant::Kprobe, 800.0, 10, 10),
            record(1, Variant::Kprobe, 900.0, 10, 10),
            record(2, Variant::Kprobe, 10.0, 10, 3), // invalid: left out
            record(0, Variant::Tracepoint, 950.0, 10, 10),
        ]
        .iter()
        .map(evaluate)
        .collect();
        let fentry_error = "Error: fentry needs BTF of module tun";
        let unavailable = |variant| (variant == Variant::Fentry).then_some(fentry_error);
        let results = variant_results(&runs, unavailable);
        let of = |variant| results.iter().find(|r| r.variant == variant).unwrap();
        assert_eq!(of(Variant::ProbeOff).median_delivered_pps, Some(1000.0));
        assert_eq!(of(Variant::Kprobe).valid_runs, 2);
        assert_eq!(of(Variant::Kprobe).median_delivered_pps, Some(850.0));
        assert!((of(Variant::Kprobe).loss.unwrap() - 0.15).abs() < 1e-12);
        assert!((of(Variant::Tracepoint).ratio.unwrap() - 0.95).abs() < 1e-12);
        assert_eq!(of(Variant::Auto).status, "no valid runs");
        assert_eq!(of(Variant::Auto).ratio, None);
        assert!(of(Variant::Fentry).status.starts_with("unavailable: Error"));

        let goal_unavailable = goal(&results, Some(fentry_error));
        assert_eq!(goal_unavailable.met, None);
        assert_eq!(
            goal_unavailable.status,
            format!("not measurable: fentry unavailable ({fentry_error})")
        );

        let mut results = results;
        results[4].loss = Some(0.05);
        let measured = goal(&results, None);
        assert_eq!(measured.met, Some(true));
        assert!((measured.value.unwrap() - 0.05 / 0.15).abs() < 1e-12);
        results[4].loss = Some(0.1);
        assert_eq!(goal(&results, None).met, Some(false));
    }
}
