//! One QEMU run: the command line, and the supervision of the guest through its serial
//! console and QEMU's stderr, line by line, under two deadlines: the boot deadline (the
//! init's first line) and the run's timeout, and a stop from the host. Whatever happens,
//! QEMU does not outlive [`run`] ([`crate::owned`]).

use std::ffi::OsString;
use std::fs::File;
use std::io::{BufRead as _, BufReader, Read as _, Write};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicBool, Ordering};
use std::sync::mpsc::{self, RecvTimeoutError};
use std::sync::{Arc, Mutex, PoisonError};
use std::thread::JoinHandle;
use std::time::{Duration, Instant};

use anyhow::Context as _;

use crate::console::{self, Signal};
use crate::owned::Owned;

pub const QEMU: &str = "qemu-system-x86_64";

/// The kernel command-line parameter that tells the guest its accelerator
/// (`tap_probe.accel=tcg`); the kernel ignores parameters it does not know.
pub const ACCEL_PARAM: &str = "tap_probe.accel";

/// After the verdict, the init powers off; QEMU gets this long to exit by itself.
const POWEROFF_GRACE: Duration = Duration::from_secs(30);
/// After a panic, oops or KVM error, the lines that explain it (the backtrace, QEMU's
/// register dump) arrive within this long.
const FATAL_GRACE: Duration = Duration::from_secs(2);
/// How long the KVM probe's QEMU has to fail before KVM counts as startable.
const KVM_PROBE: Duration = Duration::from_secs(2);
/// How often a run looks at its stop flag while it waits for the console's next line.
const STOP_POLL: Duration = Duration::from_millis(100);

/// A QEMU accelerator.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Accel {
    Kvm,
    Tcg,
}

impl Accel {
    #[must_use]
    pub fn name(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg",
        }
    }

    /// The `-accel` argument. TCG runs the guest's CPUs in one thread: with a thread per
    /// CPU, a CPU can run a stale translation of kernel text that another one patches
    /// (`text_poke_bp`, as attaching a tracepoint or kprobe does), and the guest's kernel
    /// then trapped on an int3 already removed ("Oops: int3" in `dev_hard_start_xmit`) or
    /// jumped to address 0 from `tun_do_read`, when tap-probe attached while traffic flowed.
    #[must_use]
    pub fn argument(self) -> &'static str {
        match self {
            Self::Kvm => "kvm",
            Self::Tcg => "tcg,thread=single",
        }
    }

    /// `-cpu host` needs KVM; under TCG `max` enables everything QEMU can emulate.
    #[must_use]
    pub fn cpu(self) -> &'static str {
        match self {
            Self::Kvm => "host",
            Self::Tcg => "max",
        }
    }

    /// How long a guest may take to reach its init. Under KVM Debian's cloud kernels boot
    /// in about a second, so a guest silent for this long has hung (on some machines of
    /// this kind it hangs in early boot under KVM without any message). Under TCG they take
    /// 2-7 s here; the deadline leaves room for a loaded or slower machine.
    #[must_use]
    pub fn boot_deadline(self) -> Duration {
        match self {
            Self::Kvm => Duration::from_secs(30),
            Self::Tcg => Duration::from_mins(3),
        }
    }
}

