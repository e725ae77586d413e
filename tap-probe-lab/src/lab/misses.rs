//! Program runs the kernel skips, caused on purpose: the lab object's miss programs, and
//! what tap-probe reads of their misses with the very code it reads its own programs' with
//! (`bpf::missed`, `bpf::kprobe`). A test compares that reading with the count it caused.
//!
//! The programs are set off by a program run with `BPF_PROG_TEST_RUN` on the calling CPU,
//! so each trigger is one run, in this process, outside any other program:
//! - [`RecursionLab`]: a raw tracepoint program on `bpf_trace_printk` calls
//!   `bpf_trace_printk`; its nested run is refused, one recursion miss per trigger;
//! - [`KprobeLab`]: a kprobe program on `bpf_get_current_comm` calls that helper (its
//!   kprobe is hit inside a kprobe handler: one kprobe miss per trigger) and
//!   `bpf_trace_printk` (a classic tracepoint program there is refused while a kprobe
//!   program runs: one recursion miss per trigger, counted since Linux 6.7).

use std::os::fd::{AsFd as _, AsRawFd as _};

use anyhow::{Context as _, Result, anyhow};
use aya::maps::PerCpuArray;
use aya::programs::{RawTracePoint, TracePoint};
use aya::{Ebpf, EbpfLoader};

use tap_probe_observer::bpf::kprobe::Kprobes;
use tap_probe_observer::bpf::missed::recursion_misses;
use tap_probe_observer::bpf::object::Object;
use tap_probe_observer::kernel::KernelInfo;

/// The names the lab object (`tap-probe-ebpf/src/bin/lab.rs`) gives its miss programs, the
/// process they act for, and the counts of their runs.
const TRIGGER: &str = "trigger";
const RECURSE_PRINTK: &str = "recurse_printk";
const COMM_KPROBE: &str = "comm_kprobe";
const PRINTK_TRACEPOINT: &str = "printk_tracepoint";
const GLOBAL_LAB_TGID: &str = "LAB_TGID";
const MAP_RUNS: &str = "RUNS";
const RUN_RECURSE_PRINTK: u32 = 0;
const RUN_COMM_KPROBE: u32 = 1;
const RUN_PRINTK_TRACEPOINT: u32 = 2;
/// The function `comm_kprobe` is attached to, which it calls itself.
const COMM_FUNCTION: &str = "bpf_get_current_comm";
/// The tracepoint the printk programs are attached to.
const PRINTK_TRACEPOINT_NAME: (&str, &str) = ("bpf_trace", "bpf_trace_printk");

/// `BPF_PROG_TEST_RUN` (`enum bpf_cmd`, `include/uapi/linux/bpf.h`).
const BPF_PROG_TEST_RUN: libc::c_long = 10;

/// The lab object, loaded for this process, with its trigger.
struct Lab {
    ebpf: Ebpf,
}

impl Lab {
    fn load() -> Result<Self> {
        let tgid = std::process::id();
        let mut ebpf =
            Object::Lab.load(EbpfLoader::new().override_global(GLOBAL_LAB_TGID, &tgid, true))?;
        let trigger: &mut RawTracePoint = program(&mut ebpf, TRIGGER)?.try_into()?;
        trigger.load().context("loading the trigger program")?;
        Ok(Self { ebpf })
    }

    /// Runs the trigger `times` times, each once, on this CPU.
    fn trigger(&mut self, times: u32) -> Result<()> {
        let trigger: &mut RawTracePoint = program(&mut self.ebpf, TRIGGER)?.try_into()?;
        let fd = trigger.fd()?.as_fd().as_raw_fd();
        for _ in 0..times {
            test_run(fd).context("BPF_PROG_TEST_RUN of the trigger program")?;
        }
        Ok(())
    }

    /// How many runs of the program counted at `index` did their work.
    fn runs(&self, index: u32) -> Result<u64> {
        let map = self
            .ebpf
            .map(MAP_RUNS)
            .ok_or_else(|| anyhow!("map {MAP_RUNS} missing from the lab eBPF object"))?;
        let per_cpu = PerCpuArray::<_, u64>::try_from(map)?.get(&index, 0)?;
        Ok(per_cpu.iter().sum())
    }

    /// The program `name`'s recursion misses, read as tap-probe reads its own programs';
    /// `None` where the kernel does not count them.
    fn recursion_misses(&mut self, name: &str) -> Result<Option<u64>> {
        let program = program(&mut self.ebpf, name)?;
        Ok(recursion_misses(program.fd()?.as_fd())?)
    }
}

fn program<'a>(ebpf: &'a mut Ebpf, name: &str) -> Result<&'a mut aya::programs::Program> {
    ebpf.program_mut(name)
        .ok_or_else(|| anyhow!("program {name} missing from the lab eBPF object"))
}

/// One `BPF_PROG_TEST_RUN` of the raw tracepoint program `fd`, with no arguments.
fn test_run(fd: i32) -> std::io::Result<()> {
    /// The part of `union bpf_attr` that `BPF_PROG_TEST_RUN` reads (`test`).
    #[repr(C)]
    #[derive(Default)]
    struct TestRunAttr {
        prog_fd: u32,
        retval: u32,
        data_size_in: u32,
        data_size_out: u32,
        data_in: u64,
        data_out: u64,
        repeat: u32,
        duration: u32,
        ctx_size_in: u32,
        ctx_size_out: u32,
        ctx_in: u64,
        ctx_out: u64,
        flags: u32,
        cpu: u32,
        batch_size: u32,
        pad: u32,
    }
    let mut attr = TestRunAttr {
        prog_fd: u32::try_from(fd).unwrap_or(u32::MAX),
        ..TestRunAttr::default()
    };
    // SAFETY: the attribute holds no pointer (no data, no context); the kernel reads and
    // writes at most its size.
    let rc = unsafe {
        libc::syscall(
            libc::SYS_bpf,
            BPF_PROG_TEST_RUN,
            &raw mut attr,
            size_of::<TestRunAttr>(),
        )
    };
    if rc < 0 {
        return Err(std::io::Error::last_os_error());
    }
    Ok(())
}

