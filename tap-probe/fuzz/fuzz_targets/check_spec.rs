//! Any text given as a spec ends in scenarios or in problems: never a panic. What parses
//! keeps the spec's promises (scenarios, each named once, each with expectations over known
//! names and a bound on its traffic); what does not is reported in a bounded message, however
//! large or hostile the text.
#![no_main]

use std::collections::{BTreeMap, BTreeSet};

use libfuzzer_sys::fuzz_target;
use tap_probe_spec::baseline::SavedBaseline;
use tap_probe_spec::measured::Measured;
use tap_probe_spec::spec::Spec;

mod check;

/// What `check --save-baseline` writes after a run of the README's two scenarios.
pub fn baseline() -> SavedBaseline {
    let measured = |sent: u64, pps: f64| {
        let mut m = Measured::default();
        m.insert_count("sent", sent);
        m.insert_count("dropped_full_ring", 0);
        m.insert_real("delivered_pps", pps).expect("finite");
        m
    };
    SavedBaseline::new(
        "7.3.0-1-cloud-amd64".to_owned(),
        BTreeMap::from([
            ("stock".to_owned(), measured(50_000, 999.5)),
            (
                "fq_codel with backpressure".to_owned(),
                measured(50_000, 183_512.5),
            ),
        ]),
    )
}

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let baseline = baseline();
    for baseline in [None, Some(&baseline)] {
        match Spec::parse(text, check::KNOWN, baseline) {
            Ok(spec) => {
                assert!(!spec.scenarios.is_empty());
                let mut names = BTreeSet::new();
                for scenario in &spec.scenarios {
                    assert!(names.insert(&scenario.name), "{:?} twice", scenario.name);
                    assert!(!scenario.expect.is_empty());
                    let traffic = &scenario.traffic;
                    assert!(traffic.packets.is_some() || traffic.duration.is_some());
                    for expectation in &scenario.expect {
                        assert!(expectation.check_names(check::KNOWN).is_ok());
                    }
                }
            }
            Err(errors) => assert!(!errors.to_string().is_empty()),
        }
    }
});