/// Whether QEMU can start a KVM guest at all, or why not: a paused machine (`-S`) that
/// either dies at once (seen: "failed to set MSR 0x10a") or is still alive after a moment.
/// Passing says nothing about whether a guest then boots under KVM: only a boot tells.
///
/// # Errors
/// Why QEMU cannot start with KVM.
pub fn probe_kvm() -> Result<(), String> {
    std::fs::OpenOptions::new()
        .read(true)
        .write(true)
        .open("/dev/kvm")
        .map_err(|err| format!("cannot open /dev/kvm: {err}"))?;
    let mut owned = Owned::spawn(
        Command::new(QEMU)
            .args(["-accel", "kvm", "-cpu", Accel::Kvm.cpu(), "-m", "64", "-S"])
            .args(["-nodefaults", "-display", "none", "-monitor", "none"])
            .args(["-serial", "none", "-no-reboot"])
            .stdin(Stdio::null())
            .stdout(Stdio::null())
            .stderr(Stdio::piped()),
    )
    .map_err(|err| format!("cannot run {QEMU}: {err}"))?;
    let child = owned.child();
    let started = Instant::now();
    while started.elapsed() < KVM_PROBE {
        if let Ok(Some(status)) = child.try_wait() {
            let mut stderr = String::new();
            if let Some(mut pipe) = child.stderr.take() {
                let _ = pipe.read_to_string(&mut stderr);
            }
            let reason = stderr.lines().next().unwrap_or_default().to_owned();
            return Err(format!("{QEMU} -accel kvm exited ({status}): {reason}"));
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    Ok(())
}

/// Where a serial port's bytes go while the guest runs, besides its file.
pub type Sink = Arc<Mutex<dyn Write + Send>>;

/// A further serial port (`ttyS1`, `ttyS2`, ... in the guest), written by QEMU into a file.
pub struct Serial {
    pub path: PathBuf,
    pub sink: Option<Sink>,
}

/// The accelerator a run uses, with its CPU model and boot deadline.
#[derive(Debug, Clone)]
pub struct Machine {
    pub accel: Accel,
    /// `-cpu` model, normally [`Accel::cpu`].
    pub cpu: String,
    /// The init's first line must come by then.
    pub boot_deadline: Duration,
}

impl Machine {
    /// `accel` with its usual CPU model and boot deadline.
    #[must_use]
    pub fn of(accel: Accel) -> Self {
        Self {
            accel,
            cpu: accel.cpu().to_owned(),
            boot_deadline: accel.boot_deadline(),
        }
    }
}

/// How to run QEMU.
pub struct Config<'a> {
    /// The QEMU executable ([`QEMU`]; tests substitute a script).
    pub program: &'a Path,
    pub kernel: &'a Path,
    pub initrd: &'a Path,
    pub append: &'a str,
    pub cpus: u32,
    pub memory_mib: u32,
    /// The guest must reach a verdict by then.
    pub timeout: Duration,
    /// Called with every console and stderr line as it comes.
    pub echo: &'a mut dyn FnMut(&str),
    /// The whole console and QEMU's stderr are also written here.
    pub log: &'a Path,
    /// `ttyS1`, `ttyS2`, ... in that order.
    pub serials: Vec<Serial>,
}

/// How a run ended.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum Verdict {
    /// `init: success`.
    Success,
    /// `init: failure`, with the payload's exit status when the init gave one.
    Failure(Option<i32>),
    /// The guest kernel panicked.
    Panic,
    /// The guest kernel oopsed (during boot, before the init makes oopses panic).
    Oops,
    /// KVM could not run the guest (QEMU said so and kept it paused).
    Kvm(String),
    /// The guest never reached its init, for the reason given.
    NoBoot(String),
    /// No verdict within the timeout.
    Timeout,
    /// QEMU exited after the init started, without a verdict.
    Silent,
    /// The host stopped the run before the guest's verdict (a signal); QEMU was killed.
    Interrupted,
}

impl Verdict {
    /// Whether the guest failed in a way that is the accelerator's fault or may be: it
    /// never booted, or KVM gave up on it. The same guest may then run under TCG.
    #[must_use]
    pub fn is_boot_failure(&self) -> bool {
        matches!(self, Self::Kvm(_) | Self::NoBoot(_))
    }
}

/// What a run saw.
#[derive(Debug)]
pub struct Outcome {
    pub verdict: Verdict,
    /// Every console and stderr line, in arrival order.
    pub lines: Vec<String>,
    /// From QEMU's start to the init's first line.
    pub boot: Option<Duration>,
    pub elapsed: Duration,
}

impl Outcome {
    /// The last `n` lines, to explain a failure.
    #[must_use]
    pub fn tail(&self, n: usize) -> &[String] {
        &self.lines[self.lines.len().saturating_sub(n)..]
    }
}

