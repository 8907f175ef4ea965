//! The `rocksdb` backend: serialized state in RocksDB on local disk. The WAL
//! is off because durability comes from checkpoints, as in Flink; snapshots
//! are RocksDB checkpoints (hard links to immutable SST files), so the
//! checkpoint store only copies SSTs it has not seen: incremental snapshots.
//! A snapshot's flush and links run off the caller's thread ([`snapshot`]).

mod hash_ahead;
mod snapshot;

use std::path::{Path, PathBuf};
use std::sync::Arc;

use rocksdb::compaction_filter::Decision;
use rocksdb::{DB, IteratorMode, Options, ReadOptions, WriteOptions};

use self::hash_ahead::HashAhead;
use self::snapshot::{Gate, WRITE_BUFFER_BYTES};
use super::{BackendKind, BatchOp, KvBackend, PendingSnapshot};
use crate::clock::Clock;
use crate::error::{IoContext, Result};
use crate::files::FileHashes;
use crate::layout::FIRST_RESERVED_ID;
use crate::ttl::{self, Expiry, TtlRegistry};

pub struct RocksBackend {
    /// Shared with a checkpoint's background part while it links files.
    db: Arc<DB>,
    path: PathBuf,
    write: WriteOptions,
    gate: Arc<Gate>,
    /// Hashes new SSTs for the snapshots, once [`KvBackend::hash_ahead`] starts it.
    hash_ahead: Option<HashAhead>,
}

fn concat_merge(
    _key: &[u8],
    existing: Option<&[u8]>,
    ops: &rocksdb::MergeOperands,
) -> Option<Vec<u8>> {
    let mut out = existing.map(|e| e.to_vec()).unwrap_or_default();
    for op in ops {
        out.extend_from_slice(op);
    }
    Some(out)
}

fn expired_by_filter(
    registry: &TtlRegistry,
    clock: &Arc<dyn Clock>,
    key: &[u8],
    value: &[u8],
) -> bool {
    if key.len() < 4 {
        return false;
    }
    let id = u16::from_be_bytes([key[2], key[3]]);
    if id >= FIRST_RESERVED_ID {
        return false;
    }
    let reg = registry.read();
    let Some((kind, ttl)) = reg.get(&id) else {
        return false;
    };
    if !ttl.cleanup.compaction_filter {
        return false;
    }
    // A list goes only when every element has expired: the filter cannot rewrite
    // values (rust-rocksdb only offers 'static replacements).
    matches!(
        ttl::expire(*kind, ttl, value, clock.now_ms()),
        Ok(Expiry::Remove)
    )
}

/// Per RocksDB instance; see [`db_options`].
const BLOCK_CACHE_BYTES: usize = 256 << 20;

/// The memtable Bloom filter's size as a fraction of [`WRITE_BUFFER_BYTES`]: 0.01 is
/// 5.4 Mbit, 8 bits per key in a full memtable of 100-byte entries, and a memtable
/// switched at every barrier holds far fewer (S at 55k events/s: 10-20 MB, so 25-50 bits
/// per key). RocksDB allocates and zeroes the filter when it creates a memtable,
/// which is at the barrier on the job thread: at 0.1 (6.7 MB) that was about 4 ms of
/// CPU, most of the checkpoint pause (bench/README.md, "The pause at 1 GB").
const MEMTABLE_BLOOM_RATIO: f64 = 0.01;

