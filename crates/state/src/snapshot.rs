//! Snapshots, restore and savepoints.
//!
//! A snapshot of one instance is a directory of files:
//! - `state-meta.json`: format version, backend, max parallelism, key-group
//!   range, instance index/count, the state registry (id → name, kind, TTL),
//!   operator list/union state and broadcast state (bytes as hex).
//! - keyed state and timers, either
//!   - `keyed.bin` — the **canonical format** (hashmap snapshots and every
//!     savepoint): magic `SSKV`, u32 LE version (1), then records
//!     `0x01 [varint len][storage key][varint len][value]` in key order, then
//!     the trailer `0x00 [u64 LE record count]`. Keys and values follow the
//!     layout in [`crate::layout`], so any backend can load it; or
//!   - `db/…` — a RocksDB checkpoint (rocksdb snapshots): hard links to
//!     immutable SST files, so checkpoint storage deduplicates by file name and
//!     SHA-256 and only new SSTs are copied (incremental).
//!
//! [`SnapshotResult`] lists every file with its size and SHA-256. Restore
//! verifies them all before it touches live state, builds the new state in a
//! fresh backend, and swaps it in only on success: nothing is half-restored.
//! A savepoint is a canonical snapshot plus `savepoint.json` (its
//! `SnapshotResult`), so the directory is self-describing.

use std::collections::{BTreeMap, HashMap};
use std::fs::File;
use std::io::{BufReader, BufWriter, Read, Write};
use std::path::{Path, PathBuf};
use std::sync::Arc;

use serde::{Deserialize, Serialize};
use sha2::{Digest, Sha256};

use crate::backend::rocks::{RocksBackend, scan_checkpoint};
use crate::backend::{BackendKind, FrozenEntries, KvBackend};
use crate::error::{IoContext, Result, StateError};
pub use crate::files::SnapshotFile;
use crate::files::{FileHashes, verify_file};
use crate::keygroup::{KeyGroupRange, KeyGroups};
use crate::layout::{self, FIRST_RESERVED_ID};
use crate::operator::{OperatorList, OperatorStates, Redistribution};
use crate::store::{Inner, StateMeta, StateStore, StoreConfig, open_backend};
use crate::ttl::{self, Expiry};

pub const FORMAT_VERSION: u32 = 1;
pub const META_FILE: &str = "state-meta.json";
pub const KEYED_FILE: &str = "keyed.bin";
pub const SAVEPOINT_MANIFEST: &str = "savepoint.json";
const MAGIC: &[u8; 4] = b"SSKV";
/// Entries per WriteBatch when restore rebuilds keyed state.
const BATCH: usize = 4096;

#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
#[serde(rename_all = "snake_case")]
pub enum KeyedFormat {
    /// `keyed.bin`, the canonical backend-neutral format.
    Canonical,
    /// `db/`, a RocksDB checkpoint.
    RocksdbCheckpoint,
}

/// What a snapshot wrote; the runtime stores it in its checkpoint manifest
/// and hands it back to [`StateStore::restore`].
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotResult {
    pub format_version: u32,
    pub backend: BackendKind,
    pub keyed_format: KeyedFormat,
    #[serde(flatten)]
    pub identity: SnapshotIdentity,
    pub files: Vec<SnapshotFile>,
}

/// Which checkpoint a snapshot part belongs to and which key groups of which instance it
/// holds. Every form of a part (its result, its meta file, a part in memory, an export)
/// carries this one struct, so restore, rescale and the offline tools read the same
/// fields, and the JSON keys stay those of the flat layout written before it existed.
#[derive(Debug, Clone, Copy, PartialEq, Eq, Serialize, Deserialize)]
pub struct SnapshotIdentity {
    pub checkpoint_id: u64,
    pub max_parallelism: u32,
    /// [`StoreConfig::aligned_partitions`]: absent in parts numbered modulo, which is
    /// every part written before alignment existed.
    #[serde(default, skip_serializing_if = "Option::is_none")]
    pub aligned_partitions: Option<u32>,
    pub key_group_range: KeyGroupRange,
    pub instance_index: u32,
    pub instance_count: u32,
}

impl SnapshotIdentity {
    /// The part a store configured as `config` writes for `checkpoint_id`.
    pub fn of(config: &StoreConfig, checkpoint_id: u64) -> Self {
        Self {
            checkpoint_id,
            max_parallelism: config.max_parallelism,
            aligned_partitions: config.aligned_partitions,
            key_group_range: config.key_group_range,
            instance_index: config.instance_index,
            instance_count: config.instance_count,
        }
    }

