//! `s3://` checkpoint storage: any S3-compatible object store (AWS S3, MinIO, R2, moto).
//!
//! Object keys mirror [`super::FsStorage`]'s layout under `<prefix>/<app_id>/instance-<n>/`:
//! - `chk-<id>-<run>/manifest.json`, `COMPLETED`, and the checkpoint's private files;
//! - `shared/<sha256>`: immutable SST files, stored once, referenced by many checkpoints.
//!
//! An object store has no directory rename, so publication works differently from the
//! file system: a checkpoint **exists iff its `manifest.json` exists**. Every other object
//! is uploaded first and the manifest last; a crash before that leaves a prefix without a
//! manifest (debris) that [`CheckpointStorage::list`] ignores and `prune` deletes once it
//! is older than the committed checkpoint. Deletion goes the other way round: manifest
//! first, so an interrupted delete also leaves debris, never a checkpoint with holes.
//! A completed PUT (single or multipart) is durable, which is what
//! [`CheckpointStorage::write`] promises before the Kafka transaction commits.
//!
//! The trait is synchronous because the job loop is a plain thread; each storage owns a
//! current-thread tokio runtime and blocks on it. Call it from a plain thread or from
//! `spawn_blocking`, never from inside an async task (tokio refuses nested runtimes).
//!
//! Client settings come from the standard environment (`AWS_ACCESS_KEY_ID`,
//! `AWS_SECRET_ACCESS_KEY`, `AWS_SESSION_TOKEN`, `AWS_REGION`/`AWS_DEFAULT_REGION`,
//! `AWS_ENDPOINT_URL`/`AWS_ENDPOINT`, web identity and container credentials, ...), see
//! [`AmazonS3Builder::from_env`]. Requests are path-style unless
//! `AWS_VIRTUAL_HOSTED_STYLE_REQUEST=true`; plain HTTP is allowed when the endpoint is
//! `http://`. Buckets should have a lifecycle rule that aborts incomplete multipart
//! uploads: a process killed mid-upload cannot abort its own.

use std::collections::{BTreeMap, HashMap, HashSet};
use std::fs;
use std::io::{Read, Write};
use std::path::{Path as LocalPath, PathBuf};
use std::sync::{Arc, Mutex};

use futures::{StreamExt, TryStreamExt};
use object_store::aws::{AmazonS3Builder, AmazonS3ConfigKey};
use object_store::path::Path;
use object_store::{ObjectStore, ObjectStoreExt, PutMode, PutOptions, PutPayload, WriteMultipart};

use super::{
    CheckpointError, CheckpointInfo, CheckpointRef, CheckpointStorage, Manifest, WriteStats,
    is_shared,
};

const MANIFEST: &str = "manifest.json";
const COMPLETED: &str = "COMPLETED";
const SHARED: &str = "shared";

/// Files of at least this size are uploaded in parts of this size, so a 1 GB SST never
/// sits in memory (S3's minimum part size is 5 MiB).
const PART_SIZE: usize = 8 * 1024 * 1024;
/// Parts of one multipart upload in flight at once.
const PARTS_IN_FLIGHT: usize = 2;
/// Files uploaded or downloaded at once: hides per-request latency. With the part
/// settings above this bounds upload buffers to about 4 × 3 × 8 MiB.
const FILES_IN_FLIGHT: usize = 4;

pub struct S3Storage {
    store: Arc<dyn ObjectStore>,
    bucket: String,
    /// `<prefix>/<app_id>/instance-<n>`: every key of this instance starts here.
    root: Path,
    endpoint: Option<String>,
    part_size: usize,
    /// Whether `PutMode::Create` works (conditional puts are not disabled by
    /// `AWS_CONDITIONAL_PUT=disabled`); without it the manifest is published by
    /// head-then-put, see [`S3Storage::publish_manifest`].
    conditional_put: bool,
    /// Shared-file hashes of published checkpoints, by name (see [`S3Storage::shared_hashes`]).
    manifests: Mutex<HashMap<CheckpointRef, Arc<Vec<String>>>>,
    runtime: tokio::runtime::Runtime,
}

/// What one listing found under the instance's root.
#[derive(Default)]
struct Scan {
    /// Every checkpoint-named prefix, including debris without a manifest.
    checkpoints: BTreeMap<CheckpointRef, Entry>,
    shared: Vec<object_store::ObjectMeta>,
}

#[derive(Default)]
struct Entry {
    manifest: bool,
    completed: bool,
    keys: Vec<Path>,
}

impl std::fmt::Debug for S3Storage {
    fn fmt(&self, f: &mut std::fmt::Formatter<'_>) -> std::fmt::Result {
        f.debug_struct("S3Storage")
            .field("location", &self.describe())
            .finish_non_exhaustive()
    }
}

impl S3Storage {
    /// Opens `s3://<bucket>/<prefix>` for this app and instance with client settings
    /// from the environment. Makes no request: a wrong endpoint or credentials show up
    /// at the first operation, which recovery performs right after start.
    ///
    /// Each request's retries end after `retry_timeout` (`checkpoint.timeout`), so a
    /// store that stays away fails the checkpoint, which the job rewinds, instead of
    /// holding it for the client's default three minutes.
    pub fn open(
        bucket: &str,
        prefix: &str,
        app_id: &str,
        instance: u32,
        retry_timeout: std::time::Duration,
    ) -> Result<Self, CheckpointError> {
        let retry = object_store::RetryConfig {
            retry_timeout,
            ..Default::default()
        };
        Self::with_builder(
            AmazonS3Builder::from_env().with_retry(retry),
            bucket,
            prefix,
            app_id,
            instance,
        )
    }

