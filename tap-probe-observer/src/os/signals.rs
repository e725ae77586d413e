//! How a run ends before its own end: the one stop every loop of every command obeys.
//!
//! SIGINT, SIGTERM and SIGHUP (which the kernel sends when a terminal hangs up: a closed
//! window, an ended ssh session), a terminal that went away without a signal (end of file
//! or an I/O error on it) and a stdout whose reader went away all come here, through the
//! handler or [`end`]. Each records why (the first reason stands), replaces a standard
//! output whose other end is gone by `/dev/null` ([`crate::os::stdio`]), sets a flag and
//! makes an eventfd readable. Threads that send or read traffic look at the flag between
//! batches; a loop that waits, for the next refresh or for input, waits in `poll` on the
//! eventfd too ([`Stop::wait`]), so it wakes at once whichever thread the kernel delivered
//! the signal to (a process-directed signal goes to any thread that does not block it,
//! `complete_signal` in kernel/signal.c). Every loop then ends as it would at its own end:
//! probes detached, files completed, namespaces and children removed.
//!
//! Once the command has returned, [`exit`] ends the process with the signal that says why
//! ([`Why::signal`]), so its wait status tells an early end from a finished run (a shell
//! shows 128 + N; systemd counts SIGTERM, SIGINT, SIGHUP and SIGPIPE as a clean stop; a
//! shell script interrupted by Ctrl-C stops too, as it does only for a child that died of
//! SIGINT).
//!
//! The handlers are installed for as long as a [`Stop`] lives, without `SA_RESTART`, and
//! the previous ones come back on drop. A signal ignored when the process started stays
//! ignored: `nohup` ignores SIGHUP so that a command outlives its terminal, and a shell
//! starts background jobs with SIGINT ignored.

use std::os::fd::{AsFd as _, AsRawFd as _, BorrowedFd};
use std::sync::atomic::{AtomicBool, AtomicI32, AtomicU8, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// The signals that stop a run.
const STOPPING: [Signal; 3] = [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP];

/// Set once a stop is requested; shared with the threads that check it.
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// Why, as [`Why::code`]; 0 while nothing stopped the run.
static WHY: AtomicU8 = AtomicU8::new(0);
/// The eventfd the handler writes to, -1 before the first [`Stop::install`]. It stays open
/// for the life of the process, so a handler running late never writes to a reused fd.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static WAKE: OnceLock<EventFd> = OnceLock::new();

/// Why a run ended before its own end.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Why {
    /// SIGINT, SIGTERM or SIGHUP came.
    Signal(Signal),
    /// The terminal went away without a signal: its input read end of file or an I/O
    /// error, or writing to it failed with one.
    TerminalGone,
    /// Stdout's reader went away (`EPIPE`: `tap-probe ... | head`).
    OutputClosed,
}

impl Why {
    /// The signal the process ends with: the one that came; SIGHUP for a lost terminal,
    /// what the kernel sends the session of a terminal that hangs up; SIGPIPE for a lost
    /// reader, what the failed write would have raised had Rust not ignored it.
    #[must_use]
    pub fn signal(self) -> Signal {
        match self {
            Self::Signal(signal) => signal,
            Self::TerminalGone => Signal::SIGHUP,
            Self::OutputClosed => Signal::SIGPIPE,
        }
    }

    fn code(self) -> u8 {
        match self {
            Self::Signal(Signal::SIGINT) => 1,
            Self::Signal(Signal::SIGTERM) => 2,
            Self::Signal(_) => 3,
            Self::TerminalGone => 4,
            Self::OutputClosed => 5,
        }
    }

    fn from_code(code: u8) -> Option<Self> {
        Some(match code {
            1 => Self::Signal(Signal::SIGINT),
            2 => Self::Signal(Signal::SIGTERM),
            3 => Self::Signal(Signal::SIGHUP),
            4 => Self::TerminalGone,
            5 => Self::OutputClosed,
            _ => return None,
        })
    }
}

