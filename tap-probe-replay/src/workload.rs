//! Synthetic workloads for `tap-probe replay --synthetic SPEC`, so the harness works
//! without a recording.
//!
//! ```text
//! spec     = item *( "," item )
//! item     = "producer=" process     (required)
//!          | "consumer=" process     (required)
//!          | "duration=" time        (default 1s)
//!          | "ring=" count           (default 500, tun's tx_queue_len)
//!          | "batch=" count          (entries per read, default 1; 64 is vhost-net-like)
//!          | "seed=" count           (default 1)
//! process  = "const:" rate                       evenly spaced
//!          | "poisson:" rate                     exponential gaps
//!          | "burst:" count ":" rate             bursts of `count` back to back, `rate` on average
//!          | "pause:" rate ":" time ":" time     `rate` for the first time, then idle for the second
//! rate     = number [ "k" | "M" ]                per second, e.g. 200k, 1.5M
//! time     = a duration as everywhere else (`tap_probe_common::duration`): 2s, 500ms, 2m, or a bare
//!            number of seconds, and here also us and ns; from 1 ns to a day
//! ```
//!
//! Example: `producer=const:200k,consumer=poisson:150k,duration=2s,ring=256`.

use std::fmt;
use std::time::Duration;

use tap_probe_common::echo::{MAX_CHARS, quoted};
use tap_probe_trace::RingSize;

use super::{ARRIVAL, Ops};

/// What a message quotes of the spec, cut when it is long.
fn q(text: &str) -> String {
    quoted(text, MAX_CHARS)
}

/// At most this many operations are generated (about 1.2 GB of trace in memory).
pub(crate) const MAX_OPS: f64 = 100e6;

/// A producer or reader process.
#[derive(Debug, Clone, Copy, PartialEq)]
pub enum Process {
    Const { rate: f64 },
    Poisson { rate: f64 },
    Burst { size: u32, rate: f64 },
    Pause { rate: f64, on_ns: u64, off_ns: u64 },
}

impl Process {
    /// How many events [`Self::times`] generates in `duration_ns`: exactly for the evenly
    /// spaced processes, the expectation for `poisson`. A burst puts `size` events at once
    /// and a pause window begins with an event however short it is, so neither is its mean
    /// rate times the duration: `burst:1000:1` sends a thousand events in its first
    /// second, `pause:1:1ns:1ns` one every 2 ns.
    #[must_use]
    pub fn events(self, duration_ns: u64) -> f64 {
        #[expect(clippy::cast_precision_loss, reason = "an estimate, in f64 ns")]
        let end = duration_ns as f64;
        // Events at k * gap for every k with k * gap < span.
        let spaced = |span: f64, gap: f64| (span / gap).ceil();
        match self {
            Self::Const { rate } => spaced(end, 1e9 / rate),
            Self::Poisson { rate } => rate * end / 1e9,
            Self::Burst { size, rate } => {
                spaced(end, f64::from(size) * 1e9 / rate) * f64::from(size)
            }
            #[expect(clippy::cast_precision_loss, reason = "ns below a day")]
            Self::Pause {
                rate,
                on_ns,
                off_ns,
            } => {
                let windows = spaced(end, (on_ns + off_ns) as f64);
                let per_window = spaced((on_ns as f64).min(end), 1e9 / rate);
                windows * per_window
            }
        }
    }

