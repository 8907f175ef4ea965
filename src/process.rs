//! The skeleton's job function: a running count per key. (Temporary in-memory state until
//! the state crate lands.)

use std::collections::BTreeMap;
use std::path::Path;

use crate::checkpoint::{FileEntry, StateManifest};
use crate::config::Config;
use crate::decode::Event;

#[derive(Debug, thiserror::Error)]
pub enum ProcessError {
    #[error("state I/O on {path}: {reason}")]
    Io { path: String, reason: String },
}

pub struct CountJob {
    counts: BTreeMap<String, u64>,
    max_parallelism: u32,
}

impl CountJob {
    pub fn fresh(_config: &Config, _dir: &Path, max_parallelism: u32) -> Result<Self, ProcessError> {
        Ok(Self { counts: BTreeMap::new(), max_parallelism })
    }

    pub fn restore(_config: &Config, _dir: &Path, from: &Path, m: &StateManifest) -> Result<Self, ProcessError> {
        let path = from.join("counts.json");
        let io = |e: String| ProcessError::Io { path: path.display().to_string(), reason: e };
        let bytes = std::fs::read(&path).map_err(|e| io(e.to_string()))?;
        let counts = serde_json::from_slice(&bytes).map_err(|e| io(e.to_string()))?;
        Ok(Self { counts, max_parallelism: m.max_parallelism })
    }

    pub fn process(&mut self, event: &Event) -> Result<u64, ProcessError> {
        let c = self.counts.entry(event.key.clone()).or_default();
        *c += 1;
        Ok(*c)
    }

    pub fn snapshot(&mut self, _id: u64, dir: &Path) -> Result<StateManifest, ProcessError> {
        let io = |e: String| ProcessError::Io { path: dir.display().to_string(), reason: e };
        std::fs::create_dir_all(dir).map_err(|e| io(e.to_string()))?;
        let bytes = serde_json::to_vec(&self.counts).map_err(|e| io(e.to_string()))?;
        std::fs::write(dir.join("counts.json"), bytes).map_err(|e| io(e.to_string()))?;
        Ok(StateManifest {
            backend: "hashmap".into(),
            max_parallelism: self.max_parallelism,
            key_group_start: 0,
            key_group_end: self.max_parallelism - 1,
            files: vec![FileEntry::of(dir, "counts.json").map_err(|e| io(e.to_string()))?],
        })
    }
}
