//! Property test: random operation sequences over every state kind, with
//! TTL and a fake clock, give the same results on both backends (state cache
//! off, on and tiny) and on a
//! plain in-memory reference model — also across snapshot → restore at
//! random points.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::time::Duration;

use common::*;
use proptest::prelude::*;
use streamstate_state::*;

const VTTL: u64 = 100;
const LTTL: u64 = 80;
const MTTL: u64 = 120;

#[derive(Debug, Clone)]
enum Op {
    SetKey(u8),
    SetNs(u8),
    Advance(u64),
    ValueUpdate(u8),
    ValueGet,
    ValueClear,
    ListAdd(u8),
    ListAddAll(Vec<u8>),
    ListUpdate(Vec<u8>),
    ListGet,
    ListClear,
    MapPut(u8, u8),
    MapRemove(u8),
    MapGet(u8),
    MapContains(u8),
    MapEntries,
    MapIsEmpty,
    MapClear,
    ReduceAdd(u8),
    ReduceGet,
    AggAdd(u8),
    AggGet,
    TimerRegister(u8),
    TimerDelete(u8),
    TimerPop(u8),
    OperatorAdd(u8),
    OperatorGet,
    SnapshotRestore,
}

fn op() -> impl Strategy<Value = Op> {
    prop_oneof![
        3 => (0u8..3).prop_map(Op::SetKey),
        1 => (0u8..3).prop_map(Op::SetNs),
        4 => (0u64..70).prop_map(Op::Advance),
        2 => any::<u8>().prop_map(Op::ValueUpdate),
        4 => Just(Op::ValueGet),
        1 => Just(Op::ValueClear),
        2 => any::<u8>().prop_map(Op::ListAdd),
        1 => proptest::collection::vec(any::<u8>(), 0..4).prop_map(Op::ListAddAll),
        1 => proptest::collection::vec(any::<u8>(), 0..4).prop_map(Op::ListUpdate),
        3 => Just(Op::ListGet),
        1 => Just(Op::ListClear),
        2 => (0u8..5, any::<u8>()).prop_map(|(k, v)| Op::MapPut(k, v)),
        1 => (0u8..5).prop_map(Op::MapRemove),
        2 => (0u8..5).prop_map(Op::MapGet),
        1 => (0u8..5).prop_map(Op::MapContains),
        1 => Just(Op::MapEntries),
        1 => Just(Op::MapIsEmpty),
        1 => Just(Op::MapClear),
        1 => any::<u8>().prop_map(Op::ReduceAdd),
        1 => Just(Op::ReduceGet),
        1 => any::<u8>().prop_map(Op::AggAdd),
        1 => Just(Op::AggGet),
        1 => (0u8..50).prop_map(Op::TimerRegister),
        1 => (0u8..50).prop_map(Op::TimerDelete),
        1 => (0u8..60).prop_map(Op::TimerPop),
        1 => any::<u8>().prop_map(Op::OperatorAdd),
        1 => Just(Op::OperatorGet),
        1 => Just(Op::SnapshotRestore),
    ]
}

struct CountSum;
impl AggregateFunction for CountSum {
    type In = u8;
    type Acc = (u64, u64);
    type Out = (u64, u64);
    fn create_accumulator(&self) -> (u64, u64) {
        (0, 0)
    }
    fn add(&self, v: u8, a: (u64, u64)) -> (u64, u64) {
        (a.0 + v as u64, a.1 + 1)
    }
    fn get_result(&self, a: &(u64, u64)) -> (u64, u64) {
        *a
    }
    fn merge(&self, a: (u64, u64), b: (u64, u64)) -> (u64, u64) {
        (a.0 + b.0, a.1 + b.1)
    }
}

fn value_desc() -> ValueStateDescriptor<u8> {
    ValueStateDescriptor::new("v").with_ttl(
        TtlConfig::new(Duration::from_millis(VTTL)).update_type(UpdateType::OnReadAndWrite),
    )
}
fn list_desc() -> ListStateDescriptor<u8> {
    ListStateDescriptor::new("l")
        .with_ttl(TtlConfig::new(Duration::from_millis(LTTL)).cleanup_full_snapshot())
}
fn map_desc() -> MapStateDescriptor<u8, u8> {
    MapStateDescriptor::new("m").with_ttl(
        TtlConfig::new(Duration::from_millis(MTTL))
            .cleanup_incrementally(3)
            .cleanup_in_rocksdb_compaction_filter(),
    )
}
fn reduce_desc() -> ReducingStateDescriptor<u64> {
    ReducingStateDescriptor::new("r", |a: &u64, b: &u64| a + b)
}

