//! `tap-probe check SPEC`: runs the scenarios of a spec on the running kernel and judges
//! their expectations, for CI. The spec itself, its expressions and the baseline file are
//! `tap-probe-spec`'s.
//!
//! - `run`: a scenario's traffic, watched by the probes, and what it measured;
//! - `report`: what a run found, its text and JSON forms and the exit code;
//! - `junit`: the `JUnit` XML of a run.

pub mod junit;
pub mod report;
pub mod run;
