//! Event-time sequences (timestamp order through the buffer) and `group_by` aggregates.

use std::collections::BTreeMap;

use proptest::prelude::*;

use super::*;

/// Event time with `ooo_ms` of allowed out-of-orderness.
fn event_time_ooo(ooo_ms: u64) -> H {
    harness(BackendKind::Hashmap, true, ooo_ms, None)
}

fn login_then_withdraw() -> Value {
    json!({"id": "lw", "version": 1, "kind": "sequence",
           "sequence": {"steps": [{"field": "/type", "eq": "login"}, {"field": "/type", "eq": "withdraw"}], "within": "4s"}})
}

/// Moves the watermark past everything before `ts` (another key, no rule step) and
/// fires the timers; returns what they emitted.
fn pass_watermark(h: &mut H, ooo_ms: u64, ts: u64) -> Vec<Value> {
    let mut out = h.ev("tick", json!({"type": "tick"}), Some(ts + ooo_ms + 1));
    out.extend(h.fire());
    out
}

const T: u64 = 1_700_000_000_000;

#[test]
fn an_earlier_stamped_unrelated_event_does_not_drop_the_pending_login() {
    let mut h = event_time_ooo(2_000);
    h.rule(login_then_withdraw());
    let mut out = h.ev("u", json!({"type": "login", "i": 1}), Some(T));
    out.extend(h.fire());
    out.extend(h.ev("u", json!({"type": "deposit", "i": 2}), Some(T - 500)));
    out.extend(h.fire());
    out.extend(h.ev("u", json!({"type": "withdraw", "i": 3}), Some(T + 900)));
    out.extend(h.fire());
    assert!(
        out.is_empty(),
        "nothing before the watermark passes: {out:?}"
    );
    let out = pass_watermark(&mut h, 2_000, T + 900);
    assert_eq!(out.len(), 1, "{out:#?}");
    assert_eq!(
        out[0]["value"],
        json!([{"type": "login", "i": 1}, {"type": "withdraw", "i": 3}])
    );
    assert_eq!(out[0]["sequence"]["started"], json!(T));
    assert_eq!(out[0]["sequence"]["ended"], json!(T + 900));
    assert_eq!(
        out[0]["source"]["offset"],
        json!(2),
        "the withdraw's source"
    );
    assert_eq!(out[0]["timestamp"], json!(T + 900));
}

#[test]
fn a_withdraw_stamped_before_the_login_is_skipped_and_the_next_one_matches() {
    let mut h = event_time_ooo(2_000);
    h.rule(login_then_withdraw());
    let mut out = h.ev("u", json!({"type": "login"}), Some(T));
    out.extend(h.ev("u", json!({"type": "withdraw", "i": 1}), Some(T - 100)));
    out.extend(h.ev("u", json!({"type": "withdraw", "i": 2}), Some(T + 200)));
    out.extend(h.fire());
    assert!(out.is_empty());
    let out = pass_watermark(&mut h, 2_000, T + 200);
    assert_eq!(
        vals(&out),
        vec![json!([{"type": "login"}, {"type": "withdraw", "i": 2}])]
    );
}

#[test]
fn ties_are_evaluated_in_arrival_order() {
    let mut h = event_time_ooo(1_000);
    h.rule(login_then_withdraw());
    h.ev("u", json!({"type": "withdraw", "i": 1}), Some(T + 10));
    h.ev("u", json!({"type": "login", "i": 2}), Some(T + 10));
    h.ev("u", json!({"type": "withdraw", "i": 3}), Some(T + 10));
    h.ev("u", json!({"type": "login", "i": 4}), Some(T));
    let out = pass_watermark(&mut h, 1_000, T + 10);
    // Sorted: login4@T, withdraw1@T+10, login2, withdraw3 (ties in arrival order).
    assert_eq!(
        vals(&out),
        vec![
            json!([{"type": "login", "i": 4}, {"type": "withdraw", "i": 1}]),
            json!([{"type": "login", "i": 2}, {"type": "withdraw", "i": 3}]),
        ]
    );
}