/// Output of one operation, compared across implementations.
#[derive(Debug, PartialEq)]
enum Out {
    None,
    Value(Option<u8>),
    List(Vec<u8>),
    Entries(Vec<(u8, u8)>),
    Bool(bool),
    Sum(Option<u64>),
    Agg(Option<(u64, u64)>),
    Timers(Vec<(u64, Vec<u8>, Vec<u8>)>),
}

struct Real {
    store: StateStore,
    v: ValueState<u8>,
    l: ListState<u8>,
    m: MapState<u8, u8>,
    r: ReducingState<u64>,
    a: AggregatingState<CountSum>,
    kind: BackendKind,
    generation: u32,
    /// Which of the two side-by-side stores this is (they switch backends).
    lane: u8,
    key: Option<u8>,
    ns: u8,
}

impl Real {
    fn new(env: &Env, kind: BackendKind, generation: u32, lane: u8) -> Self {
        let store = env.single(kind, &format!("{kind:?}-{generation}-{lane}"));
        store.set_current_namespace(&[0]); // the model's starting namespace
        Self {
            v: store.value_state(&value_desc()).unwrap(),
            l: store.list_state(&list_desc()).unwrap(),
            m: store.map_state(&map_desc()).unwrap(),
            r: store.reducing_state(&reduce_desc()).unwrap(),
            a: store
                .aggregating_state(&AggregatingStateDescriptor::new("a", CountSum))
                .unwrap(),
            store,
            kind,
            generation,
            lane,
            key: None,
            ns: 0,
        }
    }

    fn apply(&mut self, env: &Env, op: &Op) -> Out {
        let s = &self.store;
        match op {
            Op::SetKey(k) => {
                s.set_current_key(&[*k]).unwrap();
                self.key = Some(*k);
                Out::None
            }
            Op::SetNs(n) => {
                s.set_current_namespace(&[*n]);
                self.ns = *n;
                Out::None
            }
            Op::Advance(_) => Out::None,
            Op::SnapshotRestore => {
                let dir = env.path(&format!(
                    "chk-{:?}-{}-{}",
                    self.kind, self.generation, self.lane
                ));
                let r = s.snapshot(self.generation as u64, &dir).unwrap();
                // Every other restore switches backend, so snapshots are
                // also read across backends (rocksdb checkpoint -> heap and
                // canonical -> rocksdb), and the rest take the same-backend path.
                let kind = match (self.generation % 2, self.kind) {
                    (0, BackendKind::Hashmap) => BackendKind::Rocksdb,
                    (0, BackendKind::Rocksdb) => BackendKind::Hashmap,
                    (_, k) => k,
                };
                let mut fresh = Real::new(env, kind, self.generation + 1, self.lane);
                fresh.store.restore(&[(dir, r)]).unwrap();
                if let Some(k) = self.key {
                    fresh.store.set_current_key(&[k]).unwrap();
                }
                fresh.store.set_current_namespace(&[self.ns]);
                fresh.key = self.key;
                fresh.ns = self.ns;
                *self = fresh;
                Out::None
            }
            _ if self.key.is_none()
                && !matches!(op, Op::TimerPop(_) | Op::OperatorAdd(_) | Op::OperatorGet) =>
            {
                Out::None
            }
            Op::ValueUpdate(x) => {
                self.v.update(x).unwrap();
                Out::None
            }
            Op::ValueGet => Out::Value(self.v.value().unwrap()),
            Op::ValueClear => {
                self.v.clear().unwrap();
                Out::None
            }
            Op::ListAdd(x) => {
                self.l.add(x).unwrap();
                Out::None
            }
            Op::ListAddAll(xs) => {
                self.l.add_all(xs).unwrap();
                Out::None
            }
            Op::ListUpdate(xs) => {
                self.l.update(xs).unwrap();
                Out::None
            }
            Op::ListGet => Out::List(self.l.get().unwrap()),
            Op::ListClear => {
                self.l.clear().unwrap();
                Out::None
            }
            Op::MapPut(k, v) => {
                self.m.put(k, v).unwrap();
                Out::None
            }
            Op::MapRemove(k) => {
                self.m.remove(k).unwrap();
                Out::None
            }
            Op::MapGet(k) => Out::Value(self.m.get(k).unwrap()),
            Op::MapContains(k) => Out::Bool(self.m.contains(k).unwrap()),
            Op::MapEntries => {
                let mut e = self.m.entries().unwrap();
                e.sort();
                Out::Entries(e)
            }
            Op::MapIsEmpty => Out::Bool(self.m.is_empty().unwrap()),
            Op::MapClear => {
                self.m.clear().unwrap();
                Out::None
            }
            Op::ReduceAdd(x) => {
                self.r.add(&(*x as u64)).unwrap();
                Out::None
            }
            Op::ReduceGet => Out::Sum(self.r.get().unwrap()),
            Op::AggAdd(x) => {
                self.a.add(*x).unwrap();
                Out::None
            }
            Op::AggGet => Out::Agg(self.a.get().unwrap()),
            Op::TimerRegister(t) => {
                s.register_event_time_timer(*t as u64).unwrap();
                Out::None
            }
            Op::TimerDelete(t) => {
                s.delete_event_time_timer(*t as u64).unwrap();
                Out::None
            }
            Op::TimerPop(t) => Out::Timers(
                s.pop_due_timers(TimeDomain::EventTime, *t as u64)
                    .unwrap()
                    .into_iter()
                    .map(|t| (t.timestamp, t.key, t.namespace))
                    .collect(),
            ),
            Op::OperatorAdd(x) => {
                s.operator_list_state::<u8>("op").unwrap().add(x).unwrap();
                Out::None
            }
            Op::OperatorGet => Out::List(s.operator_list_state::<u8>("op").unwrap().get().unwrap()),
        }
    }
}

