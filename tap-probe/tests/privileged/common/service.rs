//! `tap-probe serve` running beside a test, as a service manager would run it: in a process
//! group of its own (killed whole if the test fails first), its stdout and stderr collected,
//! its address read from its log, and HTTP requests to it.

use std::collections::BTreeSet;
use std::io::{BufRead as _, BufReader, Read as _, Write as _};
use std::os::unix::process::CommandExt as _;
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use tap_probe_observer::bpf::missed::program_recursion_misses;

/// How long `serve` may take to attach and say where it serves, on a machine that is not
/// emulated (see [`super::slowdown`]).
const STARTUP: Duration = Duration::from_mins(1);
/// How long an HTTP response may take, likewise.
const RESPONSE: Duration = Duration::from_secs(10);

/// A running `serve` (possibly under wrappers such as `setpriv` or `strace`).
pub(crate) struct Service {
    child: Option<Child>,
    /// The binary that serves: the process to signal is the one running it.
    binary: PathBuf,
    stderr: Arc<Mutex<Vec<String>>>,
    stdout: Option<std::thread::JoinHandle<String>>,
    /// `IP:PORT` it serves on.
    pub(crate) addr: String,
}

impl Service {
    /// Starts `binary serve` on a free loopback port with the tracepoint backend and `args`,
    /// and waits until it attached; with the ids of the programs it loaded.
    pub(crate) fn tracepoints(binary: &Path, args: &[&str]) -> (Self, BTreeSet<u32>) {
        let before = programs();
        let mut serve = Command::new(binary);
        serve.args([
            "serve",
            "--listen",
            "127.0.0.1:0",
            "--backend",
            "tracepoint",
        ]);
        serve.args(args);
        let service = Self::start(serve, binary);
        let loaded = programs().difference(&before).copied().collect();
        (service, loaded)
    }

    /// Starts `command`, which runs `binary serve ... --listen 127.0.0.1:0` (possibly through
    /// wrappers), and waits for the lines that say where it serves and that it attached.
    pub(crate) fn start(mut command: Command, binary: &Path) -> Self {
        let mut child = super::stoppable(&mut command)
            .stdin(Stdio::null())
            .stdout(Stdio::piped())
            .stderr(Stdio::piped())
            .process_group(0)
            .spawn()
            .expect("serve starts");
        let stderr = Arc::new(Mutex::new(Vec::new()));
        let lines = Arc::clone(&stderr);
        let err = child.stderr.take().expect("piped");
        std::thread::spawn(move || {
            for line in BufReader::new(err).lines().map_while(Result::ok) {
                lines.lock().unwrap().push(line);
            }
        });
        let mut out = child.stdout.take().expect("piped");
        let stdout = std::thread::spawn(move || {
            let mut text = String::new();
            let _ = out.read_to_string(&mut text);
            text
        });
        let mut service = Self {
            child: Some(child),
            binary: binary.to_path_buf(),
            stderr,
            stdout: Some(stdout),
            addr: String::new(),
        };
        let deadline = Instant::now() + STARTUP * super::slowdown();
        service.addr = loop {
            if let Some(addr) = service.stderr().iter().find_map(|line| {
                let rest = line.split("serving metrics on http").nth(1)?;
                let rest = rest.strip_prefix("s://").or(rest.strip_prefix("://"))?;
                Some(rest.split('/').next()?.to_owned())
            }) {
                break addr;
            }
            let exited = service.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "serve did not start ({exited:?}):\n{}",
                service.stderr().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        };
        // It serves before it attaches (a SIGTERM during set-up is then answered), and
        // says when the probes are attached.
        while !service
            .stderr()
            .iter()
            .any(|line| line.contains("attached on"))
        {
            let exited = service.child.as_mut().unwrap().try_wait().unwrap();
            assert!(
                exited.is_none() && Instant::now() < deadline,
                "serve never attached ({exited:?}):\n{}",
                service.stderr().join("\n")
            );
            std::thread::sleep(Duration::from_millis(50));
        }
        service
    }

    /// Its stderr so far.
    pub(crate) fn stderr(&self) -> Vec<String> {
        self.stderr.lock().unwrap().clone()
    }

    /// `GET path`: the status line and the body.
    pub(crate) fn get(&self, path: &str) -> (String, String) {
        http_get(&self.addr, path)
    }

