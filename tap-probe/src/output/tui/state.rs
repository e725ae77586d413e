//! What the full-screen view shows and how keys change it: plain data, tested without a
//! terminal. Refreshes come in through [`State::update`], keys through [`State::key`].

use std::collections::{HashMap, VecDeque};

use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};
use tap_probe_common::MetricId;

use crate::output::columns::{Column, What};
use crate::output::compact::{Grid, GridLine, Key, Mode};
use crate::output::lines::{DeviceId, lines};
use tap_probe_observer::host::report::{Report, Value};

/// Rates kept per device for the sparklines: more than any window is wide.
pub(crate) const HISTORY: usize = 512;
/// How far `PageUp` and `PageDown` move.
const PAGE: usize = 10;

/// A device's recent rates, oldest first.
#[derive(Clone, Debug, Default, PartialEq, Eq)]
pub(crate) struct History {
    pub(crate) delivered: VecDeque<u64>,
    pub(crate) ring_drops: VecDeque<u64>,
}

/// The order of the devices.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Order {
    Ascending,
    Descending,
}

/// The full-screen view's state.
#[derive(Debug)]
pub(crate) struct State {
    pub(crate) columns: Vec<&'static Column>,
    pub(crate) report: Report,
    pub(crate) previous: Option<Report>,
    /// The lines of the last refresh, with their rates.
    pub(crate) grid: Grid,
    pub(crate) history: HashMap<DeviceId, History>,
    /// The column the devices are sorted by (an index into `columns`), and the order.
    pub(crate) sort: usize,
    pub(crate) order: Order,
    /// The selected device, kept by identity across refreshes and sorts.
    pub(crate) selected: Option<DeviceId>,
    /// The selected device's detail is shown.
    pub(crate) detail: bool,
    /// The legend is shown over the rest.
    pub(crate) legend: bool,
    pub(crate) quit: bool,
}

impl State {
    /// The view of a first refresh, sorted by device, the first one selected.
    #[must_use]
    pub(crate) fn new(first: Report, columns: Vec<&'static Column>) -> Self {
        let grid = Grid::new(&first, None, &columns, Mode::Rates);
        let sort = columns
            .iter()
            .position(|c| c.what == What::Device)
            .unwrap_or(0);
        let mut state = Self {
            columns,
            report: first,
            previous: None,
            grid,
            history: HashMap::new(),
            sort,
            order: Order::Ascending,
            selected: None,
            detail: true,
            legend: false,
            quit: false,
        };
        state.selected = state.devices().first().map(|l| l.id.device.clone());
        state
    }

    /// Takes a refresh: new rates, a step of every device's history. The selection stays
    /// on its device, or on the same place in the list when the device went away.
    pub(crate) fn update(&mut self, report: Report) {
        let place = self.selected_index();
        let previous = std::mem::replace(&mut self.report, report);
        self.grid = Grid::new(&self.report, Some(&previous), &self.columns, Mode::Rates);
        self.record_history(&previous);
        self.previous = Some(previous);
        let devices = self.devices();
        let still_there = self
            .selected
            .as_ref()
            .is_some_and(|id| devices.iter().any(|l| l.id.device == *id));
        if !still_there {
            self.selected = place
                .map(|p| p.min(devices.len().saturating_sub(1)))
                .and_then(|p| devices.get(p))
                .map(|l| l.id.device.clone());
        }
    }

