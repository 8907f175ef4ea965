//! The `hashmap` backend: state on the heap, as Flink's heap backend keeps it. Values
//! written through typed handles stay deserialized objects ([`super::StoredObject`]), so a
//! read clones the value and a write moves it in, with no serialization on the job
//! thread; an object is encoded only when bytes are asked for (scans, the state lookup,
//! snapshots). Entries written as bytes (restore, lists, migrations) stay bytes until a
//! handle writes them again. Keys keep the same serialized, ordered layout as RocksDB,
//! so key-group range scans, snapshots and TTL work identically.
//!
//! The map is persistent ([`imbl::OrdMap`]): a copy shares every node with the
//! original and a write copies only the path it changes. A checkpoint freezes the
//! entries in O(1) at the barrier and writes them on the uploader's thread, so the job
//! thread never waits for a full snapshot (Flink's copy-on-write heap snapshots); an
//! object the frozen copy still holds is replaced, never changed in place.

use std::path::Path;

use imbl::OrdMap;
use smallvec::SmallVec;

use super::{BackendKind, FrozenEntries, KvBackend, Lookup, PendingSnapshot, SharedObject};
use crate::error::Result;

#[derive(Clone)]
enum Cell {
    Bytes(Vec<u8>),
    Object(SharedObject),
}

impl Cell {
    fn approximate_bytes(&self) -> u64 {
        match self {
            Cell::Bytes(b) => b.len() as u64,
            Cell::Object(o) => o.approximate_bytes() as u64,
        }
    }
}

/// A storage key, inline up to 48 bytes (a key-grouped state key with a short user key and
/// namespace, or a map entry's): a write under a frozen copy copies whole leaves of the
/// map, and inline keys make that one memcpy rather than an allocation per key.
type Key = SmallVec<[u8; 48]>;

type Map = OrdMap<Key, Cell>;

#[derive(Default)]
pub struct HeapBackend {
    map: Map,
    /// Bytes of keys and values, kept as they change: the state-size gauge reads it
    /// every few seconds, and counting 1M entries each time would pause the job thread.
    bytes: u64,
}

impl HeapBackend {
    pub fn new() -> Self {
        Self::default()
    }

    /// Stores `cell` at `key` (one walk of the map, new key or not), keeping the byte count.
    fn set(&mut self, key: &[u8], cell: Cell) {
        let added = cell.approximate_bytes();
        match self.map.insert(Key::from_slice(key), cell) {
            Some(old) => self.bytes = self.bytes - old.approximate_bytes() + added,
            None => self.bytes += key.len() as u64 + added,
        }
    }
}

fn scan_map(
    map: &Map,
    start: &[u8],
    end: &[u8],
    f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
) -> Result<()> {
    if start >= end {
        return Ok(());
    }
    let mut encoded = Vec::new();
    for (k, cell) in map.range::<_, [u8]>((
        std::ops::Bound::Included(start),
        std::ops::Bound::Excluded(end),
    )) {
        let v = match cell {
            Cell::Bytes(b) => b.as_slice(),
            Cell::Object(o) => {
                encoded.clear();
                o.encode(&mut encoded)?;
                encoded.as_slice()
            }
        };
        if !f(k, v) {
            break;
        }
    }
    Ok(())
}

/// A frozen copy of the map (shares its nodes until either side writes).
struct Frozen(Map);

impl FrozenEntries for Frozen {
    fn scan(
        &self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        scan_map(&self.0, start, end, f)
    }
}

impl KvBackend for HeapBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Hashmap
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        match self.map.get(key) {
            Some(Cell::Bytes(v)) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            Some(Cell::Object(o)) => {
                out.clear();
                o.encode(out)?;
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        // Overwrite bytes in place so an update of an existing key allocates nothing
        // (unless a frozen copy still shares its node).
        if let Some(Cell::Bytes(v)) = self.map.get_mut(key) {
            self.bytes = self.bytes - v.len() as u64 + value.len() as u64;
            v.clear();
            v.extend_from_slice(value);
            return Ok(());
        }
        self.set(key, Cell::Bytes(value.to_vec()));
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        if let Some(cell) = self.map.remove(key) {
            self.bytes -= key.len() as u64 + cell.approximate_bytes();
        }
        Ok(())
    }

    fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()> {
        match self.map.get_mut(key) {
            Some(Cell::Bytes(v)) => {
                v.extend_from_slice(bytes);
                self.bytes += bytes.len() as u64;
            }
            Some(Cell::Object(o)) => {
                let mut v = Vec::new();
                o.encode(&mut v)?;
                v.extend_from_slice(bytes);
                self.set(key, Cell::Bytes(v));
            }
            None => self.set(key, Cell::Bytes(bytes.to_vec())),
        }
        Ok(())
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        scan_map(&self.map, start, end, f)
    }

    fn flush(&mut self) -> Result<()> {
        Ok(())
    }

    fn compact(&mut self) -> Result<()> {
        Ok(())
    }

    fn native_snapshot(&mut self, _dir: &Path) -> Result<Option<Box<dyn PendingSnapshot>>> {
        Ok(None)
    }

    fn freeze(&mut self) -> Option<Box<dyn FrozenEntries>> {
        Some(Box::new(Frozen(self.map.clone())))
    }

    fn approximate_len(&mut self) -> Result<u64> {
        Ok(self.map.len() as u64)
    }

    fn approximate_size_bytes(&mut self) -> Result<u64> {
        Ok(self.bytes)
    }

    fn keeps_objects(&self) -> bool {
        true
    }

    fn lookup(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Lookup> {
        Ok(match self.map.get(key) {
            Some(Cell::Object(o)) => Lookup::Object(o.clone()),
            Some(Cell::Bytes(v)) => {
                out.clear();
                out.extend_from_slice(v);
                Lookup::Bytes
            }
            None => Lookup::Absent,
        })
    }

    fn object_mut(&mut self, key: &[u8]) -> Option<&mut SharedObject> {
        match self.map.get_mut(key) {
            Some(Cell::Object(o)) => Some(o),
            _ => None,
        }
    }

    fn put_object(&mut self, key: &[u8], object: SharedObject) -> Result<()> {
        self.set(key, Cell::Object(object));
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn the_byte_count_follows_puts_appends_and_deletes() {
        let mut h = HeapBackend::new();
        let counted = |h: &mut HeapBackend| -> u64 {
            let mut n = 0;
            h.scan(&[], &[0xff; 8], &mut |k, v| {
                n += (k.len() + v.len()) as u64;
                true
            })
            .unwrap();
            n
        };
        h.put(b"a", b"12345").unwrap();
        h.put(b"bb", b"1").unwrap();
        h.put(b"a", b"12").unwrap();
        h.append(b"c", b"xyz").unwrap();
        h.append(b"c", b"w").unwrap();
        h.delete(b"bb").unwrap();
        h.delete(b"missing").unwrap();
        let frozen = h.freeze();
        h.put(b"a", b"1234567").unwrap();
        assert_eq!(h.approximate_size_bytes().unwrap(), counted(&mut h));
        assert_eq!(h.approximate_size_bytes().unwrap(), 1 + 7 + 1 + 4);
        drop(frozen);
    }
}
