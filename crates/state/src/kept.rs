//! Values the `hashmap` backend keeps as objects: what a typed handle hands a backend
//! that [keeps objects](crate::backend::KvBackend::keeps_objects) instead of bytes.
//!
//! A [`Kept`] is the value and its TTL timestamp, i.e. exactly what
//! `[last-access ms][postcard payload]` would say; its encoding *is* those bytes, so
//! scans, snapshots, savepoints and the state lookup read the same bytes from either
//! backend. Reads clone the value (`StateValue: Clone`), writes move it in: in place
//! when no frozen snapshot shares the object, else as a new object (copy-on-write).

use std::any::Any;
use std::sync::Arc;

use crate::backend::{KvBackend, Lookup, StoredObject};
use crate::codec::{StateValue, de, ser_append};
use crate::error::Result;
use crate::store::{Inner, StateMeta};
use crate::ttl::OnRead;

/// One kept value of a state.
struct Kept<T> {
    /// The state it belongs to: its TTL decides the encoding, its name the errors.
    meta: Arc<StateMeta>,
    /// Last access in ms (only meaningful, and only encoded, when the state has TTL).
    ts: u64,
    value: T,
}

impl<T: StateValue> StoredObject for Kept<T> {
    fn encode(&self, out: &mut Vec<u8>) -> Result<()> {
        if self.meta.ttl.is_some() {
            out.extend_from_slice(&self.ts.to_le_bytes());
        }
        ser_append(out, &self.value, &self.meta.name)
    }

    fn approximate_bytes(&self) -> usize {
        std::mem::size_of::<Self>()
    }
}

impl Inner {
    /// The value at `kbuf`, with TTL applied as [`Inner::get_entry`] applies it: from
    /// the kept object when there is one, else decoded from the stored bytes.
    pub fn get_value<T: StateValue>(
        &mut self,
        meta: &Arc<StateMeta>,
        for_update: bool,
    ) -> Result<Option<T>> {
        if !self.backend.keeps_objects() {
            return self.decoded(meta, for_update, Fetched::Fetch);
        }
        let object = match self.backend.lookup(&self.kbuf, &mut self.vbuf)? {
            Lookup::Absent => return Ok(None),
            Lookup::Bytes => return self.decoded(meta, for_update, Fetched::InVbuf),
            Lookup::Object(o) => o,
        };
        let any: &dyn Any = &*object;
        let Some(kept) = any.downcast_ref::<Kept<T>>() else {
            // Written through another Rust type (a compatible schema): go by its bytes.
            self.vbuf.clear();
            object.encode(&mut self.vbuf)?;
            return self.decoded(meta, for_update, Fetched::InVbuf);
        };
        let Some(ttl) = &meta.ttl else {
            return Ok(Some(kept.value.clone()));
        };
        let now = self.clock.now_ms();
        match ttl.on_read(kept.ts, now, for_update) {
            OnRead::Expired { visible } => {
                let value = visible.then(|| kept.value.clone());
                self.backend.delete(&self.kbuf)?;
                self.ttl_expired += 1;
                Ok(value)
            }
            OnRead::Live { refresh } => {
                let value = kept.value.clone();
                if refresh {
                    // Our reference gone, the put can stamp `now` in place instead of
                    // copying the object.
                    drop(object);
                    self.put_value(meta, value.clone())?;
                }
                Ok(Some(value))
            }
        }
    }

    /// Writes `value` at `kbuf` with a fresh TTL timestamp: kept as an object (changed
    /// in place when nothing shares it) or serialized, as the backend holds values.
    pub fn put_value<T: StateValue>(&mut self, meta: &Arc<StateMeta>, value: T) -> Result<()> {
        if !self.backend.keeps_objects() {
            return self.put_entry(meta, &value);
        }
        let ts = if meta.ttl.is_some() {
            self.clock.now_ms()
        } else {
            0
        };
        if let Some(object) = self.backend.object_mut(&self.kbuf)
            && let Some(object) = Arc::get_mut(object)
        {
            let any: &mut dyn Any = object;
            if let Some(kept) = any.downcast_mut::<Kept<T>>() {
                kept.value = value;
                kept.ts = ts;
                if !Arc::ptr_eq(&kept.meta, meta) {
                    kept.meta = meta.clone();
                }
                return Ok(());
            }
        }
        let kept = Kept {
            meta: meta.clone(),
            ts,
            value,
        };
        self.backend.put_object(&self.kbuf, Arc::new(kept))
    }

    /// [`Inner::put_value`] from a borrowed value: serialized from the reference when
    /// the backend keeps bytes, copied only when it keeps objects.
    pub fn put_value_ref<T: StateValue>(&mut self, meta: &Arc<StateMeta>, value: &T) -> Result<()> {
        if self.backend.keeps_objects() {
            self.put_value(meta, value.clone())
        } else {
            self.put_entry(meta, value)
        }
    }

    fn decoded<T: StateValue>(
        &mut self,
        meta: &StateMeta,
        for_update: bool,
        fetched: Fetched,
    ) -> Result<Option<T>> {
        let found = match fetched {
            Fetched::Fetch => self.get_entry(meta, for_update)?,
            Fetched::InVbuf => self.entry_in_vbuf(meta, for_update)?,
        };
        match found {
            Some(off) => Ok(Some(de(&self.vbuf[off..], &meta.name)?)),
            None => Ok(None),
        }
    }
}

