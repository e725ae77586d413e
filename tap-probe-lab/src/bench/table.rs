//! The table of `tap-probe bench`: the patch series' comparison, measured. Rows are the reader
//! paths (`TAP (read)`, `TAP + vhost-net`), one table per number of sender threads, columns
//! Stock and Backpressure, each cell the median of N runs with its spread, and the diff
//! of the medians in percent.
//!
//! The spread is the range of the runs, min–max: with the 3 to 5 runs a bench makes, an
//! interquartile range would rest on one or two runs and claim more than they show, while
//! min–max hides nothing.
//!
//! Lost/s says how many packets per second did not reach the reader; the ring drops and
//! qdisc drops under it say where they were lost: at the full ring (tail-drop) or in the
//! qdisc (backpressure pushed the loss up to where the qdisc's policy decides).

use std::collections::BTreeSet;
use std::fmt::Write as _;

use anyhow::{Result, bail};
use serde::Serialize;
use tap_probe_common::units::{decimals, prefix, quantity};

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Path {
    /// A thread reading the tap.
    Tap,
    /// vhost-net taking from the tap's ring.
    TapVhost,
}

impl Path {
    const ALL: [Path; 2] = [Path::Tap, Path::TapVhost];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Tap => "TAP (read)",
            Self::TapVhost => "TAP + vhost-net",
        }
    }
}

#[derive(Clone, Copy, Debug, PartialEq, Eq, PartialOrd, Ord, Serialize)]
#[serde(rename_all = "kebab-case")]
pub enum Variant {
    Stock,
    Backpressure,
}

impl Variant {
    const ALL: [Variant; 2] = [Variant::Stock, Variant::Backpressure];

    #[must_use]
    pub fn label(self) -> &'static str {
        match self {
            Self::Stock => "Stock",
            Self::Backpressure => "Backpressure",
        }
    }
}

/// One run of one cell.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub struct Run {
    /// Packets per second the reader got.
    pub delivered_pps: f64,
    /// Packets per second sent but never delivered.
    pub(crate) lost_per_sec: f64,
    /// Packets dropped at the full ring (`dropped_full_ring`).
    pub ring_drops: u64,
    /// Packets the qdisc dropped.
    pub qdisc_drops: u64,
}

/// The runs of one cell, as measured.
#[derive(Clone, Debug, PartialEq)]
pub struct Cell {
    pub path: Path,
    pub sender_threads: u32,
    pub variant: Variant,
    pub runs: Vec<Run>,
}

/// What the numbers were measured on and how.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct Header {
    pub kernel_release: String,
    pub cpus: u32,
    /// How the guest ran (`kvm`, `tcg`), or `none` on the host itself.
    pub accelerator: String,
    pub packets_per_run: u64,
    /// What the Stock column ran, e.g. "`IFF_BACKPRESSURE` off".
    pub stock: String,
    /// What the Backpressure column ran, e.g. "`IFF_BACKPRESSURE` on, `fq_codel`".
    pub backpressure: String,
}

/// The median of a cell's runs and their range.
#[derive(Clone, Copy, Debug, PartialEq, Serialize)]
pub(crate) struct Spread {
    pub(crate) median: f64,
    pub(crate) min: f64,
    pub(crate) max: f64,
}

