//! `tap-probe doctor`: what this kernel allows, tried rather than guessed, and which probe
//! backend `watch` would use. Every check is independent: one that fails is reported and the
//! others still run.

use std::process::ExitCode;

use anyhow::{Result, anyhow};
use serde::Serialize;
use tap_probe_common::KernelFacts;

use crate::output::Format;
use tap_probe_observer::bpf::backend::Sources;
use tap_probe_observer::bpf::probe::Probe;
use tap_probe_observer::kernel::kallsyms::Kallsyms;
use tap_probe_observer::kernel::{KernelInfo, TunBackpressure, Unsupported};
use tap_probe_observer::kernel::{btf, kallsyms, privileges};

mod render;
mod trials;

use render::render_table;
use trials::{attach_trials, doctor_object};

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Output format.
    #[arg(long, value_enum, default_value_t)]
    format: Format,
}

/// Functions of the tun/tap transmit and read paths worth knowing about. The last ones exist
/// only on kernels with the tun/tap "avoid tail-drop" series, or where they are not inlined.
const FUNCTIONS: &[&str] = &[
    "tun_net_xmit",
    "veth_xmit",
    "macvlan_start_xmit",
    "tun_do_read",
    "tap_do_read",
    "tun_ring_consume",
    "tap_ring_consume",
    "__tun_wake_queue",
    "tun_wake_queue",
    "tun_force_wake_queue",
    "netif_tx_wake_queue",
    "sch_direct_xmit",
    "ptr_ring_consume_batched",
];

/// Raw tracepoints the tracepoint backend uses.
const TRACEPOINTS: &[&str] = &[
    "net_dev_xmit",
    "net_dev_start_xmit",
    "kfree_skb",
    "consume_skb",
    "qdisc_dequeue",
];

/// How one check, attach trial or tracepoint went.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum CheckStatus {
    Ok,
    Failed,
    Skipped,
}

impl CheckStatus {
    fn label(self) -> &'static str {
        match self {
            Self::Ok => "ok",
            Self::Failed => "FAILED",
            Self::Skipped => "skipped",
        }
    }
}

#[derive(Debug, Serialize)]
struct Check {
    status: CheckStatus,
    detail: String,
}

impl Check {
    fn ok(detail: impl Into<String>) -> Self {
        Self {
            status: CheckStatus::Ok,
            detail: detail.into(),
        }
    }

    fn failed(err: &anyhow::Error) -> Self {
        Self {
            status: CheckStatus::Failed,
            detail: format!("{err:#}"),
        }
    }
}

/// The attach types tried, in the order `watch` prefers them.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum AttachKind {
    Kprobe,
    Fentry,
    RawTp,
    TpBtf,
    Tracepoint,
}

impl AttachKind {
    const ALL: [Self; 5] = [
        Self::RawTp,
        Self::TpBtf,
        Self::Tracepoint,
        Self::Kprobe,
        Self::Fentry,
    ];

    fn label(self) -> &'static str {
        match self {
            Self::Kprobe => "kprobe",
            Self::Fentry => "fentry",
            Self::RawTp => "raw_tp",
            Self::TpBtf => "tp_btf",
            Self::Tracepoint => "tracepoint",
        }
    }

    fn program(self) -> &'static str {
        match self {
            Self::Kprobe => "doctor_kprobe",
            Self::Fentry => "doctor_fentry",
            Self::RawTp => "doctor_raw_tp",
            Self::TpBtf => "doctor_tp_btf",
            Self::Tracepoint => "doctor_tracepoint",
        }
    }

    fn target(self) -> &'static str {
        match self {
            Self::Kprobe => "tun_net_xmit",
            // In vmlinux, whose BTF aya loads fentry programs against; tun's functions are in
            // the module's BTF (see `FENTRY_NOT_OFFERED`).
            Self::Fentry => "consume_skb",
            Self::RawTp | Self::TpBtf => "net_dev_xmit",
            Self::Tracepoint => "net:net_dev_xmit",
        }
    }
}

#[derive(Debug, Serialize)]
struct Trial {
    kind: AttachKind,
    program: &'static str,
    target: &'static str,
    status: CheckStatus,
    /// Which step failed: `object`, `load` or `attach`.
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What `watch --backend auto` attaches here: each counter's source, or why none works.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum AutoBackend {
    Sources {
        #[serde(flatten)]
        sources: Sources,
        /// The kernel memory the probe's maps hold with no device tracked, by map.
        #[serde(skip_serializing_if = "Option::is_none")]
        memory: Option<tap_probe_observer::bpf::probe::Memory>,
    },
    Failed {
        error: String,
    },
}

#[derive(Debug, Serialize)]
struct Function {
    name: &'static str,
    /// Hex address of the symbol itself, `None` when absent (or inlined).
    address: Option<String>,
    #[serde(skip_serializing_if = "Option::is_none")]
    module: Option<String>,
    /// Compiler-made parts and clones: `.cold`, `.isra.N`, `.constprop.N`.
    variants: Vec<String>,
}

