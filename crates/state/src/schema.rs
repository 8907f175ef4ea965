//! Value schemas: every registered state records, in every snapshot, which
//! value type wrote its bytes (a fingerprint of the type's name) and a schema
//! version the job bumps when the type's serialized layout changes.
//!
//! postcard is not self-describing, so old bytes can only be read by code that
//! knows the old layout. The design is the smallest sound one:
//!
//! - A descriptor carries a [`Schema`]: `version` (default 1) and migrations,
//!   each `from_version → fn(old payload bytes) -> new payload bytes`.
//! - The snapshot records [`SchemaMeta`] (`version`, `fingerprint`,
//!   `value_type`) per state (`state-meta.json`, `#[serde(default)]`, so
//!   snapshots written before this existed still load and count as "unknown").
//! - When a restored state is registered with a different schema:
//!   same version and fingerprint → keep; older stored version with a
//!   migration from it → every stored value of the state is rewritten once
//!   (TTL timestamps and list framing kept), then the state carries the new
//!   schema; anything else → [`crate::StateError::Incompatible`] naming the
//!   state. `streamstate check-restore` applies the same rule offline
//!   ([`compare`]) so an incompatible change fails before an upgrade.
//!
//! The fingerprint is SHA-256 of `std::any::type_name` (for maps, of
//! `map<K, V>`): it catches a changed or renamed type, not a field added to
//! a type that keeps its name. Changing a type's layout therefore requires a
//! version bump; that is the contract the docs state.

use std::collections::BTreeMap;
use std::sync::Arc;

use serde::de::DeserializeOwned;
use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::kind::StateKind;
use crate::ttl::TtlConfig;

/// What a snapshot records about the value type of one state.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SchemaMeta {
    pub version: u32,
    /// Hex SHA-256 (first 16 bytes) of `value_type`.
    pub fingerprint: String,
    /// `std::any::type_name` of the stored value (for maps `map<K, V>`).
    pub value_type: String,
}

impl SchemaMeta {
    pub fn new(value_type: &str, version: u32) -> Self {
        let h = Sha256::digest(value_type.as_bytes());
        Self {
            version,
            fingerprint: hex::encode(&h[..16]),
            value_type: value_type.to_string(),
        }
    }
}

/// Rewrites one stored payload (postcard bytes, without TTL timestamp) from an
/// old schema version into the current one.
pub type MigrateFn = Arc<dyn Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync>;

/// A descriptor's schema: version plus migrations from older versions.
#[derive(Clone)]
pub struct Schema {
    pub version: u32,
    pub migrations: BTreeMap<u32, MigrateFn>,
}

impl Default for Schema {
    fn default() -> Self {
        Self {
            version: 1,
            migrations: BTreeMap::new(),
        }
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema")
            .field("version", &self.version)
            .field("migrates_from", &self.migrations.keys().collect::<Vec<_>>())
            .finish()
    }
}

impl Schema {
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.migrations.insert(from_version, Arc::new(f));
        self
    }
    /// A typed migration: decode `Old`, convert, encode `New`.
    pub fn with_serde_migration<Old: DeserializeOwned, New: Serialize>(
        self,
        from_version: u32,
        convert: impl Fn(Old) -> New + Send + Sync + 'static,
    ) -> Self {
        self.with_migration(from_version, move |bytes| {
            let old: Old =
                postcard::from_bytes(bytes).map_err(|e| format!("decode v{from_version}: {e}"))?;
            postcard::to_allocvec(&convert(old)).map_err(|e| e.to_string())
        })
    }
}

/// A state as the current job would register it, known without running the
/// job: what `check-restore` compares a snapshot against.
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct StateDeclaration {
    pub name: String,
    pub kind: StateKind,
    pub ttl: Option<TtlConfig>,
    pub schema: SchemaMeta,
    /// Versions this job can migrate from.
    pub migrates_from: Vec<u32>,
}

impl StateDeclaration {
    pub fn new(
        name: &str,
        kind: StateKind,
        ttl: Option<TtlConfig>,
        value_type: &str,
        schema: &Schema,
    ) -> Self {
        Self {
            name: name.to_string(),
            kind,
            ttl,
            schema: SchemaMeta::new(value_type, schema.version),
            migrates_from: schema.migrations.keys().copied().collect(),
        }
    }
}

