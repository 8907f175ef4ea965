//! Incremental checkpoints: after a 1M-key RocksDB state is checkpointed, a checkpoint
//! following 1,000 updates stores only the new SST files; the rest is referenced.

use std::time::Instant;

use streamstate::checkpoint::{
    CheckpointRef, CheckpointStorage, FORMAT_VERSION, FsStorage, Manifest,
};
use streamstate_state::{BackendKind, StateStore, StoreConfig, ValueStateDescriptor};

fn checkpoint(
    store: &StateStore,
    storage: &FsStorage,
    id: u64,
    scratch: &std::path::Path,
) -> (u64, u64) {
    let staging = scratch.join(format!("staging-{id}"));
    let started = Instant::now();
    let state = store.snapshot(id, &staging).expect("snapshot");
    let snapshot_ms = started.elapsed().as_millis();
    let manifest = Manifest {
        format_version: FORMAT_VERSION,
        checkpoint: CheckpointRef::new(id, "00000001"),
        app_id: "incremental".into(),
        instance: 0,
        created_at_ms: 0,
        offsets: vec![],
        control_offsets: vec![],
        producer_pool_size: None,
        state,
    };
    let written = storage
        .write(&manifest, &staging)
        .expect("write checkpoint");
    storage
        .mark_complete(&manifest.checkpoint)
        .expect("complete");
    eprintln!(
        "checkpoint {id}: snapshot {snapshot_ms} ms, total {} bytes, written {} bytes, {:.2}% of full, {} ms in all",
        written.bytes_total,
        written.bytes_written,
        100.0 * written.bytes_written as f64 / written.bytes_total as f64,
        started.elapsed().as_millis()
    );
    (written.bytes_total, written.bytes_written)
}

#[test]
fn checkpoint_after_1000_updates_on_1m_keys_copies_a_small_fraction() {
    let dir = tempfile::tempdir().expect("dir");
    let store = StateStore::open(StoreConfig::new(
        BackendKind::Rocksdb,
        dir.path().join("state"),
        128,
    ))
    .expect("open");
    let storage =
        FsStorage::open(&dir.path().join("checkpoints"), "incremental", 0).expect("storage");
    let count = store
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .expect("state");
    for i in 0..1_000_000u64 {
        store
            .set_current_key(format!("user-{i}").as_bytes())
            .expect("key");
        count.update(&i).expect("update");
    }
    let (full, first) = checkpoint(&store, &storage, 1, dir.path());
    assert!(
        full > 5_000_000,
        "1M keys should take megabytes, got {full}"
    );
    assert!(
        first >= full,
        "the first checkpoint stores everything: {first} < {full}"
    );
    for i in 0..1_000u64 {
        store
            .set_current_key(format!("user-{}", i * 997).as_bytes())
            .expect("key");
        count.update(&(i + 7)).expect("update");
    }
    let (total, written) = checkpoint(&store, &storage, 2, dir.path());
    assert!(
        total >= full / 2,
        "the second checkpoint still references the whole state: {total}"
    );
    assert!(
        written * 20 < total,
        "incremental checkpoint wrote {written} of {total} bytes (over 5%)"
    );
}
