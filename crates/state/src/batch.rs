//! Batches of state access: a runtime that polls records in batches tells the store
//! where a batch begins and ends, and may name the state its events will read before
//! processing any of them.
//!
//! Why: one RocksDB `get` per state and event was the largest cost of the stateful path
//! left (bench/README.md, the S profile), much of it per call rather than per byte:
//! memtable and Bloom probes, a superversion reference, the block lookups. Read together
//! (a batched MultiGet over sorted keys, [`crate::ahead`]), a batch's reads pay those
//! once. Its writes are held and reach the backend as one sorted write batch when it
//! ends, or earlier when a barrier, scan or lookup needs the backend to hold them.

use crate::error::Result;
use crate::keygroup::{KeyGroupRange, KeyGroups};
use crate::layout;
use crate::store::{StateMeta, StateStore};

/// Storage keys a batch of events will read, collected with the handles'
/// `prefetch` methods ([`crate::ValueState::prefetch`], [`crate::MapState::prefetch`])
/// and read at once by [`StateStore::prefetch`].
pub struct Prefetch {
    key_groups: KeyGroups,
    range: KeyGroupRange,
    keys: Vec<Vec<u8>>,
}

impl Prefetch {
    /// Names the entry of `state` at `key` and `namespace`; `suffix` appends the map
    /// user key, if any. A key of a key group this instance does not own is left out
    /// (the runtime refuses its event before the function sees it).
    pub(crate) fn add(
        &mut self,
        state: &StateMeta,
        key: &[u8],
        namespace: &[u8],
        suffix: impl FnOnce(&mut Vec<u8>) -> Result<()>,
    ) -> Result<()> {
        let kg = self.key_groups.of(key);
        if !self.range.contains(kg) {
            return Ok(());
        }
        let mut k = Vec::with_capacity(16 + key.len() + namespace.len());
        layout::encode_prefix(&mut k, kg, state.id, key, namespace);
        suffix(&mut k)?;
        self.keys.push(k);
        Ok(())
    }

    /// How many entries are named so far.
    pub fn len(&self) -> usize {
        self.keys.len()
    }

    pub fn is_empty(&self) -> bool {
        self.keys.is_empty()
    }
}

impl StateStore {
    /// Begins a batch of records (see the module docs). The store's backend decides
    /// whether reading ahead pays; where it does not, this and [`Self::end_batch`]
    /// change nothing.
    pub fn begin_batch(&self) -> Result<()> {
        self.lock().backend.begin_batch()
    }

    /// Ends the batch: its held writes reach the backend (an error here is theirs:
    /// the batch's state is then not all written), and what was read ahead is dropped.
    /// Call it however the batch ended, an error included.
    pub fn end_batch(&self) -> Result<()> {
        self.lock().backend.end_batch()
    }

    /// An empty list of entries to read ahead, for this store's key groups.
    pub fn prefetch_list(&self) -> Prefetch {
        let g = self.lock();
        Prefetch {
            key_groups: g.key_groups,
            range: g.config.key_group_range,
            keys: Vec::new(),
        }
    }

    /// Whether [`Self::prefetch`] would read anything now: a batch is open on a backend
    /// that reads batches faster, or the cache is on. A runtime skips naming keys
    /// otherwise.
    pub fn reads_ahead(&self) -> bool {
        self.lock().backend.holds_reads()
    }

    /// Reads the named entries the batch (or the cache) does not hold yet, all at once,
    /// so the handles' reads that follow are answered from memory. Outside a batch and
    /// with the cache off, nothing is read.
    pub fn prefetch(&self, list: Prefetch) -> Result<()> {
        self.lock().backend.prefetch(list.keys)
    }
}
