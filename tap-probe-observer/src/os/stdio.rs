//! The standard outputs once their other end is gone: a terminal that hung up (writes fail
//! with `EIO`), a pipe whose reader left (`EPIPE`). What is left to write as a run stops
//! (a summary, a warning) would fail there, and `eprintln!` panics when it cannot write, so
//! such an output is replaced by `/dev/null`: the run stops in order and says nothing to
//! nobody. An output that still works is left alone, also on SIGHUP from `kill`.

use std::os::fd::RawFd;

/// Replaces stdout and stderr by `/dev/null` where their other end is gone.
/// Async-signal-safe (poll, open, dup2, close), so the stop's signal handler calls it.
pub(crate) fn retire_dead() {
    retire_dead_fds(&[libc::STDOUT_FILENO, libc::STDERR_FILENO]);
}

/// [`retire_dead`] for `fds`.
fn retire_dead_fds(fds: &[RawFd]) {
    for &fd in fds {
        let mut poll = libc::pollfd {
            fd,
            events: libc::POLLOUT,
            revents: 0,
        };
        // SAFETY: one pollfd in a live local; a timeout of 0 only asks.
        let ready = unsafe { libc::poll(&raw mut poll, 1, 0) };
        // A hung-up terminal says POLLHUP (`hung_up_tty_poll`, drivers/tty/tty_io.c), a
        // pipe without a reader POLLERR (`pipe_poll`, fs/pipe.c), a socket whose peer left
        // POLLHUP. A closed descriptor (POLLNVAL) writes nowhere already.
        if ready != 1 || poll.revents & (libc::POLLERR | libc::POLLHUP) == 0 {
            continue;
        }
        // SAFETY: a constant NUL-terminated path.
        let null = unsafe { libc::open(c"/dev/null".as_ptr(), libc::O_WRONLY | libc::O_CLOEXEC) };
        if null < 0 {
            continue;
        }
        // SAFETY: both descriptors are open; dup2 swaps the dead output for the new one
        // atomically, so a write in another thread goes to one or the other.
        unsafe {
            libc::dup2(null, fd);
            libc::close(null);
        }
    }
}

#[cfg(test)]
mod tests {
    use std::io::Write as _;
    use std::os::fd::AsRawFd as _;
    use std::os::unix::fs::FileTypeExt as _;

    use super::*;

    #[test]
    fn a_pipe_without_its_reader_becomes_dev_null_and_a_live_one_stays() {
        let (read, write) = nix::unistd::pipe().unwrap();
        let (live_read, live_write) = nix::unistd::pipe().unwrap();
        drop(read);
        retire_dead_fds(&[write.as_raw_fd(), live_write.as_raw_fd()]);
        let mut dead = std::fs::File::from(write);
        assert!(dead.metadata().unwrap().file_type().is_char_device());
        dead.write_all(b"to nobody").unwrap();
        let mut live = std::fs::File::from(live_write);
        assert!(live.metadata().unwrap().file_type().is_fifo());
        live.write_all(b"x").unwrap();
        drop(live);
        let mut got = String::new();
        std::io::Read::read_to_string(&mut std::fs::File::from(live_read), &mut got).unwrap();
        assert_eq!(got, "x");
        // No descriptor (poll ignores a negative one): nothing happens.
        retire_dead_fds(&[-1]);
    }
}
