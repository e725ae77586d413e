//! `cargo xtask vm`: the kernel-dependent tests inside QEMU guests, one per kernel of the
//! matrix (this host's kernel has neither kprobes nor the tail-drop fix; the guests have
//! both), side by side as far as the host's CPUs go: each emulated guest runs on one host
//! thread.
//!
//! The guest machinery is `tap-probe-guest`'s, the same `tap-probe vm` uses: the test
//! binaries of the suite's one build (dynamic ones bring their libraries), `tap-probe` at
//! the path the integration tests baked in, and the host's `ip`, `tc` and `setpriv` go into
//! the initramfs; the init runs `tap-probe doctor` and then, binary by binary, the tests
//! whose outcome depends on the kernel (see [`crate::suite`]), each under a timeout.

use std::fmt::Write as _;
use std::path::PathBuf;
use std::time::{Duration, Instant};

use anyhow::{Context as _, bail};
use tap_probe_guest::image::sh_quote;
use tap_probe_guest::{AccelChoice, Image, Kernel, KernelSpec, Launcher, Series, Verdict, launch};

use crate::cmd;
use crate::expected::Expected;
use crate::output::{self, Output};
use crate::suite::{self, Subset, Suite};

/// Host tools (copied in with their libraries) the tests run: some lib tests check the
/// rtnetlink code against `ip -j` and `tc -j`, which busybox's applets cannot print, and a
/// test reads the kernel's figures a second way through `ip netns exec`; `watch_cli` drops
/// privileges with util-linux's `setpriv --reuid`; `alerts` has Prometheus (Debian's
/// package) evaluate the alert rules where tun takes `IFF_BACKPRESSURE`.
const HOST_TOOLS: &[&str] = &[
    "/usr/sbin/ip",
    "/usr/sbin/tc",
    "/usr/bin/setpriv",
    "/usr/bin/prometheus",
];

/// Each test binary still running after this long is ended, so one hung test fails its
/// binary and the rest still run (the whole suite takes about 4 minutes under TCG here).
const BINARY_TIMEOUT_S: u32 = 8 * 60;

#[derive(Debug, clap::Args)]
pub(crate) struct Args {
    /// Kernels to run the tests on, one guest each: `debian-5.10`, `debian-6.1`,
    /// `debian-6.12`, `debian-7.3`, a bzImage or a kernel .deb [default: the matrix `cargo
    /// xtask test` runs: debian-5.10, debian-6.1, debian-6.12 with `cargo xtask seed-tun`'s
    /// tun.ko, debian-7.3].
    #[arg(long = "kernel")]
    kernels: Vec<KernelSpec>,
    /// A module that replaces (or adds to) the kernel's own in every guest of this run: a
    /// modified `tun.ko`.
    #[arg(long = "module")]
    modules: Vec<PathBuf>,
    /// With `--kernel PATH` to a bzImage: its modules (`INSTALL_MOD_PATH` of
    /// `make modules_install`, or a `lib/modules/RELEASE` directory, or a .deb).
    #[arg(long = "modules")]
    modules_dir: Option<PathBuf>,
    /// Give up on a guest (and kill QEMU) after this many seconds.
    #[arg(long, default_value_t = 20 * 60)]
    timeout: u64,
    /// QEMU accelerator; `auto` tries KVM and falls back to TCG when a guest does not boot
    /// under it.
    #[arg(long, value_enum, default_value_t = AccelChoice::Auto)]
    accel: AccelChoice,
    /// Print the guest's console only if the run fails (it is always saved to
    /// `<target>/vm/<kernel>/console.log`).
    #[arg(long)]
    quiet: bool,
    /// Guests to run at once [default: as many as the host has CPUs; each emulated guest
    /// runs on one host thread].
    #[arg(long)]
    jobs: Option<usize>,
    /// Arguments for every test binary, after `--`: a name filter, `--exact`, `--skip X`.
    #[arg(last = true)]
    passthrough: Vec<String>,
}

