//! Which kernel hooks feed which counter, chosen counter by counter and tried, not guessed.
//!
//! - Driver calls (`xmit_calls`, `enqueued`, `busy`, and the bracket that attributes drops):
//!   a kprobe and kretprobe on each driver's `ndo_start_xmit` (`tun_net_xmit`, `veth_xmit`,
//!   `macvlan_start_xmit`), or the `net_dev_start_xmit`/`net_dev_xmit` tracepoints.
//! - Reader takes (`consumed`): a kprobe on `consume_skb` that reads its caller's address
//!   from the stack, or the `consume_skb` tracepoint, whose `location` argument (Linux 6.3+)
//!   is that same address.
//! - Drops and queue state: the `kfree_skb` and `qdisc_dequeue` tracepoints, on every backend
//!   (the drop reason exists only there).
//!
//! fentry/fexit would be cheaper than kprobes, but tun is a module on most distributions and
//! aya 0.14 loads fentry programs only against vmlinux's BTF, not a module's
//! (`/sys/kernel/btf/tun`), so there is no fentry backend.

use anyhow::{Context as _, anyhow, bail};
use aya::Ebpf;
use aya::programs::{KProbe, RawTracePoint};
use serde::Serialize;
use tap_probe_common::{
    METRICS, PROG_CONSUME_ENTRY, PROG_CONSUME_SKB, PROG_KFREE_SKB, PROG_QDISC_DEQUEUE,
    PROG_START_XMIT, PROG_XMIT, PROG_XMIT_ENTRY, PROG_XMIT_RETURN, Source,
};

use crate::kernel::KernelInfo;
use crate::kernel::kallsyms::Kallsyms;

/// The perf event source aya attaches kprobes through.
const KPROBE_PMU: &str = "/sys/bus/event_source/devices/kprobe";

/// Drivers whose transmit function the kprobe backend probes, when the kernel has them.
const XMIT_FUNCTIONS: [&str; 3] = ["tun_net_xmit", "veth_xmit", "macvlan_start_xmit"];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// fentry, then kprobe, then tracepoints, counter by counter.
    #[default]
    Auto,
    Fentry,
    Kprobe,
    Tracepoint,
}

const FENTRY_UNAVAILABLE: &str = "the fentry backend is not available: tun is a kernel module \
     on most distributions, and aya 0.14 can load fentry programs only against vmlinux's BTF; \
     use --backend kprobe or tracepoint";

/// What feeds each group of counters, for `doctor`, `watch`, the JSON output and the
/// trace header. Drops and the queue state have one source on every backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sources {
    /// Driver calls: `xmit_calls`, `enqueued`, `busy`, and the bracket that ties a drop to
    /// the driver call in flight.
    pub(crate) xmit: Xmit,
    /// Reader takes: `consumed`, `reader_sleeps`.
    pub(crate) consumed: Consume,
    /// Why a preferred source was not used.
    pub(crate) notes: Vec<String>,
}

/// Where driver calls are seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub(crate) enum Xmit {
    /// A kprobe and a kretprobe on each of these drivers' `ndo_start_xmit`.
    Kprobes(Vec<&'static str>),
    /// The `net:net_dev_start_xmit` and `net:net_dev_xmit` tracepoints.
    Tracepoints,
}

/// Where reader takes are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Consume {
    /// A kprobe on `consume_skb` that reads its caller's address from the stack.
    Kprobe,
    /// The `skb:consume_skb` tracepoint and its `location` argument.
    Tracepoint,
}

/// The groups of counters that share their sources.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
enum Group {
    Xmit,
    Drops,
    Consumed,
    QueueState,
}

/// The group of a counter of the counter table (`tap_probe_common::METRICS`); a test checks
/// that every counter the programs count has one.
fn group_of(counter: &str) -> Option<Group> {
    Some(match counter {
        "xmit_calls" | "enqueued" | "busy" => Group::Xmit,
        "dropped_full_ring" | "dropped_other" => Group::Drops,
        "consumed" | "reader_sleeps" => Group::Consumed,
        "queue_stops" | "queue_wakes" | "stopped_ns" => Group::QueueState,
        _ => return None,
    })
}

/// Drops: the only source of the drop reason.
const DROPS: &str = "tracepoint skb:kfree_skb";
/// The queue state: read where it changes or shows.
const QUEUE_STATE: &str = "after each driver call, and tracepoint qdisc:qdisc_dequeue";

