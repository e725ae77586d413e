//! The deployment files' own checks, a stage of `cargo xtask test` that needs no root and
//! no kernel: the alert rules load (`promtool check rules`) and each alert fires, and stays
//! quiet, where its unit tests say (`promtool test rules`); the systemd unit parses without
//! a single warning (`systemd-analyze verify`). What the unit's command line and
//! capabilities do, and what the rules and the dashboard return against a live exporter,
//! the privileged tests `service` and `fleet` check.

use anyhow::{Context as _, bail};

use crate::cmd;

const RULES_DIR: &str = "deploy/prometheus";
const UNIT: &str = "deploy/systemd/tap-probe.service";
/// Where the unit's `ExecStart` points; the check substitutes a program that exists here.
const INSTALLED: &str = "/usr/local/bin/tap-probe";

/// Runs the checks.
///
/// # Errors
/// If promtool or systemd-analyze is missing (`cargo xtask setup` installs them), or a
/// check fails.
pub(crate) fn check() -> anyhow::Result<()> {
    let rules = cmd::workspace_root().join(RULES_DIR);
    for args in [
        ["check", "rules", "tap-probe-rules.yml"],
        ["test", "rules", "tap-probe-rules.test.yml"],
    ] {
        cmd::run(cmd::new("promtool").args(args).current_dir(&rules))
            .context("promtool (Debian's prometheus package; cargo xtask setup installs it)")?;
    }
    verify_unit()
}

/// `systemd-analyze verify` on a copy of the unit whose `ExecStart` names a program that
/// exists (verify checks that it does); it exits 0 even on unknown keys or values it cannot
/// parse, so any output is a failure.
fn verify_unit() -> anyhow::Result<()> {
    let root = cmd::workspace_root();
    let unit =
        std::fs::read_to_string(root.join(UNIT)).with_context(|| format!("reading {UNIT}"))?;
    if !unit.contains(&format!("ExecStart={INSTALLED} ")) {
        bail!("{UNIT}: ExecStart does not run {INSTALLED}");
    }
    let dir = cmd::target_dir().join("deploy-check");
    std::fs::create_dir_all(&dir).with_context(|| format!("creating {}", dir.display()))?;
    let copy = dir.join("tap-probe.service");
    std::fs::write(&copy, unit.replace(INSTALLED, "/bin/true"))
        .with_context(|| format!("writing {}", copy.display()))?;
    let mut verify = cmd::new("systemd-analyze");
    verify.args(["verify", "--man=no"]).arg(&copy);
    eprintln!("+ {}", cmd::display(&verify));
    let out = verify
        .output()
        .context("running systemd-analyze (systemd; cargo xtask setup installs it)")?;
    let said = format!(
        "{}{}",
        String::from_utf8_lossy(&out.stdout),
        String::from_utf8_lossy(&out.stderr)
    );
    if !out.status.success() || !said.trim().is_empty() {
        bail!("systemd-analyze verify {UNIT}:\n{said}");
    }
    eprintln!("xtask deploy: {UNIT} verified");
    Ok(())
}
