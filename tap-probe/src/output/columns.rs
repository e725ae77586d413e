//! The columns of the compact table and of the full-screen view: a closed set, each named
//! for `--columns`, with the metrics it reads (by their ids in the counter table), a header
//! and a shorter one, what it means (the legend), and how long it stays when the window is
//! narrow.

use tap_probe_common::MetricId;

/// What a column shows.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum What {
    Device,
    Netns,
    Kind,
    Queue,
    Owner,
    /// A counter, as a rate per second (as a total in the final summary).
    Rate(MetricId),
    /// Stuck, stopped now, or the share of the time stopped (`stuck`, `stopped`,
    /// `stopped_ns`).
    Stopped,
    /// A value shown as it is: a state or a gauge.
    State(MetricId),
}

/// One column.
#[derive(Debug, PartialEq, Eq)]
pub(crate) struct Column {
    /// Its name for `--columns`.
    pub(crate) name: &'static str,
    pub(crate) header: &'static str,
    /// The header when the window is narrow.
    pub(crate) short: &'static str,
    pub(crate) what: What,
    /// Its line in the legend.
    pub(crate) help: &'static str,
    /// Columns are dropped from the narrowest window in increasing order of this; the
    /// device, delivered and ring drop columns are never dropped ([`KEEP`]).
    pub(crate) keep: u8,
    /// Shown when `--columns` is not given.
    pub(crate) default: bool,
    /// Shown for each queue in the full-screen view's detail of a device with several.
    pub(crate) per_queue: bool,
}

/// The `keep` of the columns that every width shows.
pub(crate) const KEEP: u8 = u8::MAX;

/// Every column, in the order the table shows them: who, then the rates, then the states,
/// then the rest.
pub(crate) const COLUMNS: &[Column] = &[
    Column {
        name: "device",
        header: "DEVICE",
        short: "DEV",
        what: What::Device,
        help: "the device; its queues are folded under it when it has several",
        keep: KEEP,
        default: true,
        per_queue: false,
    },
    Column {
        name: "netns",
        header: "NETNS",
        short: "NS",
        what: What::Netns,
        help: "its network namespace (init: the host's own)",
        keep: 2,
        default: true,
        per_queue: false,
    },
    Column {
        name: "queue",
        header: "Q",
        short: "Q",
        what: What::Queue,
        help: "the transmit queue (all: the device's sum)",
        keep: 9,
        default: true,
        per_queue: true,
    },
    Column {
        name: "delivered",
        header: "DELIVERED",
        short: "DELIV",
        what: What::Rate(MetricId::Consumed),
        help: "packets the reader (the VM) took out of the ring",
        keep: KEEP,
        default: true,
        per_queue: true,
    },
    Column {
        name: "ring-drops",
        header: "RING_DROPS",
        short: "RDROP",
        what: What::Rate(MetricId::DroppedFullRing),
        help: "packets dropped because the ring was full (tail-drop)",
        keep: KEEP,
        default: true,
        per_queue: true,
    },
    Column {
        name: "busy",
        header: "BUSY",
        short: "BUSY",
        what: What::Rate(MetricId::Busy),
        help: "NETDEV_TX_BUSY returns: packets handed back to the qdisc",
        keep: 8,
        default: true,
        per_queue: true,
    },
    Column {
        name: "stopped",
        header: "STOPPED",
        short: "STOP",
        what: What::Stopped,
        help: "share of the time the queue was stopped (backpressure); \"now\" while it is; \
               \"STUCK\" when stopped with no reader take for too long",
        keep: 7,
        default: true,
        per_queue: true,
    },
    Column {
        name: "backpressure",
        header: "BACKPRESSURE",
        short: "BP",
        what: What::State(MetricId::Backpressure),
        help: "the tap stops its queue instead of dropping when the ring is full \
               (IFF_BACKPRESSURE)",
        keep: 6,
        default: false,
        per_queue: false,
    },
    Column {
        name: "occupancy",
        header: "OCCUPANCY",
        short: "OCC",
        what: What::State(MetricId::RingOccupancy),
        help: "entries in the tap's ring",
        keep: 5,
        default: false,
        per_queue: false,
    },
    Column {
        name: "xmit",
        header: "XMIT",
        short: "XMIT",
        what: What::Rate(MetricId::XmitCalls),
        help: "calls into the driver's transmit function",
        keep: 1,
        default: false,
        per_queue: false,
    },
    Column {
        name: "other-drops",
        header: "OTHER_DROPS",
        short: "ODROP",
        what: What::Rate(MetricId::DroppedOther),
        help: "packets the driver dropped for another reason (reasons below the table)",
        keep: 1,
        default: false,
        per_queue: false,
    },
    Column {
        name: "sleeps",
        header: "SLEEPS",
        short: "SLP",
        what: What::Rate(MetricId::ReaderSleeps),
        help: "times the reader slept between two packets (each ended by a wake-up)",
        keep: 1,
        default: false,
        per_queue: false,
    },
    Column {
        name: "kind",
        header: "KIND",
        short: "KIND",
        what: What::Kind,
        help: "tun, tap, veth or macvtap",
        keep: 1,
        default: false,
        per_queue: false,
    },
    Column {
        name: "owner",
        header: "OWNER",
        short: "OWNER",
        what: What::Owner,
        help: "the process that holds the device open (command/pid)",
        keep: 3,
        default: true,
        per_queue: false,
    },
];

