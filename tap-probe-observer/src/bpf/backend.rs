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
//! - Packets put back while the queue was stopped (`requeued_stopped`): a kprobe and
//!   kretprobe on `sch_direct_xmit` (exact), or each queue's `qdisc_dequeue`s followed to the
//!   driver (may be short by packets put back from the bypass of an empty qdisc).
//! - Who woke the queue: a kprobe on `netif_tx_wake_queue` and its caller's stack; without
//!   kprobes only the wakes themselves are seen (the queue state).
//! - Ring occupancy: read by the driver-call and reader-take programs of either backend,
//!   where BTF says where the tap's `ptr_ring` is.
//!
//! fentry/fexit would be cheaper than kprobes, but tun is a module on most distributions and
//! aya 0.14 loads fentry programs only against vmlinux's BTF, not a module's
//! (`/sys/kernel/btf/tun`): `FEntry::load` sets the program's `attach_btf_id` and never its
//! `attach_btf_obj_fd` (aya `src/programs/fentry.rs`; only `Extension` sets that fd). So
//! there is no fentry backend, and `doctor` says why.

use anyhow::{Context as _, anyhow, bail};
use aya::maps::{Array, MapData};
use aya::programs::BtfTracePoint;
use aya::{Btf, Ebpf};
use serde::Serialize;
use tap_probe_common::{
    Hook, MAP_SETTINGS, METRICS, PROG_CONSUME_ENTRY, PROG_CONSUME_SKB, PROG_DIRECT_XMIT_ENTRY,
    PROG_DIRECT_XMIT_RETURN, PROG_KFREE_SKB, PROG_QDISC_DEQUEUE, PROG_START_XMIT, PROG_WAKE_ENTRY,
    PROG_XMIT, PROG_XMIT_ENTRY, PROG_XMIT_RETURN, Requires, SETTING_DEQUEUE_PAIRS,
    SETTING_WAKE_EVENTS, Source,
};

use crate::bpf::kprobe::{KPROBE_PMU, Kprobes};
use crate::kernel::KernelInfo;
use crate::kernel::kallsyms::Kallsyms;

/// Drivers whose transmit function the kprobe backend probes, when the kernel has them.
const XMIT_FUNCTIONS: [&str; 3] = ["tun_net_xmit", "veth_xmit", "macvlan_start_xmit"];

#[derive(Clone, Copy, Debug, Default, PartialEq, Eq, clap::ValueEnum)]
pub enum Backend {
    /// Counter by counter, the tracepoints where they exist (cheaper, and never skipped
    /// for running inside another program), then kprobes where only kprobes can see it.
    #[default]
    Auto,
    Kprobe,
    Tracepoint,
}

impl Backend {
    /// The backends this kernel has what they need for (kprobes; the `consume_skb`
    /// tracepoint's `location`), so a test can require each of them to attach.
    #[must_use]
    pub fn available(kernel: &KernelInfo) -> Vec<Self> {
        let mut backends = Vec::new();
        if kernel.consume_has_location {
            backends.push(Self::Tracepoint);
        }
        if crate::bpf::kprobe::available() {
            backends.push(Self::Kprobe);
        }
        backends
    }
}

/// Why no backend uses fentry, for `doctor` and `auto`'s notes.
pub const FENTRY_NOT_OFFERED: &str = "not offered as a backend: tun is a kernel module \
     on most distributions, and aya 0.14 can load fentry programs only against vmlinux's BTF, \
     not a module's (/sys/kernel/btf/tun); --backend kprobe or tracepoint instead";

/// What feeds each group of counters, for `doctor`, `watch`, the JSON output and the
/// trace header. Drops and the queue state have one source on every backend.
#[derive(Clone, Debug, PartialEq, Eq)]
pub struct Sources {
    /// Driver calls: `xmit_calls`, `enqueued`, `busy`, and the bracket that ties a drop to
    /// the driver call in flight.
    pub xmit: Xmit,
    /// How a full ring is told from the driver's other drops: `dropped_full_ring`,
    /// `dropped_other`.
    pub drops: Drops,
    /// Reader takes: `consumed`, `reader_sleeps`.
    pub consumed: Consume,
    /// Packets put back while the queue was stopped: `requeued_stopped`.
    pub requeues: Requeues,
    /// Who woke the queue: `wakes_reader`, `wakes_vhost`, `wakes_forced`, `wakes_other`,
    /// `wakes_recheck`.
    pub wakes: Wakes,
    /// `ring_occupancy`.
    pub ring: Ring,
    /// Whether flows' order is followed (`reordered`, `flows_joined`).
    pub flows: bool,
    /// What the kernel says of the program runs it skipped.
    pub misses: Misses,
    /// Why a preferred source was not used.
    pub notes: Vec<String>,
}

