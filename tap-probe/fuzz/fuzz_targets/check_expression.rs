//! Any text given as an expectation parses or is refused with its column: never a panic, never
//! a stack overflow however deep. What parses evaluates, over values from zero to the ends of
//! f64, to a finite comparison or an error that says why (division by zero, overflow); a name
//! without a value is an error, never a pass.
#![no_main]

use libfuzzer_sys::fuzz_target;
use tap_probe_spec::expr::{Expectation, Name};

mod check;

/// Values every name takes in turn: zero (divisions), the exact integers' end, the ends of
/// f64 (overflow), a fraction.
const VALUES: [f64; 6] = [
    0.0,
    1.0,
    -0.5,
    9_007_199_254_740_992.0,
    f64::MAX,
    f64::MIN_POSITIVE,
];

fuzz_target!(|data: &[u8]| {
    let Ok(text) = std::str::from_utf8(data) else {
        return;
    };
    let expectation = match Expectation::parse(text) {
        Ok(expectation) => expectation,
        Err(err) => {
            assert!(!err.to_string().is_empty());
            return;
        }
    };
    if let Err(unknown) = expectation.check_names(check::KNOWN) {
        assert!(!unknown.to_string().is_empty());
    }
    for value in VALUES {
        let lookup = |_: &Name| Some(value);
        match expectation.evaluate(&lookup) {
            Ok(outcome) => {
                assert!(outcome.left.is_finite() && outcome.right.is_finite());
                let _ = expectation.failure_message(&outcome);
            }
            Err(err) => assert!(!err.to_string().is_empty()),
        }
    }
    let unmeasured = |_: &Name| None;
    assert!(expectation.names().is_empty() || expectation.evaluate(&unmeasured).is_err());
});
