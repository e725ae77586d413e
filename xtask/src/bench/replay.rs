//! `cargo xtask bench replay`: how fast the replay harness runs.
//!
//! Two measurements per round, each round a separate `tap-probe replay` process:
//! - in-memory replay of a synthetic trace on one core (`--synthetic ... --format json`,
//!   the replay's own wall time, trace generation excluded), events/s per policy;
//! - `--live`: the policies on a real two-thread ring, items/s per policy.
//!
//! The policies' order alternates between rounds so drift does not favour one. Results are
//! medians over the rounds.

use std::path::{Path, PathBuf};
use std::process::Stdio;

use anyhow::{Context as _, bail};
use serde::Serialize;
use serde_json::Value;

use super::{default_out, median, round_order, write_json};
use crate::cmd;

/// About 22 M operations: a producer faster than its reader, so every policy has work.
const SPEC: &str = "producer=poisson:12M,consumer=poisson:10M,duration=1s,ring=500";
const POLICIES: [&str; 4] = ["tail-drop", "stop-wake:0.5", "wake-every", "wake-empty"];
/// Goal: replay events per second on one core.
const GOAL_REPLAY_EVENTS_PER_S: f64 = 50e6;
/// Goal: live items per second across two cores (best policy).
const GOAL_LIVE_ITEMS_PER_S: f64 = 20e6;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Rounds (at least 5).
    #[arg(long, default_value_t = 5, value_parser = clap::value_parser!(u32).range(5..))]
    runs: u32,
    /// Seconds per policy of each `--live` run.
    #[arg(long, default_value_t = 1.0)]
    live_duration: f64,
    /// Where to write the JSON results [default: target/bench/replay.json].
    #[arg(long)]
    out: Option<PathBuf>,
}

#[derive(Debug, Serialize)]
struct PolicyMedian {
    policy: &'static str,
    replay_events_per_s: f64,
    live_items_per_s: f64,
    replay_runs: Vec<f64>,
    live_runs: Vec<f64>,
}

#[derive(Debug, Serialize)]
struct Results {
    bench: &'static str,
    spec: &'static str,
    runs: u32,
    live_duration_s: f64,
    policies: Vec<PolicyMedian>,
    goal_replay_events_per_s: f64,
    goal_live_items_per_s: f64,
    replay_goal_met: bool,
    live_goal_met: bool,
}

/// Where the results go: `--out`, or `target/bench/replay.json`.
pub(crate) fn out(args: &Args) -> PathBuf {
    args.out.clone().unwrap_or_else(|| default_out("replay"))
}

/// Runs the benchmark, its results into `out`.
///
/// # Errors
/// If a run fails or prints something that is not the expected JSON.
pub(crate) fn run(args: &Args, out: &Path, tap_probe: &Path) -> anyhow::Result<()> {
    let mut replay: Vec<Vec<f64>> = vec![Vec::new(); POLICIES.len()];
    let mut live: Vec<Vec<f64>> = vec![Vec::new(); POLICIES.len()];
    for round in 0..args.runs {
        let order: Vec<usize> = round_order((0..POLICIES.len()).collect(), round);
        eprintln!("==> round {}/{}", round + 1, args.runs);
        let out = replay_json(tap_probe, &order, &["--synthetic", SPEC])?;
        for t in out["streams"][0]["results"]
            .as_array()
            .context("replay JSON without results")?
        {
            let i = index_of(t["policy"].as_str().unwrap_or(""))?;
            replay[i].push(t["events_per_s"].as_f64().context("no events_per_s")?);
        }
        let secs = args.live_duration.to_string();
        let out = replay_json(tap_probe, &order, &["--live", "--live-duration", &secs])?;
        for r in out.as_array().context("live JSON is not a list")? {
            let i = index_of(r["policy"].as_str().unwrap_or(""))?;
            live[i].push(r["items_per_s"].as_f64().context("no items_per_s")?);
        }
    }
    let policies: Vec<PolicyMedian> = POLICIES
        .iter()
        .enumerate()
        .map(|(i, &policy)| PolicyMedian {
            policy,
            replay_events_per_s: median(&replay[i]),
            live_items_per_s: median(&live[i]),
            replay_runs: replay[i].clone(),
            live_runs: live[i].clone(),
        })
        .collect();
    let replay_goal_met = policies
        .iter()
        .all(|p| p.replay_events_per_s >= GOAL_REPLAY_EVENTS_PER_S);
    let live_goal_met = policies
        .iter()
        .any(|p| p.live_items_per_s >= GOAL_LIVE_ITEMS_PER_S);
    let results = Results {
        bench: "replay",
        spec: SPEC,
        runs: args.runs,
        live_duration_s: args.live_duration,
        policies,
        goal_replay_events_per_s: GOAL_REPLAY_EVENTS_PER_S,
        goal_live_items_per_s: GOAL_LIVE_ITEMS_PER_S,
        replay_goal_met,
        live_goal_met,
    };
    println!(
        "{:<16} {:>22} {:>20}",
        "policy", "replay events/s (med)", "live items/s (med)"
    );
    for p in &results.policies {
        println!(
            "{:<16} {:>22.3e} {:>20.3e}",
            p.policy, p.replay_events_per_s, p.live_items_per_s
        );
    }
    println!(
        "goals: replay >= {GOAL_REPLAY_EVENTS_PER_S:.0e} events/s on one core for every \
         policy: {}; live >= {GOAL_LIVE_ITEMS_PER_S:.0e} items/s: {}",
        met(replay_goal_met),
        met(live_goal_met)
    );
    write_json(out, &results)?;
    eprintln!("results written to {}", out.display());
    Ok(())
}

fn met(ok: bool) -> &'static str {
    if ok { "met" } else { "NOT met" }
}

fn index_of(policy: &str) -> anyhow::Result<usize> {
    POLICIES
        .iter()
        .position(|&p| p == policy)
        .with_context(|| format!("unexpected policy {policy:?} in the output"))
}

/// Runs `tap-probe replay --format json` with the policies in `order` and `extra`.
fn replay_json(tap_probe: &Path, order: &[usize], extra: &[&str]) -> anyhow::Result<Value> {
    let mut command = cmd::new(tap_probe);
    command.args(["replay", "--format", "json"]).args(extra);
    for &i in order {
        command.args(["--policy", POLICIES[i]]);
    }
    cmd::echo(&command);
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::inherit())
        .output()
        .with_context(|| format!("could not run `{}`", cmd::display(&command)))?;
    if !output.status.success() {
        bail!("`{}` failed ({})", cmd::display(&command), output.status);
    }
    serde_json::from_slice(&output.stdout)
        .with_context(|| format!("`{}` printed no JSON", cmd::display(&command)))
}
