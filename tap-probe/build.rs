/// Names the commit `tap-probe --version` reports (`TAP_PROBE_COMMIT`); the eBPF objects are
/// built by `tap-probe-observer`'s build script.
fn main() {
    println!("cargo:rustc-env=TAP_PROBE_COMMIT={}", commit());
}

/// The commit being built: `TAP_PROBE_COMMIT` when set (a build from a source archive),
/// else git's `HEAD`, else `unknown`. The script runs again when `HEAD` moves: a commit or a
/// checkout writes the worktree's `HEAD` or its reflog.
fn commit() -> String {
    println!("cargo:rerun-if-env-changed=TAP_PROBE_COMMIT");
    if let Some(commit) = std::env::var("TAP_PROBE_COMMIT")
        .ok()
        .filter(|c| !c.is_empty())
    {
        return commit;
    }
    let git = |args: &[&str]| {
        std::process::Command::new("git")
            .args(args)
            .output()
            .ok()
            .filter(|out| out.status.success())
            .and_then(|out| String::from_utf8(out.stdout).ok())
            .map(|out| out.trim().to_owned())
    };
    for file in ["HEAD", "logs/HEAD"] {
        // A path that does not exist would make cargo run the script on every build.
        if let Some(path) = git(&["rev-parse", "--path-format=absolute", "--git-path", file])
            .filter(|path| std::path::Path::new(path).exists())
        {
            println!("cargo:rerun-if-changed={path}");
        }
    }
    git(&["rev-parse", "--short=12", "HEAD"]).unwrap_or_else(|| "unknown".to_owned())
}