#[derive(Debug, Serialize)]
struct Tracepoint {
    name: &'static str,
    status: CheckStatus,
    /// `(name, C type)`, without the probe's leading `void *` context.
    args: Vec<Argument>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

#[derive(Debug, Serialize)]
struct Argument {
    name: String,
    r#type: String,
}

#[derive(Debug, Serialize)]
struct Range {
    name: String,
    start: String,
    end: String,
    len: u64,
}

/// [`KernelFacts`] without the reader ranges (reported on their own), in declaration order.
#[derive(Debug)]
struct Facts(KernelFacts);

impl Facts {
    fn fields(&self) -> [(&'static str, u32); 15] {
        let f = &self.0;
        [
            ("skb_dev", f.skb_dev),
            ("skb_queue_mapping", f.skb_queue_mapping),
            ("dev_ifindex", f.dev_ifindex),
            ("dev_net", f.dev_net),
            ("net_inum", f.net_inum),
            ("dev_tx", f.dev_tx),
            ("dev_netdev_ops", f.dev_netdev_ops),
            ("ops_start_xmit", f.ops_start_xmit),
            ("dev_num_tx_queues", f.dev_num_tx_queues),
            ("txq_size", f.txq_size),
            ("txq_state", f.txq_state),
            ("txq_dev", f.txq_dev),
            ("reason_full_ring", f.reason_full_ring),
            ("tx_busy", f.tx_busy),
            ("drv_xoff_mask", f.drv_xoff_mask),
        ]
    }
}

impl Serialize for Facts {
    fn serialize<S: serde::Serializer>(&self, serializer: S) -> Result<S::Ok, S::Error> {
        serializer.collect_map(self.fields())
    }
}

/// What this kernel's tun does with a full ring, and whether taps can opt in.
#[derive(Debug, Serialize)]
struct Tun {
    /// TUNGETFEATURES on `/dev/net/tun`, in hex.
    features: Check,
    /// Whether TUNSETIFF takes `IFF_BACKPRESSURE` (older kernels ignore it silently).
    iff_backpressure: bool,
    /// `never` (tail-drop), `always` (the series as posted), `opt_in` (per tap, 7.3);
    /// `null` when unknown.
    backpressure: Option<TunBackpressure>,
    /// Where the ring offsets come from, or why there are none.
    ring_offsets: Check,
}

/// Everything `doctor` found, printed as a table or as JSON.
#[derive(Debug, Serialize)]
struct Diagnosis {
    kernel_release: Check,
    btf: Check,
    tracefs: Check,
    capabilities: Check,
    ebpf_object: Check,
    tun: Option<Tun>,
    attach: Vec<Trial>,
    /// Why `--backend` has no fentry value, whatever the fentry trial says.
    fentry_backend: &'static str,
    backend: AutoBackend,
    kallsyms: Check,
    functions: Vec<Function>,
    tracepoints: Vec<Tracepoint>,
    kernel_facts: Check,
    #[serde(skip_serializing_if = "Option::is_none")]
    facts: Option<Facts>,
    reader_ranges: Vec<Range>,
}

/// Runs `tap-probe doctor`: the whole report, also on a kernel tap-probe cannot watch at
/// all, which then ends it with one line saying what the kernel lacks and exit status 2.
///
/// # Errors
/// Only when the report cannot be written; failed checks are part of the report.
pub(crate) fn run(args: &Args) -> Result<ExitCode> {
    let (diagnosis, unsupported) = collect();
    crate::output::stdout(&match args.format {
        Format::Table => render_table(&diagnosis),
        Format::Json => serde_json::to_string_pretty(&diagnosis)? + "\n",
    })?;
    Ok(match unsupported {
        Some(why) => {
            eprintln!("tap-probe: error: {why}");
            ExitCode::from(2)
        }
        None => ExitCode::SUCCESS,
    })
}

fn collect() -> (Diagnosis, Option<Unsupported>) {
    let kernel_release = match std::fs::read_to_string("/proc/sys/kernel/osrelease") {
        Ok(release) => Check::ok(release.trim()),
        Err(err) => Check::failed(&anyhow!(err).context("reading /proc/sys/kernel/osrelease")),
    };

    let vmlinux = btf::load_vmlinux();
    let btf_check = match &vmlinux {
        Ok(_) => Check::ok(btf::VMLINUX_BTF),
        Err(err) => Check::failed(err),
    };

    let capabilities = match privileges::check() {
        Ok(()) => Check::ok("CAP_BPF, CAP_PERFMON, CAP_NET_ADMIN"),
        Err(err) => Check::failed(&err),
    };
    privileges::raise_memlock();

    // Before any classic tracepoint attach: aya looks tracefs up once per process.
    let tracefs = match privileges::mounted_tracefs() {
        Some(path) => Check::ok(format!("{} (already mounted)", path.display())),
        None => match privileges::ensure_tracefs() {
            Ok(path) => Check::ok(format!("{} (mounted by doctor)", path.display())),
            Err(err) => Check::failed(&err),
        },
    };

    let syms = Kallsyms::read();
    let btf_missing = !std::path::Path::new(btf::VMLINUX_BTF).exists();
    let unsupported = match &syms {
        Ok(syms) => Unsupported::of(btf_missing, syms),
        Err(_) => btf_missing.then_some(Unsupported::NoBtf),
    };
    let (kallsyms_check, functions) = match &syms {
        Ok(syms) => (
            Check::ok(kallsyms::KALLSYMS),
            FUNCTIONS.iter().map(|name| function(syms, name)).collect(),
        ),
        Err(err) => (Check::failed(err), Vec::new()),
    };

    // Built as `watch` builds it, from the BTF and kallsyms read above; without kallsyms
    // the facts still come from BTF, with no reader ranges.
    let kernel = vmlinux
        .as_ref()
        .map_err(|e| anyhow!("{e:#}"))
        .and_then(|btf| KernelInfo::from_parts(btf, syms.unwrap_or_default()));
    let kernel_facts = match &kernel {
        Ok(_) => Check::ok("read from BTF"),
        Err(err) => Check::failed(err),
    };
    let facts = kernel.as_ref().ok().map(|k| k.facts);
    let tun = kernel.as_ref().ok().map(tun_report);
    let named_ranges = kernel
        .as_ref()
        .map(|k| k.reader_ranges.clone())
        .unwrap_or_default();

    let tracepoints = TRACEPOINTS
        .iter()
        .map(|name| tracepoint(vmlinux.as_ref().ok(), name))
        .collect();

    let (ebpf_object, attach) = attach_trials(doctor_object());
    // Tried, not guessed: the same selection `watch` makes.
    let backend = match &kernel {
        Ok(kernel) => {
            match Probe::attach_backend(
                kernel,
                tap_probe_observer::bpf::backend::Backend::Auto,
                tap_probe_observer::bpf::probe::Counting::WATCH,
            ) {
                Ok(probe) => AutoBackend::Sources {
                    sources: probe.sources().clone(),
                    memory: probe.memory().ok(),
                },
                Err(err) => AutoBackend::Failed {
                    error: format!("{err:#}"),
                },
            }
        }
        Err(_) => AutoBackend::Failed {
            error: "no kernel facts".to_owned(),
        },
    };

    let diagnosis = Diagnosis {
        kernel_release,
        btf: btf_check,
        tracefs,
        capabilities,
        ebpf_object,
        tun,
        attach,
        fentry_backend: tap_probe_observer::bpf::backend::FENTRY_NOT_OFFERED,
        backend,
        kallsyms: kallsyms_check,
        functions,
        tracepoints,
        kernel_facts,
        facts: facts.map(Facts),
        reader_ranges: named_ranges
            .iter()
            .map(|r| Range {
                name: r.name.clone(),
                start: format!("{:#x}", r.range.start),
                end: format!("{:#x}", r.range.end),
                len: r.range.end - r.range.start,
            })
            .collect(),
    };
    (diagnosis, unsupported)
}

fn tun_report(kernel: &KernelInfo) -> Tun {
    let features = match &kernel.tun_features {
        Ok(features) => Check::ok(format!("{features:#06x}")),
        Err(err) => Check::failed(&anyhow!("{err}")),
    };
    let iff_backpressure = kernel.tun_backpressure == Some(TunBackpressure::OptIn);
    let ring_offsets = match &kernel.ring_facts {
        Ok(from) => Check::ok(format!(
            "from {from}: tun_file.tx_ring at {}, netdev_priv at {}",
            kernel.facts.ring.tfile_tx_ring, kernel.facts.ring.dev_priv
        )),
        Err(err) => Check::failed(&anyhow!("{err}")),
    };
    Tun {
        features,
        iff_backpressure,
        backpressure: kernel.tun_backpressure,
        ring_offsets,
    }
}

fn function(syms: &Kallsyms, name: &'static str) -> Function {
    let variants = syms.variants(name);
    let exact = variants.iter().find(|s| s.name == name);
    Function {
        name,
        address: exact.map(|s| format!("{:#x}", s.address)),
        module: exact.and_then(|s| s.module.clone()),
        variants: variants
            .iter()
            .filter(|s| s.name != name)
            .map(|s| s.name.clone())
            .collect(),
    }
}

fn tracepoint(vmlinux: Option<&btf_rs::Btf>, name: &'static str) -> Tracepoint {
    let Some(vmlinux) = vmlinux else {
        return Tracepoint {
            name,
            status: CheckStatus::Skipped,
            args: Vec::new(),
            error: Some("no kernel BTF".to_owned()),
        };
    };
    match btf::tracepoint_args(vmlinux, name) {
        Ok(args) => Tracepoint {
            name,
            status: CheckStatus::Ok,
            args: args
                .into_iter()
                .map(|(name, r#type)| Argument { name, r#type })
                .collect(),
            error: None,
        },
        Err(err) => Tracepoint {
            name,
            status: CheckStatus::Failed,
            args: Vec::new(),
            error: Some(format!("{err:#}")),
        },
    }
}