/// What the kernel says of the runs of the programs it skipped (see
/// [`crate::bpf::missed`]): counts that may be short say so only where it counts them.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub struct Misses {
    /// The programs' `recursion_misses` (Linux 5.12+).
    pub runs: bool,
    /// The kprobes' own misses, through their links (Linux 6.7+).
    pub kprobes: bool,
}

/// How the drops inside the driver (`skb:kfree_skb` of the call in flight) are told apart.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Drops {
    /// By the reason the kernel gives, `SKB_DROP_REASON_FULL_RING` for a full ring.
    Reason,
    /// By the driver call's path, where the kernel gives no full-ring reason (before Linux
    /// 5.17, and until tun gave one): see [`tap_probe_common::DropClass::Path`]. A drop of a
    /// packet that had neither an owner nor a conntrack reference cannot be told, so
    /// `dropped_full_ring` may be short by the `unclassified` drops of `dropped_other`.
    Path,
}

impl Drops {
    /// How this kernel's drops are told apart.
    #[must_use]
    pub fn of(kernel: &KernelInfo) -> Self {
        if kernel.facts.drop_class == tap_probe_common::DropClass::Path as u32 {
            Self::Path
        } else {
            Self::Reason
        }
    }
}

/// Where packets put back by a stopped queue are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Requeues {
    /// A kprobe and a kretprobe on `sch_direct_xmit`: every requeue without a driver call.
    Kprobes,
    /// `qdisc:qdisc_dequeue`, each dequeue followed to the driver: blind to a packet put
    /// back from the bypass of an empty qdisc, which was never dequeued.
    DequeuePairs,
}

impl Requeues {
    /// Whether `requeued_stopped` may miss some (and by what).
    #[must_use]
    pub fn may_be_short(self) -> bool {
        self == Self::DequeuePairs
    }
}

/// Where wakes are told apart by who woke the queue.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Wakes {
    /// A kprobe on `netif_tx_wake_queue`; its stack is matched against these functions.
    Callers(Vec<String>),
    /// Only the `DRV_XOFF` transitions (`queue_wakes`): who woke is unknown.
    Inferred,
}

/// Where ring occupancy comes from.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Ring {
    /// The tap's `ptr_ring`, read at offsets from the BTF file `btf`, where `mode` says.
    Sampled {
        btf: String,
        mode: crate::bpf::probe::Occupancy,
    },
    /// Not sampled, and why.
    Unavailable(String),
}

/// Where driver calls are seen.
#[derive(Clone, Debug, PartialEq, Eq)]
pub enum Xmit {
    /// A kprobe and a kretprobe on each of these drivers' `ndo_start_xmit`.
    Kprobes(Vec<&'static str>),
    /// The `net:net_dev_start_xmit` and `net:net_dev_xmit` tracepoints.
    Tracepoints,
}

/// Where reader takes are seen.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub enum Consume {
    /// A kprobe on `consume_skb` that reads its caller's address from the stack.
    Kprobe,
    /// The `skb:consume_skb` tracepoint and its `location` argument.
    Tracepoint,
    /// Nowhere (`auto` on a kernel with neither, see the notes): `consumed` and
    /// `reader_sleeps` are unknown, every other counter is counted.
    Unavailable,
}

/// Drops: the only source of the drop reason.
const DROPS: &str = "tracepoint skb:kfree_skb";
/// The function every wake goes through.
const WAKE_FUNCTION: &str = "netif_tx_wake_queue";
/// The qdisc's transmit of dequeued (or bypassing) packets, which puts them back.
const DIRECT_XMIT_FUNCTION: &str = "sch_direct_xmit";
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

