//! The skeleton's job function: a running count per key, in keyed `ValueState`.

use std::path::{Path, PathBuf};


use streamstate_state::{SnapshotResult, StateError, StateStore, StoreConfig, ValueState, ValueStateDescriptor};

use crate::config::Config;
use crate::decode::Event;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("state: {0}")]
    State(#[from] StateError),
}

pub struct CountJob {
    store: StateStore,
    count: ValueState<u64>,
}

impl CountJob {
    /// Empty state with `max_parallelism` key groups, in this instance's state directory.
    pub fn fresh(config: &Config, max_parallelism: u32) -> Result<Self, ProcessError> {
        let work_dir = config.state.dir.join(format!("instance-{}", config.job.instance));
        let store = StateStore::open(StoreConfig::new(config.state.backend, work_dir, max_parallelism))?;
        let count = store.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
        Ok(Self { store, count })
    }

    /// Replaces all state with a checkpoint's files (`None`: empty state). The state layer
    /// verifies every file before it swaps anything in.
    pub fn reset(&self, from: Option<(PathBuf, SnapshotResult)>) -> Result<(), ProcessError> {
        Ok(self.store.restore(from.as_slice())?)
    }

    /// The store, for the broadcast side (rules) of the same job.
    pub fn store(&self) -> &StateStore {
        &self.store
    }

    pub fn process(&mut self, event: &Event) -> Result<u64, ProcessError> {
        self.store.set_current_key(event.key.as_bytes())?;
        let n = self.count.value()?.unwrap_or(0) + 1;
        self.count.update(&n)?;
        Ok(n)
    }

    /// The synchronous part of a checkpoint: RocksDB checkpoint (hard links) or a full
    /// heap dump, plus operator state, into `dir`.
    pub fn snapshot(&mut self, id: u64, dir: &Path) -> Result<SnapshotResult, ProcessError> {
        Ok(self.store.snapshot(id, dir)?)
    }
}
