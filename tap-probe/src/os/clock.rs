//! The clock the eBPF programs stamp events with.

/// `CLOCK_MONOTONIC` in ns, the clock of `bpf_ktime_get_ns`.
#[must_use]
pub(crate) fn monotonic_ns() -> u64 {
    let ts = nix::time::clock_gettime(nix::time::ClockId::CLOCK_MONOTONIC)
        .unwrap_or_else(|_| nix::sys::time::TimeSpec::new(0, 0));
    u64::try_from(ts.tv_sec()).unwrap_or(0) * 1_000_000_000
        + u64::try_from(ts.tv_nsec()).unwrap_or(0)
}
