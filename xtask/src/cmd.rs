//! Running commands: every command is echoed to stderr before it runs, runs from the
//! workspace root, and a non-zero exit becomes an error that names it.

use std::ffi::{OsStr, OsString};
use std::path::{Path, PathBuf};
use std::process::{Command, ExitStatus, Stdio};
use std::sync::LazyLock;

use anyhow::{Context as _, bail};

pub(crate) use tap_probe_guest::cmd::probe;
use tap_probe_guest::cmd::quote;

/// The workspace root (the parent of `xtask/`). `cargo run` names the manifest's directory
/// at run time; the one compiled in is only a fallback, because cargo may reuse a binary
/// built from another checkout that shares the target directory.
pub(crate) fn workspace_root() -> PathBuf {
    let manifest_dir = std::env::var_os("CARGO_MANIFEST_DIR")
        .map_or_else(|| PathBuf::from(env!("CARGO_MANIFEST_DIR")), PathBuf::from);
    manifest_dir
        .parent()
        .expect("xtask lives inside the workspace")
        .to_path_buf()
}

/// Cargo's target directory as cargo itself resolves it (`CARGO_TARGET_DIR`,
/// `build.target-dir` in a `.cargo/config.toml`, else `<workspace>/target`), asked once.
pub(crate) fn target_dir() -> PathBuf {
    static TARGET_DIR: LazyLock<PathBuf> = LazyLock::new(|| {
        match cargo_metadata::MetadataCommand::new()
            .current_dir(workspace_root())
            .no_deps()
            .exec()
        {
            Ok(metadata) => metadata.target_directory.into_std_path_buf(),
            Err(err) => {
                eprintln!("xtask: warning: `cargo metadata` failed ({err}); using target/");
                workspace_root().join("target")
            }
        }
    });
    TARGET_DIR.clone()
}

/// Builds binary `bin` of package `package` in release mode and returns its path, as cargo
/// reports it.
///
/// # Errors
/// If the build fails or builds no such binary.
pub(crate) fn build_release_bin(package: &str, bin: &str) -> anyhow::Result<PathBuf> {
    cargo_artifacts(cargo().args(["build", "--release", "-p", package, "--bin", bin]))?
        .into_iter()
        .filter(|artifact| {
            artifact.target.name == bin && artifact.target.is_kind(cargo_metadata::TargetKind::Bin)
        })
        .find_map(|artifact| artifact.executable)
        .map(cargo_metadata::camino::Utf8PathBuf::into_std_path_buf)
        .with_context(|| format!("cargo build -p {package} built no binary {bin}"))
}

/// Builds example `example` of `package` in release mode; its path.
///
/// # Errors
/// When the build fails or produces no such example.
pub(crate) fn build_release_example(package: &str, example: &str) -> anyhow::Result<PathBuf> {
    cargo_artifacts(cargo().args(["build", "--release", "-p", package, "--example", example]))?
        .into_iter()
        .filter(|artifact| {
            artifact.target.name == example
                && artifact.target.is_kind(cargo_metadata::TargetKind::Example)
        })
        .find_map(|artifact| artifact.executable)
        .map(cargo_metadata::camino::Utf8PathBuf::into_std_path_buf)
        .with_context(|| format!("cargo build -p {package} built no example {example}"))
}

/// A command that runs from the workspace root with cargo's bin directory on `PATH`:
/// `cargo install` puts bpf-linker there, aya-build looks it up on `PATH`, and CI's `PATH`
/// may lack it.
pub(crate) fn new(program: impl AsRef<OsStr>) -> Command {
    let mut command = Command::new(program);
    command.current_dir(workspace_root());
    if let Some(path) = path_with_cargo_bin() {
        command.env("PATH", path);
    }
    command
}

fn path_with_cargo_bin() -> Option<OsString> {
    let cargo_home = std::env::var_os("CARGO_HOME")
        .map(PathBuf::from)
        .or_else(|| std::env::var_os("HOME").map(|home| Path::new(&home).join(".cargo")))?;
    let bin = cargo_home.join("bin");
    let path = std::env::var_os("PATH").unwrap_or_default();
    if std::env::split_paths(&path).any(|dir| dir == bin) {
        return None;
    }
    std::env::join_paths(std::iter::once(bin).chain(std::env::split_paths(&path))).ok()
}

