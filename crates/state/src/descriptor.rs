//! Descriptors name a state and fix its type, default and TTL. The name is the
//! identity that survives restarts, rescaling and backend changes; the type is
//! the caller's promise about how the stored bytes decode.

use std::sync::Arc;

pub use crate::kind::StateKind;
use crate::schema::{Schema, StateDeclaration};
use crate::ttl::TtlConfig;

/// Descriptor of a `ValueState<T>`.
#[derive(Clone)]
pub struct ValueStateDescriptor<T> {
    pub name: String,
    pub default: Option<T>,
    pub ttl: Option<TtlConfig>,
    /// Schema version and migrations of the stored value type.
    pub schema: Schema,
}

impl<T> ValueStateDescriptor<T> {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            default: None,
            ttl: None,
            schema: Schema::default(),
        }
    }
    pub fn with_default(mut self, default: T) -> Self {
        self.default = Some(default);
        self
    }
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// The schema version of the stored type (default 1); bump it when the
    /// serialized layout changes, and register a migration from the old one.
    pub fn with_schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }
    /// Rewrites values stored under `from_version` (postcard bytes) on restore.
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.schema = self.schema.with_migration(from_version, f);
        self
    }
    /// What this descriptor registers, known without a store (for `check-restore`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration::new(
            &self.name,
            StateKind::Value,
            self.ttl.clone(),
            &value_type_name::<T>(),
            &self.schema,
        )
    }
}

/// Descriptor of a `ListState<T>`; TTL applies per element.
#[derive(Clone)]
pub struct ListStateDescriptor<T> {
    pub name: String,
    pub ttl: Option<TtlConfig>,
    /// Schema version and migrations of the stored value type.
    pub schema: Schema,
    _t: std::marker::PhantomData<fn() -> T>,
}

impl<T> ListStateDescriptor<T> {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ttl: None,
            schema: Schema::default(),
            _t: Default::default(),
        }
    }
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// The schema version of the stored type (default 1); bump it when the
    /// serialized layout changes, and register a migration from the old one.
    pub fn with_schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }
    /// Rewrites values stored under `from_version` (postcard bytes) on restore.
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.schema = self.schema.with_migration(from_version, f);
        self
    }
    /// What this descriptor registers, known without a store (for `check-restore`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration::new(
            &self.name,
            StateKind::List,
            self.ttl.clone(),
            &value_type_name::<T>(),
            &self.schema,
        )
    }
}

/// Descriptor of a `MapState<K, V>`; TTL applies per entry. Also used for
/// broadcast state, which is a map.
#[derive(Clone)]
pub struct MapStateDescriptor<K, V> {
    pub name: String,
    pub ttl: Option<TtlConfig>,
    /// Schema version and migrations of the stored value type.
    pub schema: Schema,
    _t: std::marker::PhantomData<fn() -> (K, V)>,
}

impl<K, V> MapStateDescriptor<K, V> {
    pub fn new(name: impl Into<String>) -> Self {
        Self {
            name: name.into(),
            ttl: None,
            schema: Schema::default(),
            _t: Default::default(),
        }
    }
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// The schema version of the stored type (default 1); bump it when the
    /// serialized layout changes, and register a migration from the old one.
    pub fn with_schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }
    /// Rewrites values stored under `from_version` (postcard bytes) on restore.
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.schema = self.schema.with_migration(from_version, f);
        self
    }
    /// What this descriptor registers, known without a store (for `check-restore`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration::new(
            &self.name,
            StateKind::Map,
            self.ttl.clone(),
            &format!(
                "map<{}, {}>",
                std::any::type_name::<K>(),
                std::any::type_name::<V>()
            ),
            &self.schema,
        )
    }
}

/// The fold of a reducing state.
pub type ReduceFn<T> = Arc<dyn Fn(&T, &T) -> T + Send + Sync>;