#[test]
fn within_is_measured_on_event_time_after_sorting() {
    let mut h = event_time_ooo(10_000);
    h.rule(login_then_withdraw());
    // Arrives first but is 4s + 1ms after the login: out of bound.
    h.ev("u", json!({"type": "withdraw", "i": 1}), Some(T + 4_001));
    h.ev("u", json!({"type": "login"}), Some(T));
    assert!(pass_watermark(&mut h, 10_000, T + 4_001).is_empty());
    // Exactly 4s: inclusive.
    h.ev("v", json!({"type": "withdraw", "i": 2}), Some(T + 20_000));
    h.ev("v", json!({"type": "login"}), Some(T + 16_000));
    assert_eq!(pass_watermark(&mut h, 10_000, T + 20_000).len(), 1);
}

#[test]
fn processing_time_keeps_arrival_order() {
    let mut h = proc_time();
    h.rule(login_then_withdraw());
    h.ev("u", json!({"type": "withdraw"}), None);
    h.clock.advance(100);
    assert!(h.ev("u", json!({"type": "login"}), None).is_empty());
    h.clock.advance(100);
    let out = h.ev("u", json!({"type": "withdraw"}), None);
    assert_eq!(out.len(), 1, "emitted on arrival, no buffering");
}

#[test]
fn buffered_events_survive_a_restore() {
    let mut h = event_time_ooo(5_000);
    h.rule(login_then_withdraw());
    h.ev("u", json!({"type": "login"}), Some(T));
    h.ev("u", json!({"type": "withdraw", "i": 1}), Some(T + 1_000));
    let dir: PathBuf = h.dir.path().join("chk-1");
    let snap = h.d.snapshot(1, &dir).expect("snapshot");
    h.d.reset(None).expect("empty");
    h.rule(login_then_withdraw());
    assert!(
        pass_watermark(&mut h, 5_000, T + 1_000).is_empty(),
        "empty state: no match"
    );
    h.d.reset(Some((dir, snap))).expect("restore");
    let out = pass_watermark(&mut h, 5_000, T + 1_000);
    assert_eq!(out.len(), 1, "the buffer came back with the checkpoint");
}

#[test]
fn a_full_buffer_evaluates_its_oldest_events_early_and_counts_them() {
    let mut h = event_time_ooo(0);
    // A partition that never delivers holds the watermark back: everything waits.
    h.d.set_partitions([("in".to_string(), 0), ("in".to_string(), 1)]);
    h.rule(login_then_withdraw());
    h.ev("u", json!({"type": "login"}), Some(T));
    h.ev("u", json!({"type": "withdraw"}), Some(T + 1));
    let mut out = Vec::new();
    for i in 0..sequence::MAX_BUFFERED_PER_KEY - 2 {
        out.extend(h.ev("u", json!({"type": "x"}), Some(T + 10 + i)));
    }
    assert!(out.is_empty());
    assert_eq!(
        h.metric("streamstate_rule_sequence_early_evaluations_total"),
        0.0
    );
    assert!(h.ev("u", json!({"type": "x"}), Some(T + 5)).is_empty());
    assert_eq!(
        h.metric("streamstate_rule_sequence_early_evaluations_total"),
        1.0,
        "the login, evaluated early"
    );
    let out = h.ev("u", json!({"type": "x"}), Some(T + 6));
    assert_eq!(
        vals(&out),
        vec![json!([{"type": "login"}, {"type": "withdraw"}])]
    );
}

// ---- property: any arrival order within the bound gives the sorted input's matches ----

const TYPES: [&str; 4] = ["a", "b", "c", "x"];

#[derive(Debug, Clone)]
struct Ev {
    key: u8,
    kind: usize,
    ts: u64,
    /// Arrival delay, at most the out-of-orderness.
    delay: u64,
}

