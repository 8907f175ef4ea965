//! Rescaling, savepoint portability, corruption detection and incremental
//! RocksDB snapshots.

mod common;

use std::collections::BTreeMap;

use common::*;
use streamstate_state::*;

const KEYS: u64 = 2000;

fn count_desc() -> ValueStateDescriptor<u64> {
    ValueStateDescriptor::new("count")
}

/// Number of entries in the whole backend, whatever their key group
/// (exact for the heap; for a freshly restored RocksDB without overwrites
/// or deletes, its estimate is exact too).
fn stored_entries(store: &StateStore, _dir: &std::path::Path) -> u64 {
    store.flush().unwrap();
    store.approximate_entries().unwrap()
}

/// Every key owned by `store`'s range, with its value.
fn owned_values(store: &StateStore) -> BTreeMap<u64, u64> {
    let v = store.value_state(&count_desc()).unwrap();
    let range = store.key_group_range();
    let mut out = BTreeMap::new();
    for i in 0..KEYS {
        if range.contains(store.key_group_of(&key(i))) {
            store.set_current_key(&key(i)).unwrap();
            if let Some(x) = v.value().unwrap() {
                out.insert(i, x);
            }
        }
    }
    out
}

fn rescale_keeps_every_key_exactly_once(kind: BackendKind, restore_kind: BackendKind) {
    let env = Env::new();
    let one = env.open(kind, "p1", 128, 0, 1);
    let v = one.value_state(&count_desc()).unwrap();
    for i in 0..KEYS {
        one.set_current_key(&key(i)).unwrap();
        v.update(&(i * 3)).unwrap();
    }
    let parts1 = vec![snapshot_to(&one, 1, &env.path("chk1"))];

    // 1 -> 3
    let mut parts3 = Vec::new();
    let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
    let mut stored = 0;
    for i in 0..3 {
        let s = env.open(restore_kind, &format!("p3-{i}"), 128, i, 3);
        s.restore(&parts1).unwrap();
        for (k, x) in owned_values(&s) {
            assert!(seen.insert(k, x).is_none(), "key {k} restored twice");
        }
        // Keys outside the range were not copied in.
        stored += stored_entries(&s, &env.path(&format!("sp3-{i}")));
        parts3.push(snapshot_to(&s, 2, &env.path(&format!("chk2-{i}"))));
    }
    assert_eq!(seen.len() as u64, KEYS);
    assert_eq!(stored, KEYS, "each key stored by exactly one instance");
    assert!(seen.iter().all(|(k, x)| *x == k * 3));

    // 3 -> 2
    let mut seen2: BTreeMap<u64, u64> = BTreeMap::new();
    let mut stored2 = 0;
    for i in 0..2 {
        let s = env.open(kind, &format!("p2-{i}"), 128, i, 2);
        s.restore(&parts3).unwrap();
        stored2 += stored_entries(&s, &env.path(&format!("sp2-{i}")));
        for (k, x) in owned_values(&s) {
            assert!(seen2.insert(k, x).is_none(), "key {k} restored twice");
        }
    }
    assert_eq!(seen2, seen);
    assert_eq!(stored2, KEYS, "each key stored by exactly one instance");
}

#[test]
fn rescale_1_to_3_to_2_on_hashmap_keeps_every_key_exactly_once() {
    rescale_keeps_every_key_exactly_once(BackendKind::Hashmap, BackendKind::Hashmap);
}

#[test]
fn rescale_1_to_3_to_2_on_rocksdb_keeps_every_key_exactly_once() {
    rescale_keeps_every_key_exactly_once(BackendKind::Rocksdb, BackendKind::Rocksdb);
}

#[test]
fn rescale_across_backends_keeps_every_key_exactly_once() {
    rescale_keeps_every_key_exactly_once(BackendKind::Rocksdb, BackendKind::Hashmap);
}

#[test]
fn restore_refuses_a_different_max_parallelism() {
    let env = Env::new();
    let s = env.open(BackendKind::Hashmap, "a", 128, 0, 1);
    let part = snapshot_to(&s, 1, &env.path("chk"));
    let other = env.open(BackendKind::Hashmap, "b", 64, 0, 1);
    assert!(matches!(
        other.restore(&[part]),
        Err(StateError::Incompatible(_))
    ));
}

