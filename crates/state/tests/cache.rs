//! The write-back state cache, seen from the store's API: read-your-writes,
//! one backend access per key and epoch, eviction that writes back, the
//! barrier write-back before a snapshot, restores and resets that drop dirty
//! entries, and savepoints and state lookups that are the same with the cache
//! on and off. (The shared suites run in every cache mode too; see
//! `common::on_every_backend!`.)

mod common;

use std::time::Duration;

use common::*;
use streamstate_state::*;

fn open(env: &Env, kind: BackendKind, name: &str, cache_bytes: u64) -> StateStore {
    let cfg = StoreConfig::new(kind, env.path(name), 128).with_cache_bytes(cache_bytes);
    StateStore::open_with_clock(cfg, std::sync::Arc::new(env.clock.clone())).expect("open store")
}

/// A value, a list and a map of one key: what the restore checks look at.
struct Handles {
    v: ValueState<u64>,
    l: ListState<u64>,
    m: MapState<u32, u64>,
}

fn handles(s: &StateStore) -> Handles {
    Handles {
        v: s.value_state(&ValueStateDescriptor::new("v")).unwrap(),
        l: s.list_state(&ListStateDescriptor::new("l")).unwrap(),
        m: s.map_state(&MapStateDescriptor::new("m")).unwrap(),
    }
}

/// Writes key i's value i, list [i, i+1] and map {i%4: i}.
fn write_key(s: &StateStore, h: &Handles, i: u64) {
    s.set_current_key(&key(i)).unwrap();
    h.v.update(&i).unwrap();
    h.l.add(&i).unwrap();
    h.l.add(&(i + 1)).unwrap();
    h.m.put(&((i % 4) as u32), &i).unwrap();
}

fn check_key(s: &StateStore, h: &Handles, i: u64) {
    s.set_current_key(&key(i)).unwrap();
    assert_eq!(h.v.value().unwrap(), Some(i), "value of key {i}");
    assert_eq!(h.l.get().unwrap(), vec![i, i + 1], "list of key {i}");
    assert_eq!(
        h.m.entries().unwrap(),
        vec![((i % 4) as u32, i)],
        "map of key {i}"
    );
}

#[test]
fn reads_see_writes_held_in_the_cache_and_the_backend_sees_one_write_per_key() {
    let env = Env::new();
    // The hashmap backend counts its entries exactly, so it shows what reached it.
    let s = open(&env, BackendKind::Hashmap, "s", 1 << 20);
    let count = s
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    for round in 0..100u64 {
        for k in 0..10 {
            s.set_current_key(&key(k)).unwrap();
            let n = count.value().unwrap().unwrap_or(0);
            assert_eq!(n, round, "read-your-writes for key {k}");
            count.update(&(n + 1)).unwrap();
        }
    }
    assert_eq!(
        s.approximate_entries().unwrap(),
        0,
        "writes wait in the cache until the barrier"
    );
    let stats = s.cache_stats();
    assert_eq!((stats.misses, stats.hits), (10, 990), "{stats:?}");
    s.snapshot(1, &env.path("chk-1")).unwrap();
    assert_eq!(s.approximate_entries().unwrap(), 10);
    assert_eq!(
        s.cache_stats().writebacks,
        10,
        "one write per key and epoch"
    );
    assert_eq!(
        s.cache_stats().entries,
        10,
        "written entries stay cached, clean"
    );
}

#[test]
fn a_snapshot_taken_right_after_writes_restores_them() {
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let env = Env::new();
        let s = open(&env, kind, "s", DEFAULT_CACHE_BYTES);
        let h = handles(&s);
        for i in 0..500 {
            write_key(&s, &h, i);
        }
        // Key 0's state goes away in the second epoch: tombstones are written back too.
        let first = s.snapshot(1, &env.path("chk-1")).unwrap();
        s.set_current_key(&key(0)).unwrap();
        h.v.clear().unwrap();
        h.l.clear().unwrap();
        h.m.clear().unwrap();
        for i in 500..600 {
            write_key(&s, &h, i);
        }
        assert!(s.cache_stats().entries > 0);
        let second = s.snapshot(2, &env.path("chk-2")).unwrap();
        for (cache, name) in [(0, "r-off"), (DEFAULT_CACHE_BYTES, "r-on")] {
            let r = open(&env, kind, name, cache);
            let rh = handles(&r);
            r.restore(&[(env.path("chk-2"), second.clone())]).unwrap();
            for i in 1..600 {
                check_key(&r, &rh, i);
            }
            r.set_current_key(&key(0)).unwrap();
            assert_eq!(
                rh.v.value().unwrap(),
                None,
                "{kind:?}: cleared value restored"
            );
            assert!(rh.l.get().unwrap().is_empty(), "{kind:?}");
            assert!(rh.m.is_empty().unwrap(), "{kind:?}");
            // And the first checkpoint still holds the first epoch only.
            r.restore(&[(env.path("chk-1"), first.clone())]).unwrap();
            check_key(&r, &rh, 0);
            r.set_current_key(&key(550)).unwrap();
            assert_eq!(rh.v.value().unwrap(), None, "{kind:?}");
        }
    }
}

