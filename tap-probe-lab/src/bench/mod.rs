//! `tap-probe bench`: the tail-drop fix's benchmark table, measured on the running kernel.
//!
//! - `run`: one run of one cell, and which columns the running kernel's fix allows;
//! - `table`: cells of runs, medians and spreads, the markdown table and its JSON.

pub mod run;
pub mod table;
