//! The storage-engine trait (TiKV `engine_traits` style): an ordered byte map.
//! Everything typed — state kinds, TTL, timers, snapshots' meaning — lives
//! above it, so both backends share that logic and the same test suite.

pub mod heap;
pub mod rocks;

use std::any::Any;
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};

use crate::error::Result;
use crate::files::FileHashes;

/// Which backend holds the live state; chosen by config.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Hash, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum BackendKind {
    /// State on the heap, values kept as objects, full snapshots written from a
    /// copy-on-write copy.
    Hashmap,
    /// State in RocksDB on local disk, incremental snapshots.
    Rocksdb,
}

impl BackendKind {
    /// The name `state.backend` takes.
    pub fn as_str(self) -> &'static str {
        match self {
            Self::Hashmap => "hashmap",
            Self::Rocksdb => "rocksdb",
        }
    }
}

impl std::fmt::Display for BackendKind {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.write_str(self.as_str())
    }
}

impl std::str::FromStr for BackendKind {
    type Err = crate::StateError;
    fn from_str(s: &str) -> Result<Self> {
        match s {
            "hashmap" | "heap" => Ok(Self::Hashmap),
            "rocksdb" => Ok(Self::Rocksdb),
            other => Err(crate::StateError::Invalid(format!(
                "unknown state backend '{other}' (hashmap|rocksdb)"
            ))),
        }
    }
}

/// Receives stored (key, value) pairs during restore; an error stops the walk.
pub(crate) type EntrySink<'a> = &'a mut dyn FnMut(&[u8], &[u8]) -> Result<()>;

