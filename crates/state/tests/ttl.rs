//! TTL table tests: every UpdateType × StateVisibility × cleanup strategy, on
//! both backends with the state cache off, on and tiny, with per-entry expiry
//! in list and map state; the same expectations hold in every cache mode. The expected
//! outcome is computed from Flink's rules, written out below.

mod common;

use common::*;
use streamstate_state::*;

const TTL: u64 = 100;

#[derive(Debug, Clone, Copy, PartialEq)]
enum Cleanup {
    OnReadOnly,
    FullSnapshot,
    Incremental,
    CompactionFilter,
}

struct Case {
    kind: BackendKind,
    update: UpdateType,
    visibility: StateVisibility,
    cleanup: Cleanup,
}

impl Case {
    fn ttl(&self) -> TtlConfig {
        let t = TtlConfig::new(std::time::Duration::from_millis(TTL))
            .update_type(self.update)
            .visibility(self.visibility);
        match self.cleanup {
            Cleanup::OnReadOnly => t,
            Cleanup::FullSnapshot => t.cleanup_full_snapshot(),
            Cleanup::Incremental => t.cleanup_incrementally(1000),
            Cleanup::CompactionFilter => t.cleanup_in_rocksdb_compaction_filter(),
        }
    }

    /// Would the strategy have physically removed an expired entry by t=120?
    /// A RocksDB compaction filter can only drop a whole list, never some of
    /// its elements; on the heap there is no compaction.
    fn cleaned(&self, whole_value_expired: bool) -> bool {
        match self.cleanup {
            Cleanup::OnReadOnly => false,
            Cleanup::FullSnapshot | Cleanup::Incremental => true,
            Cleanup::CompactionFilter => self.kind == BackendKind::Rocksdb && whole_value_expired,
        }
    }

    fn visible(&self, expired: bool, whole_value_expired: bool) -> bool {
        !expired
            || (!self.cleaned(whole_value_expired)
                && self.visibility == StateVisibility::ReturnExpiredIfNotCleanedUp)
    }
}

fn run(case: &Case) {
    let label = format!(
        "{:?} {:?} {:?} {:?} cache {:?}",
        case.kind,
        case.update,
        case.visibility,
        case.cleanup,
        cache_mode()
    );
    let env = Env::new();
    let t0 = 1_000_000;
    env.clock.set(t0);
    let mut store = env.single(case.kind, "s");
    let ttl = case.ttl();
    let vd = ValueStateDescriptor::<u32>::new("v").with_ttl(ttl.clone());
    let ld = ListStateDescriptor::<String>::new("l").with_ttl(ttl.clone());
    let md = MapStateDescriptor::<String, u32>::new("m").with_ttl(ttl.clone());
    let (v, l, m) = (
        store.value_state(&vd).unwrap(),
        store.list_state(&ld).unwrap(),
        store.map_state(&md).unwrap(),
    );

    // t=0: a.v=1, a.l=[x], a.m={k1:1}, b.v=2
    store.set_current_key(b"a").unwrap();
    v.update(&1).unwrap();
    l.add(&"x".into()).unwrap();
    m.put(&"k1".into(), &1).unwrap();
    store.set_current_key(b"b").unwrap();
    v.update(&2).unwrap();
    // t=50: a.l += y, a.m.k2 = 2
    env.clock.set(t0 + 50);
    store.set_current_key(b"a").unwrap();
    l.add(&"y".into()).unwrap();
    m.put(&"k2".into(), &2).unwrap();
    // t=60: read everything of a (OnReadAndWrite refreshes all of it)
    env.clock.set(t0 + 60);
    assert_eq!(v.value().unwrap(), Some(1), "{label}");
    assert_eq!(l.get().unwrap().len(), 2, "{label}");
    assert_eq!(m.entries().unwrap().len(), 2, "{label}");

    // t=120: x, k1 (written 0) and b's value expired; a's value expired
    // unless refreshed by the read at 60; y and k2 (50 or 60) alive.
    env.clock.set(t0 + 120);
    let refreshed = case.update == UpdateType::OnReadAndWrite;
    let a_expired = !refreshed;
    let x_expired = !refreshed;
    match case.cleanup {
        Cleanup::OnReadOnly => {}
        Cleanup::FullSnapshot => {
            let sp = env.path("sp");
            store.write_savepoint(1, &sp).unwrap();
            let fresh = env.single(case.kind, "restored");
            fresh.restore_savepoint(&[sp]).unwrap();
            store = fresh;
        }
        Cleanup::Incremental => {
            store.set_current_key(b"unrelated").unwrap();
        }
        Cleanup::CompactionFilter => store.compact().unwrap(),
    }
    let (v, l, m) = (
        store.value_state(&vd).unwrap(),
        store.list_state(&ld).unwrap(),
        store.map_state(&md).unwrap(),
    );

    store.set_current_key(b"a").unwrap();
    let want_a = case.visible(a_expired, a_expired).then_some(1);
    assert_eq!(v.value().unwrap(), want_a, "value a: {label}");
    let mut want_l = Vec::new();
    if case.visible(x_expired, false) {
        want_l.push("x".to_string());
    }
    want_l.push("y".to_string());
    assert_eq!(l.get().unwrap(), want_l, "list: {label}");
    let mut want_m = Vec::new();
    if case.visible(x_expired, x_expired) {
        want_m.push(("k1".to_string(), 1));
    }
    want_m.push(("k2".to_string(), 2));
    let mut got_m = m.entries().unwrap();
    got_m.sort();
    assert_eq!(got_m, want_m, "map: {label}");
    store.set_current_key(b"b").unwrap();
    assert_eq!(
        v.value().unwrap(),
        case.visible(true, true).then_some(2),
        "value b: {label}"
    );

    // Whatever was returned expired has now been removed by the read.
    store.set_current_key(b"a").unwrap();
    assert_eq!(
        v.value().unwrap(),
        (!a_expired).then_some(1),
        "second read a: {label}"
    );
    assert_eq!(
        l.get().unwrap().len(),
        if x_expired { 1 } else { 2 },
        "second read list: {label}"
    );
    assert_eq!(
        m.keys().unwrap().len(),
        if x_expired { 1 } else { 2 },
        "second read map: {label}"
    );
    store.set_current_key(b"b").unwrap();
    assert_eq!(v.value().unwrap(), None, "second read b: {label}");

    // Past everyone's TTL nothing is visible under NeverReturnExpired.
    env.clock.set(t0 + 1000);
    if case.visibility == StateVisibility::NeverReturnExpired {
        store.set_current_key(b"a").unwrap();
        assert_eq!(v.value().unwrap(), None, "{label}");
        assert!(l.get().unwrap().is_empty(), "{label}");
        assert!(m.is_empty().unwrap(), "{label}");
    }
}