#[test]
fn eviction_writes_back_and_every_value_survives() {
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let env = Env::new();
        let capacity = 16 << 10;
        let s = open(&env, kind, "s", capacity);
        let h = handles(&s);
        for i in 0..3000 {
            write_key(&s, &h, i);
            assert!(s.cache_stats().bytes <= capacity, "{kind:?}: over capacity");
        }
        let stats = s.cache_stats();
        assert!(stats.evictions > 5000, "{kind:?}: {stats:?}");
        assert!(stats.writebacks > 5000, "{kind:?}: {stats:?}");
        for i in 0..3000 {
            check_key(&s, &h, i);
        }
        let part = snapshot_to(&s, 1, &env.path("chk"));
        let r = open(&env, kind, "r", 0);
        let rh = handles(&r);
        r.restore(&[part]).unwrap();
        for i in 0..3000 {
            check_key(&r, &rh, i);
        }
    }
}

#[test]
fn restore_and_reset_drop_dirty_entries() {
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let env = Env::new();
        let s = open(&env, kind, "s", DEFAULT_CACHE_BYTES);
        let h = handles(&s);
        write_key(&s, &h, 1);
        let chk = snapshot_to(&s, 1, &env.path("chk-1"));
        // Epoch 2, never checkpointed: a rewind must forget all of it.
        s.set_current_key(&key(1)).unwrap();
        h.v.update(&100).unwrap();
        h.l.add(&100).unwrap();
        h.m.remove(&1).unwrap();
        write_key(&s, &h, 2);
        s.restore(&[chk]).unwrap();
        check_key(&s, &h, 1);
        s.set_current_key(&key(2)).unwrap();
        assert_eq!(
            h.v.value().unwrap(),
            None,
            "{kind:?}: dirty write survived a restore"
        );
        assert!(h.l.get().unwrap().is_empty(), "{kind:?}");
        // Nor do the dropped entries reach a later snapshot.
        let after = snapshot_to(&s, 2, &env.path("chk-2"));
        let r = open(&env, kind, "r", 0);
        let rh = handles(&r);
        r.restore(&[after]).unwrap();
        check_key(&r, &rh, 1);
        r.set_current_key(&key(2)).unwrap();
        assert_eq!(rh.v.value().unwrap(), None, "{kind:?}");
        // A reset (restore of nothing) leaves nothing, cached or stored.
        write_key(&s, &h, 3);
        s.restore(&[]).unwrap();
        assert_eq!(s.cache_stats().entries, 0);
        for i in [1, 2, 3] {
            s.set_current_key(&key(i)).unwrap();
            assert_eq!(h.v.value().unwrap(), None, "{kind:?}: key {i} after reset");
        }
        assert_eq!(s.key_state_json(&key(3)).unwrap(), None);
    }
}

