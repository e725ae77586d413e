//! A ring's size in entries, checked in one place for wherever it comes from: a trace's
//! header, `replay --ring-size`, a synthetic workload's `ring=`. Each says the same of the
//! same value, and a size outside the bounds (none, or more than any model should hold)
//! never reaches a model.

use std::fmt;
use std::str::FromStr;

/// The most entries a ring may have: a larger `ring_size` in a header makes the file
/// corrupt. The kernel's own bound is far lower (a tun ring is one kmalloc'ed array), and a
/// model sized by a larger one would exhaust memory.
pub const MAX_RING_SIZE: u32 = 1 << 24;

/// The entries of a ring: 1 to [`MAX_RING_SIZE`]. A ring of none holds nothing to model (a
/// tap with `tx_queue_len` 0 drops every frame), so it is refused as a larger one is.
#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Hash)]
pub struct RingSize(u32);

impl RingSize {
    /// `entries`, if within the bounds.
    ///
    /// # Errors
    /// When `entries` is 0 or more than [`MAX_RING_SIZE`]; the message names both bounds.
    pub fn new(entries: u64) -> Result<Self, String> {
        u32::try_from(entries)
            .ok()
            .filter(|&n| (1..=MAX_RING_SIZE).contains(&n))
            .map(Self)
            .ok_or_else(|| out_of_range(&entries.to_string()))
    }

    /// The entries.
    #[must_use]
    pub fn get(self) -> u32 {
        self.0
    }
}

/// The one message for a size outside the bounds, `shown` as given.
fn out_of_range(shown: &str) -> String {
    format!("ring size {shown} is not in 1..={MAX_RING_SIZE}")
}

impl FromStr for RingSize {
    type Err = String;

    /// A whole number of entries, as a flag or a spec gives it; a number too large for any
    /// integer type is out of range like any other, not "not a number".
    fn from_str(text: &str) -> Result<Self, String> {
        match text.parse::<u64>() {
            Ok(entries) => Self::new(entries),
            Err(_) if !text.is_empty() && text.bytes().all(|b| b.is_ascii_digit()) => {
                // Only digits: named by its length, which a message can hold whatever it is.
                Err(out_of_range(&format!("of {} digits", text.len())))
            }
            Err(_) => Err("not a whole number".to_owned()),
        }
    }
}

impl fmt::Display for RingSize {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        self.0.fmt(f)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_size_is_checked_alike() {
        assert_eq!(RingSize::new(1).unwrap().get(), 1);
        assert_eq!("256".parse::<RingSize>().unwrap().get(), 256);
        assert_eq!(
            RingSize::new(u64::from(MAX_RING_SIZE)).unwrap().get(),
            MAX_RING_SIZE
        );
        let refused = "is not in 1..=16777216";
        for (text, shown) in [
            ("0", "0"),
            ("16777217", "16777217"),
            ("4294967295", "4294967295"),
            ("1099511627776", "1099511627776"),
            ("18446744073709551616", "of 20 digits"),
        ] {
            assert_eq!(
                text.parse::<RingSize>().unwrap_err(),
                format!("ring size {shown} {refused}")
            );
        }
        assert_eq!(
            RingSize::new(1 << 40).unwrap_err(),
            format!("ring size 1099511627776 {refused}")
        );
        assert_eq!(
            RingSize::new(0).unwrap_err(),
            format!("ring size 0 {refused}")
        );
        for text in ["", "x", "-1", "1.5", "1e3", "256 "] {
            assert_eq!(
                text.parse::<RingSize>().unwrap_err(),
                "not a whole number",
                "{text:?}"
            );
        }
    }
}