/// The reference model: plain maps, Flink's TTL rules written out directly.
#[derive(Default)]
struct Model {
    now: u64,
    key: Option<u8>,
    ns: u8,
    v: HashMap<(u8, u8), (u8, u64)>,
    l: HashMap<(u8, u8), Vec<(u8, u64)>>,
    m: HashMap<(u8, u8), BTreeMap<u8, (u8, u64)>>,
    r: HashMap<(u8, u8), u64>,
    a: HashMap<(u8, u8), (u64, u64)>,
    timers: BTreeSet<(u64, Vec<u8>, Vec<u8>)>,
    op: Vec<u8>,
}

fn expired(ts: u64, ttl: u64, now: u64) -> bool {
    ts + ttl <= now
}

impl Model {
    fn apply(&mut self, op: &Op) -> Out {
        let now = self.now;
        if let Op::Advance(ms) = op {
            self.now += ms;
            return Out::None;
        }
        match op {
            Op::SetKey(k) => {
                self.key = Some(*k);
                return Out::None;
            }
            Op::SetNs(n) => {
                self.ns = *n;
                return Out::None;
            }
            Op::SnapshotRestore => return Out::None,
            Op::TimerPop(t) => {
                let due: Vec<_> = self
                    .timers
                    .iter()
                    .filter(|x| x.0 <= *t as u64)
                    .cloned()
                    .collect();
                for d in &due {
                    self.timers.remove(d);
                }
                return Out::Timers(due);
            }
            Op::OperatorAdd(x) => {
                self.op.push(*x);
                return Out::None;
            }
            Op::OperatorGet => return Out::List(self.op.clone()),
            _ => {}
        }
        let Some(key) = self.key else {
            return Out::None;
        };
        let kn = (key, self.ns);
        match op {
            Op::ValueUpdate(x) => {
                self.v.insert(kn, (*x, now));
                Out::None
            }
            Op::ValueGet => Out::Value(match self.v.get_mut(&kn) {
                Some((_, ts)) if expired(*ts, VTTL, now) => {
                    self.v.remove(&kn);
                    None
                }
                Some((x, ts)) => {
                    *ts = now; // OnReadAndWrite
                    Some(*x)
                }
                None => None,
            }),
            Op::ValueClear => {
                self.v.remove(&kn);
                Out::None
            }
            Op::ListAdd(x) => {
                self.l.entry(kn).or_default().push((*x, now));
                Out::None
            }
            Op::ListAddAll(xs) => {
                self.l
                    .entry(kn)
                    .or_default()
                    .extend(xs.iter().map(|x| (*x, now)));
                Out::None
            }
            Op::ListUpdate(xs) => {
                self.l.insert(kn, xs.iter().map(|x| (*x, now)).collect());
                Out::None
            }
            Op::ListGet => {
                let l = self.l.entry(kn).or_default();
                l.retain(|(_, ts)| !expired(*ts, LTTL, now));
                Out::List(l.iter().map(|x| x.0).collect())
            }
            Op::ListClear => {
                self.l.remove(&kn);
                Out::None
            }
            Op::MapPut(k, v) => {
                self.m.entry(kn).or_default().insert(*k, (*v, now));
                Out::None
            }
            Op::MapRemove(k) => {
                self.m.entry(kn).or_default().remove(k);
                Out::None
            }
            Op::MapGet(k) | Op::MapContains(k) => {
                let m = self.m.entry(kn).or_default();
                if m.get(k).is_some_and(|e| expired(e.1, MTTL, now)) {
                    m.remove(k);
                }
                let got = m.get(k).map(|e| e.0);
                if matches!(op, Op::MapGet(_)) {
                    Out::Value(got)
                } else {
                    Out::Bool(got.is_some())
                }
            }
            Op::MapEntries | Op::MapIsEmpty => {
                let m = self.m.entry(kn).or_default();
                m.retain(|_, e| !expired(e.1, MTTL, now));
                if matches!(op, Op::MapEntries) {
                    Out::Entries(m.iter().map(|(k, e)| (*k, e.0)).collect())
                } else {
                    Out::Bool(m.is_empty())
                }
            }
            Op::MapClear => {
                self.m.remove(&kn);
                Out::None
            }
            Op::ReduceAdd(x) => {
                *self.r.entry(kn).or_default() += *x as u64;
                Out::None
            }
            Op::ReduceGet => Out::Sum(self.r.get(&kn).copied()),
            Op::AggAdd(x) => {
                let a = self.a.entry(kn).or_default();
                a.0 += *x as u64;
                a.1 += 1;
                Out::None
            }
            Op::AggGet => Out::Agg(self.a.get(&kn).copied()),
            Op::TimerRegister(t) => {
                self.timers.insert((*t as u64, vec![key], vec![self.ns]));
                Out::None
            }
            Op::TimerDelete(t) => {
                self.timers.remove(&(*t as u64, vec![key], vec![self.ns]));
                Out::None
            }
            _ => Out::None,
        }
    }
}

proptest! {
    #![proptest_config(ProptestConfig { cases: 48, failure_persistence: None, ..ProptestConfig::default() })]

    #[test]
    fn both_backends_match_the_reference_model_across_snapshots_in_every_cache_mode(ops in proptest::collection::vec(op(), 1..120)) {
        for mode in CacheMode::ALL {
            let _mode = CacheGuard::set(mode);
            let env = Env::new();
            let mut model = Model { now: 1_000_000, ..Model::default() };
            env.clock.set(model.now);
            let mut heap = Real::new(&env, BackendKind::Hashmap, 0, 0);
            let mut rocks = Real::new(&env, BackendKind::Rocksdb, 0, 1);
            for (i, op) in ops.iter().enumerate() {
                let want = model.apply(op);
                env.clock.set(model.now);
                let got_heap = heap.apply(&env, op);
                let got_rocks = rocks.apply(&env, op);
                prop_assert_eq!(&got_heap, &want, "cache {:?}, lane started on hashmap (now {:?}), step {} {:?}", mode, heap.kind, i, op);
                prop_assert_eq!(&got_rocks, &want, "cache {:?}, lane started on rocksdb (now {:?}), step {} {:?}", mode, rocks.kind, i, op);
            }
        }
    }
}