pub(crate) fn db_options(registry: Option<(TtlRegistry, Arc<dyn Clock>)>) -> Options {
    let mut opts = Options::default();
    opts.create_if_missing(true);
    opts.set_merge_operator_associative("streamstate-list-concat", concat_merge);
    // Room for the barrier's memtables to flush while the next epoch writes (snapshot.rs).
    opts.set_write_buffer_size(WRITE_BUFFER_BYTES);
    opts.set_max_write_buffer_number(4);
    // Bloom filters (10 bits per key, ~1% false positives): most state reads miss — a
    // dedup of a new event id, the first event of a key — and every checkpoint flushes
    // the memtable into one more sorted run, so without a filter a miss searches the
    // index and a data block of every run. Filters only speed up reads; files written
    // without them (older checkpoints) read as before.
    let mut table = rocksdb::BlockBasedOptions::default();
    table.set_bloom_filter(10.0, false);
    // Universal (tiered) compaction without compression, as Kafka Streams' RocksDB store
    // is configured by default. Every barrier flushes a memtable into one more small
    // sorted run whose keys span the whole key space. Leveled compaction merged those
    // into the base level and so rewrote all of it every few checkpoints: at 200 ms
    // checkpoints 1 GB in 40 s on the job's CPU, and that run fell behind its input
    // (bench/README.md, "Universal compaction"). Universal compaction merges runs of
    // similar size, so an entry is rewritten a few times on its way to the last run,
    // and the whole state once each time the newer runs reach twice its size (RocksDB's
    // default size amplification). Uncompressed because LZ4 on the levels those merges
    // write to cost the benchmark 6-12% of its throughput in reads, and its state
    // compressed little anyway. Databases written with leveled compaction (older
    // checkpoints) open as they are; their levels are sorted runs too.
    opts.set_compaction_style(rocksdb::DBCompactionStyle::Universal);
    opts.set_compression_type(rocksdb::DBCompressionType::None);
    // Sorted runs before a merge (RocksDB's default is 4): fewer, larger merges between
    // checkpoints; the Bloom filters keep a miss cheap across a dozen runs.
    opts.set_level_zero_file_num_compaction_trigger(12);
    opts.set_level_zero_slowdown_writes_trigger(40);
    opts.set_level_zero_stop_writes_trigger(60);
    // A memtable Bloom filter lets a miss skip the up to four memtables' skip lists, and
    // a 256 MiB block cache (RocksDB's default is 32 MiB) keeps the hot data blocks.
    opts.set_memtable_prefix_bloom_ratio(MEMTABLE_BLOOM_RATIO);
    opts.set_memtable_whole_key_filtering(true);
    table.set_block_cache(&rocksdb::Cache::new_lru_cache(BLOCK_CACHE_BYTES));
    opts.set_block_based_table_factory(&table);
    if let Some((registry, clock)) = registry {
        opts.set_compaction_filter(
            "streamstate-ttl",
            move |_level: u32, key: &[u8], value: &[u8]| {
                if expired_by_filter(&registry, &clock, key, value) {
                    Decision::Remove
                } else {
                    Decision::Keep
                }
            },
        );
    }
    opts
}

impl RocksBackend {
    /// Opens a fresh database at `path` (which must not hold live state).
    pub(crate) fn open(path: &Path, registry: TtlRegistry, clock: Arc<dyn Clock>) -> Result<Self> {
        std::fs::create_dir_all(path).at(path)?;
        // The default column family is opened by name (with the same options) only so
        // that its handle exists: batched MultiGet takes one.
        let cf = rocksdb::ColumnFamilyDescriptor::new(
            rocksdb::DEFAULT_COLUMN_FAMILY_NAME,
            db_options(Some((registry.clone(), clock.clone()))),
        );
        let db = DB::open_cf_descriptors(&db_options(Some((registry, clock))), path, [cf])?;
        let mut write = WriteOptions::default();
        write.disable_wal(true);
        Ok(Self {
            db: Arc::new(db),
            path: path.to_path_buf(),
            write,
            gate: Arc::default(),
            hash_ahead: None,
        })
    }

    /// Opens a database seeded from a checkpoint of the same key-group
    /// range: SST files are hard-linked (copied if linking fails), the rest
    /// copied, because RocksDB appends to its MANIFEST and must never write
    /// into checkpoint storage. The SSTs keep their names, so the next
    /// incremental snapshot shares them with the restored checkpoint.
    pub(crate) fn open_from_checkpoint(
        checkpoint: &Path,
        path: &Path,
        registry: TtlRegistry,
        clock: Arc<dyn Clock>,
    ) -> Result<Self> {
        std::fs::create_dir_all(path).at(path)?;
        for entry in std::fs::read_dir(checkpoint).at(checkpoint)? {
            let entry = entry.at(checkpoint)?;
            let src = entry.path();
            if !entry.file_type().at(&src)?.is_file() {
                continue;
            }
            let dst = path.join(entry.file_name());
            let is_sst = src.extension().is_some_and(|e| e == "sst");
            if !(is_sst && std::fs::hard_link(&src, &dst).is_ok()) {
                std::fs::copy(&src, &dst).at(&src)?;
            }
        }
        Self::open(path, registry, clock)
    }

    pub fn path(&self) -> &Path {
        &self.path
    }
}

impl Drop for RocksBackend {
    /// Stops hashing ahead and waits for a checkpoint's background part (both hold the
    /// database), so the database closes here, before a restore removes its directory.
    fn drop(&mut self) {
        drop(self.hash_ahead.take());
        self.gate.wait_open();
    }
}