    /// Like [`S3Storage::open`] with client settings from `builder` (tests, tools).
    pub fn with_builder(
        builder: AmazonS3Builder,
        bucket: &str,
        prefix: &str,
        app_id: &str,
        instance: u32,
    ) -> Result<Self, CheckpointError> {
        let location = format!("s3://{bucket}/{prefix}");
        let bad = |reason: String| CheckpointError::ObjectStore {
            key: location.clone(),
            reason,
        };
        let base = Path::parse(prefix.trim_matches('/'))
            .map_err(|e| bad(format!("invalid key prefix: {e}")))?;
        let root = base.join(app_id).join(format!("instance-{instance}"));
        let endpoint = builder
            .get_config_value(&AmazonS3ConfigKey::S3Endpoint)
            .or_else(|| builder.get_config_value(&AmazonS3ConfigKey::Endpoint));
        let mut builder = builder.with_bucket_name(bucket);
        if endpoint
            .as_deref()
            .is_some_and(|e| e.starts_with("http://"))
        {
            // An explicit http:// endpoint is a deliberate choice (a local MinIO or moto);
            // object_store would otherwise refuse it.
            builder = builder.with_allow_http(true);
        }
        let conditional_put = builder
            .get_config_value(&AmazonS3ConfigKey::ConditionalPut)
            .is_none_or(|v| v.trim() != "disabled");
        let store = builder
            .build()
            .map_err(|e| bad(format!("cannot configure the S3 client: {e}")))?;
        // One thread is enough: requests are I/O-bound and overlap as futures.
        let runtime = tokio::runtime::Builder::new_current_thread()
            .enable_all()
            .thread_name("checkpoint-s3")
            .build()
            .map_err(|e| bad(format!("cannot start the I/O runtime: {e}")))?;
        Ok(Self {
            store: Arc::new(store),
            bucket: bucket.to_string(),
            root,
            endpoint,
            part_size: PART_SIZE,
            conditional_put,
            manifests: Mutex::default(),
            runtime,
        })
    }

    fn dir(&self, c: &CheckpointRef) -> Path {
        self.root.clone().join(c.to_string())
    }

    fn manifest_key(&self, c: &CheckpointRef) -> Path {
        self.dir(c).join(MANIFEST)
    }

    fn shared_key(&self, sha256: &str) -> Path {
        self.root.clone().join(SHARED).join(sha256)
    }

    /// Where a manifest's file lives in this storage.
    fn stored_key(&self, c: &CheckpointRef, path: &str, sha256: &str) -> Path {
        if is_shared(path) {
            self.shared_key(sha256)
        } else {
            path.split('/')
                .fold(self.dir(c), |key, part| key.join(part))
        }
    }

    /// The full address of a key, for errors and logs.
    fn url(&self, key: &Path) -> String {
        format!("s3://{}/{key}", self.bucket)
    }

    fn store_error(&self, key: &Path, e: object_store::Error) -> CheckpointError {
        CheckpointError::ObjectStore {
            key: self.url(key),
            reason: e.to_string(),
        }
    }

    fn io_error(&self, key: &Path, local: &LocalPath, e: std::io::Error) -> CheckpointError {
        CheckpointError::ObjectStore {
            key: self.url(key),
            reason: format!("{}: {e}", local.display()),
        }
    }

    async fn exists(&self, key: &Path) -> Result<Option<u64>, CheckpointError> {
        match self.store.head(key).await {
            Ok(meta) => Ok(Some(meta.size)),
            Err(object_store::Error::NotFound { .. }) => Ok(None),
            Err(e) => Err(self.store_error(key, e)),
        }
    }

    /// Uploads one local file; returns the bytes sent. Small files go in one PUT, larger
    /// ones in parts with bounded buffering; either way the object appears whole or not
    /// at all.
    async fn upload(&self, from: &LocalPath, key: &Path) -> Result<u64, CheckpointError> {
        let mut file = fs::File::open(from).map_err(|e| self.io_error(key, from, e))?;
        let len = file
            .metadata()
            .map_err(|e| self.io_error(key, from, e))?
            .len();
        if len < self.part_size as u64 {
            let mut bytes = Vec::with_capacity(len as usize);
            file.read_to_end(&mut bytes)
                .map_err(|e| self.io_error(key, from, e))?;
            let sent = bytes.len() as u64;
            self.store
                .put(key, PutPayload::from(bytes))
                .await
                .map_err(|e| self.store_error(key, e))?;
            return Ok(sent);
        }
        let upload = self
            .store
            .put_multipart(key)
            .await
            .map_err(|e| self.store_error(key, e))?;
        let mut parts = WriteMultipart::new_with_chunk_size(upload, self.part_size);
        let mut buf = vec![0u8; self.part_size];
        let mut sent = 0u64;
        let failed = loop {
            if let Err(e) = parts.wait_for_capacity(PARTS_IN_FLIGHT).await {
                break self.store_error(key, e);
            }
            match read_full(&mut file, &mut buf) {
                Ok(0) => {
                    return match parts.finish().await {
                        Ok(_) => Ok(sent),
                        // finish() aborts the upload itself when completing fails.
                        Err(e) => Err(self.store_error(key, e)),
                    };
                }
                Ok(n) => {
                    parts.write(&buf[..n]);
                    sent += n as u64;
                }
                Err(e) => break self.io_error(key, from, e),
            }
        };
        // Best effort: uploaded parts cost storage until aborted (or a lifecycle rule
        // does it); the original error is the one to report.
        let _ = parts.abort().await;
        Err(failed)
    }

