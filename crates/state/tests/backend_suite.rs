//! The conformance suite: every test runs on both backends.

mod common;

use common::*;
use streamstate_state::*;

on_every_backend!(
    value_state_is_scoped_to_the_current_key,
    value_state_returns_descriptor_default_until_updated_and_after_clear,
    keyed_state_without_current_key_is_an_error,
    list_state_appends_replaces_and_clears,
    map_state_supports_point_ops_and_iteration,
    namespaces_isolate_state_of_the_same_key,
    reducing_state_folds_added_values,
    aggregating_state_keeps_accumulator_and_merges_namespaces,
    reusing_a_name_with_another_kind_is_refused,
    timers_fire_in_time_order_and_deleted_timers_do_not_fire,
    snapshot_then_restore_brings_back_every_kind_of_state,
    restore_into_the_other_backend_gives_identical_state,
    operator_list_state_splits_evenly_and_union_state_goes_to_everyone,
    broadcast_state_is_identical_on_every_instance_after_restore,
    keys_outside_the_instance_range_are_refused,
    turning_ttl_on_for_existing_state_is_refused,
);

fn turning_ttl_on_for_existing_state_is_refused(kind: BackendKind) {
    let env = Env::new();
    let s = env.single(kind, "s");
    s.value_state(&ValueStateDescriptor::<u8>::new("v"))
        .unwrap();
    let with_ttl = ValueStateDescriptor::<u8>::new("v")
        .with_ttl(TtlConfig::new(std::time::Duration::from_secs(1)));
    assert!(matches!(
        s.value_state(&with_ttl),
        Err(StateError::Incompatible(_))
    ));
    // Same refusal when the state comes from a snapshot.
    let part = snapshot_to(&s, 1, &env.path("chk"));
    let r = env.single(kind, "r");
    r.value_state(&with_ttl).unwrap();
    assert!(matches!(
        r.restore(&[part]),
        Err(StateError::Incompatible(_))
    ));
}

fn value_state_is_scoped_to_the_current_key(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let count = store
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .unwrap();
    for (k, times) in [(b"a", 3u64), (b"b", 5)] {
        for _ in 0..times {
            store.set_current_key(k).unwrap();
            let n = count.value().unwrap().unwrap_or(0);
            count.update(&(n + 1)).unwrap();
        }
    }
    store.set_current_key(b"a").unwrap();
    assert_eq!(count.value().unwrap(), Some(3));
    store.set_current_key(b"b").unwrap();
    assert_eq!(count.value().unwrap(), Some(5));
    store.set_current_key(b"c").unwrap();
    assert_eq!(count.value().unwrap(), None);
}

fn value_state_returns_descriptor_default_until_updated_and_after_clear(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let v = store
        .value_state(&ValueStateDescriptor::new("v").with_default(String::from("none")))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    assert_eq!(v.value().unwrap().as_deref(), Some("none"));
    v.update(&"x".to_string()).unwrap();
    assert_eq!(v.value().unwrap().as_deref(), Some("x"));
    v.clear().unwrap();
    assert_eq!(v.value().unwrap().as_deref(), Some("none"));
}

fn keyed_state_without_current_key_is_an_error(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let v = store
        .value_state(&ValueStateDescriptor::<u8>::new("v"))
        .unwrap();
    assert!(matches!(v.value(), Err(StateError::NoCurrentKey)));
}

fn list_state_appends_replaces_and_clears(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let l = store
        .list_state(&ListStateDescriptor::<(String, u32)>::new("l"))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    assert!(l.get().unwrap().is_empty());
    l.add(&("a".into(), 1)).unwrap();
    l.add_all(&[("b".into(), 2), ("c".into(), 3)]).unwrap();
    assert_eq!(
        l.get().unwrap(),
        vec![("a".into(), 1), ("b".into(), 2), ("c".into(), 3)]
    );
    store.set_current_key(b"other").unwrap();
    assert!(l.get().unwrap().is_empty());
    store.set_current_key(b"k").unwrap();
    l.update(&[("z".into(), 9)]).unwrap();
    assert_eq!(l.get().unwrap(), vec![("z".into(), 9)]);
    l.update(&[]).unwrap();
    assert!(l.get().unwrap().is_empty());
    l.add(&("q".into(), 0)).unwrap();
    l.clear().unwrap();
    assert!(l.get().unwrap().is_empty());
}

