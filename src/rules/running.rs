//! Running aggregates (no window, no `group_by`): every such rule's accumulator of a key
//! in one value, read at most once and written at most once per event.
//!
//! Why one value: with an accumulator per rule (a namespace each), the S workload paid a
//! backend get and put for every running rule an event matched (its `count` plus a
//! filtered `sum`: two of each), and backend access was the largest cost of the stateful
//! path. Rules in force are few per job, so the combined value stays small.
//!
//! Semantics are the per-rule state's: an entry belongs to a rule id and version (a new
//! version starts from empty); with `[job] state_ttl` an entry not written for that long
//! is gone (processing time, `written + ttl <= now`, as the state layer's TTL), and the
//! whole value carries the same TTL so a key nobody writes is cleaned up as before.
//! Entries of rules no longer in force are dropped at the next write of the key.
//!
//! Upgrade: state written before this value existed lives in `rules.running.acc` (one
//! entry per rule namespace). While a restored checkpoint holds any of it, a rule that
//! finds no entry here reads the old one, moves it here and deletes it.

use serde::{Deserialize, Serialize};
use streamstate_state::{Prefetch, StateStore, ValueState};

use super::aggregate::Acc;
use super::spec::Rule;
use super::window::{self, namespace};
use crate::function::FunctionError;

/// The stored value: one entry per running rule that has seen the key.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Running {
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub rule: String,
    pub version: u64,
    pub acc: Acc,
    /// Processing time of the entry's last write; kept only with `[job] state_ttl`.
    pub written_ms: Option<u64>,
}

/// The namespace of the combined value: no rule's (those start with a rule id).
const NAMESPACE: &[u8] = b"";

/// One event's view of the key's running aggregates: loaded on first use, written back
/// once by [`Batch::finish`].
pub(crate) struct Batch {
    store: StateStore,
    state: ValueState<Running>,
    /// The per-rule state of earlier versions, while it still holds entries.
    legacy: Option<ValueState<Acc>>,
    ttl_ms: Option<u64>,
    value: Running,
    loaded: bool,
    dirty: bool,
}

impl Batch {
    pub fn new(
        store: StateStore,
        state: ValueState<Running>,
        legacy: Option<ValueState<Acc>>,
        ttl_ms: Option<u64>,
    ) -> Self {
        Self {
            store,
            state,
            legacy,
            ttl_ms,
            value: Running::default(),
            loaded: false,
            dirty: false,
        }
    }

    /// Names the combined value of `key` for the batch's read-ahead.
    pub fn prefetch(&self, ahead: &mut Prefetch, key: &str) -> Result<(), FunctionError> {
        Ok(self.state.prefetch(ahead, key.as_bytes(), NAMESPACE)?)
    }

    /// Forgets what the previous event loaded (the key changes between events).
    pub fn reset(&mut self) {
        self.value.entries.clear();
        self.loaded = false;
        self.dirty = false;
    }

    /// `rule`'s accumulator of the current key, to be updated in place (the caller
    /// always does: an access counts as a write). Leaves the store's namespace changed.
    pub fn acc(&mut self, rule: &Rule) -> Result<&mut Acc, FunctionError> {
        let now_ms = match self.ttl_ms {
            Some(_) => self.store.now_ms(),
            None => 0,
        };
        if !self.loaded {
            self.store.set_current_namespace(NAMESPACE);
            self.value = self.state.value()?.unwrap_or_default();
            if let Some(ttl) = self.ttl_ms {
                let before = self.value.entries.len();
                self.value
                    .entries
                    .retain(|e| e.written_ms.is_none_or(|w| w.saturating_add(ttl) > now_ms));
                self.dirty |= self.value.entries.len() != before;
            }
            self.loaded = true;
        }
        self.dirty = true;
        let written_ms = self.ttl_ms.map(|_| now_ms);
        let found = self
            .value
            .entries
            .iter()
            .position(|e| e.rule == rule.id && e.version == rule.version);
        let i = match found {
            Some(i) => i,
            None => {
                let acc = self.take_legacy(rule)?.unwrap_or_default();
                self.value.entries.push(Entry {
                    rule: rule.id.clone(),
                    version: rule.version,
                    acc,
                    written_ms,
                });
                self.value.entries.len() - 1
            }
        };
        let entry = &mut self.value.entries[i];
        entry.written_ms = written_ms;
        Ok(&mut entry.acc)
    }

    fn take_legacy(&self, rule: &Rule) -> Result<Option<Acc>, FunctionError> {
        let Some(legacy) = &self.legacy else {
            return Ok(None);
        };
        self.store
            .set_current_namespace(&namespace(&rule.id, rule.version, window::RUNNING, None));
        let acc = legacy.value()?;
        if acc.is_some() {
            legacy.clear()?;
        }
        Ok(acc)
    }

    /// Writes the value back if an event changed it, keeping only the entries of rules
    /// for which `in_force(id, version)` holds.
    pub fn finish(&mut self, in_force: impl Fn(&str, u64) -> bool) -> Result<(), FunctionError> {
        if !self.dirty {
            return Ok(());
        }
        self.value.entries.retain(|e| in_force(&e.rule, e.version));
        self.store.set_current_namespace(NAMESPACE);
        if self.value.entries.is_empty() {
            self.state.clear()?;
        } else {
            self.state.update(&self.value)?;
        }
        self.dirty = false;
        Ok(())
    }
}
