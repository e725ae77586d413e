//! Devices that went away, kept in the scrape for a grace period.
//!
//! The watcher reports a vanished device once more, with the counts it had when it went,
//! and then forgets it. A scrape target that dropped its series at once would lose what
//! the device counted since the last scrape (a VM that tail-dropped until it shut down),
//! and its series would end without their last increase. Kept for a grace period longer
//! than the scrape interval, the last values are scraped at least once; dropped after it,
//! the series of departed devices do not pile up however many VMs come and go.

use std::time::{Duration, Instant};

use tap_probe_observer::host::report::{Report, Row};

/// The most departed rows kept at once, whatever the grace: under a storm of short-lived
/// devices the oldest go first, so the scrape stays bounded.
pub(crate) const MAX_DEPARTED: usize = 4096;

/// The last rows of departed devices, each with when it went.
#[derive(Debug)]
pub(crate) struct Departed {
    grace: Duration,
    rows: Vec<(Instant, Row)>,
}

impl Departed {
    /// Keeps departed devices' rows for `grace` (zero: not at all).
    #[must_use]
    pub(crate) fn new(grace: Duration) -> Self {
        Self {
            grace,
            rows: Vec::new(),
        }
    }

    /// Takes the rows of devices that went away in `report`, forgets those that went more
    /// than the grace ago, and returns the departed rows to serve beside `report`'s: those
    /// whose labels no live row has (a device of the same name back in the same namespace
    /// is served as the live one).
    pub(crate) fn update(&mut self, report: &Report, now: Instant) -> Vec<Row> {
        if !self.grace.is_zero() {
            self.rows.extend(
                report
                    .rows
                    .iter()
                    .filter(|row| row.retired)
                    .map(|row| (now, row.clone())),
            );
        }
        self.rows
            .retain(|(went, _)| now.saturating_duration_since(*went) < self.grace);
        if self.rows.len() > MAX_DEPARTED {
            // Rows come in the order devices went: the oldest are first.
            let excess = self.rows.len() - MAX_DEPARTED;
            log::debug!("dropping the series of {excess} departed devices early: too many");
            self.rows.drain(..excess);
        }
        if self.rows.is_empty() {
            // Nothing departed: no labels to compare (a dense host's thousands of rows).
            return Vec::new();
        }
        let live: std::collections::HashSet<String> = report
            .rows
            .iter()
            .filter(|row| !row.retired)
            .map(|row| super::labels(row, true))
            .collect();
        self.rows
            .iter()
            .filter(|(_, row)| !live.contains(&super::labels(row, true)))
            .map(|(_, row)| row.clone())
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;
    use crate::output::lines::tests::report;

    fn row(device: &str, retired: bool) -> Row {
        Row {
            ifname: device.to_owned(),
            retired,
            ..crate::output::lines::tests::full_row()
        }
    }

    fn names(rows: &[Row]) -> Vec<&str> {
        rows.iter().map(|r| r.ifname.as_str()).collect()
    }

    #[test]
    fn a_departed_device_is_served_for_the_grace_then_dropped() {
        let start = Instant::now();
        let at = |s: u64| start + Duration::from_secs(s);
        let mut departed = Departed::new(Duration::from_mins(1));
        let kept = departed.update(
            &report(1.0, vec![row("vnet0", true), row("vnet1", false)]),
            at(0),
        );
        assert_eq!(names(&kept), ["vnet0"]);
        // Later refreshes no longer carry it; it stays until the grace has passed.
        let kept = departed.update(&report(2.0, vec![row("vnet1", false)]), at(59));
        assert_eq!(names(&kept), ["vnet0"]);
        let kept = departed.update(&report(3.0, vec![row("vnet1", false)]), at(60));
        assert!(kept.is_empty(), "{:?}", names(&kept));
    }

    #[test]
    fn a_device_back_under_the_same_labels_is_served_once_as_live() {
        let start = Instant::now();
        let mut departed = Departed::new(Duration::from_mins(1));
        departed.update(&report(1.0, vec![row("vnet0", true)]), start);
        let kept = departed.update(&report(2.0, vec![row("vnet0", false)]), start);
        assert!(kept.is_empty(), "the live row wins");
        // Under another owner it is another series, and both are served.
        let mut other = row("vnet0", false);
        other.owner = None;
        let kept = departed.update(&report(3.0, vec![other]), start);
        assert_eq!(names(&kept), ["vnet0"]);
    }

    #[test]
    fn without_a_grace_nothing_is_kept_and_the_count_is_bounded() {
        let now = Instant::now();
        let mut none = Departed::new(Duration::ZERO);
        assert!(
            none.update(&report(1.0, vec![row("vnet0", true)]), now)
                .is_empty()
        );
        let mut departed = Departed::new(Duration::from_mins(1));
        let storm: Vec<Row> = (0..MAX_DEPARTED + 10)
            .map(|i| row(&format!("vnet{i}"), true))
            .collect();
        let kept = departed.update(&report(1.0, storm), now);
        assert_eq!(kept.len(), MAX_DEPARTED);
        assert_eq!(kept[0].ifname, "vnet10", "the oldest went first");
    }
}
