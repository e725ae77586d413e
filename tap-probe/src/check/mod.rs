//! `tap-probe check SPEC`: runs the scenarios of a spec on the running kernel and judges
//! their expectations, for CI.
//!
//! - `spec`: the scenario file, checked completely before any traffic runs;
//! - `expr`: the expression language of `expect`;
//! - `report`: what a run found, its text and JSON forms and the exit code;
//! - `baseline`: the values of an earlier run, for `baseline.NAME`;
//! - `junit`: the `JUnit` XML of a run.

pub(crate) mod baseline;
pub(crate) mod expr;
pub(crate) mod junit;
pub(crate) mod report;
pub(crate) mod run;
pub(crate) mod spec;
