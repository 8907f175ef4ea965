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
    /// Empty state with `max_parallelism` key groups (first start).
    pub fn fresh(config: &Config, work_dir: &Path, max_parallelism: u32) -> Result<Self, ProcessError> {
        let store = StateStore::open(StoreConfig::new(config.state.backend, work_dir, max_parallelism))?;
        Self::with_store(store)
    }

    /// State rebuilt from a checkpoint's files under `from`, verified before use.
    pub fn restore(config: &Config, work_dir: &Path, from: PathBuf, snapshot: &SnapshotResult) -> Result<Self, ProcessError> {
        let job = Self::fresh(config, work_dir, snapshot.max_parallelism)?;
        job.store.restore(&[(from, snapshot.clone())])?;
        Ok(job)
    }

    fn with_store(store: StateStore) -> Result<Self, ProcessError> {
        let count = store.value_state(&ValueStateDescriptor::<u64>::new("count"))?;
        Ok(Self { store, count })
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
