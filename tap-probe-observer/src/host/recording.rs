//! The devices a recording follows, chosen through [`Host`] as the watcher's are, so that
//! the choice is tested without root: those that match when it starts (with `--wait`, the
//! first that match), each tracked once. Unlike the watcher's, the set never changes: a
//! trace's header lists its devices before the first event, so a device that appears later
//! is not added, and one that goes away stays in the header; only the summary leaves it
//! out, as the kernel has no counters of it left to compare.

use crate::host::Host;
use crate::host::discovery::Device;
use anyhow::Result;

/// A device the recording counts.
#[derive(Debug)]
pub struct Followed {
    pub device: Device,
    /// The queues counted: those in use when it began (a multi-queue tap has 256 queues
    /// whatever number is attached; its attached ones).
    pub queues: u32,
    /// The kernel's `tx_packets` and `tx_dropped` once tracking had begun, for the summary.
    pub baseline: (u64, u64),
}

/// The devices tracked, and those the probe refused (its maps had no room), with why.
#[derive(Debug)]
pub struct Following {
    pub followed: Vec<Followed>,
    pub refused: Vec<(Device, anyhow::Error)>,
}

/// The first devices that match the filter, once none did (`--wait`): `sleep` waits
/// before each look and says whether the run was stopped meanwhile, which ends the wait
/// with `None`.
///
/// # Errors
/// When the host cannot be scanned.
pub fn wait_for_devices<H: Host>(
    host: &mut H,
    mut sleep: impl FnMut() -> bool,
) -> Result<Option<Vec<Device>>> {
    loop {
        if sleep() {
            return Ok(None);
        }
        let devices = host.devices()?.matching;
        if !devices.is_empty() {
            return Ok(Some(devices));
        }
    }
}

/// Tracks each of `devices`, then reads the kernel's counters of those tracked: after
/// tracking has begun, so that what the summary compares was counted by both. A device
/// gone by then, or a scan that fails, keeps the counters it was found with.
pub fn follow<H: Host>(host: &mut H, devices: Vec<Device>) -> Following {
    let mut tracked = Vec::new();
    let mut refused = Vec::new();
    for device in devices {
        let queues = device.active_queues.max(1);
        match host.track(device.key, queues, device.slot_flags()) {
            Ok(_) => tracked.push((device, queues)),
            Err(err) => refused.push((device, err)),
        }
    }
    let now = if tracked.is_empty() {
        Vec::new()
    } else {
        host.devices().map(|scan| scan.matching).unwrap_or_default()
    };
    let followed = tracked
        .into_iter()
        .map(|(device, queues)| {
            let stats = now
                .iter()
                .find(|n| n.key == device.key)
                .map_or(device.stats, |n| n.stats);
            Followed {
                baseline: (stats.tx_packets, stats.tx_dropped),
                device,
                queues,
            }
        })
        .collect();
    Following { followed, refused }
}

/// What the kernel counted of each followed device still there (in `after`, a scan at the
/// end) since its baseline: `(name, tx_packets, tx_dropped)`. Devices that went away are
/// left out.
#[must_use]
pub fn counted_since<'a>(followed: &'a [Followed], after: &[Device]) -> Vec<(&'a str, u64, u64)> {
    followed
        .iter()
        .filter_map(|f| {
            let now = after.iter().find(|a| a.key == f.device.key)?;
            Some((
                f.device.name.as_str(),
                now.stats.tx_packets.saturating_sub(f.baseline.0),
                now.stats.tx_dropped.saturating_sub(f.baseline.1),
            ))
        })
        .collect()
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::host::watcher::tests::{FakeHost, device};

    /// The devices that match are tracked, their queues in use as `watch` does (a
    /// multi-queue tap's attached ones, not its 256), with the kernel's counters read after
    /// tracking began; one the probe has no room for is refused and not tracked.
    #[test]
    fn matching_devices_are_tracked_and_a_full_probe_refuses_the_rest() {
        let mut host = FakeHost::new();
        let mut multi = device(2, "mq0", 10, 1);
        multi.queues = 256;
        multi.active_queues = 4;
        host.devices = vec![device(1, "tap0", 5, 0), multi, device(3, "tap3", 0, 0)];
        host.room = 2;
        let devices = host.devices().unwrap().matching;
        // Traffic between the first scan and the tracking: the baseline is taken after.
        host.devices[0].stats.tx_packets = 8;
        let Following { followed, refused } = follow(&mut host, devices);
        assert_eq!(host.calls, ["track 1 1", "track 2 4", "full 3"]);
        let followed: Vec<_> = followed
            .iter()
            .map(|f| (f.device.name.as_str(), f.queues, f.baseline))
            .collect();
        assert_eq!(followed, [("tap0", 1, (8, 0)), ("mq0", 4, (10, 1))]);
        assert_eq!(refused.len(), 1);
        assert_eq!(refused[0].0.name, "tap3");
    }

    /// With no device yet, the wait looks again after each sleep until it is stopped;
    /// once devices match, it takes them at its next look. A device that appears after
    /// they were followed is not added, and one that went away is left out of what the
    /// kernel counted since.
    #[test]
    fn the_first_devices_are_followed_and_departed_ones_left_out_of_the_counts() {
        let mut host = FakeHost::new();
        let mut sleeps = 0;
        let waited = wait_for_devices(&mut host, || {
            sleeps += 1;
            sleeps == 3
        });
        assert!(waited.unwrap().is_none());
        assert_eq!(sleeps, 3);

        host.devices = vec![device(1, "tap0", 100, 2), device(2, "tap1", 50, 0)];
        let devices = wait_for_devices(&mut host, || false).unwrap().unwrap();
        let followed = follow(&mut host, devices).followed;
        assert_eq!(host.calls, ["track 1 1", "track 2 1"]);

        // tap1 goes away, tap2 appears, tap0 sends and drops.
        host.devices = vec![device(1, "tap0", 130, 5), device(3, "tap2", 7, 0)];
        let after = host.devices().unwrap().matching;
        assert_eq!(counted_since(&followed, &after), [("tap0", 30, 3)]);
        assert_eq!(
            host.calls,
            ["track 1 1", "track 2 1"],
            "nothing tracked later"
        );
    }
}
