//! The one syntax of durations, on the command line and in specs: `10` (seconds), `10s`,
//! `500ms`, `2m`, `1h` (and `us`, `ns`, which the replay model's times need), with an
//! optional decimal fraction (`1.5s`, `0.5`). No exponent, sign or space inside: what is
//! written is what is meant, exactly, to the nanosecond.

use alloc::borrow::ToOwned as _;
use alloc::format;
use alloc::string::String;
use core::ops::RangeInclusive;
use core::time::Duration;

use crate::echo::{MAX_CHARS, quoted};

/// The units a duration may carry, and their length; none means seconds.
const UNITS: [(&str, u128); 6] = [
    ("ns", 1),
    ("us", 1_000),
    ("ms", 1_000_000),
    ("s", 1_000_000_000),
    ("m", 60_000_000_000),
    ("h", 3_600_000_000_000),
];

/// Parses a duration (see the module's documentation). Surrounding spaces are ignored.
///
/// # Errors
/// Anything else, with what to write instead.
pub fn parse(text: &str) -> Result<Duration, String> {
    let shown = quoted(text, MAX_CHARS);
    let bad = || {
        format!(
            "{shown} is not a duration: write seconds, or a number and a unit, e.g. \"10\", \
             \"10s\", \"500ms\", \"2m\" (units ns, us, ms, s, m, h)"
        )
    };
    let trimmed = text.trim();
    let split = trimmed
        .find(|c: char| !c.is_ascii_digit() && c != '.')
        .unwrap_or(trimmed.len());
    let (number, unit) = trimmed.split_at(split);
    let unit_ns = if unit.is_empty() {
        1_000_000_000
    } else {
        UNITS
            .iter()
            .find(|(name, _)| *name == unit)
            .map(|&(_, ns)| ns)
            .ok_or_else(bad)?
    };
    let (whole, fraction) = number.split_once('.').unwrap_or((number, ""));
    // Twelve digits of hours is far beyond any bound a caller sets, and still fits a u128
    // in nanoseconds; nine digits of fraction is a nanosecond of seconds.
    if whole.is_empty()
        || (number.contains('.') && fraction.is_empty())
        || fraction.contains('.')
        || whole.len() > 12
        || fraction.len() > 9
    {
        return Err(bad());
    }
    let whole: u128 = whole.parse().map_err(|_| bad())?;
    let fraction_digits = u32::try_from(fraction.len()).map_err(|_| bad())?;
    let fraction: u128 = if fraction.is_empty() {
        0
    } else {
        fraction.parse().map_err(|_| bad())?
    };
    let scale = 10u128.pow(fraction_digits);
    if !(fraction * unit_ns).is_multiple_of(scale) {
        return Err(format!("{shown} is finer than a nanosecond"));
    }
    let ns = whole * unit_ns + fraction * unit_ns / scale;
    u64::try_from(ns)
        .map(Duration::from_nanos)
        .map_err(|_| format!("{shown} is longer than any duration a setting takes"))
}

/// Parses a duration and requires it within `range`.
///
/// # Errors
/// Not a duration, or outside `range` (saying which bound, in the units of the text).
pub fn within(text: &str, range: &RangeInclusive<Duration>) -> Result<Duration, String> {
    let duration = parse(text)?;
    let shown = quoted(text, MAX_CHARS);
    if duration < *range.start() {
        return Err(if duration.is_zero() {
            format!("{shown}: give a duration above 0")
        } else {
            format!("{shown} is shorter than {}", show(*range.start()))
        });
    }
    if duration > *range.end() {
        return Err(format!("{shown} is longer than {}", show(*range.end())));
    }
    Ok(duration)
}

/// A bound as people write it: `10ms`, `1.5s`, `2m`, `1h`, `8760h`.
#[must_use]
pub fn show(duration: Duration) -> String {
    let ns = duration.as_nanos();
    // Every length is a whole number of nanoseconds: only zero finds no unit.
    match UNITS
        .iter()
        .rev()
        .find(|&&(_, unit)| ns >= unit && ns.is_multiple_of(unit))
    {
        Some((name, unit)) => format!("{}{name}", ns / unit),
        None => "0s".to_owned(),
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn every_form_parses() {
        for (text, ms) in [
            ("10", 10_000),
            ("2.5", 2_500),
            (" 1 ", 1_000),
            ("0", 0),
            ("10s", 10_000),
            ("1.5s", 1_500),
            ("500ms", 500),
            ("0.5ms", 0),
            ("2m", 120_000),
            ("1.25m", 75_000),
            ("1h", 3_600_000),
            ("2000us", 2),
        ] {
            assert_eq!(parse(text).map(|d| d.as_millis()), Ok(ms), "{text}");
        }
        assert_eq!(parse("0.5ms"), Ok(Duration::from_micros(500)));
        assert_eq!(parse("0.000000001"), Ok(Duration::from_nanos(1)));
        assert_eq!(parse("2500ns"), Ok(Duration::from_nanos(2500)));
        assert_eq!(parse("1.5us"), Ok(Duration::from_nanos(1500)));
    }

    #[test]
    fn bad_input_says_what_to_write() {
        for text in [
            "",
            "s",
            "abc",
            "10 s",
            "10sec",
            "10S",
            "1.s",
            ".5s",
            "1.2.3s",
            "-1",
            "-1s",
            "+1",
            "1e9",
            "nan",
            "inf",
            "0.0000000001",
            "9999999999999h",
        ] {
            let err = parse(text).unwrap_err();
            assert!(
                err.contains("is not a duration") && err.contains("\"500ms\""),
                "{text}: {err}"
            );
        }
        let err = parse("0.5ns").unwrap_err();
        assert!(err.contains("finer than a nanosecond"), "{err}");
        let err = parse("999999999999h").unwrap_err();
        assert!(err.contains("longer than any duration"), "{err}");
        // What was given is quoted, and cut when it is long.
        let err = parse(&"1".repeat(1_000_000)).unwrap_err();
        assert!(
            err.contains("… (1000000 characters) is not a duration"),
            "{err}"
        );
        assert!(err.len() < 400, "{err}");
    }

    #[test]
    fn bounds_are_said_in_units() {
        let range = Duration::from_millis(10)..=Duration::from_hours(1);
        assert_eq!(within("10ms", &range), Ok(Duration::from_millis(10)));
        assert_eq!(within("1h", &range), Ok(Duration::from_hours(1)));
        let err = within("5ms", &range).unwrap_err();
        assert!(err.contains("shorter than 10ms"), "{err}");
        let err = within("61m", &range).unwrap_err();
        assert!(err.contains("longer than 1h"), "{err}");
        let err = within("0", &(Duration::from_nanos(1)..=Duration::from_secs(1))).unwrap_err();
        assert!(err.contains("give a duration above 0"), "{err}");
        assert_eq!(
            within("0", &(Duration::ZERO..=Duration::ZERO)),
            Ok(Duration::ZERO)
        );
        assert_eq!(show(Duration::from_millis(1500)), "1500ms");
        assert_eq!(show(Duration::from_nanos(1)), "1ns");
        assert_eq!(show(Duration::ZERO), "0s");
    }
}
