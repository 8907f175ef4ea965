#![allow(dead_code)]
//! Test helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use streamstate_state::*;

/// Runs each named generic test fn `fn(BackendKind)` once per backend and
/// state-cache setting ([`CacheMode`]), so the same suite defines "works" for
/// hashmap and rocksdb alike, with the write-back cache off, on, and so small
/// that nearly every write evicts.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        $crate::on_every_backend!(@backend hashmap, Hashmap; $($name),*);
        $crate::on_every_backend!(@backend rocksdb, Rocksdb; $($name),*);
    };
    (@backend $module:ident, $kind:ident; $($name:ident),*) => {
        mod $module {
            $crate::on_every_backend!(@cache cache_off, Off, $kind; $($name),*);
            $crate::on_every_backend!(@cache cache_on, On, $kind; $($name),*);
            $crate::on_every_backend!(@cache cache_tiny, Tiny, $kind; $($name),*);
            $crate::on_every_backend!(@cache batch_open, Batched, $kind; $($name),*);
        }
    };
    (@cache $module:ident, $mode:ident, $kind:ident; $($name:ident),*) => {
        mod $module {
            $(
                #[test]
                fn $name() {
                    $crate::common::with_cache($crate::common::CacheMode::$mode, || {
                        $crate::$name(streamstate_state::BackendKind::$kind)
                    })
                }
            )*
        }
    };
}

/// The state-cache setting stores opened through [`Env`] get.
#[derive(Debug, Clone, Copy, PartialEq, Eq)]
pub enum CacheMode {
    /// `cache_bytes = 0`: every access goes to the backend.
    Off,
    /// The default capacity.
    On,
    /// [`TINY_CACHE_BYTES`]: almost every write evicts (write-back on eviction).
    Tiny,
    /// `cache_bytes = 0` with a batch of records open from the start and never ended:
    /// on RocksDB every write is held until a read the batch cannot answer, a scan or a
    /// snapshot applies them (`crate::ahead`); the hashmap backend holds nothing.
    Batched,
}

/// A few entries' worth: eviction and its write-back run all the time.
pub const TINY_CACHE_BYTES: u64 = 300;

impl CacheMode {
    pub const ALL: [CacheMode; 4] = [
        CacheMode::Off,
        CacheMode::On,
        CacheMode::Tiny,
        CacheMode::Batched,
    ];
    pub fn bytes(self) -> u64 {
        match self {
            CacheMode::Off | CacheMode::Batched => 0,
            CacheMode::On => DEFAULT_CACHE_BYTES,
            CacheMode::Tiny => TINY_CACHE_BYTES,
        }
    }
}

thread_local! {
    static CACHE_MODE: std::cell::Cell<CacheMode> = const { std::cell::Cell::new(CacheMode::On) };
}

/// Runs `f` with stores opened through [`Env`] on this thread using `mode`
/// (each `#[test]` runs on its own thread).
pub fn with_cache<R>(mode: CacheMode, f: impl FnOnce() -> R) -> R {
    let _guard = CacheGuard::set(mode);
    f()
}

/// Sets this thread's cache mode until dropped.
pub struct CacheGuard(CacheMode);

impl CacheGuard {
    pub fn set(mode: CacheMode) -> Self {
        Self(CACHE_MODE.with(|m| m.replace(mode)))
    }
}

impl Drop for CacheGuard {
    fn drop(&mut self) {
        CACHE_MODE.with(|m| m.set(self.0));
    }
}

/// Every (cache mode, backend) pair, for tests that loop instead of using
/// [`on_every_backend!`].
pub fn every_setup() -> Vec<(CacheMode, BackendKind)> {
    CacheMode::ALL
        .into_iter()
        .flat_map(|m| [(m, BackendKind::Hashmap), (m, BackendKind::Rocksdb)])
        .collect()
}

pub fn cache_mode() -> CacheMode {
    CACHE_MODE.with(|m| m.get())
}

pub struct Env {
    pub dir: tempfile::TempDir,
    pub clock: ManualClock,
}

impl Env {
    pub fn new() -> Self {
        Self {
            dir: tempfile::tempdir().expect("tempdir"),
            clock: ManualClock::new(1_000_000),
        }
    }
    pub fn path(&self, name: &str) -> PathBuf {
        self.dir.path().join(name)
    }
    pub fn open(
        &self,
        kind: BackendKind,
        name: &str,
        mp: u32,
        index: u32,
        count: u32,
    ) -> StateStore {
        self.open_numbered(kind, name, KeyGroups::modulo(mp), index, count)
            .expect("open store")
    }
    /// [`Self::open`] with keys numbered by `key_groups`; the error when it refuses.
    pub fn open_numbered(
        &self,
        kind: BackendKind,
        name: &str,
        key_groups: KeyGroups,
        index: u32,
        count: u32,
    ) -> Result<StateStore> {
        let cfg = StoreConfig::new(kind, self.path(name), key_groups.max_parallelism())
            .with_key_groups(key_groups)
            .for_instance(index, count)
            .with_cache_bytes(cache_mode().bytes());
        let store = StateStore::open_with_clock(cfg, Arc::new(self.clock.clone()))?;
        if cache_mode() == CacheMode::Batched {
            store.begin_batch()?;
        }
        Ok(store)
    }
    pub fn single(&self, kind: BackendKind, name: &str) -> StateStore {
        self.open(kind, name, 128, 0, 1)
    }
}

pub fn snapshot_to(store: &StateStore, id: u64, dir: &Path) -> (PathBuf, SnapshotResult) {
    let r = store.snapshot(id, dir).expect("snapshot");
    (dir.to_path_buf(), r)
}

pub fn key(i: u64) -> Vec<u8> {
    format!("key-{i}").into_bytes()
}