/// Visits `[start, end)` of a RocksDB checkpoint directory without modifying
/// it (restore reads old instances' checkpoints this way).
pub(crate) fn scan_checkpoint(
    dir: &Path,
    log_dir: &Path,
    start: &[u8],
    end: &[u8],
    f: super::EntrySink<'_>,
) -> Result<()> {
    let mut opts = db_options(None);
    // Keep RocksDB's info log out of checkpoint storage.
    opts.set_db_log_dir(log_dir);
    let db = DB::open_for_read_only(&opts, dir, false)?;
    let mut ro = ReadOptions::default();
    ro.set_iterate_upper_bound(end.to_vec());
    ro.fill_cache(false);
    let iter = db.iterator_opt(IteratorMode::From(start, rocksdb::Direction::Forward), ro);
    for item in iter {
        let (k, v) = item?;
        f(&k, &v)?;
    }
    Ok(())
}

impl KvBackend for RocksBackend {
    fn kind(&self) -> BackendKind {
        BackendKind::Rocksdb
    }

    fn get(&mut self, key: &[u8], out: &mut Vec<u8>) -> Result<bool> {
        match self.db.get_pinned(key)? {
            Some(v) => {
                out.clear();
                out.extend_from_slice(&v);
                Ok(true)
            }
            None => Ok(false),
        }
    }

    /// One batched MultiGet: RocksDB probes the memtables and each file's Bloom filter
    /// for the sorted batch together, and reads a data block once for all its keys.
    fn get_many(
        &mut self,
        keys: &[&[u8]],
        found: &mut dyn FnMut(usize, Option<&[u8]>),
    ) -> Result<()> {
        let Some(cf) = self.db.cf_handle(rocksdb::DEFAULT_COLUMN_FAMILY_NAME) else {
            return super::get_each(self, keys, found);
        };
        for (i, value) in self
            .db
            .batched_multi_get_cf(cf, keys.iter().copied(), true)
            .into_iter()
            .enumerate()
        {
            found(i, value?.as_deref());
        }
        Ok(())
    }

    fn batches_pay(&self) -> bool {
        true
    }

    fn put(&mut self, key: &[u8], value: &[u8]) -> Result<()> {
        self.gate.guard(&self.db, key.len() + value.len())?;
        Ok(self.db.put_opt(key, value, &self.write)?)
    }

    fn delete(&mut self, key: &[u8]) -> Result<()> {
        self.gate.guard(&self.db, key.len())?;
        Ok(self.db.delete_opt(key, &self.write)?)
    }

    fn append(&mut self, key: &[u8], bytes: &[u8]) -> Result<()> {
        self.gate.guard(&self.db, key.len() + bytes.len())?;
        Ok(self.db.merge_opt(key, bytes, &self.write)?)
    }

    fn scan(
        &mut self,
        start: &[u8],
        end: &[u8],
        f: &mut dyn FnMut(&[u8], &[u8]) -> bool,
    ) -> Result<()> {
        if start >= end {
            return Ok(());
        }
        let mut ro = ReadOptions::default();
        ro.set_iterate_upper_bound(end.to_vec());
        let mut it = self.db.raw_iterator_opt(ro);
        it.seek(start);
        while it.valid() {
            let (Some(k), Some(v)) = (it.key(), it.value()) else {
                break;
            };
            if !f(k, v) {
                break;
            }
            it.next();
        }
        Ok(it.status()?)
    }

    fn put_many(&mut self, entries: &[(Vec<u8>, Vec<u8>)]) -> Result<()> {
        let mut batch = rocksdb::WriteBatch::default();
        for (k, v) in entries {
            batch.put(k, v);
        }
        self.gate.guard(&self.db, batch.size_in_bytes())?;
        Ok(self.db.write_opt(batch, &self.write)?)
    }

