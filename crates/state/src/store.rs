//! `StateStore`: the one object the runtime owns per instance. It holds the
//! backend, the current key and namespace, the registry of named states, the
//! timers and the operator/broadcast state, behind one mutex so typed handles
//! are cheap `Arc` clones that can be cached in user functions and sent
//! across threads.

use std::collections::HashMap;
use std::path::PathBuf;
use std::sync::Arc;

use parking_lot::{Mutex, MutexGuard};
use serde::{Deserialize, Serialize};

use crate::backend::heap::HeapBackend;
use crate::backend::rocks::RocksBackend;
use crate::backend::{BackendKind, KvBackend};
use crate::cache::{CacheStats, CachedBackend};
use crate::clock::{Clock, SystemClock};
use crate::codec::StateValue;
use crate::codec::ser_append;
use crate::descriptor::MapStateDescriptor;
use crate::error::{IoContext, Result, StateError};
use crate::keygroup::{KeyGroupRange, KeyGroups};
use crate::kind::StateKind;
use crate::layout::{self, FIRST_RESERVED_ID};
use crate::operator::{
    self, BroadcastState, OperatorListState, ReadOnlyBroadcastState, Redistribution,
    SharedOperatorStates,
};
use crate::schema::{MigrateFn, SchemaChange, SchemaMeta};
use crate::timers::{TimeDomain, Timer, TimerAt, TimerChange, TimerIndex};
use crate::ttl::{self, Expiry, OnRead, TS_LEN, TtlConfig, TtlRegistry, read_ts};

/// How to open a store.
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct StoreConfig {
    pub backend: BackendKind,
    /// Local working directory; RocksDB lives under it. Wiped on open: live
    /// state always comes from a checkpoint, never from a previous run's disk.
    pub work_dir: PathBuf,
    /// Fixed at the first start; every snapshot records it.
    pub max_parallelism: u32,
    /// The input partition count the key groups are aligned to ([`KeyGroups`]); `None`
    /// numbers them modulo `max_parallelism`. Fixed and recorded like it.
    #[serde(default)]
    pub aligned_partitions: Option<u32>,
    pub key_group_range: KeyGroupRange,
    /// This instance's index and the number of instances, for operator-state
    /// redistribution on restore.
    pub instance_index: u32,
    pub instance_count: u32,
    /// Capacity of the write-back state cache in front of the backend
    /// ([`crate::cache`]), estimated bytes; 0 turns it off.
    #[serde(default = "default_cache_bytes")]
    pub cache_bytes: u64,
}

/// The state cache's default capacity: off ([`default_cache_bytes_for`]).
fn default_cache_bytes() -> u64 {
    0
}

/// Off for both backends. `state_bench` measured the cache on `rocksdb` at 1.78x
/// the events/s with 10k hot keys and six value states per event, but 0.5x with 1M
/// keys where almost every event is a new key (misses allocate, eviction churns,
/// and the barrier write-back grew to ~1 s), and slower on `hashmap`, whose heap map
/// gains nothing from a second one in front. With one value state per event (the rule
/// engine's combined value) it is slower at 10k keys too (0.71x). A batch's
/// read-ahead ([`crate::batch`]) gives the reads their batching without it. Turn it
/// on (e.g. [`crate::DEFAULT_CACHE_BYTES`]) for hot keys read many times per epoch.
pub fn default_cache_bytes_for(backend: BackendKind) -> u64 {
    match backend {
        BackendKind::Rocksdb | BackendKind::Hashmap => default_cache_bytes(),
    }
}

impl StoreConfig {
    /// A single instance owning every key group.
    pub fn new(backend: BackendKind, work_dir: impl Into<PathBuf>, max_parallelism: u32) -> Self {
        Self {
            backend,
            work_dir: work_dir.into(),
            max_parallelism,
            aligned_partitions: None,
            key_group_range: KeyGroupRange::all(max_parallelism.max(1)),
            instance_index: 0,
            instance_count: 1,
            cache_bytes: default_cache_bytes_for(backend),
        }
    }