/// 12 partitions, 120 key groups: 1 → 4 → 3 instances, each key restored once, by the
/// instance that owns the Kafka partition the key is produced to.
fn aligned_key_groups_rescale_by_whole_partitions(kind: BackendKind) {
    let env = Env::new();
    let aligned = KeyGroups::aligned(120, 12).unwrap();
    let one = env.open_numbered(kind, "a1", aligned, 0, 1).unwrap();
    let v = one.value_state(&count_desc()).unwrap();
    for i in 0..KEYS {
        one.set_current_key(&key(i)).unwrap();
        v.update(&(i + 7)).unwrap();
    }
    let mut parts = vec![snapshot_to(&one, 1, &env.path("a-chk1"))];
    for (step, (count, partitions_each)) in [(4u32, 3u32), (3, 4)].into_iter().enumerate() {
        let mut seen: BTreeMap<u64, u64> = BTreeMap::new();
        let mut next = Vec::new();
        for i in 0..count {
            let s = env
                .open_numbered(kind, &format!("a{count}-{i}"), aligned, i, count)
                .unwrap();
            s.restore(&parts).unwrap();
            for (k, x) in owned_values(&s) {
                let partition = key_group_for(&key(k), 12);
                assert_eq!(
                    partition / partitions_each,
                    i,
                    "key {k} of partition {partition}"
                );
                assert_eq!(x, k + 7);
                assert!(seen.insert(k, x).is_none(), "key {k} restored twice");
            }
            assert_eq!(
                stored_entries(&s, &env.path("unused")),
                owned_values(&s).len() as u64
            );
            next.push(snapshot_to(
                &s,
                step as u64 + 2,
                &env.path(&format!("a-chk{count}-{i}")),
            ));
        }
        assert_eq!(seen.len() as u64, KEYS, "{count} instances");
        parts = next;
    }
    // State numbered one way is never read another way.
    let modulo = env
        .open_numbered(kind, "m", KeyGroups::modulo(120), 0, 1)
        .unwrap();
    let err = modulo.restore(&parts).expect_err("refused");
    assert!(
        err.to_string().contains("aligned to 12 partitions")
            && err.to_string().contains("numbered modulo"),
        "{err}"
    );
    match env.open_numbered(kind, "x", aligned, 0, 13) {
        Err(err) => assert!(err.to_string().contains("13 instances"), "{err}"),
        Ok(_) => panic!("13 instances of 12 partitions must be refused"),
    }
}

#[test]
fn aligned_key_groups_rescale_by_whole_partitions_on_hashmap() {
    aligned_key_groups_rescale_by_whole_partitions(BackendKind::Hashmap);
}

#[test]
fn aligned_key_groups_rescale_by_whole_partitions_on_rocksdb() {
    aligned_key_groups_rescale_by_whole_partitions(BackendKind::Rocksdb);
}

#[test]
fn savepoint_hashmap_to_rocksdb_to_hashmap_gives_identical_state() {
    let env = Env::new();
    let h1 = env.single(BackendKind::Hashmap, "h1");
    let v = h1.value_state(&count_desc()).unwrap();
    let m = h1
        .map_state(&MapStateDescriptor::<String, Vec<u8>>::new("m"))
        .unwrap();
    let l = h1
        .list_state(&ListStateDescriptor::<i32>::new("l"))
        .unwrap();
    for i in 0..300 {
        h1.set_current_key(&key(i)).unwrap();
        v.update(&i).unwrap();
        m.put(&format!("e{}", i % 7), &vec![i as u8; 3]).unwrap();
        l.add(&-(i as i32)).unwrap();
        h1.register_processing_time_timer(i * 10).unwrap();
    }
    h1.broadcast_state(&MapStateDescriptor::<String, String>::new("rules"))
        .put(&"r".into(), &"rule".into())
        .unwrap();
    let sp1 = h1.write_savepoint(1, &env.path("sp1")).unwrap();
    assert_eq!(sp1.keyed_format, KeyedFormat::Canonical);

    let r = env.single(BackendKind::Rocksdb, "r");
    r.restore_savepoint(&[env.path("sp1")]).unwrap();
    let sp2 = r.write_savepoint(2, &env.path("sp2")).unwrap();
    assert_eq!(sp2.keyed_format, KeyedFormat::Canonical);

    let h2 = env.single(BackendKind::Hashmap, "h2");
    h2.restore_savepoint(&[env.path("sp2")]).unwrap();
    let sp3 = h2.write_savepoint(3, &env.path("sp3")).unwrap();
    // Byte-identical keyed state and metadata content.
    let bytes = |d: &str, f: &str| std::fs::read(env.path(d).join(f)).unwrap();
    assert_eq!(bytes("sp1", "keyed.bin"), bytes("sp3", "keyed.bin"));
    assert_eq!(bytes("sp2", "keyed.bin"), bytes("sp3", "keyed.bin"));
    let sha = |r: &SnapshotResult| {
        r.files
            .iter()
            .find(|f| f.path == "keyed.bin")
            .unwrap()
            .sha256
            .clone()
    };
    assert_eq!(sha(&sp1), sha(&sp3));
    // And the typed view agrees.
    let v2 = h2.value_state(&count_desc()).unwrap();
    let m2 = h2
        .map_state(&MapStateDescriptor::<String, Vec<u8>>::new("m"))
        .unwrap();
    let l2 = h2
        .list_state(&ListStateDescriptor::<i32>::new("l"))
        .unwrap();
    for i in 0..300 {
        h2.set_current_key(&key(i)).unwrap();
        assert_eq!(v2.value().unwrap(), Some(i));
        assert_eq!(
            m2.get(&format!("e{}", i % 7)).unwrap(),
            Some(vec![i as u8; 3])
        );
        assert_eq!(l2.get().unwrap(), vec![-(i as i32)]);
    }
    assert_eq!(h2.timer_count(TimeDomain::ProcessingTime), 300);
    assert_eq!(
        h2.read_only_broadcast_state(&MapStateDescriptor::<String, String>::new("rules"))
            .get(&"r".into())
            .unwrap()
            .as_deref(),
        Some("rule")
    );
}

