//! The eBPF side as the loader sees it: the objects, the backends that choose which hooks
//! feed each counter, and the loaded probe with its maps.

pub(crate) mod backend;
pub(crate) mod kprobe;
pub(crate) mod loaded;
pub(crate) mod missed;
pub(crate) mod object;
pub(crate) mod probe;
pub(crate) mod slots;