    /// Event times in `[0, duration_ns)`, ascending.
    fn times(self, duration_ns: u64, rng: &mut Rng) -> Vec<u64> {
        #[expect(clippy::cast_precision_loss, reason = "time arithmetic in f64 ns")]
        let end = duration_ns as f64;
        #[expect(
            clippy::cast_possible_truncation,
            clippy::cast_sign_loss,
            reason = "bounded by MAX_OPS"
        )]
        let mut out = Vec::with_capacity((self.events(duration_ns) * 1.1) as usize + 16);
        let ns = |t: f64| -> u64 {
            #[expect(
                clippy::cast_possible_truncation,
                clippy::cast_sign_loss,
                reason = "0 <= t < duration"
            )]
            let v = t as u64;
            v
        };
        match self {
            Self::Const { rate } => {
                let gap = 1e9 / rate;
                let mut k = 0u64;
                loop {
                    #[expect(clippy::cast_precision_loss, reason = "k < 1e8")]
                    let t = k as f64 * gap;
                    if t >= end {
                        break;
                    }
                    out.push(ns(t));
                    k += 1;
                }
            }
            Self::Poisson { rate } => {
                let mean = 1e9 / rate;
                let mut t = rng.exp() * mean;
                while t < end {
                    out.push(ns(t));
                    t += rng.exp() * mean;
                }
            }
            Self::Burst { size, rate } => {
                let gap = f64::from(size) * 1e9 / rate;
                let mut k = 0u64;
                'bursts: loop {
                    #[expect(clippy::cast_precision_loss, reason = "k < 1e8")]
                    let t = k as f64 * gap;
                    for _ in 0..size {
                        if t >= end {
                            break 'bursts;
                        }
                        out.push(ns(t));
                    }
                    k += 1;
                }
            }
            Self::Pause {
                rate,
                on_ns,
                off_ns,
            } => {
                let gap = 1e9 / rate;
                #[expect(clippy::cast_precision_loss, reason = "ns below a day")]
                let (on, period) = (on_ns as f64, (on_ns + off_ns) as f64);
                let mut start = 0.0;
                while start < end {
                    let mut k = 0u64;
                    loop {
                        #[expect(clippy::cast_precision_loss, reason = "k < 1e8")]
                        let dt = k as f64 * gap;
                        let t = start + dt;
                        if dt >= on || t >= end {
                            break;
                        }
                        out.push(ns(t));
                        k += 1;
                    }
                    start += period;
                }
            }
        }
        out
    }
}

impl fmt::Display for Process {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        match self {
            Self::Const { rate } => write!(f, "const:{rate}"),
            Self::Poisson { rate } => write!(f, "poisson:{rate}"),
            Self::Burst { size, rate } => write!(f, "burst:{size}:{rate}"),
            Self::Pause {
                rate,
                on_ns,
                off_ns,
            } => write!(f, "pause:{rate}:{on_ns}ns:{off_ns}ns"),
        }
    }
}

/// A parsed `--synthetic` spec.
#[derive(Debug, Clone, PartialEq)]
pub struct Workload {
    pub producer: Process,
    pub consumer: Process,
    pub(crate) duration_ns: u64,
    pub ring: u32,
    pub batch: u32,
    pub seed: u64,
}

impl Workload {
    /// Parses and checks a spec.
    ///
    /// # Errors
    /// An unknown or repeated key, a missing producer or consumer, a malformed number, or a
    /// workload that cannot exist (rates of zero or above one per nanosecond, an empty
    /// duration, a zero-sized ring, more than [`MAX_OPS`] operations). The message names
    /// the item at fault.
    pub fn parse(spec: &str) -> Result<Self, String> {
        let mut producer = None;
        let mut consumer = None;
        let mut duration_ns = None;
        let mut ring = None;
        let mut batch = None;
        let mut seed = None;
        for item in spec.split(',').map(str::trim) {
            if item.is_empty() {
                return Err(format!("empty item in {}", q(spec)));
            }
            let (key, value) = item
                .split_once('=')
                .ok_or_else(|| format!("{}: expected KEY=VALUE", q(item)))?;
            let ctx = |e: String| format!("{}: {e}", q(item));
            let twice = || format!("{key} given twice in {}", q(spec));
            match key {
                "producer" => set(&mut producer, parse_process(value).map_err(ctx)?, twice)?,
                "consumer" => set(&mut consumer, parse_process(value).map_err(ctx)?, twice)?,
                "duration" => set(&mut duration_ns, parse_time(value).map_err(ctx)?, twice)?,
                "ring" => set(&mut ring, value.parse::<RingSize>().map_err(ctx)?, twice)?,
                "batch" => set(&mut batch, parse_count(value, 4096).map_err(ctx)?, twice)?,
                "seed" => set(
                    &mut seed,
                    value
                        .parse::<u64>()
                        .map_err(|_| ctx("not an unsigned integer".into()))?,
                    twice,
                )?,
                _ => {
                    return Err(format!(
                        "{}: unknown key {} (expected producer, consumer, duration, \
                         ring, batch or seed)",
                        q(item),
                        q(key)
                    ));
                }
            }
        }
        let w = Self {
            producer: producer.ok_or("the spec needs producer=PROCESS")?,
            consumer: consumer.ok_or("the spec needs consumer=PROCESS")?,
            duration_ns: duration_ns.unwrap_or(1_000_000_000),
            ring: ring.map_or(500, RingSize::get),
            batch: batch.unwrap_or(1),
            seed: seed.unwrap_or(1),
        };
        let total = w.producer.events(w.duration_ns) + w.consumer.events(w.duration_ns);
        if total > MAX_OPS {
            return Err(format!(
                "this workload would generate about {total:.3e} operations; at most {MAX_OPS:.0e} \
                 fit in memory: shorten the duration or lower the rates"
            ));
        }
        Ok(w)
    }

