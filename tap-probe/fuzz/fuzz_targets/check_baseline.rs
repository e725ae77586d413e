//! Any text given as a baseline file is a baseline or is refused saying what to do: never a
//! panic. A baseline reads back from its own text unchanged (counts exactly), and a spec
//! whose expectations ask it for values gets them or a bounded message naming what it lacks.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tap_probe_spec::baseline::SavedBaseline;
use tap_probe_spec::spec::Spec;

mod check;

/// The README's scenarios, compared with the baseline.
const SPEC: &str = r#"
[[scenario]]
name = "stock"
qdisc = "pfifo-fast"
packets = 50000
expect = ["sent == baseline.sent", "dropped_full_ring <= baseline.dropped_full_ring"]

[[scenario]]
name = "fq_codel with backpressure"
qdisc = "fq-codel"
backpressure = true
packets = 50000
expect = ["delivered_pps >= 0.95 * baseline.delivered_pps"]
"#;

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let baseline = match SavedBaseline::parse(text, "fuzz.json") {
        Ok(baseline) => baseline,
        Err(err) => {
            assert!(!format!("{err:#}").is_empty());
            return;
        }
    };
    let again = SavedBaseline::parse(&baseline.to_json(), "fuzz.json")
        .expect("a baseline reads back from its own text");
    assert_eq!(again, baseline);
    if let Err(errors) = Spec::parse(SPEC, check::KNOWN, Some(&baseline)) {
        assert!(!errors.to_string().is_empty());
    }
});
