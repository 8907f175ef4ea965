//! Un-grouped tumbling and sliding windows share one stored value and one timer per key
//! and window end (`rules.window.combined`): the same outputs as a value and a timer per
//! rule, versions kept apart, and windows written in the per-rule form before it still
//! close once, with everything they counted.

use streamstate_state::ValueStateDescriptor;

use super::*;
use crate::rules::aggregate::Acc;
use crate::rules::window::{self, namespace};
use crate::rules::windowed::{self, Windows};

/// The key's value of windows ending at `end`, read straight from the store.
fn stored(h: &H, key: &str, end: i64) -> Option<Windows> {
    let store = h.d.store();
    store.set_current_key(key.as_bytes()).expect("key");
    store.set_current_namespace(&windowed::namespace_of(end));
    let state = store
        .value_state(&ValueStateDescriptor::<Windows>::new(
            "rules.window.combined",
        ))
        .expect("state");
    state.value().expect("value")
}

fn tumbling(id: &str, version: u64, func: &str) -> Value {
    let mut a = json!({"fn": func, "window": {"type": "tumbling", "size": "10s"}});
    if func != "count" {
        a["field"] = json!("/amount");
    }
    agg(id, version, a)
}

/// `(rule_id, value)` of each output, in order.
fn by_rule(out: &[Value]) -> Vec<(Value, Value)> {
    out.iter()
        .map(|o| (o["rule_id"].clone(), o["value"].clone()))
        .collect()
}

#[test]
fn a_keys_window_rules_share_one_value_and_one_timer_and_close_in_rule_order() {
    let mut h = event_time();
    for (id, f) in [
        ("w-sum", "sum"),
        ("w-count", "count"),
        ("w-max", "max"),
        ("w-min", "min"),
    ] {
        h.rule(tumbling(id, 1, f));
    }
    for (ts, amount) in [(10_000, 3.0), (12_000, -1.0), (19_000, 5.0)] {
        assert!(h.ev("k", json!({"amount": amount}), Some(ts)).is_empty());
    }
    assert_eq!(
        h.d.store().timer_count(TimeDomain::EventTime),
        1,
        "one timer for the four rules' window [10000, 20000)"
    );
    let value = stored(&h, "k", 20_000).expect("one combined value");
    let mut entries: Vec<(&str, i64, u64)> = value
        .entries
        .iter()
        .map(|e| (e.rule.as_str(), e.start, e.acc.count))
        .collect();
    entries.sort();
    assert_eq!(
        entries,
        vec![
            ("w-count", 10_000, 3),
            ("w-max", 10_000, 3),
            ("w-min", 10_000, 3),
            ("w-sum", 10_000, 3)
        ]
    );
    h.ev("k", json!({"amount": 100.0}), Some(20_000)); // watermark 20000: [10000, 20000) closes
    let out = h.fire();
    assert_eq!(
        by_rule(&out),
        vec![
            (json!("w-count"), json!(3)),
            (json!("w-max"), json!(5.0)),
            (json!("w-min"), json!(-1.0)),
            (json!("w-sum"), json!(7.0)),
        ],
        "3 - 1 + 5; one output per rule, in rule-id order"
    );
    assert!(
        out.iter()
            .all(|o| o["window"] == json!({"start": 10_000, "end": 20_000}))
    );
    assert_eq!(stored(&h, "k", 20_000), None, "removed when it closes");
    assert_eq!(
        h.d.store().timer_count(TimeDomain::EventTime),
        1,
        "only the next window's timer is left"
    );
}

#[test]
fn sliding_windows_ending_apart_keep_apart_and_each_closes_once() {
    let mut h = event_time();
    h.rule(agg(
        "c",
        1,
        json!({"fn": "count", "window": {"type": "sliding", "size": "10s", "slide": "5s"}}),
    ));
    h.ev("k", json!({}), Some(7_000)); // in [0, 10000) and [5000, 15000)
    h.ev("k", json!({}), Some(11_000)); // in [5000, 15000) and [10000, 20000)
    for (end, count) in [(10_000, 1), (15_000, 2), (20_000, 1)] {
        let value = stored(&h, "k", end).expect("a value per window end");
        assert_eq!(value.entries.len(), 1);
        assert_eq!(value.entries[0].acc.count, count, "window ending at {end}");
    }
    h.ev("k", json!({}), Some(30_000));
    let out = h.fire();
    let windows: Vec<(Value, Value)> = out
        .iter()
        .map(|o| (o["window"]["end"].clone(), o["value"].clone()))
        .collect();
    assert_eq!(
        windows,
        vec![
            (json!(10_000), json!(1)),
            (json!(15_000), json!(2)),
            (json!(20_000), json!(1)),
        ],
        "watermark 30000 closes every window ending by 30001; [15000, 25000) never opened"
    );
}

