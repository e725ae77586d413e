//! Kernel text addresses from `/proc/kallsyms`.
//!
//! The eBPF side counts a `skb:consume_skb` as "the tap reader took this packet" only when the
//! caller (the tracepoint's `location`) lies inside the tun/tap read path. That path is
//! `tun_do_read` (`drivers/net/tun.c`) and `tap_do_read` (`drivers/net/tap.c`, macvtap): both
//! copy the packet to the reader and then `consume_skb` it. The compiler may split them
//! (`.cold`), specialise them (`.isra.N`, `.constprop.N`, `.part.N`) or inline them into their
//! callers, so all of those are looked up.

use std::fmt::Write as _;

use anyhow::{Context as _, Result, bail};
use tap_probe_common::{
    DEVICE_TUN, Driver, MAX_READER_RANGES, MAX_WAKE_RANGES, TextRange, WakeClass,
};

pub const KALLSYMS: &str = "/proc/kallsyms";

/// The read-path functions and, for each, the functions it may be inlined into.
const READ_PATHS: &[(&str, &[&str])] = &[
    ("tun_do_read", &["tun_chr_read_iter", "tun_recvmsg"]),
    ("tap_do_read", &["tap_read_iter", "tap_recvmsg"]),
];

/// The functions that tell who woke a queue, found on the stack of `netif_tx_wake_queue`
/// (the outermost one found decides), besides the tun/tap read path (a reader's wake). The
/// tun ones exist with the tail-drop fix: `__tun_wake_queue` (the seeds, Linux 7.3),
/// `tun_wake_queue` (7.3: vhost-net's batched take), `tun_force_wake_queue` (7.3).
const WAKERS: &[(&str, WakeClass)] = &[
    ("__tun_wake_queue", WakeClass::Reader),
    ("veth_poll", WakeClass::Reader),
    ("tun_wake_queue", WakeClass::Vhost),
    ("tun_force_wake_queue", WakeClass::Forced),
    ("tun_net_xmit", WakeClass::Recheck),
];

/// The drivers whose devices the programs count, by their `ndo_start_xmit`: a device is
/// recognised by the function its `netdev_ops` point at. tun and tap share tun's. macvlan's
/// counts only with `--macvtap` (its other devices are plain macvlans, not taps).
const TUN_XMIT: &str = "tun_net_xmit";
const VETH_XMIT: &str = "veth_xmit";
pub(crate) const MACVLAN_XMIT: &str = "macvlan_start_xmit";

/// One kernel text symbol.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Symbol {
    pub address: u64,
    pub name: String,
    /// The module it belongs to, `None` for the kernel image.
    pub module: Option<String>,
}

/// A named range of kernel text, `[start, end)`.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct NamedRange {
    pub name: String,
    pub range: TextRange,
}

/// The text symbols of the running kernel, sorted by address.
#[derive(Clone, Debug, Default)]
pub struct Kallsyms {
    symbols: Vec<Symbol>,
}

impl Kallsyms {
    /// Reads `/proc/kallsyms`.
    ///
    /// # Errors
    /// When it cannot be read, or when its addresses are hidden (all zero, see
    /// `kernel.kptr_restrict`).
    pub fn read() -> Result<Self> {
        let text =
            std::fs::read_to_string(KALLSYMS).with_context(|| format!("reading {KALLSYMS}"))?;
        Self::parse(&text)
    }