/// `cargo` with the toolchain that runs xtask (rustup's proxy picks it up from `PATH`).
pub(crate) fn cargo() -> Command {
    new("cargo")
}

/// Runs `command` to completion with inherited stdio.
///
/// # Errors
/// If it cannot be started or exits non-zero.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    let status = status(command)?;
    check(command, status)
}

/// Runs `command` to completion with inherited stdio and returns its exit status.
///
/// # Errors
/// If it cannot be started.
pub(crate) fn status(command: &mut Command) -> anyhow::Result<ExitStatus> {
    echo(command);
    command
        .status()
        .with_context(|| format!("could not run `{}`", display(command)))
}

/// Runs `command` to completion, passing its stdout on line by line as it comes, and
/// returns those lines and how it exited (stderr is inherited).
///
/// # Errors
/// If it cannot be started or its output cannot be read.
pub(crate) fn run_collecting(command: &mut Command) -> anyhow::Result<(Vec<String>, ExitStatus)> {
    use std::io::BufRead as _;
    command.stdout(Stdio::piped());
    echo(command);
    let mut child = command
        .spawn()
        .with_context(|| format!("could not run `{}`", display(command)))?;
    let stdout = child.stdout.take().context("the command's stdout")?;
    let mut lines = Vec::new();
    for line in std::io::BufReader::new(stdout).lines() {
        let line = line.context("reading the command's output")?;
        println!("{line}");
        lines.push(line);
    }
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{}`", display(command)))?;
    Ok((lines, status))
}

/// Runs a cargo build `command` (`build`, `test --no-run`) and returns the artifacts it
/// reports (compiler diagnostics still reach the terminal).
///
/// # Errors
/// If cargo cannot be run or the build fails.
pub(crate) fn cargo_artifacts(
    command: &mut Command,
) -> anyhow::Result<Vec<cargo_metadata::Artifact>> {
    command
        .arg("--message-format=json-render-diagnostics")
        .stdout(Stdio::piped());
    echo(command);
    let mut child = command
        .spawn()
        .with_context(|| format!("could not run `{}`", display(command)))?;
    let stdout = child.stdout.take().context("cargo's stdout")?;
    let artifacts = cargo_metadata::Message::parse_stream(std::io::BufReader::new(stdout))
        .filter_map(|message| match message {
            Ok(cargo_metadata::Message::CompilerArtifact(artifact)) => Some(artifact),
            _ => None,
        })
        .collect();
    let status = child
        .wait()
        .with_context(|| format!("waiting for `{}`", display(command)))?;
    check(command, status)?;
    Ok(artifacts)
}

/// Turns a non-zero exit of `command` into an error naming it.
///
/// # Errors
/// If `status` is not success.
pub(crate) fn check(command: &Command, status: ExitStatus) -> anyhow::Result<()> {
    if status.success() {
        Ok(())
    } else {
        bail!("`{}` failed ({status})", display(command))
    }
}

/// Prints `$ command` to stderr.
pub(crate) fn echo(command: &Command) {
    eprintln!("$ {}", display(command));
}

/// The command as a shell would read it, with the environment it sets (except `PATH`).
pub(crate) fn display(command: &Command) -> String {
    let envs = command.get_envs().filter_map(|(key, value)| {
        let value = value?;
        (key != "PATH").then(|| format!("{}={}", key.to_string_lossy(), quote(value)))
    });
    let words = std::iter::once(quote(command.get_program())).chain(command.get_args().map(quote));
    envs.chain(words).collect::<Vec<_>>().join(" ")
}

/// Whether this process runs as root.
pub(crate) fn is_root() -> bool {
    // SAFETY: geteuid has no preconditions and cannot fail.
    unsafe { libc::geteuid() == 0 }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn display_quotes_what_a_shell_would_split() {
        let mut command = Command::new("bpftrace");
        command.env("DEBIAN_FRONTEND", "noninteractive").args([
            "-e",
            "tracepoint:a:b { @[probe] = count(); }",
            "it's",
        ]);
        assert_eq!(
            display(&command),
            "DEBIAN_FRONTEND=noninteractive bpftrace -e \
             'tracepoint:a:b { @[probe] = count(); }' 'it'\\''s'"
        );
    }
}
