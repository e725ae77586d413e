//! The numbers a run of traffic through a tap measured (`tap-probe load`, `demo`, a scenario
//! of `check`), declared once in the table of `load_numbers!`: each number's JSON name, its
//! label in `load`'s table, how it is shown and its documentation. The table generates the
//! report's fields ([`LoadNumbers`], which the lab's report flattens into its JSON and the
//! benchmarks read back), their typed ids ([`LoadNumber`]), which are also the names an
//! expectation of `check` may use, and their values as expressions see them.

use serde::{Deserialize, Serialize};

use crate::measured::MeasuredValue;

/// The Rust type of each kind of number.
macro_rules! number_type {
    (Count) => { u64 };
    (MaybeCount) => { Option<u64> };
    (Secs) => { f64 };
    (Rate) => { f64 };
}

/// A number as expressions see it; `None` where the run measured nothing.
macro_rules! number_value {
    (Count, $v:expr) => {
        Some(MeasuredValue::Count($v))
    };
    (MaybeCount, $v:expr) => {
        $v.map(MeasuredValue::Count)
    };
    (Secs, $v:expr) => {
        Some(MeasuredValue::Real($v))
    };
    (Rate, $v:expr) => {
        Some(MeasuredValue::Real($v))
    };
}

/// A number as `load`'s table shows it.
macro_rules! number_shown {
    (Count, $v:expr) => {
        $v.to_string()
    };
    (MaybeCount, $v:expr) => {
        $v.map_or_else(|| "-".to_owned(), |n| n.to_string())
    };
    (Secs, $v:expr) => {
        format!("{:.3} s", $v)
    };
    (Rate, $v:expr) => {
        format!("{:.0}", $v)
    };
}

/// Declares [`LoadNumber`] and [`LoadNumbers`] from one list of entries,
/// `field as Id: Kind, "label";`, in the order a packet meets them. A kind is a `Count`, a
/// `MaybeCount` (`None` where nothing was measured: no qdisc counters under `noqueue`), a
/// `Secs` or a `Rate`.
macro_rules! load_numbers {
    ($($(#[doc = $doc:literal])* $field:ident as $id:ident: $kind:ident, $label:literal;)*) => {
        /// A number of the load report, by which the code asks for it.
        #[derive(Clone, Copy, Debug, PartialEq, Eq, Hash)]
        pub enum LoadNumber {
            $($(#[doc = $doc])* $id,)*
        }

        impl LoadNumber {
            /// Every number, in the table's order.
            pub const ALL: &[Self] = &[$(Self::$id),*];

            /// Its JSON field, and its name in an expectation.
            #[must_use]
            pub const fn name(self) -> &'static str {
                match self {
                    $(Self::$id => stringify!($field),)*
                }
            }

            /// Its label in `load`'s table.
            #[must_use]
            pub const fn label(self) -> &'static str {
                match self {
                    $(Self::$id => $label,)*
                }
            }

            /// What it is, as its documentation says (for the generated reference).
            #[must_use]
            pub fn doc(self) -> String {
                let text = match self {
                    $(Self::$id => concat!($($doc),*),)*
                };
                text.split_whitespace().collect::<Vec<_>>().join(" ")
            }
        }

        /// The numbers a run measured. Generated from the table in `load.rs`.
        #[derive(Clone, Copy, Debug, Default, PartialEq, Serialize, Deserialize)]
        pub struct LoadNumbers {
            $($(#[doc = $doc])* pub $field: number_type!($kind),)*
        }

        impl LoadNumbers {
            /// A number as expressions see it; `None` where the run measured nothing.
            #[must_use]
            pub fn value(&self, id: LoadNumber) -> Option<MeasuredValue> {
                match id {
                    $(LoadNumber::$id => number_value!($kind, self.$field),)*
                }
            }

            /// A number as `load`'s table shows it (`-` for nothing measured).
            #[must_use]
            pub fn shown(&self, id: LoadNumber) -> String {
                match id {
                    $(LoadNumber::$id => number_shown!($kind, self.$field),)*
                }
            }
        }
    };
}

load_numbers! {
    /// Frames given to the kernel.
    attempted as Attempted: Count, "attempted";
    /// Frames the stack accepted.
    sent as Sent: Count, "sent";
    /// Frames dropped on the way and reported to the sender: by a full qdisc, or by the
    /// driver where there is none.
    enobufs as Enobufs: Count, "enobufs";
    /// Frames the reader took while the sender ran.
    read_by_reader as ReadByReader: Count, "read by reader";
    /// Frames the `read` reader took out of their flow's order: after a later frame of the
    /// same sender and flow. None (`null`) for vhost-net, whose frames land in buffers the
    /// reader does not parse.
    reordered_by_reader as ReorderedByReader: MaybeCount, "reordered (reader)";
    /// Frames left in the ring afterwards, taken by the drain.
    drained as Drained: Count, "drained after";
    /// Change of the tap's `tx_packets` (tun counts a packet when it is read).
    kernel_tx_packets as KernelTxPackets: Count, "kernel tx_packets";
    /// Change of the tap's `tx_dropped` (ring full, tail drop).
    kernel_tx_dropped as KernelTxDropped: Count, "kernel tx_dropped";
    /// Change of the root qdisc's drops; none (`null`) without a qdisc that counts.
    qdisc_drops as QdiscDrops: MaybeCount, "qdisc drops";
    /// Change of the root qdisc's requeues; none (`null`) without a qdisc that counts.
    qdisc_requeues as QdiscRequeues: MaybeCount, "qdisc requeues";
    /// Packets still in the qdisc after the drain: held by a queue that stayed stopped (a
    /// reader that never woke it), as the qdisc's `qlen` reports them.
    qdisc_backlog as QdiscBacklog: MaybeCount, "qdisc backlog";
    /// Seconds spent sending.
    elapsed_secs as ElapsedSecs: Secs, "elapsed";
    /// `sent / elapsed`.
    sender_pps as SenderPps: Rate, "sender pps";
    /// `read_by_reader / elapsed`: what the "VM" got.
    delivered_pps as DeliveredPps: Rate, "delivered pps";
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_number_is_a_field_of_the_json_by_its_name() {
        let json = serde_json::to_value(LoadNumbers::default()).unwrap();
        let fields = json.as_object().unwrap();
        assert_eq!(fields.len(), LoadNumber::ALL.len());
        for id in LoadNumber::ALL {
            assert!(fields.contains_key(id.name()), "{id:?}");
        }
    }

    #[test]
    fn a_number_not_measured_is_none_and_shown_as_a_dash() {
        let numbers = LoadNumbers {
            sent: 7,
            elapsed_secs: 1.5,
            ..LoadNumbers::default()
        };
        assert_eq!(
            numbers.value(LoadNumber::Sent),
            Some(MeasuredValue::Count(7))
        );
        assert_eq!(numbers.value(LoadNumber::QdiscDrops), None);
        assert_eq!(numbers.shown(LoadNumber::QdiscDrops), "-");
        assert_eq!(numbers.shown(LoadNumber::ElapsedSecs), "1.500 s");
    }

    #[test]
    fn a_report_read_back_keeps_its_numbers_and_ignores_other_fields() {
        let numbers = LoadNumbers {
            sent: 10,
            qdisc_drops: Some(2),
            delivered_pps: 12.5,
            ..LoadNumbers::default()
        };
        let mut json = serde_json::to_value(numbers).unwrap();
        json["device"] = serde_json::json!({"name": "tp-load0"});
        let read: LoadNumbers = serde_json::from_value(json).unwrap();
        assert_eq!(read, numbers);
    }
}
