//! Tools on a synthetic snapshot with every kind of state (value, list with TTL, map,
//! reducing in a namespace), timers, operator and broadcast state. The real-checkpoint
//! tests are in integration-tests/checkpoint_tools.rs.

use std::path::Path;
use std::sync::Arc;
use std::time::Duration;

use streamstate_state::offline::{Entry, RawSnapshot};
use streamstate_state::*;

use super::check_restore::{Verdict, check};
use super::decoders::Registry;
use super::export::{Line, entry_lines, write};
use super::import::parse;
use super::surgery::{Op, apply};
use super::{Origin, savepoint_out};
use crate::checkpoint::PartitionOffset;

const KEYS: u64 = 300;

fn origin() -> Origin {
    Origin {
        source: "chk-7-00000001".into(),
        app_id: "app".into(),
        instance: 0,
        created_at_ms: 1,
        offsets: vec![PartitionOffset {
            topic: "in".into(),
            partition: 0,
            offset: 42,
        }],
        control_offsets: vec![],
    }
}

struct Handles {
    count: ValueState<u64>,
    events: ListState<String>,
    totals: MapState<String, i64>,
    max: ReducingState<u64>,
}

fn handles(store: &StateStore) -> Handles {
    Handles {
        count: store
            .value_state(&ValueStateDescriptor::<u64>::new("count"))
            .unwrap(),
        events: store
            .list_state(
                &ListStateDescriptor::<String>::new("events")
                    .with_ttl(TtlConfig::new(Duration::from_secs(3600))),
            )
            .unwrap(),
        totals: store
            .map_state(&MapStateDescriptor::<String, i64>::new("totals"))
            .unwrap(),
        max: store
            .reducing_state(&ReducingStateDescriptor::<u64>::new(
                "max",
                |a: &u64, b: &u64| *a.max(b),
            ))
            .unwrap(),
    }
}

/// Writes a rocksdb snapshot with every kind of state; returns its directory and result.
fn snapshot(dir: &Path, backend: BackendKind) -> (std::path::PathBuf, SnapshotResult) {
    let clock = ManualClock::new(1_000_000);
    let store = StateStore::open_with_clock(
        StoreConfig::new(backend, dir.join("live"), 128),
        Arc::new(clock),
    )
    .unwrap();
    let h = handles(&store);
    for i in 0..KEYS {
        store
            .set_current_key(format!("user-{i}").as_bytes())
            .unwrap();
        h.count.update(&i).unwrap();
        if i % 2 == 0 {
            h.events.add(&format!("a{i}")).unwrap();
            h.events.add(&"b".to_string()).unwrap();
        }
        h.totals.put(&"x".to_string(), &(i as i64)).unwrap();
        h.totals.put(&"y".to_string(), &-(i as i64)).unwrap();
        store.set_current_namespace(b"w1");
        h.max.add(&i).unwrap();
        h.max.add(&3).unwrap();
        store.set_current_namespace(b"");
        if i % 10 == 0 {
            store.register_event_time_timer(5_000 + i).unwrap();
        }
    }
    store
        .operator_list_state::<i64>("offsets")
        .unwrap()
        .update(&[1, 2, 3])
        .unwrap();
    let d = MapStateDescriptor::<String, String>::new("rules");
    store
        .broadcast_state(&d)
        .put(&"r1".into(), &"body".into())
        .unwrap();
    let out = dir.join("snap");
    let r = store.snapshot(7, &out).unwrap();
    (out, r)
}

/// One key's states as a job reads them: (key index, count, events, totals, max in `w1`).
type KeyView = (
    u64,
    Option<u64>,
    Vec<String>,
    Vec<(String, i64)>,
    Option<u64>,
);

/// Per-key typed view of a restored store: what a job would read.
fn view(store: &StateStore) -> Vec<KeyView> {
    let h = handles(store);
    let range = store.key_group_range();
    let mut out = Vec::new();
    for i in 0..KEYS {
        let key = format!("user-{i}");
        if !range.contains(store.key_group_of(key.as_bytes())) {
            continue;
        }
        store.set_current_key(key.as_bytes()).unwrap();
        store.set_current_namespace(b"w1");
        let max = h.max.get().unwrap();
        store.set_current_namespace(b"");
        out.push((
            i,
            h.count.value().unwrap(),
            h.events.get().unwrap(),
            h.totals.entries().unwrap(),
            max,
        ));
    }
    out
}