    /// How the part numbers keys into key groups.
    pub fn key_groups(&self) -> Result<KeyGroups> {
        KeyGroups::aligned(self.max_parallelism, self.aligned_partitions.unwrap_or(1))
    }

    /// A store config that owns exactly this part's key groups (for offline tools that
    /// load a part into a store of their own).
    pub fn store_config(
        &self,
        backend: BackendKind,
        work_dir: &Path,
        cache_bytes: u64,
    ) -> StoreConfig {
        StoreConfig {
            backend,
            work_dir: work_dir.to_path_buf(),
            max_parallelism: self.max_parallelism,
            aligned_partitions: self.aligned_partitions,
            key_group_range: self.key_group_range,
            instance_index: self.instance_index,
            instance_count: self.instance_count,
            cache_bytes,
        }
    }
}

/// A snapshot part apart from its keyed entries: its identity, the state registry and the
/// operator and broadcast state. Written into `state-meta.json`, held by
/// [`crate::offline::RawSnapshot`] and by an export's header.
#[derive(Debug, Clone, PartialEq, Serialize, Deserialize)]
pub struct PartMeta {
    #[serde(flatten)]
    pub identity: SnapshotIdentity,
    pub states: Vec<StateMeta>,
    pub operator_lists: BTreeMap<String, HexList>,
    pub broadcast: BTreeMap<String, Vec<(String, String)>>,
}

impl SnapshotResult {
    pub fn total_size(&self) -> u64 {
        self.files.iter().map(|f| f.size).sum()
    }
}

/// Operator list state in `state-meta.json` (entries hex-encoded).
#[derive(Debug, Clone, PartialEq, Eq, Serialize, Deserialize)]
pub struct HexList {
    pub mode: Redistribution,
    pub entries: Vec<String>,
}

/// `state-meta.json`: what a snapshot holds besides keyed state (public for
/// the offline tools, see [`crate::offline`]).
#[derive(Debug, Clone, Serialize, Deserialize)]
pub struct MetaFile {
    pub format: String,
    pub version: u32,
    pub backend: BackendKind,
    pub keyed_format: KeyedFormat,
    #[serde(flatten)]
    pub part: PartMeta,
}

/// Hashes what it writes, so a snapshot file is read once, not twice.
struct HashingWriter<W: Write> {
    inner: W,
    hasher: Sha256,
    size: u64,
}

impl<W: Write> Write for HashingWriter<W> {
    fn write(&mut self, buf: &[u8]) -> std::io::Result<usize> {
        let n = self.inner.write(buf)?;
        self.hasher.update(&buf[..n]);
        self.size += n as u64;
        Ok(n)
    }
    fn flush(&mut self) -> std::io::Result<()> {
        self.inner.flush()
    }
}

/// Writes a file and hashes it on the way; `sync` when the file is durable where it lies.
fn write_hashed(
    path: &Path,
    sync: bool,
    f: impl FnOnce(&mut dyn Write) -> Result<()>,
) -> Result<SnapshotFile> {
    let file = File::create(path).at(path)?;
    let mut w = HashingWriter {
        inner: BufWriter::with_capacity(1 << 20, file),
        hasher: Sha256::new(),
        size: 0,
    };
    f(&mut w)?;
    w.flush().at(path)?;
    let HashingWriter {
        inner,
        hasher,
        size,
    } = w;
    let file = inner.into_inner().map_err(|e| StateError::Io {
        path: path.to_path_buf(),
        source: e.into_error(),
    })?;
    if sync {
        file.sync_all().at(path)?;
    }
    Ok(SnapshotFile {
        path: String::new(),
        size,
        sha256: hex::encode(hasher.finalize()),
    })
}

/// How a scan over stored entries is handed to the canonical writer: the live backend's,
/// or a frozen copy's.
type Scan<'a> = &'a mut dyn FnMut(&[u8], &[u8], &mut dyn FnMut(&[u8], &[u8]) -> bool) -> Result<()>;

/// What writing the canonical format needs besides the entries: the owned range, and
/// each state's TTL with the barrier's time, for the cleanup of full snapshots.
struct CanonicalPlan {
    start: Vec<u8>,
    end: Vec<u8>,
    by_id: HashMap<u16, Arc<StateMeta>>,
    now: u64,
}

