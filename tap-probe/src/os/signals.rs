//! SIGINT, SIGTERM and SIGHUP: the one way tap-probe is told to stop, for every loop. SIGHUP
//! comes when the terminal goes away (a closed window, an ended ssh session); it must clean
//! up like the others rather than die leaving namespaces, taps and probes behind.
//!
//! A caught signal sets a flag and makes an eventfd readable. Threads that send or read
//! traffic look at the flag between batches; a loop that sleeps between refreshes sleeps in
//! `poll` on the eventfd, so it wakes at once whichever thread the kernel delivered the
//! signal to (a process-directed signal goes to any thread that does not block it,
//! `complete_signal` in kernel/signal.c). The handlers are installed for as long as a
//! [`Stop`] lives, without `SA_RESTART`, and the previous ones come back on drop.

use std::os::fd::{AsFd as _, AsRawFd as _};
use std::sync::atomic::{AtomicBool, AtomicI32, Ordering};
use std::sync::{Arc, OnceLock};
use std::time::{Duration, Instant};

use anyhow::{Context as _, Result};
use nix::errno::Errno;
use nix::poll::{PollFd, PollFlags};
use nix::sys::eventfd::{EfdFlags, EventFd};
use nix::sys::signal::{SaFlags, SigAction, SigHandler, SigSet, Signal, sigaction};

/// Set by the handler; shared with the threads that check it.
static FLAG: OnceLock<Arc<AtomicBool>> = OnceLock::new();
/// The eventfd the handler writes to, -1 before the first [`Stop::install`]. It stays open
/// for the life of the process, so a handler running late never writes to a reused fd.
static WAKE_FD: AtomicI32 = AtomicI32::new(-1);
static WAKE: OnceLock<EventFd> = OnceLock::new();

extern "C" fn on_signal(_: libc::c_int) {
    // Async-signal-safe: atomic loads and stores, and write(2).
    if let Some(flag) = FLAG.get() {
        flag.store(true, Ordering::SeqCst);
    }
    let fd = WAKE_FD.load(Ordering::SeqCst);
    if fd >= 0 {
        let one = 1u64;
        // SAFETY: writes 8 bytes from a live local to an eventfd that is never closed.
        // Nothing to do on failure: the flag is set either way.
        let _ = unsafe { libc::write(fd, (&raw const one).cast(), size_of::<u64>()) };
    }
}

/// SIGINT, SIGTERM and SIGHUP caught while this lives.
pub(crate) struct Stop {
    flag: Arc<AtomicBool>,
    old: Vec<(Signal, SigAction)>,
}

impl Stop {
    /// Installs the handlers and clears an earlier stop.
    ///
    /// # Errors
    /// When the eventfd cannot be created or a handler cannot be installed.
    pub(crate) fn install() -> Result<Self> {
        let flag = Arc::clone(FLAG.get_or_init(|| Arc::new(AtomicBool::new(false))));
        flag.store(false, Ordering::SeqCst);
        let wake = if let Some(wake) = WAKE.get() {
            wake
        } else {
            let fd = EventFd::from_flags(EfdFlags::EFD_CLOEXEC | EfdFlags::EFD_NONBLOCK)
                .context("creating the eventfd that signals wake sleepers with")?;
            WAKE.get_or_init(|| fd)
        };
        drain(wake);
        WAKE_FD.store(wake.as_fd().as_raw_fd(), Ordering::SeqCst);
        let action = SigAction::new(
            SigHandler::Handler(on_signal),
            SaFlags::empty(),
            SigSet::empty(),
        );
        let mut stop = Self {
            flag,
            old: Vec::new(),
        };
        for signal in [Signal::SIGINT, Signal::SIGTERM, Signal::SIGHUP] {
            // SAFETY: the handler only touches atomics and calls write(2).
            let old = unsafe { sigaction(signal, &action) }
                .with_context(|| format!("installing the {signal} handler"))?;
            stop.old.push((signal, old));
        }
        Ok(stop)
    }

    /// The flag a signal sets, for threads that check it between steps.
    #[must_use]
    pub(crate) fn flag(&self) -> Arc<AtomicBool> {
        Arc::clone(&self.flag)
    }

    /// Whether a signal came.
    #[must_use]
    pub(crate) fn stopped(&self) -> bool {
        self.flag.load(Ordering::SeqCst)
    }

    /// Sleeps for `wait`, or less when a signal comes; true when one came (or had come).
    #[must_use]
    pub(crate) fn sleep(&self, wait: Duration) -> bool {
        let end = Instant::now() + wait;
        let Some(wake) = WAKE.get() else {
            std::thread::sleep(wait);
            return self.stopped();
        };
        while !self.stopped() {
            let left = end.saturating_duration_since(Instant::now());
            if left.is_zero() {
                break;
            }
            let mut fds = [PollFd::new(wake.as_fd(), PollFlags::POLLIN)];
            match nix::poll::poll(&mut fds, crate::os::clock::poll_timeout(left)) {
                Ok(_) | Err(Errno::EINTR) => {}
                // poll on a valid eventfd does not fail otherwise; sleep instead of spinning.
                Err(_) => std::thread::sleep(left),
            }
        }
        self.stopped()
    }
}

impl Stop {
    /// Waits for `wait` at most, until one of `fds` is readable or a signal comes; true
    /// when one came (or had come).
    #[must_use]
    pub(crate) fn wait_readable(
        &self,
        fds: &[std::os::fd::BorrowedFd<'_>],
        wait: Duration,
    ) -> bool {
        let Some(wake) = WAKE.get() else {
            return self.sleep(wait);
        };
        if self.stopped() {
            return true;
        }
        let mut polled: Vec<PollFd<'_>> = fds
            .iter()
            .map(|fd| PollFd::new(*fd, PollFlags::POLLIN))
            .collect();
        polled.push(PollFd::new(wake.as_fd(), PollFlags::POLLIN));
        match nix::poll::poll(&mut polled, crate::os::clock::poll_timeout(wait)) {
            Ok(_) | Err(Errno::EINTR) => {}
            // poll on valid fds does not fail otherwise; sleep instead of spinning.
            Err(_) => std::thread::sleep(wait),
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

/// Empties the eventfd, so that an earlier signal does not end the next sleep.
fn drain(wake: &EventFd) {
    // Non-blocking: the read that finds it empty fails with EAGAIN.
    while wake.read().is_ok() {}
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn a_signal_ends_the_sleep_and_sets_the_flag() {
        let stop = Stop::install().unwrap();
        assert!(!stop.stopped());
        let started = Instant::now();
        assert!(!stop.sleep(Duration::from_millis(20)), "no signal yet");
        assert!(started.elapsed() >= Duration::from_millis(20));
        let flag = stop.flag();
        // Delivered to this process; any thread may take it.
        nix::sys::signal::raise(Signal::SIGTERM).unwrap();
        let started = Instant::now();
        assert!(stop.sleep(Duration::from_secs(10)));
        assert!(started.elapsed() < Duration::from_secs(5));
        assert!(flag.load(Ordering::SeqCst));
        drop(stop);
        // A new Stop starts clear.
        let stop = Stop::install().unwrap();
        assert!(!stop.stopped());
        assert!(!stop.sleep(Duration::from_millis(1)));
    }
}
