//! Built-in process functions, chosen by `[job] function`.
//!
//! - `rules`: the rule engine, driven by JSON rules on the control topic ([`crate::rules`]).
//! - `count`: a running count per key; the smallest stateful job, for smoke tests and as
//!   the baseline the exactly-once battery checks against a reference model.

pub mod count;

pub use count::Count;