impl Sources {
    /// What the kernel says of skipped runs, as the sources' `missed` group says it.
    fn misses_text(&self) -> String {
        let kprobes = self.uses_kprobes();
        match (self.misses.runs, kprobes && !self.misses.kprobes) {
            (false, _) => "unknown: this kernel does not count the program runs it skips \
                           (bpf_prog_info.recursion_misses, Linux 5.12+), so counts may be \
                           short unseen"
                .to_owned(),
            (true, true) => "the programs' recursion_misses; not the kprobes' own (their \
                             links report them from Linux 6.7)"
                .to_owned(),
            (true, false) if kprobes => {
                "the programs' recursion_misses and the kprobes' own".to_owned()
            }
            (true, false) => "the programs' recursion_misses".to_owned(),
        }
    }
}

impl std::fmt::Display for Drops {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Reason => f.write_str(DROPS),
            Self::Path => write!(
                f,
                "{DROPS} without a full-ring reason (Linux < 5.17): a full ring told by the \
                 driver call's path, tun_net_xmit orphaning the packet right before its ring; \
                 dropped_full_ring may be short by drops of packets with neither an owner nor \
                 a conntrack reference (dropped_other, reason unclassified)"
            ),
        }
    }
}

impl std::fmt::Display for Consume {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kprobe => "kprobe consume_skb (caller address)",
            Self::Tracepoint => "tracepoint skb:consume_skb (location)",
            Self::Unavailable => {
                "not counted: the consume_skb tracepoint has no location (Linux < 6.3) and \
                 there are no kprobes"
            }
        })
    }
}

impl std::fmt::Display for Requeues {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(match self {
            Self::Kprobes => "kprobe+kretprobe sch_direct_xmit",
            Self::DequeuePairs => {
                "tracepoint qdisc:qdisc_dequeue followed to the driver (may be short by bypass \
                 requeues)"
            }
        })
    }
}

impl std::fmt::Display for Wakes {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Callers(functions) if functions.is_empty() => {
                write!(
                    f,
                    "kprobe {WAKE_FUNCTION} (no known waker in kallsyms: all other)"
                )
            }
            Self::Callers(functions) => write!(
                f,
                "kprobe {WAKE_FUNCTION}, by caller: {}",
                functions.join(", ")
            ),
            Self::Inferred => f.write_str(
                "not told apart (no kprobes): wakes only as DRV_XOFF transitions (queue_wakes)",
            ),
        }
    }
}

impl std::fmt::Display for Ring {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        match self {
            Self::Sampled { btf, mode } => match mode {
                crate::bpf::probe::Occupancy::Exact => write!(
                    f,
                    "ptr_ring read at each driver call and reader take (offsets from {btf})"
                ),
                _ => write!(
                    f,
                    "ptr_ring read where the queue stops and wakes, at a full-ring drop and \
                     once per refresh (offsets from {btf})"
                ),
            },
            Self::Unavailable(why) => write!(f, "not sampled: {why}"),
        }
    }
}

impl Sources {
    /// Whether any counter comes from a kprobe.
    #[must_use]
    pub(crate) fn uses_kprobes(&self) -> bool {
        matches!(self.xmit, Xmit::Kprobes(_))
            || self.consumed == Consume::Kprobe
            || self.requeues == Requeues::Kprobes
            || matches!(self.wakes, Wakes::Callers(_))
    }

    /// Whether `requeued_stopped` may miss packets put back from a qdisc's bypass (the
    /// tracepoint source); where it may not, `busy + requeued_stopped` is every requeue.
    #[must_use]
    pub fn requeues_may_be_short(&self) -> bool {
        self.requeues.may_be_short()
    }

    /// Whether wakes are told apart by who woke the queue (`wakes_*`).
    #[must_use]
    pub fn wakes_by_source(&self) -> bool {
        matches!(self.wakes, Wakes::Callers(_))
    }

    /// Whether the ring occupancy is sampled (on tun/tap devices).
    #[must_use]
    pub fn ring_sampled(&self) -> bool {
        matches!(self.ring, Ring::Sampled { .. })
    }