    /// Sets the state cache's capacity in bytes (0: no cache).
    pub fn with_cache_bytes(mut self, bytes: u64) -> Self {
        self.cache_bytes = bytes;
        self
    }

    /// Numbers keys as `key_groups` does (its `max_parallelism` replaces this
    /// config's); call before [`Self::for_instance`].
    pub fn with_key_groups(mut self, key_groups: KeyGroups) -> Self {
        self.max_parallelism = key_groups.max_parallelism();
        self.aligned_partitions = key_groups.aligned_partitions();
        self.key_group_range = KeyGroupRange::all(self.max_parallelism.max(1));
        self
    }

    /// How this store numbers keys into key groups.
    pub fn key_groups(&self) -> Result<KeyGroups> {
        KeyGroups::aligned(self.max_parallelism, self.aligned_partitions.unwrap_or(1))
    }

    /// Instance `index` of `count`, with the standard key-group range (whole
    /// partitions' blocks when the groups are aligned to partitions).
    pub fn for_instance(mut self, index: u32, count: u32) -> Self {
        self.instance_index = index;
        self.instance_count = count;
        self.key_group_range = match self.key_groups() {
            Ok(kgs) if count >= 1 && index < count && kgs.fits_instances(count) => {
                kgs.range_for_instance(count, index)
            }
            // Refused by `StateStore::open`, which checks the same.
            _ => KeyGroupRange::all(self.max_parallelism.max(1)),
        };
        self
    }
}

/// A registered state: its name is its identity, its id a 2-byte storage
/// prefix local to this store (restore remaps ids by name).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateMeta {
    pub id: u16,
    pub name: String,
    pub kind: StateKind,
    pub ttl: Option<TtlConfig>,
    /// The value schema that wrote the stored bytes; `None` in snapshots
    /// written before schemas were recorded.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub schema: Option<SchemaMeta>,
}

pub(crate) struct Inner {
    /// The backend behind the write-back cache (a pass-through when the
    /// cache is off).
    pub backend: CachedBackend,
    pub config: StoreConfig,
    /// `config.key_groups()`, validated at open.
    pub key_groups: KeyGroups,
    pub clock: Arc<dyn Clock>,
    pub states: HashMap<String, Arc<StateMeta>>,
    pub by_id: HashMap<u16, Arc<StateMeta>>,
    pub next_id: u16,
    pub ttl_registry: TtlRegistry,
    pub key: Vec<u8>,
    pub kg: u32,
    pub has_key: bool,
    pub ns: Vec<u8>,
    /// Scratch buffers reused on every access so the hot path does not allocate.
    pub kbuf: Vec<u8>,
    pub vbuf: Vec<u8>,
    pub sbuf: Vec<u8>,
    pub timers: TimerIndex,
    pub operator: SharedOperatorStates,
    pub restored: bool,
    pub incremental: Option<u32>,
    pub cursor: Vec<u8>,
    /// SHA-256 of immutable SST files by name and size: an incremental
    /// snapshot hashes only the new ones.
    pub sha_cache: crate::files::FileHashes,
    pub generation: u64,
    /// JSON decoders by state name, from the descriptor's type at registration
    /// (see [`crate::inspect`]); names survive restores, so decoders do too.
    pub decoders: HashMap<String, crate::codec::JsonCodec>,
    /// Entries (values, list elements, map entries) removed because their TTL
    /// expired, by cleanup on read or incremental cleanup, since open.
    pub ttl_expired: u64,
}

/// The per-instance state store. Cloning shares it.
#[derive(Clone)]
pub struct StateStore {
    pub(crate) inner: Arc<Mutex<Inner>>,
}