    /// Parses the text of `/proc/kallsyms`: `ADDRESS TYPE NAME [\t[MODULE]]` per line.
    ///
    /// # Errors
    /// When there are no text symbols, or every address is zero.
    pub fn parse(text: &str) -> Result<Self> {
        let mut symbols = Vec::new();
        let mut any_nonzero = false;
        for line in text.lines() {
            let mut fields = line.split_whitespace();
            let (Some(address), Some(kind), Some(name)) =
                (fields.next(), fields.next(), fields.next())
            else {
                continue;
            };
            // Weak symbols (`w`/`W`) are functions too; they bound their neighbours' ranges.
            if !matches!(kind, "t" | "T" | "w" | "W") {
                continue;
            }
            let Ok(address) = u64::from_str_radix(address, 16) else {
                continue;
            };
            any_nonzero |= address != 0;
            let module = fields
                .next()
                .and_then(|m| m.strip_prefix('[')?.strip_suffix(']'))
                .map(str::to_owned);
            symbols.push(Symbol {
                address,
                name: name.to_owned(),
                module,
            });
        }
        if symbols.is_empty() {
            bail!("{KALLSYMS} lists no kernel text symbols");
        }
        if !any_nonzero {
            let sysctl = |name: &str| {
                std::fs::read_to_string(format!("/proc/sys/kernel/{name}"))
                    .map_or_else(|_| "?".to_owned(), |s| s.trim().to_owned())
            };
            // kernel/kallsyms.c kallsyms_show_value(): with kptr_restrict 0 addresses show to
            // everyone only when perf_event_paranoid <= 1; otherwise CAP_SYSLOG is needed.
            bail!(
                "{KALLSYMS} hides kernel addresses from this process (every address reads zero; \
                 kernel.kptr_restrict = {}, kernel.perf_event_paranoid = {}): run as root \
                 (CAP_SYSLOG), or set kernel.kptr_restrict=0 and kernel.perf_event_paranoid<=1",
                sysctl("kptr_restrict"),
                sysctl("perf_event_paranoid"),
            );
        }
        // kallsyms is not guaranteed sorted (modules come after the kernel image, in load order).
        symbols.sort_by_key(|s| s.address);
        Ok(Self { symbols })
    }

    /// Whether a text symbol called exactly `name` exists (in the kernel or a loaded module).
    #[must_use]
    pub fn has(&self, name: &str) -> bool {
        self.symbols.iter().any(|s| s.name == name)
    }

    /// All symbols called `name` or `name.<suffix>` (`.cold`, `.isra.0`, `.constprop.0`, ...).
    #[must_use]
    pub fn variants(&self, name: &str) -> Vec<&Symbol> {
        self.symbols
            .iter()
            .filter(|s| {
                s.name == name
                    || s.name
                        .strip_prefix(name)
                        .is_some_and(|rest| rest.starts_with('.'))
            })
            .collect()
    }

    /// The address of the text symbol called exactly `name`.
    #[must_use]
    pub fn address(&self, name: &str) -> Option<u64> {
        self.symbols
            .iter()
            .find(|s| s.name == name)
            .map(|s| s.address)
    }