impl Spread {
    /// `None` for no values.
    fn of(values: impl IntoIterator<Item = f64>) -> Option<Self> {
        let mut v: Vec<f64> = values.into_iter().collect();
        v.sort_by(f64::total_cmp);
        let (&min, &max) = (v.first()?, v.last()?);
        let mid = v.len() / 2;
        let median = if v.len() % 2 == 1 {
            v[mid]
        } else {
            f64::midpoint(v[mid - 1], v[mid])
        };
        Some(Self { median, min, max })
    }
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct CellSummary {
    pub(crate) path: Path,
    pub(crate) sender_threads: u32,
    pub(crate) variant: Variant,
    pub(crate) runs: Vec<Run>,
    pub(crate) delivered_pps: Spread,
    pub(crate) lost_per_sec: Spread,
    pub(crate) ring_drops: Spread,
    pub(crate) qdisc_drops: Spread,
}

/// Backpressure against Stock for one row: `(backpressure - stock) / stock`, in percent,
/// of the medians; `None` when a cell is missing or Stock's median is 0.
#[derive(Clone, Debug, PartialEq, Serialize)]
pub(crate) struct Diff {
    pub(crate) path: Path,
    pub(crate) sender_threads: u32,
    pub(crate) delivered_pps_percent: Option<f64>,
    pub(crate) lost_per_sec_percent: Option<f64>,
}

#[derive(Clone, Debug, PartialEq, Serialize)]
pub struct BenchTable {
    pub header: Header,
    /// How `Spread` is computed, for readers of the JSON.
    pub(crate) spread: &'static str,
    pub cells: Vec<CellSummary>,
    pub(crate) diffs: Vec<Diff>,
}

impl BenchTable {
    /// Summarises the cells. Cells may be missing (a reader this kernel cannot run); they
    /// show as `n/a`.
    ///
    /// # Errors
    /// A cell twice, a cell without runs or with 0 sender threads, or a rate that is
    /// negative or not finite: the measurement that produced it is broken.
    pub fn new(header: Header, cells: Vec<Cell>) -> Result<Self> {
        let mut seen = BTreeSet::new();
        let mut summaries = Vec::new();
        for cell in cells {
            let name = format!(
                "{}, {} sender threads, {}",
                cell.path.label(),
                cell.sender_threads,
                cell.variant.label()
            );
            if !seen.insert((cell.path, cell.sender_threads, cell.variant)) {
                bail!("the cell {name} is measured twice; merge its runs into one cell");
            }
            if cell.sender_threads == 0 {
                bail!("the cell {name} has 0 sender threads; a cell needs at least one sender");
            }
            for (i, run) in cell.runs.iter().enumerate() {
                for (what, v) in [
                    ("delivered pps", run.delivered_pps),
                    ("lost per second", run.lost_per_sec),
                ] {
                    if !v.is_finite() || v < 0.0 {
                        bail!(
                            "run {} of the cell {name} has {what} {v}, which no measurement can \
                             give; the run is broken, measure it again",
                            i + 1
                        );
                    }
                }
            }
            let spread = |f: fn(&Run) -> f64| Spread::of(cell.runs.iter().map(f));
            let (Some(delivered_pps), Some(lost_per_sec), Some(ring_drops), Some(qdisc_drops)) = (
                spread(|r| r.delivered_pps),
                spread(|r| r.lost_per_sec),
                spread(|r| count(r.ring_drops)),
                spread(|r| count(r.qdisc_drops)),
            ) else {
                bail!("the cell {name} has no runs; run the bench with --runs 1 or more");
            };
            summaries.push(CellSummary {
                path: cell.path,
                sender_threads: cell.sender_threads,
                variant: cell.variant,
                runs: cell.runs,
                delivered_pps,
                lost_per_sec,
                ring_drops,
                qdisc_drops,
            });
        }
        summaries.sort_by_key(|c| (c.sender_threads, c.path, c.variant));
        let mut table = Self {
            header,
            spread: "min-max",
            cells: summaries,
            diffs: Vec::new(),
        };
        table.diffs = table
            .rows()
            .map(|(threads, path)| {
                let percent = |f: fn(&CellSummary) -> f64| {
                    let stock = f(table.cell(path, threads, Variant::Stock)?);
                    let bp = f(table.cell(path, threads, Variant::Backpressure)?);
                    (stock != 0.0).then(|| (bp - stock) / stock * 100.0)
                };
                Diff {
                    path,
                    sender_threads: threads,
                    delivered_pps_percent: percent(|c| c.delivered_pps.median),
                    lost_per_sec_percent: percent(|c| c.lost_per_sec.median),
                }
            })
            .collect();
        Ok(table)
    }

