//! The state cache: a bounded write-back cache in front of the backend, so a
//! key that many records touch in one epoch costs the backend one read and one
//! write (Kafka Streams' record cache does this for its stores).
//!
//! It sits between the typed handles and the engine as a [`KvBackend`] itself,
//! keyed by the storage key — `[key group][state id][key][namespace]`, plus the
//! user key for map entries — and it holds the *stored* bytes (TTL timestamp
//! included). Holding bytes rather than live objects is deliberate: everything
//! above the engine (TTL expiry, visibility and update types, list framing,
//! `GET /state/{key}`, snapshots, savepoints) reads and writes exactly what the
//! backend would hold, so behaviour with the cache on and off is the same by
//! construction; the part it saves is the engine round trip, which is the cost
//! (postcard decoding of a small value is far cheaper than a RocksDB get).
//!
//! - Reads hit the cache first; a miss reads the backend once and remembers
//!   the answer, absent included (most state reads miss: a new event id, the
//!   first event of a key).
//! - Writes only mark the entry dirty; `delete` leaves a dirty tombstone; a list
//!   `append` to an entry the cache has not read stays a pending append (a
//!   RocksDB merge on write-back), so adding to a list still never reads it.
//! - [`CachedBackend::write_back`] writes every dirty entry, in storage-key
//!   order, as one batch (a RocksDB `WriteBatch`). The store calls it at the
//!   checkpoint barrier before the backend's snapshot, before a savepoint, on
//!   `flush` and `compact`.
//! - Over `capacity` bytes (an estimate: key, value and a fixed per-entry
//!   overhead) entries are evicted with CLOCK (second chance), dirty ones
//!   written back in one batch, until the cache is at 7/8 of its capacity, so
//!   eviction runs in batches rather than on every insert.
//! - Scans merge the dirty entries of their range into the backend's scan, so
//!   map iteration, incremental TTL cleanup, timer rebuilds and state lookups
//!   see cached writes without flushing them.
//! - [`CachedBackend::replace`] (restore, reset) drops every entry, dirty or
//!   not: live state then comes only from the new backend.
//!
//! Capacity 0 turns the cache off: every call goes straight to the backend,
//! except reads that a batch's read-ahead ([`crate::ahead`]) already answered and
//! writes it holds until the batch ends. [`CachedBackend::prefetch`] fills the
//! cache when it is on, the read-ahead when it is off.

use std::collections::{BTreeMap, BTreeSet};
use std::ops::Bound;
use std::path::Path;

use serde::{Deserialize, Serialize};

use crate::ahead::{ReadAhead, read_many};
use crate::backend::{
    BackendKind, BatchOp, FrozenEntries, KvBackend, Lookup, PendingSnapshot, SharedObject,
};
use crate::error::Result;

/// The suggested capacity when the cache is turned on, 64 MiB: room for about half a million small entries
/// (a rule accumulator or a dedup id, ~130 bytes with the overhead), so one
/// epoch's working set at tens of thousands of events per second fits, while
/// staying small next to RocksDB's own memory. The barrier write-back grows
/// with the dirty bytes, which the capacity bounds. (Kafka Streams' default is
/// 10 MiB per instance; Flink has no such cache.) It is off by default
/// ([`crate::default_cache_bytes_for`]): it pays when keys are hot within an
/// epoch and costs when nearly every event brings a new key.
pub const DEFAULT_CACHE_BYTES: u64 = 64 << 20;

/// Bytes counted per entry on top of its key and value: the B-tree slot, two
/// `Vec` headers and the flags, roughly. Only the order of magnitude matters.
const ENTRY_OVERHEAD: u64 = 64;

/// Cache figures since the store was opened (restores keep counting).
#[derive(Debug, Clone, Copy, Default, PartialEq, Eq, Serialize, Deserialize)]
pub struct CacheStats {
    /// Reads answered from the cache (values and remembered absences).
    pub hits: u64,
    /// Reads that went to the backend.
    pub misses: u64,
    /// Entries evicted because the cache was over capacity.
    pub evictions: u64,
    /// Dirty entries written to the backend (at barriers and on eviction).
    pub writebacks: u64,
    /// Estimated bytes held now.
    pub bytes: u64,
    /// Entries held now.
    pub entries: u64,
    /// Configured capacity in bytes; 0 means the cache is off.
    pub capacity_bytes: u64,
}

#[derive(Debug)]
enum Slot {
    /// The whole stored value.
    Value(Vec<u8>),
    /// No stored value (a remembered miss, or a delete when dirty).
    Absent,
    /// Bytes appended to a value the cache never read: the backend's value
    /// (if any) followed by these bytes is the current value.
    Append(Vec<u8>),
}

#[derive(Debug)]
struct Entry {
    slot: Slot,
    dirty: bool,
    /// CLOCK's second-chance bit: set on every access, cleared by the sweep.
    referenced: bool,
}

