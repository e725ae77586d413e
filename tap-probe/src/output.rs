//! The one way results reach stdout. A reader that went away (`tap-probe ... | head`)
//! makes writes fail with `EPIPE` (Rust ignores SIGPIPE); that is [`StdoutClosed`], which
//! ends the program quietly instead of with an error or a panic.

use std::io::Write as _;

/// Stdout was closed by its reader.
#[derive(Debug)]
pub(crate) struct StdoutClosed;

impl std::fmt::Display for StdoutClosed {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str("stdout was closed by its reader")
    }
}

impl std::error::Error for StdoutClosed {}

/// Writes `text` to stdout and flushes it.
///
/// # Errors
/// [`StdoutClosed`] when the reader went away; the I/O error otherwise.
pub(crate) fn stdout(text: &str) -> anyhow::Result<()> {
    let mut out = std::io::stdout().lock();
    match out.write_all(text.as_bytes()).and_then(|()| out.flush()) {
        Ok(()) => Ok(()),
        Err(err) if err.kind() == std::io::ErrorKind::BrokenPipe => Err(StdoutClosed.into()),
        Err(err) => Err(anyhow::Error::new(err).context("writing to stdout")),
    }
}

/// Whether `err` is, or was caused by, [`StdoutClosed`].
#[must_use]
pub(crate) fn is_closed_stdout(err: &anyhow::Error) -> bool {
    err.chain().any(<dyn std::error::Error>::is::<StdoutClosed>)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn closed_stdout_is_found_under_context() {
        let err = anyhow::Error::new(StdoutClosed).context("showing a refresh");
        assert!(is_closed_stdout(&err));
        assert!(!is_closed_stdout(&anyhow::anyhow!("other")));
    }
}