/// The QEMU command line for `config`.
fn command(config: &Config<'_>, machine: &Machine) -> Command {
    let mut qemu = Command::new(config.program);
    qemu.args(["-accel", machine.accel.argument(), "-cpu", &machine.cpu])
        .args(["-smp", &config.cpus.to_string()])
        .args(["-m", &config.memory_mib.to_string()])
        // The console on stdout, nothing on stdin (QEMU would put a terminal into raw mode),
        // no monitor, no display; -no-reboot turns the guest's reboot (panic=-1) into
        // QEMU's exit.
        .args(["-nodefaults", "-display", "none", "-monitor", "none"])
        .args(["-serial", "stdio", "-no-reboot"])
        .arg("-kernel")
        .arg(config.kernel)
        .arg("-initrd")
        .arg(config.initrd)
        // The accelerator goes on the kernel command line too, so that what runs in the
        // guest can say how it was measured (`/proc/cmdline`).
        .arg("-append")
        .arg(format!(
            "{} {ACCEL_PARAM}={}",
            config.append,
            machine.accel.name()
        ));
    for serial in &config.serials {
        let mut spec = OsString::from("file:");
        spec.push(&serial.path);
        qemu.arg("-serial").arg(spec);
    }
    qemu.stdin(Stdio::null())
        .stdout(Stdio::piped())
        .stderr(Stdio::piped());
    qemu
}

/// What the console said so far, and until when the run may go on.
struct Watch<'m> {
    machine: &'m Machine,
    started: Instant,
    boot: Option<Duration>,
    verdict: Option<Verdict>,
    deadline: Instant,
    /// The host's stop, and whether it came.
    stop: Option<&'m AtomicBool>,
    interrupted: bool,
}

impl Watch<'_> {
    /// How long to wait for the next line, or `None` once the run is over: the host
    /// stopped it, or a deadline passed.
    fn next_wait(&mut self) -> Option<Duration> {
        if self.stop.is_some_and(|stop| stop.load(Ordering::SeqCst)) {
            // A verdict already given stands; the guest does not get to power off.
            self.verdict.get_or_insert(Verdict::Interrupted);
            self.interrupted = true;
            return None;
        }
        let now = Instant::now();
        let wake = self.wake();
        if now >= wake {
            self.expire();
            return None;
        }
        Some(if self.stop.is_some() {
            (wake - now).min(STOP_POLL)
        } else {
            wake - now
        })
    }

    /// When to stop waiting for the next line: the boot deadline counts until the init
    /// speaks (or a verdict came first).
    fn wake(&self) -> Instant {
        if self.boot.is_none() && self.verdict.is_none() {
            self.deadline.min(self.started + self.machine.boot_deadline)
        } else {
            self.deadline
        }
    }

    /// Called when `wake` has passed: a missed boot deadline is the verdict.
    fn expire(&mut self) {
        if self.boot.is_none()
            && self.verdict.is_none()
            && Instant::now() >= self.started + self.machine.boot_deadline
        {
            self.verdict = Some(Verdict::NoBoot(format!(
                "no line from the init within {} s (boot deadline under {})",
                self.machine.boot_deadline.as_secs(),
                self.machine.accel.name()
            )));
        }
    }

    fn see(&mut self, signal: Signal, line: &str) {
        let now = Instant::now();
        match signal {
            Signal::Init => {
                self.boot.get_or_insert_with(|| self.started.elapsed());
            }
            // The first verdict stands: nothing turns a failure into a success.
            Signal::Success | Signal::Failure(_) => {
                if self.verdict.is_none() {
                    self.verdict = Some(match signal {
                        Signal::Failure(code) => Verdict::Failure(code),
                        _ => Verdict::Success,
                    });
                    self.deadline = self.deadline.min(now + POWEROFF_GRACE);
                }
            }
            // A panic fails the run even after `init: success` (at poweroff, say).
            Signal::Panic => self.fatal(Verdict::Panic, true),
            Signal::Oops => self.fatal(Verdict::Oops, false),
            Signal::KvmError => {
                let first = !matches!(self.verdict, Some(Verdict::Kvm(_)));
                self.fatal(Verdict::Kvm(line.to_owned()), first);
            }
            Signal::CpuRefused => self.fatal(
                Verdict::NoBoot(format!(
                    "the kernel refused the CPU model `{}`: {line}",
                    self.machine.cpu
                )),
                true,
            ),
        }
    }

    /// The guest cannot reach a verdict of its own any more; the lines that explain why
    /// still get a moment to arrive.
    fn fatal(&mut self, verdict: Verdict, overrides: bool) {
        if overrides || self.verdict.is_none() {
            self.verdict = Some(verdict);
        }
        self.deadline = self.deadline.min(Instant::now() + FATAL_GRACE);
    }
}

