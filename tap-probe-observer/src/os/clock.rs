//! The clock the eBPF programs stamp events with, and waits measured against it.

use std::time::Duration;

use nix::poll::PollTimeout;

/// `CLOCK_MONOTONIC` in ns, the clock of `bpf_ktime_get_ns`.
#[must_use]
pub fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}

/// `d` as a `poll(2)` timeout, rounded up to the next millisecond: rounded down (as
/// `PollTimeout::try_from` does), the last millisecond of a wait would poll with a timeout of
/// 0 again and again, a busy loop for up to a millisecond per wait.
#[must_use]
pub fn poll_timeout(d: Duration) -> PollTimeout {
    let ms = d.as_micros().div_ceil(1000);
    PollTimeout::try_from(ms).unwrap_or(PollTimeout::MAX)
}

#[cfg(test)]
mod tests {
    use std::time::Duration;

    use nix::poll::PollTimeout;

    use super::poll_timeout;

    #[test]
    fn poll_timeouts_round_up_to_whole_milliseconds() {
        assert_eq!(poll_timeout(Duration::ZERO), PollTimeout::ZERO);
        assert_eq!(
            poll_timeout(Duration::from_nanos(1_500)),
            PollTimeout::from(1u8)
        );
        assert_eq!(
            poll_timeout(Duration::from_micros(999)),
            PollTimeout::from(1u8)
        );
        assert_eq!(
            poll_timeout(Duration::from_millis(2)),
            PollTimeout::from(2u8)
        );
        assert_eq!(
            poll_timeout(Duration::from_micros(2_001)),
            PollTimeout::from(3u8)
        );
        assert_eq!(
            poll_timeout(Duration::from_secs(u64::MAX)),
            PollTimeout::MAX
        );
    }
}
