//! `tap-probe watch` on a terminal: under a pseudo-terminal of 100 columns, with a load
//! whose tap goes away before the end, every line fits, and the final summary lists the
//! device that went away with its exact totals; the full-screen view quits on q and leaves
//! the terminal as it found it.

use std::io::Read as _;
use std::os::fd::OwnedFd;
use std::process::{Command, Stdio};
use std::sync::mpsc;
use std::time::{Duration, Instant};

use nix::pty::{Winsize, openpty};
use nix::sys::signal::{Signal, kill};
use nix::sys::termios::{LocalFlags, tcgetattr};
use tap_probe_spec::load::LoadNumbers;

use crate::common;
use crate::common::BIN;
use crate::common::running::ChildGuard;

const COLUMNS: u16 = 100;

/// `command` started, killed if the test fails before it is reaped.
fn spawn(command: &mut Command) -> ChildGuard {
    ChildGuard(Some(
        common::stoppable(command)
            .spawn()
            .expect("tap-probe starts"),
    ))
}

/// Waits (bounded) for `child` to exit; its status.
fn exited(child: &mut ChildGuard, within: Duration) -> std::process::ExitStatus {
    child
        .wait_within(within)
        .unwrap_or_else(|| panic!("tap-probe did not exit in {within:?}"))
}

/// A pseudo-terminal of [`COLUMNS`] x 40 whose slave is a command's stdin, stdout and
/// stderr; what the command writes arrives on the returned channel.
struct Pty {
    master: std::fs::File,
    slave: Option<OwnedFd>,
    output: mpsc::Receiver<Vec<u8>>,
}

impl Pty {
    fn open() -> Self {
        let size = Winsize {
            ws_row: 40,
            ws_col: COLUMNS,
            ws_xpixel: 0,
            ws_ypixel: 0,
        };
        let pty = openpty(&size, None).expect("a pseudo-terminal");
        let master = std::fs::File::from(pty.master);
        let mut reader = master.try_clone().unwrap();
        let (tx, output) = mpsc::channel();
        std::thread::spawn(move || {
            let mut buf = [0u8; 4096];
            // Ends with EIO once the last slave descriptor is closed.
            while let Ok(n @ 1..) = reader.read(&mut buf) {
                if tx.send(buf[..n].to_vec()).is_err() {
                    break;
                }
            }
        });
        Self {
            master,
            slave: Some(pty.slave),
            output,
        }
    }

    /// Starts `command` on the terminal; this side's copy of the slave is closed, so the
    /// output ends when the command does.
    fn spawn(&mut self, command: &mut Command) -> ChildGuard {
        let slave = self.slave.take().unwrap();
        // This side interprets the cursor movements of a common terminal, whatever TERM the
        // test runs with (a guest's serial console is `dumb`).
        command
            .env("TERM", "xterm-256color")
            .stdin(Stdio::from(slave.try_clone().unwrap()))
            .stdout(Stdio::from(slave.try_clone().unwrap()))
            .stderr(Stdio::from(slave));
        spawn(command)
    }

    /// Everything written so far, waiting (bounded) until `until` holds of it.
    fn read_until(&self, text: &mut Vec<u8>, within: Duration, until: impl Fn(&str) -> bool) {
        let deadline = Instant::now() + within;
        while !until(&String::from_utf8_lossy(text)) {
            let left = deadline.saturating_duration_since(Instant::now());
            let chunk = self.output.recv_timeout(left).unwrap_or_else(|err| {
                panic!(
                    "not seen within {within:?} ({err}):\n{}",
                    String::from_utf8_lossy(text)
                )
            });
            text.extend(chunk);
        }
    }

    /// The rest of the output, until the command closed the terminal.
    fn read_to_end(&self, text: &mut Vec<u8>) {
        while let Ok(chunk) = self.output.recv_timeout(Duration::from_secs(10)) {
            text.extend(chunk);
        }
    }
}

