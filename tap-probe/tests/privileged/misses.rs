//! What the kernel skips of a program, caused on purpose and read with the code tap-probe
//! reads its own programs' misses with: a quiet program reads 0, and each nesting the
//! lab's programs cause adds exactly one. A reading of the wrong field, or of nothing, fails
//! here rather than quietly opening every oracle test's gate (see `common::short`).

use tap_probe_lab::lab::{KprobeLab, RecursionLab};
use tap_probe_observer::bpf::backend::Backend;
use tap_probe_verdict::Skip;

use crate::common;
use crate::common::{Gate, Oracle};

/// Triggers per round; two rounds, so that a count that only ever reads 0 or 1 fails.
const ROUNDS: [u32; 2] = [3, 7];

/// A raw tracepoint program that calls the helper whose tracepoint it is attached to: the
/// nested run is refused and counted in the program's `recursion_misses`.
#[test]
fn a_raw_tracepoint_program_nested_in_itself_is_one_miss() {
    if !tap_probe_verdict::root() {
        return;
    }
    let mut checks = common::Checks::new();
    let gate = Gate::none();
    let mut lab = RecursionLab::attach().unwrap();
    if lab.recursion_misses().unwrap().is_none() {
        // Nor does it refuse the nested runs it would count (both came with Linux 5.12):
        // set off, the program would call itself until the CPU stalls.
        Skip::test(
            "this kernel does not count the runs it skips (recursion_misses, \
             Linux 5.12+), and tap-probe reads them as unknown; nor does it refuse a raw \
             tracepoint program nested in itself, so it is not set off",
        )
        .print();
        return;
    }
    checks.eq(
        &gate,
        Oracle::ProgramMisses,
        lab.recursion_misses().unwrap(),
        Some(0),
        "attached, not set off: a quiet program reads 0 misses",
    );
    let mut triggered = 0;
    for times in ROUNDS {
        lab.trigger(times).unwrap();
        triggered += u64::from(times);
        let (runs, misses) = (lab.runs().unwrap(), lab.recursion_misses().unwrap());
        eprintln!("{triggered} triggers: {runs} runs, {misses:?} recursion misses");
        assert_eq!(runs, triggered, "one run per trigger");
        checks.eq(
            &gate,
            Oracle::ProgramMisses,
            misses,
            Some(triggered),
            "one nested run refused per trigger",
        );
    }
}

/// A kprobe program that calls the function its kprobe is on: the kprobe is hit inside a
/// kprobe handler and runs nothing, which the kernel counts in the kprobe's `nmissed`
/// (reported through its perf link since Linux 6.7). The tracepoint program its
/// `bpf_trace_printk` sets off is refused while a kprobe program runs, which the kernel
/// counts in that program's `recursion_misses` from the same release on.
#[test]
fn a_kprobe_hit_inside_a_kprobe_program_is_one_miss() {
    if !tap_probe_verdict::root() {
        return;
    }
    let kernel = common::kernel();
    if !Backend::available(&kernel).contains(&Backend::Kprobe) {
        Skip::test("this kernel has no kprobes").print();
        return;
    }
    let mut checks = common::Checks::new();
    let gate = Gate::none();
    let mut lab = KprobeLab::attach(&kernel).unwrap();
    let reported = kernel.reports_kprobe_misses();
    assert_eq!(lab.kprobe_misses().is_some(), reported);
    let counted = lab.kprobe_recursion_misses().unwrap().is_some();
    if counted {
        checks.eq(
            &gate,
            Oracle::ProgramMisses,
            (
                lab.kprobe_recursion_misses().unwrap(),
                lab.tracepoint_recursion_misses().unwrap(),
            ),
            (Some(0), Some(0)),
            "attached, not set off: quiet programs read 0 misses",
        );
    } else {
        assert_eq!(lab.tracepoint_recursion_misses().unwrap(), None);
        Skip::part(
            "program misses",
            "this kernel does not count the runs it skips \
             (recursion_misses, Linux 5.12+): tap-probe reads them as unknown",
        )
        .print();
    }
    if let Some(misses) = lab.kprobe_misses() {
        checks.eq(
            &gate,
            Oracle::KprobeMisses,
            misses,
            0,
            "attached, not set off: a quiet kprobe reads 0 misses",
        );
    } else {
        Skip::part(
            "kprobe misses",
            "this kernel does not report what a kprobe missed (its \
             perf link has no kprobe.missed before Linux 6.7)",
        )
        .print();
    }
    let mut triggered = 0;
    for times in ROUNDS {
        lab.trigger(times).unwrap();
        triggered += u64::from(times);
        let kprobe_runs = lab.kprobe_runs().unwrap();
        let tracepoint_runs = lab.tracepoint_runs().unwrap();
        let tracepoint_misses = lab.tracepoint_recursion_misses().unwrap();
        eprintln!(
            "{triggered} triggers: kprobe program {kprobe_runs} runs, {:?} kprobe misses, {:?} \
             recursion misses; tracepoint program {tracepoint_runs} runs, {tracepoint_misses:?} \
             recursion misses",
            lab.kprobe_misses(),
            lab.kprobe_recursion_misses().unwrap()
        );
        assert_eq!(kprobe_runs, triggered, "one kprobe run per trigger");
        // The trigger's own printk, outside any kprobe program, runs it.
        assert_eq!(tracepoint_runs, triggered, "one tracepoint run per trigger");
        if !counted {
            assert_eq!(tracepoint_misses, None, "not counted: unknown, not 0");
            continue;
        }
        checks.eq(
            &gate,
            Oracle::ProgramMisses,
            lab.kprobe_recursion_misses().unwrap(),
            Some(0),
            "the kprobe program itself never nests",
        );
        if let Some(misses) = lab.kprobe_misses() {
            checks.eq(
                &gate,
                Oracle::KprobeMisses,
                misses,
                triggered,
                "one kprobe hit inside the kprobe program per trigger",
            );
        }
        // Where the kernel does not report kprobe misses it does not count these either
        // (both came with Linux 6.7): 0 there, which a wrong reading would not give.
        checks.eq(
            &gate,
            Oracle::ProgramMisses,
            tracepoint_misses,
            Some(if reported { triggered } else { 0 }),
            "the tracepoint program refused under the kprobe program, once per trigger",
        );
    }
}