impl CanonicalPlan {
    /// Writes keyed state and timers of the owned range in the canonical
    /// format, leaving out entries expired under a full-snapshot cleanup.
    fn write(&self, path: &Path, sync: bool, scan: Scan<'_>) -> Result<SnapshotFile> {
        let Self {
            start,
            end,
            by_id,
            now,
        } = self;
        let now = *now;
        write_hashed(path, sync, |w| {
            w.write_all(MAGIC).at(path)?;
            w.write_all(&FORMAT_VERSION.to_le_bytes()).at(path)?;
            let mut count = 0u64;
            let mut err: Option<StateError> = None;
            let mut rec = Vec::with_capacity(256);
            scan(start, end, &mut |k, v| {
                let step = (|| -> Result<()> {
                    let id = u16::from_be_bytes([k[2], k[3]]);
                    let mut value = std::borrow::Cow::Borrowed(v);
                    if let Some(ttl) = by_id.get(&id).and_then(|m| {
                        m.ttl
                            .as_ref()
                            .filter(|t| t.cleanup.full_snapshot)
                            .map(|t| (m.kind.into(), t))
                    }) {
                        match ttl::expire(ttl.0, ttl.1, v, now)? {
                            Expiry::Keep => {}
                            Expiry::Remove => return Ok(()),
                            Expiry::Rewrite(nv) => value = std::borrow::Cow::Owned(nv),
                        }
                    }
                    rec.clear();
                    rec.push(1);
                    layout::put_varint(&mut rec, k.len() as u64);
                    rec.extend_from_slice(k);
                    layout::put_varint(&mut rec, value.len() as u64);
                    rec.extend_from_slice(&value);
                    w.write_all(&rec).at(path)?;
                    count += 1;
                    Ok(())
                })();
                match step {
                    Ok(()) => true,
                    Err(e) => {
                        err = Some(e);
                        false
                    }
                }
            })?;
            if let Some(e) = err {
                return Err(e);
            }
            w.write_all(&[0]).at(path)?;
            w.write_all(&count.to_le_bytes()).at(path)?;
            Ok(())
        })
    }
}

impl Inner {
    fn canonical_plan(&self) -> CanonicalPlan {
        let (start, end) = layout::key_group_bounds(
            self.config.key_group_range.start,
            self.config.key_group_range.end,
        );
        CanonicalPlan {
            start,
            end,
            by_id: self.by_id.clone(),
            now: self.clock.now_ms(),
        }
    }

    /// The canonical format from the live backend, here and now.
    fn write_canonical(&mut self, path: &Path, sync: bool) -> Result<SnapshotFile> {
        let plan = self.canonical_plan();
        let backend = &mut self.backend;
        plan.write(path, sync, &mut |start, end, f| backend.scan(start, end, f))
    }

    fn meta_file(&self, checkpoint_id: u64, keyed_format: KeyedFormat) -> MetaFile {
        let mut states: Vec<StateMeta> = self.states.values().map(|m| (**m).clone()).collect();
        states.sort_by_key(|m| m.id);
        let operators = self.operator.lock();
        MetaFile {
            format: "streamstate-state-meta".into(),
            version: FORMAT_VERSION,
            backend: self.config.backend,
            keyed_format,
            part: PartMeta {
                identity: SnapshotIdentity::of(&self.config, checkpoint_id),
                states,
                operator_lists: operators
                    .lists
                    .iter()
                    .map(|(n, l)| {
                        (
                            n.clone(),
                            HexList {
                                mode: l.mode,
                                entries: l.entries.iter().map(hex::encode).collect(),
                            },
                        )
                    })
                    .collect(),
                broadcast: operators
                    .broadcast
                    .iter()
                    .map(|(n, m)| {
                        (
                            n.clone(),
                            m.iter()
                                .map(|(k, v)| (hex::encode(k), hex::encode(v)))
                                .collect(),
                        )
                    })
                    .collect(),
            },
        }
    }