/// One guest of a test run: a kernel and the modules that replace its own.
#[derive(Debug, Clone)]
pub(crate) struct Guest {
    /// What the summary calls it; for a guest of the matrix, also where its expectations
    /// are kept in `xtask/expected.toml`.
    pub name: String,
    pub kernel: KernelSpec,
    pub modules: Vec<PathBuf>,
    /// With a bzImage: its modules.
    pub modules_dir: Option<PathBuf>,
    /// For some guests of the matrix: the tests it runs, of those that depend on the
    /// kernel (all of them without).
    pub subset: Option<&'static Subset>,
}

/// Runs `cargo xtask vm`.
///
/// # Errors
/// If a kernel cannot be found, the binaries cannot be built, QEMU cannot be run, a guest
/// does not report success, or a run of the whole matrix is not as `expected.toml` says.
pub(crate) fn run(args: &Args) -> anyhow::Result<()> {
    let whole_matrix = args.kernels.is_empty();
    let guests = if whole_matrix {
        matrix()?
    } else {
        args.kernels
            .iter()
            .map(|kernel| Guest {
                name: kernel.to_string(),
                kernel: kernel.clone(),
                modules: args.modules.clone(),
                modules_dir: args.modules_dir.clone(),
                subset: None,
            })
            .collect()
    };
    let suite = suite::build()?;
    let slots = Slots::new(args.jobs.unwrap_or_else(Slots::cpus));
    let (ran, result) = run_tests(
        &suite,
        &guests,
        &Options {
            accel: args.accel,
            timeout: Duration::from_secs(args.timeout),
            quiet: args.quiet,
            slots: &slots,
            passthrough: args.passthrough.clone(),
            last: None,
        },
    );
    let ran = ran.guests;
    for guest in &ran {
        println!("{}", guest.report());
    }
    result?;
    // Expectations hold for the whole suite on the matrix; a filter or another kernel only
    // reports.
    let expected = (whole_matrix && args.passthrough.is_empty())
        .then(Expected::load)
        .transpose()?;
    let mut problems = Vec::new();
    for guest in &ran {
        if let Some(expected) = &expected {
            let kernel = expected.of(&guest.name, &guest.release)?;
            for problem in kernel.problems(&guest.said) {
                problems.push(format!("{}: {problem}", guest.name));
            }
        }
    }
    if !problems.is_empty() {
        bail!(
            "not as {} expects:\n  {}",
            crate::expected::FILE,
            problems.join("\n  ")
        );
    }
    Ok(())
}

/// The kernels the tests run on in CI: Debian 11's 5.10 (stock, and older than the drop
/// reasons and the programs' miss counts); Debian 12's own 6.1 (stock: tail-drop); 6.12 with
/// the tail-drop fix as posted (v8 4/4 + v9 1/4, built by `cargo xtask seed-tun`: stops the
/// queue, returns BUSY on a lost race); 7.3 with the fix as merged (opt-in per tap with
/// `IFF_BACKPRESSURE`, never BUSY).
///
/// # Errors
/// If the 6.12 module cannot be built.
pub(crate) fn matrix() -> anyhow::Result<Vec<Guest>> {
    let guest = |name: &str, series, modules| Guest {
        name: name.to_owned(),
        kernel: KernelSpec::Debian(series),
        modules,
        modules_dir: None,
        subset: Subset::of(name),
    };
    Ok(vec![
        guest("debian-5.10", Series::Debian5_10, Vec::new()),
        guest("debian-6.1", Series::Debian6_1, Vec::new()),
        guest(
            "debian-6.12+seed-tun",
            Series::Debian6_12,
            vec![crate::seed_tun::build()?],
        ),
        guest("debian-7.3", Series::Debian7_3, Vec::new()),
    ])
}

/// A job that runs in a slot of its own once no guest waits for one (a short guest that
/// fills a CPU the last long one leaves idle); what it took.
pub(crate) type Last = Box<dyn FnOnce() -> anyhow::Result<Duration> + Send>;

