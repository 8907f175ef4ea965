//! Typed keyed-state handles. A handle is a descriptor bound to a store:
//! obtain it once, keep it, and every call acts on the store's current key
//! and namespace. Handles serialize with postcard (stable wire format).

use std::marker::PhantomData;
use std::sync::Arc;

use crate::backend::KvBackend;
use crate::batch::Prefetch;
use crate::codec::{JsonCodec, StateValue, de, decode_json, ser_append};
use crate::descriptor::*;
use crate::error::Result;
use crate::layout;
use crate::store::{StateMeta, StateStore};

impl StateStore {
    pub fn value_state<T: StateValue + Clone>(
        &self,
        d: &ValueStateDescriptor<T>,
    ) -> Result<ValueState<T>> {
        let meta = self.register(
            &d.name,
            StateKind::Value,
            d.ttl.clone(),
            (d.declaration().schema, &d.schema),
        )?;
        self.register_codec(
            &d.name,
            JsonCodec {
                value: decode_json::<T>,
                map_key: None,
            },
        );
        Ok(ValueState {
            store: self.clone(),
            meta,
            default: d.default.clone(),
        })
    }
    pub fn list_state<T: StateValue>(&self, d: &ListStateDescriptor<T>) -> Result<ListState<T>> {
        let meta = self.register(
            &d.name,
            StateKind::List,
            d.ttl.clone(),
            (d.declaration().schema, &d.schema),
        )?;
        self.register_codec(
            &d.name,
            JsonCodec {
                value: decode_json::<T>,
                map_key: None,
            },
        );
        Ok(ListState {
            store: self.clone(),
            meta,
            _t: PhantomData,
        })
    }
    pub fn map_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> Result<MapState<K, V>> {
        let meta = self.register(
            &d.name,
            StateKind::Map,
            d.ttl.clone(),
            (d.declaration().schema, &d.schema),
        )?;
        self.register_codec(
            &d.name,
            JsonCodec {
                value: decode_json::<V>,
                map_key: Some(decode_json::<K>),
            },
        );
        Ok(MapState {
            store: self.clone(),
            meta,
            _t: PhantomData,
        })
    }
    pub fn reducing_state<T: StateValue>(
        &self,
        d: &ReducingStateDescriptor<T>,
    ) -> Result<ReducingState<T>> {
        let meta = self.register(
            &d.name,
            StateKind::Reducing,
            d.ttl.clone(),
            (d.declaration().schema, &d.schema),
        )?;
        self.register_codec(
            &d.name,
            JsonCodec {
                value: decode_json::<T>,
                map_key: None,
            },
        );
        Ok(ReducingState {
            store: self.clone(),
            meta,
            reduce: d.reduce.clone(),
        })
    }
    pub fn aggregating_state<F>(
        &self,
        d: &AggregatingStateDescriptor<F>,
    ) -> Result<AggregatingState<F>>
    where
        F: AggregateFunction,
        F::Acc: StateValue,
    {
        let meta = self.register(
            &d.name,
            StateKind::Aggregating,
            d.ttl.clone(),
            (d.declaration().schema, &d.schema),
        )?;
        self.register_codec(
            &d.name,
            JsonCodec {
                value: decode_json::<F::Acc>,
                map_key: None,
            },
        );
        Ok(AggregatingState {
            store: self.clone(),
            meta,
            function: d.function.clone(),
        })
    }
}

/// A single value per key and namespace.
#[derive(Clone)]
pub struct ValueState<T> {
    store: StateStore,
    meta: Arc<StateMeta>,
    default: Option<T>,
}

impl<T: StateValue + Clone> ValueState<T> {
    /// The value, or the descriptor's default, or `None`.
    pub fn value(&self) -> Result<Option<T>> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        match g.get_value(&self.meta, false)? {
            Some(v) => Ok(Some(v)),
            None => Ok(self.default.clone()),
        }
    }
    pub fn update(&self, value: &T) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        g.put_value_ref(&self.meta, value)
    }
    pub fn clear(&self) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let g = &mut *g;
        g.backend.delete(&g.kbuf)
    }
    /// Names this state's value at `key` and `namespace` for a batch's read-ahead
    /// ([`crate::batch`]).
    pub fn prefetch(&self, list: &mut Prefetch, key: &[u8], namespace: &[u8]) -> Result<()> {
        list.add(&self.meta, key, namespace, |_| Ok(()))
    }
}

/// A list per key and namespace; TTL is per element.
#[derive(Clone)]
pub struct ListState<T> {
    store: StateStore,
    meta: Arc<StateMeta>,
    _t: PhantomData<fn() -> T>,
}

