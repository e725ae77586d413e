//! Reading a guest's serial console and QEMU's own stderr: each line is classified into
//! what it tells about the run (the init started, the payload's verdict, a kernel panic or
//! oops, KVM giving up on the guest). A pure function of the text, so it is tested on
//! console captures.

/// The first line the init prints: everything before it is firmware and kernel boot.
pub const INIT_PREFIX: &str = "init: ";
/// The init's last line when its payload succeeded.
pub const SUCCESS: &str = "init: success";
/// The init's last line when its payload failed; `init: failure (exit N)` carries the
/// payload's exit status.
pub const FAILURE: &str = "init: failure";

/// What a line says about the run.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum Signal {
    /// A line of the init: the guest reached userspace.
    Init,
    Success,
    /// The payload failed, with its exit status when the init gave one.
    Failure(Option<i32>),
    /// The kernel's panic banner (`panic()` in kernel/panic.c).
    Panic,
    /// A kernel oops or BUG (`die()` in arch/x86/kernel/dumpstack.c, `BUG:` reports); the
    /// init makes oopses panic, but one during boot comes before it can.
    Oops,
    /// KVM could not run the guest: QEMU prints `KVM internal error. Suberror: N` and, for
    /// an instruction it could not emulate, `emulation failure`, then keeps the VM paused
    /// without exiting (seen on machines where `/dev/kvm` half-works).
    KvmError,
    /// The CPU model lacks what the kernel needs: the boot stub prints this and halts
    /// (arch/x86/boot/cpu.c), QEMU keeps running.
    CpuRefused,
}

/// What `line` (already stripped of terminal escapes) says, if anything.
#[must_use]
pub fn classify(line: &str) -> Option<Signal> {
    if line.contains("Kernel panic - not syncing") {
        return Some(Signal::Panic);
    }
    if line.contains("KVM internal error") || line.contains("emulation failure") {
        return Some(Signal::KvmError);
    }
    if line.contains("This kernel requires an x86-64 CPU")
        || line.contains("This kernel requires the following features not present on the CPU")
    {
        return Some(Signal::CpuRefused);
    }
    // The kernel's own reports start after the printk timestamp: `[    1.2] Oops: ...`.
    let message = line
        .trim_start()
        .strip_prefix('[')
        .and_then(|rest| rest.split_once(']'))
        .map_or(line, |(_, message)| message.trim_start());
    if message.starts_with("Oops:") || message.starts_with("BUG: ") {
        return Some(Signal::Oops);
    }
    if line == SUCCESS {
        return Some(Signal::Success);
    }
    if let Some(rest) = line.strip_prefix(FAILURE) {
        let code = rest
            .trim()
            .strip_prefix("(exit ")
            .and_then(|rest| rest.strip_suffix(')'))
            .and_then(|code| code.parse().ok());
        if rest.is_empty() || code.is_some() {
            return Some(Signal::Failure(code));
        }
    }
    // The init's lines may be glued to firmware escapes or a kernel message that was being
    // printed at the same moment, so a contained prefix counts.
    line.contains(INIT_PREFIX).then_some(Signal::Init)
}

/// `line` without terminal control sequences (the guest's firmware clears the screen on the
/// serial console, which glues escape codes onto the kernel's first lines) and carriage
/// returns.
#[must_use]
pub fn strip_escapes(line: &str) -> String {
    let mut out = String::with_capacity(line.len());
    let mut chars = line.chars();
    while let Some(c) = chars.next() {
        match c {
            '\x1b' => {
                // CSI (`ESC [ params final`) runs to a byte in @..~; other escapes are
                // `ESC x`.
                if chars.next() == Some('[') {
                    for c in chars.by_ref() {
                        if ('@'..='~').contains(&c) {
                            break;
                        }
                    }
                }
            }
            '\r' => {}
            c => out.push(c),
        }
    }
    out
}

#[cfg(test)]
mod tests {
    use super::*;

    fn signals(console: &str) -> Vec<Signal> {
        console
            .lines()
            .map(strip_escapes)
            .filter_map(|line| classify(&line))
            .collect()
    }

    /// QEMU's stderr on a machine where KVM starts a guest and then cannot run it.
    const KVM_EMULATION_FAILURE: &str = "\
KVM internal error. Suberror: 1
extra data[0]: 0x0000000000000000
extra data[1]: 0x0000000000000030
emulation failure
RAX=0000000000000000 RBX=ffffffff82a03f50 RCX=0000000000000000 RDX=0000000000000000
RIP=ffffffff81c2a1e3 RFL=00000046 [---Z-P-] CPL=0 II=0 A20=1 SMM=0 HLT=0
Code=48 8b 4f 08 48 8b 07 f0 48 0f c7 0e <0f> 94 c0 c3 cc cc cc cc
";

    #[test]
    fn kvm_internal_error_and_emulation_failure_are_kvm_errors() {
        assert_eq!(
            signals(KVM_EMULATION_FAILURE),
            [Signal::KvmError, Signal::KvmError]
        );
    }

    #[test]
    fn a_clean_run_starts_the_init_and_succeeds() {
        let console = "\x1bc\x1b[?7l\x1b[2JSeaBIOS (version 1.16.2)\r\n\
                       Booting from ROM...\r\n\
                       \x1b[2Jinit: kernel 6.1.0-57-cloud-amd64, expected 6.1.0-57-cloud-amd64\r\n\
                       test result: ok. 3 passed\r\n\
                       init: success\r\n\
                       [    9.1] reboot: Power down\r\n";
        assert_eq!(
            signals(console),
            [Signal::Init, Signal::Success],
            "{console:?}"
        );
    }

    #[test]
    fn failure_carries_the_exit_status() {
        assert_eq!(classify("init: failure"), Some(Signal::Failure(None)));
        assert_eq!(
            classify("init: failure (exit 2)"),
            Some(Signal::Failure(Some(2)))
        );
        // Not a verdict: an init line that merely starts alike.
        assert_eq!(classify("init: failure to load x"), Some(Signal::Init));
    }

    #[test]
    fn panics_and_oopses_are_fatal() {
        let console = "[    3.1] BUG: kernel NULL pointer dereference, address: 0000000000000008\n\
                       [    3.1] Oops: 0000 [#1] PREEMPT SMP NOPTI\n\
                       [    3.2] Kernel panic - not syncing: Fatal exception\n";
        assert_eq!(
            signals(console),
            [Signal::Oops, Signal::Oops, Signal::Panic]
        );
        // A test's own output mentioning the words is not a kernel report.
        assert_eq!(classify("test oops_in_name ... ok"), None);
    }

    #[test]
    fn a_cpu_the_kernel_refuses_is_fatal() {
        let console = "Booting from ROM...\n\
                       This kernel requires an x86-64 CPU, but only detected an i686 CPU.\n\
                       Unable to boot - please use a kernel appropriate for your CPU.\n";
        assert_eq!(signals(console), [Signal::CpuRefused]);
    }

    #[test]
    fn no_verdict_is_no_signal() {
        let console = "Booting from ROM...\nProbing EDD (edd=off to disable)... ok\n";
        assert!(signals(console).is_empty());
    }

    #[test]
    fn escapes_are_stripped() {
        assert_eq!(
            strip_escapes("ok\x1bc\x1b[?7l\x1b[2Jinit: kernel 6.1\r\n"),
            "okinit: kernel 6.1\n"
        );
        assert_eq!(strip_escapes("plain"), "plain");
    }
}