    /// The operations, arrivals before reads at equal times.
    #[must_use]
    pub fn generate(&self) -> Ops {
        let mut rng = Rng(self.seed.wrapping_mul(0x9e37_79b9_7f4a_7c15) | 1);
        let arrivals = self.producer.times(self.duration_ns, &mut rng);
        let reads = self.consumer.times(self.duration_ns, &mut rng);
        let mut ops = Ops {
            times: Vec::with_capacity(arrivals.len() + reads.len()),
            ops: Vec::with_capacity(arrivals.len() + reads.len()),
        };
        let (mut i, mut j) = (0, 0);
        while i < arrivals.len() || j < reads.len() {
            if j >= reads.len() || (i < arrivals.len() && arrivals[i] <= reads[j]) {
                ops.push(arrivals[i], ARRIVAL);
                i += 1;
            } else {
                ops.push(reads[j], self.batch);
                j += 1;
            }
        }
        ops
    }
}

fn set<T>(slot: &mut Option<T>, v: T, twice: impl Fn() -> String) -> Result<(), String> {
    if slot.is_some() {
        return Err(twice());
    }
    *slot = Some(v);
    Ok(())
}

fn parse_process(s: &str) -> Result<Process, String> {
    let parts: Vec<&str> = s.split(':').collect();
    let p = match parts.as_slice() {
        ["const", r] => Process::Const {
            rate: parse_rate(r)?,
        },
        ["poisson", r] => Process::Poisson {
            rate: parse_rate(r)?,
        },
        ["burst", n, r] => Process::Burst {
            size: parse_count(n, 1 << 20)?,
            rate: parse_rate(r)?,
        },
        ["pause", r, on, off] => {
            let on_ns = parse_time(on)?;
            let off_ns = parse_time(off)?;
            Process::Pause {
                rate: parse_rate(r)?,
                on_ns,
                off_ns,
            }
        }
        _ => {
            return Err(format!(
                "unknown process {}: expected const:RATE, poisson:RATE, burst:N:RATE or \
                 pause:RATE:ON:OFF",
                q(s)
            ));
        }
    };
    Ok(p)
}

/// Per second, with optional k/M/G suffix; in (0, 1e9].
fn parse_rate(s: &str) -> Result<f64, String> {
    let (num, mult) = match s.as_bytes().last() {
        Some(b'k' | b'K') => (&s[..s.len() - 1], 1e3),
        Some(b'M') => (&s[..s.len() - 1], 1e6),
        Some(b'G') => (&s[..s.len() - 1], 1e9),
        _ => (s, 1.0),
    };
    let v: f64 = num
        .parse()
        .map_err(|_| format!("rate {} is not a number (per second, e.g. 200k)", q(s)))?;
    let v = v * mult;
    if !v.is_finite() || v <= 0.0 {
        return Err(format!("rate {} must be above 0 per second", q(s)));
    }
    if v > 1e9 {
        return Err(format!(
            "rate {} is more than one event per nanosecond, the resolution of the model",
            q(s)
        ));
    }
    Ok(v)
}

