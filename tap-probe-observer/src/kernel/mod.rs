//! What tap-probe knows about the running kernel, read once per run and passed to whatever
//! needs it: struct offsets and enum values from BTF, kernel text addresses from kallsyms,
//! and the names of the drop reasons.

pub mod btf;
pub mod kallsyms;
pub mod modules;
pub mod privileges;

use std::collections::BTreeMap;

use anyhow::Result;
use btf_rs::Btf;
use tap_probe_common::{
    DROP_REASON_BEFORE_RING, DROP_REASON_UNCLASSIFIED, DROP_REASON_XMIT_ERROR, KernelFacts,
    PROG_CONSUME_SKB, WakeRange,
};

use crate::kernel::kallsyms::{Kallsyms, NamedRange};
use crate::kernel::modules::Modules;
use crate::os::tap::IFF_BACKPRESSURE;

/// What tap-probe cannot run without: a kernel lacking it is the problem, not the command
/// (exit status 2), and is named in one line.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Unsupported {
    /// No `/sys/kernel/btf/vmlinux`: no struct can be read.
    NoBtf,
    /// No tun/tap transmit or read function in kallsyms: nothing to count.
    NoTunTap,
}

impl std::fmt::Display for Unsupported {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::NoBtf => write!(
                f,
                "this kernel has no BTF ({} is missing: a kernel built without \
                 CONFIG_DEBUG_INFO_BTF), which tap-probe needs to read the kernel's structures",
                crate::kernel::btf::VMLINUX_BTF
            ),
            Self::NoTunTap => f.write_str(
                "this kernel has none of the tun/tap read functions (tun_do_read, tap_do_read, \
                 ...) in /proc/kallsyms: load the tun module (modprobe tun), or use a kernel \
                 built with CONFIG_TUN",
            ),
        }
    }
}

impl std::error::Error for Unsupported {}

impl Unsupported {
    /// Why this kernel cannot be watched at all, from its BTF (whether it could be read) and
    /// kallsyms: `None` when it can.
    #[must_use]
    pub fn of(btf_missing: bool, kallsyms: &Kallsyms) -> Option<Self> {
        if btf_missing {
            Some(Self::NoBtf)
        } else if kallsyms.reader_ranges().is_empty() {
            Some(Self::NoTunTap)
        } else {
            None
        }
    }

    /// The one this error is or wraps, if any.
    #[must_use]
    pub fn in_error(err: &anyhow::Error) -> Option<Self> {
        err.chain().find_map(|e| e.downcast_ref::<Self>().copied())
    }
}

/// How this kernel's tun answers a full ring when a qdisc sits in front of the device.
#[derive(Clone, Copy, Debug, PartialEq, Eq, serde::Serialize)]
#[serde(rename_all = "snake_case")]
pub enum TunBackpressure {
    /// It drops the packet (tail-drop): a stock kernel, without `__tun_wake_queue`.
    Never,
    /// It stops the queue on every tap: the "avoid tail-drop" series as posted
    /// (`__tun_wake_queue` in kallsyms, no `IFF_BACKPRESSURE` in TUNGETFEATURES).
    Always,
    /// It stops the queue of a tap that set `IFF_BACKPRESSURE` (TUNGETFEATURES lists it:
    /// the fix as merged, Linux 7.3).
    OptIn,
}

impl TunBackpressure {
    /// The fix this kernel has, from its TUNGETFEATURES and, only when those lack
    /// `IFF_BACKPRESSURE`, whether kallsyms has `__tun_wake_queue` (the fix as posted adds
    /// it; a stock kernel has none). The one place that tells the versions apart.
    fn of(features: u32, in_kallsyms: impl FnOnce(&str) -> Result<bool>) -> Result<Self> {
        Ok(if features & IFF_BACKPRESSURE != 0 {
            Self::OptIn
        } else if in_kallsyms("__tun_wake_queue")? {
            Self::Always
        } else {
            Self::Never
        })
    }