#[test]
fn every_ttl_combination_behaves_as_flink_on_both_backends_with_and_without_cache() {
    let mut n = 0;
    for (mode, kind) in every_setup() {
        for update in [UpdateType::OnCreateAndWrite, UpdateType::OnReadAndWrite] {
            for visibility in [
                StateVisibility::NeverReturnExpired,
                StateVisibility::ReturnExpiredIfNotCleanedUp,
            ] {
                for cleanup in [
                    Cleanup::OnReadOnly,
                    Cleanup::FullSnapshot,
                    Cleanup::Incremental,
                    Cleanup::CompactionFilter,
                ] {
                    with_cache(mode, || {
                        run(&Case {
                            kind,
                            update,
                            visibility,
                            cleanup,
                        })
                    });
                    n += 1;
                }
            }
        }
    }
    assert_eq!(n, 128);
}

#[test]
fn ttl_write_refreshes_and_expiry_is_exactly_at_ttl() {
    for (mode, kind) in every_setup() {
        let _mode = CacheGuard::set(mode);
        let env = Env::new();
        let store = env.single(kind, "s");
        let v = store
            .value_state(
                &ValueStateDescriptor::<u8>::new("v")
                    .with_ttl(TtlConfig::new(std::time::Duration::from_millis(10))),
            )
            .unwrap();
        store.set_current_key(b"k").unwrap();
        v.update(&1).unwrap();
        env.clock.advance(9);
        v.update(&2).unwrap();
        env.clock.advance(9);
        assert_eq!(
            v.value().unwrap(),
            Some(2),
            "write refreshed the timestamp: {mode:?} {kind:?}"
        );
        env.clock.advance(1);
        assert_eq!(
            v.value().unwrap(),
            None,
            "expired at last_write + ttl: {mode:?} {kind:?}"
        );
    }
}

#[test]
fn reducing_state_ignores_an_expired_accumulator() {
    for (mode, kind) in every_setup() {
        let _mode = CacheGuard::set(mode);
        let env = Env::new();
        let store = env.single(kind, "s");
        let ttl = TtlConfig::new(std::time::Duration::from_millis(10))
            .visibility(StateVisibility::ReturnExpiredIfNotCleanedUp);
        let r = store
            .reducing_state(
                &ReducingStateDescriptor::new("sum", |a: &u32, b: &u32| a + b).with_ttl(ttl),
            )
            .unwrap();
        store.set_current_key(b"k").unwrap();
        r.add(&5).unwrap();
        env.clock.advance(10);
        r.add(&1).unwrap();
        assert_eq!(r.get().unwrap(), Some(1), "{mode:?} {kind:?}");
    }
}