fn map_state_supports_point_ops_and_iteration(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let m = store
        .map_state(&MapStateDescriptor::<String, i64>::new("m"))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    assert!(m.is_empty().unwrap());
    m.put(&"a".into(), &1).unwrap();
    m.put_all([(&"b".to_string(), &2), (&"c".to_string(), &3)])
        .unwrap();
    m.put(&"a".into(), &10).unwrap();
    assert_eq!(m.get(&"a".into()).unwrap(), Some(10));
    assert!(m.contains(&"b".into()).unwrap());
    m.remove(&"b".into()).unwrap();
    assert!(!m.contains(&"b".into()).unwrap());
    assert_eq!(m.get(&"b".into()).unwrap(), None);
    let mut entries = m.entries().unwrap();
    entries.sort();
    assert_eq!(entries, vec![("a".into(), 10), ("c".into(), 3)]);
    let mut keys = m.keys().unwrap();
    keys.sort();
    assert_eq!(keys, vec!["a".to_string(), "c".to_string()]);
    let mut values = m.values().unwrap();
    values.sort();
    assert_eq!(values, vec![3, 10]);
    // Another key's map is separate, even with a key that is a prefix.
    store.set_current_key(b"").unwrap();
    assert!(m.is_empty().unwrap());
    m.put(&"x".into(), &1).unwrap();
    store.set_current_key(b"k").unwrap();
    m.clear().unwrap();
    assert!(m.is_empty().unwrap());
    store.set_current_key(b"").unwrap();
    assert_eq!(m.get(&"x".into()).unwrap(), Some(1));
}

fn namespaces_isolate_state_of_the_same_key(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let v = store
        .value_state(&ValueStateDescriptor::<u32>::new("v"))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    store.set_current_namespace(b"window-1");
    v.update(&1).unwrap();
    store.set_current_namespace(b"window-2");
    assert_eq!(v.value().unwrap(), None);
    v.update(&2).unwrap();
    store.set_current_namespace(b"window-1");
    assert_eq!(v.value().unwrap(), Some(1));
}

fn reducing_state_folds_added_values(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let r = store
        .reducing_state(&ReducingStateDescriptor::new("max", |a: &u64, b: &u64| {
            *a.max(b)
        }))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    assert_eq!(r.get().unwrap(), None);
    for x in [3, 9, 4] {
        r.add(&x).unwrap();
    }
    assert_eq!(r.get().unwrap(), Some(9));
    r.clear().unwrap();
    assert_eq!(r.get().unwrap(), None);
}

