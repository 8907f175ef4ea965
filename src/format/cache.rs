//! Schemas by id, decoded once. An id's schema never changes, so a found one stays until
//! the cache is full (then the oldest goes); an id the registry did not know is asked
//! again after [`NOT_FOUND_TTL`], since it may be registered by then.

use std::collections::{HashMap, VecDeque};
use std::sync::{Arc, Mutex};
use std::time::{Duration, Instant};

use super::metrics::FormatMetrics;
use super::registry::RegistryError;

pub const NOT_FOUND_TTL: Duration = Duration::from_secs(10);

enum Entry<T> {
    Found(Arc<T>),
    NotFound(Instant),
}

pub struct SchemaCache<T> {
    capacity: usize,
    inner: Mutex<(HashMap<u32, Entry<T>>, VecDeque<u32>)>,
    metrics: FormatMetrics,
}

impl<T> SchemaCache<T> {
    pub fn new(capacity: usize, metrics: FormatMetrics) -> Self {
        Self {
            capacity: capacity.max(1),
            inner: Mutex::new((HashMap::new(), VecDeque::new())),
            metrics,
        }
    }

    /// The decoded schema of `id`, calling `fetch` on a miss (outside the lock).
    /// `Ok(None)`: the registry has no such id.
    pub fn get_or_fetch(
        &self,
        id: u32,
        fetch: impl FnOnce() -> Result<Option<T>, RegistryError>,
    ) -> Result<Option<Arc<T>>, RegistryError> {
        {
            let guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
            match guard.0.get(&id) {
                Some(Entry::Found(t)) => {
                    self.metrics.cache_hits.inc();
                    return Ok(Some(t.clone()));
                }
                Some(Entry::NotFound(at)) if at.elapsed() < NOT_FOUND_TTL => {
                    self.metrics.cache_hits.inc();
                    return Ok(None);
                }
                _ => {}
            }
        }
        self.metrics.cache_misses.inc();
        let fetched = fetch()?.map(Arc::new);
        let mut guard = self.inner.lock().unwrap_or_else(|p| p.into_inner());
        let (map, order) = &mut *guard;
        if map.remove(&id).is_some() {
            order.retain(|i| *i != id);
        }
        while map.len() >= self.capacity {
            let Some(oldest) = order.pop_front() else {
                break;
            };
            map.remove(&oldest);
        }
        map.insert(
            id,
            match &fetched {
                Some(t) => Entry::Found(t.clone()),
                None => Entry::NotFound(Instant::now()),
            },
        );
        order.push_back(id);
        self.metrics.cache_entries.set(map.len() as i64);
        Ok(fetched)
    }
}

#[cfg(test)]
mod tests {
    use super::*;

    #[test]
    fn fetches_each_id_once_and_evicts_the_oldest_when_full() {
        let cache = SchemaCache::new(2, FormatMetrics::unregistered().expect("metrics"));
        let calls = std::cell::Cell::new(0);
        let get = |id: u32| {
            cache
                .get_or_fetch(id, || {
                    calls.set(calls.get() + 1);
                    Ok(Some(id * 10))
                })
                .expect("fetch")
                .map(|v| *v)
        };
        assert_eq!(get(1), Some(10));
        assert_eq!(get(1), Some(10));
        assert_eq!(calls.get(), 1, "a cached id is not fetched again");
        get(2);
        get(3); // evicts 1
        assert_eq!(calls.get(), 3);
        assert_eq!(get(1), Some(10));
        assert_eq!(calls.get(), 4, "the evicted id is fetched again");
        assert_eq!(cache.metrics.cache_entries.get(), 2);
    }

    #[test]
    fn an_unknown_id_is_remembered_briefly_and_errors_are_not_cached() {
        let cache: SchemaCache<u32> =
            SchemaCache::new(4, FormatMetrics::unregistered().expect("metrics"));
        assert_eq!(cache.get_or_fetch(7, || Ok(None)).expect("fetch"), None);
        let again = cache.get_or_fetch(7, || panic!("not refetched within the TTL"));
        assert_eq!(again.expect("cached"), None);
        let down = cache.get_or_fetch(8, || {
            Err(RegistryError::Unavailable {
                what: "x".into(),
                waited_ms: 0,
                last: "down".into(),
            })
        });
        assert!(down.is_err());
        assert_eq!(
            cache
                .get_or_fetch(8, || Ok(Some(80)))
                .expect("fetch")
                .map(|v| *v),
            Some(80),
            "a failed fetch leaves nothing behind"
        );
    }
}