    /// The kind of hook behind each counter the programs count, as `counter=hook` pairs in
    /// the counter table's order: the trace header's record of what produced the events.
    /// A hook is `kprobe`, `tracepoint`, or `kprobe+tracepoint` for the queue state when
    /// driver calls come from kprobes (it is read after each call and at each dequeue).
    #[must_use]
    pub fn hooks(&self) -> String {
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
            Consume::Unavailable => "none",
        };
        let queue_state = match self.xmit {
            Xmit::Kprobes(_) => "kprobe+tracepoint",
            Xmit::Tracepoints => "tracepoint",
        };
        let requeues = match self.requeues {
            Requeues::Kprobes => "kprobe",
            Requeues::DequeuePairs => "tracepoint",
        };
        // Without the kprobe on the wake function, who woke is not counted at all.
        let wakes = match self.wakes {
            Wakes::Callers(_) => "kprobe",
            Wakes::Inferred => "none",
        };
        METRICS
            .iter()
            .filter_map(|m| {
                let Source::Programs { hook, .. } = m.source else {
                    return None;
                };
                let kind = match hook {
                    Hook::Xmit if m.requires == Requires::Flows && !self.flows => "none",
                    Hook::Xmit => xmit,
                    Hook::Drops => "tracepoint",
                    Hook::Consumed => consumed,
                    Hook::QueueState => queue_state,
                    Hook::Requeues => requeues,
                    Hook::Wakes => wakes,
                };
                Some((m.name, kind))
            })
            .collect()
    }

    /// Each group of counters: its JSON key, what it counts, and its source, in the order
    /// the JSON has them.
    #[must_use]
    pub fn groups(&self) -> [(&'static str, &'static str, String); 8] {
        [
            ("xmit", "driver calls", self.xmit.to_string()),
            ("drops", "drops", self.drops.to_string()),
            ("consumed", "reader takes", self.consumed.to_string()),
            ("queue_state", "queue state", QUEUE_STATE.to_owned()),
            (
                "requeued_stopped",
                "requeues while stopped",
                self.requeues.to_string(),
            ),
            ("wakes", "wakes by source", self.wakes.to_string()),
            ("ring_occupancy", "ring occupancy", self.ring.to_string()),
            ("missed", "skipped runs", self.misses_text()),
        ]
    }
}

impl std::fmt::Display for Sources {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        let groups = self.groups();
        for (i, (_, what, source)) in groups.iter().enumerate() {
            if i > 0 {
                f.write_str("; ")?;
            }
            write!(f, "{what}: {source}")?;
        }
        Ok(())
    }
}

