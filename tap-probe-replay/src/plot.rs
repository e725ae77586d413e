//! `replay --plot FILE.svg`: ring occupancy over time, one panel per policy, side by side.

use std::path::Path;

use anyhow::anyhow;
use plotters::prelude::*;

/// One panel: a policy's occupancy series over `span_ns`.
pub struct Panel<'a> {
    pub title: String,
    pub series: &'a [u32],
    pub ring_size: u32,
    pub span_ns: u64,
}

/// Writes the panels side by side to `path` as SVG.
///
/// # Errors
/// When the file cannot be written or there is nothing to plot.
pub fn occupancy_svg(path: &Path, panels: &[Panel<'_>]) -> anyhow::Result<()> {
    if panels.is_empty() {
        return Err(anyhow!("nothing to plot"));
    }
    let width = u32::try_from(panels.len())
        .unwrap_or(u32::MAX)
        .saturating_mul(420);
    let root = SVGBackend::new(path, (width, 340)).into_drawing_area();
    root.fill(&WHITE).map_err(plot_err)?;
    let areas = root.split_evenly((1, panels.len()));
    for (area, panel) in areas.iter().zip(panels) {
        #[expect(clippy::cast_precision_loss, reason = "milliseconds for an axis")]
        let span_ms = (panel.span_ns as f64 / 1e6).max(1e-6);
        let y_max = panel
            .ring_size
            .max(panel.series.iter().copied().max().unwrap_or(0))
            .max(1);
        let mut chart = ChartBuilder::on(area)
            .caption(&panel.title, ("sans-serif", 16))
            .margin(8)
            .x_label_area_size(30)
            .y_label_area_size(44)
            .build_cartesian_2d(0f64..span_ms, 0u32..y_max + y_max / 20)
            .map_err(plot_err)?;
        chart
            .configure_mesh()
            .x_desc("time (ms)")
            .y_desc("entries in ring")
            .draw()
            .map_err(plot_err)?;
        let n = panel.series.len().max(1);
        #[expect(clippy::cast_precision_loss, reason = "plot coordinates")]
        let points = panel
            .series
            .iter()
            .enumerate()
            .map(|(i, &o)| ((i as f64 + 0.5) * span_ms / n as f64, o));
        chart
            .draw_series(LineSeries::new(points, &BLUE))
            .map_err(plot_err)?;
        chart
            .draw_series(LineSeries::new(
                [(0.0, panel.ring_size), (span_ms, panel.ring_size)],
                &RED,
            ))
            .map_err(plot_err)?;
    }
    root.present().map_err(plot_err)?;
    Ok(())
}

fn plot_err<E: std::fmt::Debug>(e: E) -> anyhow::Error {
    anyhow!("drawing the plot: {e:?}")
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn writes_an_svg() {
        let dir = tempfile::tempdir().unwrap();
        let path = dir.path().join("occ.svg");
        let a = [0, 10, 64, 64, 32];
        let b = [0, 5, 7];
        occupancy_svg(
            &path,
            &[
                Panel {
                    title: "tail-drop".into(),
                    series: &a,
                    ring_size: 64,
                    span_ns: 1_000_000,
                },
                Panel {
                    title: "stop-wake:0.5".into(),
                    series: &b,
                    ring_size: 64,
                    span_ns: 1_000_000,
                },
            ],
        )
        .unwrap();
        let svg = std::fs::read_to_string(&path).unwrap();
        assert!(svg.starts_with("<svg"));
        assert!(svg.contains("polyline"));
    }
}