    fn snapshot_into(
        &mut self,
        checkpoint_id: u64,
        dir: &Path,
        canonical: bool,
        defer: bool,
    ) -> Result<(SnapshotResult, Option<DeferredSnapshot>)> {
        std::fs::create_dir_all(dir).at(dir)?;
        // The barrier: the state cache's dirty entries go into the backend,
        // in key order and as one batch, before the backend is snapshotted.
        self.backend.write_back()?;
        let mut files = Vec::new();
        let native = if canonical {
            None
        } else {
            self.backend.native_snapshot(dir)?
        };
        // A checkpoint of a backend that can freeze its entries writes them after the
        // barrier, off the job thread; anything else writes them here.
        let frozen = match (&native, defer) {
            (None, true) => self.backend.freeze(),
            _ => None,
        };
        let keyed_format = if native.is_some() {
            KeyedFormat::RocksdbCheckpoint
        } else {
            if frozen.is_none() {
                let mut f = self.write_canonical(&dir.join(KEYED_FILE), !defer)?;
                f.path = KEYED_FILE.into();
                files.push(f);
            }
            KeyedFormat::Canonical
        };
        let meta = self.meta_file(checkpoint_id, keyed_format);
        let mut result = SnapshotResult {
            format_version: FORMAT_VERSION,
            backend: self.config.backend,
            keyed_format,
            identity: meta.part.identity,
            files,
        };
        let keyed = match (native, frozen) {
            (Some(pending), _) => Some(Deferred::Native {
                pending,
                hashes: self.sha_cache.clone(),
            }),
            (None, Some(entries)) => Some(Deferred::Canonical {
                entries,
                plan: self.canonical_plan(),
            }),
            (None, None) => None,
        };
        // Even the small meta file is written after the barrier: file creation can wait
        // on the disk behind the previous checkpoint's upload.
        let rest = DeferredSnapshot {
            dir: dir.to_path_buf(),
            keyed,
            meta,
            sync: !defer,
        };
        if defer {
            Ok((result, Some(rest)))
        } else {
            rest.complete(&mut result)?;
            Ok((result, None))
        }
    }
}

/// What a checkpoint's snapshot leaves for after the barrier: the backend's files (a
/// RocksDB checkpoint, linked once the barrier's memtables are flushed) and the hashes of
/// those not seen before, or the canonical file of a frozen copy of the entries (the
/// `hashmap` backend), and the meta file. Dropping it abandons the snapshot once the
/// backend's part has ended (one memtable flush), so its directory can be removed.
pub struct DeferredSnapshot {
    dir: PathBuf,
    keyed: Option<Deferred>,
    meta: MetaFile,
    /// Sync what is written here (not for staging, which the uploader copies and syncs).
    sync: bool,
}

enum Deferred {
    Native {
        pending: Box<dyn crate::backend::PendingSnapshot>,
        hashes: FileHashes,
    },
    Canonical {
        entries: Box<dyn FrozenEntries>,
        plan: CanonicalPlan,
    },
}

impl DeferredSnapshot {
    /// Writes every entry (the `hashmap` backend's frozen copy), rather than waiting for a
    /// RocksDB checkpoint's links: O(state) work, which the caller may not want queued.
    pub fn is_full(&self) -> bool {
        matches!(self.keyed, Some(Deferred::Canonical { .. }))
    }

    /// Writes or waits for the keyed files and puts them, hashed, at the front of
    /// `result.files`, and the meta file at the end. Hashes of SSTs seen before come from
    /// the store's cache; the others are read here, so this belongs off the job thread.
    pub fn complete(self, result: &mut SnapshotResult) -> Result<()> {
        let mut keyed = Vec::new();
        match self.keyed {
            None => {}
            Some(Deferred::Native { pending, hashes }) => {
                for rel in pending.finish()? {
                    let name = rel.to_string_lossy().replace('\\', "/");
                    let full = self.dir.join(&rel);
                    keyed.push(match hashes.cached(&name, &full)? {
                        Some(f) => f,
                        None => hashes.hash(name, &full)?,
                    });
                }
            }
            Some(Deferred::Canonical { entries, plan }) => {
                let mut f = plan.write(
                    &self.dir.join(KEYED_FILE),
                    self.sync,
                    &mut |start, end, f| entries.scan(start, end, f),
                )?;
                f.path = KEYED_FILE.into();
                keyed.push(f);
            }
        }
        result.files.splice(0..0, keyed);
        let meta_path = self.dir.join(META_FILE);
        let mut mf = write_hashed(&meta_path, self.sync, |w| {
            serde_json::to_writer_pretty(&mut *w, &self.meta)
                .map_err(|e| StateError::Invalid(e.to_string()))
        })?;
        mf.path = META_FILE.into();
        result.files.push(mf);
        Ok(())
    }
}

