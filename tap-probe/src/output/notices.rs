//! What a report asks its reader to notice besides the counts, worded once for every view
//! of text (the table, the compact status line, the full-screen view): queues stuck, devices
//! not counted, and the report's caveats. Each view lays the sentences out its own way (a
//! line each, or `; ` between them).

use tap_probe_observer::host::report::{Caveat, Report};

/// The sentences, most urgent first.
pub(crate) fn notices(report: &Report) -> Vec<String> {
    let mut out = Vec::new();
    out.extend(stuck(report));
    out.extend(untracked(report));
    out.extend(report.caveats().iter().map(caveat));
    out
}

/// The queues stopped with no reader take for too long, as `DEVICE/qN`.
fn stuck(report: &Report) -> Option<String> {
    let stuck: Vec<String> = report
        .rows
        .iter()
        .filter(|r| r.stuck && !r.retired)
        .map(|r| format!("{}/q{}", r.ifname, r.queue))
        .collect();
    (!stuck.is_empty()).then(|| {
        format!(
            "STUCK: stopped, and the reader took nothing since: {}",
            stuck.join(", ")
        )
    })
}

/// The matching devices the probe does not count, the first named, and why.
fn untracked(report: &Report) -> Option<String> {
    let first = report.untracked.first()?;
    let n = report.untracked.len();
    Some(format!(
        "NOT COUNTED: {n} matching device{} ({}{}): {}",
        if n == 1 { "" } else { "s" },
        first.ifname,
        if n == 1 { "" } else { ", ..." },
        first.reason
    ))
}

/// One caveat, in words.
pub(crate) fn caveat(caveat: &Caveat<'_>) -> String {
    match caveat {
        Caveat::SkippedRuns(missed) => {
            let missed: Vec<String> = missed.iter().map(|(p, n)| format!("{p} {n}")).collect();
            format!(
                "COUNTS MAY BE SHORT: the kernel skipped program runs: {}",
                missed.join(", ")
            )
        }
        Caveat::NoRoom(events) => format!(
            "COUNTS MAY BE SHORT: {events} events of new devices found no spare counter slots"
        ),
        Caveat::GoneUnnamed(n) => format!(
            "{n} device{} came and went between two refreshes: counted, but gone before a \
             refresh could name {}, so in no row (a shorter --interval shows such devices)",
            if *n == 1 { "" } else { "s" },
            if *n == 1 { "it" } else { "them" }
        ),
        Caveat::ModuleChanged(change) => {
            format!("{change} since attach: its devices may be counted wrongly; restart tap-probe")
        }
    }
}