    /// The drivers whose devices the programs recognise, as the programs read them: tun/tap
    /// and veth, and macvlan (for macvtap) when `macvtap` is set. A driver that is not
    /// loaded is left out (its module may load later: see `Modules`).
    #[must_use]
    pub fn drivers(&self, macvtap: bool) -> Vec<(&'static str, Driver)> {
        let wanted: &[(&'static str, u32)] = if macvtap {
            &[(TUN_XMIT, DEVICE_TUN), (VETH_XMIT, 0), (MACVLAN_XMIT, 0)]
        } else {
            &[(TUN_XMIT, DEVICE_TUN), (VETH_XMIT, 0)]
        };
        wanted
            .iter()
            .filter_map(|&(name, flags)| {
                let start_xmit = self.address(name)?;
                Some((
                    name,
                    Driver {
                        start_xmit,
                        flags,
                        reserved: 0,
                    },
                ))
            })
            .collect()
    }

    /// `[start, next higher symbol)` of the symbol at index `i`, `None` for the last one.
    fn range_at(&self, i: usize) -> Option<TextRange> {
        let start = self.symbols[i].address;
        let end = self.symbols[i + 1..]
            .iter()
            .find(|s| s.address > start)?
            .address;
        Some(TextRange { start, end })
    }

    /// The text ranges of the tun/tap read path, see the module documentation. At most
    /// [`MAX_READER_RANGES`]; extra ones are dropped with a warning.
    #[must_use]
    pub fn reader_ranges(&self) -> Vec<NamedRange> {
        let mut ranges = Vec::new();
        for (function, inlined_into) in READ_PATHS {
            let direct = self.named_ranges(function);
            if direct.iter().any(|r| r.name == *function) {
                ranges.extend(direct);
                continue;
            }
            // Only `.cold` parts or nothing left: the body was inlined into its callers.
            ranges.extend(direct);
            for caller in *inlined_into {
                ranges.extend(self.named_ranges(caller));
            }
        }
        if ranges.len() > MAX_READER_RANGES {
            let mut dropped = String::new();
            for r in &ranges[MAX_READER_RANGES..] {
                let _ = write!(dropped, " {}", r.name);
            }
            log::warn!(
                "more than {MAX_READER_RANGES} tun/tap read-path functions; ignoring:{dropped}"
            );
            ranges.truncate(MAX_READER_RANGES);
        }
        ranges
    }

    /// The text ranges that classify a queue wake (see [`WAKERS`]), with the read path as
    /// the reader's. At most [`MAX_WAKE_RANGES`]; extra ones are dropped with a warning.
    #[must_use]
    pub(crate) fn wake_ranges(&self) -> Vec<(NamedRange, WakeClass)> {
        let mut ranges: Vec<(NamedRange, WakeClass)> = self
            .reader_ranges()
            .into_iter()
            .map(|r| (r, WakeClass::Reader))
            .collect();
        for (function, class) in WAKERS {
            ranges.extend(self.named_ranges(function).into_iter().map(|r| (r, *class)));
        }
        if ranges.len() > MAX_WAKE_RANGES {
            let mut dropped = String::new();
            for (r, _) in &ranges[MAX_WAKE_RANGES..] {
                let _ = write!(dropped, " {}", r.name);
            }
            log::warn!("more than {MAX_WAKE_RANGES} wake functions; ignoring:{dropped}");
            ranges.truncate(MAX_WAKE_RANGES);
        }
        ranges
    }

    fn named_ranges(&self, function: &str) -> Vec<NamedRange> {
        self.symbols
            .iter()
            .enumerate()
            .filter(|(_, s)| {
                s.name == function
                    || s.name
                        .strip_prefix(function)
                        .is_some_and(|rest| rest.starts_with('.'))
            })
            .filter_map(|(i, s)| {
                let range = self.range_at(i)?;
                Some(NamedRange {
                    name: s.name.clone(),
                    range,
                })
            })
            .collect()
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    const SAMPLE: &str = "\
ffffffff81dfd2e0 t tun_do_read
ffffffff81000000 T _stext
ffffffff81dfdd00 t tun_recvmsg
ffffffff8123b44f t tun_do_read.cold
ffffffff8123b4a0 t something_else.cold
ffffffff81dfdea0 t tun_chr_read_iter
ffffffff81dfdf00 T tun_chr_read_iter_not_a_variant
ffffffffc0001000 t tap_read_iter\t[tap]
ffffffffc0001000 t tap_read_iter_alias\t[tap]
ffffffffc0001100 t tap_recvmsg\t[tap]
ffffffffc0001200 t tap_exit\t[tap]
ffffffff82000000 D some_data
";

    #[test]
    fn ranges_are_bounded_by_the_next_symbol() {
        let syms = Kallsyms::parse(SAMPLE).unwrap();
        let ranges = syms.reader_ranges();
        let got: Vec<(&str, u64, u64)> = ranges
            .iter()
            .map(|r| (r.name.as_str(), r.range.start, r.range.end))
            .collect();
        assert_eq!(
            got,
            vec![
                (
                    "tun_do_read.cold",
                    0xffff_ffff_8123_b44f,
                    0xffff_ffff_8123_b4a0
                ),
                ("tun_do_read", 0xffff_ffff_81df_d2e0, 0xffff_ffff_81df_dd00),
                // tap_do_read is absent: its callers, modules included; an alias at the same
                // address does not end the range.
                (
                    "tap_read_iter",
                    0xffff_ffff_c000_1000,
                    0xffff_ffff_c000_1100
                ),
                ("tap_recvmsg", 0xffff_ffff_c000_1100, 0xffff_ffff_c000_1200),
            ]
        );
        assert!(syms.has("tap_exit"));
        assert!(!syms.has("tap_do_read"));
        assert!(!syms.has("some_data"), "data symbols are not text");
        assert_eq!(syms.variants("tun_chr_read_iter").len(), 1);
    }

    #[test]
    fn inlined_read_path_falls_back_to_callers() {
        let text = "\
0000000000001000 t tun_do_read.cold
0000000000002000 t tun_chr_read_iter
0000000000002100 t tun_recvmsg.isra.0
0000000000002200 t tun_other
";
        let ranges = Kallsyms::parse(text).unwrap().reader_ranges();
        let names: Vec<&str> = ranges.iter().map(|r| r.name.as_str()).collect();
        assert_eq!(
            names,
            [
                "tun_do_read.cold",
                "tun_chr_read_iter",
                "tun_recvmsg.isra.0"
            ]
        );
    }

    #[test]
    fn wakers_are_classified_by_name() {
        let text = "\
0000000000001000 t tun_do_read
0000000000001100 t __tun_wake_queue
0000000000001200 T tun_wake_queue
0000000000001300 t tun_force_wake_queue
0000000000001400 t tun_net_xmit
0000000000001500 t tun_net_xmit.cold
0000000000001600 t tun_other
";
        let ranges = Kallsyms::parse(text).unwrap().wake_ranges();
        let got: Vec<(&str, WakeClass, u64)> = ranges
            .iter()
            .map(|(r, c)| (r.name.as_str(), *c, r.range.start))
            .collect();
        assert_eq!(
            got,
            [
                ("tun_do_read", WakeClass::Reader, 0x1000),
                ("__tun_wake_queue", WakeClass::Reader, 0x1100),
                ("tun_wake_queue", WakeClass::Vhost, 0x1200),
                ("tun_force_wake_queue", WakeClass::Forced, 0x1300),
                ("tun_net_xmit", WakeClass::Recheck, 0x1400),
                ("tun_net_xmit.cold", WakeClass::Recheck, 0x1500),
            ]
        );
    }

    #[test]
    fn hidden_addresses_are_an_error() {
        let text = "0000000000000000 T _stext\n0000000000000000 t tun_do_read\n";
        let err = Kallsyms::parse(text).unwrap_err().to_string();
        assert!(err.contains("kptr_restrict"), "{err}");
    }
}

/// This reads the running kernel's kallsyms: its outcome depends on the kernel, so the guests
/// run it too (`cargo xtask vm` picks `kernel_tests` modules out of the unit tests).
#[cfg(test)]
mod kernel_tests {
    use tap_probe_verdict::Skip;

    use super::*;

    #[test]
    fn host_reader_ranges() {
        let syms = match Kallsyms::read() {
            Ok(syms) => syms,
            Err(err) => {
                Skip::test(format!("{err:#}")).print();
                return;
            }
        };
        let ranges = syms.reader_ranges();
        for r in &ranges {
            eprintln!("{} {:#x}..{:#x}", r.name, r.range.start, r.range.end);
            assert!(r.range.start < r.range.end);
            // A function is not megabytes long: a wrong neighbour would show here.
            assert!(r.range.end - r.range.start < 1 << 20, "{}", r.name);
        }
        assert!(ranges.len() <= MAX_READER_RANGES);
        if syms.has("tun_net_xmit") {
            assert!(
                ranges.iter().any(|r| r.name.starts_with("tun_")),
                "tun is here"
            );
        }
    }
}