    /// Pushes each device's delivered and ring-drop rates since `previous`.
    #[expect(
        clippy::cast_precision_loss,
        clippy::cast_possible_truncation,
        clippy::cast_sign_loss,
        reason = "rates for display"
    )]
    fn record_history(&mut self, previous: &Report) {
        let dt = self.report.elapsed_s - previous.elapsed_s;
        if dt <= 0.0 {
            return;
        }
        let before: HashMap<_, _> = lines(previous)
            .into_iter()
            .filter(|l| !l.under)
            .map(|l| (l.id.device.clone(), l))
            .collect();
        let rate = |now: Value, then: Value| match (now, then) {
            (Value::Count(now), Value::Count(then)) => {
                (now.saturating_sub(then) as f64 / dt).round() as u64
            }
            _ => 0,
        };
        for line in lines(&self.report)
            .iter()
            .filter(|l| !l.under && !l.retired())
        {
            let Some(then) = before.get(&line.id.device) else {
                continue;
            };
            let history = self.history.entry(line.id.device.clone()).or_default();
            for (series, id) in [
                (&mut history.delivered, MetricId::Consumed),
                (&mut history.ring_drops, MetricId::DroppedFullRing),
            ] {
                let metric = id.metric();
                series.push_back(rate(line.value(metric), then.value(metric)));
                if series.len() > HISTORY {
                    series.pop_front();
                }
            }
        }
    }

    /// The devices' lines (a device's own line, not its queues'), sorted.
    #[must_use]
    pub(crate) fn devices(&self) -> Vec<&GridLine> {
        let mut devices: Vec<&GridLine> = self.grid.lines.iter().filter(|l| !l.folded).collect();
        let sort = self.sort;
        devices.sort_by(|a, b| {
            let order = key(a, sort).order(key(b, sort));
            match self.order {
                Order::Ascending => order,
                Order::Descending => order.reverse(),
            }
        });
        devices
    }

    /// Where the selected device is in [`State::devices`].
    #[must_use]
    pub(crate) fn selected_index(&self) -> Option<usize> {
        let id = self.selected.as_ref()?;
        self.devices().iter().position(|l| l.id.device == *id)
    }

    /// Acts on a key.
    pub(crate) fn key(&mut self, key: KeyEvent) {
        if key.modifiers.contains(KeyModifiers::CONTROL) {
            if key.code == KeyCode::Char('c') {
                self.quit = true;
            }
            return;
        }
        if self.legend {
            // Any key closes the legend; q still quits.
            self.legend = false;
            self.quit = key.code == KeyCode::Char('q');
            return;
        }
        match key.code {
            KeyCode::Char('q') => self.quit = true,
            KeyCode::Char('?') => self.legend = true,
            KeyCode::Esc => self.detail = false,
            KeyCode::Enter | KeyCode::Char('d') => self.detail = !self.detail,
            KeyCode::Up | KeyCode::Char('k') => self.select_by(-1),
            KeyCode::Down | KeyCode::Char('j') => self.select_by(1),
            KeyCode::PageUp => self.select_by(-isize::try_from(PAGE).unwrap_or(1)),
            KeyCode::PageDown => self.select_by(isize::try_from(PAGE).unwrap_or(1)),
            KeyCode::Home | KeyCode::Char('g') => self.select_at(0),
            KeyCode::End | KeyCode::Char('G') => self.select_at(usize::MAX),
            KeyCode::Char('s' | '>') | KeyCode::Right => self.sort_by(1),
            KeyCode::Char('S' | '<') | KeyCode::Left => self.sort_by(-1),
            KeyCode::Char('r') => {
                self.order = match self.order {
                    Order::Ascending => Order::Descending,
                    Order::Descending => Order::Ascending,
                };
            }
            _ => {}
        }
    }

    fn select_by(&mut self, step: isize) {
        let at = self.selected_index().unwrap_or(0);
        self.select_at(at.saturating_add_signed(step));
    }

    fn select_at(&mut self, at: usize) {
        let devices = self.devices();
        let at = at.min(devices.len().saturating_sub(1));
        self.selected = devices.get(at).map(|l| l.id.device.clone());
    }

    /// Sorts by the next (or previous) column: numbers largest first, names from A.
    fn sort_by(&mut self, step: isize) {
        let n = self.columns.len();
        let step = step.rem_euclid(isize::try_from(n).unwrap_or(1));
        self.sort = (self.sort + step.unsigned_abs()) % n.max(1);
        self.order = match self.columns[self.sort].what {
            What::Device | What::Netns | What::Kind | What::Owner | What::Queue => Order::Ascending,
            What::Rate(_) | What::Stopped | What::State(_) => Order::Descending,
        };
    }

    /// The header the devices are sorted by, with the order.
    #[must_use]
    pub(crate) fn sorted_by(&self) -> String {
        format!(
            "{} {}",
            self.columns[self.sort].header(false, true),
            match self.order {
                Order::Ascending => "↑",
                Order::Descending => "↓",
            }
        )
    }
}

fn key(line: &GridLine, column: usize) -> &Key {
    &line.keys[column]
}

#[cfg(test)]
mod tests {
    use ratatui::crossterm::event::KeyEvent;

    use super::*;
    use crate::output::columns::defaults;
    use crate::output::lines::tests::{report, row};