pub(crate) fn read_meta(dir: &Path) -> Result<MetaFile> {
    let path = dir.join(META_FILE);
    let file = File::open(&path).at(&path)?;
    let meta: MetaFile =
        serde_json::from_reader(BufReader::new(file)).map_err(|e| StateError::Corrupt {
            path: path.clone(),
            reason: e.to_string(),
        })?;
    if meta.format != "streamstate-state-meta" || meta.version != FORMAT_VERSION {
        return Err(StateError::Corrupt {
            path,
            reason: format!("unknown format {} v{}", meta.format, meta.version),
        });
    }
    Ok(meta)
}

/// Reads a canonical keyed file, calling `f` for every record.
pub(crate) fn read_canonical(path: &Path, f: crate::backend::EntrySink<'_>) -> Result<()> {
    let corrupt = |reason: &str| StateError::Corrupt {
        path: path.to_path_buf(),
        reason: reason.into(),
    };
    let mut data = Vec::new();
    File::open(path).at(path)?.read_to_end(&mut data).at(path)?;
    if data.len() < 8 || &data[..4] != MAGIC {
        return Err(corrupt("bad magic"));
    }
    if data[4..8] != FORMAT_VERSION.to_le_bytes() {
        return Err(corrupt("unsupported version"));
    }
    let mut pos = 8;
    let mut count = 0u64;
    loop {
        match data.get(pos) {
            None => return Err(corrupt("truncated: no trailer")),
            Some(0) => {
                let t = data
                    .get(pos + 1..pos + 9)
                    .ok_or_else(|| corrupt("truncated trailer"))?;
                let expected =
                    u64::from_le_bytes(t.try_into().map_err(|_| corrupt("truncated trailer"))?);
                if expected != count || data.len() != pos + 9 {
                    return Err(corrupt("record count mismatch"));
                }
                return Ok(());
            }
            Some(1) => {
                pos += 1;
                let (kl, n) =
                    layout::get_varint(&data[pos..]).ok_or_else(|| corrupt("truncated record"))?;
                pos += n;
                let k = data
                    .get(pos..pos + kl as usize)
                    .ok_or_else(|| corrupt("truncated record"))?;
                pos += kl as usize;
                let (vl, n) = layout::get_varint(data.get(pos..).unwrap_or(&[]))
                    .ok_or_else(|| corrupt("truncated record"))?;
                pos += n;
                let v = data
                    .get(pos..pos + vl as usize)
                    .ok_or_else(|| corrupt("truncated record"))?;
                pos += vl as usize;
                if k.len() < 4 {
                    return Err(corrupt("short key"));
                }
                f(k, v)?;
                count += 1;
            }
            Some(_) => return Err(corrupt("bad record tag")),
        }
    }
}

fn redistribute(
    lists: Vec<(u32, u32, BTreeMap<String, HexList>)>,
    index: u32,
    count: u32,
) -> Result<BTreeMap<String, OperatorList>> {
    let decode = |s: &String| {
        hex::decode(s).map_err(|e| StateError::Invalid(format!("operator state: {e}")))
    };
    let same_parallelism = lists.len() as u32 == count && lists.iter().all(|(_, c, _)| *c == count);
    type PartsByName = BTreeMap<String, (Redistribution, Vec<(u32, Vec<Vec<u8>>)>)>;
    let mut by_name: PartsByName = BTreeMap::new();
    for (old_index, _, l) in lists {
        for (name, hl) in l {
            let entries = hl.entries.iter().map(decode).collect::<Result<Vec<_>>>()?;
            by_name
                .entry(name)
                .or_insert((hl.mode, Vec::new()))
                .1
                .push((old_index, entries));
        }
    }
    let mut out = BTreeMap::new();
    for (name, (mode, mut parts)) in by_name {
        parts.sort_by_key(|p| p.0);
        let entries = match mode {
            Redistribution::Union => parts.into_iter().flat_map(|p| p.1).collect(),
            Redistribution::EvenSplit if same_parallelism => parts
                .into_iter()
                .filter(|p| p.0 == index)
                .flat_map(|p| p.1)
                .collect(),
            Redistribution::EvenSplit => {
                let all: Vec<Vec<u8>> = parts.into_iter().flat_map(|p| p.1).collect();
                let n = all.len() as u64;
                let lo = (index as u64 * n / count as u64) as usize;
                let hi = ((index as u64 + 1) * n / count as u64) as usize;
                all[lo..hi].to_vec()
            }
        };
        out.insert(name, OperatorList { mode, entries });
    }
    Ok(out)
}