/// A raw tracepoint program that nests in itself once per trigger.
pub struct RecursionLab {
    lab: Lab,
}

impl RecursionLab {
    /// Loads the lab object and attaches `recurse_printk`.
    ///
    /// # Errors
    /// When the kernel refuses a program.
    pub fn attach() -> Result<Self> {
        let mut lab = Lab::load()?;
        let recurse: &mut RawTracePoint = program(&mut lab.ebpf, RECURSE_PRINTK)?.try_into()?;
        recurse.load().context("loading recurse_printk")?;
        recurse
            .attach(PRINTK_TRACEPOINT_NAME.1)
            .context("attaching recurse_printk to the raw tracepoint bpf_trace_printk")?;
        Ok(Self { lab })
    }

    /// Sets the program off `times` times.
    ///
    /// # Errors
    /// When the kernel refuses to run the trigger.
    pub fn trigger(&mut self, times: u32) -> Result<()> {
        self.lab.trigger(times)
    }

    /// Runs of `recurse_printk` that did their work (its own count).
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn runs(&self) -> Result<u64> {
        self.lab.runs(RUN_RECURSE_PRINTK)
    }

    /// `recurse_printk`'s runs the kernel skipped, as tap-probe reads them (`None`: not
    /// counted by this kernel).
    ///
    /// # Errors
    /// When the kernel refuses the object-info request.
    pub fn recursion_misses(&mut self) -> Result<Option<u64>> {
        self.lab.recursion_misses(RECURSE_PRINTK)
    }
}

/// A kprobe program hit inside itself, and a tracepoint program set off inside it, once
/// per trigger.
pub struct KprobeLab {
    // Declared first: the kprobes' links go before the programs they run.
    kprobes: Kprobes,
    lab: Lab,
    /// `offsetof(struct bpf_link_info, perf_event.kprobe.missed)` where the kernel has it.
    missed_at: Option<u32>,
}

impl KprobeLab {
    /// Loads the lab object, attaches `comm_kprobe` (through a perf link, as tap-probe's
    /// own kprobes are) and `printk_tracepoint`.
    ///
    /// # Errors
    /// When the kernel has no kprobes, or refuses a program.
    pub fn attach(kernel: &KernelInfo) -> Result<Self> {
        let mut lab = Lab::load()?;
        let mut kprobes = Kprobes::default();
        kprobes.attach(&mut lab.ebpf, COMM_KPROBE, COMM_FUNCTION, false)?;
        let (category, name) = PRINTK_TRACEPOINT_NAME;
        let tracepoint: &mut TracePoint = program(&mut lab.ebpf, PRINTK_TRACEPOINT)?.try_into()?;
        tracepoint.load().context("loading printk_tracepoint")?;
        tracepoint
            .attach(category, name)
            .context("attaching printk_tracepoint to bpf_trace:bpf_trace_printk")?;
        Ok(Self {
            kprobes,
            lab,
            missed_at: kernel.kprobe_link_missed,
        })
    }

    /// Sets the programs off `times` times.
    ///
    /// # Errors
    /// When the kernel refuses to run the trigger.
    pub fn trigger(&mut self, times: u32) -> Result<()> {
        self.lab.trigger(times)
    }

    /// Runs of `comm_kprobe` that did their work (its own count).
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn kprobe_runs(&self) -> Result<u64> {
        self.lab.runs(RUN_COMM_KPROBE)
    }

    /// Hits of `comm_kprobe`'s kprobe that ran nothing, as tap-probe reads its own
    /// kprobes' (the perf link's `missed`); `None` where the kernel does not report them.
    #[must_use]
    pub fn kprobe_misses(&self) -> Option<u64> {
        let missed_at = self.missed_at?;
        Some(
            self.kprobes
                .missed(missed_at)
                .get(COMM_KPROBE)
                .copied()
                .unwrap_or(0),
        )
    }

    /// `comm_kprobe`'s runs the kernel skipped, as tap-probe reads them (`None`: not
    /// counted by this kernel).
    ///
    /// # Errors
    /// When the kernel refuses the object-info request.
    pub fn kprobe_recursion_misses(&mut self) -> Result<Option<u64>> {
        self.lab.recursion_misses(COMM_KPROBE)
    }

    /// Runs of `printk_tracepoint` that did their work (its own count).
    ///
    /// # Errors
    /// When the map cannot be read.
    pub fn tracepoint_runs(&self) -> Result<u64> {
        self.lab.runs(RUN_PRINTK_TRACEPOINT)
    }

    /// `printk_tracepoint`'s runs the kernel skipped, as tap-probe reads them (`None`: not
    /// counted by this kernel).
    ///
    /// # Errors
    /// When the kernel refuses the object-info request.
    pub fn tracepoint_recursion_misses(&mut self) -> Result<Option<u64>> {
        self.lab.recursion_misses(PRINTK_TRACEPOINT)
    }
}