impl Serialize for Sources {
    /// Each group's source as text, then the notes.
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        use serde::ser::SerializeStruct as _;
        let mut st = serializer.serialize_struct("Sources", 9)?;
        for (group, _, source) in self.groups() {
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
#[expect(
    clippy::too_many_lines,
    reason = "one decision per counter group, in the order the sources depend on each other"
)]
pub fn attach(
    ebpf: &mut Ebpf,
    kprobes: &mut Kprobes,
    backend: Backend,
    kernel: &KernelInfo,
) -> anyhow::Result<Sources> {
    let mut notes = Vec::new();
    if backend == Backend::Auto {
        notes.push(format!("fentry: {FENTRY_NOT_OFFERED}"));
    }
    let with_kprobes = matches!(backend, Backend::Auto | Backend::Kprobe);
    // The tracepoint programs read the kernel's structures through the BTF types of their
    // arguments (`tp_btf`): plain loads where a raw tracepoint needs a helper call per field.
    let btf = Btf::from_sys_fs().context("reading the kernel's BTF for the tracepoint programs")?;
    let btf = &btf;
    // The closing side of a driver call first: an opened bracket is always closed.
    attach_tp(ebpf, btf, PROG_KFREE_SKB)?;
    attach_tp(ebpf, btf, PROG_QDISC_DEQUEUE)?;

    // Driver calls and reader takes: the tracepoints first under auto. A kprobe does not
    // fire while another kprobe's handler runs on its CPU (`kprobe_running()`,
    // kernel/kprobes.c), and a kprobe program is skipped while another kprobe or perf-event
    // program runs (`bpf_prog_active`, kernel/trace/bpf_trace.c): a softirq that runs on an
    // interrupt's exit in the middle of a process-context kprobe program loses every driver
    // call it makes. A raw tracepoint program only ever skips itself.
    let no_location = || {
        anyhow!(
            "the consume_skb tracepoint has no location argument (Linux < 6.3), so it cannot \
             tell a reader's take from any other free"
        )
    };
    if matches!(backend, Backend::Tracepoint) && !kernel.consume_has_location {
        // What rules the backend out goes first: before 6.3 the xmit programs may not load
        // either (6.1's verifier refuses the typed ones), which would hide it.
        return Err(no_location()).context("nothing can count reader takes with tracepoints");
    }
    let xmit = match backend {
        Backend::Kprobe => Xmit::Kprobes(attach_xmit_kprobes(ebpf, kprobes, &kernel.kallsyms)?),
        Backend::Tracepoint => {
            attach_xmit_tracepoints(ebpf, btf)?;
            Xmit::Tracepoints
        }
        Backend::Auto => match attach_xmit_tracepoints(ebpf, btf) {
            Ok(()) => Xmit::Tracepoints,
            Err(err) => {
                notes.push(format!("xmit tracepoints: {err:#}"));
                Xmit::Kprobes(attach_xmit_kprobes(ebpf, kprobes, &kernel.kallsyms)?)
            }
        },
    };

    let consume_tracepoint = |ebpf: &mut Ebpf| {
        if kernel.consume_has_location {
            attach_tp(ebpf, btf, PROG_CONSUME_SKB)
        } else {
            Err(no_location())
        }
    };
    let consume_kprobe = |ebpf: &mut Ebpf, kprobes: &mut Kprobes| {
        kprobes.attach(ebpf, PROG_CONSUME_ENTRY, "consume_skb", false)
    };
    // Even the kprobe backend takes the reader's takes from the tracepoint where it can
    // (6.3+): a kprobe handler running in the reader's process context, right after the
    // reader woke the queue and so raised NET_TX, is where an interrupt's exit runs the
    // queue's drain, and every kprobe of that drain then does not fire (`kprobe_running()`,
    // kernel/kprobes.c): whole drains of driver calls went uncounted (64 at a time on 6.12
    // and 7.3); the kernel counts them only in each kprobe's `nmissed`. Where the
    // tracepoint cannot tell a take (before 6.3) the kprobe it is, and the kernel's tun
    // never wakes a queue there.
    let consumed = match backend {
        Backend::Kprobe if kernel.consume_has_location => {
            consume_tracepoint(ebpf)?;
            notes.push(
                "consume kprobe: not used where the consume_skb tracepoint has its location: \
                 a kprobe in the reader's context makes the kernel skip the driver-call \
                 kprobes of a queue drain run inside it"
                    .to_owned(),
            );
            Consume::Tracepoint
        }
        Backend::Kprobe => {
            consume_kprobe(ebpf, kprobes)?;
            Consume::Kprobe
        }
        Backend::Tracepoint => {
            consume_tracepoint(ebpf).context("nothing can count reader takes with tracepoints")?;
            Consume::Tracepoint
        }
        // A kernel with neither loses the reader's takes alone.
        Backend::Auto => match consume_tracepoint(ebpf) {
            Ok(()) => Consume::Tracepoint,
            Err(err) => {
                notes.push(format!("consume tracepoint: {err:#}"));
                match consume_kprobe(ebpf, kprobes) {
                    Ok(()) => Consume::Kprobe,
                    Err(err) => {
                        notes.push(format!("consume kprobe: {err:#}"));
                        Consume::Unavailable
                    }
                }
            }
        },
    };

    let requeues = match with_kprobes.then(|| attach_direct_xmit(ebpf, kprobes, &kernel.kallsyms)) {
        Some(Ok(())) => Requeues::Kprobes,
        Some(Err(err)) if backend == Backend::Kprobe => return Err(err),
        failed => {
            if let Some(Err(err)) = failed {
                notes.push(format!("requeue kprobes: {err:#}"));
            }
            set(ebpf, SETTING_DEQUEUE_PAIRS)?;
            Requeues::DequeuePairs
        }
    };

    let wakes = match with_kprobes.then(|| attach_wake(ebpf, kprobes, kernel)) {
        Some(Ok(functions)) => Wakes::Callers(functions),
        Some(Err(err)) if backend == Backend::Kprobe => return Err(err),
        failed => {
            if let Some(Err(err)) = failed {
                notes.push(format!("wake kprobe: {err:#}"));
            }
            Wakes::Inferred
        }
    };

    let ring = match &kernel.ring_facts {
        Ok(btf) => Ring::Sampled {
            btf: btf.clone(),
            mode: crate::bpf::probe::Occupancy::Events,
        },
        Err(why) => Ring::Unavailable(why.clone()),
    };
    Ok(Sources {
        xmit,
        drops: Drops::of(kernel),
        consumed,
        requeues,
        wakes,
        ring,
        flows: true,
        // Asked of the loaded programs by the probe (see `Probe::attach_backend`).
        misses: Misses {
            runs: false,
            kprobes: false,
        },
        notes,
    })
}

