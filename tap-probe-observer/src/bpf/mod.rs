//! The eBPF side as the loader sees it: the objects, the backends that choose which hooks
//! feed each counter, and the loaded probe with its maps.

pub mod backend;
pub mod kprobe;
pub mod loaded;
pub mod missed;
pub mod object;
pub mod probe;
pub mod slots;
mod sys;