impl std::fmt::Display for Why {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Signal(signal) => write!(f, "stopped by {signal}"),
            Self::TerminalGone => f.write_str("the terminal went away"),
            Self::OutputClosed => f.write_str("stdout's reader went away"),
        }
    }
}

extern "C" fn on_signal(signo: libc::c_int) {
    // Async-signal-safe: atomics, and poll, open, dup2, close and write (stdio::retire_dead).
    let why = match Signal::try_from(signo) {
        Ok(signal) => Why::Signal(signal),
        Err(_) => return,
    };
    request(why);
}

/// Records `why` unless a reason is already recorded, retires dead outputs, sets the flag
/// and wakes every waiter. Async-signal-safe.
fn request(why: Why) {
    let _ = WHY.compare_exchange(0, why.code(), Ordering::SeqCst, Ordering::SeqCst);
    crate::os::stdio::retire_dead();
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
    wake();
}

/// Makes the eventfd readable. Async-signal-safe.
fn wake() {
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live local to an eventfd that is never closed.
        // Nothing to do on failure: the flag is set either way.
        let _ = unsafe { libc::write(fd, (&raw const one).cast(), size_of::<u64>()) };
    }
}

/// Stops the run for a reason found by the program itself (a lost terminal or reader), as
/// a signal would.
pub fn end(why: Why) {
    FLAG.get_or_init(|| Arc::new(AtomicBool::new(false)));
    request(why);
}

/// Why the run was stopped early, if it was.
#[must_use]
pub fn why() -> Option<Why> {
    Why::from_code(WHY.load(Ordering::SeqCst))
}

/// Ends the process with the signal that says why it stopped ([`Why::signal`]), once
/// everything was undone: what is buffered on stdout goes out first, the signal's default
/// action is restored and the signal raised.
pub fn exit(why: Why) -> ! {
    use std::io::Write as _;
    let _ = std::io::stdout().flush();
    let signal = why.signal();
    // SAFETY: restores the default action of a signal; no handler runs after this.
    let _ = unsafe { nix::sys::signal::signal(signal, SigHandler::SigDfl) };
    let mut set = SigSet::empty();
    set.add(signal);
    let _ = set.thread_unblock();
    let _ = nix::sys::signal::raise(signal);
    // Not reached: the default action of each of these signals ends the process.
    std::process::exit(128 + signal as i32)
}

/// SIGINT, SIGTERM and SIGHUP caught while this lives.
pub struct Stop {
    flag: Arc<AtomicBool>,
    old: Vec<(Signal, SigAction)>,
}

/// What ended a [`Stop::wait`].
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Woke {
    /// The run is to stop.
    Stopped,
    /// The descriptor waited on has input, or was hung up or closed (its `revents`).
    Ready(PollFlags),
    /// Nothing happened within the time, or a wake that was not a stop came
    /// ([`Resize`]).
    Timeout,
}

