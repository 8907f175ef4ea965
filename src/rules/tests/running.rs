//! Running aggregates share one stored value per key (`rules.running`): the same
//! outputs as a value per rule, one write per event, per-rule TTL and versions, and
//! state written in the per-rule form before it still counts after an upgrade.

use streamstate_state::ValueStateDescriptor;

use super::*;
use crate::rules::aggregate::Acc;
use crate::rules::running::Running;
use crate::rules::window::{self, namespace};

/// The key's combined running value, read straight from the store.
fn stored(h: &H, key: &str) -> Option<Running> {
    let store = h.d.store();
    store.set_current_key(key.as_bytes()).expect("key");
    store.set_current_namespace(b"");
    let state = store
        .value_state(&ValueStateDescriptor::<Running>::new("rules.running"))
        .expect("state");
    state.value().expect("value")
}

fn sum_of(kind: &str) -> Value {
    json!({"id": format!("sum-{kind}"), "version": 1, "kind": "aggregate",
           "filter": {"field": "/type", "eq": kind},
           "aggregate": {"fn": "sum", "field": "/amount", "emit": "every_event"}})
}

#[test]
fn every_running_rule_of_a_key_lives_in_one_value() {
    let mut h = proc_time();
    h.rule(agg("count", 1, json!({"fn": "count"})));
    h.rule(sum_of("view"));
    h.rule(sum_of("cart"));
    let mut last = Vec::new();
    for (kind, amount) in [("view", 1.5), ("cart", 2.0), ("view", 3.0)] {
        last = h.ev("k", json!({"type": kind, "amount": amount}), None);
    }
    // count 3; sum-view 1.5 + 3 over 2 events; sum-cart untouched by the last event.
    let by_rule: Vec<(Value, Value, Value)> = last
        .iter()
        .map(|o| (o["rule_id"].clone(), o["value"].clone(), o["count"].clone()))
        .collect();
    assert_eq!(
        by_rule,
        vec![
            (json!("count"), json!(3), json!(3)),
            (json!("sum-view"), json!(4.5), json!(2)),
        ]
    );
    let value = stored(&h, "k").expect("one combined value");
    let mut rules: Vec<(&str, u64, u64)> = value
        .entries
        .iter()
        .map(|e| (e.rule.as_str(), e.version, e.acc.count))
        .collect();
    rules.sort();
    assert_eq!(
        rules,
        vec![("count", 1, 3), ("sum-cart", 1, 1), ("sum-view", 1, 2)]
    );
    assert_eq!(
        stored(&h, "other"),
        None,
        "a key without events holds nothing"
    );
}

#[test]
fn a_replaced_or_deleted_rule_leaves_the_value_at_the_next_write() {
    let mut h = proc_time();
    h.rule(agg("a", 1, json!({"fn": "count"})));
    h.rule(agg("b", 1, json!({"fn": "count"})));
    h.ev("k", json!({}), None);
    h.ev("k", json!({}), None);
    h.rule(agg("a", 2, json!({"fn": "count"})));
    h.delete("b", 2);
    let out = h.ev("k", json!({}), None);
    assert_eq!(
        vals(&out),
        vec![json!(1)],
        "version 2 starts afresh; b is gone"
    );
    let value = stored(&h, "k").expect("value");
    let rules: Vec<(&str, u64)> = value
        .entries
        .iter()
        .map(|e| (e.rule.as_str(), e.version))
        .collect();
    assert_eq!(rules, vec![("a", 2)]);
}

#[test]
fn a_running_rule_idle_for_state_ttl_starts_again_while_another_keeps_the_key() {
    let mut h = harness(
        BackendKind::Hashmap,
        false,
        0,
        Some(Duration::from_secs(60)),
    );
    h.rule(agg("all", 1, json!({"fn": "count"})));
    h.rule(json!({"id": "views", "version": 1, "kind": "aggregate",
                  "filter": {"field": "/type", "eq": "view"},
                  "aggregate": {"fn": "count"}}));
    h.ev("k", json!({"type": "view"}), None);
    h.clock.advance(40_000);
    h.ev("k", json!({"type": "click"}), None); // writes `all` only
    h.clock.advance(20_000); // `views` last written 60 s ago: expired; `all` 20 s ago
    let out = h.ev("k", json!({"type": "view"}), None);
    assert_eq!(
        out.iter()
            .map(|o| (o["rule_id"].clone(), o["value"].clone()))
            .collect::<Vec<_>>(),
        vec![(json!("all"), json!(3)), (json!("views"), json!(1))]
    );
}

/// A checkpoint written before the combined value: accumulators per rule namespace in
/// `rules.running.acc`. They go on counting and move into the combined value.
fn upgrade_keeps_per_rule_running_state(backend: BackendKind) {
    let mut h = harness(backend, false, 0, None);
    h.rule(agg("c", 1, json!({"fn": "count"})));
    h.rule(sum_of("view"));
    let store = h.d.store().clone();
    let legacy = store
        .value_state(&ValueStateDescriptor::<Acc>::new("rules.running.acc"))
        .expect("legacy state");
    store.set_current_key(b"k").expect("key");
    store.set_current_namespace(&namespace("c", 1, window::RUNNING, None));
    legacy
        .update(&Acc {
            count: 5,
            ..Acc::default()
        })
        .expect("write");
    store.set_current_namespace(&namespace("sum-view", 1, window::RUNNING, None));
    legacy
        .update(&Acc {
            count: 2,
            sum: 10.0,
            ..Acc::default()
        })
        .expect("write");
    let dir: PathBuf = h.dir.path().join("chk-old");
    let snap = h.d.snapshot(1, &dir).expect("snapshot");
    h.d.reset(Some((dir, snap))).expect("restore");
    assert!(store.state_has_entries("rules.running.acc").expect("scan"));
    let out = h.ev("k", json!({"type": "view", "amount": 1.0}), None);
    assert_eq!(vals(&out), vec![json!(6), json!(11.0)], "both continue");
    assert_eq!(out[1]["count"], json!(3));
    assert!(
        !store.state_has_entries("rules.running.acc").expect("scan"),
        "moved out of the old state"
    );
    let dir: PathBuf = h.dir.path().join("chk-new");
    let snap = h.d.snapshot(2, &dir).expect("snapshot");
    h.d.reset(Some((dir, snap))).expect("restore");
    let out = h.ev("k", json!({"type": "view", "amount": 1.0}), None);
    assert_eq!(vals(&out), vec![json!(7), json!(12.0)]);
}

#[test]
fn upgrade_keeps_per_rule_running_state_on_hashmap() {
    upgrade_keeps_per_rule_running_state(BackendKind::Hashmap);
}

#[test]
fn upgrade_keeps_per_rule_running_state_on_rocksdb() {
    upgrade_keeps_per_rule_running_state(BackendKind::Rocksdb);
}
