//! The files `tap-probe check` reads, and nothing of the kernel: the scenario spec
//! (`spec`: TOML `[[scenario]]` tables, checked completely before any traffic runs), the
//! expression language of its `expect` lists (`expr`), what a scenario measured
//! (`measured`), the numbers its traffic measured among them, which `load`'s and `demo`'s
//! reports and the benchmarks share (`load`), the baseline file of an earlier run
//! (`baseline`), and the traffic's choices that `load`, `demo` and `bench` share with a
//! scenario (`traffic`).
//!
//! A crate of its own, below the lab, as the trace format is: what a user writes is parsed
//! and fuzzed without the observer (`tap-probe/fuzz`).

pub mod baseline;
mod caret;
pub mod expr;
pub mod load;
pub mod measured;
pub mod spec;
pub mod traffic;
