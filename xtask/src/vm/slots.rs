//! How many guests may run at once: a semaphore whose size may change while guests run.

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