/// How to run the tests in guests.
pub(crate) struct Options<'a> {
    pub accel: AccelChoice,
    pub timeout: Duration,
    pub quiet: bool,
    /// How many guests may run at once.
    pub slots: &'a Slots,
    pub passthrough: Vec<String>,
    /// Run after every guest has started, beside the last ones.
    pub last: Option<std::sync::Mutex<Option<Last>>>,
}

/// What the guests of a run and its last job did.
#[derive(Default)]
pub(crate) struct Ran {
    pub guests: Vec<GuestRun>,
    /// How long the last job took, if it ran and succeeded.
    pub last: Option<Duration>,
}

/// How many guests may run at once: a number that may grow while they run (when the host
/// frees a CPU), or drop to none (nothing more starts).
#[derive(Debug)]
pub(crate) struct Slots {
    /// Guests allowed at once, and running now; `None` once closed.
    state: std::sync::Mutex<Option<(usize, usize)>>,
    changed: std::sync::Condvar,
}

impl Slots {
    pub(crate) fn new(allowed: usize) -> Self {
        Self {
            state: std::sync::Mutex::new(Some((allowed.max(1), 0))),
            changed: std::sync::Condvar::new(),
        }
    }

    /// As many as the host has CPUs: an emulated guest runs on one host thread.
    pub(crate) fn cpus() -> usize {
        std::thread::available_parallelism().map_or(1, usize::from)
    }

    /// Lets `allowed` guests run at once from now on.
    pub(crate) fn allow(&self, allowed: usize) {
        let mut state = self.state.lock().expect("the slots' lock");
        if let Some((now, _)) = state.as_mut() {
            *now = allowed.max(1);
        }
        self.changed.notify_all();
    }

    /// Lets no more guests start.
    pub(crate) fn close(&self) {
        *self.state.lock().expect("the slots' lock") = None;
        self.changed.notify_all();
    }

    /// Waits for a free slot and holds it until the guard goes; `None` once closed.
    pub(crate) fn hold(&self) -> Option<SlotGuard<'_>> {
        self.take().then_some(SlotGuard(self))
    }

    /// Waits for a free slot and takes it; `false` once closed.
    fn take(&self) -> bool {
        let mut state = self.state.lock().expect("the slots' lock");
        loop {
            match state.as_mut() {
                None => return false,
                Some((allowed, running)) if *running < *allowed => {
                    *running += 1;
                    return true;
                }
                Some(_) => state = self.changed.wait(state).expect("the slots' lock"),
            }
        }
    }

    fn give_back(&self) {
        if let Some((_, running)) = self.state.lock().expect("the slots' lock").as_mut() {
            *running -= 1;
        }
        self.changed.notify_all();
    }
}

/// A slot of [`Slots`], given back when dropped.
pub(crate) struct SlotGuard<'a>(&'a Slots);

impl Drop for SlotGuard<'_> {
    fn drop(&mut self) {
        self.0.give_back();
    }
}

/// What one guest ran and said.
#[derive(Debug)]
pub(crate) struct GuestRun {
    pub name: String,
    /// Its kernel's release.
    pub release: String,
    pub said: Output,
    /// Per test binary: its `test result:` line, failed tests and init lines that report a
    /// failure.
    pub results: String,
    /// Where its time went.
    pub times: String,
    pub took: Duration,
}

impl GuestRun {
    /// Its results, skips, retries and oracle checks, for the summary.
    pub(crate) fn report(&self) -> String {
        let mut out = format!(
            "xtask vm: {} ({}), {:.0} s:{}",
            self.name,
            self.release,
            self.took.as_secs_f64(),
            self.results
        );
        for skip in &self.said.skips {
            let _ = write!(out, "\n    skipped: {skip}");
        }
        for retry in &self.said.retries {
            let _ = write!(out, "\n    retried: {retry}");
        }
        out.push_str(&crate::expected::tally_lines(&self.said));
        out
    }
}

