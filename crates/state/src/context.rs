//! The two sides of a keyed broadcast process function see different
//! capabilities, enforced by types rather than by runtime checks: the keyed
//! side reads broadcast state, the broadcast side writes it and cannot touch
//! keyed state.

use crate::descriptor::MapStateDescriptor;
use crate::keyed::StateValue;
use crate::operator::{BroadcastState, ReadOnlyBroadcastState};
use crate::store::StateStore;

/// Given to `process_element` and `on_timer`: timers and read-only
/// broadcast state (keyed state goes through the function's cached handles).
pub struct KeyedContext<'a> {
    store: &'a StateStore,
}

impl<'a> KeyedContext<'a> {
    pub fn new(store: &'a StateStore) -> Self {
        Self { store }
    }
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> ReadOnlyBroadcastState<K, V> {
        self.store.read_only_broadcast_state(d)
    }
    pub fn register_event_time_timer(&self, ts: u64) -> crate::Result<()> {
        self.store.register_event_time_timer(ts)
    }
    pub fn delete_event_time_timer(&self, ts: u64) -> crate::Result<()> {
        self.store.delete_event_time_timer(ts)
    }
    pub fn register_processing_time_timer(&self, ts: u64) -> crate::Result<()> {
        self.store.register_processing_time_timer(ts)
    }
    pub fn delete_processing_time_timer(&self, ts: u64) -> crate::Result<()> {
        self.store.delete_processing_time_timer(ts)
    }
    pub fn current_key(&self) -> Option<Vec<u8>> {
        self.store.current_key()
    }
}

/// Given to `process_broadcast_element`: writable broadcast state only.
pub struct BroadcastContext<'a> {
    store: &'a StateStore,
}

impl<'a> BroadcastContext<'a> {
    pub fn new(store: &'a StateStore) -> Self {
        Self { store }
    }
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> BroadcastState<K, V> {
        self.store.broadcast_state(d)
    }
}
