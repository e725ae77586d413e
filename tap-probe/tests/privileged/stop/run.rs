//! A `tap-probe` command under test: started on a pseudo-terminal (as in a terminal window)
//! or on pipes with stdin at end of file (as under systemd or nohup), its output collected as
//! it comes, stopped the way a user or the system stops it, and its exit bounded. Dropping a
//! run that is still going ends it, so a failed assertion leaves nothing running.

use std::fs::File;
use std::io::Read as _;
use std::os::fd::{AsFd as _, OwnedFd};
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::{Arc, Mutex};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use nix::poll::{PollFd, PollFlags, PollTimeout};
use nix::pty::{Winsize, openpty};
use nix::sys::signal::{Signal, kill};
use nix::unistd::Pid;

use crate::common::BIN;

/// How a run is connected.
#[derive(Clone, Copy, Debug, PartialEq, Eq)]
pub(crate) enum Io {
    /// A pseudo-terminal of 120 x 40 as stdin, stdout and stderr. `controlling`: it is also
    /// the command's controlling terminal, the command leading a session of its own (a
    /// shell's job in a terminal window), so the kernel sends it SIGHUP when the terminal
    /// closes; otherwise only reads and writes tell it.
    Pty { controlling: bool },
    /// As [`Io::Pty`] with stdin at end of file (`< /dev/null`).
    PtyOutput { controlling: bool },
    /// Stdin at end of file, stdout and stderr pipes read by the test.
    Pipes,
}

/// Options for [`Run::start`] beyond its arguments.
#[derive(Clone, Copy, Debug, Default)]
pub(crate) struct Start {
    /// SIGHUP ignored, as `nohup` starts a command.
    pub(crate) sighup_ignored: bool,
}

/// A command under test.
pub(crate) struct Run {
    pub(crate) name: String,
    child: Option<Child>,
    /// Everything written to the terminal, or to stdout.
    output: Arc<Mutex<Vec<u8>>>,
    /// Stderr, on pipes.
    errors: Arc<Mutex<Vec<u8>>>,
    /// The terminal's master side, while the test keeps it open.
    master: Option<Arc<File>>,
    /// Set to make the terminal's reader close its copy of the master.
    hang_up: Arc<AtomicBool>,
    /// The terminal's reader.
    pty_reader: Option<JoinHandle<()>>,
    /// The pipes' readers.
    readers: Vec<JoinHandle<()>>,
    /// When the run was told to stop.
    stopped_at: Option<Instant>,
}

impl Run {
    /// Starts `tap-probe ARGS` on `io`. Off a controlling terminal the command leads a
    /// process group of its own, as a shell's job does, so that a signal to the group
    /// reaches it and what it started.
    pub(crate) fn start(name: &str, args: &[String], io: Io, options: Start) -> Self {
        let mut command = Command::new(BIN);
        command.args(args);
        let output = Arc::new(Mutex::new(Vec::new()));
        let errors = Arc::new(Mutex::new(Vec::new()));
        let hang_up = Arc::new(AtomicBool::new(false));
        let mut pty_reader = None;
        let mut master = None;
        let controlling = match io {
            Io::Pty { controlling } | Io::PtyOutput { controlling } => {
                let (pty_master, slave) = pty();
                let input = if matches!(io, Io::Pty { .. }) {
                    Stdio::from(slave.try_clone().unwrap())
                } else {
                    Stdio::null()
                };
                // This side reads what the command draws whatever TERM the test has (a
                // guest's serial console is `dumb`).
                command
                    .env("TERM", "xterm-256color")
                    .stdin(input)
                    .stdout(Stdio::from(slave.try_clone().unwrap()))
                    .stderr(Stdio::from(slave));
                let pty_master = Arc::new(File::from(pty_master));
                pty_reader = Some(read_master(
                    Arc::clone(&pty_master),
                    Arc::clone(&output),
                    Arc::clone(&hang_up),
                ));
                master = Some(pty_master);
                controlling
            }
            Io::Pipes => {
                command
                    .stdin(Stdio::null())
                    .stdout(Stdio::piped())
                    .stderr(Stdio::piped());
                false
            }
        };
        let sighup = if options.sighup_ignored {
            libc::SIG_IGN
        } else {
            libc::SIG_DFL
        };
        if !controlling {
            command.process_group(0);
        }
        // Whatever the test runner was started with (nohup, a background job), the command
        // starts as a shell would start it.
        crate::common::stoppable(&mut command);
        // SAFETY: between fork and exec, only async-signal-safe calls: signal, setsid, ioctl.
        unsafe {
            command.pre_exec(move || {
                libc::signal(libc::SIGHUP, sighup);
                // Stdout is the terminal here (stdin may be /dev/null).
                if controlling && (libc::setsid() < 0 || libc::ioctl(1, libc::TIOCSCTTY, 0) < 0) {
                    return Err(std::io::Error::last_os_error());
                }
                Ok(())
            });
        }
        let mut child = command.spawn().expect("tap-probe starts");
        // The copies of the terminal's slave side go with `command`: only the child holds
        // it now, so the child's end shows as the master's end of file.
        drop(command);
        let mut readers = Vec::new();
        if let Some(stdout) = child.stdout.take() {
            readers.push(read_pipe(stdout, Arc::clone(&output)));
        }
        if let Some(stderr) = child.stderr.take() {
            readers.push(read_pipe(stderr, Arc::clone(&errors)));
        }
        Self {
            name: name.to_owned(),
            child: Some(child),
            output,
            errors,
            master,
            hang_up,
            pty_reader,
            readers,
            stopped_at: None,
        }
    }