pub(crate) fn open_backend(
    config: &StoreConfig,
    generation: u64,
    registry: &TtlRegistry,
    clock: &Arc<dyn Clock>,
) -> Result<Box<dyn KvBackend>> {
    Ok(match config.backend {
        BackendKind::Hashmap => Box::new(HeapBackend::new()),
        BackendKind::Rocksdb => {
            let path = config.work_dir.join(format!("rocksdb-{generation}"));
            if path.exists() {
                std::fs::remove_dir_all(&path).at(&path)?;
            }
            Box::new(RocksBackend::open(&path, registry.clone(), clock.clone())?)
        }
    })
}

impl StateStore {
    /// Opens an empty store with the system clock.
    pub fn open(config: StoreConfig) -> Result<Self> {
        Self::open_with_clock(config, Arc::new(SystemClock))
    }

    /// Opens an empty store; `clock` drives TTL and processing time.
    pub fn open_with_clock(config: StoreConfig, clock: Arc<dyn Clock>) -> Result<Self> {
        let mp = config.max_parallelism;
        let key_groups = config.key_groups()?;
        if !key_groups.fits_instances(config.instance_count) {
            return Err(StateError::Invalid(format!(
                "{} instances exceed the {key_groups}: an instance would own none of them",
                config.instance_count
            )));
        }
        if config.key_group_range.end >= mp {
            return Err(StateError::Invalid(format!(
                "key group range {} exceeds max_parallelism {mp}",
                config.key_group_range
            )));
        }
        if config.instance_count == 0 || config.instance_index >= config.instance_count {
            return Err(StateError::Invalid(
                "instance_index must be < instance_count".into(),
            ));
        }
        std::fs::create_dir_all(&config.work_dir).at(&config.work_dir)?;
        // Live state never survives a restart on its own: clear old backends.
        for entry in std::fs::read_dir(&config.work_dir).at(&config.work_dir)? {
            let entry = entry.at(&config.work_dir)?;
            let name = entry.file_name().to_string_lossy().into_owned();
            if name.starts_with("rocksdb-") || name == "restore-logs" {
                std::fs::remove_dir_all(entry.path()).at(entry.path())?;
            }
        }
        let registry: TtlRegistry = Default::default();
        let mut backend = CachedBackend::new(
            open_backend(&config, 0, &registry, &clock)?,
            config.cache_bytes,
        );
        let sha_cache = crate::files::FileHashes::default();
        backend.hash_ahead(&sha_cache)?;
        Ok(Self {
            inner: Arc::new(Mutex::new(Inner {
                backend,
                config,
                key_groups,
                clock,
                states: HashMap::new(),
                by_id: HashMap::new(),
                next_id: 0,
                ttl_registry: registry,
                key: Vec::new(),
                kg: 0,
                has_key: false,
                ns: Vec::new(),
                kbuf: Vec::with_capacity(64),
                vbuf: Vec::with_capacity(256),
                sbuf: Vec::with_capacity(256),
                timers: TimerIndex::default(),
                operator: SharedOperatorStates::default(),
                restored: false,
                incremental: None,
                cursor: Vec::new(),
                sha_cache,
                generation: 0,
                decoders: HashMap::new(),
                ttl_expired: 0,
            })),
        })
    }