impl Entry {
    fn size(key: &[u8], slot: &Slot) -> u64 {
        let v = match slot {
            Slot::Value(v) | Slot::Append(v) => v.len(),
            Slot::Absent => 0,
        };
        ENTRY_OVERHEAD + (key.len() + v) as u64
    }
}

/// The write-back cache over one backend; see the module docs.
pub(crate) struct CachedBackend {
    inner: Box<dyn KvBackend>,
    capacity: u64,
    map: BTreeMap<Vec<u8>, Entry>,
    /// The keys of the dirty entries, in order: the barrier and scans visit
    /// only these, never the whole cache.
    dirty: BTreeSet<Vec<u8>>,
    bytes: u64,
    /// CLOCK hand: eviction resumes at the first key at or after this one.
    hand: Vec<u8>,
    stats: CacheStats,
    /// With the cache off: the open batch's read-ahead and held writes.
    ahead: ReadAhead,
}

impl CachedBackend {
    pub fn new(inner: Box<dyn KvBackend>, capacity_bytes: u64) -> Self {
        Self {
            inner,
            capacity: capacity_bytes,
            map: BTreeMap::new(),
            dirty: BTreeSet::new(),
            bytes: 0,
            hand: Vec::new(),
            stats: CacheStats::default(),
            ahead: ReadAhead::default(),
        }
    }

    #[inline]
    fn enabled(&self) -> bool {
        self.capacity > 0
    }

    /// Starts a batch of records: with the cache off, on a backend that reads
    /// batches faster, [`Self::prefetch`] reads ahead for it and its writes are
    /// held until it ends.
    pub fn begin_batch(&mut self) -> Result<()> {
        self.write_held()?;
        let pays = !self.enabled() && self.inner.batches_pay() && !self.inner.keeps_objects();
        self.ahead.begin(pays);
        Ok(())
    }

    /// Ends the batch: its held writes reach the backend as one batch in key order
    /// (also when this returns their error), and what was read ahead is dropped.
    pub fn end_batch(&mut self) -> Result<()> {
        let written = self.write_held();
        self.ahead.end();
        written
    }

    /// Applies the open batch's held writes, before anything reads the backend
    /// other than through the read-ahead.
    fn write_held(&mut self) -> Result<()> {
        let inner = &mut self.inner;
        self.ahead.take_writes(|ops| inner.write_batch(ops))
    }

    /// Whether [`Self::prefetch`] would read anything now.
    pub fn holds_reads(&self) -> bool {
        self.enabled() || self.ahead.is_open()
    }

    /// Reads `keys` that the cache (or the batch's read-ahead) does not hold
    /// with one `get_many` and keeps the answers, absences included, so the
    /// reads that follow are answered from memory. Nothing is read while the
    /// cache is off and no batch reads ahead.
    pub fn prefetch(&mut self, keys: Vec<Vec<u8>>) -> Result<()> {
        if !self.enabled() {
            self.write_held()?;
            let fetched = self.ahead.fetch(self.inner.as_mut(), keys)?;
            self.stats.misses += fetched;
            return Ok(());
        }
        let mut keys = keys;
        keys.retain(|k| !self.map.contains_key(k.as_slice()));
        let fetched = read_many(self.inner.as_mut(), keys)?;
        self.stats.misses += fetched.len() as u64;
        for (k, v) in fetched {
            self.insert(&k, v.map_or(Slot::Absent, Slot::Value), false)?;
        }
        Ok(())
    }

    /// Swaps in a new backend (restore, reset) and drops every cached entry,
    /// dirty ones and a batch's held writes included: they belong to the state
    /// being replaced.
    pub fn replace(&mut self, inner: Box<dyn KvBackend>) -> Box<dyn KvBackend> {
        self.map.clear();
        self.dirty.clear();
        self.bytes = 0;
        self.hand.clear();
        self.ahead.end();
        std::mem::replace(&mut self.inner, inner)
    }

    pub fn stats(&self) -> CacheStats {
        CacheStats {
            bytes: self.bytes,
            entries: self.map.len() as u64,
            capacity_bytes: self.capacity,
            ..self.stats
        }
    }

