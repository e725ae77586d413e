//! What tap-probe knows about the running kernel, read once per run and passed to whatever
//! needs it: struct offsets and enum values from BTF, kernel text addresses from kallsyms,
//! and the names of the drop reasons.

pub(crate) mod btf;
pub(crate) mod kallsyms;
pub(crate) mod privileges;

use std::collections::BTreeMap;

use anyhow::{Result, bail};
use btf_rs::Btf;
use tap_probe_common::{DROP_REASON_XMIT_ERROR, KernelFacts, PROG_CONSUME_SKB};

use crate::kernel::kallsyms::{Kallsyms, NamedRange};

/// The kernel's facts, from one parse of its BTF and one read of kallsyms.
#[derive(Debug)]
pub struct KernelInfo {
    /// `uname -r`.
    pub(crate) release: String,
    /// What the programs read the kernel's structures with; written into their read-only
    /// data before they load.
    pub(crate) facts: KernelFacts,
    /// The tun/tap read path in kernel text (also in `facts`, by address only).
    pub(crate) reader_ranges: Vec<NamedRange>,
    /// Whether the `consume_skb` tracepoint carries its caller's address (Linux 6.3+);
    /// without it a reader's take cannot be told from any other free at that tracepoint.
    pub(crate) consume_has_location: bool,
    pub(crate) drop_reasons: ReasonNames,
    pub(crate) kallsyms: Kallsyms,
}

impl KernelInfo {
    /// Reads the running kernel's BTF and kallsyms, and requires the tun/tap read path
    /// (without it no reader's take can be counted).
    ///
    /// # Errors
    /// When BTF or kallsyms cannot be read or lack something the programs rely on.
    pub fn load() -> Result<Self> {
        let btf = crate::kernel::btf::load_vmlinux()?;
        let info = Self::from_parts(&btf, Kallsyms::read()?)?;
        if info.reader_ranges.is_empty() {
            bail!(
                "found none of the tun/tap read functions (tun_do_read, tap_do_read, ...) in \
                 /proc/kallsyms: is the tun module loaded? (modprobe tun)"
            );
        }
        Ok(info)
    }

    /// From a BTF and kallsyms already read (`doctor` reports on each on its own).
    ///
    /// # Errors
    /// When BTF lacks a type, member or enum value the programs rely on.
    pub(crate) fn from_parts(btf: &Btf, kallsyms: Kallsyms) -> Result<Self> {
        let mut facts = crate::kernel::btf::kernel_facts(btf)?;
        let reader_ranges = kallsyms.reader_ranges();
        let mut count = 0;
        for (slot, range) in facts.reader_ranges.iter_mut().zip(&reader_ranges) {
            *slot = range.range;
            count += 1;
        }
        facts.reader_range_count = count;
        Ok(Self {
            release: release(),
            facts,
            reader_ranges,
            consume_has_location: crate::kernel::btf::tracepoint_args(btf, PROG_CONSUME_SKB.1)?
                .len()
                >= 2,
            drop_reasons: ReasonNames(crate::kernel::btf::drop_reason_names(btf)?),
            kallsyms,
        })
    }
}

/// Maps `enum skb_drop_reason` values to names.
#[derive(Clone, Debug, Default)]
pub(crate) struct ReasonNames(pub(crate) BTreeMap<u32, String>);

impl ReasonNames {
    #[must_use]
    pub(crate) fn name(&self, reason: u32) -> String {
        if reason == DROP_REASON_XMIT_ERROR {
            return "xmit_error".to_owned();
        }
        self.0
            .get(&reason)
            .cloned()
            .unwrap_or_else(|| format!("reason_{reason}"))
    }
}

/// The running kernel's release (`uname -r`); empty when unreadable.
#[must_use]
pub(crate) fn release() -> String {
    std::fs::read_to_string("/proc/sys/kernel/osrelease")
        .map(|s| s.trim().to_owned())
        .unwrap_or_default()
}
