//! The one place the offline tools write a savepoint, so it can be pointed at whatever
//! layout the admin API's savepoints settle on (`savepoints/` under checkpoint storage).
//!
//! A savepoint directory holds the state layer's canonical savepoint
//! ([`streamstate_state::StateStore::write_savepoint`]: `state-meta.json`, `keyed.bin`,
//! `savepoint.json`) plus [`MANIFEST_FILE`]: the source checkpoint's offsets (input and
//! control topic), so restoring the savepoint resumes exactly where its state stopped.

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use serde::{Deserialize, Serialize};
use streamstate_state::SnapshotResult;
use streamstate_state::offline::RawSnapshot;
use streamstate_state::snapshot::SAVEPOINT_MANIFEST;

use super::{Origin, now_ms};

/// The tools' manifest beside the state layer's `savepoint.json`.
pub const MANIFEST_FILE: &str = "savepoint-manifest.json";
pub const FORMAT: &str = "streamstate-savepoint";
pub const FORMAT_VERSION: u32 = 1;

#[derive(Debug, Clone, Serialize, Deserialize)]
#[serde(deny_unknown_fields)]
pub struct SavepointManifest {
    pub format: String,
    pub format_version: u32,
    pub created_at_ms: u64,
    /// What made it, e.g. `import`, `surgery rekey 128 -> 256`.
    pub operation: String,
    /// Where the state came from, with the offsets that belong to it.
    pub origin: Origin,
    pub state: SnapshotResult,
}

/// Writes `raw` as a NEW savepoint into `out_dir` (which must not exist or be empty).
pub fn write(
    raw: &RawSnapshot,
    origin: &Origin,
    operation: &str,
    out_dir: &Path,
) -> anyhow::Result<SavepointManifest> {
    if out_dir.exists()
        && out_dir
            .read_dir()
            .with_context(|| format!("reading {}", out_dir.display()))?
            .next()
            .is_some()
    {
        bail!(
            "savepoint directory {} is not empty: a savepoint is always written new",
            out_dir.display()
        );
    }
    let work = tempfile::Builder::new()
        .prefix("streamstate-savepoint-")
        .tempdir()
        .context("scratch directory")?;
    let state = raw.write_savepoint(raw.part.identity.checkpoint_id, work.path(), out_dir)?;
    let manifest = SavepointManifest {
        format: FORMAT.into(),
        format_version: FORMAT_VERSION,
        created_at_ms: now_ms(),
        operation: operation.into(),
        origin: origin.clone(),
        state,
    };
    let path = out_dir.join(MANIFEST_FILE);
    std::fs::write(&path, serde_json::to_vec_pretty(&manifest)?)
        .with_context(|| format!("writing {}", path.display()))?;
    Ok(manifest)
}

/// Reads a savepoint directory: its origin (offsets) and the state layer's description.
/// A directory with only the state layer's `savepoint.json` has no offsets.
pub fn read(dir: &Path) -> anyhow::Result<(Origin, SnapshotResult)> {
    let path = dir.join(MANIFEST_FILE);
    if path.is_file() {
        let m: SavepointManifest = serde_json::from_slice(
            &std::fs::read(&path).with_context(|| format!("reading {}", path.display()))?,
        )
        .with_context(|| format!("parsing {}", path.display()))?;
        if m.format != FORMAT || m.format_version != FORMAT_VERSION {
            bail!(
                "{}: unknown format {} v{}",
                path.display(),
                m.format,
                m.format_version
            );
        }
        return Ok((m.origin, m.state));
    }
    let state_path: PathBuf = dir.join(SAVEPOINT_MANIFEST);
    let state: SnapshotResult =
        serde_json::from_slice(&std::fs::read(&state_path).with_context(|| {
            format!(
                "{} is not a savepoint directory: reading {}",
                dir.display(),
                state_path.display()
            )
        })?)
        .with_context(|| format!("parsing {}", state_path.display()))?;
    let origin = Origin {
        source: dir.display().to_string(),
        app_id: String::new(),
        instance: state.identity.instance_index,
        created_at_ms: 0,
        offsets: Vec::new(),
        control_offsets: Vec::new(),
    };
    Ok((origin, state))
}
