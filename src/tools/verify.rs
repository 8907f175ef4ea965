//! `checkpoints verify`: every referenced file present, every size and SHA-256 right, and
//! the state layer's meta file consistent with the manifest. Any failure names the file
//! and exits with [`super::EXIT_REFUSED`].

use streamstate_state::offline::{RawSnapshot, verify_snapshot};

use super::{Refused, SourceRef, resolve};
use crate::checkpoint::{CheckpointError, open_storage};
use crate::config::Config;

/// Every problem found, one line each (empty: intact). `Err` only when the check itself
/// could not run (storage unreachable, unknown checkpoint).
pub fn problems(config: &Config, from: &str) -> anyhow::Result<(String, Vec<String>)> {
    let storage = open_storage(config)?;
    let scratch = tempfile::Builder::new()
        .prefix("streamstate-verify-")
        .tempdir()?;
    let (label, dir, state) = match resolve(storage.as_ref(), from)? {
        SourceRef::Savepoint(dir) => {
            let (_, state) = super::savepoint_out::read(&dir)?;
            (dir.display().to_string(), dir, state)
        }
        SourceRef::Checkpoint(c) => {
            let manifest = match storage.read_manifest(&c) {
                Ok(m) => m,
                Err(
                    e @ (CheckpointError::BadManifest { .. } | CheckpointError::Missing { .. }),
                ) => return Ok((c.to_string(), vec![e.to_string()])),
                Err(e) => return Err(e.into()),
            };
            let dir = scratch.path().join("files");
            if let Err(e) = storage.fetch(&manifest, &dir) {
                return Ok((c.to_string(), vec![e.to_string()]));
            }
            (c.to_string(), dir, manifest.state)
        }
    };
    let mut out: Vec<String> = verify_snapshot(&dir, &state)
        .into_iter()
        .map(|e| e.to_string())
        .collect();
    if out.is_empty() {
        match RawSnapshot::read_meta(&dir) {
            Ok(meta)
                if meta.part.identity.max_parallelism != state.identity.max_parallelism
                    || meta.part.identity.key_group_range != state.identity.key_group_range =>
            {
                out.push(format!(
                    "{}: disagrees with the manifest (key groups)",
                    dir.join(streamstate_state::snapshot::META_FILE).display()
                ))
            }
            Ok(_) => {}
            Err(e) => out.push(e.to_string()),
        }
    }
    // Name files by their path inside the snapshot, not the scratch copy.
    let scratch_prefix = format!("{}/", dir.display());
    let out = out
        .into_iter()
        .map(|p| p.replace(&scratch_prefix, ""))
        .collect();
    Ok((label, out))
}

pub fn run(config: &Config, from: &str) -> anyhow::Result<()> {
    let (label, problems) = problems(config, from)?;
    if problems.is_empty() {
        println!("{label}: ok");
        return Ok(());
    }
    for p in &problems {
        println!("{label}: FAILED: {p}");
    }
    Err(Refused(format!(
        "{label}: {} problem(s); first: {}",
        problems.len(),
        problems[0]
    ))
    .into())
}