fn corrupted_file_is_detected_and_live_state_is_untouched(
    kind: BackendKind,
    damage: fn(&std::path::Path),
) {
    let env = Env::new();
    let s = env.single(kind, "s");
    let v = s.value_state(&count_desc()).unwrap();
    for i in 0..500 {
        s.set_current_key(&key(i)).unwrap();
        v.update(&i).unwrap();
    }
    let (dir, result) = snapshot_to(&s, 1, &env.path("chk"));
    // The live store holds different state that a failed restore must keep.
    let live = env.single(kind, "live");
    let lv = live.value_state(&count_desc()).unwrap();
    live.set_current_key(&key(1)).unwrap();
    lv.update(&4242).unwrap();

    let victim = result
        .files
        .iter()
        .filter(|f| f.size > 0)
        .max_by_key(|f| f.size)
        .unwrap()
        .path
        .clone();
    damage(&dir.join(&victim));
    let err = live.restore(&[(dir, result)]).unwrap_err();
    let msg = err.to_string();
    assert!(matches!(err, StateError::Corrupt { .. }), "{msg}");
    assert!(msg.contains(&victim), "error must name the file: {msg}");
    live.set_current_key(&key(1)).unwrap();
    assert_eq!(lv.value().unwrap(), Some(4242));
    live.set_current_key(&key(2)).unwrap();
    assert_eq!(lv.value().unwrap(), None);
    assert!(!live.is_restored());
}

fn flip_a_byte(p: &std::path::Path) {
    let mut b = std::fs::read(p).unwrap();
    let mid = b.len() / 2;
    b[mid] ^= 0x55;
    std::fs::write(p, b).unwrap();
}

fn truncate(p: &std::path::Path) {
    let b = std::fs::read(p).unwrap();
    std::fs::write(p, &b[..b.len() - 3]).unwrap();
}

#[test]
fn corrupted_hashmap_snapshot_is_detected_naming_the_file() {
    corrupted_file_is_detected_and_live_state_is_untouched(BackendKind::Hashmap, flip_a_byte);
}

#[test]
fn truncated_hashmap_snapshot_is_detected_naming_the_file() {
    corrupted_file_is_detected_and_live_state_is_untouched(BackendKind::Hashmap, truncate);
}

#[test]
fn corrupted_rocksdb_snapshot_is_detected_naming_the_file() {
    corrupted_file_is_detected_and_live_state_is_untouched(BackendKind::Rocksdb, flip_a_byte);
}

#[test]
fn truncated_rocksdb_snapshot_is_detected_naming_the_file() {
    corrupted_file_is_detected_and_live_state_is_untouched(BackendKind::Rocksdb, truncate);
}

