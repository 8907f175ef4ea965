//! Checkpoint snapshots whose backend part completes after the barrier
//! (`StateStore::snapshot_deferred`): what they hold is the state at the barrier, whatever
//! the job writes while they complete.

mod common;

use common::*;
use streamstate_state::*;

const KEYS: u64 = 3000;

fn value_desc() -> ValueStateDescriptor<Vec<u8>> {
    ValueStateDescriptor::new("v")
}

fn write_all(store: &StateStore, keys: std::ops::Range<u64>, value: &[u8]) {
    let v = store.value_state(&value_desc()).unwrap();
    for i in keys {
        store.set_current_key(&key(i)).unwrap();
        v.update(&value.to_vec()).unwrap();
    }
}

/// Restores `parts` into a fresh store and returns (keys with `want`, keys present).
fn restored(
    env: &Env,
    kind: BackendKind,
    parts: &[(std::path::PathBuf, SnapshotResult)],
    want: &[u8],
) -> (u64, u64) {
    let s = env.open(
        kind,
        &format!("restored-{}", parts[0].1.identity.checkpoint_id),
        128,
        0,
        1,
    );
    s.restore(parts).unwrap();
    let v = s.value_state(&value_desc()).unwrap();
    let (mut matching, mut present) = (0, 0);
    for i in 0..2 * KEYS {
        s.set_current_key(&key(i)).unwrap();
        if let Some(x) = v.value().unwrap() {
            present += 1;
            matching += u64::from(x == want);
        }
    }
    (matching, present)
}

fn complete(
    dir: &std::path::Path,
    snap: (SnapshotResult, Option<DeferredSnapshot>),
) -> (std::path::PathBuf, SnapshotResult) {
    let (mut result, rest) = snap;
    if let Some(rest) = rest {
        rest.complete(&mut result).unwrap();
    }
    (dir.to_path_buf(), result)
}

fn writes_after_the_barrier_are_not_in_its_snapshot(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "live");
    write_all(&store, 0..KEYS, b"before");
    let dir = env.path("chk-1");
    let pending = store.snapshot_deferred(1, &dir).unwrap();
    // The next epoch overwrites every key, adds as many and deletes some, all before
    // the snapshot's files exist.
    write_all(&store, 0..2 * KEYS, b"after");
    let v = store.value_state(&value_desc()).unwrap();
    for i in (0..KEYS).step_by(7) {
        store.set_current_key(&key(i)).unwrap();
        v.clear().unwrap();
    }
    let chk1 = complete(&dir, pending);
    assert_eq!(restored(&env, kind, &[chk1], b"before"), (KEYS, KEYS));
    // The next barrier holds the next epoch's writes, and only those.
    let dir = env.path("chk-2");
    let chk2 = complete(&dir, store.snapshot_deferred(2, &dir).unwrap());
    let deleted = KEYS.div_ceil(7);
    assert_eq!(
        restored(&env, kind, &[chk2], b"after"),
        (2 * KEYS - deleted, 2 * KEYS - deleted)
    );
}

fn writes_that_fill_the_memtable_while_a_snapshot_completes_stay_out_of_it(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "live");
    write_all(&store, 0..KEYS, b"before");
    let dir = env.path("chk-1");
    let pending = store.snapshot_deferred(1, &dir).unwrap();
    // Over 64 MiB, RocksDB's memtable size, before the snapshot is completed: the
    // memtable holding these writes must not reach an SST of the snapshot.
    let big = vec![b'x'; 64 << 10];
    for round in 0..2 {
        write_all(&store, 0..KEYS / 3, &[&big[..], &[round]].concat());
    }
    let chk1 = complete(&dir, pending);
    assert_eq!(restored(&env, kind, &[chk1], b"before"), (KEYS, KEYS));
}

fn a_dropped_deferred_snapshot_does_not_block_the_next_barrier(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "live");
    write_all(&store, 0..KEYS, b"one");
    drop(store.snapshot_deferred(1, &env.path("chk-1")).unwrap());
    write_all(&store, 0..KEYS, b"two");
    let dir = env.path("chk-2");
    let chk2 = complete(&dir, store.snapshot_deferred(2, &dir).unwrap());
    assert_eq!(restored(&env, kind, &[chk2], b"two"), (KEYS, KEYS));
}

on_every_backend!(
    writes_after_the_barrier_are_not_in_its_snapshot,
    writes_that_fill_the_memtable_while_a_snapshot_completes_stay_out_of_it,
    a_dropped_deferred_snapshot_does_not_block_the_next_barrier,
);

#[test]
fn a_hashmap_checkpoint_writes_its_keyed_file_on_another_thread_from_the_barriers_copy() {
    let env = Env::new();
    let store = env.single(BackendKind::Hashmap, "live");
    write_all(&store, 0..KEYS, b"before");
    let dir = env.path("chk-1");
    let (mut result, rest) = store.snapshot_deferred(1, &dir).unwrap();
    let rest = rest.expect("the heap backend leaves its keyed file for after the barrier");
    assert!(
        !dir.join("keyed.bin").exists() && !dir.join("state-meta.json").exists(),
        "no file is written at the barrier"
    );
    let writer = std::thread::spawn(move || rest.complete(&mut result).map(|()| result));
    write_all(&store, 0..2 * KEYS, b"after");
    let result = writer.join().expect("writer thread").unwrap();
    let files: Vec<&str> = result.files.iter().map(|f| f.path.as_str()).collect();
    assert_eq!(files, ["keyed.bin", "state-meta.json"]);
    assert_eq!(
        restored(&env, BackendKind::Hashmap, &[(dir, result)], b"before"),
        (KEYS, KEYS)
    );
}