    /// Writes every dirty entry into the backend, in storage-key order, as one
    /// batch. Written values stay cached (clean); pending appends are dropped
    /// (the cache never knew the whole value).
    pub fn write_back(&mut self) -> Result<()> {
        if self.dirty.is_empty() {
            return Ok(());
        }
        let keys = std::mem::take(&mut self.dirty);
        {
            let map = &self.map;
            let ops: Vec<(&[u8], BatchOp<'_>)> = keys
                .iter()
                .filter_map(|k| Some((k.as_slice(), op_of(&map.get(k.as_slice())?.slot))))
                .collect();
            if let Err(e) = self.inner.write_batch(&ops) {
                drop(ops);
                self.dirty = keys;
                return Err(e);
            }
            self.stats.writebacks += ops.len() as u64;
        }
        for k in &keys {
            let Some(e) = self.map.get_mut(k.as_slice()) else {
                continue;
            };
            if matches!(e.slot, Slot::Append(_)) {
                if let Some(e) = self.map.remove(k.as_slice()) {
                    self.bytes -= Entry::size(k, &e.slot);
                }
            } else {
                e.dirty = false;
            }
        }
        Ok(())
    }

    /// Writes back, then forgets every entry, so later reads see what the
    /// backend holds (after a compaction filter dropped expired values, say).
    fn write_back_and_forget(&mut self) -> Result<()> {
        self.write_back()?;
        self.map.clear();
        self.dirty.clear();
        self.bytes = 0;
        Ok(())
    }

    /// Inserts a new entry and evicts if that took the cache over capacity.
    fn insert(&mut self, key: &[u8], slot: Slot, dirty: bool) -> Result<()> {
        self.bytes += Entry::size(key, &slot);
        if dirty {
            self.dirty.insert(key.to_vec());
        }
        self.map.insert(
            key.to_vec(),
            Entry {
                slot,
                dirty,
                // Unreferenced until touched again, so a key read once (a
                // scan-like stream of new keys) is the first to go.
                referenced: false,
            },
        );
        self.evict_if_full()
    }

    /// Replaces the slot of the entry at `key` (which exists), keeping the
    /// byte estimate right.
    fn set_slot(&mut self, key: &[u8], slot: Slot) -> Result<()> {
        if let Some(e) = self.map.get_mut(key) {
            self.bytes -= Entry::size(key, &e.slot);
            self.bytes += Entry::size(key, &slot);
            e.slot = slot;
            mark_dirty(&mut self.dirty, e, key);
        }
        self.evict_if_full()
    }

    fn evict_if_full(&mut self) -> Result<()> {
        if self.bytes <= self.capacity {
            return Ok(());
        }
        let target = self.capacity - self.capacity / 8;
        let mut removed: Vec<(Vec<u8>, Entry)> = Vec::new();
        // Two turns of the clock at most: the first may only clear bits.
        for _turn in 0..2 {
            let mut victims: Vec<Vec<u8>> = Vec::new();
            let mut freed = 0u64;
            let mut stop_at: Option<Vec<u8>> = None;
            let hand = std::mem::take(&mut self.hand);
            let ranges = [
                (Bound::Included(hand.as_slice()), Bound::Unbounded),
                (Bound::Unbounded, Bound::Excluded(hand.as_slice())),
            ];
            'turn: for range in ranges {
                for (k, e) in self.map.range_mut::<[u8], _>(range) {
                    if self.bytes - freed <= target {
                        stop_at = Some(k.clone());
                        break 'turn;
                    }
                    if e.referenced {
                        e.referenced = false;
                    } else {
                        freed += Entry::size(k, &e.slot);
                        victims.push(k.clone());
                    }
                }
            }
            for k in victims {
                if let Some((k, e)) = self.map.remove_entry(&k) {
                    self.bytes -= Entry::size(&k, &e.slot);
                    removed.push((k, e));
                }
            }
            self.hand = stop_at.unwrap_or_default();
            if self.bytes <= target {
                break;
            }
        }
        // Victims were collected from the hand round: sort them into key order.
        removed.sort_by(|a, b| a.0.cmp(&b.0));
        let ops: Vec<(&[u8], BatchOp<'_>)> = removed
            .iter()
            .filter(|(_, e)| e.dirty)
            .map(|(k, e)| (k.as_slice(), op_of(&e.slot)))
            .collect();
        if !ops.is_empty() {
            if let Err(err) = self.inner.write_batch(&ops) {
                // Keep the entries: losing dirty state would be worse than a
                // cache over its bound until the next write-back.
                drop(ops);
                for (k, e) in removed {
                    self.bytes += Entry::size(&k, &e.slot);
                    self.map.insert(k, e);
                }
                return Err(err);
            }
            self.stats.writebacks += ops.len() as u64;
        }
        for (k, e) in &removed {
            if e.dirty {
                self.dirty.remove(k.as_slice());
            }
        }
        self.stats.evictions += removed.len() as u64;
        Ok(())
    }
}

/// Marks `e` (at `key`) dirty and touched.
fn mark_dirty(dirty: &mut BTreeSet<Vec<u8>>, e: &mut Entry, key: &[u8]) {
    e.referenced = true;
    if !e.dirty {
        e.dirty = true;
        dirty.insert(key.to_vec());
    }
}

/// Shows a dirty entry the backend does not hold to a scan; false = stop.
fn emit_new(k: &[u8], e: &Entry, f: &mut dyn FnMut(&[u8], &[u8]) -> bool) -> bool {
    match &e.slot {
        // A pending append without a stored value is the whole value.
        Slot::Value(v) | Slot::Append(v) => f(k, v),
        Slot::Absent => true,
    }
}

fn op_of(slot: &Slot) -> BatchOp<'_> {
    match slot {
        Slot::Value(v) => BatchOp::Put(v),
        Slot::Absent => BatchOp::Delete,
        Slot::Append(a) => BatchOp::Append(a),
    }
}