/// A guest ready to boot.
struct Prepared {
    guest: Guest,
    kernel: Kernel,
    image: Image,
    dir: PathBuf,
    prepare_time: Duration,
    /// How many tests it runs.
    tests: usize,
}

/// Runs the kernel-dependent tests of `suite` in one guest per entry of `guests`, as many
/// at once as [`Options::slots`] allow, those with the most tests first. Returns what each
/// guest that ran said, also when one failed, and whether all succeeded.
pub(crate) fn run_tests(
    suite: &Suite,
    guests: &[Guest],
    options: &Options,
) -> (Ran, anyhow::Result<()>) {
    let mut runs = Ran::default();
    let ran = run_all(suite, guests, options, &mut runs);
    (runs, ran)
}

/// [`run_tests`], putting each guest's run into `runs`.
///
/// # Errors
/// If a kernel cannot be had, QEMU cannot be run, a guest fails (after running them all),
/// or the slots closed before every guest ran.
fn run_all(
    suite: &Suite,
    guests: &[Guest],
    options: &Options,
    ran: &mut Ran,
) -> anyhow::Result<()> {
    let runs = &mut ran.guests;
    let started = Instant::now();
    let payloads = guests
        .iter()
        .map(|guest| Payload::select(suite, &options.passthrough, guest.subset))
        .collect::<anyhow::Result<Vec<_>>>()?;
    if payloads.iter().all(|payload| payload.runs.is_empty()) {
        bail!(
            "no test depends on the kernel among those {:?} selects",
            options.passthrough
        );
    }
    // One after another: they share apt's cache and the kernels'.
    let mut prepared = Vec::new();
    for (guest, payload) in guests.iter().zip(&payloads) {
        if payload.runs.is_empty() {
            eprintln!("xtask vm: {} runs none of the selected tests", guest.name);
            continue;
        }
        if let Some(subset) = guest.subset {
            eprintln!(
                "xtask vm: {} runs the tests whose outcome can differ from {}'s, as its kernel \
                 has otherwise: {}",
                guest.name, subset.like, subset.differs
            );
        }
        let step = Instant::now();
        let (kernel, modules) = prepare(guest)?;
        let dir = guest_dir(&kernel);
        let mut image = Image::new(&kernel.release, modules, &dir.join("scratch"))?;
        payload.add_to(&mut image, suite)?;
        prepared.push(Prepared {
            guest: guest.clone(),
            kernel,
            image,
            dir,
            prepare_time: step.elapsed(),
            tests: payload.runs.iter().map(|(_, tests)| tests.len()).sum(),
        });
    }
    let total = prepared.len();
    let (mut done, last) = run_queue(prepared, options);
    done.sort_by_key(|(index, ..)| *index);
    let mut failures = Vec::new();
    let mut errors = Vec::new();
    let mut times = Vec::new();
    for (_, result, failure) in done {
        match result {
            Ok(run) => {
                times.push(format!("{}: {}", run.name, run.times));
                failures.extend(failure);
                runs.push(run);
            }
            Err(err) => errors.push(format!("{err:#}")),
        }
    }
    if runs.len() + errors.len() < total {
        failures.push(format!(
            "{} of {total} guests did not run: the run was stopped",
            total - runs.len() - errors.len()
        ));
    }
    failures.extend(errors);
    match last {
        Some(Ok(took)) => {
            times.push(format!("last job: {:.1} s", took.as_secs_f64()));
            ran.last = Some(took);
        }
        Some(Err(err)) => failures.push(format!("{err:#}")),
        None if options.last.is_some() => failures.push("the last job did not run".to_owned()),
        None => {}
    }
    eprintln!(
        "xtask vm: times: {}; all {:.1} s",
        times.join("; "),
        started.elapsed().as_secs_f64()
    );
    if !failures.is_empty() {
        bail!("guests failed: {}", failures.join("; "));
    }
    Ok(())
}