    fn cell(&self, path: Path, threads: u32, variant: Variant) -> Option<&CellSummary> {
        self.cells
            .iter()
            .find(|c| c.path == path && c.sender_threads == threads && c.variant == variant)
    }

    fn thread_counts(&self) -> BTreeSet<u32> {
        self.cells.iter().map(|c| c.sender_threads).collect()
    }

    /// Every (threads, path) with at least one cell, in table order.
    fn rows(&self) -> impl Iterator<Item = (u32, Path)> + '_ {
        self.thread_counts().into_iter().flat_map(move |threads| {
            Path::ALL.into_iter().filter_map(move |path| {
                Variant::ALL
                    .iter()
                    .any(|&v| self.cell(path, threads, v).is_some())
                    .then_some((threads, path))
            })
        })
    }

    fn diff(&self, path: Path, threads: u32) -> Option<&Diff> {
        self.diffs
            .iter()
            .find(|d| d.path == path && d.sender_threads == threads)
    }

    /// The JSON document: the header, every cell with its runs, and the diffs.
    #[must_use]
    pub fn to_json(&self) -> String {
        #[derive(Serialize)]
        struct BenchDocument<'a> {
            format: &'static str,
            version: u32,
            #[serde(flatten)]
            table: &'a BenchTable,
        }
        // Finite numbers (checked in `new`) and string keys: serialising cannot fail.
        serde_json::to_string_pretty(&BenchDocument {
            format: "tap-probe-bench",
            version: 1,
            table: self,
        })
        .unwrap_or_default()
    }

    /// The markdown tables, one per number of sender threads, shaped like the series' own.
    pub fn markdown(&self) -> String {
        let h = &self.header;
        let runs: BTreeSet<usize> = self.cells.iter().map(|c| c.runs.len()).collect();
        let runs = runs
            .iter()
            .map(ToString::to_string)
            .collect::<Vec<_>>()
            .join(" or ");
        let mut out = String::new();
        let _ = writeln!(
            out,
            "Kernel {}, {} CPUs, accelerator {}; {} packets per run, {runs} runs per cell, \
             median (min–max).  \nStock: {}. Backpressure: {}.\n",
            h.kernel_release, h.cpus, h.accelerator, h.packets_per_run, h.stock, h.backpressure
        );
        for threads in self.thread_counts() {
            let sending = if threads == 1 {
                "1 thread sending".to_owned()
            } else {
                format!("{threads} threads sending")
            };
            let _ = writeln!(
                out,
                "| {sending} | | Stock | Backpressure | diff |\n|---|---|--:|--:|--:|"
            );
            for (_, path) in self.rows().filter(|(t, _)| *t == threads) {
                let cells = Variant::ALL.map(|v| self.cell(path, threads, v));
                let show = |f: fn(&CellSummary) -> String| {
                    cells.map(|c| c.map_or_else(|| "n/a".to_owned(), f))
                };
                let [stock, bp] = show(|c| rate(&c.delivered_pps));
                let diff = self
                    .diff(path, threads)
                    .and_then(|d| d.delivered_pps_percent)
                    .map_or_else(String::new, percent);
                let _ = writeln!(
                    out,
                    "| {} | Transmitted | {stock} | {bp} | {diff} |",
                    path.label()
                );
                let [stock, bp] = show(|c| rate(&c.lost_per_sec));
                let _ = writeln!(out, "| | Lost/s | {stock} | {bp} | |");
                let [stock, bp] = show(|c| {
                    format!(
                        "{} / {}",
                        quantity(c.ring_drops.median, ""),
                        quantity(c.qdisc_drops.median, "")
                    )
                });
                let _ = writeln!(out, "| | Drops: ring / qdisc | {stock} | {bp} | |");
            }
            out.push('\n');
        }
        out.push_str(
            "Drops are per run (medians): ring drops are tail-drops at the tap's full ring, \
             qdisc drops are the qdisc's own. diff: Backpressure against Stock, medians.\n",
        );
        if self.header.accelerator == "tcg" {
            out.push_str(
                "Measured under TCG (emulation): the ratios carry, the absolute rates do not.\n",
            );
        }
        out
    }
}