impl KvBackend for CachedBackend {
    fn kind(&self) -> BackendKind {
        self.inner.kind()
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        if !self.enabled() {
            if let Some(found) = self.ahead.get(key, out) {
                self.stats.hits += 1;
                return Ok(found);
            }
            self.write_held()?;
            return self.inner.get(key, out);
        }
        if let Some(e) = self.map.get_mut(key) {
            e.referenced = true;
            match &e.slot {
                Slot::Value(v) => {
                    self.stats.hits += 1;
                    out.clear();
                    out.extend_from_slice(v);
                    return Ok(true);
                }
                Slot::Absent => {
                    self.stats.hits += 1;
                    return Ok(false);
                }
                Slot::Append(_) => {}
            }
            // A pending append: read the base once and keep the whole value.
            self.stats.misses += 1;
            if !self.inner.get(key, out)? {
                out.clear();
            }
            if let Some(Entry {
                slot: Slot::Append(a),
                ..
            }) = self.map.get(key)
            {
                out.extend_from_slice(a);
            }
            self.set_slot(key, Slot::Value(out.clone()))?;
            return Ok(true);
        }
        self.stats.misses += 1;
        let found = self.inner.get(key, out)?;
        let slot = if found {
            Slot::Value(out.clone())
        } else {
            Slot::Absent
        };
        self.insert(key, slot, false)?;
        Ok(found)
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        if !self.enabled() {
            // Outside a batch nothing is read ahead, so writing through is all.
            if self.ahead.hold(key, BatchOp::Put(value)) {
                return Ok(());
            }
            return self.inner.put(key, value);
        }
        if let Some(e) = self.map.get_mut(key) {
            mark_dirty(&mut self.dirty, e, key);
            if let Slot::Value(v) = &mut e.slot {
                // Overwrite in place: an update of a cached key allocates nothing.
                self.bytes = self.bytes - v.len() as u64 + value.len() as u64;
                v.clear();
                v.extend_from_slice(value);
                return self.evict_if_full();
            }
            return self.set_slot(key, Slot::Value(value.to_vec()));
        }
        self.insert(key, Slot::Value(value.to_vec()), true)
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        if !self.enabled() {
            if self.ahead.hold(key, BatchOp::Delete) {
                return Ok(());
            }
            return self.inner.delete(key);
        }
        if self.map.contains_key(key) {
            return self.set_slot(key, Slot::Absent);
        }
        self.insert(key, Slot::Absent, true)
    }

    fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()> {
        if !self.enabled() {
            if self.ahead.hold(key, BatchOp::Append(bytes)) {
                return Ok(());
            }
            return self.inner.append(key, bytes);
        }
        if let Some(e) = self.map.get_mut(key) {
            mark_dirty(&mut self.dirty, e, key);
            match &mut e.slot {
                Slot::Value(v) | Slot::Append(v) => {
                    v.extend_from_slice(bytes);
                    self.bytes += bytes.len() as u64;
                    return self.evict_if_full();
                }
                Slot::Absent => return self.set_slot(key, Slot::Value(bytes.to_vec())),
            }
        }
        self.insert(key, Slot::Append(bytes.to_vec()), true)
    }