/// Boots the guest and follows it until its verdict, a fatal console line, a missed
/// deadline, QEMU's exit or `stop` (looked at every [`STOP_POLL`]); QEMU is killed if it
/// outlives that. What the guest wrote until then is in the outcome and its serial ports'
/// sinks.
///
/// # Errors
/// If QEMU cannot be started or the log cannot be written.
pub fn run(
    config: &mut Config<'_>,
    machine: &Machine,
    stop: Option<&AtomicBool>,
) -> anyhow::Result<Outcome> {
    let mut log =
        File::create(config.log).with_context(|| format!("creating {}", config.log.display()))?;
    for serial in &config.serials {
        File::create(&serial.path)
            .with_context(|| format!("creating {}", serial.path.display()))?;
    }
    let started = Instant::now();
    let mut owned = Owned::spawn(&mut command(config, machine)).with_context(|| {
        format!(
            "could not run {} (Debian's qemu-system-x86 package has it)",
            config.program.display()
        )
    })?;
    let child = owned.child();
    let (lines_tx, lines_rx) = mpsc::channel();
    let stdout = child.stdout.take().context("QEMU's stdout")?;
    let stderr = child.stderr.take().context("QEMU's stderr")?;
    let readers = [
        forward_lines(stdout, lines_tx.clone()),
        forward_lines(stderr, lines_tx),
    ];
    let running = Arc::new(AtomicBool::new(true));
    let tails: Vec<JoinHandle<()>> = config
        .serials
        .iter()
        .filter_map(|serial| {
            let sink = Arc::clone(serial.sink.as_ref()?);
            Some(tail(serial.path.clone(), sink, Arc::clone(&running)))
        })
        .collect();

    let mut lines = Vec::new();
    let mut closed = false;
    let mut watch = Watch {
        machine,
        started,
        boot: None,
        verdict: None,
        deadline: started + config.timeout,
        stop,
        interrupted: false,
    };
    while let Some(wait) = watch.next_wait() {
        let line = match lines_rx.recv_timeout(wait) {
            Ok(line) => line,
            // QEMU closed its stdout and stderr: it is exiting.
            Err(RecvTimeoutError::Disconnected) => {
                closed = true;
                break;
            }
            Err(RecvTimeoutError::Timeout) => continue,
        };
        writeln!(log, "{line}")?;
        (config.echo)(&line);
        if let Some(signal) = console::classify(&line) {
            watch.see(signal, &line);
        }
        lines.push(line);
    }
    // After a verdict the guest is powering off, and once its pipes closed QEMU is
    // exiting (a process closes its files before it can be reaped): both get a moment.
    // Otherwise (a deadline, a fatal line: QEMU keeps such guests paused; a stop from the
    // host) QEMU is killed at once.
    let powering_off = matches!(watch.verdict, Some(Verdict::Success | Verdict::Failure(_)));
    let grace = if (closed || powering_off) && !watch.interrupted {
        Duration::from_secs(5)
    } else {
        Duration::ZERO
    };
    let exit = wait_or_kill(child, grace)?;
    running.store(false, Ordering::Release);
    // The readers end once QEMU's pipes close, which its exit ensures.
    for reader in readers {
        let _ = reader.join();
    }
    for tail in tails {
        let _ = tail.join();
    }
    // Lines still queued when the loop ended belong in the log.
    for line in lines_rx.try_iter() {
        writeln!(log, "{line}")?;
        lines.push(line);
    }
    let boot = watch.boot;
    let verdict = watch.verdict.unwrap_or_else(|| match exit {
        Some(status) if boot.is_none() => {
            Verdict::NoBoot(format!("QEMU exited ({status}) before the init started"))
        }
        Some(_) => Verdict::Silent,
        None => Verdict::Timeout,
    });
    Ok(Outcome {
        verdict,
        lines,
        boot,
        elapsed: started.elapsed(),
    })
}

/// A thread sending each line of `pipe` (escapes stripped) to `lines`.
fn forward_lines(
    pipe: impl std::io::Read + Send + 'static,
    lines: mpsc::Sender<String>,
) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let mut reader = BufReader::new(pipe);
        let mut line = Vec::new();
        loop {
            line.clear();
            match reader.read_until(b'\n', &mut line) {
                Ok(0) | Err(_) => break,
                Ok(_) => {
                    let text = console::strip_escapes(&String::from_utf8_lossy(&line));
                    let text = text.trim_end_matches('\n').to_owned();
                    if lines.send(text).is_err() {
                        break;
                    }
                }
            }
        }
    })
}