    pub(crate) fn pid(&self) -> u32 {
        self.child.as_ref().expect("running").id()
    }

    /// Whether the command still runs.
    pub(crate) fn running(&mut self) -> bool {
        matches!(
            self.child.as_mut().expect("not reaped").try_wait(),
            Ok(None)
        )
    }

    /// The terminal's output (control sequences and all), or stdout.
    pub(crate) fn output(&self) -> String {
        String::from_utf8_lossy(&self.output.lock().unwrap()).into_owned()
    }

    /// Stderr, on pipes.
    pub(crate) fn errors(&self) -> String {
        String::from_utf8_lossy(&self.errors.lock().unwrap()).into_owned()
    }

    /// Both, for failure messages.
    pub(crate) fn said(&self) -> String {
        format!(
            "--- {} output:\n{}\n--- stderr:\n{}",
            self.name,
            self.output(),
            self.errors()
        )
    }

    /// Waits, bounded, until `ready` holds of the output and stderr.
    pub(crate) fn wait_for(
        &mut self,
        within: Duration,
        what: &str,
        ready: impl Fn(&str, &str) -> bool,
    ) {
        let deadline = Instant::now() + within;
        while !ready(&self.output(), &self.errors()) {
            if let Some(status) = self.child.as_mut().unwrap().try_wait().unwrap() {
                panic!(
                    "{} exited ({status}) before {what}:\n{}",
                    self.name,
                    self.said()
                );
            }
            assert!(
                Instant::now() < deadline,
                "{}: not {what} within {within:?}:\n{}",
                self.name,
                self.said()
            );
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends `signal` to the command.
    pub(crate) fn signal(&mut self, signal: Signal) {
        self.stopped_at = Some(Instant::now());
        kill(Pid::from_raw(i32::try_from(self.pid()).unwrap()), signal).unwrap();
    }

    /// Writes `bytes` to the terminal, as typed.
    pub(crate) fn type_keys(&mut self, bytes: &[u8]) {
        use std::io::Write as _;
        self.stopped_at = Some(Instant::now());
        (&**self.master.as_ref().expect("a terminal"))
            .write_all(bytes)
            .unwrap();
    }

    /// Closes the terminal: its master side, every copy, as a closed window or an ended ssh
    /// session does.
    pub(crate) fn hang_up(&mut self) {
        self.master.take().expect("a terminal");
        self.hang_up.store(true, Ordering::SeqCst);
        // The reader holds the other copy; once it returned, the master is closed (and the
        // kernel hung the terminal up in that close: `pty_close`).
        self.pty_reader.take().unwrap().join().unwrap();
        self.stopped_at = Some(Instant::now());
    }

    /// The terminal's modes now (it must still be open).
    pub(crate) fn termios(&self) -> nix::sys::termios::Termios {
        nix::sys::termios::tcgetattr(self.master.as_ref().expect("a terminal").as_fd()).unwrap()
    }

    /// Waits for the command's exit, which must come within `within` of its stop; its status
    /// and how long it took. The output is complete afterwards.
    pub(crate) fn exit_within(&mut self, within: Duration) -> (ExitStatus, Duration) {
        let from = self.stopped_at.unwrap_or_else(Instant::now);
        let child = self.child.as_mut().expect("running");
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            assert!(
                from.elapsed() < within,
                "{} still ran {within:?} after it was stopped:\n{}",
                self.name,
                self.said()
            );
            std::thread::sleep(Duration::from_millis(10));
        };
        let took = from.elapsed();
        self.child = None;
        // The readers end at the output's end; one that a process left behind still holds
        // open is ended by the test (and that process is found by the leftover checks).
        let readers: Vec<_> = self
            .readers
            .drain(..)
            .chain(self.pty_reader.take())
            .collect();
        let deadline = Instant::now() + Duration::from_secs(5);
        while readers.iter().any(|r| !r.is_finished()) && Instant::now() < deadline {
            std::thread::sleep(Duration::from_millis(10));
        }
        self.hang_up.store(true, Ordering::SeqCst);
        for reader in readers.into_iter().filter(JoinHandle::is_finished) {
            reader.join().unwrap();
        }
        (status, took)
    }
}

impl Drop for Run {
    fn drop(&mut self) {
        // A test that failed: SIGTERM, so that the command undoes what it made, then
        // SIGKILL for one that does not end.
        if let Some(mut child) = self.child.take() {
            let pid = Pid::from_raw(i32::try_from(child.id()).unwrap());
            let _ = kill(pid, Signal::SIGTERM);
            let deadline = Instant::now() + Duration::from_secs(10);
            while matches!(child.try_wait(), Ok(None)) && Instant::now() < deadline {
                std::thread::sleep(Duration::from_millis(20));
            }
            let _ = child.kill();
            let _ = child.wait();
        }
        self.hang_up.store(true, Ordering::SeqCst);
    }
}

/// A pseudo-terminal of 120 x 40, both sides closed on exec: a command started later must
/// not hold another test's terminal open.
fn pty() -> (OwnedFd, OwnedFd) {
    let size = Winsize {
        ws_row: 40,
        ws_col: 120,
        ws_xpixel: 0,
        ws_ypixel: 0,
    };
    let pty = openpty(&size, None).expect("a pseudo-terminal");
    for fd in [&pty.master, &pty.slave] {
        nix::fcntl::fcntl(
            fd,
            nix::fcntl::FcntlArg::F_SETFD(nix::fcntl::FdFlag::FD_CLOEXEC),
        )
        .unwrap();
    }
    (pty.master, pty.slave)
}

/// Copies what the command writes to the terminal into `into`, until the command closed its
/// side (`EIO`) or the test hangs up, when this closes its copy of the master.
fn read_master(
    master: Arc<File>,
    into: Arc<Mutex<Vec<u8>>>,
    hang_up: Arc<AtomicBool>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while !hang_up.load(Ordering::SeqCst) {
            let mut fds = [PollFd::new(master.as_fd(), PollFlags::POLLIN)];
            if nix::poll::poll(&mut fds, PollTimeout::from(20u8)).unwrap_or(0) == 0 {
                continue;
            }
            match (&*master).read(&mut buf) {
                Ok(n @ 1..) => into.lock().unwrap().extend_from_slice(&buf[..n]),
                _ => break,
            }
        }
    })
}

fn read_pipe(
    mut pipe: impl std::io::Read + Send + 'static,
    into: Arc<Mutex<Vec<u8>>>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut buf = [0u8; 4096];
        while let Ok(n @ 1..) = pipe.read(&mut buf) {
            into.lock().unwrap().extend_from_slice(&buf[..n]);
        }
    })
}
