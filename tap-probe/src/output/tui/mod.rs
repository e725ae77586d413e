//! `watch --tui`: the full-screen view (ratatui on crossterm). The loop waits, in the stop's
//! own wait ([`Stop::wait`]), for a key, a resize, the next refresh, the end of
//! `--duration` or the run's stop (a signal, a terminal that went away); q and Ctrl-C end
//! it. Keys are read by [`keyboard`], not crossterm (see there why). The terminal is
//! restored on every way out: the guard's drop, and a panic hook that restores it before
//! the panic message is printed (raw mode would garble it otherwise).

mod draw;
mod keyboard;
mod keys;
pub(crate) mod state;

use std::io::IsTerminal as _;
use std::sync::Once;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::{Duration, Instant};

use anyhow::bail;
use nix::poll::PollFlags;
use ratatui::Terminal;
use ratatui::backend::CrosstermBackend;
use ratatui::crossterm::{cursor, execute, terminal};

use keyboard::{Input, Keyboard};
pub(crate) use state::State;
use tap_probe_observer::host::report::Report;
use tap_probe_observer::os::signals::{Resize, Stop, Why, Woke};

/// Whether the terminal is in the full-screen view's mode, to be restored.
static ACTIVE: AtomicBool = AtomicBool::new(false);

/// Checks that the full-screen view can run here.
///
/// # Errors
/// When stdout is not a terminal, or one that cannot move the cursor (`TERM=dumb`), or
/// there is no terminal to read keys from.
pub(crate) fn check() -> anyhow::Result<()> {
    let stdout = std::io::stdout();
    if !stdout.is_terminal() {
        bail!(
            "--tui needs a terminal on stdout; without one, watch prints the compact table \
             (or use --format json)"
        );
    }
    if !crate::output::term::interactive(&stdout) {
        bail!(
            "--tui needs a terminal that can move the cursor, and TERM is `dumb` here; set \
             TERM to the terminal's type, or leave out --tui for the compact table"
        );
    }
    Keyboard::open().map(drop)
}

/// Runs the view until a key, the run's stop or `deadline` ends it, taking a refresh from
/// `refresh` every `interval`. A terminal that goes away stops the run
/// ([`Why::TerminalGone`]). The terminal is back as it was when this returns.
///
/// # Errors
/// When the terminal cannot be set up, or a refresh fails.
pub(crate) fn run(
    state: &mut State,
    interval: Duration,
    deadline: Option<Instant>,
    stop: &Stop,
    mut refresh: impl FnMut() -> anyhow::Result<Report>,
) -> anyhow::Result<()> {
    let mut keyboard = Keyboard::open()?;
    let _resize = Resize::install()?;
    let mut screen = Screen::enter()?;
    let mut next = Instant::now() + interval;
    loop {
        // A terminal that hung up fails the write (EIO): that stops the run.
        screen
            .terminal
            .draw(|frame| draw::draw(frame, state))
            .map_err(crate::output::stdout_failed)?;
        // Wait for something to redraw for.
        loop {
            let now = Instant::now();
            if state.quit || deadline.is_some_and(|d| now >= d) {
                return Ok(());
            }
            if now >= next {
                state.update(refresh()?);
                next = (next + interval).max(now);
                break;
            }
            let until = deadline.map_or(next, |d| d.min(next));
            match stop.wait(Some((keyboard.fd(), PollFlags::POLLIN)), until - now) {
                Woke::Stopped => return Ok(()),
                // A resize, or the time is up (the loop's top tells which).
                Woke::Timeout if Instant::now() < until => break,
                Woke::Timeout => {}
                Woke::Ready(revents) => match keyboard.read(revents) {
                    Input::Keys(keys) if keys.is_empty() => {}
                    Input::Keys(keys) => {
                        for key in keys {
                            state.key(key);
                        }
                        break;
                    }
                    Input::Gone => {
                        tap_probe_observer::os::signals::end(Why::TerminalGone);
                        return Ok(());
                    }
                },
            }
        }
    }
}

/// The terminal in raw mode on the alternate screen, for as long as this lives.
struct Screen {
    terminal: Terminal<CrosstermBackend<std::io::Stdout>>,
}

impl Screen {
    fn enter() -> anyhow::Result<Self> {
        install_panic_hook();
        ACTIVE.store(true, Ordering::SeqCst);
        let entered = terminal::enable_raw_mode()
            .and_then(|()| {
                execute!(
                    std::io::stdout(),
                    terminal::EnterAlternateScreen,
                    cursor::Hide
                )
            })
            .and_then(|()| Terminal::new(CrosstermBackend::new(std::io::stdout())));
        match entered {
            Ok(terminal) => Ok(Self { terminal }),
            Err(err) => {
                restore();
                Err(anyhow::Error::new(err).context("setting up the terminal"))
            }
        }
    }
}

impl Drop for Screen {
    fn drop(&mut self) {
        restore();
    }
}

/// Leaves raw mode and the alternate screen, once.
fn restore() {
    if ACTIVE.swap(false, Ordering::SeqCst) {
        let _ = execute!(
            std::io::stdout(),
            terminal::LeaveAlternateScreen,
            cursor::Show
        );
        let _ = terminal::disable_raw_mode();
    }
}

/// A panic restores the terminal first, then says what happened as it would have.
fn install_panic_hook() {
    static ONCE: Once = Once::new();
    ONCE.call_once(|| {
        let previous = std::panic::take_hook();
        std::panic::set_hook(Box::new(move |info| {
            restore();
            previous(info);
        }));
    });
}