/// The kretprobe, then the kprobe, on `sch_direct_xmit` (so every recorded entry meets
/// its return).
fn attach_direct_xmit(
    ebpf: &mut Ebpf,
    kprobes: &mut Kprobes,
    kallsyms: &Kallsyms,
) -> anyhow::Result<()> {
    require_kprobes()?;
    if !kallsyms.has(DIRECT_XMIT_FUNCTION) {
        bail!("{DIRECT_XMIT_FUNCTION} is not in /proc/kallsyms");
    }
    kprobes.attach(ebpf, PROG_DIRECT_XMIT_RETURN, DIRECT_XMIT_FUNCTION, true)?;
    kprobes.attach(ebpf, PROG_DIRECT_XMIT_ENTRY, DIRECT_XMIT_FUNCTION, false)
}

/// The kprobe on `netif_tx_wake_queue`; from then on it records the wake events (see
/// `SETTING_WAKE_EVENTS`). Returns the wakers it tells apart.
fn attach_wake(
    ebpf: &mut Ebpf,
    kprobes: &mut Kprobes,
    kernel: &KernelInfo,
) -> anyhow::Result<Vec<String>> {
    require_kprobes()?;
    if !kernel.kallsyms.has(WAKE_FUNCTION) {
        bail!("{WAKE_FUNCTION} is not in /proc/kallsyms");
    }
    kprobes.attach(ebpf, PROG_WAKE_ENTRY, WAKE_FUNCTION, false)?;
    set(ebpf, SETTING_WAKE_EVENTS)?;
    // One name per function and class: `.cold` parts and clones are the same function.
    let mut functions: Vec<String> = Vec::new();
    for (range, class) in &kernel.wake_ranges {
        let base = range.name.split('.').next().unwrap_or(&range.name);
        let name = format!("{base} ({})", wake_class_name(*class));
        if !functions.contains(&name) {
            functions.push(name);
        }
    }
    Ok(functions)
}

/// The counter a wake of `class` lands in, without its `wakes_` prefix.
#[must_use]
pub(crate) fn wake_class_name(class: tap_probe_common::WakeClass) -> &'static str {
    use tap_probe_common::WakeClass;
    match class {
        WakeClass::Reader => "reader",
        WakeClass::Vhost => "vhost",
        WakeClass::Forced => "forced",
        WakeClass::Recheck => "recheck",
        WakeClass::Other => "other",
    }
}

fn require_kprobes() -> anyhow::Result<()> {
    if crate::bpf::kprobe::available() {
        Ok(())
    } else {
        bail!("this kernel has no kprobes ({KPROBE_PMU} is missing: CONFIG_KPROBES is off)")
    }
}

/// Turns on switch `index` of the programs' `SETTINGS`.
///
/// # Errors
/// When the map is missing or refuses the update.
pub fn set(ebpf: &mut Ebpf, index: u32) -> anyhow::Result<()> {
    let mut settings: Array<&mut MapData, u32> = Array::try_from(
        ebpf.map_mut(MAP_SETTINGS)
            .ok_or_else(|| anyhow!("map {MAP_SETTINGS} missing from the eBPF object"))?,
    )?;
    settings.set(index, 1, 0)?;
    Ok(())
}

/// The closing side of a driver call first: an opened bracket is always closed.
fn attach_xmit_tracepoints(ebpf: &mut Ebpf, btf: &Btf) -> anyhow::Result<()> {
    attach_tp(ebpf, btf, PROG_XMIT)?;
    attach_tp(ebpf, btf, PROG_START_XMIT)
}