/// The same operations (every state kind, TTL, namespaces, timers, clears)
/// against one store; returns its savepoint's keyed-state checksum, and the
/// state lookup of every key (read before the barrier) followed by what every
/// read in the workload saw. With `batch`, steps run
/// in batches of that many, each reading ahead the value and map entry its
/// steps touch (and some they do not), as the job loop runs polled records.
fn run_workload(
    env: &Env,
    kind: BackendKind,
    name: &str,
    cache: u64,
    batch: Option<u64>,
) -> (String, Vec<String>) {
    env.clock.set(1_000_000);
    let s = open(env, kind, name, cache);
    let ttl = TtlConfig::new(Duration::from_millis(50))
        .update_type(UpdateType::OnReadAndWrite)
        .cleanup_full_snapshot();
    let v = s
        .value_state(&ValueStateDescriptor::<u64>::new("v").with_ttl(ttl.clone()))
        .unwrap();
    let l = s
        .list_state(&ListStateDescriptor::<u64>::new("l").with_ttl(ttl.clone()))
        .unwrap();
    let m = s
        .map_state(&MapStateDescriptor::<u32, u64>::new("m"))
        .unwrap();
    let r = s
        .reducing_state(&ReducingStateDescriptor::new("r", |a: &u64, b: &u64| a + b))
        .unwrap();
    let key_of = |step: u64| key((step * 7919) % 37);
    // What every read saw, in order: part of what must not depend on the cache.
    let mut reads = Vec::new();
    for step in 0..2000u64 {
        if let Some(n) = batch.filter(|n| step % n == 0) {
            s.end_batch().unwrap();
            s.begin_batch().unwrap();
            let mut ahead = s.prefetch_list();
            for ahead_step in step..step + n + 3 {
                let ns = [(ahead_step % 3) as u8];
                v.prefetch(&mut ahead, &key_of(ahead_step), &ns).unwrap();
                m.prefetch(
                    &mut ahead,
                    &key_of(ahead_step),
                    &ns,
                    &((ahead_step % 5) as u32),
                )
                .unwrap();
            }
            s.prefetch(ahead).unwrap();
        }
        env.clock.advance(step % 3);
        let k = (step * 7919) % 37;
        s.set_current_key(&key(k)).unwrap();
        s.set_current_namespace(&[(step % 3) as u8]);
        match step % 9 {
            0 => v.update(&step).unwrap(),
            1 => reads.push(format!(
                "{:?} {:?}",
                v.value().unwrap(),
                m.get(&((step % 5) as u32)).unwrap()
            )),
            2 => l.add(&step).unwrap(),
            3 => reads.push(format!("{:?}", l.get().unwrap())),
            4 => m.put(&((step % 5) as u32), &step).unwrap(),
            5 => m.remove(&((step % 5) as u32)).unwrap(),
            6 => r.add(&step).unwrap(),
            7 => s.register_event_time_timer(step % 100).unwrap(),
            _ if step % 45 == 8 => {
                v.clear().unwrap();
                m.clear().unwrap();
            }
            _ => reads.push(format!("{:?}", m.entries().unwrap())),
        }
    }
    s.pop_due_timers(TimeDomain::EventTime, 50).unwrap();
    s.end_batch().unwrap();
    let lookups = (0..37)
        .map(|k| format!("{:?}", s.key_state_json(&key(k)).unwrap()))
        .chain(reads)
        .collect();
    let sp = s
        .write_savepoint(1, &env.path(&format!("{name}-sp")))
        .unwrap();
    let keyed = sp
        .files
        .iter()
        .find(|f| f.path == "keyed.bin")
        .expect("keyed.bin")
        .sha256
        .clone();
    (keyed, lookups)
}

#[test]
fn savepoints_and_state_lookups_are_identical_with_the_cache_on_and_off_and_in_batches() {
    for kind in [BackendKind::Hashmap, BackendKind::Rocksdb] {
        let env = Env::new();
        let off = run_workload(&env, kind, "off", 0, None);
        let on = run_workload(&env, kind, "on", DEFAULT_CACHE_BYTES, None);
        let tiny = run_workload(&env, kind, "tiny", TINY_CACHE_BYTES, None);
        let batched = run_workload(&env, kind, "batched", 0, Some(16));
        let batched_on = run_workload(&env, kind, "batched-on", DEFAULT_CACHE_BYTES, Some(16));
        assert_eq!(
            batched.1, off.1,
            "{kind:?}: state lookups differ when run in batches"
        );
        assert_eq!(
            batched.0, off.0,
            "{kind:?}: savepoint bytes differ when run in batches"
        );
        assert_eq!(
            batched_on, off,
            "{kind:?}: state differs when run in batches with the cache on"
        );
        assert!(off.1.iter().any(|l| l != "None"), "the workload left state");
        assert_eq!(
            on.1, off.1,
            "{kind:?}: state lookups differ with the cache on"
        );
        assert_eq!(
            tiny.1, off.1,
            "{kind:?}: state lookups differ with a tiny cache"
        );
        assert_eq!(
            on.0, off.0,
            "{kind:?}: savepoint bytes differ with the cache on"
        );
        assert_eq!(
            tiny.0, off.0,
            "{kind:?}: savepoint bytes differ with a tiny cache"
        );
    }
}

#[test]
fn cache_bytes_zero_turns_the_cache_off() {
    let env = Env::new();
    let s = open(&env, BackendKind::Hashmap, "s", 0);
    let h = handles(&s);
    write_key(&s, &h, 1);
    check_key(&s, &h, 1);
    assert_eq!(
        s.approximate_entries().unwrap(),
        3,
        "written straight through"
    );
    assert_eq!(
        s.cache_stats(),
        CacheStats::default(),
        "no hits, misses or entries without a cache"
    );
}
