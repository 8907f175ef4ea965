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
//! | [`keyed`] | typed keyed state: value, list, map, reducing, aggregating |
//! | [`ttl`] | TTL config: update type, visibility, cleanup strategies |
//! | [`timers`] | event/processing-time timers per key and namespace |
//! | [`operator`] | operator list/union state, broadcast state (read-only vs writable types) |
//! | [`context`] | keyed vs broadcast side capabilities |
//! | [`checkpointed`] | `CheckpointedFunction` hooks |
//! | [`snapshot`] | snapshots (checksummed), restore with rescale, canonical savepoints |
//! | [`backend`] | the engine trait and its `hashmap` and `rocksdb` implementations |
//! | `layout` | the byte layout every backend and the savepoint format share |
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
//! Values are encoded with postcard 1.x (stable, documented wire format);
//! storage keys put the key group first so a key-group range is one
//! contiguous scan; see `layout` and [`snapshot`] for the on-disk formats.

pub mod backend;
pub mod checkpointed;
pub mod clock;
pub mod context;
pub mod descriptor;
pub mod error;
pub mod keyed;
pub mod keygroup;
mod layout;
pub mod operator;
pub mod snapshot;
pub mod store;
pub mod timers;
pub mod ttl;

pub use backend::BackendKind;
pub use checkpointed::{CheckpointedFunction, FunctionInitializationContext, FunctionSnapshotContext};
pub use clock::{Clock, ManualClock, SystemClock};
pub use context::{BroadcastContext, KeyedContext};
pub use descriptor::*;
pub use error::{Result, StateError};
pub use keyed::{AggregatingState, ListState, MapState, ReducingState, StateValue, ValueState};
pub use keygroup::{KeyGroupRange, key_group_for, murmur2};
pub use operator::{BroadcastState, OperatorListState, ReadOnlyBroadcastState, Redistribution};
pub use snapshot::{KeyedFormat, SnapshotFile, SnapshotResult};
pub use store::{StateStore, StoreConfig};
pub use timers::{TimeDomain, Timer};
pub use ttl::{CleanupStrategies, StateVisibility, TtlConfig, UpdateType};
