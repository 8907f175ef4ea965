//! A batch's read-ahead and write-behind: the values a batch of records will read,
//! fetched in one `get_many` (RocksDB's batched MultiGet) before the batch is
//! processed, and the batch's writes, held and applied as one sorted write batch when
//! it ends.
//!
//! Why hold the writes: one RocksDB `put` per state and event paid a write-group join
//! and a memtable insert at a random place each (a sixth of the S workload's CPU,
//! bench/README.md). One `WriteBatch` in key order pays the first once, and its inserts
//! walk the memtable's skip list from the previous key rather than from the top.
//!
//! A held write is current in the read-ahead (a put or delete is the value the key
//! reads), so the batch reads its own writes from memory. Anything that reads the
//! backend by another way — a key not read ahead, a scan, a snapshot, a lookup —
//! makes the owner apply the held writes first ([`ReadAhead::take_writes`]), and the
//! end of the batch always does, error or not, so what reached the backend when the
//! batch ends is what write-through would have written. It is a plain hash map rather
//! than the state cache's ordered map: one batch of entries, looked up by exact key,
//! never scanned. Hashed with foldhash, not SipHash: every key of a batch is hashed on
//! insert and on each lookup, and SipHash showed in S-EO's profile. foldhash is seeded at
//! random, which defeats keys chosen in advance to collide; it claims no more than that,
//! and the map holds one batch (hundreds of keys), so even colliding keys cost a batch
//! some milliseconds, not the job its progress.

use foldhash::HashMap;

use crate::backend::{BatchOp, KvBackend};
use crate::error::Result;

/// Reads `keys` (any order, repeats allowed) with one sorted `get_many`: each distinct
/// key with its stored value, `None` where there is none.
pub(crate) fn read_many(
    backend: &mut dyn KvBackend,
    mut keys: Vec<Vec<u8>>,
) -> Result<Vec<(Vec<u8>, Option<Vec<u8>>)>> {
    keys.sort_unstable();
    keys.dedup();
    if keys.is_empty() {
        return Ok(Vec::new());
    }
    let mut answers: Vec<Option<Vec<u8>>> = vec![None; keys.len()];
    {
        let wanted: Vec<&[u8]> = keys.iter().map(Vec::as_slice).collect();
        backend.get_many(&wanted, &mut |i, v| answers[i] = v.map(<[u8]>::to_vec))?;
    }
    Ok(keys.into_iter().zip(answers).collect())
}

#[derive(Default)]
pub(crate) struct ReadAhead {
    open: bool,
    /// Stored bytes by storage key; `None` = no stored value.
    values: HashMap<Vec<u8>, Option<Vec<u8>>>,
    /// The batch's writes, in the order they were made.
    writes: Vec<(Vec<u8>, Held)>,
}

/// A write held until the batch ends.
enum Held {
    Put(Vec<u8>),
    Delete,
    Append(Vec<u8>),
}

impl ReadAhead {
    /// Opens a batch (when `pays`: the backend reads batches faster). The owner has
    /// applied the previous batch's writes.
    pub fn begin(&mut self, pays: bool) {
        debug_assert!(self.writes.is_empty(), "a batch began with writes held");
        self.values.clear();
        self.writes.clear();
        self.open = pays;
    }

    /// Closes the batch and drops what was read for it, and any write still held: the
    /// owner applies them first ([`Self::take_writes`]) unless the state they belong to
    /// is being replaced.
    pub fn end(&mut self) {
        self.values.clear();
        self.writes.clear();
        self.open = false;
    }

    /// Drops what was read ahead, keeping the batch open: the backend changed under it.
    pub fn forget_reads(&mut self) {
        self.values.clear();
    }

    /// Holds a write of the open batch, keeping the read-ahead current with it; false
    /// (nothing held) when no batch is open, and the owner writes through.
    pub fn hold(&mut self, key: &[u8], op: BatchOp<'_>) -> bool {
        if !self.open {
            return false;
        }
        let held = match op {
            BatchOp::Put(v) => {
                // A key the batch read ahead (the usual case) is overwritten in place.
                match self.values.get_mut(key) {
                    Some(Some(copy)) => {
                        copy.clear();
                        copy.extend_from_slice(v);
                    }
                    Some(absent) => *absent = Some(v.to_vec()),
                    None => {
                        self.values.insert(key.to_vec(), Some(v.to_vec()));
                    }
                }
                Held::Put(v.to_vec())
            }
            BatchOp::Delete => {
                self.values.insert(key.to_vec(), None);
                Held::Delete
            }
            BatchOp::Append(a) => {
                // The whole value is not known here: the next read goes to the backend,
                // after the held writes.
                self.values.remove(key);
                Held::Append(a.to_vec())
            }
        };
        self.writes.push((key.to_vec(), held));
        true
    }

    pub fn holds_writes(&self) -> bool {
        !self.writes.is_empty()
    }

    /// The held writes in key order (a key's own writes in the order made), for one
    /// write batch; `apply` gets them, and they are no longer held whatever it returns.
    /// After a failed write the read-ahead no longer matches the backend, so it is
    /// dropped and the next reads go to the backend.
    pub fn take_writes(
        &mut self,
        apply: impl FnOnce(&[(&[u8], BatchOp<'_>)]) -> Result<()>,
    ) -> Result<()> {
        if self.writes.is_empty() {
            return Ok(());
        }
        let mut writes = std::mem::take(&mut self.writes);
        writes.sort_by(|a, b| a.0.cmp(&b.0));
        let ops: Vec<(&[u8], BatchOp<'_>)> = writes
            .iter()
            .map(|(k, h)| {
                let op = match h {
                    Held::Put(v) => BatchOp::Put(v),
                    Held::Delete => BatchOp::Delete,
                    Held::Append(a) => BatchOp::Append(a),
                };
                (k.as_slice(), op)
            })
            .collect();
        let applied = apply(&ops);
        if applied.is_err() {
            self.values.clear();
        }
        drop(ops);
        // Keeps the allocation for the next batch.
        writes.clear();
        self.writes = writes;
        applied
    }

    pub fn is_open(&self) -> bool {
        self.open
    }

    /// Reads the `keys` not held yet from `backend` in one call. Returns how
    /// many it read.
    pub fn fetch(&mut self, backend: &mut dyn KvBackend, mut keys: Vec<Vec<u8>>) -> Result<u64> {
        if !self.open {
            return Ok(0);
        }
        keys.retain(|k| !self.values.contains_key(k));
        let fetched = read_many(backend, keys)?;
        let n = fetched.len() as u64;
        self.values.extend(fetched);
        Ok(n)
    }

    /// The stored value at `key` if the read-ahead holds it: `Some(true)` with
    /// the bytes in `out`, `Some(false)` for a known absence, `None` when it was
    /// not read ahead.
    pub fn get(&self, key: &[u8], out: &mut Vec<u8>) -> Option<bool> {
        if !self.open {
            return None;
        }
        match self.values.get(key)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Some(true)
            }
            None => Some(false),
        }
    }

    /// `key` was written around the batch (a bulk write): the next read goes to the
    /// backend.
    pub fn forget(&mut self, key: &[u8]) {
        self.values.remove(key);
    }
}