pub struct Avg;
impl AggregateFunction for Avg {
    type In = u64;
    type Acc = (u64, u64);
    type Out = f64;
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, v: u64, acc: (u64, u64)) -> (u64, u64) {
        (acc.0 + v, acc.1 + 1)
    }
    fn get_result(&self, acc: &(u64, u64)) -> f64 {
        acc.0 as f64 / acc.1 as f64
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

fn aggregating_state_keeps_accumulator_and_merges_namespaces(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    let a = store
        .aggregating_state(&AggregatingStateDescriptor::new("avg", Avg))
        .unwrap();
    store.set_current_key(b"k").unwrap();
    store.set_current_namespace(b"w1");
    a.add(2).unwrap();
    a.add(4).unwrap();
    assert_eq!(a.get().unwrap(), Some(3.0));
    store.set_current_namespace(b"w2");
    a.add(9).unwrap();
    a.merge_namespaces(b"w3", &[b"w1", b"w2"]).unwrap();
    assert_eq!(a.get().unwrap(), None, "sources are cleared");
    store.set_current_namespace(b"w3");
    assert_eq!(a.get().unwrap(), Some(5.0));
}

fn reusing_a_name_with_another_kind_is_refused(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    store
        .value_state(&ValueStateDescriptor::<u8>::new("x"))
        .unwrap();
    assert!(matches!(
        store.list_state(&ListStateDescriptor::<u8>::new("x")),
        Err(StateError::KindMismatch { .. })
    ));
}

fn timers_fire_in_time_order_and_deleted_timers_do_not_fire(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    store.set_current_key(b"a").unwrap();
    store.register_event_time_timer(30).unwrap();
    store.register_event_time_timer(10).unwrap();
    store.register_event_time_timer(10).unwrap(); // duplicate: one timer
    store.set_current_key(b"b").unwrap();
    store.set_current_namespace(b"w");
    store.register_event_time_timer(20).unwrap();
    store.register_event_time_timer(25).unwrap();
    store.delete_event_time_timer(25).unwrap();
    store.register_processing_time_timer(5).unwrap();
    assert_eq!(store.next_timer(TimeDomain::EventTime), Some(10));
    let due = store.pop_due_timers(TimeDomain::EventTime, 20).unwrap();
    let got: Vec<(u64, Vec<u8>, Vec<u8>)> = due
        .into_iter()
        .map(|t| (t.timestamp, t.key, t.namespace))
        .collect();
    assert_eq!(
        got,
        vec![
            (10, b"a".to_vec(), vec![]),
            (20, b"b".to_vec(), b"w".to_vec())
        ]
    );
    // Survives snapshot + restore.
    let (d, r) = snapshot_to(&store, 1, &env.path("chk"));
    let restored = env.single(kind, "r");
    restored.restore(&[(d, r)]).unwrap();
    assert_eq!(
        restored
            .pop_due_timers(TimeDomain::EventTime, 100)
            .unwrap()
            .iter()
            .map(|t| t.timestamp)
            .collect::<Vec<_>>(),
        vec![30]
    );
    assert_eq!(
        restored
            .pop_due_timers(TimeDomain::ProcessingTime, 100)
            .unwrap()
            .len(),
        1
    );
    assert_eq!(restored.timer_count(TimeDomain::EventTime), 0);
}

/// Writes a bit of every state kind for keys 0..n and returns a dump.
pub fn fill_all_kinds(store: &StateStore, n: u64) {
    let v = store
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let l = store
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let m = store
        .map_state(&MapStateDescriptor::<u64, String>::new("m"))
        .unwrap();
    let r = store
        .reducing_state(&ReducingStateDescriptor::new("r", |a: &u64, b: &u64| a + b))
        .unwrap();
    for i in 0..n {
        store.set_current_key(&key(i)).unwrap();
        v.update(&i).unwrap();
        l.add_all(&[i, i + 1]).unwrap();
        m.put(&i, &format!("v{i}")).unwrap();
        r.add(&i).unwrap();
        r.add(&1).unwrap();
        store.register_event_time_timer(i).unwrap();
    }
    store
        .operator_list_state::<(String, i32, i64)>("offsets")
        .unwrap()
        .update(&[("t".into(), 0, 42), ("t".into(), 1, 7)])
        .unwrap();
    store
        .broadcast_state(&MapStateDescriptor::<String, String>::new("rules"))
        .put(&"r1".into(), &"x > 1".into())
        .unwrap();
}

pub fn dump_all_kinds(store: &StateStore, n: u64) -> Vec<String> {
    let v = store
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap();
    let l = store
        .list_state(&ListStateDescriptor::<u64>::new("l"))
        .unwrap();
    let m = store
        .map_state(&MapStateDescriptor::<u64, String>::new("m"))
        .unwrap();
    let r = store
        .reducing_state(&ReducingStateDescriptor::new("r", |a: &u64, b: &u64| a + b))
        .unwrap();
    let mut out = Vec::new();
    for i in 0..n {
        store.set_current_key(&key(i)).unwrap();
        out.push(format!(
            "{i}: {:?} {:?} {:?} {:?}",
            v.value().unwrap(),
            l.get().unwrap(),
            m.entries().unwrap(),
            r.get().unwrap()
        ));
    }
    out.push(format!(
        "{:?}",
        store
            .operator_list_state::<(String, i32, i64)>("offsets")
            .unwrap()
            .get()
            .unwrap()
    ));
    out.push(format!(
        "{:?}",
        store
            .read_only_broadcast_state(&MapStateDescriptor::<String, String>::new("rules"))
            .entries()
            .unwrap()
    ));
    out.push(format!(
        "timers {}",
        store.timer_count(TimeDomain::EventTime)
    ));
    out
}

fn snapshot_then_restore_brings_back_every_kind_of_state(kind: BackendKind) {
    let env = Env::new();
    let store = env.single(kind, "s");
    fill_all_kinds(&store, 50);
    let before = dump_all_kinds(&store, 50);
    let (d, r) = snapshot_to(&store, 7, &env.path("chk-7"));
    assert_eq!(r.identity.checkpoint_id, 7);
    assert_eq!(r.identity.max_parallelism, 128);
    assert!(r.files.iter().all(|f| f.sha256.len() == 64));
    assert!(
        r.files
            .iter()
            .any(|f| f.path == "state-meta.json" && f.size > 0)
    );
    // Changes after the snapshot are not in it.
    store.set_current_key(&key(0)).unwrap();
    store
        .value_state(&ValueStateDescriptor::<u64>::new("v"))
        .unwrap()
        .update(&999)
        .unwrap();
    let restored = env.single(kind, "r");
    assert!(!restored.is_restored());
    restored.restore(&[(d.clone(), r.clone())]).unwrap();
    assert!(restored.is_restored());
    assert_eq!(dump_all_kinds(&restored, 50), before);
    // Restoring into the live store rolls it back too.
    store.restore(&[(d, r)]).unwrap();
    assert_eq!(dump_all_kinds(&store, 50), before);
}

fn restore_into_the_other_backend_gives_identical_state(kind: BackendKind) {
    let other = if kind == BackendKind::Hashmap {
        BackendKind::Rocksdb
    } else {
        BackendKind::Hashmap
    };
    let env = Env::new();
    let store = env.single(kind, "s");
    fill_all_kinds(&store, 30);
    let (d, r) = snapshot_to(&store, 1, &env.path("chk"));
    let restored = env.single(other, "r");
    restored.restore(&[(d, r)]).unwrap();
    assert_eq!(dump_all_kinds(&restored, 30), dump_all_kinds(&store, 30));
}

fn operator_list_state_splits_evenly_and_union_state_goes_to_everyone(kind: BackendKind) {
    let env = Env::new();
    let mut parts = Vec::new();
    for i in 0..2u32 {
        let s = env.open(kind, &format!("old{i}"), 128, i, 2);
        s.operator_list_state::<u32>("split")
            .unwrap()
            .update(&[i * 10, i * 10 + 1, i * 10 + 2])
            .unwrap();
        s.union_list_state::<u32>("union").unwrap().add(&i).unwrap();
        parts.push(snapshot_to(&s, 1, &env.path(&format!("chk{i}"))));
    }
    // Same parallelism: each instance gets exactly its own entries back.
    let same = env.open(kind, "same1", 128, 1, 2);
    same.restore(&parts).unwrap();
    assert_eq!(
        same.operator_list_state::<u32>("split")
            .unwrap()
            .get()
            .unwrap(),
        vec![10, 11, 12]
    );
    // Rescale 2 -> 3: even split of all six entries, union to everyone.
    let mut split_all = Vec::new();
    for i in 0..3u32 {
        let s = env.open(kind, &format!("new{i}"), 128, i, 3);
        s.restore(&parts).unwrap();
        let got = s
            .operator_list_state::<u32>("split")
            .unwrap()
            .get()
            .unwrap();
        assert_eq!(got.len(), 2);
        split_all.extend(got);
        assert_eq!(
            s.union_list_state::<u32>("union").unwrap().get().unwrap(),
            vec![0, 1]
        );
    }
    assert_eq!(split_all, vec![0, 1, 2, 10, 11, 12]);
}

fn broadcast_state_is_identical_on_every_instance_after_restore(kind: BackendKind) {
    let env = Env::new();
    let desc = MapStateDescriptor::<String, u32>::new("rules");
    let s = env.single(kind, "s");
    let rules = s.broadcast_state(&desc);
    rules.put(&"a".into(), &1).unwrap();
    rules.put(&"b".into(), &2).unwrap();
    rules.remove(&"a".into()).unwrap();
    let part = snapshot_to(&s, 1, &env.path("chk"));
    for i in 0..3 {
        let n = env.open(kind, &format!("n{i}"), 128, i, 3);
        n.restore(std::slice::from_ref(&part)).unwrap();
        let read = n.read_only_broadcast_state(&desc);
        assert_eq!(read.entries().unwrap(), vec![("b".to_string(), 2)]);
        assert!(!read.contains(&"a".into()).unwrap());
    }
}

fn keys_outside_the_instance_range_are_refused(kind: BackendKind) {
    let env = Env::new();
    let s = env.open(kind, "s", 128, 0, 2);
    let range = s.key_group_range();
    let outside = (0..1000u64)
        .map(key)
        .find(|k| !range.contains(key_group_for(k, 128)))
        .unwrap();
    assert!(matches!(
        s.set_current_key(&outside),
        Err(StateError::Invalid(_))
    ));
}