    /// Streams one object into a local file; returns its size, or `None` if the object
    /// does not exist.
    async fn download(&self, key: &Path, to: &LocalPath) -> Result<Option<u64>, CheckpointError> {
        let mut stream = match self.store.get(key).await {
            Ok(got) => got.into_stream(),
            Err(object_store::Error::NotFound { .. }) => return Ok(None),
            Err(e) => return Err(self.store_error(key, e)),
        };
        let mut out = fs::File::create(to).map_err(|e| CheckpointError::io(to, e))?;
        let mut n = 0u64;
        while let Some(chunk) = stream.next().await {
            let chunk = chunk.map_err(|e| self.store_error(key, e))?;
            out.write_all(&chunk)
                .map_err(|e| CheckpointError::io(to, e))?;
            n += chunk.len() as u64;
        }
        Ok(Some(n))
    }

    /// Publishes the manifest, which makes the checkpoint exist; fails if it already does.
    ///
    /// With conditional puts (the default; AWS S3, MinIO, R2 and moto honour
    /// `If-None-Match: *`) the store itself refuses a second manifest, so two writers of
    /// one name cannot both win. With `AWS_CONDITIONAL_PUT=disabled` (or a store that
    /// ignores the header) this is head-then-put: a writer racing between the two requests
    /// could replace the manifest. Names carry the writing process's random run id, so
    /// only one process ever writes a given name and the race needs a bug to happen.
    async fn publish_manifest(
        &self,
        c: &CheckpointRef,
        json: Vec<u8>,
    ) -> Result<(), CheckpointError> {
        let key = self.manifest_key(c);
        let published = || CheckpointError::AlreadyPublished {
            name: c.to_string(),
            key: self.url(&key),
        };
        if !self.conditional_put {
            if self.exists(&key).await?.is_some() {
                return Err(published());
            }
            return self
                .store
                .put(&key, json.into())
                .await
                .map(drop)
                .map_err(|e| self.store_error(&key, e));
        }
        let create = PutOptions {
            mode: PutMode::Create,
            ..PutOptions::default()
        };
        match self.store.put_opts(&key, json.into(), create).await {
            Ok(_) => Ok(()),
            Err(object_store::Error::AlreadyExists { .. }) => Err(published()),
            Err(e) => Err(self.store_error(&key, e)),
        }
    }

    async fn write_async(
        &self,
        manifest: &Manifest,
        src: &LocalPath,
    ) -> Result<WriteStats, CheckpointError> {
        let c = &manifest.checkpoint;
        // Checked before anything is uploaded: a second writer of a published name would
        // otherwise overwrite its private files before failing at the manifest.
        let manifest_key = self.manifest_key(c);
        if self.exists(&manifest_key).await?.is_some() {
            return Err(CheckpointError::AlreadyPublished {
                name: c.to_string(),
                key: self.url(&manifest_key),
            });
        }
        let total: u64 = manifest.state.files.iter().map(|f| f.size).sum();
        let written: u64 = futures::stream::iter(&manifest.state.files)
            .map(|file| async move {
                let key = self.stored_key(c, &file.path, &file.sha256);
                // Shared files are content-addressed: one already stored is the same bytes.
                if is_shared(&file.path) && self.exists(&key).await? == Some(file.size) {
                    return Ok(0);
                }
                self.upload(&src.join(&file.path), &key).await
            })
            .buffer_unordered(FILES_IN_FLIGHT)
            .try_fold(0u64, |sum, n| async move { Ok(sum + n) })
            .await?;
        let json =
            serde_json::to_vec_pretty(manifest).map_err(|e| CheckpointError::BadManifest {
                name: c.to_string(),
                path: PathBuf::from(self.url(&manifest_key)),
                reason: e.to_string(),
            })?;
        let manifest_len = json.len() as u64;
        self.publish_manifest(c, json).await?;
        self.remember(manifest);
        Ok(WriteStats {
            bytes_written: written + manifest_len,
            bytes_total: total,
        })
    }

    async fn read_manifest_async(&self, c: &CheckpointRef) -> Result<Manifest, CheckpointError> {
        let key = self.manifest_key(c);
        let bytes = match self.store.get(&key).await {
            Ok(got) => got.bytes().await.map_err(|e| self.store_error(&key, e))?,
            Err(object_store::Error::NotFound { .. }) => {
                return Err(CheckpointError::Missing {
                    name: c.to_string(),
                    path: PathBuf::from(self.url(&key)),
                });
            }
            Err(e) => return Err(self.store_error(&key, e)),
        };
        let bad = |reason: String| CheckpointError::BadManifest {
            name: c.to_string(),
            path: PathBuf::from(self.url(&key)),
            reason,
        };
        Manifest::parse(&bytes, c).map_err(bad)
    }