impl StateStore {
    /// Synchronously writes everything (keyed state and timers of the owned
    /// key-group range, operator and broadcast state) under `target_dir`.
    /// rocksdb: a checkpoint (hard links) plus `state-meta.json`;
    /// hashmap: `keyed.bin` plus `state-meta.json`.
    pub fn snapshot(&self, checkpoint_id: u64, target_dir: &Path) -> Result<SnapshotResult> {
        Ok(self
            .lock()
            .snapshot_into(checkpoint_id, target_dir, false, false)?
            .0)
    }

    /// [`StateStore::snapshot`] for a checkpoint barrier: returns once the snapshot is
    /// fixed (for RocksDB, once the memtable is switched: later writes are not in it),
    /// with what is left to do — the RocksDB flush and links, and hashing the new SSTs —
    /// in the [`DeferredSnapshot`], to complete off the job thread. Files written here
    /// are staging for an uploader and are not synced.
    pub fn snapshot_deferred(
        &self,
        checkpoint_id: u64,
        target_dir: &Path,
    ) -> Result<(SnapshotResult, Option<DeferredSnapshot>)> {
        self.lock()
            .snapshot_into(checkpoint_id, target_dir, false, true)
    }

    /// Writes a savepoint in the canonical, backend-neutral format, with
    /// `savepoint.json` describing it.
    pub fn write_savepoint(&self, savepoint_id: u64, dir: &Path) -> Result<SnapshotResult> {
        let (result, _) = self.lock().snapshot_into(savepoint_id, dir, true, false)?;
        let path = dir.join(SAVEPOINT_MANIFEST);
        let json =
            serde_json::to_vec_pretty(&result).map_err(|e| StateError::Invalid(e.to_string()))?;
        std::fs::write(&path, json).at(&path)?;
        Ok(result)
    }

    /// Restores from savepoint directories (one per old instance).
    pub fn restore_savepoint(&self, dirs: &[PathBuf]) -> Result<()> {
        let mut parts = Vec::new();
        for d in dirs {
            let path = d.join(SAVEPOINT_MANIFEST);
            let bytes = std::fs::read(&path).at(&path)?;
            let r: SnapshotResult =
                serde_json::from_slice(&bytes).map_err(|e| StateError::Corrupt {
                    path: path.clone(),
                    reason: e.to_string(),
                })?;
            parts.push((d.clone(), r));
        }
        self.restore(&parts)
    }