/// What one guest of the queue ran, by its index in the run's list, and why it failed.
type Done = (usize, anyhow::Result<GuestRun>, Option<String>);

/// Boots the prepared guests, as many at once as the slots allow, those with the most tests
/// first, then runs the options' last job once no guest waits; what each guest did, and
/// what the last job did if it ran.
fn run_queue(
    prepared: Vec<Prepared>,
    options: &Options,
) -> (Vec<Done>, Option<anyhow::Result<Duration>>) {
    let workers = Slots::cpus().clamp(1, prepared.len().max(1));
    let alone = prepared.len() == 1;
    // Taken from the end: the guests with the most tests first, so that the shortest ones
    // fill in at the end, when a CPU would otherwise idle beside the last one.
    let mut queue: Vec<(usize, Prepared)> = prepared.into_iter().enumerate().collect();
    queue.sort_by_key(|(_, guest)| guest.tests);
    let queue = std::sync::Mutex::new(queue);
    let take_last = || {
        options
            .last
            .as_ref()
            .and_then(|job| job.lock().expect("the last job's lock").take())
    };
    let mut done: Vec<Done> = Vec::new();
    let mut last: Option<anyhow::Result<Duration>> = None;
    std::thread::scope(|scope| {
        let workers: Vec<_> = (0..workers)
            .map(|_| {
                scope.spawn(|| {
                    let mut ran = Vec::new();
                    let mut last = None;
                    // Each worker decides its own accelerator: where QEMU cannot start KVM at
                    // all the decision is immediate; elsewhere each guest's first boot tells.
                    let mut launcher = Launcher::new(options.accel, "xtask vm");
                    while let Some(slot) = options.slots.hold() {
                        let next = queue.lock().expect("the queue's lock").pop();
                        let Some((index, guest)) = next else {
                            // No guest waits: the last job, if no other worker took it.
                            last = take_last().map(|job| job());
                            drop(slot);
                            break;
                        };
                        let (result, failure) = boot(&mut launcher, guest, options, alone);
                        drop(slot);
                        ran.push((index, result, failure));
                    }
                    (ran, last)
                })
            })
            .collect();
        for worker in workers {
            let (ran, ran_last) = worker.join().expect("a guest worker panicked");
            done.extend(ran);
            last = last.take().or(ran_last);
        }
    });
    // Stopped before the last job's turn: it is run now, alone, if a slot still opens.
    if last.is_none()
        && let Some(job) = take_last()
        && let Some(_slot) = options.slots.hold()
    {
        last = Some(job());
    }
    (done, last)
}

/// Boots one prepared guest; what it ran, and why it failed if it did.
fn boot(
    launcher: &mut Launcher,
    prepared: Prepared,
    options: &Options,
    alone: bool,
) -> (anyhow::Result<GuestRun>, Option<String>) {
    let Prepared {
        guest,
        kernel,
        image,
        dir,
        prepare_time,
        ..
    } = prepared;
    let name = guest.name.clone();
    let quiet = options.quiet;
    // Alone, a guest's console is echoed as it comes; side by side, only the init's lines,
    // each with its guest's name (the whole console is printed if the guest fails).
    let mut echo = |line: &str| {
        if alone && !quiet {
            println!("{line}");
        } else if !quiet && line.starts_with("init: ") {
            println!("[{name}] {line}");
        }
    };
    eprintln!(
        "==> xtask vm: tests on {} ({}, {})",
        name, kernel.release, kernel.origin
    );
    let ran = tap_probe_guest::boot(
        launcher,
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 2048,
            timeout: options.timeout,
            echo: &mut echo,
            stdout: None,
            collect_into: None,
        },
    );
    let ran = match ran {
        Ok(ran) => ran,
        Err(err) => return (Err(err), None),
    };
    let outcome = &ran.booted.outcome;
    let PerBinary {
        results,
        said,
        init_failures,
    } = per_binary(&outcome.lines);
    let failure = (outcome.verdict != Verdict::Success).then(|| {
        // Which binaries failed (an abort or a timeout has no panic to show) and why.
        let mut why = vec![launch::describe(&outcome.verdict)];
        why.extend(init_failures);
        why.extend((!said.panics.is_empty()).then(|| said.failures()));
        format!("{name}: {}", why.join("; "))
    });
    if failure.is_some() && (quiet || !alone) {
        for line in &outcome.lines {
            println!("[{name}] {line}");
        }
    }
    let times = format!(
        "prepare {:.1} s, image {} MiB, {}; console log {}",
        prepare_time.as_secs_f64(),
        ran.image_bytes >> 20,
        ran.booted.times(),
        ran.log.display()
    );
    eprintln!("xtask vm: {name}: {times}");
    let run = GuestRun {
        name: guest.name,
        release: kernel.release,
        said,
        results,
        times,
        took: outcome.elapsed,
    };
    (Ok(run), failure)
}