#[expect(
    clippy::cast_precision_loss,
    reason = "drop counts of one run stay far below 2^53"
)]
fn count(n: u64) -> f64 {
    n as f64
}

/// `1.151 Mpps (1.140–1.162)`: the median with 4 significant digits and the range in the
/// same unit; `0 pps` for a cell where every run was 0.
fn rate(s: &Spread) -> String {
    if s.max == 0.0 {
        return "0 pps".to_owned();
    }
    let reference = if s.median == 0.0 { s.max } else { s.median };
    let (factor, prefix) = prefix(reference);
    let d = decimals(reference / factor, prefix);
    let median = format!("{:.d$} {prefix}pps", s.median / factor);
    #[expect(
        clippy::float_cmp,
        reason = "runs that gave exactly the same value have no range to show"
    )]
    let no_range = s.min == s.max;
    if no_range {
        median
    } else {
        format!("{median} ({:.d$}–{:.d$})", s.min / factor, s.max / factor)
    }
}

/// `-1.1%`, `+0.4%`, `0.0%` (never `-0.0%`).
fn percent(p: f64) -> String {
    let rounded = (p * 10.0).round() / 10.0;
    if rounded == 0.0 {
        "0.0%".to_owned()
    } else {
        format!("{rounded:+.1}%")
    }
}

#[cfg(test)]
#[expect(clippy::float_cmp, reason = "medians of given values are exact")]
mod tests {
    use proptest::prelude::*;

    use super::*;

    fn header(accelerator: &str) -> Header {
        Header {
            kernel_release: "7.3.0-1-cloud-amd64".to_owned(),
            cpus: 2,
            accelerator: accelerator.to_owned(),
            packets_per_run: 1_000_000,
            stock: "IFF_BACKPRESSURE off, pfifo_fast".to_owned(),
            backpressure: "IFF_BACKPRESSURE on, fq_codel".to_owned(),
        }
    }

    fn run(delivered_pps: f64, lost_per_sec: f64, ring_drops: u64, qdisc_drops: u64) -> Run {
        Run {
            delivered_pps,
            lost_per_sec,
            ring_drops,
            qdisc_drops,
        }
    }

    fn cell(path: Path, sender_threads: u32, variant: Variant, runs: Vec<Run>) -> Cell {
        Cell {
            path,
            sender_threads,
            variant,
            runs,
        }
    }

    /// The series' published numbers (v8, 1 and 2 threads), three runs around each.
    fn published() -> Vec<Cell> {
        let three = |pps: f64, lost: f64, ring: u64, qdisc: u64| {
            vec![
                run(pps * 0.99, lost * 1.01, ring + 10, qdisc),
                run(pps, lost, ring, qdisc),
                run(pps * 1.01, lost * 0.98, ring.saturating_sub(10), qdisc),
            ]
        };
        vec![
            cell(
                Path::Tap,
                1,
                Variant::Stock,
                three(1.151e6, 3.606e6, 18_030_000, 0),
            ),
            cell(
                Path::Tap,
                1,
                Variant::Backpressure,
                three(1.139e6, 0.0, 0, 0),
            ),
            cell(
                Path::TapVhost,
                1,
                Variant::Stock,
                three(3.948e6, 496.5e3, 2_482_000, 0),
            ),
            cell(
                Path::TapVhost,
                1,
                Variant::Backpressure,
                three(3.738e6, 0.0, 0, 0),
            ),
            cell(
                Path::Tap,
                2,
                Variant::Stock,
                three(1.133e6, 8.269e6, 41_340_000, 0),
            ),
            cell(
                Path::Tap,
                2,
                Variant::Backpressure,
                three(1.109e6, 0.0, 0, 12),
            ),
            cell(
                Path::TapVhost,
                2,
                Variant::Stock,
                three(3.820e6, 4.961e6, 24_800_000, 0),
            ),
            cell(
                Path::TapVhost,
                2,
                Variant::Backpressure,
                three(3.513e6, 0.0, 0, 0),
            ),
        ]
    }

