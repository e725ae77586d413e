//! What the driver does when the ring fills, and when the reader wakes the queue.
//!
//! `tail-drop` is the stock kernel: `tun_net_xmit` drops when `ptr_ring_produce` fails and
//! never stops its queue. The others follow the "avoid `ptr_ring` tail-drop" series with a
//! qdisc present: after a produce, if `__ptr_ring_produce_peek` says full the queue is
//! stopped (then re-checked); a failed produce returns `NETDEV_TX_BUSY`. On every consume
//! `__tun_wake_queue` wakes the queue when the ring is empty, or when it is stopped and
//! `++cons_cnt` reached the threshold, and resets `cons_cnt`. The series uses
//! `tx_ring.size / 2`; `stop-wake:F` generalises that to `max(1, floor(F * size))`,
//! `wake-every` is a threshold of 1 and `wake-empty` never wakes by count.

use std::fmt;
use std::str::FromStr;

#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Policy {
    TailDrop,
    /// Wake once this fraction of the ring was consumed since the stop (0 < F <= 1).
    StopWake(f64),
    WakeEvery,
    WakeEmpty,
}

impl Policy {
    /// The four policies the series compares, with its F = 1/2.
    pub const DEFAULTS: [Self; 4] = [
        Self::TailDrop,
        Self::StopWake(0.5),
        Self::WakeEvery,
        Self::WakeEmpty,
    ];

    /// Whether the queue stops (a qdisc holds packets) rather than the driver dropping.
    #[must_use]
    pub fn stops(self) -> bool {
        !matches!(self, Self::TailDrop)
    }

    /// Consumes since the stop after which the reader wakes the queue (`u32::MAX`: never
    /// by count, only when the ring is empty).
    #[must_use]
    pub(crate) fn wake_threshold(self, size: u32) -> u32 {
        match self {
            Self::TailDrop | Self::WakeEmpty => u32::MAX,
            Self::WakeEvery => 1,
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "F is in (0, 1], so F * size is in [0, size]"
            )]
            Self::StopWake(f) => ((f * f64::from(size)).floor() as u32).max(1),
        }
    }
}

impl fmt::Display for Policy {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::TailDrop => f.write_str("tail-drop"),
            Self::StopWake(x) => write!(f, "stop-wake:{x}"),
            Self::WakeEvery => f.write_str("wake-every"),
            Self::WakeEmpty => f.write_str("wake-empty"),
        }
    }
}

impl FromStr for Policy {
    type Err = String;

    fn from_str(s: &str) -> Result<Self, String> {
        match s {
            "tail-drop" => Ok(Self::TailDrop),
            "wake-every" => Ok(Self::WakeEvery),
            "wake-empty" => Ok(Self::WakeEmpty),
            "stop-wake" => Ok(Self::StopWake(0.5)),
            _ => {
                let Some(frac) = s.strip_prefix("stop-wake:") else {
                    return Err(format!(
                        "unknown policy {s:?}: expected tail-drop, stop-wake:F, wake-every or \
                         wake-empty"
                    ));
                };
                let f = parse_fraction(frac).ok_or_else(|| {
                    format!("stop-wake:{frac}: F must be a number like 0.5 or 1/2")
                })?;
                if f > 0.0 && f <= 1.0 {
                    Ok(Self::StopWake(f))
                } else {
                    Err(format!(
                        "stop-wake:{frac}: F must be in (0, 1] (a share of the ring)"
                    ))
                }
            }
        }
    }
}

fn parse_fraction(s: &str) -> Option<f64> {
    if let Some((n, d)) = s.split_once('/') {
        let n: f64 = n.trim().parse().ok()?;
        let d: f64 = d.trim().parse().ok()?;
        (d != 0.0).then(|| n / d).filter(|v| v.is_finite())
    } else {
        s.trim().parse::<f64>().ok().filter(|v| v.is_finite())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_and_prints() {
        for p in Policy::DEFAULTS {
            assert_eq!(p.to_string().parse::<Policy>().unwrap(), p);
        }
        assert_eq!(
            "stop-wake:3/4".parse::<Policy>().unwrap(),
            Policy::StopWake(0.75)
        );
        assert!("stop-wake:0".parse::<Policy>().is_err());
        assert!("stop-wake:1.5".parse::<Policy>().is_err());
        assert!("stop-wake:x".parse::<Policy>().is_err());
        assert!("stop-wake:1/0".parse::<Policy>().is_err());
        assert!("drop".parse::<Policy>().is_err());
    }

    #[test]
    fn thresholds_match_the_series() {
        // `++cons_cnt < size / 2` returns early: the wake comes at size / 2.
        assert_eq!(Policy::StopWake(0.5).wake_threshold(500), 250);
        assert_eq!(Policy::StopWake(0.5).wake_threshold(255), 127);
        assert_eq!(Policy::StopWake(0.5).wake_threshold(1), 1);
        assert_eq!(Policy::WakeEvery.wake_threshold(500), 1);
        assert_eq!(Policy::WakeEmpty.wake_threshold(500), u32::MAX);
    }
}