fn ev_strategy(ooo: u64) -> impl Strategy<Value = Ev> {
    (0u8..3, 0usize..TYPES.len(), 0u64..20_000, 0..=ooo).prop_map(|(key, kind, ts, delay)| Ev {
        key,
        kind,
        ts,
        delay,
    })
}

fn seq_rule(steps: usize, within_ms: u64) -> Value {
    let steps: Vec<Value> = TYPES[..steps]
        .iter()
        .map(|t| json!({"field": "/t", "eq": t}))
        .collect();
    json!({"id": "p", "version": 1, "kind": "sequence",
           "sequence": {"steps": steps, "within": format!("{within_ms}ms")}})
}

fn element(h: &mut H, i: usize, e: &Ev) -> Vec<Value> {
    let src = SourceRef {
        topic: "in".into(),
        partition: 0,
        offset: i as i64,
    };
    let v = json!({"t": TYPES[e.kind], "i": i});
    let key = format!("k{}", e.key);
    let (records, rejected) =
        h.d.element(&key, &v, Some(T + e.ts), &src)
            .expect("element");
    assert!(rejected.is_none(), "within the bound nothing is late");
    values(&records)
}

fn by_key(out: Vec<Value>) -> BTreeMap<String, Vec<Value>> {
    let mut m: BTreeMap<String, Vec<Value>> = BTreeMap::new();
    for o in out {
        m.entry(o["key"].as_str().expect("key").to_string())
            .or_default()
            .push(o);
    }
    m
}

proptest! {
    #![proptest_config(ProptestConfig::with_cases(96))]

    /// The event-time engine on events arriving out of order (each at most `ooo` behind
    /// the newest) gives exactly what the arrival-order engine gives on the same events
    /// sorted by time (stable, so ties keep their arrival order).
    #[test]
    fn out_of_order_arrival_gives_the_matches_of_the_sorted_input(
        evs in proptest::collection::vec(ev_strategy(3_000), 1..120),
        steps in 1usize..4,
        within in 1u64..6_000,
    ) {
        let ooo = 3_000;
        let mut arrival: Vec<(usize, Ev)> = evs.iter().cloned().enumerate().collect();
        arrival.sort_by_key(|(_, e)| e.ts + e.delay);
        let mut et = event_time_ooo(ooo);
        et.rule(seq_rule(steps, within));
        let mut got = Vec::new();
        for (i, e) in &arrival {
            got.extend(element(&mut et, *i, e));
            got.extend(et.fire());
        }
        let end = Ev { key: 9, kind: 3, ts: 100_000, delay: 0 };
        got.extend(element(&mut et, usize::MAX >> 1, &end));
        got.extend(et.fire());

        // The reference run: processing time, the clock at each event's time.
        let mut sorted = arrival.clone();
        sorted.sort_by_key(|(_, e)| e.ts);
        let mut pt = proc_time();
        pt.rule(seq_rule(steps, within));
        let mut want = Vec::new();
        for (i, e) in &sorted {
            pt.clock.set(T + e.ts);
            want.extend(pt.fire());
            let src = SourceRef { topic: "in".into(), partition: 0, offset: *i as i64 };
            let v = json!({"t": TYPES[e.kind], "i": i});
            let (records, _) = pt.d.element(&format!("k{}", e.key), &v, None, &src).expect("element");
            want.extend(values(&records));
        }
        prop_assert_eq!(by_key(got), by_key(want));
    }
}

// ---- group_by --------------------------------------------------------------------------

