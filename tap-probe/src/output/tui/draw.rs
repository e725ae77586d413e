//! Draws a [`State`]: a title line, the devices (the compact table's lines, sorted, the
//! selected one reversed, stopped queues yellow, stuck ones red), the selected device's
//! detail (every counter, its queues, drop reasons, sources, and sparklines of its
//! delivered and ring-drop rates), the keys, and the legend over it all on `?`.

use ratatui::Frame;
use ratatui::layout::{Constraint, Layout, Rect};
use ratatui::style::{Color, Modifier, Style};
use ratatui::text::Line as TextLine;
use ratatui::widgets::{Block, Clear, Paragraph, Sparkline, Wrap};
use tap_probe_common::{METRICS, Unit};

use crate::output::columns;
use crate::output::compact::{Grid, Mark, Mode, clip, plain};
use crate::output::legend;
use crate::output::lines::{DeviceId, Line, lines};
use crate::output::notices;
use crate::output::tui::state::State;
use tap_probe_common::units::count;
use tap_probe_observer::host::report::{Caveat, Report, Value};

/// The keys, as the footer shows them.
pub(crate) const FOOTER: &str = "↑↓ select  s/S sort  r reverse  enter detail  ? legend  q quit";

/// The keys, as the legend explains them.
pub(crate) const KEYS: &[(&str, &str)] = &[
    ("↑ ↓ j k", "select a device (PgUp PgDn Home End: further)"),
    ("s S", "sort by the next or the previous column"),
    ("r", "reverse the order"),
    (
        "enter d",
        "show or hide the selected device's detail (esc hides it)",
    ),
    ("?", "this legend; any key closes it"),
    ("q Ctrl-C", "quit, with the final totals"),
];

/// Draws the whole screen.
pub(crate) fn draw(frame: &mut Frame<'_>, state: &State) {
    let area = frame.area();
    let devices = state.devices();
    let table_rows = u16::try_from(devices.len() + 1).unwrap_or(u16::MAX);
    let table = if state.detail && state.selected.is_some() {
        Constraint::Length(table_rows.min((area.height.saturating_sub(2) / 2).max(3)))
    } else {
        Constraint::Min(0)
    };
    let [title, list, detail, footer] = Layout::vertical([
        Constraint::Length(1),
        table,
        Constraint::Min(0),
        Constraint::Length(1),
    ])
    .areas(area);
    frame.render_widget(Paragraph::new(title_line(state)).style(bold()), title);
    draw_devices(frame, state, list);
    if let (true, Some(id)) = (state.detail, &state.selected) {
        draw_detail(frame, state, id, detail);
    }
    frame.render_widget(
        Paragraph::new(format!(" {FOOTER}")).style(Style::new().add_modifier(Modifier::DIM)),
        footer,
    );
    if state.legend {
        draw_legend(frame, state, area);
    }
}

fn bold() -> Style {
    Style::new().add_modifier(Modifier::BOLD)
}

fn title_line(state: &State) -> String {
    let devices = state.devices().len();
    format!(
        " tap-probe watch  {:.1} s  {devices} device{}  sorted by {}{}",
        state.report.elapsed_s,
        if devices == 1 { "" } else { "s" },
        state.sorted_by(),
        if state.report.may_be_short() {
            "  COUNTS MAY BE SHORT (details below)"
        } else {
            ""
        }
    )
}

/// The devices, scrolled so that the selected one is in view.
fn draw_devices(frame: &mut Frame<'_>, state: &State, area: Rect) {
    if area.height == 0 {
        return;
    }
    let devices = state.devices();
    let fit = state.grid.fit(Some(usize::from(area.width)));
    let mut text = state.grid.render(&fit, devices.iter().copied());
    let header = text.remove(0);
    let visible = usize::from(area.height - 1);
    let selected = state.selected_index();
    let offset = selected.map_or(0, |s| s.saturating_sub(visible.saturating_sub(1)));
    let mut out = vec![TextLine::styled(header, bold())];
    for (i, (line, grid_line)) in text.into_iter().zip(&devices).enumerate().skip(offset) {
        let mut style = match grid_line.mark {
            Mark::Plain => Style::new(),
            Mark::Stopped => Style::new().fg(Color::Yellow),
            Mark::Stuck => Style::new().fg(Color::Red).add_modifier(Modifier::BOLD),
            Mark::Gone => Style::new().add_modifier(Modifier::DIM),
        };
        if Some(i) == selected {
            style = style.add_modifier(Modifier::REVERSED);
        }
        let width = usize::from(area.width);
        out.push(TextLine::styled(format!("{line:<width$}"), style));
    }
    if devices.is_empty() {
        out.push(TextLine::raw("no matching device yet"));
    }
    frame.render_widget(Paragraph::new(out), area);
}