/// The guest's kernel and the modules to load in it.
///
/// # Errors
/// If the kernel cannot be had or a module is unusable.
pub(crate) fn prepare(guest: &Guest) -> anyhow::Result<(Kernel, Vec<tap_probe_guest::Module>)> {
    let cache = tap_probe_guest::cache_dir()?;
    let kernel =
        tap_probe_guest::kernel::resolve(&guest.kernel, guest.modules_dir.as_deref(), &cache)?;
    let scratch = guest_dir(&kernel).join("modules");
    let set = kernel.modules(tap_probe_guest::MODULES, &guest.modules, &scratch)?;
    eprintln!(
        "xtask vm: kernel {} from {}; modules: {}{}",
        kernel.release,
        kernel.origin,
        set.load
            .iter()
            .map(|module| module.name.as_str())
            .collect::<Vec<_>>()
            .join(" "),
        if set.missing.is_empty() {
            String::new()
        } else {
            format!(" (not available: {})", set.missing.join(" "))
        }
    );
    Ok((kernel, set.load))
}

/// What every guest runs: per test binary of the suite, the tests whose outcome depends on
/// the kernel, of those the passthrough arguments select.
struct Payload {
    /// Index into the suite's binaries, and the tests of it to run.
    runs: Vec<(usize, Vec<String>)>,
    /// The passthrough arguments each binary also gets (but `--exact`, which the selection
    /// already sets).
    args: Vec<String>,
}

impl Payload {
    /// What a guest runs: of what `passthrough` selects, the tests that depend on the
    /// kernel, and of those its `subset`'s (see [`suite::SUBSETS`]).
    fn select(
        suite: &Suite,
        passthrough: &[String],
        subset: Option<&Subset>,
    ) -> anyhow::Result<Self> {
        let mut runs = Vec::new();
        for (index, binary) in suite.binaries.iter().enumerate() {
            if !binary.for_guests() {
                continue;
            }
            let tests: Vec<String> = suite::for_guests(binary, passthrough)?
                .into_iter()
                .filter(|test| subset.is_none_or(|subset| subset.runs(&binary.label, test)))
                .collect();
            if !tests.is_empty() {
                runs.push((index, tests));
            }
        }
        let args = passthrough
            .iter()
            .filter(|arg| *arg != "--exact")
            .cloned()
            .collect();
        Ok(Self { runs, args })
    }

