//! The `hashmap` backend: state on the heap. It keeps the same serialized
//! layout as RocksDB (an ordered map of bytes) so key-group range scans,
//! snapshots and TTL work identically; the cost is a (cheap, postcard)
//! serialization per access instead of Flink's live objects.
//!
//! The map is persistent ([`imbl::OrdMap`]): a copy shares every node with the
//! original and a write copies only the path it changes. A checkpoint freezes the
//! entries in O(1) at the barrier and writes them on the uploader's thread, so the job
//! thread never waits for a full snapshot (Flink's copy-on-write heap snapshots).

use std::path::Path;

use imbl::OrdMap;

use super::{BackendKind, FrozenEntries, KvBackend, PendingSnapshot};
use crate::error::Result;

type Map = OrdMap<Vec<u8>, Vec<u8>>;

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
    for (k, v) in map.range::<_, [u8]>((
        std::ops::Bound::Included(start),
        std::ops::Bound::Excluded(end),
    )) {
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
            Some(v) => {
                out.clear();
                out.extend_from_slice(v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        // Overwrite in place so an update of an existing key allocates nothing
        // (unless a frozen copy still shares its node).
        if let Some(v) = self.map.get_mut(key) {
            self.bytes = self.bytes - v.len() as u64 + value.len() as u64;
            v.clear();
            v.extend_from_slice(value);
        } else {
            self.bytes += (key.len() + value.len()) as u64;
            self.map.insert(key.to_vec(), value.to_vec());
        }
        Ok(())
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        if let Some(v) = self.map.remove(key) {
            self.bytes -= (key.len() + v.len()) as u64;
        }
        Ok(())
    }

    fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()> {
        if let Some(v) = self.map.get_mut(key) {
            v.extend_from_slice(bytes);
        } else {
            self.bytes += key.len() as u64;
            self.map.insert(key.to_vec(), bytes.to_vec());
        }
        self.bytes += bytes.len() as u64;
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
