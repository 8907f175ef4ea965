//! One error type for the whole state layer, so the runtime can log one thing
//! and decide (stop the instance) without matching on backend internals.

use std::path::PathBuf;

/// Everything that can go wrong in the state layer. Disk and input problems
/// are errors, never panics: a checkpoint that fails must stop the instance
/// with a message that names the culprit.
#[derive(Debug, thiserror::Error)]
pub enum StateError {
    #[error("I/O error on {path}: {source}")]
    Io {
        path: PathBuf,
        #[source]
        source: std::io::Error,
    },
    #[error("RocksDB error: {0}")]
    Rocks(#[from] rocksdb::Error),
    #[error("cannot (de)serialize state value of '{state}': {message}")]
    Serde { state: String, message: String },
    #[error("snapshot file {path} is corrupt: {reason}")]
    Corrupt { path: PathBuf, reason: String },
    #[error("snapshot is incompatible: {0}")]
    Incompatible(String),
    #[error("state '{name}' was registered as {existing} and cannot be reused as {requested}")]
    KindMismatch {
        name: String,
        existing: String,
        requested: String,
    },
    #[error("no current key: call set_current_key before using keyed state")]
    NoCurrentKey,
    #[error("invalid argument: {0}")]
    Invalid(String),
}

pub type Result<T, E = StateError> = std::result::Result<T, E>;

/// Attaches the path to an io::Error, because an error that does not name the
/// file is useless at 3 a.m.
pub(crate) trait IoContext<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T>;
}

impl<T> IoContext<T> for std::io::Result<T> {
    fn at(self, path: impl Into<PathBuf>) -> Result<T> {
        self.map_err(|source| StateError::Io {
            path: path.into(),
            source,
        })
    }
}
