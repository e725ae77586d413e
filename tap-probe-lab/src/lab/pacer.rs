//! Pacing a sender or a reader to a rate: frame `n` (counted from the last rebase) is due at
//! `base + n / pps`, an absolute schedule, so late wake-ups (sleeps overshoot, more so in an
//! emulated guest) are made up for and the long-run rate stays `pps`.

use std::time::{Duration, Instant};

/// Pacing sleeps shorter than this are not worth a syscall; the loop yields instead.
const MIN_SLEEP: Duration = Duration::from_micros(200);
/// How long one wait lasts at most, so that stop flags and deadlines are seen.
const POLL_SLICE: Duration = Duration::from_millis(20);

/// A rate of `pps` frames per second. Credit earned while there was nothing to do (a reader
/// with no traffic) is capped at `burst` frames by [`Pacer::forgive`], so a reader that
/// waited for traffic does not then take a backlog at once.
pub(crate) struct Pacer {
    pps: u64,
    base: Instant,
    base_count: u64,
    burst: u64,
}

impl Pacer {
    pub(crate) fn new(pps: u64, start: Instant) -> Self {
        let pps = pps.max(1);
        Self {
            pps,
            base: start,
            base_count: 0,
            // About 10 ms of frames, at least 1.
            burst: (pps / 100).max(1),
        }
    }

    /// Frames that may be recycled by `now` beyond the `done` already recycled.
    pub(crate) fn allowed(&self, now: Instant, done: u64) -> u64 {
        let elapsed = now.saturating_duration_since(self.base).as_nanos();
        let due = elapsed * u128::from(self.pps) / 1_000_000_000 + 1;
        self.base_count
            .saturating_add(u64::try_from(due).unwrap_or(u64::MAX))
            .saturating_sub(done)
    }

    /// Called while nothing waits to be recycled: caps the credit at `burst`.
    pub(crate) fn forgive(&mut self, now: Instant, done: u64) {
        if self.allowed(now, done) > self.burst {
            self.base = now;
            self.base_count = done + self.burst - 1;
        }
    }

    /// Sleeps until frame `done` is due (or `until`, or one poll slice).
    pub(crate) fn wait(&self, done: u64, until: Instant) {
        let ahead = u128::from(done.saturating_sub(self.base_count));
        let due_ns = ahead * 1_000_000_000 / u128::from(self.pps);
        let due = self.base + Duration::from_nanos(u64::try_from(due_ns).unwrap_or(u64::MAX));
        let gap = due
            .min(until)
            .saturating_duration_since(Instant::now())
            .min(POLL_SLICE);
        if gap >= MIN_SLEEP {
            std::thread::sleep(gap);
        } else {
            std::thread::yield_now();
        }
    }
}

/// `start + d`, saturating at a year for "no deadline" values such as `Duration::MAX`.
pub(crate) fn deadline_after(start: Instant, d: Duration) -> Instant {
    start
        .checked_add(d.min(Duration::from_hours(365 * 24)))
        .unwrap_or(start)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn pacer_catches_up_but_forgives_idle_time() {
        let start = Instant::now();
        let mut p = Pacer::new(1000, start);
        assert_eq!(p.allowed(start, 0), 1);
        assert_eq!(p.allowed(start + Duration::from_millis(5), 0), 6);
        assert_eq!(p.allowed(start + Duration::from_millis(5), 6), 0);
        // Late by 100 ms with frames waiting: all of it may be made up.
        let late = start + Duration::from_millis(105);
        assert_eq!(p.allowed(late, 6), 100);
        // A second with nothing to recycle: the credit is capped at 10 ms worth.
        let idle = start + Duration::from_secs(1);
        p.forgive(idle, 106);
        assert_eq!(p.allowed(idle, 106), 10);
        assert_eq!(p.allowed(idle, 116), 0);
        assert_eq!(p.allowed(idle + Duration::from_millis(1), 116), 1);
        // Forgiving within the burst changes nothing.
        p.forgive(idle + Duration::from_millis(1), 116);
        assert_eq!(p.allowed(idle + Duration::from_millis(1), 116), 1);
    }
}