#[test]
fn group_by_keeps_one_running_sum_per_type_and_names_the_group() {
    let mut h = proc_time();
    assert_eq!(
        h.rule(agg(
            "s",
            1,
            json!({"fn": "sum", "field": "/amount", "group_by": "/type", "emit": "every_event"})
        )),
        None
    );
    let mut out = Vec::new();
    for (t, x) in [
        ("view", 1.0),
        ("click", 10.0),
        ("view", 2.5),
        ("cart", 4.0),
        ("click", 1.0),
    ] {
        out.extend(h.ev("u", json!({"type": t, "amount": x}), None));
    }
    out.extend(h.ev("w", json!({"type": "view", "amount": 100}), None));
    let got: Vec<(Value, Value, Value, Value)> = out
        .iter()
        .map(|o| {
            (
                o["key"].clone(),
                o["group"]["value"].clone(),
                o["value"].clone(),
                o["count"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (json!("u"), json!("view"), json!(1.0), json!(1)),
            (json!("u"), json!("click"), json!(10.0), json!(1)),
            (json!("u"), json!("view"), json!(3.5), json!(2)),
            (json!("u"), json!("cart"), json!(4.0), json!(1)),
            (json!("u"), json!("click"), json!(11.0), json!(2)),
            (json!("w"), json!("view"), json!(100.0), json!(1)),
        ]
    );
    assert_eq!(out[0]["group"]["field"], json!("/type"));
    assert!(
        h.ev("u", json!({"amount": 1}), None).is_empty(),
        "no group field"
    );
    assert_eq!(
        h.registry
            .gather()
            .iter()
            .filter(|f| f.name() == "streamstate_rule_evaluation_errors_total")
            .flat_map(|f| f.get_metric().iter())
            .filter(|m| m.get_label().iter().any(|l| l.value() == "group_missing"))
            .map(|m| m.get_counter().get_value())
            .sum::<f64>(),
        1.0
    );
}

#[test]
fn group_by_in_a_tumbling_window_emits_one_output_per_group_at_close() {
    let mut h = event_time();
    h.rule(agg(
        "g",
        1,
        json!({"fn": "distinct_count", "field": "/page", "group_by": "/type",
        "window": {"type": "tumbling", "size": "10s"}, "emit": "on_window_close"}),
    ));
    for (t, page, ts) in [
        ("view", "a", 1_000),
        ("click", "a", 2_000),
        ("view", "b", 3_000),
        ("view", "a", 4_000),
        ("click", "a", 9_999),
    ] {
        h.ev("u", json!({"type": t, "page": page}), Some(ts));
    }
    h.ev("u", json!({"type": "view", "page": "z"}), Some(10_000));
    let out = h.fire();
    let got: Vec<(Value, Value, Value)> = out
        .iter()
        .map(|o| {
            (
                o["group"]["value"].clone(),
                o["value"].clone(),
                o["window"]["start"].clone(),
            )
        })
        .collect();
    assert_eq!(
        got,
        vec![
            (json!("click"), json!(1), json!(0)),
            (json!("view"), json!(2), json!(0))
        ],
        "distinct pages per type, groups in order, the window's state cleared"
    );
    h.ev("u", json!({"type": "x", "page": "q"}), Some(20_000));
    let out = h.fire();
    assert_eq!(out.len(), 1, "only view/z in the second window: {out:?}");
    assert_eq!(out[0]["value"], json!(1));
}

#[test]
fn group_by_bounds_the_groups_per_key_and_counts_the_overflow() {
    let mut h = proc_time();
    h.rule(agg(
        "g",
        1,
        json!({"fn": "count", "group_by": "/type", "max_groups": 2, "emit": "every_event"}),
    ));
    assert_eq!(h.ev("u", json!({"type": "a"}), None).len(), 1);
    assert_eq!(h.ev("u", json!({"type": "b"}), None).len(), 1);
    assert!(
        h.ev("u", json!({"type": "c"}), None).is_empty(),
        "a third group"
    );
    assert_eq!(
        h.metric("streamstate_rule_group_overflow_events_total"),
        1.0
    );
    assert_eq!(h.ev("u", json!({"type": "a"}), None)[0]["value"], json!(2));
    assert_eq!(h.ev("v", json!({"type": "c"}), None).len(), 1, "per key");
}

#[test]
fn group_by_on_match_fires_once_per_group_and_window() {
    let mut h = proc_time();
    h.rule(agg(
        "g",
        1,
        json!({"fn": "sum", "field": "/x", "group_by": "/t",
        "window": {"type": "tumbling", "size": "1m"}, "having": {"gte": 10}}),
    ));
    let mut out = Vec::new();
    for (t, x) in [("a", 6), ("b", 9), ("a", 6), ("a", 6), ("b", 1)] {
        out.extend(h.ev("u", json!({"t": t, "x": x}), None));
    }
    let got: Vec<(Value, Value)> = out
        .iter()
        .map(|o| (o["group"]["value"].clone(), o["value"].clone()))
        .collect();
    assert_eq!(
        got,
        vec![(json!("a"), json!(12.0)), (json!("b"), json!(10.0))]
    );
}

#[test]
fn group_by_refusals_name_a_reason() {
    let mut h = proc_time();
    assert_eq!(
        h.rule(agg(
            "g",
            1,
            json!({"fn": "count", "group_by": "/t", "window": {"type": "session", "gap": "1m"}})
        )),
        Some(spec::reason::BAD_WINDOW)
    );
    assert_eq!(
        h.rule(agg("g", 1, json!({"fn": "sum", "field": "/x", "group_by": "/t", "window": {"type": "tumbling", "size": "1m"},
            "emit": "on_window_close", "compare": {"windows_back": 1, "ratio_gt": 2.0}}))),
        Some(spec::reason::INVALID)
    );
    assert_eq!(
        h.rule(agg("g", 1, json!({"fn": "count", "max_groups": 5}))),
        Some(spec::reason::INVALID)
    );
    assert_eq!(
        h.rule(agg(
            "g",
            1,
            json!({"fn": "count", "group_by": "/t", "max_groups": 0})
        )),
        Some(spec::reason::TOO_COMPLEX)
    );
    assert_eq!(
        h.rule(agg("g", 1, json!({"fn": "count", "group_by": "t"}))),
        Some(spec::reason::BAD_POINTER)
    );
}

/// A checkpoint written before the sequence buffer existed (only `rules.sequence`, the
/// layout of earlier versions) restores, and its pending partial completes.
#[test]
fn a_checkpoint_without_the_buffer_states_restores_and_its_partial_completes() {
    let old_dir = tempfile::tempdir().expect("dir");
    let old = StateStore::open(StoreConfig::new(
        BackendKind::Hashmap,
        old_dir.path().join("state"),
        4,
    ))
    .expect("store");
    let rule = login_then_withdraw();
    BroadcastContext::new(&old)
        .broadcast_state(&rules_descriptor())
        .put(
            &"lw".to_string(),
            &StoredRule {
                version: 1,
                body: Some(rule.to_string()),
                applied_at_ms: 0,
                partition: 0,
                offset: 0,
            },
        )
        .expect("rule");
    old.set_current_key(b"u").expect("key");
    old.set_current_namespace(&window::namespace("lw", 1, window::SEQUENCE, None));
    let partials = old
        .value_state(&ValueStateDescriptor::<Vec<sequence::Partial>>::new(
            "rules.sequence",
        ))
        .expect("state");
    partials
        .update(&vec![sequence::Partial {
            start: T,
            next: 1,
            events: vec![json!({"type": "login"}).to_string()],
            sources: vec![("in".into(), 0, 7)],
        }])
        .expect("partial");
    let snap_dir = old_dir.path().join("chk-1");
    let snap = old.snapshot(1, &snap_dir).expect("snapshot");

    let mut h = event_time_ooo(0);
    h.d.reset(Some((snap_dir, snap))).expect("restore");
    h.ev("u", json!({"type": "withdraw"}), Some(T + 3_000));
    let out = pass_watermark(&mut h, 0, T + 3_000);
    assert_eq!(
        vals(&out),
        vec![json!([{"type": "login"}, {"type": "withdraw"}])]
    );
    assert_eq!(out[0]["sequence"]["sources"][0]["offset"], json!(7));
}