    /// Whether a tap whose `tun_flags` are `flags` stops its queue on a full ring (with a
    /// qdisc in front of it).
    #[must_use]
    pub fn of_tap(self, flags: u32) -> bool {
        match self {
            Self::Never => false,
            Self::Always => true,
            Self::OptIn => flags & IFF_BACKPRESSURE != 0,
        }
    }
}

/// The kernel's facts, from one parse of its BTF and one read of kallsyms.
#[derive(Debug)]
pub struct KernelInfo {
    /// `uname -r`.
    pub release: String,
    /// What the programs read the kernel's structures with; written into their read-only
    /// data before they load.
    pub facts: KernelFacts,
    /// The tun/tap read path in kernel text (also in `facts`, by address only).
    pub reader_ranges: Vec<NamedRange>,
    /// Whether the `consume_skb` tracepoint carries its caller's address (Linux 6.3+);
    /// without it a reader's take cannot be told from any other free at that tracepoint.
    pub(crate) consume_has_location: bool,
    pub drop_reasons: ReasonNames,
    pub kallsyms: Kallsyms,
    /// The functions that tell who woke a queue (also in `facts`, by address only).
    pub(crate) wake_ranges: Vec<(NamedRange, tap_probe_common::WakeClass)>,
    /// Where the ring offsets came from (a BTF file), or why there are none.
    pub ring_facts: Result<String, String>,
    /// TUNGETFEATURES, or why it could not be read.
    pub tun_features: Result<u32, String>,
    /// How tun answers a full ring here; `None` when TUNGETFEATURES could not be read.
    pub tun_backpressure: Option<TunBackpressure>,
    /// The modules whose code was located in kallsyms, as they were then.
    pub modules: Modules,
    /// Where a kprobe's perf link reports its misses, if it does (see `bpf::missed`).
    pub kprobe_link_missed: Option<u32>,
}

impl KernelInfo {
    /// Reads the running kernel's BTF and kallsyms, and requires the tun/tap read path
    /// (without it no reader's take can be counted).
    ///
    /// # Errors
    /// When BTF or kallsyms cannot be read or lack something the programs rely on.
    pub fn load() -> Result<Self> {
        // Before kallsyms: a module loaded in between is then reported as loaded since.
        let modules = Modules::now();
        let btf_missing = !std::path::Path::new(crate::kernel::btf::VMLINUX_BTF).exists();
        let kallsyms = Kallsyms::read()?;
        if let Some(unsupported) = Unsupported::of(btf_missing, &kallsyms) {
            return Err(unsupported.into());
        }
        let btf = crate::kernel::btf::load_vmlinux()?;
        let mut info = Self::from_parts(&btf, kallsyms)?;
        info.modules = modules;
        Ok(info)
    }

    /// From a BTF and kallsyms already read (`doctor` reports on each on its own).
    ///
    /// # Errors
    /// When BTF lacks a type, member or enum value the programs rely on.
    pub fn from_parts(btf: &Btf, kallsyms: Kallsyms) -> Result<Self> {
        let mut facts = crate::kernel::btf::kernel_facts(btf)?;
        let reader_ranges = kallsyms.reader_ranges();
        let mut count = 0;
        for (slot, range) in facts.reader_ranges.iter_mut().zip(&reader_ranges) {
            *slot = range.range;
            count += 1;
        }
        facts.reader_range_count = count;
        let wake_ranges = kallsyms.wake_ranges();
        let mut count = 0;
        for (slot, (range, class)) in facts.wake_ranges.iter_mut().zip(&wake_ranges) {
            *slot = WakeRange {
                range: range.range,
                class: *class as u32,
                reserved: 0,
            };
            count += 1;
        }
        facts.wake_range_count = count;
        let ring_facts = match crate::kernel::btf::ring_facts(btf) {
            Ok((ring, from)) => {
                facts.ring = ring;
                Ok(from)
            }
            Err(err) => Err(format!("{err:#}")),
        };
        let tun_features = crate::os::tap::tun_features().map_err(|err| format!("{err:#}"));
        let tun_backpressure = tun_features
            .as_ref()
            .ok()
            .map(|&features| TunBackpressure::of(features, |name| Ok(kallsyms.has(name))))
            .transpose()?;
        Ok(Self {
            release: release(),
            facts,
            reader_ranges,
            // Without the tracepoint's typedef in BTF, nothing can be known of its location.
            consume_has_location: crate::kernel::btf::tracepoint_args(btf, PROG_CONSUME_SKB.1)
                .is_ok_and(|args| args.len() >= 2),
            drop_reasons: ReasonNames(crate::kernel::btf::drop_reason_names(btf)),
            kallsyms,
            wake_ranges,
            ring_facts,
            tun_features,
            tun_backpressure,
            modules: Modules::now(),
            kprobe_link_missed: crate::kernel::btf::kprobe_link_missed(btf),
        })
    }
}

