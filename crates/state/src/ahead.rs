//! A batch's read-ahead: the values a batch of records will read, fetched in one
//! `get_many` (RocksDB's batched MultiGet) before the batch is processed, and kept
//! only until it ends.
//!
//! Writes are not held: they go straight to the backend, as without a batch, and
//! only keep the copy here current (a list append, whose whole value is not known
//! here, drops it). So a barrier, a scan or the admin lookup never depends on the
//! read-ahead, and dropping it at any point loses nothing. It is a plain hash map
//! rather than the state cache's ordered map: one batch of entries, looked up by
//! exact key, never scanned.

use std::collections::HashMap;

use crate::backend::KvBackend;
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
}

impl ReadAhead {
    /// Opens a batch (when `pays`: the backend reads batches faster).
    pub fn begin(&mut self, pays: bool) {
        self.values.clear();
        self.open = pays;
    }

    /// Closes the batch and drops what was read for it.
    pub fn end(&mut self) {
        self.values.clear();
        self.open = false;
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

    /// `key` was written through: a held copy follows a stored value or a delete,
    /// and is dropped for anything else, so the next read goes to the backend.
    pub fn wrote(&mut self, key: &[u8], write: Written<'_>) {
        let held = match write {
            Written::Unknown => {
                self.values.remove(key);
                return;
            }
            Written::Value(v) => Some(v),
            Written::Deleted => None,
        };
        if let Some(copy) = self.values.get_mut(key) {
            match (copy, held) {
                (Some(old), Some(new)) => {
                    old.clear();
                    old.extend_from_slice(new);
                }
                (copy, held) => *copy = held.map(<[u8]>::to_vec),
            }
        }
    }
}

/// What a write did to a key, as far as the read-ahead can follow it.
pub(crate) enum Written<'a> {
    Value(&'a [u8]),
    Deleted,
    /// A list append (the whole value is not known here) or a write that failed.
    Unknown,
}