impl std::fmt::Display for Xmit {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Kprobes(functions) => write!(f, "kprobe+kretprobe {}", functions.join(", ")),
            Self::Tracepoints => {
                f.write_str("tracepoints net:net_dev_start_xmit, net:net_dev_xmit")
            }
        }
    }
}

impl std::fmt::Display for Consume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kprobe => "kprobe consume_skb (caller address)",
            Self::Tracepoint => "tracepoint skb:consume_skb (location)",
        })
    }
}

impl Sources {
    /// The kind of hook behind each counter the programs count, as `counter=hook` pairs in
    /// the counter table's order: the trace header's record of what produced the events.
    /// A hook is `kprobe`, `tracepoint`, or `kprobe+tracepoint` for the queue state when
    /// driver calls come from kprobes (it is read after each call and at each dequeue).
    #[must_use]
    pub(crate) fn hooks(&self) -> String {
        self.per_counter()
            .iter()
            .map(|(counter, hook)| format!("{counter}={hook}"))
            .collect::<Vec<_>>()
            .join(", ")
    }

    /// Each counter of the programs and the kind of hook that feeds it.
    #[must_use]
    pub(crate) fn per_counter(&self) -> Vec<(&'static str, &'static str)> {
        let xmit = match self.xmit {
            Xmit::Kprobes(_) => "kprobe",
            Xmit::Tracepoints => "tracepoint",
        };
        let consumed = match self.consumed {
            Consume::Kprobe => "kprobe",
            Consume::Tracepoint => "tracepoint",
        };
        let queue_state = match self.xmit {
            Xmit::Kprobes(_) => "kprobe+tracepoint",
            Xmit::Tracepoints => "tracepoint",
        };
        METRICS
            .iter()
            .filter(|m| matches!(m.source, Source::Programs(_)))
            .map(|m| {
                let hook = match group_of(m.name) {
                    Some(Group::Xmit) => xmit,
                    Some(Group::Drops) => "tracepoint",
                    Some(Group::Consumed) => consumed,
                    Some(Group::QueueState) => queue_state,
                    None => "unknown",
                };
                (m.name, hook)
            })
            .collect()
    }

    /// Each group of counters and its source, in the order the JSON has them.
    #[must_use]
    pub(crate) fn groups(&self) -> [(&'static str, String); 4] {
        [
            ("xmit", self.xmit.to_string()),
            ("drops", DROPS.to_owned()),
            ("consumed", self.consumed.to_string()),
            ("queue_state", QUEUE_STATE.to_owned()),
        ]
    }
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(
            f,
            "xmit: {}; drops: {DROPS}; consumed: {}; queue state: {QUEUE_STATE}",
            self.xmit, self.consumed
        )
    }
}

impl Serialize for Sources {
    /// Each group's source as text, then the notes.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = serializer.serialize_struct("Sources", 5)?;
        for (group, source) in self.groups() {
            st.serialize_field(group, &source)?;
        }
        st.serialize_field("notes", &self.notes)?;
        st.end()
    }
}

/// Loads and attaches the programs `backend` calls for; on error nothing stays attached
/// once `ebpf` is dropped.
///
/// # Errors
/// When a forced backend cannot attach, or no source at all works for a counter.
pub(crate) fn attach(
    ebpf: &mut Ebpf,
    backend: Backend,
    kernel: &KernelInfo,
) -> anyhow::Result<Sources> {
    if backend == Backend::Fentry {
        bail!("{FENTRY_UNAVAILABLE}");
    }
    let mut notes = Vec::new();
    if backend == Backend::Auto {
        notes.push(format!("fentry: {FENTRY_UNAVAILABLE}"));
    }
    let kprobes = matches!(backend, Backend::Auto | Backend::Kprobe);
    // The closing side of a driver call first: an opened bracket is always closed.
    attach_raw(ebpf, PROG_KFREE_SKB)?;
    attach_raw(ebpf, PROG_QDISC_DEQUEUE)?;

    let xmit = match kprobes.then(|| attach_xmit_kprobes(ebpf, &kernel.kallsyms)) {
        Some(Ok(functions)) => Xmit::Kprobes(functions),
        Some(Err(err)) if backend == Backend::Kprobe => return Err(err),
        failed => {
            if let Some(Err(err)) = failed {
                notes.push(format!("xmit kprobes: {err:#}"));
            }
            attach_raw(ebpf, PROG_XMIT)?;
            attach_raw(ebpf, PROG_START_XMIT)?;
            Xmit::Tracepoints
        }
    };

    let consume_kprobe = || attach_kprobe(ebpf, PROG_CONSUME_ENTRY, "consume_skb", false);
    let consumed = match kprobes.then(consume_kprobe) {
        Some(Ok(())) => Consume::Kprobe,
        Some(Err(err)) if backend == Backend::Kprobe => return Err(err),
        failed => {
            if let Some(Err(err)) = failed {
                notes.push(format!("consume kprobe: {err:#}"));
            }
            if !kernel.consume_has_location {
                bail!(
                    "nothing can count reader takes here: kprobes do not attach and the \
                     consume_skb tracepoint has no location argument (Linux < 6.3)"
                );
            }
            attach_raw(ebpf, PROG_CONSUME_SKB)?;
            Consume::Tracepoint
        }
    };
    Ok(Sources {
        xmit,
        consumed,
        notes,
    })
}