/// Whether the stored bytes still have to be read, or are in `vbuf` already.
enum Fetched {
    Fetch,
    InVbuf,
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use crate::backend::{BackendKind, KvBackend};
    use crate::*;

    #[derive(Clone, Debug, PartialEq, serde::Serialize, serde::Deserialize)]
    struct Acc {
        count: u64,
        last: String,
    }

    fn entries(store: &StateStore) -> Vec<(Vec<u8>, Vec<u8>)> {
        let mut g = store.lock();
        let mut out = Vec::new();
        g.backend
            .scan(&[], &[0xff; 8], &mut |k, v| {
                out.push((k.to_vec(), v.to_vec()));
                true
            })
            .unwrap();
        out
    }

    /// The same writes on a store that keeps objects and on one that keeps bytes
    /// (the cache on makes handles serialize) leave the same stored bytes.
    #[test]
    fn kept_objects_encode_to_the_bytes_a_byte_store_holds() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000));
        let open = |name: &str, cache: u64| {
            StateStore::open_with_clock(
                StoreConfig::new(BackendKind::Hashmap, dir.path().join(name), 128)
                    .with_cache_bytes(cache),
                clock.clone(),
            )
            .unwrap()
        };
        let objects = open("objects", 0);
        let bytes = open("bytes", 1 << 20);
        assert!(objects.lock().backend.keeps_objects());
        assert!(!bytes.lock().backend.keeps_objects());
        let handles: Vec<_> = [&objects, &bytes]
            .into_iter()
            .map(|store| {
                let acc = store
                    .value_state(
                        &ValueStateDescriptor::<Acc>::new("acc").with_ttl(
                            TtlConfig::new(Duration::from_secs(60))
                                .update_type(UpdateType::OnReadAndWrite),
                        ),
                    )
                    .unwrap();
                let seen = store
                    .map_state(&MapStateDescriptor::<u64, String>::new("seen"))
                    .unwrap();
                (store, acc, seen)
            })
            .collect();
        for i in 0..20u64 {
            for (store, acc, seen) in &handles {
                store
                    .set_current_key(format!("k{}", i % 7).as_bytes())
                    .unwrap();
                let mut a = acc.value().unwrap().unwrap_or(Acc {
                    count: 0,
                    last: String::new(),
                });
                a.count += 1;
                a.last = format!("event-{i}");
                acc.update(&a).unwrap();
                seen.put(&i, &format!("v{i}")).unwrap();
                if i % 5 == 0 {
                    seen.remove(&(i / 2)).unwrap();
                }
            }
            // Encode between rounds: the next round's writes (in place, nothing shares the
            // objects) must show in the next encoding, TTL timestamp included.
            entries(&objects);
            clock.advance(1_000);
        }
        assert_eq!(entries(&objects), entries(&bytes));
    }

    /// A write in place (nothing shares the object) after an encoding: the next encoding
    /// says the new value and timestamp (what any reuse of encodings must keep true).
    #[test]
    fn a_write_in_place_after_an_encoding_is_what_the_next_encoding_says() {
        let dir = tempfile::tempdir().unwrap();
        let clock = Arc::new(ManualClock::new(1_000));
        let store = StateStore::open_with_clock(
            StoreConfig::new(BackendKind::Hashmap, dir.path(), 128),
            clock.clone(),
        )
        .unwrap();
        let plain = store
            .value_state(&ValueStateDescriptor::<Acc>::new("plain"))
            .unwrap();
        let ttl = store
            .value_state(
                &ValueStateDescriptor::<u64>::new("ttl")
                    .with_ttl(TtlConfig::new(Duration::from_secs(60))),
            )
            .unwrap();
        store.set_current_key(b"k").unwrap();
        for round in 1..=3u64 {
            let acc = Acc {
                count: round,
                last: format!("round-{round}"),
            };
            plain.update(&acc).unwrap();
            ttl.update(&round).unwrap();
            let mut expected_ttl = clock.now_ms().to_le_bytes().to_vec();
            expected_ttl.extend(postcard::to_allocvec(&round).unwrap());
            let values: Vec<Vec<u8>> = entries(&store).into_iter().map(|(_, v)| v).collect();
            assert_eq!(
                values,
                vec![postcard::to_allocvec(&acc).unwrap(), expected_ttl],
                "round {round}"
            );
            clock.advance(1_000);
        }
    }

    /// A frozen copy (a checkpoint's) keeps the value it saw: a write after the freeze
    /// replaces the shared object rather than changing it.
    #[test]
    fn a_frozen_copy_keeps_the_object_a_later_write_replaces() {
        let dir = tempfile::tempdir().unwrap();
        let store =
            StateStore::open(StoreConfig::new(BackendKind::Hashmap, dir.path(), 128)).unwrap();
        let acc = store
            .value_state(&ValueStateDescriptor::<Acc>::new("acc"))
            .unwrap();
        store.set_current_key(b"k").unwrap();
        let first = Acc {
            count: 1,
            last: "a".into(),
        };
        acc.update(&first).unwrap();
        let frozen = store.lock().backend.freeze().unwrap();
        acc.update(&Acc {
            count: 2,
            last: "b".into(),
        })
        .unwrap();
        let mut seen = Vec::new();
        frozen
            .scan(&[], &[0xff; 8], &mut |_, v| {
                seen.push(v.to_vec());
                true
            })
            .unwrap();
        assert_eq!(seen, vec![postcard::to_allocvec(&first).unwrap()]);
        assert_eq!(acc.value().unwrap().unwrap().count, 2);
    }
}