/// A thread copying what QEMU appends to `path` into `sink` while `running`, then the rest.
fn tail(path: PathBuf, sink: Sink, running: Arc<AtomicBool>) -> JoinHandle<()> {
    std::thread::spawn(move || {
        let Ok(mut file) = File::open(&path) else {
            return;
        };
        let mut buf = vec![0; 64 * 1024];
        let mut open = true;
        loop {
            // Read `running` before reading the file: once it is false QEMU has exited,
            // so the read that follows sees everything it wrote.
            let last = !running.load(Ordering::Acquire);
            match file.read(&mut buf) {
                Ok(0) if last => break,
                Ok(0) => std::thread::sleep(Duration::from_millis(20)),
                Ok(n) if open => {
                    let mut sink = sink.lock().unwrap_or_else(PoisonError::into_inner);
                    // A reader that went away (a closed pipe) ends the copying; QEMU goes on
                    // writing the file.
                    open = sink
                        .write_all(&buf[..n])
                        .and_then(|()| sink.flush())
                        .is_ok();
                }
                Ok(_) => {}
                Err(_) => break,
            }
        }
    })
}

/// Waits up to `grace` for `child` to exit, then kills it. Returns its exit status if it
/// exited by itself.
fn wait_or_kill(child: &mut Child, grace: Duration) -> anyhow::Result<Option<ExitStatus>> {
    let until = Instant::now() + grace;
    loop {
        if let Some(status) = child.try_wait()? {
            return Ok(Some(status));
        }
        if Instant::now() >= until {
            break;
        }
        std::thread::sleep(Duration::from_millis(50));
    }
    child.kill().context("killing QEMU")?;
    child.wait().context("waiting for QEMU")?;
    Ok(None)
}

#[cfg(test)]
mod tests {
    use std::os::unix::fs::PermissionsExt as _;

    use super::*;

    /// A shell script in QEMU's place (it ignores QEMU's arguments) and where its console
    /// log goes, in a directory of their own that goes with them.
    struct FakeQemu {
        /// Removed with the script and the log when this is dropped.
        _dir: tempfile::TempDir,
        program: PathBuf,
        log: PathBuf,
    }

    impl FakeQemu {
        fn new(script: &str) -> Self {
            let dir = tempfile::tempdir().expect("temp dir");
            let program = dir.path().join("fake-qemu");
            std::fs::write(&program, format!("#!/bin/sh\n{script}\n")).expect("writing the script");
            std::fs::set_permissions(&program, std::fs::Permissions::from_mode(0o755))
                .expect("chmod");
            let log = dir.path().join("console.log");
            Self {
                _dir: dir,
                program,
                log,
            }
        }

        /// A run of the script that must reach a verdict within `timeout`, each line it
        /// says passed to `echo`: the kernel and initrd named to it are none (it boots
        /// nothing).
        fn config<'a>(&'a self, timeout: Duration, echo: &'a mut dyn FnMut(&str)) -> Config<'a> {
            Config {
                program: &self.program,
                kernel: Path::new("/nonexistent/vmlinuz"),
                initrd: Path::new("/nonexistent/initrd"),
                append: "",
                cpus: 1,
                memory_mib: 64,
                timeout,
                echo,
                log: &self.log,
                serials: Vec::new(),
            }
        }
    }

    /// Runs a shell script in QEMU's place and returns the outcome and how long supervision
    /// took.
    fn supervise(script: &str, boot_deadline: Duration) -> (Outcome, Duration) {
        let qemu = FakeQemu::new(script);
        let mut echo = |_: &str| {};
        let mut config = qemu.config(Duration::from_mins(1), &mut echo);
        let started = Instant::now();
        let machine = Machine {
            boot_deadline,
            ..Machine::of(Accel::Kvm)
        };
        let outcome = run(&mut config, &machine, None).expect("the fake QEMU runs");
        let logged = std::fs::read_to_string(&qemu.log).expect("the log");
        assert_eq!(logged.lines().count(), outcome.lines.len());
        (outcome, started.elapsed())
    }

