//! Built-in process functions, chosen by `[job] function`.
//!
//! - `rules`: the rule engine, driven by JSON rules on the control topic ([`crate::rules`]).
//! - `count`: a running count per key; the smallest stateful job, for smoke tests and as
//!   the baseline the exactly-once battery checks against a reference model.
//! - `json`: decode and re-encode each event, no state (benchmark contender `J`).
//! - `passthrough`: raw bytes in, bytes out (benchmark contender `P`, the physical limit).

pub mod count;
pub mod json;
pub mod passthrough;

pub use count::Count;
pub use json::Json;
pub use passthrough::Passthrough;

use streamstate_state::StateDeclaration;

use crate::config::FunctionKind;

/// The keyed states a built-in function registers in `open`, without running it: what
/// `streamstate check-restore` compares a snapshot with. The rule engine registers none
/// yet; when it does, its list goes here.
pub fn declared_states(config: &crate::config::Config) -> Vec<StateDeclaration> {
    match config.job.function {
        FunctionKind::Count => Count::declared_states(),
        FunctionKind::Rules => crate::rules::RuleEngine::declared_states(config.job.state_ttl),
        FunctionKind::Json | FunctionKind::Passthrough => Vec::new(),
    }
}

/// Name prefixes of states a function creates on demand (so not declared one by one):
/// a snapshot state with such a name is kept as it is.
pub fn dynamic_state_prefixes(function: FunctionKind) -> &'static [&'static str] {
    match function {
        FunctionKind::Count | FunctionKind::Json | FunctionKind::Passthrough => &[],
        FunctionKind::Rules => &[crate::rules::DEDUP_STATE_PREFIX],
    }
}
