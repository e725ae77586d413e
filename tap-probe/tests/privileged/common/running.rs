//! `tap-probe watch` running beside a test: started as a child, its output read line by line
//! as it comes, killed if the test fails before it is ended.

use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::mpsc::Receiver;
use std::time::{Duration, Instant};

use super::BIN;

/// Kills a child (`tap-probe`, mostly) if the test fails before it is reaped.
pub(crate) struct ChildGuard(pub(crate) Option<Child>);

impl ChildGuard {
    /// The child's pid.
    pub(crate) fn pid(&self) -> nix::unistd::Pid {
        let child = self.0.as_ref().expect("a child not yet reaped");
        nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap())
    }

    /// Waits for the child to exit, at most `limit`: its status, or `None` if it still runs
    /// then (the guard still holds it).
    pub(crate) fn wait_within(&mut self, limit: Duration) -> Option<ExitStatus> {
        let end = Instant::now() + limit;
        let child = self.0.as_mut().expect("a child not yet reaped");
        loop {
            if let Some(status) = child.try_wait().unwrap() {
                self.0 = None;
                return Some(status);
            }
            if Instant::now() >= end {
                return None;
            }
            std::thread::sleep(Duration::from_millis(20));
        }
    }
}

impl Drop for ChildGuard {
    fn drop(&mut self) {
        if let Some(child) = &mut self.0 {
            let _ = child.kill();
            let _ = child.wait();
        }
    }
}

/// Which of a child's outputs a test reads line by line.
#[derive(Clone, Copy)]
pub(crate) enum Lines {
    Stdout,
    Stderr,
}

/// `tap-probe watch` running beside a test (killed if the test fails first), and the lines
/// of one of its outputs as they come.
pub(crate) struct Running {
    pub(crate) guard: ChildGuard,
    pub(crate) lines: Receiver<String>,
}

impl Running {
    /// Starts `tap-probe watch` with `filter` and `options`.
    pub(crate) fn watch(filter: &[&str], options: &[&str], read: Lines) -> Self {
        let mut child = super::stoppable(&mut Command::new(BIN))
            .arg("watch")
            .args(filter)
            .args(options)
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .spawn()
            .unwrap();
        let stream: Box<dyn std::io::Read + Send> = match read {
            Lines::Stdout => Box::new(child.stdout.take().unwrap()),
            Lines::Stderr => Box::new(child.stderr.take().unwrap()),
        };
        let (tx, lines) = std::sync::mpsc::channel();
        std::thread::spawn(move || {
            use std::io::BufRead as _;
            for line in std::io::BufReader::new(stream)
                .lines()
                .map_while(Result::ok)
            {
                let _ = tx.send(line);
            }
        });
        Self {
            guard: ChildGuard(Some(child)),
            lines,
        }
    }

    /// Ends it with SIGTERM: whether it stopped in order ([`super::stopped_by`]), and the
    /// lines not taken yet.
    pub(crate) fn terminate(mut self) -> (bool, Vec<String>) {
        let mut child = self.guard.0.take().unwrap();
        let pid = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let clean = super::stopped_by(child.wait().unwrap(), nix::sys::signal::Signal::SIGTERM);
        (clean, self.lines.iter().collect())
    }
}