impl<T: StateValue> ListState<T> {
    /// The elements in insertion order (empty if none).
    pub fn get(&self) -> Result<Vec<T>> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        g.get_list(&self.meta)?
            .iter()
            .map(|b| de(b, &self.meta.name))
            .collect()
    }
    /// Appends without reading (a RocksDB merge).
    pub fn add(&self, value: &T) -> Result<()> {
        self.add_all(std::slice::from_ref(value))
    }
    pub fn add_all(&self, values: &[T]) -> Result<()> {
        if values.is_empty() {
            return Ok(());
        }
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let now = g.now();
        g.sbuf.clear();
        for v in values {
            g.frame_element(&self.meta, v, now)?;
        }
        let g = &mut *g;
        g.backend.append(&g.kbuf, &g.sbuf)
    }
    /// Replaces the list; an empty list clears it.
    pub fn update(&self, values: &[T]) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let now = g.now();
        g.sbuf.clear();
        for v in values {
            g.frame_element(&self.meta, v, now)?;
        }
        let g = &mut *g;
        if values.is_empty() {
            g.backend.delete(&g.kbuf)
        } else {
            g.backend.put(&g.kbuf, &g.sbuf)
        }
    }
    pub fn clear(&self) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let g = &mut *g;
        g.backend.delete(&g.kbuf)
    }
}

/// A map per key and namespace; TTL is per entry. One storage entry per map
/// entry, so a point access never reads the whole map.
#[derive(Clone)]
pub struct MapState<K, V> {
    store: StateStore,
    meta: Arc<StateMeta>,
    _t: PhantomData<fn() -> (K, V)>,
}

impl<K: StateValue, V: StateValue> MapState<K, V> {
    fn entry_key(&self, g: &mut crate::store::Inner, key: &K) -> Result<()> {
        g.prefix(self.meta.id)?;
        ser_append(&mut g.kbuf, key, &self.meta.name)
    }
    pub fn get(&self, key: &K) -> Result<Option<V>> {
        let mut g = self.store.lock();
        self.entry_key(&mut g, key)?;
        g.get_value(&self.meta, false)
    }
    pub fn contains(&self, key: &K) -> Result<bool> {
        let mut g = self.store.lock();
        self.entry_key(&mut g, key)?;
        Ok(g.get_value::<V>(&self.meta, false)?.is_some())
    }
    pub fn put(&self, key: &K, value: &V) -> Result<()> {
        let mut g = self.store.lock();
        self.entry_key(&mut g, key)?;
        g.put_value_ref(&self.meta, value)
    }
    pub fn put_all<'a>(&self, entries: impl IntoIterator<Item = (&'a K, &'a V)>) -> Result<()>
    where
        K: 'a,
        V: 'a,
    {
        for (k, v) in entries {
            self.put(k, v)?;
        }
        Ok(())
    }
    /// Names the entry `user_key` of this map at `key` and `namespace` for a batch's
    /// read-ahead ([`crate::batch`]).
    pub fn prefetch(
        &self,
        list: &mut Prefetch,
        key: &[u8],
        namespace: &[u8],
        user_key: &K,
    ) -> Result<()> {
        list.add(&self.meta, key, namespace, |k| {
            ser_append(k, user_key, &self.meta.name)
        })
    }
    pub fn remove(&self, key: &K) -> Result<()> {
        let mut g = self.store.lock();
        self.entry_key(&mut g, key)?;
        let g = &mut *g;
        g.backend.delete(&g.kbuf)
    }
    /// All visible entries, ordered by the serialized key bytes.
    pub fn entries(&self) -> Result<Vec<(K, V)>> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let prefix_len = g.kbuf.len();
        let end = layout::prefix_end(&g.kbuf);
        let mut raw: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        {
            let g = &mut *g;
            g.backend.scan(&g.kbuf, &end, &mut |k, v| {
                raw.push((k.to_vec(), v.to_vec()));
                true
            })?;
        }
        let mut out = Vec::with_capacity(raw.len());
        if self.meta.ttl.is_none() {
            for (k, v) in raw {
                out.push((
                    de(&k[prefix_len..], &self.meta.name)?,
                    de(&v, &self.meta.name)?,
                ));
            }
            return Ok(out);
        }
        for (k, _) in raw {
            // Re-read through get_entry so TTL rules and cleanup apply per entry.
            g.kbuf.clear();
            g.kbuf.extend_from_slice(&k);
            if let Some(v) = g.get_value(&self.meta, false)? {
                out.push((de(&k[prefix_len..], &self.meta.name)?, v));
            }
        }
        Ok(out)
    }
    pub fn keys(&self) -> Result<Vec<K>> {
        Ok(self.entries()?.into_iter().map(|(k, _)| k).collect())
    }
    pub fn values(&self) -> Result<Vec<V>> {
        Ok(self.entries()?.into_iter().map(|(_, v)| v).collect())
    }
    pub fn is_empty(&self) -> Result<bool> {
        Ok(self.entries()?.is_empty())
    }
    pub fn clear(&self) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        g.delete_prefix()
    }
}