    /// The pid of the process running the binary: the child itself, or a descendant of
    /// its wrappers.
    pub(crate) fn pid(&self) -> u32 {
        let root = self.child.as_ref().unwrap().id();
        let mut pending = vec![root];
        while let Some(pid) = pending.pop() {
            if std::fs::read_link(format!("/proc/{pid}/exe"))
                .ok()
                .as_deref()
                == Some(self.binary.as_path())
            {
                return pid;
            }
            let children = std::fs::read_to_string(format!("/proc/{pid}/task/{pid}/children"))
                .unwrap_or_default();
            pending.extend(
                children
                    .split_whitespace()
                    .filter_map(|c| c.parse::<u32>().ok()),
            );
        }
        panic!("no process runs {} under {root}", self.binary.display());
    }

    /// Ends it with SIGTERM to the serving process; returns how the top process exited,
    /// its stderr and its stdout.
    pub(crate) fn terminate(mut self) -> (ExitStatus, Vec<String>, String) {
        let pid = nix::unistd::Pid::from_raw(i32::try_from(self.pid()).unwrap());
        nix::sys::signal::kill(pid, nix::sys::signal::Signal::SIGTERM).unwrap();
        let mut child = self.child.take().unwrap();
        let deadline = Instant::now() + Duration::from_secs(30);
        let status = loop {
            if let Some(status) = child.try_wait().unwrap() {
                break status;
            }
            if Instant::now() > deadline {
                kill_group(&mut child);
                panic!("serve did not exit within 30 s of SIGTERM");
            }
            std::thread::sleep(Duration::from_millis(50));
        };
        let stdout = self.stdout.take().unwrap().join().unwrap();
        // The stderr reader ends with the pipe; give it a moment to take the last lines.
        std::thread::sleep(Duration::from_millis(100));
        (status, self.stderr(), stdout)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        if let Some(child) = &mut self.child {
            kill_group(child);
        }
    }
}

/// Kills the process group `child` leads (its wrappers and the server alike) and reaps it.
fn kill_group(child: &mut Child) {
    let group = nix::unistd::Pid::from_raw(i32::try_from(child.id()).unwrap());
    let _ = nix::sys::signal::killpg(group, nix::sys::signal::Signal::SIGKILL);
    let _ = child.wait();
}

/// One HTTP/1.0 `GET` (the server closes the connection after it, and sends its body as
/// is, unchunked): the status line and the body.
pub(crate) fn http_get(addr: &str, path: &str) -> (String, String) {
    let mut stream = std::net::TcpStream::connect(addr).unwrap();
    stream
        .set_read_timeout(Some(RESPONSE * super::slowdown()))
        .unwrap();
    write!(stream, "GET {path} HTTP/1.0\r\nHost: {addr}\r\n\r\n").unwrap();
    let mut response = String::new();
    stream.read_to_string(&mut response).unwrap();
    let (head, body) = response.split_once("\r\n\r\n").unwrap();
    (head.lines().next().unwrap().to_owned(), body.to_owned())
}

/// The ids of the programs loaded now.
pub(crate) fn programs() -> BTreeSet<u32> {
    aya::programs::loaded_programs()
        .filter_map(Result::ok)
        .map(|p| p.id())
        .collect()
}

/// The runs of the programs of `ids` the kernel skipped, in all: what a test holds another
/// process's programs to (`recursion_misses`, Linux 5.12+, which every kernel these tests
/// run on counts).
pub(crate) fn kernel_misses(ids: &BTreeSet<u32>) -> u64 {
    ids.iter()
        .map(|&id| {
            program_recursion_misses(id).unwrap().expect(
                "this kernel does not count the runs it skips (recursion_misses, Linux 5.12+)",
            )
        })
        .sum()
}

/// The programs of `ids` still loaded, and the links to any of them: what a process that
/// loaded them left behind.
pub(crate) fn left_behind(ids: &BTreeSet<u32>) -> (Vec<u32>, Vec<u32>) {
    let programs = programs().intersection(ids).copied().collect();
    let links = aya::programs::loaded_links()
        .filter_map(Result::ok)
        .filter(|l| ids.contains(&l.program_id()))
        .map(|l| l.id())
        .collect();
    (programs, links)
}

/// The value of the sample of `family` whose labels include every one of `labels`
/// (`name="value"` each).
pub(crate) fn sample(body: &str, family: &str, labels: &[&str]) -> Option<f64> {
    body.lines()
        .filter(|l| l.starts_with(family) && l[family.len()..].starts_with(['{', ' ']))
        .find(|l| labels.iter().all(|label| l.contains(label)))
        .and_then(|l| l.rsplit(' ').next())
        .map(|v| v.parse().unwrap())
}