#[cfg(test)]
mod tests {
    use ratatui::backend::TestBackend;
    use ratatui::crossterm::event::{KeyCode, KeyEvent, KeyModifiers};

    use super::*;
    use crate::output::columns::defaults;
    use crate::output::lines::tests::{report, row};

    /// The screen as text, one string per line.
    fn screen(state: &State, width: u16, height: u16) -> Vec<String> {
        let mut terminal = Terminal::new(TestBackend::new(width, height)).unwrap();
        terminal.draw(|f| draw::draw(f, state)).unwrap();
        let buffer = terminal.backend().buffer();
        (0..height)
            .map(|y| {
                (0..width)
                    .map(|x| buffer[(x, y)].symbol().to_owned())
                    .collect::<String>()
                    .trim_end()
                    .to_owned()
            })
            .collect()
    }

    fn state() -> State {
        let mut mq = vec![row("tp-mq", 0, 0, 0), row("tp-mq", 1, 0, 0)];
        let mut state = State::new(
            report(1.0, [vec![row("tp-load0", 0, 0, 0)], mq.clone()].concat()),
            defaults(),
        );
        mq[0].counters.consumed = 4000;
        mq[1].counters.dropped_full_ring = 700;
        mq[1].stopped = true;
        state.update(report(
            2.0,
            [vec![row("tp-load0", 0, 20_000, 80_000)], mq].concat(),
        ));
        state
    }

    #[test]
    fn the_screen_has_the_devices_the_detail_and_the_keys_at_every_width() {
        let state = state();
        for width in [80, 100, 120] {
            let lines = screen(&state, width, 36);
            let text = lines.join("\n");
            assert!(lines[0].contains("tap-probe watch"), "{text}");
            assert!(
                lines[1].contains("DELIVERED/s") || lines[1].contains("DELIV/s"),
                "{text}"
            );
            assert!(
                lines[2].contains("tp-load0") && lines[2].contains("20000"),
                "{text}"
            );
            assert!(lines[2].contains("80000"), "ring drops/s: {text}");
            // The selected device's detail: every counter, its rate, the sparklines.
            for m in METRICS {
                assert!(text.contains(m.name), "{} in the detail:\n{text}", m.name);
            }
            assert!(text.contains("delivered/s 20000"), "{text}");
            assert!(text.contains("ring drops/s 80000"), "{text}");
            assert!(
                text.contains("80000/s"),
                "the rate beside the total: {text}"
            );
            assert!(text.contains("sources: driver calls:"), "{text}");
            assert!(lines.last().unwrap().contains("q quit"), "{text}");
        }
    }

    use tap_probe_common::METRICS;

    #[test]
    fn a_multiqueue_device_shows_its_queues_and_a_stopped_one_is_marked() {
        let mut state = state();
        state.key(KeyEvent::new(KeyCode::Down, KeyModifiers::NONE));
        let lines = screen(&state, 100, 30);
        let text = lines.join("\n");
        assert!(text.contains("tp-mq (netns"), "{text}");
        // The device's line says `now`: one of its queues is stopped.
        let device = lines.iter().find(|l| l.starts_with("tp-mq")).unwrap();
        assert!(device.contains("now"), "{text}");
        assert!(device.contains("all"), "{text}");
        // Its queues in the detail, queue 1 stopped.
        assert!(
            lines.iter().any(|l| l.contains("│1 ") && l.contains("now")),
            "{text}"
        );
    }

    /// What the kernel skipped shows in the title and in the detail.
    #[test]
    fn counts_that_may_be_short_say_so() {
        let mut state = state();
        let text = screen(&state, 100, 36).join("\n");
        assert!(text.contains("missed by the kernel: nothing"), "{text}");
        assert!(!text.contains("MAY BE SHORT"), "{text}");
        // A device that came and went unnamed is said, and is not a miss.
        let mut report = state.report.clone();
        report.gone_unnamed = 1;
        state.update(report);
        let text = screen(&state, 100, 36).join("\n");
        assert!(text.contains("missed by the kernel: nothing"), "{text}");
        assert!(text.contains("1 device came and went"), "{text}");
        assert!(!text.contains("MAY BE SHORT"), "{text}");
        let mut report = state.report.clone();
        report.missed = vec![tap_probe_observer::bpf::missed::ProgramMissed {
            program: "xmit_entry".to_owned(),
            runs: Some(2),
            kprobe: Some(3),
        }];
        state.update(report);
        let lines = screen(&state, 100, 36);
        let text = lines.join("\n");
        assert!(lines[0].contains("COUNTS MAY BE SHORT"), "{text}");
        // The detail wraps it in its pane: runs skipped and kprobe hits that ran nothing.
        assert!(text.contains("COUNTS MAY BE SHORT: the kernel"), "{text}");
        assert!(text.contains("xmit_entry 5"), "{text}");
    }

    #[test]
    fn the_legend_covers_the_screen_until_a_key() {
        let mut state = state();
        state.key(KeyEvent::new(KeyCode::Char('?'), KeyModifiers::NONE));
        let text = screen(&state, 80, 30).join("\n");
        assert!(text.contains("legend (any key closes it)"), "{text}");
        assert!(text.contains("tail-drop"), "{text}");
        state.key(KeyEvent::new(KeyCode::Char('x'), KeyModifiers::NONE));
        let text = screen(&state, 80, 30).join("\n");
        assert!(!text.contains("legend (any key"), "{text}");
    }

    #[test]
    fn a_tiny_screen_does_not_panic() {
        let state = state();
        for (w, h) in [(1, 1), (10, 3), (20, 5), (80, 2)] {
            screen(&state, w, h);
        }
    }
}
