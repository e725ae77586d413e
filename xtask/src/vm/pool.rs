//! The guests of a run, side by side: each prepared in turn (they share apt's cache and the
//! kernels'), then booted by a pool of workers as the [`Slots`] allow, those with the most
//! tests first, and a last job run beside the last guests. What each guest did stays typed
//! until the summary renders it ([`GuestRun::report`]).

use std::fmt::{self, Write as _};
use std::path::PathBuf;
use std::sync::Mutex;
use std::time::{Duration, Instant};

use anyhow::bail;
use tap_probe_guest::{AccelChoice, Image, Kernel, Launcher, Verdict, launch};

use super::console::{Console, UNREAD};
use super::payload::Payload;
use super::slots::Slots;
use super::{Guest, guest_dir, prepare};
use crate::output::Output;
use crate::suite::Suite;

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
    pub last: Option<Mutex<Option<Last>>>,
}

/// What the guests of a run and its last job did.
#[derive(Default)]
pub(crate) struct Ran {
    pub guests: Vec<GuestRun>,
    /// How long the last job took, if it ran and succeeded.
    pub last: Option<Duration>,
}

/// What one guest ran and said.
#[derive(Debug)]
pub(crate) struct GuestRun {
    pub name: String,
    /// Its kernel's release.
    pub release: String,
    pub said: Output,
    /// How each test that ended did, in the order they ran.
    pub verdicts: Vec<tap_probe_verdict::Verdict>,
    /// The tests that did not pass, each with how it ended, and the init's lines that
    /// report a failure.
    pub failures: Vec<String>,
    /// Where its time went.
    pub times: Times,
    pub took: Duration,
}

/// Where a guest's time went, and where its console was saved.
#[derive(Debug)]
pub(crate) struct Times {
    prepare: Duration,
    image_bytes: u64,
    /// The boot's own account (`tap_probe_guest`'s): the accelerator, boot and run times.
    booted: String,
    log: PathBuf,
}

impl fmt::Display for Times {
    fn fmt(&self, f: &mut fmt::Formatter<'_>) -> fmt::Result {
        write!(
            f,
            "prepare {:.1} s, image {} MiB, {}; console log {}",
            self.prepare.as_secs_f64(),
            self.image_bytes >> 20,
            self.booted,
            self.log.display()
        )
    }
}

