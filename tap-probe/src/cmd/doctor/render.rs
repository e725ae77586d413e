//! The doctor's report as text.

use std::fmt::Write as _;

use super::{AutoBackend, Check, CheckStatus, Diagnosis};
use crate::output::table::Table;
use tap_probe_observer::kernel::TunBackpressure;

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

pub(super) fn render_table(r: &Diagnosis) -> String {
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

    if let Some(tun) = &r.tun {
        let backpressure = match tun.backpressure {
            Some(TunBackpressure::Never) => {
                "tail-drop: the ring drops when full, whatever the qdisc"
            }
            Some(TunBackpressure::Always) => {
                "the series as posted: every tap with a qdisc stops its queue instead of dropping"
            }
            Some(TunBackpressure::OptIn) => {
                "per tap: a tap opened with IFF_BACKPRESSURE and a qdisc stops its queue"
            }
            None => "unknown (see TUNGETFEATURES)",
        };
        out.push_str("\ntun\n");
        columns(
            &mut out,
            "  ",
            &[
                check_row("TUNGETFEATURES", &tun.features),
                vec![
                    "IFF_BACKPRESSURE".to_owned(),
                    if tun.iff_backpressure { "yes" } else { "no" }.to_owned(),
                    if tun.iff_backpressure {
                        "load/demo --backpressure work".to_owned()
                    } else {
                        "not supported: TUNSETIFF ignores the flag here".to_owned()
                    },
                ],
                vec![
                    "full ring".to_owned(),
                    String::new(),
                    backpressure.to_owned(),
                ],
                check_row("ring offsets", &tun.ring_offsets),
            ],
        );
    }

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
    let _ = writeln!(out, "  fentry backend: {}", r.fentry_backend);
    match &r.backend {
        AutoBackend::Sources { sources, memory } => {
            let _ = writeln!(out, "\nwatch --backend auto attaches:");
            let rows: Vec<Vec<String>> = sources
                .groups()
                .into_iter()
                .map(|(_, what, source)| vec![what.to_owned(), source])
                .collect();
            columns(&mut out, "  ", &rows);
            for note in &sources.notes {
                let _ = writeln!(out, "  not used: {note}");
            }
            if let Some(memory) = memory {
                render_memory(&mut out, memory);
            }
        }
        AutoBackend::Failed { error } => {
            let _ = writeln!(out, "\nwatch --backend auto: FAILED  {error}");
        }
    }

    render_kallsyms(&mut out, r);
    out
}

/// What the probe's maps hold, as `watch` would attach them here.
fn render_memory(out: &mut String, memory: &tap_probe_observer::bpf::probe::Memory) {
    let _ = writeln!(
        out,
        "\nits maps, with no device tracked and one chunk of {} queues:",
        tap_probe_common::CHUNK_SLOTS
    );
    for line in crate::output::memory_lines(memory) {
        let _ = writeln!(out, "  {line}");
    }
}

/// The kallsyms and BTF parts of the table.
fn render_kallsyms(out: &mut String, r: &Diagnosis) {
    out.push_str("\nkernel functions (kallsyms)\n");
    if r.kallsyms.status != CheckStatus::Ok {
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
    if r.kallsyms.status != CheckStatus::Ok {
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