    pub(crate) fn lock(&self) -> MutexGuard<'_, Inner> {
        self.inner.lock()
    }

    pub fn backend_kind(&self) -> BackendKind {
        self.lock().config.backend
    }

    pub fn max_parallelism(&self) -> u32 {
        self.lock().config.max_parallelism
    }

    /// How keys are numbered into key groups (fixed at open).
    pub fn key_groups(&self) -> KeyGroups {
        self.lock().key_groups
    }

    /// The key group of `key`.
    pub fn key_group_of(&self, key: &[u8]) -> u32 {
        self.lock().key_groups.of(key)
    }

    pub fn key_group_range(&self) -> KeyGroupRange {
        self.lock().config.key_group_range
    }

    /// (this instance's index, number of instances): with [`Self::max_parallelism`]
    /// this names the owner of any key group ([`KeyGroupRange::for_instance`]).
    pub fn instance(&self) -> (u32, u32) {
        let g = self.lock();
        (g.config.instance_index, g.config.instance_count)
    }

    /// Whether state came from a snapshot or savepoint (Flink's `isRestored`).
    pub fn is_restored(&self) -> bool {
        self.lock().restored
    }

    /// Scopes keyed state and timers to `key` (the record's key bytes, the
    /// same bytes Kafka partitions on). Returns the key group. Errors if the
    /// key belongs to a key group this instance does not own.
    pub fn set_current_key(&self, key: &[u8]) -> Result<u32> {
        let mut g = self.lock();
        let kg = g.key_groups.of(key);
        if !g.config.key_group_range.contains(kg) {
            return Err(StateError::Invalid(format!(
                "key {} is in key group {kg}, outside this instance's range {}",
                hex::encode(key),
                g.config.key_group_range
            )));
        }
        g.key.clear();
        g.key.extend_from_slice(key);
        g.kg = kg;
        g.has_key = true;
        if let Some(n) = g.incremental {
            g.incremental_cleanup(n)?;
        }
        Ok(kg)
    }

    pub fn current_key(&self) -> Option<Vec<u8>> {
        let g = self.lock();
        g.has_key.then(|| g.key.clone())
    }

    /// Scopes keyed state to a namespace (a window, for instance); the empty
    /// namespace is the default. Stays set until changed.
    pub fn set_current_namespace(&self, ns: &[u8]) {
        let mut g = self.lock();
        g.ns.clear();
        g.ns.extend_from_slice(ns);
    }

    /// Writes the state cache back and makes buffered writes durable enough
    /// for a snapshot (RocksDB memtable flush). [`Self::snapshot`] does this itself.
    pub fn flush(&self) -> Result<()> {
        self.lock().backend.flush()
    }

    /// Runs backend compaction; with RocksDB this applies the TTL compaction filter.
    pub fn compact(&self) -> Result<()> {
        self.lock().backend.compact()
    }

    /// Processing time from the store's clock (TTL and processing-time timers use it).
    pub fn now_ms(&self) -> u64 {
        self.lock().now()
    }

    /// Whether any key of this instance's key-group range holds an entry of the state
    /// `name` (registered or restored; an unknown name holds none). A function that
    /// replaced one state by another uses it once, after a restore, to read the old
    /// state only while it still holds data. One seek per key group.
    pub fn state_has_entries(&self, name: &str) -> Result<bool> {
        let mut g = self.lock();
        let Some(id) = g.states.get(name).map(|m| m.id) else {
            return Ok(false);
        };
        let range = g.config.key_group_range;
        for kg in range.start..=range.end {
            let kg = (kg as u16).to_be_bytes();
            let start = [kg[0], kg[1], (id >> 8) as u8, id as u8];
            let next = id + 1; // ids stay below FIRST_RESERVED_ID
            let end = [kg[0], kg[1], (next >> 8) as u8, next as u8];
            let mut found = false;
            g.backend.scan(&start, &end, &mut |_, _| {
                found = true;
                false
            })?;
            if found {
                return Ok(true);
            }
        }
        Ok(false)
    }

    /// Approximate number of stored entries (RocksDB's estimate).
    pub fn approximate_entries(&self) -> Result<u64> {
        self.lock().backend.approximate_len()
    }

    /// Approximate bytes the live state occupies (RocksDB: SST files plus
    /// memtables; hashmap: stored keys and values).
    pub fn approximate_size_bytes(&self) -> Result<u64> {
        self.lock().backend.approximate_size_bytes()
    }

    /// The state cache's figures: hits, misses, evictions, write-backs since
    /// open, and the bytes and entries it holds now (all zero when it is off).
    pub fn cache_stats(&self) -> CacheStats {
        self.lock().backend.stats()
    }

    /// Entries removed because their TTL expired (cleanup on read and
    /// incremental cleanup) since the store was opened. Entries dropped by the
    /// RocksDB compaction filter or left out of full snapshots are not counted.
    pub fn ttl_expired_total(&self) -> u64 {
        self.lock().ttl_expired
    }

    pub(crate) fn register(
        &self,
        name: &str,
        kind: StateKind,
        ttl: Option<TtlConfig>,
        schema: (SchemaMeta, &crate::schema::Schema),
    ) -> Result<Arc<StateMeta>> {
        self.lock().register(name, kind, ttl, schema)
    }
}

