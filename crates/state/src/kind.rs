//! The kinds of keyed state. Descriptors declare one, the schema registry and every
//! snapshot record it, so that a restore can refuse to reinterpret a list as a value.

use serde::{Deserialize, Serialize};

use crate::ttl::Framing;

/// What kind of keyed state a name refers to.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum StateKind {
    Value,
    List,
    Map,
    Reducing,
    Aggregating,
}

impl From<StateKind> for Framing {
    fn from(kind: StateKind) -> Self {
        match kind {
            StateKind::List => Self::List,
            _ => Self::Single,
        }
    }
}

impl std::fmt::Display for StateKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        write!(f, "{self:?}")
    }
}