/// What registering a state with `new` does to a restored state stored with `old`.
#[derive(Debug, Clone, PartialEq, Eq)]
pub enum SchemaChange {
    /// Same schema (or none recorded: a snapshot older than schemas).
    Keep,
    /// Values are rewritten from `from` to `to` by the job's migration.
    Migrate { from: u32, to: u32 },
    /// The restore would fail; the reason names both schemas.
    Incompatible(String),
}

/// The one rule the store (at registration) and `check-restore` (offline) share.
pub fn compare(old: Option<&SchemaMeta>, new: &SchemaMeta, migrates_from: &[u32]) -> SchemaChange {
    let Some(old) = old else {
        return SchemaChange::Keep;
    };
    if old.version == new.version && old.fingerprint == new.fingerprint {
        return SchemaChange::Keep;
    }
    if old.version < new.version && migrates_from.contains(&old.version) {
        return SchemaChange::Migrate {
            from: old.version,
            to: new.version,
        };
    }
    if old.version == new.version {
        return SchemaChange::Incompatible(format!(
            "value type changed from {} to {} at schema version {} without a version bump and migration",
            old.value_type, new.value_type, new.version
        ));
    }
    SchemaChange::Incompatible(format!(
        "stored schema version {} ({}) cannot become version {} ({}): the job declares no migration from version {}",
        old.version, old.value_type, new.version, new.value_type, old.version
    ))
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;
    use std::time::Duration;

    use serde::{Deserialize, Serialize};

    use crate::*;

    #[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
    struct CountV2 {
        n: u64,
        last_seen: Option<u64>,
    }

    fn v2() -> ValueStateDescriptor<CountV2> {
        let mut d = ValueStateDescriptor::<CountV2>::new("count").with_schema_version(2);
        d.schema = d
            .schema
            .with_serde_migration::<u64, CountV2>(1, |n| CountV2 { n, last_seen: None });
        d
    }

    fn v1_snapshot(
        dir: &std::path::Path,
        backend: BackendKind,
    ) -> (std::path::PathBuf, SnapshotResult) {
        let clock = ManualClock::new(1_000);
        let store = StateStore::open_with_clock(
            StoreConfig::new(backend, dir.join("a"), 8),
            Arc::new(clock),
        )
        .unwrap();
        let c = store
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        let t = store
            .list_state(
                &ListStateDescriptor::<u32>::new("seen")
                    .with_ttl(TtlConfig::new(Duration::from_secs(10))),
            )
            .unwrap();
        for i in 0..50u64 {
            store.set_current_key(format!("k{i}").as_bytes()).unwrap();
            c.update(&i).unwrap();
            t.add(&(i as u32)).unwrap();
        }
        let out = dir.join("snap");
        let r = store.snapshot(1, &out).unwrap();
        (out, r)
    }

    fn restored(
        dir: &std::path::Path,
        snap: &(std::path::PathBuf, SnapshotResult),
        clock: &ManualClock,
    ) -> StateStore {
        let store = StateStore::open_with_clock(
            StoreConfig::new(BackendKind::Rocksdb, dir, 8),
            Arc::new(clock.clone()),
        )
        .unwrap();
        store.restore(std::slice::from_ref(snap)).unwrap();
        store
    }

    #[test]
    fn snapshots_record_schemas_and_a_migration_rewrites_old_values_once() {
        for backend in [BackendKind::Rocksdb, BackendKind::Hashmap] {
            let dir = tempfile::tempdir().unwrap();
            let snap = v1_snapshot(dir.path(), backend);
            let meta = crate::offline::RawSnapshot::read_meta(&snap.0).unwrap();
            let count = meta.part.states.iter().find(|s| s.name == "count").unwrap();
            assert_eq!(count.schema, Some(SchemaMeta::new("u64", 1)));
            let clock = ManualClock::new(2_000);
            let store = restored(&dir.path().join("b"), &snap, &clock);
            let c = store.value_state(&v2()).unwrap();
            // TTL'd list with a bumped version and an element migration u32 -> u64.
            let mut ld = ListStateDescriptor::<u64>::new("seen")
                .with_ttl(TtlConfig::new(Duration::from_secs(10)))
                .with_schema_version(2);
            ld.schema = ld
                .schema
                .with_serde_migration::<u32, u64>(1, |x| x as u64 * 10);
            let l = store.list_state(&ld).unwrap();
            for i in 0..50u64 {
                store.set_current_key(format!("k{i}").as_bytes()).unwrap();
                assert_eq!(
                    c.value().unwrap(),
                    Some(CountV2 {
                        n: i,
                        last_seen: None
                    })
                );
                assert_eq!(l.get().unwrap(), vec![i * 10]);
            }
            // TTL timestamps were kept: written at 1_000, expired at 11_000.
            clock.set(11_000);
            store.set_current_key(b"k3").unwrap();
            assert!(l.get().unwrap().is_empty());
            // Registering again (a second open) does not migrate twice.
            let c2 = store.value_state(&v2()).unwrap();
            store.set_current_key(b"k4").unwrap();
            assert_eq!(
                c2.value().unwrap(),
                Some(CountV2 {
                    n: 4,
                    last_seen: None
                })
            );
            // The next snapshot records version 2.
            store.snapshot(2, &dir.path().join("snap2")).unwrap();
            let meta = crate::offline::RawSnapshot::read_meta(&dir.path().join("snap2")).unwrap();
            let count = meta.part.states.iter().find(|s| s.name == "count").unwrap();
            assert_eq!(count.schema.as_ref().map(|s| s.version), Some(2));
        }
    }

    #[test]
    fn an_incompatible_type_fails_at_registration_naming_the_state() {
        let dir = tempfile::tempdir().unwrap();
        let snap = v1_snapshot(dir.path(), BackendKind::Rocksdb);
        let store = restored(&dir.path().join("b"), &snap, &ManualClock::new(2_000));
        let err = store
            .value_state(&ValueStateDescriptor::<String>::new("count"))
            .err()
            .unwrap()
            .to_string();
        assert!(
            err.contains("'count'") && err.contains("u64") && err.contains("String"),
            "{err}"
        );
        let err = store
            .value_state(&ValueStateDescriptor::<u64>::new("count").with_schema_version(2))
            .err()
            .unwrap()
            .to_string();
        assert!(err.contains("no migration from version 1"), "{err}");
        // Unchanged still works.
        store
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
    }

    #[test]
    fn rewinding_to_a_pre_migration_snapshot_migrates_again() {
        let dir = tempfile::tempdir().unwrap();
        let snap = v1_snapshot(dir.path(), BackendKind::Rocksdb);
        let store = restored(&dir.path().join("b"), &snap, &ManualClock::new(2_000));
        store.value_state(&v2()).unwrap();
        // An aborted epoch: the same store restores the v1 snapshot again, then opens.
        store.restore(std::slice::from_ref(&snap)).unwrap();
        let c = store.value_state(&v2()).unwrap();
        store.set_current_key(b"k9").unwrap();
        assert_eq!(
            c.value().unwrap(),
            Some(CountV2 {
                n: 9,
                last_seen: None
            })
        );
    }

    #[test]
    fn snapshots_without_schemas_still_restore() {
        let dir = tempfile::tempdir().unwrap();
        let (snap, r) = v1_snapshot(dir.path(), BackendKind::Hashmap);
        // Strip the schemas, as a snapshot written before they existed; fix the checksum.
        let path = snap.join(crate::snapshot::META_FILE);
        let mut v: serde_json::Value =
            serde_json::from_slice(&std::fs::read(&path).unwrap()).unwrap();
        for s in v["states"].as_array_mut().unwrap() {
            s.as_object_mut().unwrap().remove("schema");
        }
        let bytes = serde_json::to_vec(&v).unwrap();
        std::fs::write(&path, &bytes).unwrap();
        let mut r = r;
        for f in &mut r.files {
            if f.path == crate::snapshot::META_FILE {
                f.size = bytes.len() as u64;
                f.sha256 = hex::encode(<sha2::Sha256 as sha2::Digest>::digest(&bytes));
            }
        }
        let store = restored(&dir.path().join("b"), &(snap, r), &ManualClock::new(2_000));
        let c = store
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap();
        store.set_current_key(b"k2").unwrap();
        assert_eq!(c.value().unwrap(), Some(2));
    }
}