/// Operator and broadcast state ([`crate::operator`] keeps them).
impl StateStore {
    /// Operator list state with even-split redistribution (e.g. a sink's
    /// buffered elements, as in `examples/buffering_sink.rs`).
    pub fn operator_list_state<T: StateValue>(&self, name: &str) -> Result<OperatorListState<T>> {
        operator::list_handle(&self.lock().operator, name, Redistribution::EvenSplit)
    }

    /// Operator list state that every instance receives whole on restore.
    pub fn union_list_state<T: StateValue>(&self, name: &str) -> Result<OperatorListState<T>> {
        operator::list_handle(&self.lock().operator, name, Redistribution::Union)
    }

    /// Whether operator list `name` exists, restored or registered (the handle methods
    /// create it, so they cannot tell an empty list from a missing one).
    pub fn has_operator_list(&self, name: &str) -> bool {
        operator::has_list(&self.lock().operator, name)
    }

    /// The writable broadcast state (broadcast side only).
    pub fn broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> BroadcastState<K, V> {
        operator::broadcast_handle(&self.lock().operator, d)
    }

    /// The read-only view of a broadcast state (keyed side).
    pub fn read_only_broadcast_state<K: StateValue, V: StateValue>(
        &self,
        d: &MapStateDescriptor<K, V>,
    ) -> ReadOnlyBroadcastState<K, V> {
        operator::read_only_broadcast_handle(&self.lock().operator, d)
    }
}

/// Timers of the current key and namespace ([`crate::timers`] keeps them).
impl StateStore {
    /// Registers a timer for the current key and namespace. Registering the
    /// same (time, key, namespace) twice leaves one timer.
    pub fn register_timer(&self, domain: TimeDomain, timestamp: u64) -> Result<()> {
        self.change_timer(domain, timestamp, TimerChange::Register)
    }

    pub fn delete_timer(&self, domain: TimeDomain, timestamp: u64) -> Result<()> {
        self.change_timer(domain, timestamp, TimerChange::Delete)
    }

    fn change_timer(&self, domain: TimeDomain, timestamp: u64, change: TimerChange) -> Result<()> {
        let mut g = self.lock();
        let g = &mut *g;
        if !g.has_key {
            return Err(StateError::NoCurrentKey);
        }
        let at = TimerAt {
            buf: &mut g.kbuf,
            key_group: g.kg,
            key: &g.key,
            namespace: &g.ns,
        };
        g.timers
            .change(&mut g.backend, at, domain, timestamp, change)
    }

    pub fn register_event_time_timer(&self, timestamp: u64) -> Result<()> {
        self.register_timer(TimeDomain::EventTime, timestamp)
    }
    pub fn delete_event_time_timer(&self, timestamp: u64) -> Result<()> {
        self.delete_timer(TimeDomain::EventTime, timestamp)
    }
    pub fn register_processing_time_timer(&self, timestamp: u64) -> Result<()> {
        self.register_timer(TimeDomain::ProcessingTime, timestamp)
    }
    pub fn delete_processing_time_timer(&self, timestamp: u64) -> Result<()> {
        self.delete_timer(TimeDomain::ProcessingTime, timestamp)
    }

    /// The earliest registered timer of `domain`.
    pub fn next_timer(&self, domain: TimeDomain) -> Option<u64> {
        self.lock().timers.next(domain)
    }

    /// Removes and returns every timer with `timestamp <= up_to`, in time
    /// order (ties by key, then namespace). Timers registered while firing
    /// are returned by the next call.
    pub fn pop_due_timers(&self, domain: TimeDomain, up_to: u64) -> Result<Vec<Timer>> {
        let mut g = self.lock();
        let g = &mut *g;
        g.timers
            .pop_due(&mut g.backend, &mut g.kbuf, g.key_groups, domain, up_to)
    }