/// Descriptor of a `ReducingState<T>`: `add` folds with `reduce`.
pub struct ReducingStateDescriptor<T> {
    pub name: String,
    pub reduce: ReduceFn<T>,
    pub ttl: Option<TtlConfig>,
    /// Schema version and migrations of the stored value type.
    pub schema: Schema,
}

impl<T> Clone for ReducingStateDescriptor<T> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            reduce: self.reduce.clone(),
            ttl: self.ttl.clone(),
            schema: self.schema.clone(),
        }
    }
}

impl<T> ReducingStateDescriptor<T> {
    pub fn new(
        name: impl Into<String>,
        reduce: impl Fn(&T, &T) -> T + Send + Sync + 'static,
    ) -> Self {
        Self {
            name: name.into(),
            reduce: Arc::new(reduce),
            ttl: None,
            schema: Schema::default(),
        }
    }
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// The schema version of the stored type (default 1); bump it when the
    /// serialized layout changes, and register a migration from the old one.
    pub fn with_schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }
    /// Rewrites values stored under `from_version` (postcard bytes) on restore.
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.schema = self.schema.with_migration(from_version, f);
        self
    }
    /// What this descriptor registers, known without a store (for `check-restore`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration::new(
            &self.name,
            StateKind::Reducing,
            self.ttl.clone(),
            &value_type_name::<T>(),
            &self.schema,
        )
    }
}

/// Flink's `AggregateFunction`: only the accumulator is stored, so it must be
/// serializable; inputs and results need not be.
pub trait AggregateFunction: Send + Sync + 'static {
    type In;
    type Acc;
    type Out;
    fn create_accumulator(&self) -> Self::Acc;
    fn add(&self, value: Self::In, acc: Self::Acc) -> Self::Acc;
    fn get_result(&self, acc: &Self::Acc) -> Self::Out;
    fn merge(&self, a: Self::Acc, b: Self::Acc) -> Self::Acc;
}

/// Descriptor of an `AggregatingState<F>`.
pub struct AggregatingStateDescriptor<F> {
    pub name: String,
    pub function: Arc<F>,
    pub ttl: Option<TtlConfig>,
    /// Schema version and migrations of the stored value type.
    pub schema: Schema,
}

impl<F> Clone for AggregatingStateDescriptor<F> {
    fn clone(&self) -> Self {
        Self {
            name: self.name.clone(),
            function: self.function.clone(),
            ttl: self.ttl.clone(),
            schema: self.schema.clone(),
        }
    }
}

impl<F: AggregateFunction> AggregatingStateDescriptor<F> {
    pub fn new(name: impl Into<String>, function: F) -> Self {
        Self {
            name: name.into(),
            function: Arc::new(function),
            ttl: None,
            schema: Schema::default(),
        }
    }
    pub fn with_ttl(mut self, ttl: TtlConfig) -> Self {
        self.ttl = Some(ttl);
        self
    }
    /// The schema version of the stored type (default 1); bump it when the
    /// serialized layout changes, and register a migration from the old one.
    pub fn with_schema_version(mut self, version: u32) -> Self {
        self.schema.version = version;
        self
    }
    /// Rewrites values stored under `from_version` (postcard bytes) on restore.
    pub fn with_migration(
        mut self,
        from_version: u32,
        f: impl Fn(&[u8]) -> Result<Vec<u8>, String> + Send + Sync + 'static,
    ) -> Self {
        self.schema = self.schema.with_migration(from_version, f);
        self
    }
    /// What this descriptor registers, known without a store (for `check-restore`).
    pub fn declaration(&self) -> StateDeclaration {
        StateDeclaration::new(
            &self.name,
            StateKind::Aggregating,
            self.ttl.clone(),
            &value_type_name::<F::Acc>(),
            &self.schema,
        )
    }
}

/// The type name a schema fingerprint is computed from.
pub fn value_type_name<T: ?Sized>() -> String {
    std::any::type_name::<T>().to_string()
}
