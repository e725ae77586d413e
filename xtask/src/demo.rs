//! `cargo xtask demo`: set up, build, and run `tap-probe demo`.

use std::os::unix::process::{CommandExt as _, ExitStatusExt as _};
use std::process::ExitCode;

use anyhow::Context as _;

use crate::{cmd, setup};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Arguments for `tap-probe demo` (after `--`).
    #[arg(last = true)]
    args: Vec<String>,
}

/// Runs `cargo xtask demo` and returns the demo's exit code.
///
/// # Errors
/// If setup or the build fails, or the demo cannot be started.
pub(crate) fn run(args: &Args) -> anyhow::Result<ExitCode> {
    setup::run(&setup::Args {})?;
    let binary = cmd::build_release_bin("tap-probe", "tap-probe")?;
    let mut demo = cmd::new(&binary);
    demo.arg("demo").args(&args.args);
    cmd::echo(&demo);
    // Ctrl-C reaches the whole foreground process group, the demo included, and the demo
    // cleans up on SIGINT. xtask ignores it meanwhile so that it stays to wait for the
    // demo and hand on its exit code; the demo gets the default disposition back before
    // exec (an ignored signal would stay ignored across exec).
    let _guard = IgnoreSigint::new();
    // SAFETY: signal(2) is async-signal-safe, as required between fork and exec.
    unsafe {
        demo.pre_exec(|| {
            libc::signal(libc::SIGINT, libc::SIG_DFL);
            Ok(())
        });
    }
    let status = demo
        .status()
        .with_context(|| format!("could not run {}", binary.display()))?;
    Ok(match (status.code(), status.signal()) {
        (Some(code), _) => ExitCode::from(u8::try_from(code).unwrap_or(1)),
        // Killed by a signal: report it the way shells do.
        (None, Some(signal)) => ExitCode::from(u8::try_from(128 + signal).unwrap_or(1)),
        (None, None) => ExitCode::FAILURE,
    })
}

/// Ignores SIGINT in this process while alive; restores the previous disposition on drop.
struct IgnoreSigint(libc::sighandler_t);

impl IgnoreSigint {
    fn new() -> Self {
        // SAFETY: installing SIG_IGN has no preconditions.
        Self(unsafe { libc::signal(libc::SIGINT, libc::SIG_IGN) })
    }
}

impl Drop for IgnoreSigint {
    fn drop(&mut self) {
        // SAFETY: restores the disposition that signal(2) returned.
        unsafe {
            libc::signal(libc::SIGINT, self.0);
        }
    }
}
