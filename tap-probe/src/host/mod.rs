//! The host as tap-probe watches it: which devices exist, which are tracked, what each
//! refresh shows, and the recorder that turns events into a trace.

pub(crate) mod discovery;
pub(crate) mod recorder;
pub(crate) mod report;
pub(crate) mod watcher;