/// The lines a terminal would show, without the control sequences (CSI `ESC [ ... final`)
/// and carriage returns.
fn screen_lines(raw: &[u8]) -> Vec<String> {
    let text = String::from_utf8_lossy(raw);
    let mut plain = String::new();
    let mut chars = text.chars();
    while let Some(c) = chars.next() {
        if c == '\x1b' {
            if chars.next() == Some('[') {
                for c in chars.by_ref() {
                    if ('@'..='~').contains(&c) {
                        break;
                    }
                }
            }
        } else if c != '\r' {
            plain.push(c);
        }
    }
    plain.lines().map(str::to_owned).collect()
}

#[test]
fn watch_on_a_terminal_fits_it_and_its_summary_keeps_the_device_that_went_away() {
    if !tap_probe_verdict::root() {
        return;
    }
    // The load's tap appears at once and sends after a delay, time for watch to attach and
    // track it (about 2 s in an emulated guest, where loading the programs is slow); the
    // tap is deleted when the load ends, while watch still runs. A ring of 100 and a
    // reader slower than any sender, also in an emulated guest (whose sender manages a
    // few thousand frames a second), and no qdisc, so the ring tail-drops also where a
    // full ring stops the queue (the seeds' tun on 6.12, which would leave the drops to the
    // qdisc).
    let emulated = common::slowdown() > 1;
    let start_delay = if emulated { 12 } else { 4 };
    let reader_pps = if emulated { "100" } else { "10000" };
    let started = Instant::now();
    let mut load = spawn(
        Command::new(BIN)
            .args(["load", "--duration", "2", "--tx-queue-len", "100"])
            .args(["--qdisc", "noqueue"])
            .args(["--start-delay", &start_delay.to_string()])
            .args([
                "--pps",
                "50000",
                "--reader-pps",
                reader_pps,
                "--format",
                "json",
            ])
            .stdout(Stdio::piped())
            .stderr(Stdio::piped()),
    );
    let netns = format!("tap-probe-load-{}", load.pid());
    let mut pty = Pty::open();
    let mut watch = pty.spawn(
        Command::new(BIN)
            .args(["watch", "--dev", "tp-load0", "--netns", &netns, "--wait"])
            .args(["--interval", "0.2", "--duration", "40"]),
    );
    let mut raw = Vec::new();
    pty.read_until(&mut raw, Duration::from_secs(30), |t| {
        t.contains("tp-load0  ")
    });
    // Totals are exact only for a device tracked before its first packet.
    let tracked_after = started.elapsed();
    assert!(
        tracked_after < Duration::from_secs(start_delay),
        "watch tracked the tap only after {tracked_after:?}, when the load had started sending"
    );
    let mut report = load.0.as_mut().unwrap().stdout.take().unwrap();
    assert_eq!(
        exited(&mut load, Duration::from_mins(1)).code(),
        Some(0),
        "the load ran"
    );
    let mut json = String::new();
    report.read_to_string(&mut json).unwrap();
    let report: LoadNumbers = serde_json::from_str(&json).unwrap();
    // Watch sees the tap go away within a refresh or two; then it is stopped.
    pty.read_until(&mut raw, Duration::from_secs(10), |t| t.contains("(gone)"));
    std::thread::sleep(Duration::from_millis(600));
    kill(watch.pid(), Signal::SIGTERM).unwrap();
    let status = exited(&mut watch, Duration::from_secs(20));
    pty.read_to_end(&mut raw);
    let lines = screen_lines(&raw);
    let text = lines.join("\n");
    assert!(common::stopped_by(status, Signal::SIGTERM), "{text}");
    for line in &lines {
        assert!(
            line.chars().count() <= usize::from(COLUMNS),
            "{} columns: {line:?}\n{text}",
            line.chars().count()
        );
    }
    assert!(!text.contains("panicked"), "{text}");
    // The legend once, not on every refresh.
    assert_eq!(text.matches("Rates are per second").count(), 1, "{text}");
    let frame = lines
        .iter()
        .position(|l| l.starts_with("DEVICE") && l.contains("DELIVERED/s"))
        .unwrap_or_else(|| panic!("a frame with full headers at 100 columns:\n{text}"));
    assert!(lines[frame].contains("RING_DROPS/s"), "{text}");
    let summary = lines
        .iter()
        .position(|l| l.starts_with("Final counters after"))
        .unwrap_or_else(|| panic!("a final summary:\n{text}"));
    assert!(
        lines[summary].contains("1 device went away"),
        "{}",
        lines[summary]
    );
    let header: Vec<&str> = lines[summary + 1].split_whitespace().collect();
    let gone = lines[summary + 2..]
        .iter()
        .find(|l| l.starts_with("tp-load0 (gone)"))
        .unwrap_or_else(|| panic!("the tap that went away is in the summary:\n{text}"));
    // "tp-load0 (gone)" is two words where the header has one.
    let cells: Vec<&str> = gone.split_whitespace().skip(1).collect();
    let total = |name: &str| -> u64 {
        let at = header.iter().position(|h| *h == name).unwrap();
        cells[at]
            .parse()
            .unwrap_or_else(|_| panic!("{name}: {gone}"))
    };
    // The kernel's own counters of the tap, as the load read them before deleting it.
    assert!(report.kernel_tx_dropped > 0, "a slow reader: tail-drops");
    assert_eq!(total("DELIVERED"), report.kernel_tx_packets, "{gone}");
    assert_eq!(total("RING_DROPS"), report.kernel_tx_dropped, "{gone}");
}