fn restore_savepoint(dir: &Path, work: &Path, config: StoreConfig) -> StateStore {
    let _ = work;
    let store = StateStore::open_with_clock(config, Arc::new(ManualClock::new(1_000_000))).unwrap();
    store.restore_savepoint(&[dir.to_path_buf()]).unwrap();
    store
}

fn export_lines(raw: &RawSnapshot) -> Vec<Line> {
    entry_lines(raw, &Registry::default()).unwrap()
}

#[test]
fn export_import_round_trip_is_byte_identical_for_every_kind() {
    for backend in [BackendKind::Rocksdb, BackendKind::Hashmap] {
        let dir = tempfile::tempdir().unwrap();
        let (snap, result) = snapshot(dir.path(), backend);
        let raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();
        let mut jsonl = Vec::new();
        write(&raw, &origin(), &Registry::default(), &mut jsonl).unwrap();
        let (imported, o) = parse(std::io::Cursor::new(&jsonl), &Registry::default()).unwrap();
        assert_eq!(o, origin());
        assert_eq!(
            imported.entries, raw.entries,
            "{backend:?}: same storage bytes"
        );
        let sp = dir.path().join("sp");
        savepoint_out::write(&imported, &o, "import", &sp).unwrap();
        let (o2, state) = savepoint_out::read(&sp).unwrap();
        assert_eq!(
            o2.offsets,
            origin().offsets,
            "offsets travel with the savepoint"
        );
        let back = RawSnapshot::read(&sp, &state, &dir.path().join("logs2")).unwrap();
        assert_eq!(export_lines(&back), export_lines(&raw));
        assert_eq!(back.part.states, raw.part.states);
        assert_eq!(back.part.operator_lists, raw.part.operator_lists);
        assert_eq!(back.part.broadcast, raw.part.broadcast);
        // Restored, the savepoint reads exactly like the source.
        let a = StateStore::open_with_clock(
            StoreConfig::new(BackendKind::Rocksdb, dir.path().join("a"), 128),
            Arc::new(ManualClock::new(1_000_000)),
        )
        .unwrap();
        a.restore(&[(snap.clone(), result.clone())]).unwrap();
        let b = restore_savepoint(
            &sp,
            &dir.path().join("b"),
            StoreConfig::new(BackendKind::Hashmap, dir.path().join("b"), 128),
        );
        assert!(
            view(&a) == view(&b),
            "{backend:?}: restored savepoint reads like the source"
        );
        assert_eq!(
            b.pop_due_timers(TimeDomain::EventTime, u64::MAX)
                .unwrap()
                .len(),
            (KEYS as usize).div_ceil(10)
        );
    }
}

#[test]
fn rekey_128_to_256_restores_identically_on_two_instances() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, result) = snapshot(dir.path(), BackendKind::Rocksdb);
    let mut raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();
    apply(
        &mut raw,
        &Op::Rekey {
            max_parallelism: 256,
            aligned_partitions: None,
        },
    )
    .unwrap();
    let sp = dir.path().join("sp");
    savepoint_out::write(&raw, &origin(), "rekey", &sp).unwrap();
    let source = StateStore::open_with_clock(
        StoreConfig::new(BackendKind::Rocksdb, dir.path().join("src"), 128),
        Arc::new(ManualClock::new(1_000_000)),
    )
    .unwrap();
    source.restore(&[(snap, result)]).unwrap();
    let mut expected = view(&source);
    let mut got = Vec::new();
    for i in 0..2 {
        let config = StoreConfig::new(BackendKind::Rocksdb, dir.path().join(format!("i{i}")), 256)
            .for_instance(i, 2);
        let store = restore_savepoint(&sp, &dir.path().join(format!("i{i}")), config);
        got.extend(view(&store));
    }
    expected.sort();
    got.sort();
    assert_eq!(got.len(), KEYS as usize);
    assert!(got == expected, "per-key state differs after rekey");
    assert!(got.iter().any(|g| !g.2.is_empty()), "TTL'd lists survive");
}

