//! Offline checkpoint tools (`streamstate checkpoints …`, `streamstate check-restore`).
//!
//! They work directly on checkpoint storage (`checkpoint.storage` of the config: `file://`
//! or `s3://`), fetching a checkpoint's files into a private scratch directory: never on a
//! running instance's local state. Everything that writes, writes a NEW savepoint
//! directory and leaves its source untouched. See `docs/checkpoint-tools.md`.
//!
//! One concept per file: [`list`], [`inspect`], [`verify`], [`export`] (and its value
//! [`decoders`]), [`import`], [`surgery`], [`savepoint_out`] (the one savepoint writer),
//! [`check_restore`].
//!
//! The operator verbs on the cluster live here too: [`topics`] (the topics a config
//! needs) and [`rules_cli`] (rule files to the control topic), on [`cluster_client`],
//! [`control_log`] and [`rule_files`].

pub mod check_restore;
pub mod cluster_client;
pub mod control_log;
pub mod decoders;
pub mod export;
pub mod import;
pub mod inspect;
pub mod list;
pub mod rule_files;
pub mod rules_cli;
pub mod savepoint_out;
pub mod surgery;
pub mod topics;
pub mod verify;

use std::path::{Path, PathBuf};

use anyhow::{Context, bail};
use clap::Subcommand;
use streamstate_state::SnapshotResult;
use streamstate_state::offline::RawSnapshot;

use crate::checkpoint::{
    CheckpointRef, CheckpointStorage, Manifest, PartitionOffset, open_storage,
};
use crate::config::Config;

/// Exit code of a check that ran and said no (verify found damage, check-restore refuses).
pub const EXIT_REFUSED: u8 = 3;

/// The error a tool returns when its check failed (as opposed to not being able to run):
/// the binary exits with [`EXIT_REFUSED`].
#[derive(Debug, thiserror::Error)]
#[error("{0}")]
pub struct Refused(pub String);

#[derive(Debug, Subcommand)]
pub enum CheckpointsCommand {
    /// Every checkpoint of this instance: id, run, instance, completed, created, size.
    List {
        #[arg(long)]
        json: bool,
    },
    /// Manifest, offsets, key-group range, states with entry counts and sizes (JSON).
    Inspect { from: String },
    /// Checks every referenced file is present with its size and SHA-256.
    Verify { from: String },
    /// Every state entry as JSON lines (see docs/checkpoint-tools.md for the format).
    Export {
        from: String,
        #[arg(long, default_value = "jsonl")]
        format: String,
        /// Write here instead of stdout.
        #[arg(long)]
        out: Option<PathBuf>,
    },
    /// Builds a NEW savepoint from an export.
    Import {
        jsonl: PathBuf,
        #[arg(long)]
        savepoint_dir: PathBuf,
    },
    /// State surgery: writes a NEW savepoint, the source stays untouched.
    Surgery {
        from: String,
        #[arg(long)]
        savepoint_dir: PathBuf,
        #[command(subcommand)]
        op: surgery::Op,
    },
}

/// Runs `streamstate checkpoints …`; `instance` overrides `[job] instance`.
pub fn run_checkpoints(
    config: &Path,
    instance: Option<u32>,
    command: CheckpointsCommand,
) -> anyhow::Result<()> {
    let mut config = Config::load(config)?;
    if let Some(i) = instance {
        config.job.instance = i;
    }
    match command {
        CheckpointsCommand::List { json } => list::run(&config, json),
        CheckpointsCommand::Inspect { from } => inspect::run(&config, &from),
        CheckpointsCommand::Verify { from } => verify::run(&config, &from),
        CheckpointsCommand::Export { from, format, out } => {
            if format != "jsonl" {
                bail!("--format {format}: only jsonl is supported");
            }
            export::run(&config, &from, out.as_deref())
        }
        CheckpointsCommand::Import {
            jsonl,
            savepoint_dir,
        } => import::run(&config, &jsonl, &savepoint_dir),
        CheckpointsCommand::Surgery {
            from,
            savepoint_dir,
            op,
        } => surgery::run(&config, &from, &savepoint_dir, op),
    }
}

/// Where a snapshot came from, and the offsets that belong to it (copied into every
/// savepoint made from it, so restoring that savepoint is exactly-once consistent).
#[derive(Debug, Clone, serde::Serialize, serde::Deserialize, PartialEq, Eq)]
pub struct Origin {
    /// `chk-<id>-<run>` or the savepoint directory.
    pub source: String,
    pub app_id: String,
    pub instance: u32,
    pub created_at_ms: u64,
    pub offsets: Vec<PartitionOffset>,
    #[serde(default)]
    pub control_offsets: Vec<PartitionOffset>,
}

/// A snapshot's files in a private local directory (removed on drop).
pub struct Fetched {
    pub origin: Origin,
    pub state: SnapshotResult,
    pub dir: PathBuf,
    scratch: tempfile::TempDir,
}