    async fn fetch_async(
        &self,
        manifest: &Manifest,
        into: &LocalPath,
    ) -> Result<(), CheckpointError> {
        let c = &manifest.checkpoint;
        remove_dir_if_exists(into)?;
        for file in &manifest.state.files {
            if let Some(parent) = into.join(&file.path).parent() {
                fs::create_dir_all(parent).map_err(|e| CheckpointError::io(parent, e))?;
            }
        }
        futures::stream::iter(&manifest.state.files)
            .map(|file| async move {
                let key = self.stored_key(c, &file.path, &file.sha256);
                let corrupt = |reason: String| CheckpointError::Corrupt {
                    name: c.to_string(),
                    path: PathBuf::from(self.url(&key)),
                    reason,
                };
                match self.download(&key, &into.join(&file.path)).await? {
                    Some(n) if n == file.size => Ok(()),
                    Some(n) => Err(corrupt(format!(
                        "{n} bytes, the manifest lists {} as {} bytes",
                        file.path, file.size
                    ))),
                    None => Err(corrupt(format!(
                        "missing (listed in the manifest as {})",
                        file.path
                    ))),
                }
            })
            .buffer_unordered(FILES_IN_FLIGHT)
            .try_collect::<()>()
            .await
    }

    /// Everything stored for this instance, from one recursive listing (one request per
    /// 1000 keys): cheaper than a listing per checkpoint, and one view for a whole prune.
    async fn scan(&self) -> Result<Scan, CheckpointError> {
        let objects: Vec<object_store::ObjectMeta> = self
            .store
            .list(Some(&self.root))
            .try_collect()
            .await
            .map_err(|e| self.store_error(&self.root, e))?;
        let mut scan = Scan::default();
        for meta in objects {
            // The key's segments below the root: `shared/<sha>` or `chk-…/<file…>`.
            let Some(below) = meta.location.prefix_match(&self.root) else {
                continue;
            };
            let below: Vec<String> = below.map(|part| part.as_ref().to_string()).collect();
            match below.as_slice() {
                [top, _] if top == SHARED => scan.shared.push(meta),
                [top, rest @ ..] => {
                    let Some(c) = CheckpointRef::parse(top) else {
                        continue;
                    };
                    let entry = scan.checkpoints.entry(c).or_default();
                    entry.manifest |= rest == [MANIFEST];
                    entry.completed |= rest == [COMPLETED];
                    entry.keys.push(meta.location);
                }
                [] => {}
            }
        }
        Ok(scan)
    }

    async fn list_async(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        // BTreeMap order is checkpoint order.
        Ok(self
            .scan()
            .await?
            .checkpoints
            .into_iter()
            .filter(|(_, e)| e.manifest)
            .map(|(checkpoint, e)| CheckpointInfo {
                checkpoint,
                completed: e.completed,
            })
            .collect())
    }

    /// Deletes `keys`; missing objects are fine (deletes are idempotent).
    async fn delete_keys(&self, keys: Vec<Path>, what: &Path) -> Result<(), CheckpointError> {
        if keys.is_empty() {
            return Ok(());
        }
        let mut deleted = self
            .store
            .delete_stream(futures::stream::iter(keys.into_iter().map(Ok)).boxed());
        while let Some(result) = deleted.next().await {
            match result {
                Ok(_) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.store_error(what, e)),
            }
        }
        Ok(())
    }

    /// Removes a checkpoint's objects as listed by [`S3Storage::scan`]: manifest first, so
    /// from that moment it no longer exists and an interrupted delete leaves debris rather
    /// than a checkpoint missing files.
    async fn delete_checkpoint(
        &self,
        c: &CheckpointRef,
        entry: &Entry,
    ) -> Result<(), CheckpointError> {
        self.forget(c);
        let manifest = self.manifest_key(c);
        if entry.manifest {
            match self.store.delete(&manifest).await {
                Ok(()) | Err(object_store::Error::NotFound { .. }) => {}
                Err(e) => return Err(self.store_error(&manifest, e)),
            }
        }
        let rest = entry
            .keys
            .iter()
            .filter(|k| **k != manifest)
            .cloned()
            .collect();
        self.delete_keys(rest, &self.dir(c)).await
    }

    async fn discard_uncommitted_async(
        &self,
        committed: Option<&CheckpointRef>,
    ) -> Result<Vec<CheckpointRef>, CheckpointError> {
        // Debris (no manifest) is left to `prune`: it may be a paused zombie's upload, and
        // the zombie should find out it is fenced at its commit, not by vanished objects.
        let mut removed = Vec::new();
        for (c, entry) in self.scan().await?.checkpoints {
            let uncommitted = committed.is_none_or(|k| c.id > k.id || (c.id == k.id && c != *k));
            if entry.manifest && uncommitted {
                self.delete_checkpoint(&c, &entry).await?;
                removed.push(c);
            }
        }
        Ok(removed)
    }

    async fn prune_async(
        &self,
        retained: usize,
        keep: &CheckpointRef,
    ) -> Result<(), CheckpointError> {
        let Scan {
            checkpoints,
            shared,
        } = self.scan().await?;
        let completed: Vec<&CheckpointRef> = checkpoints
            .iter()
            .filter(|(_, e)| e.manifest && e.completed)
            .map(|(c, _)| c)
            .collect();
        let cut = completed.len().saturating_sub(retained);
        let mut doomed: HashSet<&CheckpointRef> = completed
            .into_iter()
            .take(cut)
            .filter(|c| *c != keep)
            .collect();
        // Incomplete (or without a manifest) and older than the committed one: abandoned
        // by a crash or a zombie. Newer debris may be a write in progress.
        doomed.extend(
            checkpoints
                .iter()
                .filter(|(c, e)| !(e.manifest && e.completed) && c.id < keep.id)
                .map(|(c, _)| c),
        );
        let mut referenced = HashSet::new();
        for (c, entry) in &checkpoints {
            if doomed.contains(c) {
                self.delete_checkpoint(c, entry).await?;
            } else if entry.manifest {
                // A checkpoint being written by someone else has no manifest yet; its
                // shared files can only belong to an uncommitted epoch. A manifest deleted
                // since the listing or unreadable references nothing (as in FsStorage), but
                // a failed request stops the prune: guessing would delete live files.
                match self.shared_hashes(c).await {
                    Ok(hashes) => referenced.extend(hashes.iter().cloned()),
                    Err(CheckpointError::Missing { .. } | CheckpointError::BadManifest { .. }) => {}
                    Err(e) => return Err(e),
                }
            }
        }
        let orphans: Vec<Path> = shared
            .into_iter()
            .filter(|meta| {
                meta.location
                    .filename()
                    .is_some_and(|name| !referenced.contains(name))
            })
            .map(|meta| meta.location)
            .collect();
        self.delete_keys(orphans, &self.root.clone().join(SHARED))
            .await
    }

    /// The shared files a published checkpoint references. A manifest never changes once
    /// published, so each is read at most once per process.
    async fn shared_hashes(&self, c: &CheckpointRef) -> Result<Arc<Vec<String>>, CheckpointError> {
        if let Some(known) = self.lock_manifests().get(c) {
            return Ok(known.clone());
        }
        let manifest = self.read_manifest_async(c).await?;
        Ok(self.remember(&manifest))
    }

    fn remember(&self, manifest: &Manifest) -> Arc<Vec<String>> {
        let hashes: Vec<String> = manifest
            .state
            .files
            .iter()
            .filter(|f| is_shared(&f.path))
            .map(|f| f.sha256.clone())
            .collect();
        let hashes = Arc::new(hashes);
        self.lock_manifests()
            .insert(manifest.checkpoint.clone(), hashes.clone());
        hashes
    }

    fn forget(&self, c: &CheckpointRef) {
        self.lock_manifests().remove(c);
    }

    fn lock_manifests(
        &self,
    ) -> std::sync::MutexGuard<'_, HashMap<CheckpointRef, Arc<Vec<String>>>> {
        // The map is a cache of immutable data: a panic elsewhere cannot leave it wrong.
        self.manifests
            .lock()
            .unwrap_or_else(std::sync::PoisonError::into_inner)
    }

    async fn mark_complete_async(&self, c: &CheckpointRef) -> Result<(), CheckpointError> {
        // Only a published checkpoint can complete; a marker alone would be debris.
        let manifest = self.manifest_key(c);
        if self.exists(&manifest).await?.is_none() {
            return Err(CheckpointError::Missing {
                name: c.to_string(),
                path: PathBuf::from(self.url(&manifest)),
            });
        }
        let key = self.dir(c).join(COMPLETED);
        self.store
            .put(&key, PutPayload::default())
            .await
            .map(drop)
            .map_err(|e| self.store_error(&key, e))
    }
}

