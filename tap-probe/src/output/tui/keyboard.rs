//! The terminal the full-screen view reads its keys from, read only when `poll` says it has
//! something, so that the wait for a key is the stop's wait ([`tap_probe_observer::os::signals::Stop::wait`])
//! and a terminal that went away is seen as such.
//!
//! crossterm's own event reader is not used: on a terminal that hung up, `read` returns 0
//! (end of file) or fails with `EIO`, and crossterm 0.29's `UnixInternalEventSource::try_read`
//! retries both in a loop that never returns, so a view whose terminal closed spun on
//! `read(0)` at full speed, deaf to signals and to `--duration`.

use std::fs::File;
use std::io::IsTerminal as _;
use std::os::fd::{AsFd as _, BorrowedFd};
use std::os::unix::fs::OpenOptionsExt as _;

use anyhow::bail;
use nix::errno::Errno;
use nix::poll::PollFlags;
use ratatui::crossterm::event::KeyEvent;

use super::keys::Keys;

/// Where keys come from: stdin when it is a terminal, else the controlling terminal, as
/// crossterm puts that same terminal into raw mode.
pub(crate) struct Keyboard {
    source: Source,
    keys: Keys,
}

enum Source {
    Stdin(std::io::Stdin),
    /// `/dev/tty`, when stdin is no terminal.
    Tty(File),
}

/// What a read of the keyboard gave.
pub(crate) enum Input {
    Keys(Vec<KeyEvent>),
    /// The terminal hung up (end of file, `EIO`, `POLLHUP`).
    Gone,
}

impl Keyboard {
    /// The terminal to read keys from.
    ///
    /// # Errors
    /// When stdin is no terminal and there is no controlling terminal either (a service,
    /// `setsid`).
    pub(crate) fn open() -> anyhow::Result<Self> {
        let stdin = std::io::stdin();
        if stdin.is_terminal() {
            return Ok(Self {
                source: Source::Stdin(stdin),
                keys: Keys::default(),
            });
        }
        match std::fs::OpenOptions::new()
            .read(true)
            .write(true)
            .custom_flags(libc::O_CLOEXEC)
            .open("/dev/tty")
        {
            Ok(tty) => Ok(Self {
                source: Source::Tty(tty),
                keys: Keys::default(),
            }),
            Err(err) => bail!(
                "--tui reads its keys from the terminal, but stdin is not one and there is no \
                 controlling terminal either (/dev/tty: {err}); run it from a terminal, or \
                 leave out --tui for the compact table"
            ),
        }
    }

    /// The descriptor to wait on.
    pub(crate) fn fd(&self) -> BorrowedFd<'_> {
        match &self.source {
            Source::Stdin(stdin) => stdin.as_fd(),
            Source::Tty(tty) => tty.as_fd(),
        }
    }

    /// Reads what `poll` reported (`revents`): keys, or the terminal's end.
    pub(crate) fn read(&mut self, revents: PollFlags) -> Input {
        if !revents.contains(PollFlags::POLLIN) {
            // POLLHUP, POLLERR or POLLNVAL without input: nothing will come any more.
            return Input::Gone;
        }
        let mut buf = [0u8; 256];
        // read(2) itself, not `Stdin`: its buffer could keep bytes that poll no longer
        // reports.
        match nix::unistd::read(self.fd(), &mut buf) {
            // In raw mode (VMIN 1) a read returns at least one byte while the terminal
            // lives; 0 is a hung-up terminal's end of file (`hung_up_tty_read`).
            Ok(0) => Input::Gone,
            Ok(n) => {
                let keys = self.keys.feed(&buf[..n]);
                Input::Keys(keys)
            }
            Err(Errno::EINTR | Errno::EAGAIN) => Input::Keys(Vec::new()),
            Err(_) => Input::Gone,
        }
    }
}