impl GuestRun {
    /// Its results, skips, retries and oracle checks, for the summary.
    pub(crate) fn report(&self) -> String {
        let mut out = format!(
            "xtask vm: {} ({}), {:.0} s:",
            self.name,
            self.release,
            self.took.as_secs_f64(),
        );
        out.push_str(&crate::suite::binary_lines(&self.verdicts));
        for failure in &self.failures {
            let _ = write!(out, "\n  failed: {failure}");
        }
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
    /// Its place in the run's list of guests.
    index: usize,
    guest: Guest,
    kernel: Kernel,
    image: Image,
    dir: PathBuf,
    prepare_time: Duration,
    /// How many tests it runs.
    tests: usize,
}

/// What one guest of the queue did: its run, and why it failed if it did.
struct Finished {
    index: usize,
    run: anyhow::Result<GuestRun>,
    failure: Option<String>,
}

/// Runs the kernel-dependent tests of `suite` in one guest per entry of `guests`, as many
/// at once as [`Options::slots`] allow, those with the most tests first. Returns what each
/// guest that ran said, also when one failed, and whether all succeeded: an error if a
/// kernel cannot be had, QEMU cannot be run, a guest fails (after running them all), or the
/// slots closed before every guest ran.
pub(crate) fn run_tests(
    suite: &Suite,
    guests: &[Guest],
    options: &Options,
) -> (Ran, anyhow::Result<()>) {
    let started = Instant::now();
    let prepared = match prepare_all(suite, guests, options) {
        Ok(prepared) => prepared,
        Err(err) => return (Ran::default(), Err(err)),
    };
    let total = prepared.len();
    let (mut finished, last) = run_queue(prepared, options);
    finished.sort_by_key(|f| f.index);
    let mut ran = Ran::default();
    let mut failures = Vec::new();
    let mut errors = Vec::new();
    let mut times = Vec::new();
    for Finished { run, failure, .. } in finished {
        match run {
            Ok(run) => {
                times.push(format!("{}: {}", run.name, run.times));
                failures.extend(failure);
                ran.guests.push(run);
            }
            Err(err) => errors.push(format!("{err:#}")),
        }
    }
    let stopped = total - ran.guests.len() - errors.len();
    if stopped > 0 {
        failures.push(format!(
            "{stopped} of {total} guests did not run: the run was stopped"
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
    let result = if failures.is_empty() {
        Ok(())
    } else {
        Err(anyhow::anyhow!("guests failed: {}", failures.join("; ")))
    };
    (ran, result)
}

/// Each guest's kernel, modules and image, one after another (they share apt's cache and
/// the kernels'); a guest that runs none of the selected tests is left out.
fn prepare_all(
    suite: &Suite,
    guests: &[Guest],
    options: &Options,
) -> anyhow::Result<Vec<Prepared>> {
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
    let mut prepared = Vec::new();
    for (index, (guest, payload)) in guests.iter().zip(&payloads).enumerate() {
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
            index,
            guest: guest.clone(),
            kernel,
            image,
            dir,
            prepare_time: step.elapsed(),
            tests: payload.tests(),
        });
    }
    Ok(prepared)
}

/// Boots the prepared guests, as many at once as the slots allow, those with the most tests
/// first, then runs the options' last job once no guest waits; what each guest did, and
/// what the last job did if it ran.
fn run_queue(
    prepared: Vec<Prepared>,
    options: &Options,
) -> (Vec<Finished>, Option<anyhow::Result<Duration>>) {
    let workers = Slots::cpus().clamp(1, prepared.len().max(1));
    let alone = prepared.len() == 1;
    // Taken from the end: the guests with the most tests first, so that the shortest ones
    // fill in at the end, when a CPU would otherwise idle beside the last one.
    let mut queue = prepared;
    queue.sort_by_key(|guest| guest.tests);
    let queue = Mutex::new(queue);
    let take_last = || {
        options
            .last
            .as_ref()
            .and_then(|job| job.lock().expect("the last job's lock").take())
    };
    let mut finished: Vec<Finished> = Vec::new();
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
                        let Some(guest) = next else {
                            // No guest waits: the last job, if no other worker took it.
                            last = take_last().map(|job| job());
                            drop(slot);
                            break;
                        };
                        let done = boot(&mut launcher, guest, options, alone);
                        drop(slot);
                        ran.push(done);
                    }
                    (ran, last)
                })
            })
            .collect();
        for worker in workers {
            let (ran, ran_last) = worker.join().expect("a guest worker panicked");
            finished.extend(ran);
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
    (finished, last)
}

/// Boots one prepared guest; what it ran, and why it failed if it did.
fn boot(launcher: &mut Launcher, prepared: Prepared, options: &Options, alone: bool) -> Finished {
    let Prepared {
        index,
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
        Err(err) => {
            return Finished {
                index,
                run: Err(err),
                failure: None,
            };
        }
    };
    let outcome = &ran.booted.outcome;
    let console = Console::read(&outcome.lines);
    // The init's own verdict, and each test's: a verdict line that does not read, or a test
    // that never ended, fails the guest even where the init thought it succeeded.
    let failure = (outcome.verdict != Verdict::Success
        || !console.failed().is_empty()
        || console.init_failures.iter().any(|f| f.starts_with(UNREAD)))
    .then(|| {
        // Which tests failed (an abort or a timeout has no panic to show) and why.
        let mut why = vec![launch::describe(&outcome.verdict)];
        why.extend(console.init_failures.iter().cloned());
        why.extend(console.failed());
        why.extend((!console.said.panics.is_empty()).then(|| console.said.failures()));
        format!("{name}: {}", why.join("; "))
    });
    if failure.is_some() && (quiet || !alone) {
        for line in &outcome.lines {
            println!("[{name}] {line}");
        }
    }
    let times = Times {
        prepare: prepare_time,
        image_bytes: ran.image_bytes,
        booted: ran.booted.times(),
        log: ran.log.clone(),
    };
    eprintln!("xtask vm: {name}: {times}");
    let mut failures = console.init_failures.clone();
    failures.extend(console.failed());
    let Console { verdicts, said, .. } = console;
    Finished {
        index,
        run: Ok(GuestRun {
            name: guest.name,
            release: kernel.release,
            said,
            verdicts,
            failures,
            times,
            took: outcome.elapsed,
        }),
        failure,
    }
}