#[test]
fn delete_key_removes_it_from_every_state_and_nothing_else() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, result) = snapshot(dir.path(), BackendKind::Rocksdb);
    let raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();
    let mut changed = raw.clone();
    let report = apply(
        &mut changed,
        &Op::DeleteKey {
            key: "user-20".into(),
            hex: false,
        },
    )
    .unwrap();
    // count 1, events 1, totals 2 (x, y), max 1 in namespace w1, one timer.
    assert_eq!(report["total_removed"], 6, "{report}");
    assert_eq!(report["timers_removed"], 1);
    let removed: Vec<_> = report["removed"]
        .as_array()
        .unwrap()
        .iter()
        .map(|r| {
            (
                r["state"].as_str().unwrap().to_string(),
                r["entries"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(
        removed,
        vec![
            ("count".into(), 1),
            ("events".into(), 1),
            ("max".into(), 1),
            ("totals".into(), 2)
        ]
    );
    let before: Vec<Entry> = raw.decoded().unwrap();
    let after: Vec<Entry> = changed.decoded().unwrap();
    let kept: Vec<&Entry> = before.iter().filter(|e| e.key() != b"user-20").collect();
    assert_eq!(
        after.iter().collect::<Vec<_>>(),
        kept,
        "everything else is untouched"
    );
    assert_eq!(changed.part.operator_lists, raw.part.operator_lists);
}

#[test]
fn drop_rename_and_add_ttl_write_what_they_say() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, result) = snapshot(dir.path(), BackendKind::Hashmap);
    let raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();

    let mut dropped = raw.clone();
    let r = apply(
        &mut dropped,
        &Op::DropState {
            name: "totals".into(),
        },
    )
    .unwrap();
    assert_eq!(r["entries_removed"], 2 * KEYS);
    assert!(dropped.state("totals").is_none());
    assert_eq!(dropped.entries.len(), raw.entries.len() - 2 * KEYS as usize);

    let mut renamed = raw.clone();
    apply(
        &mut renamed,
        &Op::RenameState {
            from: "count".into(),
            to: "n".into(),
        },
    )
    .unwrap();
    assert_eq!(
        renamed.entries, raw.entries,
        "a rename changes no stored byte (ids stay)"
    );
    assert!(renamed.state("n").is_some() && renamed.state("count").is_none());
    assert!(
        apply(
            &mut renamed.clone(),
            &Op::RenameState {
                from: "n".into(),
                to: "events".into()
            }
        )
        .is_err()
    );

    let mut ttl = raw.clone();
    apply(
        &mut ttl,
        &Op::AddTtl {
            name: "count".into(),
            ttl: "1h".parse().unwrap(),
            last_access_ms: Some(2_000_000),
        },
    )
    .unwrap();
    let sp = dir.path().join("sp");
    savepoint_out::write(&ttl, &origin(), "add-ttl", &sp).unwrap();
    let clock = ManualClock::new(2_000_000);
    let store = StateStore::open_with_clock(
        StoreConfig::new(BackendKind::Hashmap, dir.path().join("t"), 128),
        Arc::new(clock.clone()),
    )
    .unwrap();
    store.restore_savepoint(&[sp]).unwrap();
    let count = store
        .value_state(
            &ValueStateDescriptor::<u64>::new("count")
                .with_ttl(TtlConfig::new(Duration::from_secs(3600))),
        )
        .unwrap();
    store.set_current_key(b"user-5").unwrap();
    assert_eq!(count.value().unwrap(), Some(5));
    clock.set(2_000_000 + 3_600_000);
    assert_eq!(
        count.value().unwrap(),
        None,
        "expires one TTL after the given last access"
    );
    assert!(
        apply(
            &mut ttl,
            &Op::AddTtl {
                name: "count".into(),
                ttl: "1h".parse().unwrap(),
                last_access_ms: None
            }
        )
        .is_err(),
        "already has TTL"
    );
}

#[test]
fn a_savepoint_is_always_written_new() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, result) = snapshot(dir.path(), BackendKind::Hashmap);
    let raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();
    let sp = dir.path().join("sp");
    savepoint_out::write(&raw, &origin(), "copy", &sp).unwrap();
    let err = savepoint_out::write(&raw, &origin(), "copy", &sp)
        .unwrap_err()
        .to_string();
    assert!(err.contains("not empty"), "{err}");
}

