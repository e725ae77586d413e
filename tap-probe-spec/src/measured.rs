//! What a scenario measured: the values its expectations are judged on, and a baseline
//! keeps for a later run. Counts stay exact (integers in JSON), rates are finite reals.

use std::collections::BTreeMap;
use std::fmt;

use anyhow::{Result, bail};
use serde::{Deserialize, Serialize};

use crate::expr::{MAX_EXACT_INTEGER, format_value};

/// A value a scenario measured, or one an expectation computed from them: a count (kept
/// exact in JSON) or a rate.
#[derive(Clone, Copy, Debug, PartialEq, Serialize, Deserialize)]
#[serde(untagged)]
pub enum MeasuredValue {
    Count(u64),
    /// Always finite.
    Real(f64),
}

impl MeasuredValue {
    /// The value as expressions see it; counts are exact up to 2^53.
    #[expect(
        clippy::cast_precision_loss,
        reason = "packet counts stay far below 2^53, where the conversion is exact"
    )]
    #[must_use]
    pub fn as_f64(self) -> f64 {
        match self {
            Self::Count(n) => n as f64,
            Self::Real(v) => v,
        }
    }

    /// A result of an expression: a count when it is a non-negative integer that converts
    /// exactly, so that JSON shows `49000`, not `49000.0`.
    #[must_use]
    pub fn from_f64(v: f64) -> Self {
        #[expect(clippy::cast_precision_loss, reason = "2^53 is exact")]
        let max = MAX_EXACT_INTEGER as f64;
        if v.fract() == 0.0 && (0.0..=max).contains(&v) {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "a non-negative integer at most 2^53"
            )]
            let n = v as u64;
            Self::Count(n)
        } else {
            Self::Real(v)
        }
    }
}

impl fmt::Display for MeasuredValue {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Count(n) => write!(f, "{n}"),
            Self::Real(v) => f.write_str(&format_value(*v)),
        }
    }
}

/// The values one scenario's expectations are evaluated against: watch's counters summed
/// over the tap's queues, the kernel's device counters and the load report's numbers.
#[derive(Clone, Debug, Default, PartialEq, Serialize, Deserialize)]
#[serde(transparent)]
pub struct Measured(BTreeMap<String, MeasuredValue>);

impl Measured {
    /// Sets a count (a per-device value such as `kernel_tx_packets`, or a load report's).
    pub fn insert_count(&mut self, name: &str, n: u64) {
        self.0.insert(name.to_owned(), MeasuredValue::Count(n));
    }

    /// Adds to a count: one call per queue sums a counter over the queues.
    pub fn add_count(&mut self, name: &str, n: u64) {
        let entry = self
            .0
            .entry(name.to_owned())
            .or_insert(MeasuredValue::Count(0));
        *entry = match *entry {
            // Counts of one run stay far below u64's range; saturating keeps this total.
            MeasuredValue::Count(c) => MeasuredValue::Count(c.saturating_add(n)),
            MeasuredValue::Real(v) => MeasuredValue::Real(v + MeasuredValue::Count(n).as_f64()),
        };
    }

    /// Sets a rate or another fraction (`delivered_pps`, `elapsed_secs`).
    ///
    /// # Errors
    /// When the value is NaN or infinite: JSON cannot hold it and no expectation could be
    /// judged on it, so the measurement that produced it is broken.
    pub fn insert_real(&mut self, name: &str, v: f64) -> Result<()> {
        if !v.is_finite() {
            bail!("`{name}` measured as {v}, which is not a number an expectation can use");
        }
        self.0.insert(name.to_owned(), MeasuredValue::Real(v));
        Ok(())
    }

    #[must_use]
    pub fn get(&self, name: &str) -> Option<MeasuredValue> {
        self.0.get(name).copied()
    }

    pub fn iter(&self) -> impl Iterator<Item = (&str, MeasuredValue)> {
        self.0.iter().map(|(k, v)| (k.as_str(), *v))
    }

    #[must_use]
    pub fn is_empty(&self) -> bool {
        self.0.is_empty()
    }
}

#[cfg(test)]
#[expect(clippy::float_cmp, reason = "conversions of integers are exact")]
mod tests {
    use super::*;

    #[test]
    fn measured_sums_queues_and_keeps_kinds() {
        let mut m = Measured::default();
        for (queue_enqueued, queue_dropped) in [(600, 30_000), (400, 19_000)] {
            m.add_count("enqueued", queue_enqueued);
            m.add_count("dropped_full_ring", queue_dropped);
        }
        m.insert_real("delivered_pps", 4000.0).unwrap();
        assert_eq!(
            m.get("dropped_full_ring"),
            Some(MeasuredValue::Count(49_000))
        );
        assert_eq!(m.get("enqueued"), Some(MeasuredValue::Count(1000)));
        assert_eq!(m.get("delivered_pps"), Some(MeasuredValue::Real(4000.0)));
        assert_eq!(m.get("nothing"), None);
        let mut m = Measured::default();
        assert!(m.is_empty());
        m.add_count("a", u64::MAX);
        m.add_count("a", 5);
        assert_eq!(m.get("a"), Some(MeasuredValue::Count(u64::MAX)));
        m.insert_real("r", 1.5).unwrap();
        m.add_count("r", 2);
        assert_eq!(m.get("r"), Some(MeasuredValue::Real(3.5)));
        assert!(m.insert_real("bad", f64::NAN).is_err());
        assert!(m.insert_real("bad", f64::INFINITY).is_err());
        assert_eq!(m.get("bad"), None);
        let names: Vec<&str> = m.iter().map(|(k, _)| k).collect();
        assert_eq!(names, ["a", "r"]);
    }

    #[test]
    fn values_convert_exactly() {
        assert_eq!(
            MeasuredValue::from_f64(49_000.0),
            MeasuredValue::Count(49_000)
        );
        assert_eq!(MeasuredValue::from_f64(0.0), MeasuredValue::Count(0));
        assert_eq!(MeasuredValue::from_f64(-3.0), MeasuredValue::Real(-3.0));
        assert_eq!(MeasuredValue::from_f64(0.5), MeasuredValue::Real(0.5));
        assert_eq!(MeasuredValue::from_f64(1e300), MeasuredValue::Real(1e300));
        assert_eq!(MeasuredValue::Count(49_000).to_string(), "49000");
        assert_eq!(MeasuredValue::Real(0.25).to_string(), "0.25");
        assert_eq!(
            MeasuredValue::Count(1 << 53).as_f64(),
            9_007_199_254_740_992.0
        );
    }
}