impl CheckpointStorage for S3Storage {
    fn write(&self, manifest: &Manifest, src: &LocalPath) -> Result<WriteStats, CheckpointError> {
        self.runtime.block_on(self.write_async(manifest, src))
    }

    fn mark_complete(&self, c: &CheckpointRef) -> Result<(), CheckpointError> {
        self.runtime.block_on(self.mark_complete_async(c))
    }

    fn put_document(&self, name: &str, bytes: &[u8]) -> Result<(), CheckpointError> {
        let key = self.root.clone().join(name);
        let opts = object_store::PutOptions {
            mode: object_store::PutMode::Create,
            ..Default::default()
        };
        let payload = PutPayload::from(bytes.to_vec());
        self.runtime
            .block_on(self.store.put_opts(&key, payload, opts))
            .map(drop)
            .map_err(|e| self.store_error(&key, e))
    }

    fn get_document(&self, name: &str) -> Result<Option<Vec<u8>>, CheckpointError> {
        let key = self.root.clone().join(name);
        self.runtime.block_on(async {
            match self.store.get(&key).await {
                Ok(got) => got
                    .bytes()
                    .await
                    .map(|b| Some(b.to_vec()))
                    .map_err(|e| self.store_error(&key, e)),
                Err(object_store::Error::NotFound { .. }) => Ok(None),
                Err(e) => Err(self.store_error(&key, e)),
            }
        })
    }

    fn read_manifest(&self, c: &CheckpointRef) -> Result<Manifest, CheckpointError> {
        self.runtime.block_on(self.read_manifest_async(c))
    }

    fn fetch(&self, manifest: &Manifest, into: &LocalPath) -> Result<(), CheckpointError> {
        self.runtime.block_on(self.fetch_async(manifest, into))
    }

    fn list(&self) -> Result<Vec<CheckpointInfo>, CheckpointError> {
        self.runtime.block_on(self.list_async())
    }

    fn discard_uncommitted(
        &self,
        committed: Option<&CheckpointRef>,
    ) -> Result<Vec<CheckpointRef>, CheckpointError> {
        self.runtime
            .block_on(self.discard_uncommitted_async(committed))
    }

    fn prune(&self, retained: usize, keep: &CheckpointRef) -> Result<(), CheckpointError> {
        self.runtime.block_on(self.prune_async(retained, keep))
    }

    fn describe(&self) -> String {
        match &self.endpoint {
            Some(endpoint) => format!("s3://{}/{} (endpoint {endpoint})", self.bucket, self.root),
            None => format!("s3://{}/{}", self.bucket, self.root),
        }
    }
}

