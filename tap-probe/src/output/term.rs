//! The terminal's size, for views that fit it.

use std::io::IsTerminal;
use std::os::fd::AsRawFd;

/// Whether `stream` is a terminal to draw on in place: a terminal whose `TERM` is not
/// `dumb` (the convention for terminals that cannot move the cursor; `tap-probe vm` sets
/// it in the guest, whose serial lines carry the output to the host).
#[must_use]
pub(crate) fn interactive(stream: &impl IsTerminal) -> bool {
    stream.is_terminal() && std::env::var_os("TERM").is_none_or(|term| term != "dumb")
}

/// Columns and rows of the terminal `fd` is, if it is one (`TIOCGWINSZ`, which the kernel
/// updates on every resize; a pseudo-terminal nobody sized reports 0, taken as unknown).
#[must_use]
pub(crate) fn size(fd: &impl AsRawFd) -> Option<(usize, usize)> {
    let mut ws = libc::winsize {
        ws_row: 0,
        ws_col: 0,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    // SAFETY: TIOCGWINSZ writes one `winsize` to the pointer, which points to a live local.
    let rc = unsafe { libc::ioctl(fd.as_raw_fd(), libc::TIOCGWINSZ, &raw mut ws) };
    (rc == 0 && ws.ws_col > 0).then(|| (usize::from(ws.ws_col), usize::from(ws.ws_row)))
}

/// The width to fit when the output is not a terminal: `$COLUMNS` when set (a shell's own
/// variable, exported by whoever wants a width), else none.
#[must_use]
pub(crate) fn columns_env() -> Option<usize> {
    std::env::var("COLUMNS")
        .ok()
        .and_then(|c| c.trim().parse().ok())
        .filter(|c| *c > 0)
}