/// Every counter of the selected device on the left; its sparklines, queues, drop
/// reasons and the sources on the right.
fn draw_detail(frame: &mut Frame<'_>, state: &State, id: &DeviceId, area: Rect) {
    let all = lines(&state.report);
    let Some(line) = all.iter().find(|l| !l.under && l.id.device == *id) else {
        return;
    };
    let before = state.previous.as_ref().map(|p| (p, p.elapsed_s));
    let before_lines = before.map(|(p, _)| lines(p)).unwrap_or_default();
    let then = before_lines.iter().find(|l| !l.under && l.id.device == *id);
    let dt = before.map(|(_, t)| state.report.elapsed_s - t);
    let [left, right] = Layout::horizontal([
        Constraint::Length(44.min(area.width / 2)),
        Constraint::Min(0),
    ])
    .areas(area);
    let owner = line
        .first()
        .owner
        .as_ref()
        .map_or_else(String::new, |o| format!(", {}/{}", o.comm, o.pid));
    let title = format!(" {} (netns {}{owner}) ", id.ifname, id.netns);
    frame.render_widget(
        Paragraph::new(counters(line, then, dt, left.width >= 44))
            .block(Block::bordered().title(title)),
        left,
    );

    let history = state.history.get(id);
    let [delivered, drops, rest] = Layout::vertical([
        Constraint::Length(5),
        Constraint::Length(5),
        Constraint::Min(0),
    ])
    .areas(right);
    for (area, name, series, color) in [
        (
            delivered,
            "delivered/s",
            history.map(|h| &h.delivered),
            Color::Green,
        ),
        (
            drops,
            "ring drops/s",
            history.map(|h| &h.ring_drops),
            Color::Red,
        ),
    ] {
        let width = usize::from(area.width.saturating_sub(2));
        let data: Vec<u64> = series
            .map(|s| {
                s.iter()
                    .skip(s.len().saturating_sub(width))
                    .copied()
                    .collect()
            })
            .unwrap_or_default();
        let now = data.last().copied().unwrap_or(0);
        let max = data.iter().copied().max().unwrap_or(0);
        let title = format!(" {name} {}  max {} ", count(now), count(max));
        frame.render_widget(
            Sparkline::default()
                .block(Block::bordered().title(title))
                .data(&data)
                .style(Style::new().fg(color)),
            area,
        );
    }
    let width = usize::from(rest.width.saturating_sub(2));
    frame.render_widget(
        Paragraph::new(more(state, line, id, width))
            .block(Block::bordered())
            .wrap(Wrap { trim: false }),
        rest,
    );
}

/// One line per counter of the table: its total (exact when there is room) and, for
/// counts, its rate.
fn counters<'a>(
    line: &Line<'_>,
    then: Option<&Line<'_>>,
    dt: Option<f64>,
    exact: bool,
) -> Vec<TextLine<'a>> {
    METRICS
        .iter()
        .map(|m| {
            let now = line.value(m);
            let total = match (now, m.unit) {
                (Value::Count(n), Unit::Packets | Unit::Events) if exact => n.to_string(),
                _ => plain(m, now).0,
            };
            let rate = match (now, then.map(|t| t.value(m)), dt, m.unit) {
                (
                    Value::Count(now),
                    Some(Value::Count(before)),
                    Some(dt),
                    Unit::Packets | Unit::Events,
                ) if dt > 0.0 => format!("{}/s", rate(now.saturating_sub(before), dt)),
                _ => String::new(),
            };
            let total_width = if exact { 12 } else { 9 };
            TextLine::raw(format!("{:<19}{total:>total_width$}{rate:>10}", m.name))
        })
        .collect()
}