impl Column {
    /// Its header: rates say so, except in the final summary, which shows totals.
    #[must_use]
    pub(crate) fn header(&self, short: bool, rates: bool) -> String {
        let header = if short { self.short } else { self.header };
        match self.what {
            What::Rate(_) if rates => format!("{header}/s"),
            _ => header.to_owned(),
        }
    }
}

/// The columns shown when `--columns` is not given.
#[must_use]
pub(crate) fn defaults() -> Vec<&'static Column> {
    COLUMNS.iter().filter(|c| c.default).collect()
}

/// The columns of the full-screen view's per-queue detail.
#[must_use]
pub(crate) fn per_queue() -> Vec<&'static Column> {
    COLUMNS.iter().filter(|c| c.per_queue).collect()
}

/// The columns `--columns` chose, in their order.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) struct Chosen(pub(crate) Vec<&'static Column>);

/// `--columns LIST`: comma-separated names from [`COLUMNS`], in the order to show them.
///
/// # Errors
/// An unknown or repeated name, or an empty list, with the names on offer.
pub(crate) fn parse(list: &str) -> Result<Chosen, String> {
    let valid = || {
        COLUMNS
            .iter()
            .map(|c| c.name)
            .collect::<Vec<_>>()
            .join(", ")
    };
    let mut chosen: Vec<&'static Column> = Vec::new();
    for name in list.split(',').map(str::trim).filter(|n| !n.is_empty()) {
        let Some(column) = COLUMNS.iter().find(|c| c.name == name) else {
            return Err(format!(
                "unknown column {name:?}; valid columns: {}",
                valid()
            ));
        };
        if chosen.contains(&column) {
            return Err(format!("column {name:?} is given twice"));
        }
        chosen.push(column);
    }
    if chosen.is_empty() {
        return Err(format!(
            "give at least one column; valid columns: {}",
            valid()
        ));
    }
    Ok(Chosen(chosen))
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn names_are_unique_and_the_kept_ones_are_on_offer() {
        for (i, c) in COLUMNS.iter().enumerate() {
            assert!(
                COLUMNS[i + 1..].iter().all(|o| o.name != c.name),
                "{}",
                c.name
            );
            assert!(c.short.len() <= c.header.len(), "{}", c.name);
        }
        let kept: Vec<&str> = defaults()
            .iter()
            .filter(|c| c.keep == KEEP)
            .map(|c| c.name)
            .collect();
        assert_eq!(kept, ["device", "delivered", "ring-drops"]);
        // A queue's line in the detail names its queue first, and shows what it delivered
        // and dropped.
        let detail: Vec<&str> = per_queue().iter().map(|c| c.name).collect();
        assert_eq!(detail[..3], ["queue", "delivered", "ring-drops"]);
    }

    #[test]
    fn columns_parse_in_order_and_bad_names_list_the_valid_ones() {
        let names = |list| {
            parse(list)
                .unwrap()
                .0
                .iter()
                .map(|c| c.name)
                .collect::<Vec<_>>()
        };
        assert_eq!(
            names("ring-drops, device,delivered"),
            ["ring-drops", "device", "delivered"]
        );
        let err = parse("device,drops").unwrap_err();
        assert!(err.contains("unknown column \"drops\""), "{err}");
        assert!(err.contains("valid columns: device, netns, queue"), "{err}");
        assert!(parse("device,device").unwrap_err().contains("twice"));
        assert!(parse(" , ").unwrap_err().contains("at least one"));
    }
}
