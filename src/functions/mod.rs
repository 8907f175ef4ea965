//! Built-in process functions, chosen by `[job] function`.
//!
//! - `rules`: the rule engine, driven by JSON rules on the control topic ([`crate::rules`]).
//! - `count`: a running count per key; the smallest stateful job, for smoke tests and as
//!   the baseline the exactly-once battery checks against a reference model.

pub mod count;

pub use count::Count;

use streamstate_state::StateDeclaration;

use crate::config::FunctionKind;

/// The keyed states a built-in function registers in `open`, without running it: what
/// `streamstate check-restore` compares a snapshot with. The rule engine registers none
/// yet; when it does, its list goes here.
pub fn declared_states(function: FunctionKind) -> Vec<StateDeclaration> {
    match function {
        FunctionKind::Count => Count::declared_states(),
        FunctionKind::Rules => Vec::new(),
    }
}