    /// Number of registered timers of `domain`.
    pub fn timer_count(&self, domain: TimeDomain) -> usize {
        self.lock().timers.count(domain)
    }
}

impl Inner {
    /// Reloads the timer index from the backend (after a restore).
    pub(crate) fn rebuild_timer_index(&mut self) -> Result<()> {
        self.timers = TimerIndex::load(&mut self.backend, self.config.key_group_range)?;
        Ok(())
    }

    #[inline]
    pub fn now(&self) -> u64 {
        self.clock.now_ms()
    }

    pub fn register(
        &mut self,
        name: &str,
        kind: StateKind,
        ttl: Option<TtlConfig>,
        schema: (SchemaMeta, &crate::schema::Schema),
    ) -> Result<Arc<StateMeta>> {
        let (schema_meta, spec) = schema;
        if let Some(existing) = self.states.get(name).cloned() {
            if existing.kind != kind {
                return Err(StateError::KindMismatch {
                    name: name.into(),
                    existing: existing.kind.to_string(),
                    requested: kind.to_string(),
                });
            }
            // Stored values carry a timestamp prefix only when TTL is on, so
            // switching TTL on or off would misread every stored value.
            if existing.ttl.is_some() != ttl.is_some() {
                return Err(StateError::Incompatible(format!(
                    "state '{name}': TTL cannot be turned on or off for existing state"
                )));
            }
            let migrates_from: Vec<u32> = spec.migrations.keys().copied().collect();
            match crate::schema::compare(existing.schema.as_ref(), &schema_meta, &migrates_from) {
                SchemaChange::Keep => {}
                SchemaChange::Migrate { from, .. } => {
                    let f = spec.migrations[&from].clone();
                    self.migrate_values(&existing, &f)?;
                }
                SchemaChange::Incompatible(reason) => {
                    return Err(StateError::Incompatible(format!(
                        "state '{name}': {reason}"
                    )));
                }
            }
            if existing.ttl == ttl && existing.schema.as_ref() == Some(&schema_meta) {
                return Ok(existing);
            }
            let meta = Arc::new(StateMeta {
                id: existing.id,
                name: name.into(),
                kind,
                ttl,
                schema: Some(schema_meta),
            });
            self.install(meta.clone());
            return Ok(meta);
        }
        if self.next_id >= FIRST_RESERVED_ID {
            return Err(StateError::Invalid("too many states".into()));
        }
        let meta = Arc::new(StateMeta {
            id: self.next_id,
            name: name.into(),
            kind,
            ttl,
            schema: Some(schema_meta),
        });
        self.next_id += 1;
        self.install(meta.clone());
        Ok(meta)
    }

    /// Rewrites every stored value of `meta`'s state with `f` (a schema
    /// migration), keeping TTL timestamps and list framing.
    fn migrate_values(&mut self, meta: &StateMeta, f: &MigrateFn) -> Result<()> {
        let (start, end) = layout::key_group_bounds(
            self.config.key_group_range.start,
            self.config.key_group_range.end,
        );
        let mut found: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        let id = meta.id.to_be_bytes();
        self.backend.scan(&start, &end, &mut |k, v| {
            if k[2..4] == id {
                found.push((k.to_vec(), v.to_vec()));
            }
            true
        })?;
        let has_ttl = meta.ttl.is_some();
        let mut out = Vec::with_capacity(found.len());
        for (k, v) in found {
            let parts = ttl::split_value(meta.kind.into(), has_ttl, &v)?;
            let mut migrated = Vec::with_capacity(parts.len());
            for (ts, payload) in parts {
                let nv = f(payload).map_err(|message| StateError::Serde {
                    state: meta.name.clone(),
                    message: format!("migration: {message}"),
                })?;
                migrated.push((ts, nv));
            }
            out.push((k, ttl::join_value(meta.kind.into(), &migrated)));
        }
        self.backend.put_many(&out)
    }