    #[test]
    fn medians_and_ranges() {
        let s = Spread::of([3.0, 1.0, 2.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.0, 1.0, 3.0));
        let s = Spread::of([4.0, 1.0, 2.0, 3.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (2.5, 1.0, 4.0));
        let s = Spread::of([7.0]).unwrap();
        assert_eq!((s.median, s.min, s.max), (7.0, 7.0, 7.0));
        assert_eq!(Spread::of([]), None);
        let s = Spread::of([1.0, 100.0, 2.0, 1e9, 3.0]).unwrap();
        assert_eq!(s.median, 3.0, "an outlier does not move the median");
    }

    #[test]
    fn diffs_are_backpressure_against_stock() {
        let table = BenchTable::new(header("kvm"), published()).unwrap();
        assert_eq!(table.diffs.len(), 4);
        let d = &table.diffs[0];
        assert_eq!((d.path, d.sender_threads), (Path::Tap, 1));
        let expected = (1.139e6 - 1.151e6) / 1.151e6 * 100.0;
        assert!((d.delivered_pps_percent.unwrap() - expected).abs() < 1e-9);
        assert_eq!(percent(d.delivered_pps_percent.unwrap()), "-1.0%");
        assert_eq!(d.lost_per_sec_percent, Some(-100.0));
        let vhost2 = &table.diffs[3];
        assert_eq!((vhost2.path, vhost2.sender_threads), (Path::TapVhost, 2));
        assert_eq!(percent(vhost2.delivered_pps_percent.unwrap()), "-8.0%");
    }

    #[test]
    fn markdown_has_the_series_shape() {
        let md = BenchTable::new(header("tcg"), published())
            .unwrap()
            .markdown();
        let expected = "\
Kernel 7.3.0-1-cloud-amd64, 2 CPUs, accelerator tcg; 1000000 packets per run, 3 runs per cell, median (min–max).  
Stock: IFF_BACKPRESSURE off, pfifo_fast. Backpressure: IFF_BACKPRESSURE on, fq_codel.

| 1 thread sending | | Stock | Backpressure | diff |
|---|---|--:|--:|--:|
| TAP (read) | Transmitted | 1.151 Mpps (1.139–1.163) | 1.139 Mpps (1.128–1.150) | -1.0% |
| | Lost/s | 3.606 Mpps (3.534–3.642) | 0 pps | |
| | Drops: ring / qdisc | 18.03 M / 0 | 0 / 0 | |
| TAP + vhost-net | Transmitted | 3.948 Mpps (3.909–3.987) | 3.738 Mpps (3.701–3.775) | -5.3% |
| | Lost/s | 496.5 kpps (486.6–501.5) | 0 pps | |
| | Drops: ring / qdisc | 2.482 M / 0 | 0 / 0 | |

| 2 threads sending | | Stock | Backpressure | diff |
|---|---|--:|--:|--:|
| TAP (read) | Transmitted | 1.133 Mpps (1.122–1.144) | 1.109 Mpps (1.098–1.120) | -2.1% |
| | Lost/s | 8.269 Mpps (8.104–8.352) | 0 pps | |
| | Drops: ring / qdisc | 41.34 M / 0 | 0 / 12 | |
| TAP + vhost-net | Transmitted | 3.820 Mpps (3.782–3.858) | 3.513 Mpps (3.478–3.548) | -8.0% |
| | Lost/s | 4.961 Mpps (4.862–5.011) | 0 pps | |
| | Drops: ring / qdisc | 24.80 M / 0 | 0 / 0 | |

Drops are per run (medians): ring drops are tail-drops at the tap's full ring, qdisc drops are the qdisc's own. diff: Backpressure against Stock, medians.
Measured under TCG (emulation): the ratios carry, the absolute rates do not.
";
        assert_eq!(md, expected);
        let kvm = BenchTable::new(header("kvm"), published())
            .unwrap()
            .markdown();
        assert!(!kvm.contains("TCG"));
    }

    #[test]
    fn missing_cells_show_as_not_available() {
        let mut cells = published();
        cells.retain(|c| !(c.path == Path::TapVhost && c.variant == Variant::Backpressure));
        cells.retain(|c| c.sender_threads == 1);
        let table = BenchTable::new(header("kvm"), cells).unwrap();
        let md = table.markdown();
        assert!(
            md.contains("| TAP + vhost-net | Transmitted | 3.948 Mpps (3.909–3.987) | n/a |  |\n"),
            "{md}"
        );
        assert!(!md.contains("2 threads"), "{md}");
        let d = &table.diffs[1];
        assert_eq!((d.path, d.delivered_pps_percent), (Path::TapVhost, None));
        let only_vhost = BenchTable::new(
            header("kvm"),
            vec![cell(
                Path::TapVhost,
                1,
                Variant::Stock,
                vec![run(1.0, 0.0, 0, 0)],
            )],
        )
        .unwrap();
        assert!(!only_vhost.markdown().contains("TAP (read)"));
    }

    #[test]
    fn json_has_every_cell_and_the_header() {
        let table = BenchTable::new(header("tcg"), published()).unwrap();
        let json: serde_json::Value = serde_json::from_str(&table.to_json()).unwrap();
        assert_eq!(json["format"], "tap-probe-bench");
        assert_eq!(json["version"], 1);
        assert_eq!(json["spread"], "min-max");
        assert_eq!(json["header"]["kernel_release"], "7.3.0-1-cloud-amd64");
        assert_eq!(json["header"]["cpus"], 2);
        assert_eq!(json["header"]["accelerator"], "tcg");
        let cells = json["cells"].as_array().unwrap();
        assert_eq!(cells.len(), 8);
        let first = &cells[0];
        assert_eq!(first["path"], "tap");
        assert_eq!(first["sender_threads"], 1);
        assert_eq!(first["variant"], "stock");
        assert_eq!(first["runs"].as_array().unwrap().len(), 3);
        assert_eq!(first["runs"][1]["ring_drops"], 18_030_000);
        assert_eq!(first["delivered_pps"]["median"], 1.151e6);
        assert_eq!(first["ring_drops"]["max"], 18_030_010.0);
        assert_eq!(cells[7]["path"], "tap-vhost");
        assert_eq!(cells[7]["variant"], "backpressure");
        assert_eq!(json["diffs"].as_array().unwrap().len(), 4);
        assert_eq!(json["diffs"][0]["lost_per_sec_percent"], -100.0);
        let lost_diff_without_stock_loss = BenchTable::new(
            header("kvm"),
            vec![
                cell(Path::Tap, 1, Variant::Stock, vec![run(10.0, 0.0, 0, 0)]),
                cell(
                    Path::Tap,
                    1,
                    Variant::Backpressure,
                    vec![run(10.0, 0.0, 0, 0)],
                ),
            ],
        )
        .unwrap();
        assert_eq!(
            lost_diff_without_stock_loss.diffs[0].lost_per_sec_percent,
            None
        );
        assert_eq!(
            lost_diff_without_stock_loss.diffs[0].delivered_pps_percent,
            Some(0.0)
        );
    }

    #[test]
    fn broken_input_is_refused_with_the_cell_named() {
        for (cells, message) in [
            (
                vec![cell(Path::Tap, 1, Variant::Stock, vec![])],
                "the cell TAP (read), 1 sender threads, Stock has no runs",
            ),
            (
                vec![
                    cell(Path::Tap, 1, Variant::Stock, vec![run(1.0, 0.0, 0, 0)]),
                    cell(Path::Tap, 1, Variant::Stock, vec![run(1.0, 0.0, 0, 0)]),
                ],
                "measured twice",
            ),
            (
                vec![cell(
                    Path::Tap,
                    0,
                    Variant::Stock,
                    vec![run(1.0, 0.0, 0, 0)],
                )],
                "0 sender threads",
            ),
            (
                vec![cell(
                    Path::TapVhost,
                    2,
                    Variant::Backpressure,
                    vec![run(1.0, 0.0, 0, 0), run(f64::NAN, 0.0, 0, 0)],
                )],
                "run 2 of the cell TAP + vhost-net, 2 sender threads, Backpressure has \
                 delivered pps NaN",
            ),
            (
                vec![cell(
                    Path::Tap,
                    1,
                    Variant::Stock,
                    vec![run(1.0, -1.0, 0, 0)],
                )],
                "lost per second -1",
            ),
            (
                vec![cell(
                    Path::Tap,
                    1,
                    Variant::Stock,
                    vec![run(f64::INFINITY, 0.0, 0, 0)],
                )],
                "delivered pps inf",
            ),
        ] {
            let err = BenchTable::new(header("kvm"), cells)
                .unwrap_err()
                .to_string();
            assert!(err.contains(message), "{err}");
        }
        let empty = BenchTable::new(header("kvm"), vec![]).unwrap();
        assert!(empty.cells.is_empty());
        assert!(empty.markdown().starts_with("Kernel"));
    }

    #[test]
    fn numbers_read_like_the_published() {
        let one = |v: f64| Spread {
            median: v,
            min: v,
            max: v,
        };
        assert_eq!(rate(&one(1.151e6)), "1.151 Mpps");
        assert_eq!(rate(&one(196e3)), "196.0 kpps");
        assert_eq!(rate(&one(496.5e3)), "496.5 kpps");
        assert_eq!(rate(&one(0.0)), "0 pps");
        assert_eq!(rate(&one(950.0)), "950 pps");
        assert_eq!(rate(&one(2.5e9)), "2.500 Gpps");
        assert_eq!(
            rate(&Spread {
                median: 0.0,
                min: 0.0,
                max: 1500.0
            }),
            "0.000 kpps (0.000–1.500)"
        );
        assert_eq!(percent(-1.04), "-1.0%");
        assert_eq!(percent(0.44), "+0.4%");
        assert_eq!(percent(-0.04), "0.0%");
        assert_eq!(percent(-100.0), "-100.0%");
    }

    proptest! {
        #[test]
        fn median_lies_within_the_range(values in prop::collection::vec(0.0f64..1e10, 1..12)) {
            let s = Spread::of(values.iter().copied()).unwrap();
            prop_assert!(s.min <= s.median && s.median <= s.max);
            let below = values.iter().filter(|&&v| v < s.median).count();
            let above = values.iter().filter(|&&v| v > s.median).count();
            prop_assert!(below <= values.len() / 2 && above <= values.len() / 2);
        }

        #[test]
        fn any_valid_cells_render(
            runs in prop::collection::vec((0.0f64..1e10, 0.0f64..1e10, any::<u32>(), any::<u32>()), 1..6),
            threads in 1u32..4,
        ) {
            let runs: Vec<Run> = runs
                .into_iter()
                .map(|(d, l, r, q)| run(d, l, u64::from(r), u64::from(q)))
                .collect();
            let cells = vec![
                cell(Path::Tap, threads, Variant::Stock, runs.clone()),
                cell(Path::TapVhost, threads, Variant::Backpressure, runs),
            ];
            let table = BenchTable::new(header("kvm"), cells).unwrap();
            let md = table.markdown();
            prop_assert!(!md.contains("NaN") && !md.contains("inf"));
            let json: serde_json::Value = serde_json::from_str(&table.to_json()).unwrap();
            prop_assert_eq!(json["cells"].as_array().unwrap().len(), 2);
        }
    }
}