/// Reads until `buf` is full or the file ends: parts must be full-sized except the last.
fn read_full(file: &mut fs::File, buf: &mut [u8]) -> std::io::Result<usize> {
    let mut n = 0;
    while n < buf.len() {
        match file.read(&mut buf[n..]) {
            Ok(0) => break,
            Ok(k) => n += k,
            Err(e) if e.kind() == std::io::ErrorKind::Interrupted => {}
            Err(e) => return Err(e),
        }
    }
    Ok(n)
}

fn remove_dir_if_exists(path: &LocalPath) -> Result<(), CheckpointError> {
    match fs::remove_dir_all(path) {
        Err(e) if e.kind() != std::io::ErrorKind::NotFound => Err(CheckpointError::io(path, e)),
        _ => Ok(()),
    }
}

/// Runs on the moto server that `integration-tests/s3/moto.sh start` provides (the test
/// script starts it before the unit tests). Without it these tests fail: they are the
/// only check of the S3 code paths, so skipping silently would hide regressions.
#[cfg(test)]
mod tests {
    use super::super::suite;
    use super::*;
    use std::sync::atomic::{AtomicU32, Ordering};
    use std::time::Duration;

    fn endpoint() -> String {
        std::env::var("STREAMSTATE_TEST_S3_ENDPOINT")
            .unwrap_or_else(|_| "http://127.0.0.1:19000".to_string())
    }

    /// A bucket no other test (or earlier run) uses.
    fn unique_bucket() -> String {
        static N: AtomicU32 = AtomicU32::new(0);
        let now = std::time::SystemTime::now()
            .duration_since(std::time::UNIX_EPOCH)
            .map_or(0, |d| d.as_millis());
        format!(
            "sst-{}-{}-{}",
            std::process::id(),
            now % 1_000_000_000,
            N.fetch_add(1, Ordering::SeqCst)
        )
    }

    /// Creates a bucket with a plain unsigned `PUT /<bucket>`, which moto accepts;
    /// object_store has no bucket API.
    fn create_bucket(endpoint: &str, bucket: &str) {
        let hint = "is the test S3 server up? run `integration-tests/s3/moto.sh start` (or set STREAMSTATE_TEST_S3_ENDPOINT)";
        let url = url::Url::parse(endpoint)
            .unwrap_or_else(|e| panic!("STREAMSTATE_TEST_S3_ENDPOINT={endpoint}: {e}"));
        let host = url.host_str().unwrap_or("127.0.0.1");
        let port = url.port_or_known_default().unwrap_or(80);
        let addr = std::net::ToSocketAddrs::to_socket_addrs(&(host, port))
            .ok()
            .and_then(|mut a| a.next())
            .unwrap_or_else(|| panic!("cannot resolve {host}:{port}; {hint}"));
        let mut conn = std::net::TcpStream::connect_timeout(&addr, Duration::from_secs(3))
            .unwrap_or_else(|e| {
                panic!("cannot connect to the S3 endpoint {endpoint}: {e}; {hint}")
            });
        conn.set_read_timeout(Some(Duration::from_secs(10)))
            .expect("read timeout");
        write!(conn, "PUT /{bucket} HTTP/1.1\r\nHost: {host}:{port}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n")
            .unwrap_or_else(|e| panic!("create bucket {bucket} at {endpoint}: {e}; {hint}"));
        let mut reply = String::new();
        conn.read_to_string(&mut reply)
            .unwrap_or_else(|e| panic!("create bucket {bucket} at {endpoint}: {e}; {hint}"));
        let status = reply.split_whitespace().nth(1).unwrap_or("none");
        assert_eq!(
            status,
            "200",
            "create bucket {bucket} at {endpoint}: {}; {hint}",
            reply.lines().next().unwrap_or("")
        );
    }

    /// A builder for the test server: explicit settings, so the tests neither depend on
    /// nor race over process-wide environment variables.
    fn builder() -> AmazonS3Builder {
        let env = |k: &str, default: &str| std::env::var(k).unwrap_or_else(|_| default.to_string());
        let retry = object_store::RetryConfig {
            max_retries: 2,
            retry_timeout: Duration::from_secs(20),
            ..Default::default()
        };
        AmazonS3Builder::new()
            .with_endpoint(endpoint())
            .with_access_key_id(env("AWS_ACCESS_KEY_ID", "test"))
            .with_secret_access_key(env("AWS_SECRET_ACCESS_KEY", "test"))
            .with_region(env("AWS_REGION", "us-east-1"))
            .with_retry(retry)
    }

    fn storage() -> S3Storage {
        let bucket = unique_bucket();
        create_bucket(&endpoint(), &bucket);
        S3Storage::with_builder(builder(), &bucket, "ckpt/tests", "app", 0).expect("open")
    }

    fn get(s: &S3Storage, key: &Path) -> Option<Vec<u8>> {
        s.runtime.block_on(async {
            match s.store.get(key).await {
                Ok(got) => Some(got.bytes().await.expect("body").to_vec()),
                Err(object_store::Error::NotFound { .. }) => None,
                Err(e) => panic!("get {key}: {e}"),
            }
        })
    }

    fn keys_under(s: &S3Storage, prefix: &Path) -> Vec<String> {
        let mut keys: Vec<String> = s
            .runtime
            .block_on(
                s.store
                    .list(Some(prefix))
                    .map_ok(|m| m.location.to_string())
                    .try_collect::<Vec<_>>(),
            )
            .expect("list");
        keys.sort();
        keys
    }