fn attach_raw(ebpf: &mut Ebpf, (name, tracepoint): (&str, &str)) -> anyhow::Result<()> {
    let program: &mut RawTracePoint = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
        .try_into()?;
    program
        .load()
        .with_context(|| format!("loading {name} (raw tracepoint)"))?;
    program
        .attach(tracepoint)
        .with_context(|| format!("attaching to raw tracepoint {tracepoint}"))?;
    Ok(())
}

/// Probes the return, then the entry, of every driver transmit function present; the
/// returns first so that every recorded entry meets its return.
fn attach_xmit_kprobes(ebpf: &mut Ebpf, kallsyms: &Kallsyms) -> anyhow::Result<Vec<&'static str>> {
    if !std::path::Path::new(KPROBE_PMU).exists() {
        bail!("this kernel has no kprobes ({KPROBE_PMU} is missing: CONFIG_KPROBES is off)");
    }
    let present: Vec<&str> = XMIT_FUNCTIONS
        .into_iter()
        .filter(|f| kallsyms.has(f))
        .collect();
    if !present.contains(&"tun_net_xmit") {
        bail!("tun_net_xmit is not in /proc/kallsyms: is the tun module loaded? (modprobe tun)");
    }
    for function in &present {
        attach_kprobe(ebpf, PROG_XMIT_RETURN, function, true)?;
    }
    for function in &present {
        attach_kprobe(ebpf, PROG_XMIT_ENTRY, function, false)?;
    }
    Ok(present)
}

/// Loads `name` (once) and attaches it to `function`.
fn attach_kprobe(ebpf: &mut Ebpf, name: &str, function: &str, ret: bool) -> anyhow::Result<()> {
    let program: &mut KProbe = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
        .try_into()?;
    if program.fd().is_err() {
        program
            .load()
            .with_context(|| format!("loading {name} (kprobe)"))?;
    }
    let kind = if ret { "kretprobe" } else { "kprobe" };
    if let Err(err) = program.attach(function, 0) {
        // Leave nothing loaded that is not attached.
        let _ = program.unload();
        return Err(err).with_context(|| format!("attaching a {kind} to {function}"));
    }
    Ok(())
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_as_before_and_name_their_hooks() {
        let sources = Sources {
            xmit: Xmit::Kprobes(vec!["tun_net_xmit", "veth_xmit"]),
            consumed: Consume::Tracepoint,
            notes: vec!["fentry: no".to_owned()],
        };
        assert_eq!(
            serde_json::to_string(&sources).unwrap(),
            r#"{"xmit":"kprobe+kretprobe tun_net_xmit, veth_xmit","drops":"tracepoint skb:kfree_skb","consumed":"tracepoint skb:consume_skb (location)","queue_state":"after each driver call, and tracepoint qdisc:qdisc_dequeue","notes":["fentry: no"]}"#
        );
        assert_eq!(
            sources.hooks(),
            "xmit_calls=kprobe, enqueued=kprobe, busy=kprobe, dropped_full_ring=tracepoint, \
             dropped_other=tracepoint, consumed=tracepoint, queue_stops=kprobe+tracepoint, \
             queue_wakes=kprobe+tracepoint, stopped_ns=kprobe+tracepoint, \
             reader_sleeps=tracepoint"
        );
    }

    /// Every counter the programs count is in a group, so the trace header names its hook.
    #[test]
    fn every_counter_has_a_group() {
        for metric in METRICS {
            if matches!(metric.source, Source::Programs(_)) {
                assert!(
                    group_of(metric.name).is_some(),
                    "{} has no group",
                    metric.name
                );
            }
        }
    }
}