    /// The backend's scan with the cache's dirty entries of `[start, end)`
    /// merged in: a dirty value replaces the stored one, a tombstone hides it,
    /// a pending append extends it.
    fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if !self.enabled() || start >= end {
            self.write_held()?;
            return self.inner.scan(start, end, f);
        }
        let map = &self.map;
        let mut dirty = self
            .dirty
            .range::<[u8], _>((Bound::Included(start), Bound::Excluded(end)))
            .filter_map(|k| Some((k, map.get(k.as_slice())?)))
            .peekable();
        let mut stopped = false;
        let mut joined = Vec::new();
        // Emits a dirty entry that the backend does not have; false = stop.
        self.inner.scan(start, end, &mut |k, v| {
            while let Some((ck, ce)) = dirty.next_if(|(ck, _)| ck.as_slice() < k) {
                if !emit_new(ck, ce, &mut *f) {
                    stopped = true;
                    return false;
                }
            }
            let go_on = match dirty.next_if(|(ck, _)| ck.as_slice() == k) {
                None => f(k, v),
                Some((_, ce)) => match &ce.slot {
                    Slot::Value(cv) => f(k, cv),
                    Slot::Absent => true,
                    Slot::Append(a) => {
                        joined.clear();
                        joined.extend_from_slice(v);
                        joined.extend_from_slice(a);
                        f(k, &joined)
                    }
                },
            };
            if !go_on {
                stopped = true;
            }
            go_on
        })?;
        if !stopped {
            for (ck, ce) in dirty {
                if !emit_new(ck, ce, &mut *f) {
                    break;
                }
            }
        }
        Ok(())
    }

    /// Bulk writes (restore, schema migration) go straight to the backend; any
    /// cached entry for those keys is superseded and dropped.
    fn put_many(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        self.write_held()?;
        for (k, _) in entries {
            self.ahead.forget(k);
        }
        if self.enabled() && !self.map.is_empty() {
            for (k, _) in entries {
                if let Some(e) = self.map.remove(k) {
                    self.bytes -= Entry::size(k, &e.slot);
                    if e.dirty {
                        self.dirty.remove(k);
                    }
                }
            }
        }
        self.inner.put_many(entries)
    }

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

    fn flush(&mut self) -> Result<()> {
        self.write_held()?;
        self.write_back()?;
        self.inner.flush()
    }

    fn compact(&mut self) -> Result<()> {
        self.write_held()?;
        // The compaction filter drops expired values the read-ahead still holds.
        self.ahead.forget_reads();
        self.write_back_and_forget()?;
        self.inner.compact()
    }

    fn hash_ahead(&mut self, hashes: &crate::files::FileHashes) -> Result<()> {
        self.inner.hash_ahead(hashes)
    }

    fn native_snapshot(&mut self, dir: &Path) -> Result<Option<Box<dyn PendingSnapshot>>> {
        self.write_held()?;
        self.write_back()?;
        self.inner.native_snapshot(dir)
    }

    /// The backend's entries: the caller writes the cache back first (the barrier does),
    /// and no batch is open (its writes would be missing).
    fn freeze(&mut self) -> Option<Box<dyn FrozenEntries>> {
        debug_assert!(
            !self.ahead.holds_writes(),
            "frozen with a batch's writes held"
        );
        self.inner.freeze()
    }

    fn approximate_len(&mut self) -> Result<u64> {
        self.write_held()?;
        self.inner.approximate_len()
    }

    fn approximate_size_bytes(&mut self) -> Result<u64> {
        self.write_held()?;
        self.inner.approximate_size_bytes()
    }

    /// Objects pass through only with the cache off: the cache holds bytes, so with it
    /// on, handles serialize and the cache writes bytes back.
    fn keeps_objects(&self) -> bool {
        !self.enabled() && self.inner.keeps_objects()
    }

    fn lookup(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<Lookup> {
        if !self.enabled() {
            self.write_held()?;
            return self.inner.lookup(key, out);
        }
        Ok(if self.get(key, out)? {
            Lookup::Bytes
        } else {
            Lookup::Absent
        })
    }

    fn object_mut(&mut self, key: &[u8]) -> Option<&mut SharedObject> {
        if self.enabled() {
            return None;
        }
        self.inner.object_mut(key)
    }

    fn put_object(&mut self, key: &[u8], object: SharedObject) -> Result<()> {
        if !self.enabled() && !self.ahead.is_open() {
            return self.inner.put_object(key, object);
        }
        let mut bytes = Vec::new();
        object.encode(&mut bytes)?;
        self.put(key, &bytes)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use parking_lot::Mutex;

    use super::*;
    use crate::backend::heap::HeapBackend;

    /// What reached the backend, in order.
    #[derive(Debug, Clone, PartialEq, Eq)]
    enum Call {
        Get(Vec<u8>),
        Put(Vec<u8>),
        Delete(Vec<u8>),
        Append(Vec<u8>),
        Batch(Vec<Vec<u8>>),
        GetMany(Vec<Vec<u8>>),
        Snapshot,
    }

    /// The heap backend, recording every call that reaches it.
    struct Recording {
        heap: HeapBackend,
        calls: Arc<Mutex<Vec<Call>>>,
    }

    impl KvBackend for Recording {
        fn kind(&self) -> BackendKind {
            BackendKind::Hashmap
        }
        fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
            self.calls.lock().push(Call::Get(key.to_vec()));
            self.heap.get(key, out)
        }
        fn get_many(
            &mut self,
            keys: &[&[u8]],
            found: &mut dyn FnMut(usize, Option<&[u8]>),
        ) -> Result<()> {
            self.calls
                .lock()
                .push(Call::GetMany(keys.iter().map(|k| k.to_vec()).collect()));
            self.heap.get_many(keys, found)
        }
        /// As RocksDB's: the cache batches in front of it.
        fn batches_pay(&self) -> bool {
            true
        }
        fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
            self.calls.lock().push(Call::Put(key.to_vec()));
            self.heap.put(key, value)
        }
        fn delete(&mut self, key: &[u8]) -> Result<()> {
            self.calls.lock().push(Call::Delete(key.to_vec()));
            self.heap.delete(key)
        }
        fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()> {
            self.calls.lock().push(Call::Append(key.to_vec()));
            self.heap.append(key, bytes)
        }
        fn scan(
            &mut self,
            start: &[u8],
            end: &[u8],
            f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
        ) -> Result<()> {
            self.heap.scan(start, end, f)
        }
        fn write_batch(&mut self, ops: &[(&[u8], BatchOp<'_>)]) -> Result<()> {
            self.calls
                .lock()
                .push(Call::Batch(ops.iter().map(|(k, _)| k.to_vec()).collect()));
            self.heap.write_batch(ops)
        }
        fn flush(&mut self) -> Result<()> {
            Ok(())
        }
        fn compact(&mut self) -> Result<()> {
            Ok(())
        }
        fn native_snapshot(&mut self, _dir: &Path) -> Result<Option<Box<dyn PendingSnapshot>>> {
            self.calls.lock().push(Call::Snapshot);
            Ok(None)
        }
        fn approximate_len(&mut self) -> Result<u64> {
            self.heap.approximate_len()
        }
    }

    fn cached(capacity: u64) -> (CachedBackend, Arc<Mutex<Vec<Call>>>) {
        let calls = Arc::new(Mutex::new(Vec::new()));
        let inner = Recording {
            heap: HeapBackend::new(),
            calls: calls.clone(),
        };
        (CachedBackend::new(Box::new(inner), capacity), calls)
    }

    fn scan_all(c: &mut CachedBackend) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut out = Vec::new();
        c.scan(&[], &[0xff; 8], &mut |k, v| {
            out.push((k.to_vec(), v.to_vec()));
            true
        })
        .unwrap();
        out
    }

    #[test]
    fn a_batch_reads_ahead_in_one_call_and_writes_in_one_sorted_batch_at_its_end() {
        let (mut c, calls) = cached(0);
        c.put(b"k1", b"one").unwrap();
        calls.lock().clear();
        c.begin_batch().unwrap();
        c.prefetch(vec![b"k2".to_vec(), b"k1".to_vec(), b"k2".to_vec()])
            .unwrap();
        assert_eq!(
            *calls.lock(),
            vec![Call::GetMany(vec![b"k1".to_vec(), b"k2".to_vec()])],
            "one read of the sorted, distinct keys"
        );
        let mut buf = Vec::new();
        assert!(c.get(b"k1", &mut buf).unwrap());
        assert_eq!(buf, b"one");
        assert!(!c.get(b"k2", &mut buf).unwrap(), "a remembered absence");
        c.put(b"k3", b"three").unwrap();
        c.put(b"k2", b"two").unwrap();
        c.delete(b"k1").unwrap();
        assert!(c.get(b"k2", &mut buf).unwrap(), "read-your-writes");
        assert_eq!(buf, b"two");
        assert!(
            c.get(b"k3", &mut buf).unwrap(),
            "a key written but never read ahead"
        );
        assert_eq!(buf, b"three");
        assert!(!c.get(b"k1", &mut buf).unwrap(), "a delete is seen");
        assert_eq!(calls.lock().len(), 1, "the writes are held");
        c.end_batch().unwrap();
        assert_eq!(
            calls.lock()[1..],
            [Call::Batch(vec![
                b"k1".to_vec(),
                b"k2".to_vec(),
                b"k3".to_vec()
            ])],
            "one write batch, in key order"
        );
        calls.lock().clear();
        assert!(!c.get(b"k1", &mut buf).unwrap());
        assert!(c.get(b"k3", &mut buf).unwrap());
        assert_eq!(
            *calls.lock(),
            vec![Call::Get(b"k1".to_vec()), Call::Get(b"k3".to_vec())],
            "after the batch every read goes through"
        );
    }

    /// An append's whole value is not known in memory: reading it back, or any read the
    /// read-ahead cannot answer, or a scan, first writes what the batch holds.
    #[test]
    fn reads_the_read_ahead_cannot_answer_see_the_batchs_held_writes() {
        let (mut c, calls) = cached(0);
        c.put(b"k2", b"two").unwrap();
        c.begin_batch().unwrap();
        c.prefetch(vec![b"k2".to_vec()]).unwrap();
        calls.lock().clear();
        c.put(b"k9", b"nine").unwrap();
        c.append(b"k2", b"+").unwrap();
        c.append(b"k2", b"+").unwrap();
        let mut buf = Vec::new();
        assert!(c.get(b"k2", &mut buf).unwrap());
        assert_eq!(buf, b"two++", "an append is read from the backend");
        assert_eq!(
            *calls.lock(),
            vec![
                Call::Batch(vec![b"k2".to_vec(), b"k2".to_vec(), b"k9".to_vec()]),
                Call::Get(b"k2".to_vec()),
            ],
            "a key's own writes in the order made, then the read"
        );
        c.delete(b"k9").unwrap();
        c.put(b"k5", b"five").unwrap();
        assert_eq!(
            scan_all(&mut c),
            vec![
                (b"k2".to_vec(), b"two++".to_vec()),
                (b"k5".to_vec(), b"five".to_vec())
            ],
            "a scan sees the held put and delete"
        );
        calls.lock().clear();
        c.end_batch().unwrap();
        assert!(calls.lock().is_empty(), "nothing left to write");
    }

    /// Restore and reset replace the state, so a batch's held writes go with it.
    #[test]
    fn replace_drops_a_batchs_held_writes() {
        let (mut c, calls) = cached(0);
        c.begin_batch().unwrap();
        c.put(b"k", b"v").unwrap();
        let old = c.replace(Box::new(HeapBackend::new()));
        c.end_batch().unwrap();
        let mut buf = Vec::new();
        assert!(!c.get(b"k", &mut buf).unwrap(), "the new backend's answer");
        drop(old);
        assert!(calls.lock().is_empty(), "the old backend got nothing");
    }

    #[test]
    fn a_batch_on_a_backend_that_does_not_gain_from_it_changes_nothing() {
        let mut c = CachedBackend::new(Box::new(HeapBackend::new()), 0);
        c.begin_batch().unwrap();
        assert!(!c.holds_reads());
        c.prefetch(vec![b"k".to_vec()]).unwrap();
        c.put(b"k", b"v").unwrap();
        assert_eq!(c.stats(), CacheStats::default(), "nothing read ahead");
        assert_eq!(c.inner.approximate_len().unwrap(), 1, "written through");
        c.end_batch().unwrap();
    }

    #[test]
    fn replace_drops_what_a_batch_read_ahead() {
        let (mut c, calls) = cached(0);
        c.put(b"k", b"old").unwrap();
        c.begin_batch().unwrap();
        c.prefetch(vec![b"k".to_vec()]).unwrap();
        let old = c.replace(Box::new(HeapBackend::new()));
        let mut buf = Vec::new();
        assert!(!c.get(b"k", &mut buf).unwrap(), "the new backend's answer");
        drop(old);
        assert_eq!(
            calls.lock().len(),
            2,
            "the old backend saw the put and the read-ahead"
        );
    }

    #[test]
    fn many_reads_and_writes_of_a_key_cost_one_read_and_one_batched_write() {
        let (mut c, calls) = cached(1 << 20);
        let mut buf = Vec::new();
        for i in 0u32..100 {
            for key in [b"k2".as_slice(), b"k1"] {
                let n = if c.get(key, &mut buf).unwrap() {
                    u32::from_le_bytes(buf[..4].try_into().unwrap())
                } else {
                    0
                };
                assert_eq!(n, i, "read-your-writes");
                c.put(key, &(n + 1).to_le_bytes()).unwrap();
            }
        }
        assert_eq!(
            *calls.lock(),
            vec![Call::Get(b"k2".to_vec()), Call::Get(b"k1".to_vec())],
            "only the first read of each key reaches the backend before the barrier"
        );
        c.native_snapshot(Path::new("unused")).unwrap();
        assert_eq!(
            calls.lock()[2..],
            [
                Call::Batch(vec![b"k1".to_vec(), b"k2".to_vec()]),
                Call::Snapshot
            ],
            "one batch in key order, then the snapshot"
        );
        let s = c.stats();
        assert_eq!((s.hits, s.misses, s.writebacks), (198, 2, 2));
        // Clean after the barrier: a second barrier writes nothing.
        c.native_snapshot(Path::new("unused")).unwrap();
        assert_eq!(calls.lock()[4..], [Call::Snapshot]);
    }

    #[test]
    fn barrier_writes_puts_deletes_and_appends_sorted_by_storage_key() {
        let (mut c, calls) = cached(1 << 20);
        c.inner.put(b"b", b"old").unwrap();
        calls.lock().clear();
        for k in [b"e", b"a", b"d"] {
            c.put(k, b"v").unwrap();
        }
        c.delete(b"b").unwrap();
        c.append(b"c", b"x").unwrap();
        c.append(b"c", b"y").unwrap();
        assert!(
            calls.lock().is_empty(),
            "nothing reaches the backend before the barrier"
        );
        c.write_back().unwrap();
        let keys: Vec<Vec<u8>> = [b"a", b"b", b"c", b"d", b"e"].map(|k| k.to_vec()).into();
        assert_eq!(*calls.lock(), vec![Call::Batch(keys)]);
        let mut buf = Vec::new();
        assert!(!c.inner.get(b"b", &mut buf).unwrap(), "delete written back");
        assert!(c.inner.get(b"c", &mut buf).unwrap());
        assert_eq!(buf, b"xy", "appends written back as one merge");
    }

    #[test]
    fn scans_merge_dirty_values_tombstones_and_pending_appends() {
        let (mut c, _) = cached(1 << 20);
        for (k, v) in [(b"a", b"1"), (b"b", b"2"), (b"c", b"3"), (b"f", b"6")] {
            c.inner.put(k, v).unwrap();
        }
        c.append(b"a", b"+").unwrap(); // pending append on a stored value
        c.put(b"b", b"two").unwrap(); // dirty value over a stored one
        c.delete(b"c").unwrap(); // tombstone over a stored one
        c.append(b"d", b"4").unwrap(); // pending append, nothing stored
        c.put(b"e", b"5").unwrap(); // new value
        c.delete(b"g").unwrap(); // tombstone, nothing stored
        let mut buf = Vec::new();
        assert!(c.get(b"f", &mut buf).unwrap()); // a clean cached entry
        let want: Vec<(Vec<u8>, Vec<u8>)> = [
            (b"a", b"1+".as_slice()),
            (b"b", b"two"),
            (b"d", b"4"),
            (b"e", b"5"),
            (b"f", b"6"),
        ]
        .iter()
        .map(|(k, v)| (k.to_vec(), v.to_vec()))
        .collect();
        assert_eq!(scan_all(&mut c), want);
        // A scan stops where its visitor says, in either source.
        for stop_after in 1..=want.len() {
            let mut seen = Vec::new();
            c.scan(b"a", b"z", &mut |k, _| {
                seen.push(k.to_vec());
                seen.len() < stop_after
            })
            .unwrap();
            let expected: Vec<Vec<u8>> =
                want[..stop_after].iter().map(|(k, _)| k.clone()).collect();
            assert_eq!(seen, expected);
        }
        // Same view after the write-back.
        c.write_back().unwrap();
        assert_eq!(scan_all(&mut c), want);
        let mut inner = Vec::new();
        c.inner
            .scan(b"a", b"z", &mut |k, v| {
                inner.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        assert_eq!(inner, want);
    }

    #[test]
    fn a_pending_append_read_later_joins_the_stored_value() {
        let (mut c, calls) = cached(1 << 20);
        c.inner.put(b"l", b"ab").unwrap();
        calls.lock().clear();
        c.append(b"l", b"c").unwrap();
        assert!(calls.lock().is_empty(), "appending reads nothing");
        let mut buf = Vec::new();
        assert!(c.get(b"l", &mut buf).unwrap());
        assert_eq!(buf, b"abc");
        c.append(b"l", b"d").unwrap();
        assert!(c.get(b"l", &mut buf).unwrap());
        assert_eq!(buf, b"abcd");
        c.write_back().unwrap();
        assert!(c.inner.get(b"l", &mut buf).unwrap());
        assert_eq!(
            buf, b"abcd",
            "written back as the whole value, not appended twice"
        );
    }

    #[test]
    fn eviction_writes_back_dirty_entries_and_stays_within_capacity() {
        let capacity = 4096;
        let (mut c, calls) = cached(capacity);
        let key = |i: u32| format!("key-{i:05}").into_bytes();
        for i in 0..2000u32 {
            c.put(&key(i), &i.to_le_bytes()).unwrap();
            assert!(c.stats().bytes <= capacity, "over capacity after put {i}");
        }
        let s = c.stats();
        assert!(s.evictions > 1900, "{s:?}");
        assert_eq!(s.evictions + s.entries, 2000);
        assert!(
            calls.lock().iter().all(|c| matches!(c, Call::Batch(_))),
            "evictions write back in batches"
        );
        // Each eviction frees an eighth of the capacity: ~6 entries of ~77 bytes here.
        assert!(calls.lock().len() < 400, "batches, not one write per entry");
        let mut buf = Vec::new();
        for i in 0..2000u32 {
            assert!(c.get(&key(i), &mut buf).unwrap(), "key {i} lost");
            assert_eq!(buf, i.to_le_bytes());
        }
        assert_eq!(scan_all(&mut c).len(), 2000);
    }

    #[test]
    fn clock_keeps_recently_read_entries() {
        let (mut c, _) = cached(64 * (ENTRY_OVERHEAD + 16));
        let mut buf = Vec::new();
        c.put(b"hot", b"v").unwrap();
        for i in 0..1000u32 {
            c.put(format!("cold-{i:05}").as_bytes(), b"v").unwrap();
            assert!(c.get(b"hot", &mut buf).unwrap());
        }
        let s = c.stats();
        assert!(s.evictions > 900, "{s:?}");
        assert_eq!(s.misses, 0, "the hot key was never evicted: {s:?}");
    }

    #[test]
    fn replace_drops_dirty_and_clean_entries() {
        let (mut c, _) = cached(1 << 20);
        c.put(b"a", b"1").unwrap();
        c.write_back().unwrap();
        c.put(b"b", b"2").unwrap();
        c.delete(b"a").unwrap();
        let mut fresh = HeapBackend::new();
        fresh.put(b"a", b"restored").unwrap();
        let old = c.replace(Box::new(fresh));
        drop(old);
        assert_eq!(c.stats().entries, 0);
        assert_eq!(
            scan_all(&mut c),
            vec![(b"a".to_vec(), b"restored".to_vec())]
        );
        c.write_back().unwrap();
        assert_eq!(
            scan_all(&mut c),
            vec![(b"a".to_vec(), b"restored".to_vec())]
        );
    }

    #[test]
    fn capacity_zero_passes_every_call_through() {
        let (mut c, calls) = cached(0);
        let mut buf = Vec::new();
        c.put(b"a", b"1").unwrap();
        assert!(c.get(b"a", &mut buf).unwrap());
        c.delete(b"a").unwrap();
        c.append(b"l", b"x").unwrap();
        c.write_back().unwrap();
        assert_eq!(
            *calls.lock(),
            vec![
                Call::Put(b"a".to_vec()),
                Call::Get(b"a".to_vec()),
                Call::Delete(b"a".to_vec()),
                Call::Append(b"l".to_vec()),
            ]
        );
        assert_eq!(c.stats(), CacheStats::default());
    }
}