impl Stop {
    /// Installs the handlers and clears an earlier stop.
    ///
    /// # Errors
    /// When the eventfd cannot be created or a handler cannot be installed.
    pub fn install() -> Result<Self> {
        let flag = Arc::clone(FLAG.get_or_init(|| Arc::new(AtomicBool::new(false))));
        flag.store(false, Ordering::SeqCst);
        WHY.store(0, Ordering::SeqCst);
        let wake = wake_fd()?;
        drain(wake);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::empty(),
            SigSet::empty(),
        );
        let mut stop = Self {
            flag,
            old: Vec::new(),
        };
        for signal in STOPPING {
            // SAFETY: the handler only touches atomics and makes async-signal-safe calls.
            let old = unsafe { sigaction(signal, &action) }
                .with_context(|| format!("installing the {signal} handler"))?;
            if matches!(old.handler(), SigHandler::SigIgn) {
                // Ignored by whoever started us (nohup, a shell's background job): so be it.
                // SAFETY: puts back the action that was there.
                unsafe { sigaction(signal, &old) }
                    .with_context(|| format!("leaving {signal} ignored"))?;
                continue;
            }
            stop.old.push((signal, old));
        }
        Ok(stop)
    }

    /// The flag a stop sets, for threads that check it between steps.
    #[must_use]
    pub fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    /// Whether the run is to stop.
    #[must_use]
    pub fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sleeps for `wait`, or less when the run is to stop; true when it is.
    #[must_use]
    pub fn sleep(&self, wait: Duration) -> bool {
        let end = Instant::now() + wait;
        loop {
            match self.wait(None, end.saturating_duration_since(Instant::now())) {
                Woke::Stopped => return true,
                Woke::Timeout if Instant::now() >= end => return false,
                Woke::Ready(_) | Woke::Timeout => {}
            }
        }
    }

    /// Waits up to `timeout` for `events` on `fd` (when given) or a stop, whichever comes
    /// first: the way a loop waits on input. `poll` reports a descriptor's hangup and error
    /// (`POLLHUP`, `POLLERR`) whatever `events` asks for.
    pub fn wait(&self, fd: Option<(BorrowedFd<'_>, PollFlags)>, timeout: Duration) -> Woke {
        let mut fds: Vec<PollFd<'_>> = fd
            .map(|(fd, events)| PollFd::new(fd, events))
            .into_iter()
            .collect();
        if self.poll(&mut fds, timeout) {
            Woke::Stopped
        } else if let Some(revents) = fds
            .first()
            .and_then(PollFd::revents)
            .filter(|r| !r.is_empty())
        {
            Woke::Ready(revents)
        } else {
            Woke::Timeout
        }
    }

    /// Waits for `wait` at most, until one of `fds` is readable or the run is to stop; true
    /// when it is.
    #[must_use]
    pub fn wait_readable(&self, fds: &[BorrowedFd<'_>], wait: Duration) -> bool {
        let mut polled: Vec<PollFd<'_>> = fds
            .iter()
            .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
            .collect();
        self.poll(&mut polled, wait)
    }

    /// Polls `fds` and the eventfd for `timeout` at most; true when the run is to stop.
    fn poll(&self, fds: &mut Vec<PollFd<'_>>, timeout: Duration) -> bool {
        if self.stopped() {
            return true;
        }
        let Some(eventfd) = WAKE.get() else {
            std::thread::sleep(timeout);
            return self.stopped();
        };
        fds.push(PollFd::new(eventfd.as_fd(), PollFlags::POLLIN));
        match nix::poll::poll(fds, crate::os::clock::poll_timeout(timeout)) {
            Ok(_) | Err(Errno::EINTR) => {}
            // poll on valid descriptors does not fail otherwise; sleep instead of spinning.
            Err(_) => std::thread::sleep(timeout),
        }
        let woken = fds.pop().and_then(|wake| wake.any()).unwrap_or(false);
        if woken {
            // A wake that was not a stop (a resize) is taken off; a stop's is left, so that
            // every other waiter, now or later, wakes for it too.
            drain(eventfd);
            if self.stopped() {
                wake();
            }
        }
        self.stopped()
    }
}

impl Drop for Stop {
    fn drop(&mut self) {
        for (signal, old) in &self.old {
            // SAFETY: restores the action that was installed before ours.
            if let Err(err) = unsafe { sigaction(*signal, old) } {
                log::warn!("cannot restore the {signal} handler: {err}");
            }
        }
    }
}

/// SIGWINCH wakes [`Stop::wait`] (as a timeout) while this lives, so that a full-screen
/// view redraws for the window's new size at once.
pub struct Resize {
    old: SigAction,
}

extern "C" fn on_resize(_: libc::c_int) {
    wake();
}

impl Resize {
    /// Installs the handler.
    ///
    /// # Errors
    /// When the eventfd cannot be created or the handler cannot be installed.
    pub fn install() -> Result<Self> {
        wake_fd()?;
        let action = SigAction::new(
            SigHandler::Handler(on_resize),
            SaFlags::SA_RESTART,
            SigSet::empty(),
        );
        // SAFETY: the handler only writes to the eventfd.
        let old = unsafe { sigaction(Signal::SIGWINCH, &action) }
            .context("installing the SIGWINCH handler")?;
        Ok(Self { old })
    }
}

impl Drop for Resize {
    fn drop(&mut self) {
        // SAFETY: restores the action that was installed before ours.
        let _ = unsafe { sigaction(Signal::SIGWINCH, &self.old) };
    }
}

/// The eventfd, created once and published to the handlers.
fn wake_fd() -> Result<&'static EventFd> {
    let wake = if let Some(wake) = WAKE.get() {
        wake
    } else {
        let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
            .context("creating the eventfd that stops and resizes wake waiters with")?;
        WAKE.get_or_init(|| fd)
    };
    WAKE_FD.store(wake.as_fd().as_raw_fd(), Ordering::SeqCst);
    Ok(wake)
}

