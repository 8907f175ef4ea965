//! Flink's `CheckpointedFunction`: user functions that keep their own
//! in-memory buffers copy them into operator state at each snapshot and read
//! them back on start (see the BufferingSink test).

use crate::error::Result;
use crate::keyed::StateValue;
use crate::operator::OperatorListState;
use crate::store::StateStore;

pub struct FunctionSnapshotContext {
    pub checkpoint_id: u64,
}

/// Handed to `initialize_state`, after any restore.
pub struct FunctionInitializationContext<'a> {
    store: &'a StateStore,
}

impl<'a> FunctionInitializationContext<'a> {
    pub fn new(store: &'a StateStore) -> Self {
        Self { store }
    }
    /// True when state was restored from a checkpoint or savepoint.
    pub fn is_restored(&self) -> bool {
        self.store.is_restored()
    }
    pub fn operator_list_state<T: StateValue>(&self, name: &str) -> Result<OperatorListState<T>> {
        self.store.operator_list_state(name)
    }
    pub fn union_list_state<T: StateValue>(&self, name: &str) -> Result<OperatorListState<T>> {
        self.store.union_list_state(name)
    }
    /// Keyed state, for functions that also use it.
    pub fn keyed_state_store(&self) -> &StateStore {
        self.store
    }
}

pub trait CheckpointedFunction {
    /// Called before every snapshot: copy in-memory data into state handles.
    fn snapshot_state(&mut self, ctx: &FunctionSnapshotContext) -> Result<()>;
    /// Called once at start, after restore: obtain handles, reload buffers.
    fn initialize_state(&mut self, ctx: &FunctionInitializationContext<'_>) -> Result<()>;
}
