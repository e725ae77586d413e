//! How every view writes a figure for people: SI prefixes (`k`, `M`, `G`, ...), four
//! significant digits once a prefix is needed, and a space before a unit but not before a
//! bare prefix. The watch table, the full-screen view, the progress line, `doctor`, `serve`'s
//! log and the benchmark table all write their figures here, so one figure reads the same
//! wherever it is shown:
//!
//! ```text
//! count(12_345_678)         12.35M      (a table cell: never more than 6 characters)
//! bytes(34_500_000)         34.50 MB
//! quantity(1.151e6, "pps")  1.151 Mpps
//! ```

use alloc::format;
use alloc::string::{String, ToString};

/// The SI prefixes, each a thousand times the one before: none, then kilo to exa (`u64::MAX`
/// is 18.45 E).
const PREFIXES: [&str; 7] = ["", "k", "M", "G", "T", "P", "E"];

/// How many thousands `v` is written in: the most whose scaled value is at least 1.
fn thousands(v: f64) -> usize {
    let mut n = 0;
    let mut factor = 1e3;
    while n + 1 < PREFIXES.len() && v.abs() >= factor {
        n += 1;
        factor *= 1e3;
    }
    n
}

/// `1e3` to the power `n`.
fn factor(n: usize) -> f64 {
    (0..n).fold(1.0, |f, _| f * 1e3)
}

/// The factor and prefix to write `v` with: the largest whose scaled value is at least 1,
/// none below a thousand.
#[must_use]
pub fn prefix(v: f64) -> (f64, &'static str) {
    let n = thousands(v);
    (factor(n), PREFIXES[n])
}

/// Decimals for four significant digits of a value scaled by [`prefix`] (1 to 999.9); none
/// without a prefix, where the value is a whole number (packets, bytes, packets a second).
#[must_use]
pub fn decimals(scaled: f64, prefix: &str) -> usize {
    if prefix.is_empty() {
        return 0;
    }
    match scaled.abs() {
        v if v >= 100.0 => 1,
        v if v >= 10.0 => 2,
        _ => 3,
    }
}

/// `v` scaled to four significant digits: the scaled value, its decimals and prefix. A
/// value that rounds up to the next digit (9.9996k, 999.96k) is written with one decimal
/// less, or with the next prefix.
fn significant(v: f64) -> (f64, usize, &'static str) {
    let mut k = thousands(v);
    let rounded = |scaled: f64, d: usize| {
        let p = (0..d).fold(1.0, |p, _| p * 10.0);
        (scaled * p).round() / p
    };
    let d = decimals(v / factor(k), PREFIXES[k]);
    if k > 0 && rounded(v / factor(k), d).abs() >= 1000.0 && k + 1 < PREFIXES.len() {
        k += 1;
    }
    let scaled = v / factor(k);
    let d = decimals(scaled, PREFIXES[k]);
    let d = decimals(rounded(scaled, d), PREFIXES[k]);
    (scaled, d, PREFIXES[k])
}

/// A figure with its unit: `950 B`, `34.50 MB`, `1.151 Mpps`; with none, `18.03 M`, `950`.
#[must_use]
pub fn quantity(v: f64, unit: &str) -> String {
    let (scaled, d, prefix) = significant(v);
    let text = format!("{scaled:.d$} {prefix}{unit}");
    String::from(text.trim_end())
}

/// A size in bytes: `950 B`, `34.50 MB`.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    reason = "shown to four significant digits"
)]
pub fn bytes(n: u64) -> String {
    quantity(n as f64, "B")
}

/// A count where a column is narrow: exact below 100,000 (`99999`), then four significant
/// digits and a prefix (`123.5k`, `4.560G`); never more than 6 characters.
#[must_use]
#[expect(
    clippy::cast_precision_loss,
    reason = "shown to four significant digits"
)]
pub fn count(n: u64) -> String {
    if n < 100_000 {
        return n.to_string();
    }
    let (scaled, d, prefix) = significant(n as f64);
    format!("{scaled:.d$}{prefix}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn counts_stay_within_six_characters() {
        assert_eq!(count(0), "0");
        assert_eq!(count(99_999), "99999");
        assert_eq!(count(123_456), "123.5k");
        assert_eq!(count(999_949), "999.9k");
        assert_eq!(count(999_999), "1.000M");
        assert_eq!(count(4_560_000_000), "4.560G");
        assert_eq!(count(u64::MAX), "18.45E");
        assert_eq!(count(9_999_999), "10.00M");
        for n in [100_000, 999_950, 9_999_999, 99_999_999_999, u64::MAX / 3] {
            assert!(count(n).len() <= 6, "{n}: {}", count(n));
        }
    }

    #[test]
    fn quantities_have_their_unit() {
        assert_eq!(quantity(0.0, "pps"), "0 pps");
        assert_eq!(quantity(950.0, "B"), "950 B");
        assert_eq!(quantity(34.5e6, "B"), "34.50 MB");
        assert_eq!(quantity(1.151e6, "pps"), "1.151 Mpps");
        assert_eq!(quantity(196e3, "pps"), "196.0 kpps");
        assert_eq!(quantity(18.03e6, ""), "18.03 M");
        assert_eq!(quantity(999.96e3, "B"), "1.000 MB");
        assert_eq!(bytes(999), "999 B");
    }
}