/// Empties the eventfd, so that an earlier wake does not end the next wait.
fn drain(wake: &EventFd) {
    // Non-blocking: the read that finds it empty fails with EAGAIN.
    while wake.read().is_ok() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The process-wide state is shared by these tests: one test, in steps.
    #[test]
    fn a_stop_ends_every_wait_and_says_why() {
        let stop = Stop::install().unwrap();
        assert!(!stop.stopped());
        assert_eq!(why(), None);
        let started = Instant::now();
        assert!(!stop.sleep(Duration::from_millis(20)), "no signal yet");
        assert!(started.elapsed() >= Duration::from_millis(20));

        // Input on a descriptor ends a wait, without a stop.
        let (read, write) = nix::unistd::pipe().unwrap();
        nix::unistd::write(&write, b"x").unwrap();
        assert!(matches!(
            stop.wait(Some((read.as_fd(), PollFlags::POLLIN)), Duration::from_secs(10)),
            Woke::Ready(r) if r.contains(PollFlags::POLLIN)
        ));

        // A resize wakes a wait as a timeout, and is taken off: the next wait waits.
        let resize = Resize::install().unwrap();
        nix::sys::signal::raise(Signal::SIGWINCH).unwrap();
        let started = Instant::now();
        assert_eq!(stop.wait(None, Duration::from_secs(10)), Woke::Timeout);
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(!stop.sleep(Duration::from_millis(20)));
        assert!(started.elapsed() >= Duration::from_millis(20));
        drop(resize);

        let flag = stop.flag();
        // Delivered to this process; any thread may take it.
        nix::sys::signal::raise(Signal::SIGTERM).unwrap();
        let started = Instant::now();
        assert!(stop.sleep(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(flag.load(Ordering::SeqCst));
        assert_eq!(why(), Some(Why::Signal(Signal::SIGTERM)));
        // Every later wait, with or without a descriptor, ends at once.
        for _ in 0..3 {
            assert_eq!(
                stop.wait(
                    Some((read.as_fd(), PollFlags::POLLIN)),
                    Duration::from_secs(10)
                ),
                Woke::Stopped
            );
        }
        // The first reason stands.
        end(Why::OutputClosed);
        assert_eq!(why(), Some(Why::Signal(Signal::SIGTERM)));
        drop(stop);

        // A new Stop starts clear; a reason found by the program stops it as a signal does.
        let stop = Stop::install().unwrap();
        assert!(!stop.stopped());
        assert_eq!(why(), None);
        assert!(!stop.sleep(Duration::from_millis(1)));
        let waiter = {
            let flag = stop.flag();
            std::thread::spawn(move || {
                let started = Instant::now();
                while !flag.load(Ordering::SeqCst) {
                    assert!(started.elapsed() < Duration::from_secs(10));
                    std::thread::yield_now();
                }
            })
        };
        end(Why::TerminalGone);
        waiter.join().unwrap();
        assert!(stop.sleep(Duration::from_secs(10)));
        assert_eq!(why(), Some(Why::TerminalGone));
        assert_eq!(Why::TerminalGone.signal(), Signal::SIGHUP);
        assert_eq!(Why::OutputClosed.signal(), Signal::SIGPIPE);
        drop(stop);
        // Clear for whoever comes next in this process.
        let _clear = Stop::install().unwrap();
    }
}
