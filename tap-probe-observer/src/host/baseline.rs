//! Comparing the probes' counters with the kernel's own statistics of a device, which are
//! read through another interface (rtnetlink) at another instant.
//!
//! Two things make the two disagree without anything being wrong:
//! - the baseline: the kernel's statistics run from the device's creation, the probes' from
//!   the moment tracking began, so the kernel's are shown as deltas from a baseline, which
//!   must be read when the probes' counters start, not before (packets in between would be
//!   the kernel's and not the probes') nor later (the other way round);
//! - each refresh: packets keep flowing while the two are read one after the other.
//!
//! The kernel counts a packet a few instructions before the event the probes count it at
//! (tun counts `tx_packets` in `tun_put_user`, then frees the packet, `consume_skb`; its
//! drop path counts `tx_dropped`, then `kfree_skb`): a packet caught between the two when
//! the statistics are read is already the kernel's and not yet the probes'. So the probes'
//! counters are read a moment after the statistics ([`Host::settle`]), by when such a packet
//! has reached them, and it shows as counted in between.
//!
//! The baseline is read right after tracking began, and it is exact when the probes counted
//! nothing of the device before it was read (their counters are read after it, and are still
//! zero); otherwise the counters are zeroed and the baseline read again, a few times. Under
//! a load that never pauses it may stay inexact: what the probes counted before it is then
//! the bound of its error. Each refresh reads the probes' counters before and after the
//! kernel's: what they counted in between bounds that refresh's error. The sum of the two is
//! shown as `kernel.skew`; it is 0 once traffic stops, and then the kernel's columns and the
//! probes' must agree exactly.

use anyhow::Result;
use tap_probe_common::{DeviceKey, QueueCounters};

use crate::host::Host;

/// Attempts at an exact baseline before settling for a bounded one, and how long they may
/// take in all (a slow machine under load gives up sooner rather than stall the refresh).
const BASELINE_ATTEMPTS: usize = 128;
const BASELINE_TIME: std::time::Duration = std::time::Duration::from_millis(100);

/// The kernel's statistics of a device when its counting began.
#[derive(Clone, Copy, Debug, Default, PartialEq, Eq)]
pub struct Baseline {
    pub tx_packets: u64,
    pub tx_dropped: u64,
    /// Packets the probes counted before the baseline was read: 0 for an exact one.
    pub skew: u64,
}

/// Reads the baseline of a device whose tracking just began (see the module documentation),
/// with the probes' counters read right after it.
///
/// # Errors
/// When the kernel's statistics or the probes' counters cannot be read.
pub fn take(host: &mut impl Host, key: DeviceKey) -> Result<(Baseline, Vec<QueueCounters>)> {
    let mut attempt = 0;
    let start = std::time::Instant::now();
    loop {
        let read_at = std::time::Instant::now();
        let stats = host.kernel_stats(key)?;
        host.settle(read_at.elapsed());
        let after = host.queue_counters(key)?;
        let counted = packets(&after);
        attempt += 1;
        if counted == 0 || attempt == BASELINE_ATTEMPTS || start.elapsed() >= BASELINE_TIME {
            let baseline = Baseline {
                tx_packets: stats.tx_packets,
                tx_dropped: stats.tx_dropped,
                skew: counted,
            };
            return Ok((baseline, after));
        }
        // Count again from zero: what is zeroed now predates the next read of the kernel's.
        host.reset(key)?;
    }
}

/// The packet events the probes counted on a device's queues that the kernel's columns
/// count too (takes in `tx_packets`, drops in `tx_dropped`): each is a packet the kernel's
/// statistics may have seen at another moment. The others (driver calls, enqueues) have no
/// twin in the kernel's statistics, so no baseline to be off from.
#[must_use]
pub fn packets(queues: &[QueueCounters]) -> u64 {
    queues
        .iter()
        .map(|q| q.consumed + q.dropped_full_ring + q.dropped_other)
        .sum()
}

/// What the probes counted between `before` and `after`: packets that passed while the
/// kernel's statistics were read between the two.
#[must_use]
pub(crate) fn counted_between(before: &[QueueCounters], after: &[QueueCounters]) -> u64 {
    packets(after).saturating_sub(packets(before))
}