    pub fn install(&mut self, meta: Arc<StateMeta>) {
        self.next_id = self.next_id.max(meta.id + 1);
        {
            let mut reg = self.ttl_registry.write();
            match &meta.ttl {
                Some(t) => {
                    reg.insert(meta.id, (meta.kind.into(), t.clone()));
                }
                None => {
                    reg.remove(&meta.id);
                }
            }
        }
        self.states.insert(meta.name.clone(), meta.clone());
        self.by_id.insert(meta.id, meta);
        self.incremental = self
            .states
            .values()
            .filter_map(|m| m.ttl.as_ref()?.cleanup.incremental)
            .max();
    }

    /// Writes `[kg][id][key][ns]` into `kbuf`.
    #[inline]
    pub fn prefix(&mut self, id: u16) -> Result<()> {
        if !self.has_key {
            return Err(StateError::NoCurrentKey);
        }
        layout::encode_prefix(&mut self.kbuf, self.kg, id, &self.key, &self.ns);
        Ok(())
    }

    /// Reads the single value at `kbuf`, applying TTL. Returns the offset of
    /// the payload in `vbuf`. `for_update` reads ignore visibility: an
    /// expired value never feeds a reduce or aggregate.
    pub fn get_entry(&mut self, meta: &StateMeta, for_update: bool) -> Result<Option<usize>> {
        if !self.backend.get(&self.kbuf, &mut self.vbuf)? {
            return Ok(None);
        }
        self.entry_in_vbuf(meta, for_update)
    }

    /// [`Inner::get_entry`] for a value already read into `vbuf`.
    pub(crate) fn entry_in_vbuf(
        &mut self,
        meta: &StateMeta,
        for_update: bool,
    ) -> Result<Option<usize>> {
        let Some(ttl) = &meta.ttl else {
            return Ok(Some(0));
        };
        let ts = read_ts(&self.vbuf).ok_or_else(|| {
            StateError::Invalid(format!(
                "state '{}': value without TTL timestamp",
                meta.name
            ))
        })?;
        let now = self.clock.now_ms();
        match ttl.on_read(ts, now, for_update) {
            OnRead::Expired { visible } => {
                self.backend.delete(&self.kbuf)?;
                self.ttl_expired += 1;
                Ok(visible.then_some(TS_LEN))
            }
            OnRead::Live { refresh } => {
                if refresh {
                    self.vbuf[..TS_LEN].copy_from_slice(&now.to_le_bytes());
                    self.backend.put(&self.kbuf, &self.vbuf)?;
                }
                Ok(Some(TS_LEN))
            }
        }
    }

    /// Writes `value` at `kbuf` (with a fresh TTL timestamp).
    pub fn put_entry<T: Serialize + ?Sized>(&mut self, meta: &StateMeta, value: &T) -> Result<()> {
        self.vbuf.clear();
        if meta.ttl.is_some() {
            let now = self.clock.now_ms();
            self.vbuf.extend_from_slice(&now.to_le_bytes());
        }
        ser_append(&mut self.vbuf, value, &meta.name)?;
        self.backend.put(&self.kbuf, &self.vbuf)
    }

    /// Frames one list element (timestamp + payload) into `sbuf`.
    pub fn frame_element<T: Serialize>(
        &mut self,
        meta: &StateMeta,
        value: &T,
        now: u64,
    ) -> Result<()> {
        self.vbuf.clear();
        if meta.ttl.is_some() {
            self.vbuf.extend_from_slice(&now.to_le_bytes());
        }
        ser_append(&mut self.vbuf, value, &meta.name)?;
        layout::append_list_element(&mut self.sbuf, &self.vbuf);
        Ok(())
    }