/// A value folded with a reduce function on every `add`.
#[derive(Clone)]
pub struct ReducingState<T> {
    store: StateStore,
    meta: Arc<StateMeta>,
    reduce: ReduceFn<T>,
}

impl<T: StateValue> ReducingState<T> {
    pub fn get(&self) -> Result<Option<T>> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        g.get_value(&self.meta, false)
    }
    pub fn add(&self, value: &T) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let next = match g.get_value::<T>(&self.meta, true)? {
            Some(old) => (self.reduce)(&old, value),
            None => value.clone(),
        };
        g.put_value(&self.meta, next)
    }
    pub fn clear(&self) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let g = &mut *g;
        g.backend.delete(&g.kbuf)
    }
    /// Folds the values of `sources` namespaces into `target` and clears the
    /// sources (merging windows), for the current key.
    pub fn merge_namespaces(&self, target: &[u8], sources: &[&[u8]]) -> Result<()> {
        let mut g = self.store.lock();
        let saved = std::mem::take(&mut g.ns);
        let result = (|| {
            let mut acc: Option<T> = None;
            for ns in sources.iter().copied().chain(std::iter::once(target)) {
                g.ns.clear();
                g.ns.extend_from_slice(ns);
                g.prefix(self.meta.id)?;
                if let Some(v) = g.get_value::<T>(&self.meta, true)? {
                    acc = Some(match acc {
                        Some(a) => (self.reduce)(&a, &v),
                        None => v,
                    });
                }
                let g2 = &mut *g;
                g2.backend.delete(&g2.kbuf)?;
            }
            if let Some(a) = acc {
                g.ns.clear();
                g.ns.extend_from_slice(target);
                g.prefix(self.meta.id)?;
                g.put_value(&self.meta, a)?;
            }
            Ok(())
        })();
        g.ns = saved;
        result
    }
}

/// An accumulator per key and namespace; `get` returns the function's result.
pub struct AggregatingState<F: AggregateFunction> {
    store: StateStore,
    meta: Arc<StateMeta>,
    function: Arc<F>,
}

impl<F: AggregateFunction> Clone for AggregatingState<F> {
    fn clone(&self) -> Self {
        Self {
            store: self.store.clone(),
            meta: self.meta.clone(),
            function: self.function.clone(),
        }
    }
}

impl<F> AggregatingState<F>
where
    F: AggregateFunction,
    F::Acc: StateValue,
{
    pub fn get(&self) -> Result<Option<F::Out>> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        Ok(g.get_value::<F::Acc>(&self.meta, false)?
            .map(|acc| self.function.get_result(&acc)))
    }
    pub fn add(&self, value: F::In) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let acc = match g.get_value::<F::Acc>(&self.meta, true)? {
            Some(acc) => acc,
            None => self.function.create_accumulator(),
        };
        let acc = self.function.add(value, acc);
        g.put_value(&self.meta, acc)
    }
    pub fn clear(&self) -> Result<()> {
        let mut g = self.store.lock();
        g.prefix(self.meta.id)?;
        let g = &mut *g;
        g.backend.delete(&g.kbuf)
    }
    /// Merges the accumulators of `sources` into `target` with the
    /// function's `merge` and clears the sources, for the current key.
    pub fn merge_namespaces(&self, target: &[u8], sources: &[&[u8]]) -> Result<()> {
        let mut g = self.store.lock();
        let saved = std::mem::take(&mut g.ns);
        let result = (|| {
            let mut acc: Option<F::Acc> = None;
            for ns in sources.iter().copied().chain(std::iter::once(target)) {
                g.ns.clear();
                g.ns.extend_from_slice(ns);
                g.prefix(self.meta.id)?;
                if let Some(v) = g.get_value::<F::Acc>(&self.meta, true)? {
                    acc = Some(match acc {
                        Some(a) => self.function.merge(a, v),
                        None => v,
                    });
                }
                let g2 = &mut *g;
                g2.backend.delete(&g2.kbuf)?;
            }
            if let Some(a) = acc {
                g.ns.clear();
                g.ns.extend_from_slice(target);
                g.prefix(self.meta.id)?;
                g.put_value(&self.meta, a)?;
            }
            Ok(())
        })();
        g.ns = saved;
        result
    }
}