#[test]
fn a_replaced_rules_window_entry_is_dropped_and_its_close_emits_nothing() {
    let mut h = event_time();
    h.rule(tumbling("a", 1, "count"));
    h.rule(tumbling("b", 1, "count"));
    h.ev("k", json!({}), Some(1_000));
    h.ev("k", json!({}), Some(2_000));
    h.rule(tumbling("a", 2, "count"));
    h.delete("b", 2);
    h.ev("k", json!({}), Some(3_000));
    let value = stored(&h, "k", 10_000).expect("value");
    let rules: Vec<(&str, u64, u64)> = value
        .entries
        .iter()
        .map(|e| (e.rule.as_str(), e.version, e.acc.count))
        .collect();
    assert_eq!(
        rules,
        vec![("a", 2, 1)],
        "a v1 and b left at the next write"
    );
    h.ev("k", json!({}), Some(10_000));
    let out = h.fire();
    assert_eq!(by_rule(&out), vec![(json!("a"), json!(1))]);
    assert_eq!(out[0]["rule_version"], json!(2));
}

/// A checkpoint written before the combined value: window accumulators per rule
/// namespace in `rules.window.acc`, each with its own timer. One window gets another
/// event after the restore and moves into the combined value (its old timer deleted);
/// the other is only closed by its old timer. Each closes once, with all it counted.
fn upgrade_closes_per_rule_windows_once(backend: BackendKind) {
    let mut h = harness(backend, true, 0, None);
    h.rule(tumbling("c", 1, "count"));
    let store = h.d.store().clone();
    let legacy = store
        .value_state(&ValueStateDescriptor::<Acc>::new("rules.window.acc"))
        .expect("legacy state");
    for (key, count) in [("moved", 2), ("left", 5)] {
        store.set_current_key(key.as_bytes()).expect("key");
        store.set_current_namespace(&namespace("c", 1, window::WINDOW, Some(0)));
        legacy
            .update(&Acc {
                count,
                ..Acc::default()
            })
            .expect("write");
        store.register_event_time_timer(9_999).expect("old timer");
    }
    let dir: PathBuf = h.dir.path().join("chk-old");
    let snap = h.d.snapshot(1, &dir).expect("snapshot");
    h.d.reset(Some((dir, snap))).expect("restore");
    assert!(h.ev("moved", json!({}), Some(4_000)).is_empty());
    assert_eq!(
        stored(&h, "moved", 10_000).map(|v| v.entries[0].acc.count),
        Some(3),
        "2 before the upgrade + 1"
    );
    assert_eq!(
        h.d.store().timer_count(TimeDomain::EventTime),
        2,
        "moved: the old timer gave way to the combined one; left: its old timer"
    );
    h.ev("other", json!({}), Some(10_000));
    let mut closed: Vec<(Value, Value)> = h
        .fire()
        .iter()
        .map(|o| (o["key"].clone(), o["value"].clone()))
        .collect();
    closed.sort_by_key(|(k, _)| k.to_string());
    assert_eq!(
        closed,
        vec![(json!("left"), json!(5)), (json!("moved"), json!(3))]
    );
    assert!(
        !store.state_has_entries("rules.window.acc").expect("scan"),
        "nothing left in the old state"
    );
}

#[test]
fn upgrade_closes_per_rule_windows_once_on_hashmap() {
    upgrade_closes_per_rule_windows_once(BackendKind::Hashmap);
}

#[test]
fn upgrade_closes_per_rule_windows_once_on_rocksdb() {
    upgrade_closes_per_rule_windows_once(BackendKind::Rocksdb);
}