    fn press(state: &mut State, code: KeyCode) {
        state.key(KeyEvent::new(code, KeyModifiers::NONE));
    }

    fn names(state: &State) -> Vec<String> {
        state
            .devices()
            .iter()
            .map(|l| l.id.device.ifname.clone())
            .collect()
    }

    fn two_refreshes() -> State {
        let mut state = State::new(
            report(
                1.0,
                vec![row("a", 0, 0, 0), row("b", 0, 0, 0), row("c", 0, 0, 0)],
            ),
            defaults(),
        );
        state.update(report(
            2.0,
            vec![
                row("a", 0, 100, 5),
                row("b", 0, 300, 1),
                row("c", 0, 200, 50),
            ],
        ));
        state
    }

    #[test]
    fn sorting_cycles_through_the_columns_and_reverses() {
        let mut state = two_refreshes();
        assert_eq!(names(&state), ["a", "b", "c"], "by device at first");
        assert_eq!(state.selected.as_ref().unwrap().ifname, "a");
        // s moves to the next columns: netns, queue, then delivered, largest first.
        for _ in 0..3 {
            press(&mut state, KeyCode::Char('s'));
        }
        assert_eq!(state.sorted_by(), "DELIVERED/s ↓");
        assert_eq!(names(&state), ["b", "c", "a"]);
        press(&mut state, KeyCode::Char('s'));
        assert_eq!(state.sorted_by(), "RING_DROPS/s ↓");
        assert_eq!(names(&state), ["c", "a", "b"]);
        press(&mut state, KeyCode::Char('r'));
        assert_eq!(names(&state), ["b", "a", "c"]);
        press(&mut state, KeyCode::Char('S'));
        assert_eq!(state.sorted_by(), "DELIVERED/s ↓");
        // The selection follows its device through the sorts.
        assert_eq!(state.selected.as_ref().unwrap().ifname, "a");
        assert_eq!(state.selected_index(), Some(2));
    }

    #[test]
    fn selection_moves_within_bounds_and_survives_a_device_going_away() {
        let mut state = two_refreshes();
        press(&mut state, KeyCode::Up);
        assert_eq!(state.selected_index(), Some(0));
        press(&mut state, KeyCode::Down);
        press(&mut state, KeyCode::Down);
        press(&mut state, KeyCode::Down);
        assert_eq!(state.selected.as_ref().unwrap().ifname, "c");
        press(&mut state, KeyCode::Home);
        assert_eq!(state.selected.as_ref().unwrap().ifname, "a");
        press(&mut state, KeyCode::End);
        assert_eq!(state.selected.as_ref().unwrap().ifname, "c");
        // c goes: the selection stays at the end of the list.
        state.update(report(3.0, vec![row("a", 0, 1, 0), row("b", 0, 1, 0)]));
        assert_eq!(state.selected.as_ref().unwrap().ifname, "b");
    }

    #[test]
    fn detail_legend_and_quitting() {
        let mut state = two_refreshes();
        assert!(state.detail);
        press(&mut state, KeyCode::Enter);
        assert!(!state.detail);
        press(&mut state, KeyCode::Char('d'));
        assert!(state.detail);
        press(&mut state, KeyCode::Char('?'));
        assert!(state.legend);
        press(&mut state, KeyCode::Char('j'));
        assert!(!state.legend && !state.quit, "a key closes the legend");
        assert_eq!(state.selected_index(), Some(0), "and does nothing else");
        press(&mut state, KeyCode::Char('q'));
        assert!(state.quit);
        let mut state = two_refreshes();
        state.key(KeyEvent::new(KeyCode::Char('c'), KeyModifiers::CONTROL));
        assert!(state.quit, "Ctrl-C quits: raw mode turns it into a key");
    }

    #[test]
    fn history_keeps_each_devices_rates() {
        let mut state = two_refreshes();
        state.update(report(
            3.0,
            vec![
                row("a", 0, 150, 5),
                row("b", 0, 300, 1),
                row("c", 0, 200, 80),
            ],
        ));
        let a = &state.history[&state.devices()[0].id.device];
        assert_eq!(a.delivered, [100, 50]);
        assert_eq!(a.ring_drops, [5, 0]);
        let c = state
            .history
            .iter()
            .find(|(id, _)| id.ifname == "c")
            .unwrap()
            .1;
        assert_eq!(c.ring_drops, [50, 30]);
    }
}