    #[test]
    fn round_trips_and_shares_sst_files() {
        suite::round_trips_and_shares_sst_files(&storage());
    }

    #[test]
    fn discards_what_never_committed() {
        suite::discards_what_never_committed(&storage());
    }

    #[test]
    fn documents_are_published_once() {
        let s = storage();
        suite::documents_are_published_once(&s);
    }

    #[test]
    fn names_missing_checkpoints_and_files() {
        let s = storage();
        suite::names_missing_checkpoints_and_files(&s);
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(1, "dddddddd");
        let m = suite::manifest(&c, src.path(), &[("db/000001.sst", b"sst")]);
        s.write(&m, src.path()).expect("write");
        let sha = &m.state.files[0].sha256;
        s.runtime
            .block_on(s.store.delete(&s.shared_key(sha)))
            .expect("delete shared object");
        let out = tempfile::tempdir().expect("dir");
        let err = s
            .fetch(&m, &out.path().join("r"))
            .expect_err("missing object")
            .to_string();
        assert!(
            err.contains("chk-1-dddddddd") && err.contains(sha.as_str()) && err.contains("missing"),
            "{err}"
        );
    }

    #[test]
    fn a_name_is_published_once() {
        let s = storage();
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(3, "eeeeeeee");
        s.write(&suite::manifest(&c, src.path(), &[("a", b"1")]), src.path())
            .expect("first write");
        let again = s.write(&suite::manifest(&c, src.path(), &[("a", b"2")]), src.path());
        let err = again
            .expect_err("a second writer of the same name must fail, not replace it")
            .to_string();
        assert!(
            err.contains("chk-3-eeeeeeee") && err.contains("published once"),
            "{err}"
        );
        assert_eq!(get(&s, &s.dir(&c).join("a")).as_deref(), Some(&b"1"[..]));
        // The store itself must refuse the race the head check cannot see: two writers
        // that both passed it. Needs conditional puts (If-None-Match) on the server.
        assert!(s.conditional_put);
        let raced = s.runtime.block_on(s.publish_manifest(&c, b"{}".to_vec()));
        assert!(
            matches!(raced, Err(CheckpointError::AlreadyPublished { .. })),
            "{raced:?}"
        );
        assert_eq!(
            s.read_manifest(&c)
                .expect("first manifest stays")
                .state
                .files[0]
                .size,
            1
        );
    }

    #[test]
    fn a_name_is_published_once_without_conditional_puts() {
        // What `AWS_CONDITIONAL_PUT=disabled` selects for stores without If-None-Match.
        let bucket = unique_bucket();
        create_bucket(&endpoint(), &bucket);
        let builder = builder().with_config(AmazonS3ConfigKey::ConditionalPut, "disabled");
        let s = S3Storage::with_builder(builder, &bucket, "", "app", 1).expect("open");
        assert!(!s.conditional_put);
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(3, "eeeeeeee");
        s.write(&suite::manifest(&c, src.path(), &[("a", b"1")]), src.path())
            .expect("first write");
        let raced = s.runtime.block_on(s.publish_manifest(&c, b"{}".to_vec()));
        assert!(
            matches!(raced, Err(CheckpointError::AlreadyPublished { .. })),
            "{raced:?}"
        );
        assert_eq!(
            s.read_manifest(&c)
                .expect("first manifest stays")
                .checkpoint,
            c
        );
        assert_eq!(
            keys_under(&s, &s.root)[0],
            "app/instance-1/chk-3-eeeeeeee/a",
            "an empty prefix puts keys at the top"
        );
    }

    /// The service calls storage from `spawn_blocking` inside its multi-threaded runtime;
    /// the storage's own runtime must work (and drop) there.
    #[test]
    fn works_from_a_blocking_thread_of_another_runtime() {
        let outer = tokio::runtime::Builder::new_multi_thread()
            .worker_threads(1)
            .enable_all()
            .build()
            .expect("runtime");
        let listed = outer.block_on(async {
            tokio::task::spawn_blocking(|| {
                let s = storage();
                let src = tempfile::tempdir().expect("dir");
                let c = CheckpointRef::new(1, "0000000e");
                s.write(&suite::manifest(&c, src.path(), &[("x", b"x")]), src.path())
                    .expect("write");
                s.list().expect("list")
            })
            .await
            .expect("join")
        });
        assert_eq!(listed.len(), 1);
    }

