//! Running host tools (apt-get, dpkg-deb, xz, make): each command is echoed to stderr before
//! it runs, its output goes to stderr too (standard output is the guest command's, for
//! `tap-probe vm`), and a non-zero exit becomes an error that names it.

use std::ffi::OsStr;
use std::os::fd::AsFd as _;
use std::process::{Command, Stdio};

use anyhow::{Context as _, bail};

/// Runs `command` with its output on stderr.
///
/// # Errors
/// If it cannot be started or exits non-zero.
pub(crate) fn run(command: &mut Command) -> anyhow::Result<()> {
    eprintln!("$ {}", display(command));
    let stderr = std::io::stderr()
        .as_fd()
        .try_clone_to_owned()
        .context("duplicating stderr")?;
    let status = command
        .stdin(Stdio::null())
        .stdout(Stdio::from(stderr))
        .status()
        .with_context(|| format!("could not run `{}`", display(command)))?;
    if !status.success() {
        bail!("`{}` failed ({status})", display(command));
    }
    Ok(())
}

/// Runs `command` quietly and returns its stdout if it exited zero: for questions whose
/// answer may be "no" (does apt know this package?).
pub fn probe(command: &mut Command) -> Option<String> {
    let output = command
        .stdin(Stdio::null())
        .stderr(Stdio::null())
        .output()
        .ok()?;
    output
        .status
        .success()
        .then(|| String::from_utf8_lossy(&output.stdout).into_owned())
}

/// The command as a shell would read it.
#[must_use]
pub(crate) fn display(command: &Command) -> String {
    std::iter::once(command.get_program())
        .chain(command.get_args())
        .map(quote)
        .collect::<Vec<_>>()
        .join(" ")
}

/// `word` as a shell reads it: bare when it holds only characters a shell takes as they
/// are, single-quoted otherwise.
#[must_use]
pub fn quote(word: &OsStr) -> String {
    let word = word.to_string_lossy();
    let plain = !word.is_empty()
        && word
            .chars()
            .all(|c| c.is_ascii_alphanumeric() || "-_./=:,+@%".contains(c));
    if plain {
        word.into_owned()
    } else {
        format!("'{}'", word.replace('\'', r"'\''"))
    }
}