    fn write_batch(&mut self, ops: &[(&[u8], BatchOp<'_>)]) -> Result<()> {
        let mut batch = rocksdb::WriteBatch::default();
        for (k, op) in ops {
            match op {
                BatchOp::Put(v) => batch.put(k, v),
                BatchOp::Delete => batch.delete(k),
                BatchOp::Append(a) => batch.merge(k, a),
            }
        }
        self.gate.guard(&self.db, batch.size_in_bytes())?;
        Ok(self.db.write_opt(batch, &self.write)?)
    }

    fn flush(&mut self) -> Result<()> {
        self.gate.wait_open();
        Ok(self.db.flush()?)
    }

    fn compact(&mut self) -> Result<()> {
        self.gate.wait_open();
        self.db.flush()?;
        self.db.compact_range(None::<&[u8]>, None::<&[u8]>);
        Ok(())
    }

    fn hash_ahead(&mut self, hashes: &FileHashes) -> Result<()> {
        drop(self.hash_ahead.take());
        let started = HashAhead::start(self.db.clone(), self.path.clone(), hashes.clone());
        self.hash_ahead = Some(started.at(&self.path)?);
        Ok(())
    }

    fn native_snapshot(&mut self, dir: &Path) -> Result<Option<Box<dyn PendingSnapshot>>> {
        snapshot::begin(&self.db, &self.gate, dir).map(Some)
    }

    fn approximate_len(&mut self) -> Result<u64> {
        Ok(self
            .db
            .property_int_value("rocksdb.estimate-num-keys")?
            .unwrap_or(0))
    }

    fn approximate_size_bytes(&mut self) -> Result<u64> {
        let sst = self
            .db
            .property_int_value("rocksdb.total-sst-files-size")?
            .unwrap_or(0);
        let mem = self
            .db
            .property_int_value("rocksdb.size-all-mem-tables")?
            .unwrap_or(0);
        Ok(sst + mem)
    }
}

#[cfg(test)]
mod tests {
    use std::sync::Arc;

    use rocksdb::{DB, DBCompactionStyle, DBCompressionType, Options};

    use super::RocksBackend;
    use crate::backend::KvBackend;
    use crate::clock::SystemClock;

    fn value(round: u32, i: u32) -> Vec<u8> {
        format!("{round}:{i}").into_bytes()
    }

    /// Checkpoints taken before the switch to universal compaction hold a leveled
    /// database (L0 files beside compressed lower levels); a restore must open it as
    /// it is, read every entry, and compact it on.
    #[test]
    fn a_database_written_with_leveled_compaction_restores_and_compacts_on() {
        let tmp = tempfile::tempdir().unwrap();
        let old = tmp.path().join("old");
        {
            let mut opts = Options::default();
            opts.create_if_missing(true);
            opts.set_compaction_style(DBCompactionStyle::Level);
            opts.set_compression_per_level(&[
                DBCompressionType::None,
                DBCompressionType::None,
                DBCompressionType::Lz4,
                DBCompressionType::Lz4,
                DBCompressionType::Lz4,
                DBCompressionType::Lz4,
                DBCompressionType::Lz4,
            ]);
            let db = DB::open(&opts, &old).unwrap();
            for round in 0..3u32 {
                for i in (round * 1_000)..(round * 1_000 + 2_000) {
                    db.put(format!("k{i:05}"), value(round, i)).unwrap();
                }
                db.flush().unwrap();
            }
            db.compact_range::<&[u8], &[u8]>(None, None);
            // One more level-0 file over the compacted levels.
            for i in 0..500u32 {
                db.put(format!("k{i:05}"), value(3, i)).unwrap();
            }
            db.flush().unwrap();
            let levels: Vec<i32> = db.live_files().unwrap().iter().map(|f| f.level).collect();
            assert!(
                levels.contains(&0) && levels.iter().any(|l| *l > 0),
                "the old database has level-0 and lower-level files: {levels:?}"
            );
        }
        let mut db = RocksBackend::open_from_checkpoint(
            &old,
            &tmp.path().join("live"),
            Arc::default(),
            Arc::new(SystemClock),
        )
        .expect("a leveled database opens with universal compaction");
        // The newest write of each key: rounds 0-2 wrote [1000 r, 1000 r + 2000), round 3
        // [0, 500).
        let expected = |i: u32| match i {
            0..500 => value(3, i),
            500..1_000 => value(0, i),
            1_000..2_000 => value(1, i),
            _ => value(2, i),
        };
        let check = |db: &mut RocksBackend| {
            let mut out = Vec::new();
            for i in 0..4_000u32 {
                assert!(db.get(format!("k{i:05}").as_bytes(), &mut out).unwrap());
                assert_eq!(out, expected(i), "k{i:05}");
            }
        };
        check(&mut db);
        for round in 0..14u32 {
            db.put(format!("n{round:05}").as_bytes(), b"new").unwrap();
            db.flush().unwrap();
        }
        db.compact().unwrap();
        check(&mut db);
        let mut out = Vec::new();
        assert!(db.get(b"n00013", &mut out).unwrap());
    }
}