    #[test]
    fn debris_of_interrupted_writes_is_invisible_and_pruned_once_older_than_the_committed() {
        let s = storage();
        let src = tempfile::tempdir().expect("dir");
        let debris = |c: &CheckpointRef| {
            // What a crash mid-write leaves: private files, no manifest.
            let key = s.dir(c).join("db").join("MANIFEST-9");
            s.runtime
                .block_on(s.store.put(&key, b"x".to_vec().into()))
                .expect("put");
        };
        let publish = |c: &CheckpointRef| {
            s.write(&suite::manifest(c, src.path(), &[("x", b"x")]), src.path())
                .expect("write");
            s.mark_complete(c).expect("complete");
        };
        let (old, committed, newer, next) = (
            CheckpointRef::new(1, "0000000a"),
            CheckpointRef::new(2, "0000000a"),
            CheckpointRef::new(3, "0000000b"),
            CheckpointRef::new(4, "0000000c"),
        );
        debris(&old);
        debris(&newer);
        publish(&committed);
        let listed: Vec<_> = s
            .list()
            .expect("list")
            .into_iter()
            .map(|i| i.checkpoint)
            .collect();
        assert_eq!(
            listed,
            vec![committed.clone()],
            "a prefix without a manifest is not a checkpoint"
        );
        assert!(
            s.mark_complete(&newer).is_err(),
            "only a published checkpoint can complete"
        );
        // Recovery leaves debris alone: it may be a paused zombie's upload.
        assert_eq!(
            s.discard_uncommitted(Some(&committed)).expect("discard"),
            vec![]
        );
        assert!(
            !keys_under(&s, &s.dir(&old)).is_empty() && !keys_under(&s, &s.dir(&newer)).is_empty()
        );
        // Prune removes debris older than the committed checkpoint, not newer: that may
        // be a write in progress.
        s.prune(1, &committed).expect("prune");
        assert!(
            keys_under(&s, &s.dir(&old)).is_empty(),
            "older debris must be pruned"
        );
        assert!(
            !keys_under(&s, &s.dir(&newer)).is_empty(),
            "newer debris may be a write in progress"
        );
        publish(&next);
        s.prune(1, &next).expect("prune");
        assert!(
            keys_under(&s, &s.dir(&newer)).is_empty(),
            "debris older than the committed one must go"
        );
        let listed: Vec<_> = s
            .list()
            .expect("list")
            .into_iter()
            .map(|i| i.checkpoint)
            .collect();
        assert_eq!(listed, vec![next]);
    }

    #[test]
    fn big_files_upload_in_parts_and_round_trip() {
        let mut s = storage();
        s.part_size = 5 * 1024 * 1024; // S3's minimum part size: 3 parts for 12 MiB
        let src = tempfile::tempdir().expect("dir");
        let big: Vec<u8> = (0..12 * 1024 * 1024 + 17)
            .map(|i: u32| (i.wrapping_mul(2_654_435_761) >> 13) as u8)
            .collect();
        let c = CheckpointRef::new(1, "0000000c");
        let m = suite::manifest(
            &c,
            src.path(),
            &[("db/000042.sst", &big), ("db/OPTIONS-7", &big[..1000])],
        );
        let stats = s.write(&m, src.path()).expect("write");
        assert!(stats.bytes_written > big.len() as u64, "{stats:?}");
        let meta = s
            .runtime
            .block_on(s.store.head(&s.shared_key(&m.state.files[0].sha256)))
            .expect("head");
        assert_eq!(meta.size, big.len() as u64);
        let etag = meta.e_tag.unwrap_or_default();
        assert!(
            etag.trim_matches('"').ends_with("-3"),
            "a 12 MiB file must be a 3-part upload, ETag {etag}"
        );
        let out = tempfile::tempdir().expect("dir");
        s.fetch(&m, &out.path().join("r")).expect("fetch");
        assert!(
            fs::read(out.path().join("r/db/000042.sst")).expect("sst") == big,
            "downloaded bytes differ"
        );
    }

    #[test]
    fn prune_deletes_shared_files_no_checkpoint_references() {
        let s = storage();
        let src = tempfile::tempdir().expect("dir");
        let (c1, c2) = (
            CheckpointRef::new(1, "00000010"),
            CheckpointRef::new(2, "00000010"),
        );
        let m1 = suite::manifest(
            &c1,
            src.path(),
            &[("db/000001.sst", b"a"), ("db/000002.sst", b"b")],
        );
        let m2 = suite::manifest(
            &c2,
            src.path(),
            &[("db/000002.sst", b"b"), ("db/000003.sst", b"c")],
        );
        for (c, m) in [(&c1, &m1), (&c2, &m2)] {
            s.write(m, src.path()).expect("write");
            s.mark_complete(c).expect("complete");
        }
        let shared = s.root.clone().join(SHARED);
        assert_eq!(keys_under(&s, &shared).len(), 3);
        s.prune(1, &c2).expect("prune");
        let mut expected: Vec<String> = m2
            .state
            .files
            .iter()
            .map(|f| s.shared_key(&f.sha256).to_string())
            .collect();
        expected.sort();
        assert_eq!(
            keys_under(&s, &shared),
            expected,
            "only the pruned checkpoint's own SST may go"
        );
        assert!(keys_under(&s, &s.dir(&c1)).is_empty());
        // A fresh process (no cached manifests) agrees.
        let again =
            S3Storage::with_builder(builder(), &s.bucket, "ckpt/tests", "app", 0).expect("open");
        again.prune(1, &c2).expect("prune again");
        assert_eq!(keys_under(&s, &shared), expected);
    }

    #[test]
    fn keys_mirror_the_file_layout() {
        let s = storage();
        let src = tempfile::tempdir().expect("dir");
        let c = CheckpointRef::new(4, "0000000d");
        let m = suite::manifest(
            &c,
            src.path(),
            &[("db/000007.sst", b"s"), ("db/CURRENT", b"c")],
        );
        s.write(&m, src.path()).expect("write");
        s.mark_complete(&c).expect("complete");
        let root = "ckpt/tests/app/instance-0";
        let sha = &m.state.files[0].sha256;
        let expected = vec![
            format!("{root}/chk-4-0000000d/COMPLETED"),
            format!("{root}/chk-4-0000000d/db/CURRENT"),
            format!("{root}/chk-4-0000000d/manifest.json"),
            format!("{root}/shared/{sha}"),
        ];
        assert_eq!(keys_under(&s, &s.root), expected);
        assert!(
            s.describe()
                .starts_with(&format!("s3://{}/{root}", s.bucket)),
            "{}",
            s.describe()
        );
    }
}