    /// `restore(&[])` resets the store to empty state (a first start).
    ///
    /// Replaces all state with the snapshot `parts` (one per old instance:
    /// pass every part of the checkpoint, since operator state is spread
    /// over all of them). Keyed state is kept only for this store's
    /// key-group range, so this is also how rescaling restores. Every file
    /// is checked (size, SHA-256) before live state is touched.
    pub fn restore(&self, parts: &[(PathBuf, SnapshotResult)]) -> Result<()> {
        let mut g = self.lock();
        let range = g.config.key_group_range;
        // 1. Check everything first.
        let mut metas = Vec::with_capacity(parts.len());
        for (dir, r) in parts {
            if r.format_version != FORMAT_VERSION {
                return Err(StateError::Incompatible(format!(
                    "{}: format version {}",
                    dir.display(),
                    r.format_version
                )));
            }
            if r.identity.key_groups()? != g.key_groups {
                return Err(StateError::Incompatible(format!(
                    "{}: {} differ from this store's {}",
                    dir.display(),
                    r.identity.key_groups()?,
                    g.key_groups
                )));
            }
            let needed = r.identity.key_group_range.intersects(&range);
            let meta_entry = r
                .files
                .iter()
                .find(|f| f.path == META_FILE)
                .ok_or_else(|| StateError::Corrupt {
                    path: dir.join(META_FILE),
                    reason: "not listed in the snapshot".into(),
                })?;
            for f in &r.files {
                if needed || std::ptr::eq(f, meta_entry) {
                    verify_file(dir, f)?;
                }
            }
            let meta = read_meta(dir)?;
            if meta.part.identity.max_parallelism != r.identity.max_parallelism
                || meta.part.identity.aligned_partitions != r.identity.aligned_partitions
                || meta.part.identity.key_group_range != r.identity.key_group_range
            {
                return Err(StateError::Corrupt {
                    path: dir.join(META_FILE),
                    reason: "disagrees with the snapshot result".into(),
                });
            }
            metas.push((dir.clone(), r.clone(), meta, needed));
        }
        // 2. Registry: keep live ids (handles stay valid), add new names.
        let mut states: HashMap<String, Arc<StateMeta>> = g.states.clone();
        let mut next_id = g.next_id;
        let mut remaps: Vec<HashMap<u16, u16>> = Vec::new();
        for (dir, _, meta, _) in &metas {
            let mut remap = HashMap::new();
            for s in &meta.part.states {
                let id = match states.get(&s.name).cloned() {
                    Some(live) if live.kind != s.kind => {
                        return Err(StateError::KindMismatch {
                            name: s.name.clone(),
                            existing: live.kind.to_string(),
                            requested: format!("{} (in {})", s.kind, dir.display()),
                        });
                    }
                    Some(live) if live.ttl.is_some() != s.ttl.is_some() => {
                        return Err(StateError::Incompatible(format!(
                            "state '{}': TTL on/off differs from {}",
                            s.name,
                            dir.display()
                        )));
                    }
                    Some(live) => {
                        // The stored bytes are the snapshot's: carry its schema, so the
                        // next registration migrates (or refuses) them.
                        if live.schema != s.schema {
                            states.insert(
                                s.name.clone(),
                                Arc::new(StateMeta {
                                    schema: s.schema.clone(),
                                    ..(*live).clone()
                                }),
                            );
                        }
                        live.id
                    }
                    None => {
                        if next_id >= FIRST_RESERVED_ID {
                            return Err(StateError::Invalid("too many states".into()));
                        }
                        let m = Arc::new(StateMeta {
                            id: next_id,
                            ..s.clone()
                        });
                        next_id += 1;
                        states.insert(s.name.clone(), m.clone());
                        m.id
                    }
                };
                remap.insert(s.id, id);
            }
            remaps.push(remap);
        }
        // 3. Build the new keyed state in a fresh backend.
        let generation = g.generation + 1;
        let needed: Vec<usize> = (0..metas.len()).filter(|i| metas[*i].3).collect();
        // Fast path (a restart without rescale): reuse the checkpoint's SSTs.
        let reuse = match needed.as_slice() {
            [i] => {
                let (_, r, _, _) = &metas[*i];
                g.config.backend == BackendKind::Rocksdb
                    && r.keyed_format == KeyedFormat::RocksdbCheckpoint
                    && r.identity.key_group_range == range
                    && remaps[*i].iter().all(|(a, b)| a == b)
            }
            _ => false,
        };
        let new_dir = g.config.work_dir.join(format!("rocksdb-{generation}"));
        let mut backend: Box<dyn crate::backend::KvBackend> = if reuse {
            if new_dir.exists() {
                std::fs::remove_dir_all(&new_dir).at(&new_dir)?;
            }
            match RocksBackend::open_from_checkpoint(
                &metas[needed[0]].0.join("db"),
                &new_dir,
                g.ttl_registry.clone(),
                g.clock.clone(),
            ) {
                Ok(b) => Box::new(b),
                Err(e) => {
                    let _ = std::fs::remove_dir_all(&new_dir);
                    return Err(e);
                }
            }
        } else {
            open_backend(&g.config, generation, &g.ttl_registry, &g.clock)?
        };
        let log_dir = g.config.work_dir.join("restore-logs");
        let fill = (|| -> Result<()> {
            let (start, end) = layout::key_group_bounds(range.start, range.end);
            for ((dir, r, _, needed), remap) in metas.iter().zip(&remaps) {
                if !needed || reuse {
                    continue;
                }
                let mut pending: Vec<(Vec<u8>, Vec<u8>)> = Vec::with_capacity(BATCH);
                let mut put = |k: &[u8], v: &[u8]| -> Result<()> {
                    let kg = u16::from_be_bytes([k[0], k[1]]) as u32;
                    if !range.contains(kg) {
                        return Ok(());
                    }
                    let id = u16::from_be_bytes([k[2], k[3]]);
                    let new_id = if id >= FIRST_RESERVED_ID {
                        id
                    } else {
                        *remap.get(&id).ok_or_else(|| StateError::Corrupt {
                            path: dir.join(META_FILE),
                            reason: format!("state id {id} not registered"),
                        })?
                    };
                    let mut key = k.to_vec();
                    key[2..4].copy_from_slice(&new_id.to_be_bytes());
                    pending.push((key, v.to_vec()));
                    if pending.len() >= BATCH {
                        backend.put_many(&pending)?;
                        pending.clear();
                    }
                    Ok(())
                };
                match r.keyed_format {
                    KeyedFormat::Canonical => read_canonical(&dir.join(KEYED_FILE), &mut put)?,
                    KeyedFormat::RocksdbCheckpoint => {
                        std::fs::create_dir_all(&log_dir).at(&log_dir)?;
                        scan_checkpoint(&dir.join("db"), &log_dir, &start, &end, &mut put)?
                    }
                }
                backend.put_many(&pending)?;
            }
            backend.flush()
        })();
        let operator = match fill.and_then(|_| {
            let lists = metas
                .iter()
                .map(|(_, r, m, _)| {
                    (
                        r.identity.instance_index,
                        r.identity.instance_count,
                        m.part.operator_lists.clone(),
                    )
                })
                .collect();
            let lists = redistribute(lists, g.config.instance_index, g.config.instance_count)?;
            let mut broadcast = BTreeMap::new();
            if let Some((_, _, m, _)) = metas
                .iter()
                .min_by_key(|(_, r, _, _)| r.identity.instance_index)
            {
                for (name, entries) in &m.part.broadcast {
                    let mut map = BTreeMap::new();
                    for (k, v) in entries {
                        let k = hex::decode(k)
                            .map_err(|e| StateError::Invalid(format!("broadcast state: {e}")))?;
                        let v = hex::decode(v)
                            .map_err(|e| StateError::Invalid(format!("broadcast state: {e}")))?;
                        map.insert(k, v);
                    }
                    broadcast.insert(name.clone(), map);
                }
            }
            Ok(OperatorStates { lists, broadcast })
        }) {
            Ok(o) => o,
            Err(e) => {
                drop(backend);
                let _ = std::fs::remove_dir_all(
                    g.config.work_dir.join(format!("rocksdb-{generation}")),
                );
                return Err(e);
            }
        };
        // 4. Swap in; the state cache's entries, dirty or not, go with the old state.
        let old = g.backend.replace(backend);
        drop(old);
        // The old files' hashes go with them (its thread hashing ahead ended with it): the
        // new database may reuse their names.
        g.sha_cache.clear();
        if reuse {
            // The restored SSTs keep their names and were verified against these hashes
            // above: the first checkpoint need not read them again.
            for f in &metas[needed[0]].1.files {
                g.sha_cache.remember(f);
            }
        }
        let old_dir = g.config.work_dir.join(format!("rocksdb-{}", g.generation));
        if old_dir.exists() {
            std::fs::remove_dir_all(&old_dir).at(&old_dir)?;
        }
        g.generation = generation;
        g.states.clear();
        g.by_id.clear();
        for m in states.into_values() {
            g.install(m);
        }
        g.next_id = next_id;
        *g.operator.lock() = operator;
        g.restored = !parts.is_empty();
        g.cursor.clear();
        let hashes = g.sha_cache.clone();
        g.backend.hash_ahead(&hashes)?;
        g.rebuild_timer_index()?;
        Ok(())
    }
}

