//! Tumbling and sliding windows without `group_by`: every such rule's accumulator of a
//! key for the windows that end at one instant, in one value with one timer.
//!
//! Why one value: with an accumulator and a timer per rule (a namespace each), the W
//! benchmark's four rules cost, per key and window, four backend reads, four writes,
//! four timer writes, and at the close four timer deletes and four reads and clears;
//! its profile put adding to the windows at 36% of the process and firing them at 33%.
//! Flink and Kafka Streams keep one accumulator and one timer per key and window.
//! Windows that end together close together, so the value is keyed by the end.
//!
//! Semantics are the per-rule state's: an entry belongs to a rule id, version and
//! window start (a new version starts from empty); a window the watermark has closed
//! takes no more events; at the close each rule in force emits in rule-id order, as
//! the per-rule timers fired; `distinct_count` keeps its values in the rule's own window
//! namespace. Entries of rules no longer in force are dropped at the next write of the
//! value, and at the close without output.
//!
//! Upgrade: state written before this value existed lives in `rules.window.acc` with a
//! timer per rule window; those timers still close their windows. While a restored
//! checkpoint holds any of it, a rule that finds no entry here moves the old one here
//! and deletes its old timer.

use serde::{Deserialize, Serialize};
use streamstate_state::{StateStore, ValueState};

use super::Env;
use super::aggregate::Acc;
use super::spec::Rule;
use super::window::{self, namespace};
use crate::function::FunctionError;

/// The stored value: one entry per (rule, window start) of the windows ending at its
/// namespace's instant.
#[derive(Debug, Clone, Default, PartialEq, Serialize, Deserialize)]
pub struct Windows {
    pub entries: Vec<Entry>,
}

#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct Entry {
    pub rule: String,
    pub version: u64,
    pub start: i64,
    pub acc: Acc,
}

/// The namespace of the value of windows ending at `end` (exclusive): no rule's, since
/// rule ids are never empty; its timer fires at `end - 1`.
pub fn namespace_of(end: i64) -> Vec<u8> {
    namespace("", 0, window::WINDOW_END, Some(end))
}

/// One event's view of the key's window values: each loaded on first use, written back
/// once by [`Batch::finish`].
pub(crate) struct Batch {
    store: StateStore,
    state: ValueState<Windows>,
    /// The per-rule state of earlier versions, while it still holds entries.
    legacy: Option<ValueState<Acc>>,
    loaded: Vec<Loaded>,
}

struct Loaded {
    end: i64,
    value: Windows,
}

impl Batch {
    pub fn new(
        store: StateStore,
        state: ValueState<Windows>,
        legacy: Option<ValueState<Acc>>,
    ) -> Self {
        Self {
            store,
            state,
            legacy,
            loaded: Vec::new(),
        }
    }

    /// Forgets what the previous event loaded (the key changes between events).
    pub fn reset(&mut self) {
        self.loaded.clear();
    }

    /// `rule`'s accumulator of the current key in window `[start, end)`, to be updated
    /// in place (an access counts as a write). The first access to a window of the key
    /// registers its timer. Leaves the store's namespace changed.
    pub fn acc(
        &mut self,
        env: &Env<'_, '_>,
        rule: &Rule,
        start: i64,
        end: i64,
    ) -> Result<&mut Acc, FunctionError> {
        let i = match self.loaded.iter().position(|l| l.end == end) {
            Some(i) => i,
            None => {
                env.set_namespace(&namespace_of(end));
                let value = match self.state.value()? {
                    Some(v) => v,
                    None => {
                        env.register_timer((end - 1) as u64)?;
                        Windows::default()
                    }
                };
                self.loaded.push(Loaded { end, value });
                self.loaded.len() - 1
            }
        };
        let found = self.loaded[i]
            .value
            .entries
            .iter()
            .position(|e| e.rule == rule.id && e.version == rule.version && e.start == start);
        let j = match found {
            Some(j) => j,
            None => {
                let acc = self.take_legacy(env, rule, start, end)?.unwrap_or_default();
                let entries = &mut self.loaded[i].value.entries;
                entries.push(Entry {
                    rule: rule.id.clone(),
                    version: rule.version,
                    start,
                    acc,
                });
                entries.len() - 1
            }
        };
        Ok(&mut self.loaded[i].value.entries[j].acc)
    }

    /// Moves `rule`'s accumulator of the window out of the per-rule state, with its timer.
    fn take_legacy(
        &self,
        env: &Env<'_, '_>,
        rule: &Rule,
        start: i64,
        end: i64,
    ) -> Result<Option<Acc>, FunctionError> {
        let Some(legacy) = &self.legacy else {
            return Ok(None);
        };
        env.set_namespace(&namespace(
            &rule.id,
            rule.version,
            window::WINDOW,
            Some(start),
        ));
        let acc = legacy.value()?;
        if acc.is_some() {
            legacy.clear()?;
            env.delete_timer((end - 1) as u64)?;
        }
        Ok(acc)
    }

    /// Writes back every value the event loaded, keeping only the entries of rules for
    /// which `in_force(id, version)` holds.
    pub fn finish(&mut self, in_force: impl Fn(&str, u64) -> bool) -> Result<(), FunctionError> {
        for mut l in self.loaded.drain(..) {
            l.value.entries.retain(|e| in_force(&e.rule, e.version));
            self.store.set_current_namespace(&namespace_of(l.end));
            if l.value.entries.is_empty() {
                self.state.clear()?;
            } else {
                self.state.update(&l.value)?;
            }
        }
        Ok(())
    }

    /// The value of the current namespace, removed from the store: the windows that
    /// close now, in rule-id order.
    pub fn take(&self) -> Result<Vec<Entry>, FunctionError> {
        let Some(value) = self.state.value()? else {
            return Ok(Vec::new());
        };
        self.state.clear()?;
        let mut entries = value.entries;
        entries.sort_by(|a, b| (&a.rule, a.version, a.start).cmp(&(&b.rule, b.version, b.start)));
        Ok(entries)
    }
}