    /// The binaries, the host tools, and a script that runs `tap-probe doctor` and then
    /// each binary in turn, one test at a time (they share the guest's tracepoints), with
    /// exactly the selected tests.
    fn add_to(&self, image: &mut Image, suite: &Suite) -> anyhow::Result<()> {
        for tool in HOST_TOOLS {
            image.host_tool(tool)?;
        }
        let tap_probe = suite.tap_probe.to_str().context("non-UTF-8 target path")?;
        image.executable(tap_probe, &suite.tap_probe)?;
        image.executable("/bin/tap-probe", &suite.tap_probe)?;
        let mut script = format!(
            r#"echo "init: tap-probe doctor"
/bin/tap-probe doctor
echo "init: tap-probe doctor exited $?"
run() {{
    read -r up _ < /proc/uptime
    echo "init: running $1 (uptime $up s)"
    timeout {BINARY_TIMEOUT_S} "$@" --test-threads=1 --show-output
    rc=$?
    read -r up _ < /proc/uptime
    # busybox timeout ends the binary with SIGTERM: exit status 128 + 15.
    [ "$rc" -eq 143 ] && echo "init: $1 timed out after {BINARY_TIMEOUT_S} s"
    echo "init: $1 exited $rc (uptime $up s)"
    [ "$rc" -eq 0 ] || status=1
}}
"#
        );
        for (index, tests) in &self.runs {
            let binary = &suite.binaries[*index];
            let guest = format!("/tests/{}", binary.label);
            image.executable(&guest, &binary.path)?;
            let _ = write!(script, "run {guest} --exact");
            for word in tests.iter().chain(&self.args) {
                script.push(' ');
                script.push_str(&sh_quote(word));
            }
            script.push('\n');
        }
        image.script(&script);
        Ok(())
    }
}

/// Per test binary, the counts from libtest's `test result:` line, the failed tests' names
/// and init lines that report a failure; and everything the tests said. Read from the
/// console, where `init: running /tests/LABEL` begins each binary's output.
fn per_binary(lines: &[String]) -> PerBinary {
    let mut results = String::new();
    let mut said = Output::default();
    let mut init_failures = Vec::new();
    let mut binary: Option<&str> = None;
    let mut failed: Vec<&str> = Vec::new();
    let mut output: Vec<&str> = Vec::new();
    let mut flush = |binary: Option<&str>, output: &mut Vec<&str>| {
        if let Some(binary) = binary {
            said.extend(output::read(binary, output));
        }
        output.clear();
    };
    for line in lines {
        if let Some(path) = line.strip_prefix("init: running ") {
            flush(binary, &mut output);
            binary = path
                .split(' ')
                .next()
                .and_then(|path| path.rsplit('/').next());
            failed.clear();
        } else if let Some(name) = line
            .strip_prefix("test ")
            .and_then(|rest| rest.strip_suffix(" ... FAILED"))
        {
            failed.push(name);
        } else if let (Some(name), Some(result)) = (binary, line.strip_prefix("test result: ")) {
            let _ = write!(results, "\n  {name}: {result}");
            if !failed.is_empty() {
                let _ = write!(results, "\n    failed: {}", failed.join(", "));
            }
        } else if let Some(rest) = line
            .strip_prefix("init: ")
            .filter(|rest| rest.ends_with("failed") || failed_exit(rest))
        {
            let _ = write!(results, "\n  {line}");
            init_failures.push(rest.split(" (uptime").next().unwrap_or(rest).to_owned());
        }
        output.push(line);
    }
    flush(binary, &mut output);
    PerBinary {
        results,
        said,
        init_failures,
    }
}

/// What the console said of the test binaries a guest ran.
struct PerBinary {
    /// Per binary, its `test result:` line and failed tests; init lines reporting a failure.
    results: String,
    said: Output,
    /// The init's lines that report a failure (a binary's non-zero exit, a timeout), as
    /// they read after `init: `.
    init_failures: Vec<String>,
}

/// Whether an init line reports a non-zero exit: `PATH exited RC (uptime ...)`.
fn failed_exit(line: &str) -> bool {
    line.split_once(" exited ")
        .and_then(|(_, rest)| rest.split(' ').next())
        .is_some_and(|rc| rc != "0")
}