#[cfg(test)]
mod tests {
    use crate::{BackendKind, StateStore, StoreConfig, ValueStateDescriptor};

    /// A restart restores its checkpoint's SSTs as they are (linked, names kept), and the
    /// restore verified each against its hash: the first checkpoint after it takes those
    /// hashes from the cache instead of reading every file of the state again.
    #[test]
    fn a_restore_that_reuses_the_checkpoints_files_remembers_their_verified_hashes() {
        let tmp = tempfile::tempdir().unwrap();
        let open = |name: &str| {
            StateStore::open(StoreConfig::new(
                BackendKind::Rocksdb,
                tmp.path().join(name),
                128,
            ))
            .unwrap()
        };
        let before = open("before");
        let v = before
            .value_state(&ValueStateDescriptor::<u64>::new("n"))
            .unwrap();
        for i in 0..1_000u64 {
            before.set_current_key(format!("k{i}").as_bytes()).unwrap();
            v.update(&i).unwrap();
        }
        let chk = tmp.path().join("chk-1");
        let result = before.snapshot(1, &chk).unwrap();
        let ssts: Vec<_> = result
            .files
            .iter()
            .filter(|f| f.path.ends_with(".sst"))
            .collect();
        assert!(!ssts.is_empty(), "the checkpoint holds SSTs: {result:?}");

        let after = open("after");
        after.restore(&[(chk, result.clone())]).unwrap();
        let g = after.lock();
        for f in ssts {
            assert!(
                g.sha_cache.knows(&f.path, f.size),
                "{} not remembered after the restore",
                f.path
            );
        }
    }
}
