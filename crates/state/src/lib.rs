//! # Layout
//!
//! Flink's state model for one streamstate instance. The runtime owns one
//! [`StateStore`] per instance; user functions hold typed handles.
//!
//! | module | concept |
//! |---|---|
//! | [`keygroup`] | key groups = Kafka's default partitioner; [`KeyGroupRange`] per instance |
//! | [`store`] | [`StateStore`]: backend, current key/namespace, state registry |
//! | [`descriptor`] | state descriptors: name, type, default, TTL |
//! | [`kind`] | [`StateKind`]: value, list, map, reducing, aggregating |
//! | [`keyed`] | typed keyed state: value, list, map, reducing, aggregating |
//! | `kept` | values the `hashmap` backend keeps as objects, and the typed reads and writes of them |
//! | [`ttl`] | TTL config, and every expiry decision: what a read sees, what cleanup drops |
//! | [`inspect`] | one key's state as JSON (admin state lookup), decoders per state |
//! | [`timers`] | event/processing-time timers per key and namespace |
//! | [`operator`] | operator list/union state, broadcast state (read-only vs writable types) |
//! | [`snapshot`] | snapshots (checksummed), their [`SnapshotIdentity`], restore with rescale, canonical savepoints |
//! | [`backend`] | the engine trait and its `hashmap` and `rocksdb` implementations |
//! | [`codec`] | how values are stored (postcard) and shown (JSON) |
//! | [`cache`] | the write-back state cache in front of the backend, flushed at the barrier |
//! | [`batch`] | a batch of records: the state its events will read, named before they run |
//! | `ahead` | a batch's read-ahead (one batched MultiGet) and its writes, held until it ends |
//! | [`schema`] | value schema fingerprints/versions per state, migrations |
//! | [`files`] | a snapshot's files: listing (size, SHA-256), verification, the SST hash cache |
//! | [`offline`] | snapshots without a running job: read, verify, scan, rebuild (checkpoint tools) |
//! | [`layout`] | the byte layout every backend and the savepoint format share |
//! | [`clock`] | injectable processing time |
//! | [`error`] | [`StateError`] |
//!
//! ## How the runtime uses it
//!
//! ```no_run
//! use streamstate_state::*;
//! # fn main() -> Result<()> {
//! let config = StoreConfig::new(BackendKind::Rocksdb, "/var/lib/streamstate/state", 128).for_instance(0, 1);
//! let store = StateStore::open(config)?;
//! let count = store.value_state(&ValueStateDescriptor::<u64>::new("count").with_default(0))?;
//! for key in [b"user-1".as_slice(), b"user-2"] {
//!     store.set_current_key(key)?;
//!     let n = count.value()?.unwrap_or(0) + 1;
//!     count.update(&n)?;
//! }
//! let result = store.snapshot(1, std::path::Path::new("/tmp/chk-1"))?; // files + SHA-256
//! store.restore(&[("/tmp/chk-1".into(), result)])?;
//! # Ok(()) }
//! ```
//!
//! ## Integration points (what the runtime calls)
//!
//! - [`KeyGroups`]: how keys are numbered into `max_parallelism` key groups,
//!   aligned to the input's partitions (a key's group lies in the block of the
//!   partition Kafka's default partitioner sends it to) or modulo
//!   ([`key_group_for`]); [`KeyGroups::range_for_instance`]`(n, i)` gives
//!   instance `i` of `n` whole partitions' blocks. [`StoreConfig::with_key_groups`]
//!   sets it; every snapshot records it and restore refuses another numbering.
//! - [`StateStore::open_with_clock`]`(StoreConfig, Arc<dyn Clock>)`; config:
//!   backend (`"hashmap" | "rocksdb"` parse into [`BackendKind`]), work dir
//!   (wiped), max parallelism, key-group range, instance index/count.
//! - Per record: [`StateStore::set_current_key`]`(&[u8])` (errors for a key
//!   outside the range), optional [`StateStore::set_current_namespace`], then
//!   cached handles ([`ValueState`], [`ListState`], [`MapState`], …). One
//!   mutex per store; handles are `Clone + Send + Sync`; no allocation on a
//!   value get/update of an existing key.
//! - Timers: `register_*_timer` / `delete_*_timer` for the current key and
//!   namespace; the runtime drains [`StateStore::pop_due_timers`]`(domain,
//!   watermark_or_now)` (time order) and sets each timer's key before
//!   calling `on_timer`.
//! - Operator state: [`StateStore::operator_list_state`],
//!   [`StateStore::union_list_state`]; broadcast: [`StateStore::broadcast_state`]
//!   (writable) vs [`StateStore::read_only_broadcast_state`]. Which side of a
//!   function gets which is the runtime's API (`streamstate::function`: its
//!   keyed context hands out only the read-only type), not this crate's. The
//!   runtime keeps its source's partition offsets in two union lists
//!   (`streamstate.source_offsets`, `streamstate.control_offsets`), so every
//!   instance of a rescaled job receives all of them.
//! - [`StateStore::snapshot`]`(checkpoint_id, dir) -> SnapshotResult` (files
//!   with relative path, size, SHA-256, and the part's [`SnapshotIdentity`]:
//!   checkpoint id, max parallelism, key-group range, instance;
//!   serde-serializable for the manifest).
//!   RocksDB SST names are stable (immutable files) but only unique within
//!   one restore generation: deduplicate by (name, SHA-256).
//! - [`StateStore::restore`]`(&[(dir, SnapshotResult)])`: pass every part of
//!   the checkpoint; checksums are verified first, keyed state is filtered to
//!   this store's range (rescale), operator state redistributed.
//! - [`StateStore::write_savepoint`] / [`StateStore::restore_savepoint`]: the
//!   canonical, backend-neutral format (see [`snapshot`]).
//! - [`StateStore::flush`] before handing files over is done by `snapshot`
//!   itself; [`StateStore::compact`] runs the TTL compaction filter.
//!
//! Values are encoded with postcard 1.x (stable, documented wire format);
//! storage keys put the key group first so a key-group range is one
//! contiguous scan; see [`layout`] and [`snapshot`] for the on-disk formats.

mod ahead;
pub mod backend;
pub mod batch;
pub mod cache;
pub mod clock;
pub mod codec;
pub mod descriptor;
pub mod error;
pub mod files;
pub mod inspect;
mod kept;
pub mod keyed;
pub mod keygroup;
pub mod kind;
pub mod layout;
pub mod offline;
pub mod operator;
pub mod schema;
pub mod snapshot;
pub mod store;
pub mod timers;
pub mod ttl;

pub use backend::BackendKind;
pub use batch::Prefetch;
pub use cache::{CacheStats, DEFAULT_CACHE_BYTES};
pub use clock::{Clock, ManualClock, SystemClock};
pub use codec::StateValue;
pub use descriptor::*;
pub use error::{Result, StateError};
pub use keyed::{AggregatingState, ListState, MapState, ReducingState, ValueState};
pub use keygroup::{KeyGroupRange, KeyGroups, key_group_for, murmur2};
pub use operator::{BroadcastState, OperatorListState, ReadOnlyBroadcastState, Redistribution};
pub use schema::{Schema, SchemaChange, SchemaMeta, StateDeclaration};
pub use snapshot::{
    DeferredSnapshot, KeyedFormat, PartMeta, SnapshotFile, SnapshotIdentity, SnapshotResult,
};
pub use store::{StateMeta, StateStore, StoreConfig, default_cache_bytes_for};
pub use timers::{TimeDomain, Timer};
pub use ttl::{CleanupStrategies, StateVisibility, TtlConfig, UpdateType};