#[expect(
    clippy::cast_precision_loss,
    clippy::cast_possible_truncation,
    clippy::cast_sign_loss,
    reason = "a rate for display"
)]
fn rate(delta: u64, dt: f64) -> String {
    count((delta as f64 / dt).round() as u64)
}

/// The queues of a device with several, the other drops by reason, the sources, what the
/// kernel skipped, and the programs' cost where measured.
fn more<'a>(state: &State, line: &Line<'_>, id: &DeviceId, width: usize) -> Vec<TextLine<'a>> {
    let mut out = Vec::new();
    if line.folds {
        let of_device = |r: &Report| Report {
            rows: r
                .rows
                .iter()
                .filter(|row| {
                    row.netns == id.netns && row.ifname == id.ifname && row.ifindex == id.ifindex
                })
                .cloned()
                .collect(),
            ..r.clone()
        };
        let columns = columns::per_queue();
        let report = of_device(&state.report);
        let previous = state.previous.as_ref().map(of_device);
        let grid = Grid::new(&report, previous.as_ref(), &columns, Mode::Rates);
        let fit = grid.fit(Some(width));
        for text in grid.render(&fit, grid.lines.iter().filter(|l| l.folded)) {
            out.push(TextLine::raw(text));
        }
    }
    let reasons = line.drop_reasons();
    if reasons.is_empty() {
        out.push(TextLine::raw("other drops: none"));
    } else {
        let reasons: Vec<String> = reasons.iter().map(|(k, v)| format!("{k} {v}")).collect();
        out.push(TextLine::raw(format!(
            "other drops: {}",
            reasons.join(", ")
        )));
    }
    out.push(TextLine::raw(format!("sources: {}", state.report.sources)));
    for note in &state.report.sources.notes {
        out.push(TextLine::raw(format!("  {note}")));
    }
    let caveats = state.report.caveats();
    if !state.report.sources.misses.runs {
        out.push(TextLine::raw(
            "missed by the kernel: unknown (this kernel does not count them)",
        ));
    } else if !caveats.iter().any(|c| matches!(c, Caveat::SkippedRuns(_))) {
        out.push(TextLine::raw("missed by the kernel: nothing"));
    }
    for caveat in &caveats {
        out.push(TextLine::raw(notices::caveat(caveat)));
    }
    for p in state.report.programs.iter().flatten() {
        out.push(TextLine::raw(clip(
            &format!(
                "program {}: {} runs, {} ns/run",
                p.program, p.runs, p.mean_ns
            ),
            width,
        )));
    }
    out
}

/// The legend over the middle of the screen.
fn draw_legend(frame: &mut Frame<'_>, state: &State, area: Rect) {
    let width = area.width.saturating_sub(4).max(10).min(area.width);
    let inner = usize::from(width.saturating_sub(2));
    // The keys first: on a small screen the end of the legend is cut.
    let mut text = vec!["keys:".to_owned()];
    for (keys, what) in KEYS {
        text.extend(legend::wrap(
            &format!("  {keys:<10}"),
            what,
            Some(inner),
            &" ".repeat(12),
        ));
    }
    text.extend(legend::wrap(
        "",
        "Yellow: a queue is stopped now; red: stuck; dim: the device went away. The \
         detail's sources say why a backend was not used.",
        Some(inner),
        "",
    ));
    text.extend(legend::columns_lines(&state.columns, Some(inner)));
    let height = u16::try_from(text.len() + 2)
        .unwrap_or(u16::MAX)
        .min(area.height);
    let popup = Rect {
        x: area.x + (area.width - width) / 2,
        y: area.y + (area.height - height) / 2,
        width,
        height,
    };
    frame.render_widget(Clear, popup);
    frame.render_widget(
        Paragraph::new(text.into_iter().map(TextLine::raw).collect::<Vec<_>>())
            .block(Block::bordered().title(" legend (any key closes it) ")),
        popup,
    );
}