impl Fetched {
    /// Verifies every file and loads the snapshot into memory.
    pub fn load(&self) -> anyhow::Result<RawSnapshot> {
        Ok(RawSnapshot::read(
            &self.dir,
            &self.state,
            &self.scratch.path().join("rocksdb-logs"),
        )?)
    }
    pub fn scratch(&self) -> &Path {
        self.scratch.path()
    }
}

/// A checkpoint name (`chk-<id>-<run>`), a bare id, or a savepoint directory.
pub enum SourceRef {
    Checkpoint(CheckpointRef),
    Savepoint(PathBuf),
}

/// The newest completed checkpoint, if any.
pub fn latest(storage: &dyn CheckpointStorage) -> anyhow::Result<Option<CheckpointRef>> {
    Ok(storage
        .list()?
        .into_iter()
        .filter(|i| i.completed)
        .map(|i| i.checkpoint)
        .max_by_key(|c| c.id))
}

/// Resolves `from` against storage: a directory path is a savepoint; `chk-…` a
/// checkpoint; `latest` the newest completed checkpoint; a bare number the checkpoint
/// with that id (the completed one if several runs wrote it).
pub fn resolve(storage: &dyn CheckpointStorage, from: &str) -> anyhow::Result<SourceRef> {
    let path = Path::new(from);
    if path.is_dir() {
        return Ok(SourceRef::Savepoint(path.to_path_buf()));
    }
    if let Some(c) = CheckpointRef::parse(from) {
        return Ok(SourceRef::Checkpoint(c));
    }
    if from == "latest" {
        return match latest(storage)? {
            Some(c) => Ok(SourceRef::Checkpoint(c)),
            None => bail!("no completed checkpoint in {}", storage.describe()),
        };
    }
    let Ok(id) = from.parse::<u64>() else {
        bail!(
            "{from:?} is neither a checkpoint (chk-<id>-<run> or <id>) nor a savepoint directory"
        );
    };
    let all = storage.list()?;
    let mut matching: Vec<_> = all.iter().filter(|i| i.checkpoint.id == id).collect();
    if matching.len() > 1 {
        matching.retain(|i| i.completed);
    }
    match matching.as_slice() {
        [one] => Ok(SourceRef::Checkpoint(one.checkpoint.clone())),
        [] => bail!("no checkpoint with id {id} in {}", storage.describe()),
        many => bail!(
            "checkpoint id {id} is ambiguous in {}: {}",
            storage.describe(),
            many.iter()
                .map(|i| i.checkpoint.to_string())
                .collect::<Vec<_>>()
                .join(", ")
        ),
    }
}

/// Reads a checkpoint's manifest (or a savepoint's) and fetches its files; with
/// `meta_only`, only `state-meta.json`.
pub fn fetch(config: &Config, from: &str, meta_only: bool) -> anyhow::Result<Fetched> {
    let scratch = tempfile::Builder::new()
        .prefix("streamstate-tools-")
        .tempdir()
        .context("scratch directory")?;
    let storage = open_storage(config)?;
    match resolve(storage.as_ref(), from)? {
        SourceRef::Savepoint(dir) => {
            let (origin, state) = savepoint_out::read(&dir)?;
            Ok(Fetched {
                origin,
                state,
                dir,
                scratch,
            })
        }
        SourceRef::Checkpoint(c) => {
            let manifest = storage.read_manifest(&c)?;
            let dir = scratch.path().join("files");
            let mut to_fetch = manifest.clone();
            if meta_only {
                to_fetch
                    .state
                    .files
                    .retain(|f| f.path == streamstate_state::snapshot::META_FILE);
            }
            storage.fetch(&to_fetch, &dir)?;
            Ok(Fetched {
                origin: origin_of(&manifest),
                state: manifest.state,
                dir,
                scratch,
            })
        }
    }
}

pub fn origin_of(m: &Manifest) -> Origin {
    Origin {
        source: m.checkpoint.to_string(),
        app_id: m.app_id.clone(),
        instance: m.instance,
        created_at_ms: m.created_at_ms,
        offsets: m.offsets.clone(),
        control_offsets: m.control_offsets.clone(),
    }
}

pub(crate) fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

#[cfg(test)]
mod tests;

/// Left-aligned columns, two spaces apart.
pub(crate) fn columns<const N: usize>(rows: &[[String; N]]) -> String {
    let mut widths = [0usize; N];
    for row in rows {
        for (w, c) in widths.iter_mut().zip(row) {
            *w = (*w).max(c.len());
        }
    }
    let mut out = String::new();
    for row in rows {
        let line = row
            .iter()
            .zip(widths)
            .map(|(c, w)| format!("{c:<w$}"))
            .collect::<Vec<_>>()
            .join("  ");
        out.push_str(line.trim_end());
        out.push('\n');
    }
    out
}
