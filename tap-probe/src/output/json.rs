//! JSON for programs: one object per refresh.

use tap_probe_observer::host::report::Report;

/// One report as a JSON line; `final` marks the summary written after detaching, and
/// `counts_may_be_short` says whether the kernel skipped runs of a program (see `missed`).
///
/// # Errors
/// Never in practice (serialising plain data).
pub(crate) fn json_line(report: &Report, last: bool) -> anyhow::Result<String> {
    let mut value = serde_json::to_value(report)?;
    if let Some(obj) = value.as_object_mut() {
        obj.insert("final".to_owned(), serde_json::Value::Bool(last));
        obj.insert(
            "counts_may_be_short".to_owned(),
            serde_json::Value::Bool(report.may_be_short()),
        );
    }
    Ok(format!("{value}\n"))
}

/// As [`json_line`], with one more top-level field: `key` holding `value`.
///
/// # Errors
/// Never in practice (serialising plain data).
pub(crate) fn json_line_with(
    report: &Report,
    last: bool,
    key: &str,
    value: serde_json::Value,
) -> anyhow::Result<String> {
    let mut json: serde_json::Value = serde_json::from_str(&json_line(report, last)?)?;
    if let Some(obj) = json.as_object_mut() {
        obj.insert(key.to_owned(), value);
    }
    Ok(format!("{json}\n"))
}

#[cfg(test)]
mod tests {
    use tap_probe_observer::bpf::probe::RingOccupancy;
    use tap_probe_observer::host::discovery::DeviceKind;

    use crate::output::lines::tests::full_row;

    /// A row's JSON as it has been (`serde_json` sorts the keys), byte for byte.
    #[test]
    fn row_json_is_unchanged() {
        const GOLDEN: &str = r#"{"backpressure":true,"busy":1,"consumed":6,"drop_reasons":{"xmit_error":3},"dropped_full_ring":2,"dropped_other":0,"enqueued":7,"flows_joined":0,"from_birth":false,"ifindex":7,"ifname":"tap0","kernel":{"skew":0,"tx_dropped":2,"tx_dropped_at_start":0,"tx_packets":6,"tx_packets_at_start":0},"kind":"tap","netns":"ns","owner":{"comm":"qemu","pid":42},"queue":1,"queue_stops":1,"queue_wakes":1,"reader_sleeps":4,"reordered":5,"requeued_stopped":2,"retired":false,"ring_occupancy":{"current":3,"histogram":[0,1,2,0,1,0,0,0,0,0,0,0,0,0,0,0,0,0],"max":8,"samples":4},"stopped":true,"stopped_ns":1500000000,"stuck":true,"wakes_forced":0,"wakes_other":0,"wakes_reader":1,"wakes_recheck":3,"wakes_vhost":0,"wakeups_per_packet":0.6666666666666666,"xmit_calls":10}"#;
        let row = full_row();
        let json = serde_json::to_value(&row).unwrap().to_string();
        assert_eq!(json, GOLDEN);
        let mut before = row.clone();
        before.counters.consumed = 0;
        assert_eq!(
            serde_json::to_value(&before).unwrap()["wakeups_per_packet"],
            serde_json::Value::Null
        );
        // What is not known here is null, not a zero that looks measured: wakes by source
        // without the wake kprobe; the flag and the ring of a device that is no tun/tap.
        let mut veth = row.clone();
        veth.kind = DeviceKind::Veth;
        veth.wake_sources = false;
        veth.occupancy = None;
        veth.backpressure = None;
        let json = serde_json::to_value(&veth).unwrap();
        for field in [
            "wakes_reader",
            "wakes_vhost",
            "wakes_forced",
            "wakes_other",
            "wakes_recheck",
            "ring_occupancy",
            "backpressure",
        ] {
            assert_eq!(json[field], serde_json::Value::Null, "{field}");
        }
        assert_eq!(json["requeued_stopped"], 2, "known on every backend");
        // Reader takes on a kernel with neither their tracepoint's location nor kprobes:
        // those alone are unknown.
        let mut untaken = row.clone();
        untaken.reader_takes = false;
        let json = serde_json::to_value(&untaken).unwrap();
        for field in ["consumed", "reader_sleeps", "wakeups_per_packet"] {
            assert_eq!(json[field], serde_json::Value::Null, "{field}");
        }
        assert_eq!(json["dropped_full_ring"], 2, "every other value counted");
        let text = crate::output::prometheus::exposition(
            &crate::output::lines::tests::report(1.0, vec![untaken]),
            crate::output::prometheus::Series::default(),
        );
        assert!(!text.contains("\ntap_probe_consumed_total{"), "{text}");
        assert!(
            text.contains("\ntap_probe_dropped_full_ring_total{"),
            "{text}"
        );
        // Before the first sample a ring's level is unknown, its histogram empty.
        let mut fresh = row.clone();
        fresh.occupancy = Some(RingOccupancy::default());
        let json = serde_json::to_value(&fresh).unwrap();
        assert_eq!(json["ring_occupancy"]["current"], serde_json::Value::Null);
        assert_eq!(json["ring_occupancy"]["max"], serde_json::Value::Null);
        assert_eq!(json["ring_occupancy"]["samples"], 0);
    }
}
