//! The time of the event a program handles, read from the kernel at most once per run: the
//! event's record, the ring sample and the queue's stop time taken with it share one read
//! (`bpf_ktime_get_ns` costs about as much as the rest of a sample together).

use aya_ebpf::helpers::bpf_ktime_get_ns;

/// `CLOCK_MONOTONIC` nanoseconds, read on first use.
pub(crate) struct Clock(u64);

impl Clock {
    #[inline(always)]
    pub(crate) const fn new() -> Self {
        Self(0)
    }

    /// The time, read now if it was not yet (the clock never reads 0 once the system runs).
    #[inline(always)]
    pub(crate) fn now(&mut self) -> u64 {
        if self.0 == 0 {
            self.0 = unsafe { bpf_ktime_get_ns() };
        }
        self.0
    }
}
