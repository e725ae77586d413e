//! `tap-probe doctor`: what this kernel allows, tried rather than guessed, and which probe
//! backend `watch` would use. Every check is independent: one that fails is reported and the
//! others still run.

use std::fmt::Write as _;

use anyhow::{Result, anyhow};
use aya::programs::{BtfTracePoint, FEntry, KProbe, Program, RawTracePoint, TracePoint};
use serde::Serialize;
use tap_probe_common::{GLOBAL_KERNEL, KernelFacts};

use crate::backend::Sources;
use crate::cli::Format;
use crate::kallsyms::Kallsyms;
use crate::kernel::KernelInfo;
use crate::probe::Probe;
use crate::table::Table;
use crate::{btf, kallsyms, privileges};

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
    "tun_do_read",
    "tap_do_read",
    "tun_ring_consume",
    "tap_ring_consume",
    "__tun_wake_queue",
    "netif_tx_wake_queue",
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

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize)]
#[serde(rename_all = "snake_case")]
enum Status {
    Ok,
    Failed,
    Skipped,
}

impl Status {
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
    status: Status,
    detail: String,
}

impl Check {
    fn ok(detail: impl Into<String>) -> Self {
        Self {
            status: Status::Ok,
            detail: detail.into(),
        }
    }

    fn failed(err: &anyhow::Error) -> Self {
        Self {
            status: Status::Failed,
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
            Self::Kprobe | Self::Fentry => "tun_net_xmit",
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
    status: Status,
    /// Which step failed: `object`, `load` or `attach`.
    #[serde(skip_serializing_if = "Option::is_none")]
    stage: Option<&'static str>,
    #[serde(skip_serializing_if = "Option::is_none")]
    error: Option<String>,
}

/// What `watch --backend auto` attaches here: each counter's source, or why none works.
#[derive(Debug, Serialize)]
#[serde(untagged)]
enum Backend {
    Sources(Sources),
    Failed { error: String },
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
    status: Status,
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
    fn fields(&self) -> [(&'static str, u32); 12] {
        let f = &self.0;
        [
            ("skb_dev", f.skb_dev),
            ("skb_queue_mapping", f.skb_queue_mapping),
            ("dev_ifindex", f.dev_ifindex),
            ("dev_net", f.dev_net),
            ("net_inum", f.net_inum),
            ("dev_tx", f.dev_tx),
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

#[derive(Debug, Serialize)]
struct Report {
    kernel_release: Check,
    btf: Check,
    tracefs: Check,
    capabilities: Check,
    ebpf_object: Check,
    attach: Vec<Trial>,
    backend: Backend,
    kallsyms: Check,
    functions: Vec<Function>,
    tracepoints: Vec<Tracepoint>,
    kernel_facts: Check,
    #[serde(skip_serializing_if = "Option::is_none")]
    facts: Option<Facts>,
    reader_ranges: Vec<Range>,
}

/// Runs `tap-probe doctor`.
///
/// # Errors
/// Only when the report cannot be written; failed checks are part of the report.
pub(crate) fn run(args: &Args) -> Result<()> {
    let report = collect();
    crate::output::stdout(&match args.format {
        Format::Table => render_table(&report),
        Format::Json => serde_json::to_string_pretty(&report)? + "\n",
    })
}

fn collect() -> Report {
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
    let named_ranges = kernel
        .as_ref()
        .map(|k| k.reader_ranges.clone())
        .unwrap_or_default();

    let tracepoints = TRACEPOINTS
        .iter()
        .map(|name| tracepoint(vmlinux.as_ref().ok(), name))
        .collect();

    let (ebpf_object, attach) = attach_trials(tap_probe_ebpf_object(), facts.as_ref());
    // Tried, not guessed: the same selection `watch` makes.
    let backend = match &kernel {
        Ok(kernel) => match Probe::attach_backend(kernel, crate::backend::Backend::Auto, false) {
            Ok(probe) => Backend::Sources(probe.sources().clone()),
            Err(err) => Backend::Failed {
                error: format!("{err:#}"),
            },
        },
        Err(_) => Backend::Failed {
            error: "no kernel facts".to_owned(),
        },
    };

    Report {
        kernel_release,
        btf: btf_check,
        tracefs,
        capabilities,
        ebpf_object,
        attach,
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
    }
}

/// Runs every attach trial, or skips them all when the object is empty (`AYA_BUILD_SKIP`).
fn attach_trials(object: &[u8], facts: Option<&KernelFacts>) -> (Check, Vec<Trial>) {
    if object.is_empty() {
        let why = "eBPF object not built (AYA_BUILD_SKIP); attach trials skipped";
        let trials = AttachKind::ALL
            .iter()
            .map(|&kind| Trial {
                kind,
                program: kind.program(),
                target: kind.target(),
                status: Status::Skipped,
                stage: None,
                error: Some(why.to_owned()),
            })
            .collect();
        let check = Check {
            status: Status::Skipped,
            detail: why.to_owned(),
        };
        return (check, trials);
    }
    // The doctor programs read nothing from the facts; zeroes do if BTF failed.
    let facts = facts.copied().unwrap_or_default();
    let trials = AttachKind::ALL
        .iter()
        .map(|&kind| trial(kind, object, &facts))
        .collect();
    (Check::ok(format!("{} bytes", object.len())), trials)
}

/// The object bytes; a seam so the skipped path is what an `AYA_BUILD_SKIP` build shows.
fn tap_probe_ebpf_object() -> &'static [u8] {
    crate::ebpf_object()
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
            status: Status::Skipped,
            args: Vec::new(),
            error: Some("no kernel BTF".to_owned()),
        };
    };
    match btf::tracepoint_args(vmlinux, name) {
        Ok(args) => Tracepoint {
            name,
            status: Status::Ok,
            args: args
                .into_iter()
                .map(|(name, r#type)| Argument { name, r#type })
                .collect(),
            error: None,
        },
        Err(err) => Tracepoint {
            name,
            status: Status::Failed,
            args: Vec::new(),
            error: Some(format!("{err:#}")),
        },
    }
}

/// An error and its sources on one string, skipping a source its parent already quotes
/// (aya's `LoadError` prints its `io::Error` and also returns it as the source).
fn error_text(err: &(dyn std::error::Error + 'static)) -> String {
    let mut text = err.to_string();
    let mut source = err.source();
    while let Some(cause) = source {
        let cause_text = cause.to_string();
        if !text.contains(&cause_text) {
            let _ = write!(text, ": {cause_text}");
        }
        source = cause.source();
    }
    // aya appends the verifier log even when the kernel wrote none.
    text.trim_end()
        .trim_end_matches(" Verifier output:")
        .to_owned()
}

/// Loads the object, then loads and attaches `kind`'s program, then detaches and unloads it.
fn trial(kind: AttachKind, object: &[u8], facts: &KernelFacts) -> Trial {
    let outcome = try_trial(kind, object, facts);
    let (status, stage, error) = match outcome {
        Ok(()) => (Status::Ok, None, None),
        Err((stage, error)) => (Status::Failed, Some(stage), Some(error)),
    };
    Trial {
        kind,
        program: kind.program(),
        target: kind.target(),
        status,
        stage,
        error,
    }
}

type TrialError = (&'static str, String);

fn try_trial(kind: AttachKind, object: &[u8], facts: &KernelFacts) -> Result<(), TrialError> {
    let object_err = |e: &(dyn std::error::Error + 'static)| ("object", error_text(e));
    let load_err = |e: aya::programs::ProgramError| ("load", error_text(&e));
    let attach_err = |e: aya::programs::ProgramError| ("attach", error_text(&e));

    let mut ebpf = aya::EbpfLoader::new()
        .override_global(GLOBAL_KERNEL, facts, true)
        .load(object)
        .map_err(|e| object_err(&e))?;
    let program: &mut Program = ebpf.program_mut(kind.program()).ok_or_else(|| {
        (
            "object",
            format!("the eBPF object has no program {}", kind.program()),
        )
    })?;
    let sys_btf = || aya::Btf::from_sys_fs().map_err(|e| ("load", error_text(&e)));
    match kind {
        AttachKind::RawTp => {
            let p: &mut RawTracePoint = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach(kind.target()).map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::TpBtf => {
            let btf = sys_btf()?;
            let p: &mut BtfTracePoint = program.try_into().map_err(load_err)?;
            p.load(kind.target(), &btf).map_err(load_err)?;
            let link = p.attach().map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Tracepoint => {
            let p: &mut TracePoint = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach("net", "net_dev_xmit").map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Kprobe => {
            let p: &mut KProbe = program.try_into().map_err(load_err)?;
            p.load().map_err(load_err)?;
            let link = p.attach(kind.target(), 0).map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
        AttachKind::Fentry => {
            let btf = sys_btf()?;
            let p: &mut FEntry = program.try_into().map_err(load_err)?;
            p.load(kind.target(), &btf).map_err(load_err)?;
            let link = p.attach().map_err(attach_err)?;
            p.detach(link).map_err(attach_err)?;
            p.unload().map_err(load_err)
        }
    }
}

/// Lays out rows as left-aligned columns.
fn columns(out: &mut String, indent: &'static str, rows: &[Vec<String>]) {
    let mut table = Table::new(&[]).indent(indent);
    for row in rows {
        table.row(row.clone());
    }
    out.push_str(&table.render());
}

/// `struct sk_buff *skb`, `int rc`: how C spells a parameter.
fn c_declaration(ty: &str, name: &str) -> String {
    if ty.ends_with('*') {
        format!("{ty}{name}")
    } else {
        format!("{ty} {name}")
    }
}

/// One line, at most `max` characters: verifier logs are long and multi-line.
fn one_line(text: &str, max: usize) -> String {
    let flat = text.split_whitespace().collect::<Vec<_>>().join(" ");
    if flat.chars().count() <= max {
        flat
    } else {
        flat.chars().take(max).collect::<String>() + "..."
    }
}

fn render_table(r: &Report) -> String {
    let mut out = String::new();
    let check_row = |name: &str, c: &Check| {
        vec![
            name.to_owned(),
            c.status.label().to_owned(),
            one_line(&c.detail, 200),
        ]
    };
    columns(
        &mut out,
        "",
        &[
            check_row("kernel", &r.kernel_release),
            check_row("btf", &r.btf),
            check_row("tracefs", &r.tracefs),
            check_row("capabilities", &r.capabilities),
            check_row("kallsyms", &r.kallsyms),
            check_row("kernel facts", &r.kernel_facts),
            check_row("eBPF object", &r.ebpf_object),
        ],
    );

    out.push_str("\nattach trials (load, attach, detach)\n");
    let rows: Vec<Vec<String>> = r
        .attach
        .iter()
        .map(|t| {
            let mut detail = String::new();
            if let Some(stage) = t.stage {
                let _ = write!(detail, "at {stage}: ");
            }
            detail.push_str(&one_line(t.error.as_deref().unwrap_or(""), 160));
            vec![
                t.kind.label().to_owned(),
                t.target.to_owned(),
                t.status.label().to_owned(),
                detail,
            ]
        })
        .collect();
    columns(&mut out, "  ", &rows);
    match &r.backend {
        Backend::Sources(sources) => {
            let _ = writeln!(out, "\nwatch --backend auto attaches:");
            let what = ["driver calls", "drops", "reader takes", "queue state"];
            let rows: Vec<Vec<String>> = what
                .iter()
                .zip(sources.groups())
                .map(|(what, (_, source))| vec![(*what).to_owned(), source])
                .collect();
            columns(&mut out, "  ", &rows);
            for note in &sources.notes {
                let _ = writeln!(out, "  not used: {note}");
            }
        }
        Backend::Failed { error } => {
            let _ = writeln!(out, "\nwatch --backend auto: FAILED  {error}");
        }
    }

    render_kallsyms(&mut out, r);
    out
}

/// The kallsyms and BTF parts of the table.
fn render_kallsyms(out: &mut String, r: &Report) {
    out.push_str("\nkernel functions (kallsyms)\n");
    if r.kallsyms.status != Status::Ok {
        out.push_str("  unavailable: see kallsyms above\n");
    }
    let rows: Vec<Vec<String>> = r
        .functions
        .iter()
        .map(|f| {
            let mut extra = f.variants.join(" ");
            if let Some(module) = &f.module {
                extra = format!("[{module}] {extra}");
            }
            vec![
                f.name.to_owned(),
                f.address.clone().unwrap_or_else(|| "-".to_owned()),
                extra,
            ]
        })
        .collect();
    columns(out, "  ", &rows);

    out.push_str("\ntracepoints (BTF)\n");
    let rows: Vec<Vec<String>> = r
        .tracepoints
        .iter()
        .map(|t| {
            let detail = if let Some(err) = &t.error {
                one_line(err, 160)
            } else {
                let args: Vec<String> = t
                    .args
                    .iter()
                    .map(|a| c_declaration(&a.r#type, &a.name))
                    .collect();
                format!("({})", args.join(", "))
            };
            vec![t.name.to_owned(), t.status.label().to_owned(), detail]
        })
        .collect();
    columns(out, "  ", &rows);

    if let Some(facts) = &r.facts {
        out.push_str("\nkernel facts (BTF)\n");
        let rows: Vec<Vec<String>> = facts
            .fields()
            .iter()
            .map(|(name, value)| vec![(*name).to_owned(), value.to_string(), format!("{value:#x}")])
            .collect();
        columns(out, "  ", &rows);
    }

    out.push_str("\nreader ranges (kallsyms)\n");
    if r.kallsyms.status != Status::Ok {
        out.push_str("  unavailable: see kallsyms above\n");
    } else if r.reader_ranges.is_empty() {
        out.push_str("  none: no tun/tap read path in kallsyms (modules not loaded?)\n");
    }
    let rows: Vec<Vec<String>> = r
        .reader_ranges
        .iter()
        .map(|g| {
            vec![
                g.name.clone(),
                format!("{}..{}", g.start, g.end),
                format!("{} bytes", g.len),
            ]
        })
        .collect();
    columns(out, "  ", &rows);
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn one_line_flattens_and_truncates() {
        assert_eq!(one_line("a\n  b\tc", 10), "a b c");
        assert_eq!(one_line("abcdef", 3), "abc...");
    }
}