/// Loads a `tp_btf` program against the kernel's BTF of `tracepoint` and attaches it.
fn attach_tp(ebpf: &mut Ebpf, btf: &Btf, (name, tracepoint): (&str, &str)) -> anyhow::Result<()> {
    let program: &mut BtfTracePoint = ebpf
        .program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the eBPF object"))?
        .try_into()?;
    program
        .load(tracepoint, btf)
        .with_context(|| format!("loading {name} (BTF tracepoint {tracepoint})"))?;
    program
        .attach()
        .with_context(|| format!("attaching to BTF tracepoint {tracepoint}"))?;
    Ok(())
}

/// Probes the return, then the entry, of every driver transmit function present; the
/// returns first so that every recorded entry meets its return.
fn attach_xmit_kprobes(
    ebpf: &mut Ebpf,
    kprobes: &mut Kprobes,
    kallsyms: &Kallsyms,
) -> anyhow::Result<Vec<&'static str>> {
    require_kprobes()?;
    let present: Vec<&str> = XMIT_FUNCTIONS
        .into_iter()
        .filter(|f| kallsyms.has(f))
        .collect();
    if !present.contains(&"tun_net_xmit") {
        bail!("tun_net_xmit is not in /proc/kallsyms: is the tun module loaded? (modprobe tun)");
    }
    for function in &present {
        kprobes.attach(ebpf, PROG_XMIT_RETURN, function, true)?;
    }
    for function in &present {
        kprobes.attach(ebpf, PROG_XMIT_ENTRY, function, false)?;
    }
    Ok(present)
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn sources_read_as_before_and_name_their_hooks() {
        let sources = Sources {
            xmit: Xmit::Kprobes(vec!["tun_net_xmit", "veth_xmit"]),
            drops: Drops::Reason,
            consumed: Consume::Tracepoint,
            requeues: Requeues::DequeuePairs,
            wakes: Wakes::Inferred,
            ring: Ring::Sampled {
                btf: "/sys/kernel/btf/tun".to_owned(),
                mode: crate::bpf::probe::Occupancy::Exact,
            },
            flows: false,
            misses: Misses {
                runs: true,
                kprobes: false,
            },
            notes: vec!["fentry: no".to_owned()],
        };
        // The groups that were there keep their keys and texts.
        assert_eq!(
            serde_json::to_string(&sources).unwrap(),
            r#"{"xmit":"kprobe+kretprobe tun_net_xmit, veth_xmit","drops":"tracepoint skb:kfree_skb","consumed":"tracepoint skb:consume_skb (location)","queue_state":"after each driver call, and tracepoint qdisc:qdisc_dequeue","requeued_stopped":"tracepoint qdisc:qdisc_dequeue followed to the driver (may be short by bypass requeues)","wakes":"not told apart (no kprobes): wakes only as DRV_XOFF transitions (queue_wakes)","ring_occupancy":"ptr_ring read at each driver call and reader take (offsets from /sys/kernel/btf/tun)","missed":"the programs' recursion_misses; not the kprobes' own (their links report them from Linux 6.7)","notes":["fentry: no"]}"#
        );
        assert_eq!(
            sources.hooks(),
            "xmit_calls=kprobe, enqueued=kprobe, busy=kprobe, requeued_stopped=tracepoint, \
             dropped_full_ring=tracepoint, dropped_other=tracepoint, reordered=none, \
             flows_joined=none, consumed=tracepoint, \
             queue_stops=kprobe+tracepoint, queue_wakes=kprobe+tracepoint, wakes_reader=none, \
             wakes_vhost=none, wakes_forced=none, wakes_other=none, wakes_recheck=none, \
             stopped_ns=kprobe+tracepoint, reader_sleeps=tracepoint"
        );
        assert!(sources.requeues.may_be_short());
        let wakes = Wakes::Callers(vec!["__tun_wake_queue (reader)".to_owned()]);
        assert_eq!(
            wakes.to_string(),
            "kprobe netif_tx_wake_queue, by caller: __tun_wake_queue (reader)"
        );
    }
}
