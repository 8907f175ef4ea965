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

use crate::descriptor::StateKind;
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
        Self { version, fingerprint: hex::encode(&h[..16]), value_type: value_type.to_string() }
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
        Self { version: 1, migrations: BTreeMap::new() }
    }
}

impl std::fmt::Debug for Schema {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("Schema").field("version", &self.version).field("migrates_from", &self.migrations.keys().collect::<Vec<_>>()).finish()
    }
}

impl Schema {
    pub fn with_version(mut self, version: u32) -> Self {
        self.version = version;
        self
    }
    pub fn with_migration(mut self, from_version: u32, f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static) -> Self {
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
            let old: Old = postcard::from_bytes(bytes).map_err(|e| format!("decode v{from_version}: {e}"))?;
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
    pub fn new(name: &str, kind: StateKind, ttl: Option<TtlConfig>, value_type: &str, schema: &Schema) -> Self {
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
    let Some(old) = old else { return SchemaChange::Keep };
    if old.version == new.version && old.fingerprint == new.fingerprint {
        return SchemaChange::Keep;
    }
    if old.version < new.version && migrates_from.contains(&old.version) {
        return SchemaChange::Migrate { from: old.version, to: new.version };
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
