//! The observer: what tap-probe sees of the machine and how. From the bottom up: the
//! operating system through narrow doors (`os`), what is known of the running kernel
//! (`kernel`), the eBPF objects this crate's build script builds and embeds, the backends
//! and the loaded probe (`bpf`), and the host as tap-probe watches it: discovery, the
//! watcher's refresh, its report rows, the recorder (`host`). Each module uses only those
//! before it.
//!
//! The modules are public; an item in them is `pub` when a crate above (the lab, the
//! binary, the binary's tests) uses it and `pub(crate)` otherwise, so the compiler still
//! finds dead code. The tests name what they use by these paths: the lab exports rigs only.

pub mod bpf;
pub mod host;
pub mod kernel;
pub mod os;