    /// The guest did not boot, and the verdict says `reason`.
    fn assert_no_boot(outcome: &Outcome, reason: &str) {
        assert!(
            matches!(&outcome.verdict, Verdict::NoBoot(why) if why.contains(reason)),
            "{:?}",
            outcome.verdict
        );
    }

    /// A guest whose init has started and that then says nothing more.
    const BOOTED_AND_HANGS: &str = "echo 'init: started'\nexec sleep 600";

    #[test]
    fn a_kvm_error_ends_a_paused_guest_at_once() {
        // What QEMU does on a machine where KVM half-works: the error, then it keeps the
        // VM paused and never exits.
        let (outcome, took) = supervise(
            "echo 'Booting from ROM...'\n\
             echo 'KVM internal error. Suberror: 1' >&2\n\
             echo 'emulation failure' >&2\n\
             exec sleep 600",
            Duration::from_secs(50),
        );
        assert!(
            matches!(&outcome.verdict, Verdict::Kvm(line) if line.contains("Suberror: 1")),
            "{:?}",
            outcome.verdict
        );
        assert!(outcome.verdict.is_boot_failure());
        assert!(took < Duration::from_secs(20), "took {took:?}");
        assert!(outcome.lines.iter().any(|l| l == "emulation failure"));
    }

    #[test]
    fn a_silent_guest_misses_its_boot_deadline() {
        let (outcome, took) = supervise(
            "echo 'Probing EDD (edd=off to disable)... ok'\nexec sleep 600",
            Duration::from_secs(1),
        );
        assert_no_boot(&outcome, "within 1 s");
        assert!(took < Duration::from_secs(20), "took {took:?}");
        assert_eq!(outcome.boot, None);
    }

    #[test]
    fn the_init_verdict_ends_the_run() {
        let (outcome, _) = supervise(
            "echo 'init: kernel 6.1'\necho 'init: failure (exit 3)'\nexit 0",
            Duration::from_secs(30),
        );
        assert_eq!(outcome.verdict, Verdict::Failure(Some(3)));
        assert!(outcome.boot.is_some());
        assert!(!outcome.verdict.is_boot_failure());
    }

    #[test]
    fn a_guest_that_booted_and_hangs_is_bounded_by_the_timeout_not_the_boot_deadline() {
        let qemu = FakeQemu::new(BOOTED_AND_HANGS);
        let mut echo = |_: &str| {};
        let mut config = qemu.config(Duration::from_secs(2), &mut echo);
        let machine = Machine {
            boot_deadline: Duration::from_millis(200),
            ..Machine::of(Accel::Tcg)
        };
        let outcome = run(&mut config, &machine, None).expect("the fake QEMU runs");
        assert_eq!(outcome.verdict, Verdict::Timeout);
    }

    #[test]
    fn a_stop_from_the_host_kills_a_running_guest_and_keeps_what_it_said() {
        let qemu = FakeQemu::new(BOOTED_AND_HANGS);
        let stop = Arc::new(AtomicBool::new(false));
        let mut echo = {
            let stop = Arc::clone(&stop);
            // The stop comes once the guest has spoken, as a signal would mid-run.
            move |line: &str| {
                if line == "init: started" {
                    stop.store(true, Ordering::SeqCst);
                }
            }
        };
        let mut config = qemu.config(Duration::from_mins(10), &mut echo);
        let started = Instant::now();
        let outcome = run(&mut config, &Machine::of(Accel::Tcg), Some(&stop)).expect("runs");
        assert_eq!(outcome.verdict, Verdict::Interrupted);
        assert!(
            started.elapsed() < Duration::from_secs(10),
            "{:?}",
            started.elapsed()
        );
        assert_eq!(outcome.lines, ["init: started"]);
    }

    #[test]
    fn qemu_exiting_before_the_init_is_a_boot_failure() {
        let (outcome, _) = supervise(
            "echo 'qemu-system-x86_64: unable to find CPU model' >&2\nexit 1",
            Duration::from_secs(30),
        );
        assert_no_boot(&outcome, "before the init");
    }

    #[test]
    fn qemu_that_closed_its_pipes_is_waited_for_not_killed() {
        // The pipes close when the process starts to exit, a little before it can be
        // reaped; here that little is made long enough to see.
        let (outcome, _) = supervise("exec >&- 2>&-\nsleep 0.5\nexit 1", Duration::from_secs(30));
        assert_no_boot(&outcome, "exit status: 1");
    }
}