impl KernelInfo {
    /// How the running kernel's tun answers a full ring, asked on its own: for what runs
    /// no probe (`bench`, the privileged tests) and so needs neither BTF nor the tun/tap
    /// read path that [`KernelInfo::load`] requires. kallsyms is read only when
    /// TUNGETFEATURES lacks `IFF_BACKPRESSURE`.
    ///
    /// # Errors
    /// When `/dev/net/tun` cannot be asked, or kallsyms cannot be read.
    pub fn tun_backpressure_now() -> Result<TunBackpressure> {
        TunBackpressure::of(crate::os::tap::tun_features()?, |name| {
            Ok(Kallsyms::read()?.has(name))
        })
    }

    /// Whether this kernel reports the hits of a kprobe that ran no program (its `nmissed`)
    /// through the kprobe's perf link (Linux 6.7+, read from BTF).
    #[must_use]
    pub fn reports_kprobe_misses(&self) -> bool {
        self.kprobe_link_missed.is_some()
    }
}

/// Maps `enum skb_drop_reason` values to names.
#[derive(Clone, Debug, Default)]
pub struct ReasonNames(pub(crate) BTreeMap<u32, String>);

impl ReasonNames {
    #[must_use]
    pub(crate) fn name(&self, reason: u32) -> String {
        match reason {
            DROP_REASON_XMIT_ERROR => return "xmit_error".to_owned(),
            DROP_REASON_BEFORE_RING => return "before_ring".to_owned(),
            DROP_REASON_UNCLASSIFIED => return "unclassified".to_owned(),
            _ => {}
        }
        self.0
            .get(&reason)
            .cloned()
            .unwrap_or_else(|| format!("reason_{reason}"))
    }
}

/// The running kernel's release (`uname -r`); empty when unreadable.
#[must_use]
pub fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}

#[cfg(test)]
mod tests {
    use super::*;

    /// The flag decides alone when TUNGETFEATURES lists it (kallsyms is not read); without
    /// it, `__tun_wake_queue` tells the fix as posted from a stock kernel.
    #[test]
    fn the_fix_is_told_from_features_then_kallsyms() {
        let never_asked = |_: &str| -> Result<bool> { panic!("kallsyms read with the flag") };
        assert_eq!(
            TunBackpressure::of(IFF_BACKPRESSURE, never_asked).unwrap(),
            TunBackpressure::OptIn
        );
        let asked = |name: &str| Ok(name == "__tun_wake_queue");
        assert_eq!(
            TunBackpressure::of(0, asked).unwrap(),
            TunBackpressure::Always
        );
        assert_eq!(
            TunBackpressure::of(0, |_| Ok(false)).unwrap(),
            TunBackpressure::Never
        );
        assert!(TunBackpressure::of(0, |_| anyhow::bail!("unreadable")).is_err());
    }
}
