//! QEMU as a child that does not outlive the program that runs it, whatever ends that
//! program: an error or a panic that unwinds past it (the guard kills it on drop), a
//! signal the program handles (it stops QEMU itself, see [`crate::qemu::run`]), or a death
//! it cannot handle, SIGKILL or an abort (the kernel kills QEMU then: `PR_SET_PDEATHSIG`).
//! An emulated guest left running takes a whole CPU until someone finds it.

use std::io;
use std::os::unix::process::CommandExt as _;
use std::process::{Child, Command};

/// A child killed and reaped when this is dropped, and by the kernel when the thread that
/// started it dies first.
pub(crate) struct Owned(Child);

impl Owned {
    /// Starts `command` in a process group of its own, tied to this thread's life.
    ///
    /// The group keeps a terminal's Ctrl-C (sent to the foreground group) from reaching
    /// QEMU, which would exit on it before its owner read what the guest had to say: the
    /// owner gets the signal alone and stops QEMU itself.
    ///
    /// # Errors
    /// When the command cannot be started.
    pub(crate) fn spawn(command: &mut Command) -> io::Result<Self> {
        let owner = std::process::id();
        command.process_group(0);
        // SAFETY: runs in the child between fork and exec, where only async-signal-safe
        // calls are allowed: prctl and getppid are.
        unsafe {
            command.pre_exec(move || {
                if libc::prctl(libc::PR_SET_PDEATHSIG, libc::SIGKILL) != 0 {
                    return Err(io::Error::last_os_error());
                }
                // The owner died before the prctl: this child belongs to someone else
                // already, and nobody would ever kill it.
                if u32::try_from(libc::getppid()).ok() != Some(owner) {
                    return Err(io::Error::other("the parent died while starting QEMU"));
                }
                Ok(())
            });
        }
        command.spawn().map(Self)
    }

    pub(crate) fn child(&mut self) -> &mut Child {
        &mut self.0
    }
}

impl Drop for Owned {
    fn drop(&mut self) {
        if matches!(self.0.try_wait(), Ok(None)) {
            let _ = self.0.kill();
            let _ = self.0.wait();
        }
    }
}

#[cfg(test)]
mod tests {
    use std::time::{Duration, Instant};

    use super::*;

    /// Whether `pid` is still a process (a zombie counts as gone).
    fn alive(pid: u32) -> bool {
        std::fs::read_to_string(format!("/proc/{pid}/stat")).is_ok_and(|stat| {
            stat.rsplit(')')
                .next()
                .is_some_and(|rest| !rest.trim_start().starts_with('Z'))
        })
    }

    fn wait_gone(pid: u32) {
        let deadline = Instant::now() + Duration::from_secs(10);
        while alive(pid) {
            assert!(Instant::now() < deadline, "{pid} outlived its owner");
            std::thread::sleep(Duration::from_millis(20));
        }
    }

    #[test]
    fn a_panic_that_unwinds_past_the_guard_kills_the_child() {
        let mut pid = 0;
        let unwound = std::panic::catch_unwind(std::panic::AssertUnwindSafe(|| {
            let mut child = Owned::spawn(Command::new("sleep").arg("600")).unwrap();
            pid = child.child().id();
            panic!("on purpose");
        }));
        assert!(unwound.is_err());
        assert!(pid > 0);
        wait_gone(pid);
    }

    #[test]
    fn the_child_dies_with_the_thread_that_started_it() {
        // The guard is leaked, as a SIGKILL of the owner would leave it: the kernel's
        // parent-death signal is all that is left to end the child.
        let pid = std::thread::spawn(|| {
            let mut child = Owned::spawn(Command::new("sleep").arg("600")).unwrap();
            let pid = child.child().id();
            std::mem::forget(child);
            pid
        })
        .join()
        .unwrap();
        wait_gone(pid);
        // It was a child of this process: reap it.
        // SAFETY: waits for a child of this process that nothing else waits for.
        unsafe { libc::waitpid(i32::try_from(pid).unwrap(), std::ptr::null_mut(), 0) };
    }

    #[test]
    fn the_child_leads_a_process_group_of_its_own() {
        let mut child = Owned::spawn(Command::new("sleep").arg("600")).unwrap();
        let pid = child.child().id();
        let stat = std::fs::read_to_string(format!("/proc/{pid}/stat")).unwrap();
        // Fields after the command's closing parenthesis: state, ppid, pgrp.
        let pgrp: u32 = stat
            .rsplit(')')
            .next()
            .and_then(|rest| rest.split_whitespace().nth(2))
            .and_then(|field| field.parse().ok())
            .unwrap();
        assert_eq!(pgrp, pid);
    }
}
