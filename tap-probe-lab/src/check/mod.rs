//! `tap-probe check SPEC`: runs the scenarios of a spec on the running kernel and judges
//! their expectations, for CI.
//!
//! - `spec`: the scenario file, checked completely before any traffic runs;
//! - `expr`: the expression language of `expect`;
//! - `report`: what a run found, its text and JSON forms and the exit code;
//! - `baseline`: the values of an earlier run, for `baseline.NAME`;
//! - `junit`: the `JUnit` XML of a run.

pub mod baseline;
pub mod expr;
pub mod junit;
pub mod report;
pub mod run;
pub mod spec;
