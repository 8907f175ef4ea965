#![allow(dead_code)]
//! Test helpers shared by the integration tests.

use std::path::{Path, PathBuf};
use std::sync::Arc;

use streamstate_state::*;

/// Runs each named generic test fn `fn(BackendKind)` once per backend, so the
/// same suite defines "works" for hashmap and rocksdb alike.
#[macro_export]
macro_rules! on_every_backend {
    ($($name:ident),* $(,)?) => {
        mod hashmap { $( #[test] fn $name() { super::$name(streamstate_state::BackendKind::Hashmap) } )* }
        mod rocksdb { $( #[test] fn $name() { super::$name(streamstate_state::BackendKind::Rocksdb) } )* }
    };
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
        let cfg = StoreConfig::new(kind, self.path(name), mp).for_instance(index, count);
        StateStore::open_with_clock(cfg, Arc::new(self.clock.clone())).expect("open store")
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