#[test]
fn the_full_screen_view_quits_on_q_and_restores_the_terminal() {
    if !tap_probe_verdict::root() {
        return;
    }
    // The load runs until the test ends it: the watch attaches only after the kernel has
    // verified its programs, which takes seconds in an emulated guest.
    let mut load = spawn(
        Command::new(BIN)
            .args(["load", "--duration", "60", "--start-delay", "1"])
            .args(["--pps", "20000", "--reader-pps", "5000"])
            .stdout(Stdio::null())
            .stderr(Stdio::null()),
    );
    let netns = format!("tap-probe-load-{}", load.pid());
    let mut pty = Pty::open();
    let before = tcgetattr(&pty.master).unwrap();
    assert!(before.local_flags.contains(LocalFlags::ICANON));
    let mut watch = pty.spawn(
        Command::new(BIN)
            .args(["watch", "--dev", "tp-load0", "--netns", &netns, "--wait"])
            .args(["--tui", "--interval", "0.2", "--duration", "60"]),
    );
    let mut raw = Vec::new();
    pty.read_until(&mut raw, Duration::from_secs(30), |t| {
        t.contains("tp-load0") && t.contains("delivered/s")
    });
    // Raw mode while the view runs: no line editing, no echo.
    let during = tcgetattr(&pty.master).unwrap();
    assert!(!during.local_flags.contains(LocalFlags::ICANON));
    assert!(!during.local_flags.contains(LocalFlags::ECHO));
    {
        use std::io::Write as _;
        (&pty.master).write_all(b"q").unwrap();
    }
    let status = exited(&mut watch, Duration::from_secs(20));
    pty.read_to_end(&mut raw);
    let text = String::from_utf8_lossy(&raw).into_owned();
    assert!(status.success(), "{text}");
    assert!(text.contains("\x1b[?1049h"), "entered the alternate screen");
    let left = text
        .rfind("\x1b[?1049l")
        .expect("left the alternate screen");
    assert!(
        text[left..].contains("Final counters after"),
        "the summary is printed on the normal screen, after the view:\n{text}"
    );
    let after = tcgetattr(&pty.master).unwrap();
    assert_eq!(
        after.local_flags, before.local_flags,
        "line mode and echo are back"
    );
    assert_eq!(after.input_flags, before.input_flags);
    assert_eq!(after.output_flags, before.output_flags);
    kill(load.pid(), Signal::SIGINT).unwrap();
    exited(&mut load, Duration::from_secs(30));
}