/// Boots `guest`'s kernel with a trivial payload and a first boot that cannot succeed (as
/// `TAP_PROBE_VM_BREAK_FIRST_BOOT` makes it): the launcher must fall back to TCG and the
/// second boot must pass. Exercises on every machine the path machines with a half-working
/// KVM take.
///
/// # Errors
/// If the fallback does not happen or its run fails.
pub(crate) fn check_fallback(guest: &Guest) -> anyhow::Result<()> {
    let (kernel, _) = prepare(guest)?;
    let dir = cmd::target_dir().join("vm").join("fallback");
    let mut image = Image::new(&kernel.release, Vec::new(), &dir.join("scratch"))?;
    image.script("echo \"init: payload ran on $(uname -r)\"\n");
    let mut launcher = Launcher::new(AccelChoice::Auto, "xtask vm");
    launcher.break_next_boot();
    let mut echo = |_: &str| {};
    let ran = tap_probe_guest::boot(
        &mut launcher,
        tap_probe_guest::Boot {
            kernel: &kernel,
            image,
            dir: &dir,
            cpus: 2,
            memory_mib: 512,
            timeout: Duration::from_mins(5),
            echo: &mut echo,
            stdout: None,
            collect_into: None,
        },
    )?;
    let booted = &ran.booted;
    let Some((why, took)) = &booted.fallback else {
        bail!("the first boot was broken on purpose, yet no fallback happened");
    };
    if booted.outcome.verdict != Verdict::Success {
        bail!(
            "the fallback run failed: {} (console log {})",
            launch::describe(&booted.outcome.verdict),
            ran.log.display()
        );
    }
    eprintln!(
        "xtask vm: fallback checked: the broken first boot failed after {:.1} s ({why}); the \
         TCG run passed: {}",
        took.as_secs_f64(),
        booted.times()
    );
    Ok(())
}

/// Where a guest's files go.
pub(crate) fn guest_dir(kernel: &Kernel) -> PathBuf {
    cmd::target_dir().join("vm").join(&kernel.release)
}

#[cfg(test)]
mod tests {
    use std::path::Path;

    use super::*;

    #[test]
    fn each_binary_is_reported_with_what_its_tests_said() {
        let lines: Vec<String> = [
            "init: running /tests/exactness --exact a b (uptime 9.50 s)",
            "test a ... ok",
            "test b ... FAILED",
            "successes:",
            "---- a stdout ----",
            "skipping test - no kprobes",
            r#"oracle: {"outcome":"exact","count":3,"oracle":"qdisc","backend":"kprobe"}"#,
            "test result: FAILED. 1 passed; 1 failed; 0 ignored",
            "init: /tests/exactness exited 101 (uptime 12.00 s)",
            "init: running /tests/ring --exact c (uptime 12.10 s)",
            "---- c stdout ----",
            r#"oracle: {"outcome":"exact","count":2,"oracle":"reader","backend":"kprobe"}"#,
            "test result: ok. 1 passed; 0 failed; 0 ignored",
            "init: /tests/ring exited 0 (uptime 13.00 s)",
        ]
        .map(str::to_owned)
        .to_vec();
        let PerBinary {
            results,
            said,
            init_failures,
        } = per_binary(&lines);
        assert_eq!(init_failures, ["/tests/exactness exited 101"]);
        assert!(
            results.contains("exactness: FAILED. 1 passed; 1 failed"),
            "{results}"
        );
        assert!(results.contains("failed: b"), "{results}");
        assert!(results.contains("exited 101"), "{results}");
        assert!(!results.contains("exited 0"), "{results}");
        assert_eq!(said.skips.len(), 1);
        assert_eq!(said.skips[0].test, "exactness::a");
        let tests: Vec<&str> = said.tallies.iter().map(|t| t.test.as_str()).collect();
        assert_eq!(tests, ["exactness::a", "ring::c"]);
    }

    #[test]
    fn guest_dirs_are_per_release() {
        let kernel = Kernel {
            release: "7.3-cloud-amd64".to_owned(),
            vmlinuz: Path::new("/x").to_path_buf(),
            modules_dir: None,
            origin: String::new(),
        };
        assert!(guest_dir(&kernel).ends_with("vm/7.3-cloud-amd64"));
    }
}