/// A duration in ns, in (0, 1 day].
fn parse_time(s: &str) -> Result<u64, String> {
    let time = tap_probe_common::duration::parse(s).map_err(|e| format!("time {e}"))?;
    if time < Duration::from_nanos(1) {
        return Err(format!("time {} must be at least 1 ns", q(s)));
    }
    if time > Duration::from_hours(24) {
        return Err(format!("time {} is longer than a day", q(s)));
    }
    u64::try_from(time.as_nanos()).map_err(|_| format!("time {} is longer than a day", q(s)))
}

fn parse_count(s: &str, max: u32) -> Result<u32, String> {
    let v: u32 = s
        .parse()
        .map_err(|_| format!("{} is not a whole number", q(s)))?;
    if v == 0 || v > max {
        return Err(format!("{v} is outside 1..={max}"));
    }
    Ok(v)
}

/// xorshift64*: reproducible, fast, good enough for arrival gaps.
struct Rng(u64);

impl Rng {
    fn next(&mut self) -> u64 {
        self.0 ^= self.0 >> 12;
        self.0 ^= self.0 << 25;
        self.0 ^= self.0 >> 27;
        self.0.wrapping_mul(0x2545_f491_4f6c_dd1d)
    }

    /// Exp(1).
    fn exp(&mut self) -> f64 {
        // 53 random bits in (0, 1].
        #[expect(clippy::cast_precision_loss, reason = "53 bits fit an f64 exactly")]
        let u = ((self.next() >> 11) + 1) as f64 / (1u64 << 53) as f64;
        -u.ln()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn parses_the_documented_example() {
        let w = Workload::parse("producer=const:200k,consumer=poisson:150k,duration=2s,ring=256")
            .unwrap();
        assert_eq!(w.producer, Process::Const { rate: 200e3 });
        assert_eq!(w.consumer, Process::Poisson { rate: 150e3 });
        assert_eq!(w.duration_ns, 2_000_000_000);
        assert_eq!(w.ring, 256);
        assert_eq!(w.batch, 1);
        let w = Workload::parse(
            "producer=burst:32:1M,consumer=pause:500k:10ms:5ms,duration=100ms,batch=64,seed=7",
        )
        .unwrap();
        assert_eq!(
            w.consumer,
            Process::Pause {
                rate: 500e3,
                on_ns: 10_000_000,
                off_ns: 5_000_000
            }
        );
    }

    #[test]
    fn rejects_impossible_specs() {
        for (spec, want) in [
            ("consumer=const:1k", "needs producer"),
            ("producer=const:1k", "needs consumer"),
            ("producer=const:0,consumer=const:1", "must be above 0"),
            ("producer=const:-5,consumer=const:1", "must be above 0"),
            (
                "producer=const:2G,consumer=const:1",
                "more than one event per nanosecond",
            ),
            (
                "producer=const:1k,consumer=const:1k,duration=0s",
                "at least 1 ns",
            ),
            (
                "producer=const:1k,consumer=const:1k,ring=0",
                "\"ring=0\": ring size 0 is not in 1..=16777216",
            ),
            (
                "producer=const:1k,consumer=const:1k,ring=1099511627776",
                "ring size 1099511627776 is not in 1..=16777216",
            ),
            (
                "producer=const:1k,consumer=const:1k,ring=x",
                "not a whole number",
            ),
            (
                "producer=const:1k,consumer=const:1k,color=red",
                "unknown key",
            ),
            (
                "producer=const:1k,producer=const:2k,consumer=const:1",
                "given twice",
            ),
            ("producer=fast,consumer=const:1", "unknown process"),
            ("producer=burst:0:1k,consumer=const:1", "outside 1..="),
            (
                "producer=const:1G,consumer=const:1G,duration=1d",
                "not a duration",
            ),
            ("producer=const:1G,consumer=const:1G,duration=1h", "at most"),
            (
                "producer=const:1k,consumer=const:1k,duration=25h",
                "longer than a day",
            ),
            (
                "producer=const:1G,consumer=const:1G,duration=10s",
                "at most",
            ),
            // Each 2 ns window opens with an event: 5e10 of them, whatever the rate.
            (
                "producer=pause:1:1ns:1ns,consumer=const:1,duration=100s",
                "about 5.000e10 operations",
            ),
            ("producer=const:1k,,consumer=const:1", "empty item"),
            ("producer", "expected KEY=VALUE"),
        ] {
            let err = Workload::parse(spec).unwrap_err();
            assert!(err.contains(want), "{spec}: {err}");
        }
    }

    #[test]
    fn generates_merged_sorted_ops() {
        let w = Workload::parse("producer=const:1M,consumer=poisson:500k,duration=10ms").unwrap();
        let ops = w.generate();
        let arrivals = ops.ops.iter().filter(|&&o| o == ARRIVAL).count();
        assert_eq!(arrivals, 10_000);
        let reads = ops.len() - arrivals;
        assert!((4500..5500).contains(&reads), "{reads}");
        assert!(ops.times.windows(2).all(|w| w[0] <= w[1]));
        // Same seed, same ops.
        assert_eq!(ops, w.generate());
    }

    /// The size guard counts what generation makes, for every kind of process.
    #[test]
    fn the_estimate_is_what_is_generated() {
        for (spec, arrivals) in [
            ("producer=const:1M,consumer=const:1,duration=10ms", 10_000),
            ("producer=const:4k,consumer=const:1,duration=1ms", 4),
            ("producer=burst:10:100k,consumer=const:1,duration=4ms", 400),
            ("producer=burst:1000:1,consumer=const:1,duration=1s", 1000),
            (
                "producer=pause:1M:1ms:1ms,consumer=const:1,duration=4ms",
                2000,
            ),
            (
                "producer=pause:1:1us:1us,consumer=const:1,duration=1ms",
                500,
            ),
            (
                "producer=pause:1M:2500ns:1ms,consumer=const:1,duration=3ms",
                9,
            ),
            (
                "producer=pause:1M:10ms:1ms,consumer=const:1,duration=4ms",
                4000,
            ),
        ] {
            let w = Workload::parse(spec).unwrap();
            let made = w.generate().ops.iter().filter(|&&o| o == ARRIVAL).count();
            assert_eq!(made, arrivals, "{spec}");
            #[expect(clippy::cast_precision_loss, reason = "small counts")]
            let made = made as f64;
            assert!(
                (w.producer.events(w.duration_ns) - made).abs() < 0.5,
                "{spec}: estimated {}, made {made}",
                w.producer.events(w.duration_ns)
            );
        }
        let w = Workload::parse("producer=poisson:1M,consumer=const:1,duration=10ms").unwrap();
        assert!((w.producer.events(w.duration_ns) - 10_000.0).abs() < 0.5);
    }

    #[test]
    fn pauses_and_bursts() {
        let w = Workload::parse("producer=burst:10:100k,consumer=pause:1M:1ms:1ms,duration=4ms")
            .unwrap();
        let ops = w.generate();
        let arrivals: Vec<u64> = ops
            .times
            .iter()
            .zip(&ops.ops)
            .filter(|(_, o)| **o == ARRIVAL)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(arrivals.len(), 400);
        assert_eq!(arrivals[..10], [0; 10]);
        let reads: Vec<u64> = ops
            .times
            .iter()
            .zip(&ops.ops)
            .filter(|(_, o)| **o != ARRIVAL)
            .map(|(t, _)| *t)
            .collect();
        assert_eq!(reads.len(), 2000);
        assert!(reads.iter().all(|t| (t / 1_000_000) % 2 == 0));
    }
}