#[test]
fn missing_snapshot_file_is_detected_naming_the_file() {
    let env = Env::new();
    let s = env.single(BackendKind::Hashmap, "s");
    let (dir, result) = snapshot_to(&s, 1, &env.path("chk"));
    std::fs::remove_file(dir.join("keyed.bin")).unwrap();
    let err = env
        .single(BackendKind::Hashmap, "r")
        .restore(&[(dir, result)])
        .unwrap_err();
    assert!(err.to_string().contains("keyed.bin"), "{err}");
}

#[test]
fn rocksdb_snapshot_after_few_updates_reuses_most_sst_files() {
    let env = Env::new();
    let s = env.single(BackendKind::Rocksdb, "s");
    let v = s.value_state(&count_desc()).unwrap();
    for i in 0..20_000 {
        s.set_current_key(&key(i)).unwrap();
        v.update(&i).unwrap();
    }
    let (_, first) = snapshot_to(&s, 1, &env.path("chk1"));
    for i in 0..100 {
        s.set_current_key(&key(i)).unwrap();
        v.update(&(i + 1)).unwrap();
    }
    let (_, second) = snapshot_to(&s, 2, &env.path("chk2"));
    let old: std::collections::HashSet<(String, String)> = first
        .files
        .iter()
        .map(|f| (f.path.clone(), f.sha256.clone()))
        .collect();
    let new_bytes: u64 = second
        .files
        .iter()
        .filter(|f| !old.contains(&(f.path.clone(), f.sha256.clone())))
        .map(|f| f.size)
        .sum();
    let sst_old: u64 = first
        .files
        .iter()
        .filter(|f| f.path.ends_with(".sst"))
        .map(|f| f.size)
        .sum();
    assert!(sst_old > 0);
    assert!(
        second
            .files
            .iter()
            .filter(|f| f.path.ends_with(".sst"))
            .any(|f| old.contains(&(f.path.clone(), f.sha256.clone()))),
        "old SSTs are shared"
    );
    assert!(
        new_bytes * 4 < second.total_size(),
        "incremental: {new_bytes} new of {}",
        second.total_size()
    );
}

#[test]
fn rocksdb_restart_without_rescale_keeps_sharing_sst_files_with_the_checkpoint() {
    let env = Env::new();
    let s = env.single(BackendKind::Rocksdb, "s");
    let v = s.value_state(&count_desc()).unwrap();
    for i in 0..5000 {
        s.set_current_key(&key(i)).unwrap();
        v.update(&i).unwrap();
    }
    let part = snapshot_to(&s, 1, &env.path("chk1"));
    let r = env.single(BackendKind::Rocksdb, "r");
    r.restore(std::slice::from_ref(&part)).unwrap();
    let rv = r.value_state(&count_desc()).unwrap();
    r.set_current_key(&key(1)).unwrap();
    rv.update(&100).unwrap();
    let (_, second) = snapshot_to(&r, 2, &env.path("chk2"));
    let old: std::collections::HashSet<(String, String)> = part
        .1
        .files
        .iter()
        .filter(|f| f.path.ends_with(".sst"))
        .map(|f| (f.path.clone(), f.sha256.clone()))
        .collect();
    assert!(
        second
            .files
            .iter()
            .any(|f| old.contains(&(f.path.clone(), f.sha256.clone()))),
        "SSTs shared after restore"
    );
    // Restoring (and writing afterwards) did not modify the checkpoint it
    // came from: restoring it again re-verifies every file's SHA-256.
    r.restore(std::slice::from_ref(&part)).unwrap();
    r.set_current_key(&key(1)).unwrap();
    assert_eq!(rv.value().unwrap(), Some(1));
}

#[test]
fn store_and_handles_can_move_across_threads() {
    fn send_sync<T: Send + Sync>() {}
    send_sync::<StateStore>();
    send_sync::<ValueState<u64>>();
    send_sync::<ListState<String>>();
    send_sync::<MapState<String, u64>>();
    send_sync::<OperatorListState<(String, i32, i64)>>();
    send_sync::<BroadcastState<String, String>>();
    let env = Env::new();
    let s = env.single(BackendKind::Rocksdb, "s");
    let v = s.value_state(&count_desc()).unwrap();
    let s2 = s.clone();
    std::thread::spawn(move || {
        s2.set_current_key(b"k").unwrap();
        v.update(&5).unwrap();
    })
    .join()
    .unwrap();
    let v = s.value_state(&count_desc()).unwrap();
    s.set_current_key(b"k").unwrap();
    assert_eq!(v.value().unwrap(), Some(5));
}