#[test]
fn import_encodes_typed_values_with_the_jobs_codec() {
    let dir = tempfile::tempdir().unwrap();
    let (snap, result) = snapshot(dir.path(), BackendKind::Hashmap);
    let raw = RawSnapshot::read(&snap, &result, &dir.path().join("logs")).unwrap();
    let codecs = super::decoders::for_function(crate::config::FunctionKind::Count);
    let mut jsonl = Vec::new();
    write(&raw, &origin(), &codecs, &mut jsonl).unwrap();
    let text = String::from_utf8(jsonl).unwrap();
    let line = text
        .lines()
        .find(|l| l.contains(r#""key":"user-7""#) && l.contains(r#""state":"count""#))
        .unwrap();
    assert!(line.contains(r#""value":7"#), "{line}");
    // Hand-edited: typed value only, no hex.
    let edited: String = text
        .lines()
        .map(|l| {
            if l == line {
                l.replace(r#""value_hex":"07","#, "")
                    .replace(r#""value":7"#, r#""value":70"#)
            } else {
                l.to_string()
            }
        })
        .collect::<Vec<_>>()
        .join("\n");
    let (imported, _) = parse(std::io::Cursor::new(edited), &codecs).unwrap();
    let changed: Vec<_> = imported
        .entries
        .iter()
        .filter(|(k, v)| raw.entries.get(*k) != Some(*v))
        .collect();
    assert_eq!(changed.len(), 1);
    assert_eq!(changed[0].1, &postcard::to_allocvec(&70u64).unwrap());
}

fn metas() -> (Vec<StateMeta>, Vec<StateDeclaration>) {
    let dir = tempfile::tempdir().unwrap();
    let (snap, _) = snapshot(dir.path(), BackendKind::Hashmap);
    let meta = RawSnapshot::read_meta(&snap).unwrap();
    let declared = vec![
        ValueStateDescriptor::<u64>::new("count").declaration(),
        ListStateDescriptor::<String>::new("events")
            .with_ttl(TtlConfig::new(Duration::from_secs(3600)))
            .declaration(),
        MapStateDescriptor::<String, i64>::new("totals").declaration(),
        ReducingStateDescriptor::<u64>::new("max", |a: &u64, b: &u64| *a.max(b)).declaration(),
    ];
    (meta.part.states, declared)
}

fn verdicts(lines: &[super::check_restore::Line]) -> Vec<(String, Verdict)> {
    lines.iter().map(|l| (l.name.clone(), l.verdict)).collect()
}

#[test]
fn check_restore_rules() {
    let (snap, declared) = metas();
    let ok = |l: &[super::check_restore::Line]| l.iter().all(|l| l.verdict != Verdict::Fail);
    // Unchanged.
    let l = check(&snap, 128, &declared, None, false);
    assert!(
        ok(&l) && l.iter().skip(1).all(|l| l.verdict == Verdict::Keep),
        "{l:?}"
    );
    // Removed state: refused unless allowed.
    let fewer: Vec<_> = declared
        .iter()
        .filter(|d| d.name != "totals")
        .cloned()
        .collect();
    let l = check(&snap, 128, &fewer, None, false);
    assert!(
        !ok(&l) && verdicts(&l).contains(&("totals".into(), Verdict::Fail)),
        "{l:?}"
    );
    assert!(
        verdicts(&check(&snap, 128, &fewer, None, true))
            .contains(&("totals".into(), Verdict::Drop))
    );
    // New state.
    let mut more = declared.clone();
    more.push(ValueStateDescriptor::<String>::new("last").declaration());
    let l = check(&snap, 128, &more, None, false);
    assert!(ok(&l) && verdicts(&l).contains(&("last".into(), Verdict::New)));
    // Incompatible type change.
    let mut changed = declared.clone();
    changed[0] = ValueStateDescriptor::<String>::new("count").declaration();
    let l = check(&snap, 128, &changed, None, false);
    let bad = l.iter().find(|l| l.verdict == Verdict::Fail).unwrap();
    assert_eq!(bad.name, "count");
    assert!(
        bad.reason.contains("u64") && bad.reason.contains("String"),
        "{}",
        bad.reason
    );
    // Version bump without migration, with migration.
    changed[0] = ValueStateDescriptor::<u64>::new("count")
        .with_schema_version(2)
        .declaration();
    assert!(!ok(&check(&snap, 128, &changed, None, false)));
    changed[0] = ValueStateDescriptor::<u64>::new("count")
        .with_schema_version(2)
        .with_migration(1, |b| Ok(b.to_vec()))
        .declaration();
    assert!(
        verdicts(&check(&snap, 128, &changed, None, false))
            .contains(&("count".into(), Verdict::Migrate))
    );
    // TTL on/off, kind change, key groups.
    changed[0] = ValueStateDescriptor::<u64>::new("count")
        .with_ttl(TtlConfig::new(Duration::from_secs(1)))
        .declaration();
    assert!(!ok(&check(&snap, 128, &changed, None, false)));
    changed[0] = ListStateDescriptor::<u64>::new("count").declaration();
    assert!(!ok(&check(&snap, 128, &changed, None, false)));
    assert!(!ok(&check(&snap, 128, &declared, Some(256), false)));
    assert!(ok(&check(&snap, 128, &declared, Some(128), false)));
}

#[test]
fn count_declares_exactly_what_it_registers() {
    use crate::function::{OpenContext, ProcessFunction};
    let dir = tempfile::tempdir().unwrap();
    let store = StateStore::open(StoreConfig::new(
        BackendKind::Hashmap,
        dir.path().join("s"),
        4,
    ))
    .unwrap();
    crate::functions::Count::default()
        .open(&OpenContext::new(&store))
        .unwrap();
    store.snapshot(1, &dir.path().join("snap")).unwrap();
    let meta = RawSnapshot::read_meta(&dir.path().join("snap")).unwrap();
    let declared = crate::functions::Count::declared_states();
    let lines = check(&meta.part.states, 4, &declared, None, false);
    assert!(
        lines.iter().all(|l| matches!(l.verdict, Verdict::Keep)),
        "{lines:?}"
    );
    assert_eq!(meta.part.states.len(), declared.len());
}

#[test]
fn the_rule_engine_declares_exactly_what_it_registers() {
    use crate::function::{OpenContext, ProcessFunction};
    for state_ttl in [None, Some(std::time::Duration::from_secs(60))] {
        let dir = tempfile::tempdir().unwrap();
        let store = StateStore::open(StoreConfig::new(
            BackendKind::Hashmap,
            dir.path().join("s"),
            4,
        ))
        .unwrap();
        let registry = prometheus::Registry::new();
        let options = crate::rules::EngineOptions {
            event_time: false,
            state_ttl,
        };
        crate::rules::RuleEngine::with_options(options, &registry)
            .open(&OpenContext::new(&store))
            .unwrap();
        store.snapshot(1, &dir.path().join("snap")).unwrap();
        let meta = RawSnapshot::read_meta(&dir.path().join("snap")).unwrap();
        let declared = crate::rules::RuleEngine::declared_states(state_ttl);
        let keyed: Vec<_> = meta
            .part
            .states
            .iter()
            .filter(|s| s.name.starts_with("rules."))
            .cloned()
            .collect();
        let lines = check(&keyed, 4, &declared, None, false);
        assert!(
            lines.iter().all(|l| matches!(l.verdict, Verdict::Keep)),
            "{lines:?}"
        );
        assert_eq!(keyed.len(), declared.len());
    }
}