    /// Reads a list at `kbuf`, applying per-element TTL and cleanup on read.
    /// Returns the visible elements' payloads.
    pub fn get_list(&mut self, meta: &StateMeta) -> Result<Vec<Vec<u8>>> {
        if !self.backend.get(&self.kbuf, &mut self.vbuf)? {
            return Ok(Vec::new());
        }
        let elems = layout::list_elements(&self.vbuf)?;
        let Some(ttl) = &meta.ttl else {
            return Ok(elems.into_iter().map(|e| e.to_vec()).collect());
        };
        let now = self.clock.now_ms();
        let mut out = Vec::with_capacity(elems.len());
        let mut keep: Vec<&[u8]> = Vec::with_capacity(elems.len());
        let (mut changed, mut refresh) = (false, false);
        for e in elems {
            let ts = read_ts(e).ok_or_else(|| {
                StateError::Invalid(format!(
                    "state '{}': list element without timestamp",
                    meta.name
                ))
            })?;
            match ttl.on_read(ts, now, false) {
                OnRead::Expired { visible } => {
                    changed = true;
                    self.ttl_expired += 1;
                    if visible {
                        out.push(e[TS_LEN..].to_vec());
                    }
                }
                OnRead::Live { refresh: r } => {
                    refresh |= r;
                    out.push(e[TS_LEN..].to_vec());
                    keep.push(e);
                }
            }
        }
        if changed || refresh {
            let mut rewritten = Vec::with_capacity(self.vbuf.len());
            for e in keep.iter() {
                if refresh {
                    let mut el = Vec::with_capacity(e.len());
                    el.extend_from_slice(&now.to_le_bytes());
                    el.extend_from_slice(&e[TS_LEN..]);
                    layout::append_list_element(&mut rewritten, &el);
                } else {
                    layout::append_list_element(&mut rewritten, e);
                }
            }
            if keep.is_empty() {
                self.backend.delete(&self.kbuf)?;
            } else {
                self.backend.put(&self.kbuf, &rewritten)?;
            }
        }
        Ok(out)
    }

    /// Deletes every entry under the prefix in `kbuf` (map state clear).
    pub fn delete_prefix(&mut self) -> Result<()> {
        let end = layout::prefix_end(&self.kbuf);
        let mut keys = Vec::new();
        self.backend.scan(&self.kbuf, &end, &mut |k, _| {
            keys.push(k.to_vec());
            true
        })?;
        for k in keys {
            self.backend.delete(&k)?;
        }
        Ok(())
    }

    /// Visits up to `n` stored entries after the cursor and drops the
    /// expired ones of states with incremental cleanup (wrapping around).
    pub fn incremental_cleanup(&mut self, n: u32) -> Result<()> {
        let (start, end) = layout::key_group_bounds(
            self.config.key_group_range.start,
            self.config.key_group_range.end,
        );
        let from = if self.cursor.is_empty() || self.cursor < start {
            start.clone()
        } else {
            self.cursor.clone()
        };
        let mut seen: Vec<(Vec<u8>, Vec<u8>)> = Vec::new();
        self.backend.scan(&from, &end, &mut |k, v| {
            seen.push((k.to_vec(), v.to_vec()));
            seen.len() < n as usize
        })?;
        self.cursor = match seen.last() {
            Some((k, _)) if seen.len() >= n as usize => {
                let mut c = k.clone();
                c.push(0);
                c
            }
            _ => Vec::new(),
        };
        let now = self.clock.now_ms();
        for (k, v) in seen {
            let id = u16::from_be_bytes([k[2], k[3]]);
            let Some(meta) = self.by_id.get(&id).cloned() else {
                continue;
            };
            let Some(ttl) = &meta.ttl else { continue };
            if ttl.cleanup.incremental.is_none() {
                continue;
            }
            match ttl::expire(meta.kind.into(), ttl, &v, now)? {
                Expiry::Keep => {}
                Expiry::Remove => {
                    self.backend.delete(&k)?;
                    self.ttl_expired += 1;
                }
                Expiry::Rewrite(nv) => {
                    self.backend.put(&k, &nv)?;
                    self.ttl_expired += 1;
                }
            }
        }
        Ok(())
    }
}