/// One write of a batch ([`KvBackend::write_batch`]).
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum BatchOp<'a> {
    Put(&'a [u8]),
    Delete,
    /// As [`KvBackend::append`].
    Append(&'a [u8]),
}

/// The part of a native snapshot that may run after the barrier, on another thread.
pub trait PendingSnapshot: Send {
    /// Waits for the snapshot's files and returns them, relative to its directory.
    fn finish(self: Box<Self>) -> Result<Vec<PathBuf>>;
}

/// An immutable copy of a backend's entries, taken in O(1) at the barrier and scanned on
/// another thread while the backend goes on changing: Flink's copy-on-write snapshots of
/// its heap backend.
pub trait FrozenEntries: Send {
    /// Visits `[start, end)` in key order until `f` returns false.
    fn scan(&self, start: &[u8], end: &[u8], f: &mut dyn FnMut(&[u8], &[u8]) -> bool)
    -> Result<()>;
}

/// A value kept deserialized by a backend that holds objects (`hashmap`, as Flink's heap
/// backend keeps live objects). The backend never looks inside: it asks for the stored
/// bytes only when someone reads bytes (a scan, a snapshot, a savepoint), so everything
/// that reads bytes sees exactly what a byte store would hold.
pub trait StoredObject: Any + Send + Sync {
    /// Appends the bytes this object stands for: what a byte store would hold.
    fn encode(&self, out: &mut Vec<u8>) -> Result<()>;
    /// Heap bytes it takes, roughly (the state-size gauge; not what it points to).
    fn approximate_bytes(&self) -> usize;
}

/// A kept object; shared with frozen copies until either side replaces it.
pub type SharedObject = Arc<dyn StoredObject>;

/// What [`KvBackend::lookup`] found.
pub enum Lookup {
    Absent,
    /// The stored bytes, copied into the caller's buffer.
    Bytes,
    /// A kept object (only from a backend whose [`KvBackend::keeps_objects`] is true).
    Object(SharedObject),
}

/// [`KvBackend::get_many`] one key at a time.
pub(crate) fn get_each<B: KvBackend + ?Sized>(
    backend: &mut B,
    keys: &[&[u8]],
    found: &mut dyn FnMut(usize, Option<&[u8]>),
) -> Result<()> {
    let mut out = Vec::new();
    for (i, k) in keys.iter().enumerate() {
        let hit = backend.get(k, &mut out)?;
        found(i, hit.then_some(out.as_slice()));
    }
    Ok(())
}

/// An ordered key/value engine.
pub trait KvBackend: Send {
    fn kind(&self) -> BackendKind;
    /// Copies the value into `out` (reused by the caller to avoid allocating).
    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool>;
    /// Reads `keys` (sorted, no repeats) at once, handing each answer to `found` with the
    /// key's index. One by one unless the backend reads batches faster
    /// ([`KvBackend::batches_pay`]).
    fn get_many(
        &mut self,
        keys: &[&[u8]],
        found: &mut dyn FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        get_each(self, keys, found)
    }
    /// Whether reading a batch of keys together costs less per key than one call each:
    /// then the store reads ahead for a batch of events ([`crate::StateStore::begin_batch`]).
    /// False for an in-memory map, where each read is already a hash lookup.
    fn batches_pay(&self) -> bool {
        false
    }
    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()>;
    fn delete(&mut self, key: &[u8]) -> Result<()>;
    /// Appends `bytes` to the value at `key` (creating it). Lists use this.
    fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()>;
    /// Visits `[start, end)` in key order until `f` returns false.
    fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()>;
    /// Writes many entries at once (RocksDB: one WriteBatch). Restore uses it.
    fn put_many(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        for (k, v) in entries {
            self.put(k, v)?;
        }
        Ok(())
    }
    /// Applies the writes in order (RocksDB: one WriteBatch). The state cache
    /// writes back through this.
    fn write_batch(&mut self, ops: &[(&[u8], BatchOp<'_>)]) -> Result<()> {
        for (k, op) in ops {
            match op {
                BatchOp::Put(v) => self.put(k, v)?,
                BatchOp::Delete => self.delete(k)?,
                BatchOp::Append(a) => self.append(k, a)?,
            }
        }
        Ok(())
    }
    /// Makes buffered writes visible to snapshots.
    fn flush(&mut self) -> Result<()>;
    /// Runs compaction (and with it the TTL compaction filter) where there is one.
    fn compact(&mut self) -> Result<()>;
    /// From now on, keeps `hashes` ahead of the files the backend's native snapshots will
    /// list (RocksDB: hashes each SST a compaction installs), so a snapshot
    /// reads only what appeared since. Where snapshots list no such files, nothing.
    fn hash_ahead(&mut self, _hashes: &FileHashes) -> Result<()> {
        Ok(())
    }
    /// Starts the backend's native incremental snapshot into `dir`: what must
    /// happen at the barrier happens before this returns, the rest (the files)
    /// when the returned part finishes. Writes made after this call are not in
    /// it. `None` means "no native format, write the full canonical format".
    fn native_snapshot(&mut self, dir: &Path) -> Result<Option<Box<dyn PendingSnapshot>>>;
    /// The entries as they are now, frozen, if the backend can copy them in O(1) (so
    /// that its full snapshot can be written off the job thread); `None` otherwise.
    fn freeze(&mut self) -> Option<Box<dyn FrozenEntries>> {
        None
    }
    fn approximate_len(&mut self) -> Result<u64>;
    /// Whether the backend keeps objects: then typed handles hand it values with
    /// [`KvBackend::put_object`] instead of serializing them on every write.
    fn keeps_objects(&self) -> bool {
        false
    }
    /// As [`KvBackend::get`], except that a kept object comes back as itself.
    fn lookup(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Lookup> {
        Ok(if self.get(key, out)? {
            Lookup::Bytes
        } else {
            Lookup::Absent
        })
    }
    /// The object kept at `key`, to change in place when nothing else shares it.
    fn object_mut(&mut self, _key: &[u8]) -> Option<&mut SharedObject> {
        None
    }
    /// Stores `object` at `key`; a backend that keeps only bytes stores its encoding.
    fn put_object(&mut self, key: &[u8], object: SharedObject) -> Result<()> {
        let mut bytes = Vec::new();
        object.encode(&mut bytes)?;
        self.put(key, &bytes)
    }
    /// Approximate bytes of live state (for metrics).
    fn approximate_size_bytes(&mut self) -> Result<u64> {
        Ok(0)
    }
}
