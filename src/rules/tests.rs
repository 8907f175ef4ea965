//! The engine through the [`Driver`], with a manual clock. Expected values are computed
//! by hand in the comments.

use std::path::PathBuf;
use std::sync::Arc;

use serde_json::{Value, json};
use streamstate_state::{BackendKind, ManualClock, StoreConfig};

use super::*;
use crate::driver::{Driver, EventTime, LATE_EVENT};
use crate::function::SourceRef;

struct H {
    d: Driver,
    clock: Arc<ManualClock>,
    offset: i64,
    registry: prometheus::Registry,
    dir: tempfile::TempDir,
}

fn harness(
    backend: BackendKind,
    event_time: bool,
    out_of_order_ms: u64,
    state_ttl: Option<Duration>,
) -> H {
    let dir = tempfile::tempdir().expect("dir");
    let clock = Arc::new(ManualClock::new(1_000_000));
    let store = StateStore::open_with_clock(
        StoreConfig::new(backend, dir.path().join("state"), 4),
        clock.clone(),
    )
    .expect("store");
    let registry = prometheus::Registry::new();
    let engine = RuleEngine::with_options(
        EngineOptions {
            event_time,
            state_ttl,
        },
        &registry,
    );
    let time = EventTime {
        enabled: event_time,
        max_out_of_orderness: Duration::from_millis(out_of_order_ms),
        idle_timeout: None,
    };
    let d = Driver::new(store, Box::new(engine), time).expect("driver");
    H {
        d,
        clock,
        offset: 0,
        registry,
        dir,
    }
}

/// Processing time, hashmap.
fn proc_time() -> H {
    harness(BackendKind::Hashmap, false, 0, None)
}

/// Event time with no out-of-orderness: the watermark is the newest event time.
fn event_time() -> H {
    harness(BackendKind::Hashmap, true, 0, None)
}

fn values(records: &[crate::function::OutputRecord]) -> Vec<Value> {
    records
        .iter()
        .map(|r| serde_json::from_slice(&r.value).expect("json"))
        .collect()
}

impl H {
    /// Publishes a rule as the runtime does: the function decides, and an accepted rule
    /// is stored in broadcast state. Returns the refusal reason, if any.
    fn rule(&mut self, body: Value) -> Option<&'static str> {
        let id = body["id"].as_str().expect("id").to_string();
        let version = body["version"].as_u64().expect("version");
        let src = SourceRef {
            topic: "control".into(),
            partition: 0,
            offset: 0,
        };
        let (_, refused) = self
            .d
            .broadcast(&BroadcastUpdate {
                id: &id,
                version,
                body: Some(&body),
                source: &src,
            })
            .expect("broadcast");
        if refused.is_none() {
            let stored = StoredRule {
                version,
                body: Some(body.to_string()),
                applied_at_ms: 0,
                partition: 0,
                offset: 0,
            };
            BroadcastContext::new(self.d.store())
                .broadcast_state(&rules_descriptor())
                .put(&id, &stored)
                .expect("store rule");
        }
        refused.map(|r| r.reason)
    }

    fn delete(&mut self, id: &str, version: u64) {
        let src = SourceRef {
            topic: "control".into(),
            partition: 0,
            offset: 0,
        };
        let (_, refused) = self
            .d
            .broadcast(&BroadcastUpdate {
                id,
                version,
                body: None,
                source: &src,
            })
            .expect("broadcast");
        assert!(refused.is_none());
        let stored = StoredRule {
            version,
            body: None,
            applied_at_ms: 0,
            partition: 0,
            offset: 0,
        };
        BroadcastContext::new(self.d.store())
            .broadcast_state(&rules_descriptor())
            .put(&id.to_string(), &stored)
            .expect("store");
    }

    /// One event; returns its outputs (a rejection panics).
    fn ev(&mut self, key: &str, value: Value, ts: Option<u64>) -> Vec<Value> {
        let (records, rejected) = self.try_ev(key, value, ts);
        assert_eq!(rejected, None, "event unexpectedly rejected");
        records
    }

    fn try_ev(
        &mut self,
        key: &str,
        value: Value,
        ts: Option<u64>,
    ) -> (Vec<Value>, Option<&'static str>) {
        let src = SourceRef {
            topic: "in".into(),
            partition: 0,
            offset: self.offset,
        };
        self.offset += 1;
        let (records, rejected) = self.d.element(key, &value, ts, &src).expect("element");
        (values(&records), rejected.map(|r| r.reason))
    }

    fn fire(&mut self) -> Vec<Value> {
        values(&self.d.fire_timers().expect("fire"))
    }

    fn metric(&self, name: &str) -> f64 {
        self.registry
            .gather()
            .iter()
            .filter(|f| f.name() == name)
            .flat_map(|f| f.get_metric().iter().map(|m| m.get_counter().get_value()))
            .sum()
    }
}

fn agg(id: &str, version: u64, aggregate: Value) -> Value {
    json!({"id": id, "version": version, "kind": "aggregate", "aggregate": aggregate})
}

fn vals(out: &[Value]) -> Vec<Value> {
    out.iter().map(|o| o["value"].clone()).collect()
}

#[test]
fn output_record_shape_and_topic() {
    let mut h = proc_time();
    assert_eq!(h.rule(json!({"id": "c", "version": 1, "kind": "aggregate", "output_topic": "alerts",
        "aggregate": {"fn": "count", "window": {"type": "tumbling", "size": "10s"}, "emit": "every_event"}})), None);
    let src = SourceRef {
        topic: "in".into(),
        partition: 0,
        offset: 0,
    };
    let (records, _) =
        h.d.element("k1", &json!({"a": 1}), None, &src)
            .expect("element");
    assert_eq!(records[0].topic.as_deref(), Some("alerts"));
    assert_eq!(records[0].key.as_deref(), Some(b"k1".as_slice()));
    let v: Value = serde_json::from_slice(&records[0].value).expect("json");
    // Processing time 1_000_000 → window [1_000_000, 1_010_000).
    assert_eq!(
        v,
        json!({"rule_id": "c", "rule_version": 1, "key": "k1", "kind": "aggregate", "value": 1,
               "window": {"start": 1_000_000, "end": 1_010_000},
               "source": {"topic": "in", "partition": 0, "offset": 0}, "timestamp": 1_000_000,
               "fn": "count", "count": 1, "trigger": "event"})
    );
    assert!(h.metric("streamstate_rule_outputs_total") >= 1.0);
    assert_eq!(h.metric("streamstate_rule_matches_total"), 1.0);
}

#[test]
fn shadow_rule_keeps_state_and_counts_matches_but_emits_nothing() {
    let mut h = proc_time();
    let rule = |version: u64, status: &str| {
        json!({"id": "s", "version": version, "status": status, "kind": "aggregate",
               "filter": {"field": "/a", "gte": 1},
               "aggregate": {"fn": "count", "emit": "every_event"}})
    };
    assert_eq!(h.rule(rule(1, "shadow")), None);
    assert!(h.ev("k", json!({"a": 1}), None).is_empty());
    assert!(h.ev("k", json!({"a": 2}), None).is_empty());
    assert!(h.ev("k", json!({"a": 0}), None).is_empty(), "filtered out");
    assert_eq!(h.metric("streamstate_rule_matches_by_rule_total"), 2.0);
    assert_eq!(
        h.metric("streamstate_rule_shadow_suppressed_outputs_total"),
        2.0
    );
    assert_eq!(h.metric("streamstate_rule_outputs_total"), 0.0);
    // Promotion is a new version, and a new version starts its state afresh.
    assert_eq!(h.rule(rule(2, "active")), None);
    let out = h.ev("k", json!({"a": 3}), None);
    assert_eq!(vals(&out), vec![json!(1)]);
    assert_eq!(out[0]["rule_version"], 2);
    assert_eq!(h.metric("streamstate_rule_matches_by_rule_total"), 3.0);
}

#[test]
fn tumbling_event_time_boundaries_and_late_events() {
    let mut h = event_time();
    h.rule(agg("s", 1, json!({"fn": "sum", "field": "/amount", "window": {"type": "tumbling", "size": "1m"}, "emit": "on_window_close"})));
    h.ev("a", json!({"amount": 1}), Some(60_000)); // exactly at start
    h.ev("a", json!({"amount": 2}), Some(119_998));
    assert!(h.fire().is_empty(), "watermark 119998 < end - 1");
    h.ev("a", json!({"amount": 4}), Some(119_999));
    let out = h.fire();
    assert_eq!(
        vals(&out),
        vec![json!(7.0)],
        "1 + 2 + 4; fires at watermark = end - 1"
    );
    assert_eq!(out[0]["window"], json!({"start": 60_000, "end": 120_000}));
    assert_eq!(
        out[0]["source"],
        Value::Null,
        "window close is caused by a timer"
    );
    assert_eq!(out[0]["timestamp"], json!(119_999));
    // An event at exactly the watermark is on time for the driver, but its window has
    // closed: it is counted nowhere (Flink drops it the same way).
    assert!(h.ev("a", json!({"amount": 100}), Some(119_999)).is_empty());
    assert_eq!(h.metric("streamstate_rule_late_window_events_total"), 1.0);
    // Behind the watermark: the driver rejects it before the engine sees it.
    assert_eq!(
        h.try_ev("a", json!({"amount": 100}), Some(110_000)).1,
        Some(LATE_EVENT)
    );
    h.ev("a", json!({"amount": 8}), Some(120_000)); // exactly at end: the next window
    h.ev("b", json!({"amount": 0}), Some(180_000));
    let out = h.fire();
    assert_eq!(
        vals(&out),
        vec![json!(8.0)],
        "[120000,180000) has only the event at 120000"
    );
    assert!(h.fire().is_empty());
}

#[test]
fn processing_time_windows_close_on_the_clock() {
    let mut h = proc_time();
    h.rule(agg(
        "c",
        1,
        json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}}),
    ));
    h.clock.set(1_005_000);
    h.ev("a", json!({}), None);
    h.ev("a", json!({}), None);
    h.clock.set(1_009_998);
    assert!(h.fire().is_empty());
    h.clock.set(1_009_999); // end - 1
    let out = h.fire();
    assert_eq!(vals(&out), vec![json!(2)]);
    assert_eq!(
        out[0]["window"],
        json!({"start": 1_000_000, "end": 1_010_000})
    );
}

#[test]
fn sliding_windows_count_one_event_in_each_overlapping_window() {
    let mut h = event_time();
    h.rule(agg(
        "sl",
        1,
        json!({"fn": "count", "window": {"type": "sliding", "size": "30s", "slide": "10s"}}),
    ));
    h.ev("a", json!({}), Some(25_000));
    h.ev("b", json!({}), Some(100_000));
    let out = h.fire();
    let windows: Vec<Value> = out.iter().map(|o| o["window"].clone()).collect();
    assert_eq!(
        windows,
        vec![
            json!({"start": 0, "end": 30_000}),
            json!({"start": 10_000, "end": 40_000}),
            json!({"start": 20_000, "end": 50_000})
        ]
    );
    assert_eq!(vals(&out), vec![json!(1), json!(1), json!(1)]);
}

#[test]
fn sliding_every_event_emits_per_window() {
    let mut h = event_time();
    h.rule(agg("sl", 1, json!({"fn": "sum", "field": "/x", "window": {"type": "sliding", "size": "20s", "slide": "10s"}, "emit": "every_event"})));
    assert_eq!(
        vals(&h.ev("a", json!({"x": 1}), Some(15_000))),
        vec![json!(1.0), json!(1.0)]
    );
    // 21000 is in [10000,30000) (with the first) and [20000,40000).
    assert_eq!(
        vals(&h.ev("a", json!({"x": 2}), Some(21_000))),
        vec![json!(3.0), json!(2.0)]
    );
}

#[test]
fn sessions_merge_when_an_event_bridges_them() {
    // Out-of-orderness 100s so the bridging event (8000) is on time.
    let mut h = harness(BackendKind::Hashmap, true, 100_000, None);
    h.rule(agg(
        "ss",
        1,
        json!({"fn": "sum", "field": "/x", "window": {"type": "session", "gap": "10s"}}),
    ));
    h.rule(agg(
        "sd",
        1,
        json!({"fn": "distinct_count", "field": "/x", "window": {"type": "session", "gap": "10s"}}),
    ));
    h.ev("a", json!({"x": 1}), Some(0)); // [0, 10000)
    h.ev("a", json!({"x": 2}), Some(15_000)); // [15000, 25000): separate
    h.ev("a", json!({"x": 1}), Some(8_000)); // [8000, 18000) overlaps both → [0, 25000)
    h.ev("z", json!({"x": 5}), Some(125_000)); // watermark 25000 ≥ 24999
    let out = h.fire();
    assert_eq!(out.len(), 2, "{out:?}");
    let by_rule = |id: &str| {
        out.iter()
            .find(|o| o["rule_id"] == id)
            .expect("output")
            .clone()
    };
    assert_eq!(by_rule("sd")["value"], json!(2), "distinct values 1 and 2");
    assert_eq!(by_rule("ss")["value"], json!(4.0), "1 + 2 + 1");
    assert_eq!(by_rule("ss")["window"], json!({"start": 0, "end": 25_000}));
    assert_eq!(by_rule("ss")["count"], json!(3));
}

#[test]
fn a_session_emitting_every_event_reports_the_merged_session() {
    let mut h = harness(BackendKind::Hashmap, true, 100_000, None);
    h.rule(agg(
        "se",
        1,
        json!({"fn": "sum", "field": "/x", "emit": "every_event",
               "window": {"type": "session", "gap": "10s"}}),
    ));
    let one = |out: Vec<Value>| {
        assert_eq!(out.len(), 1, "{out:?}");
        let o = &out[0];
        (o["value"].clone(), o["window"].clone(), o["count"].clone())
    };
    assert_eq!(
        one(h.ev("a", json!({"x": 1}), Some(0))),
        (json!(1.0), json!({"start": 0, "end": 10_000}), json!(1))
    );
    assert_eq!(
        one(h.ev("a", json!({"x": 2}), Some(15_000))),
        (
            json!(2.0),
            json!({"start": 15_000, "end": 25_000}),
            json!(1)
        )
    );
    // Bridges both: the output is the merged session's.
    assert_eq!(
        one(h.ev("a", json!({"x": 1}), Some(8_000))),
        (json!(4.0), json!({"start": 0, "end": 25_000}), json!(3))
    );
}

#[test]
fn a_closed_windows_distinct_values_are_dropped_and_the_next_window_counts_afresh() {
    let mut h = event_time();
    h.rule(agg(
        "wd",
        1,
        json!({"fn": "distinct_count", "field": "/x", "window": {"type": "tumbling", "size": "10s"}}),
    ));
    h.rule(agg(
        "wc",
        1,
        json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}}),
    ));
    let distinct = |h: &H| {
        h.d.store()
            .state_has_entries("rules.window.distinct")
            .expect("scan")
    };
    h.ev("a", json!({"x": 1}), Some(0));
    h.ev("a", json!({"x": 2}), Some(1_000));
    h.ev("a", json!({"x": 2}), Some(2_000));
    assert!(distinct(&h), "the open window keeps its distinct values");
    h.ev("a", json!({"x": 1}), Some(11_000)); // watermark 11000 closes [0, 10000)
    let out = h.fire();
    let by_rule = |out: &[Value], id: &str| {
        out.iter()
            .find(|o| o["rule_id"] == id)
            .unwrap_or_else(|| panic!("{id} in {out:?}"))["value"]
            .clone()
    };
    assert_eq!(by_rule(&out, "wd"), json!(2), "1 and 2");
    assert_eq!(by_rule(&out, "wc"), json!(3));
    h.ev("b", json!({"x": 7}), Some(30_000)); // closes [10000, 20000) of "a"
    let out = h.fire();
    assert_eq!(by_rule(&out, "wd"), json!(1), "only 1 in the second window");
    assert_eq!(by_rule(&out, "wc"), json!(1));
    assert!(distinct(&h), "b's open window holds its value");
    // No /x: "wd" writes nothing for "c"; the watermark closes b's window.
    h.ev("c", json!({}), Some(50_000));
    h.fire();
    assert!(
        !distinct(&h),
        "every closed window's distinct values are gone"
    );
}

#[test]
fn sessions_stay_apart_beyond_the_gap() {
    let mut h = event_time();
    h.rule(agg(
        "ss",
        1,
        json!({"fn": "count", "window": {"type": "session", "gap": "10s"}}),
    ));
    h.ev("a", json!({}), Some(0));
    h.ev("a", json!({}), Some(9_999)); // within the gap: [0, 19999)
    h.ev("a", json!({}), Some(19_999)); // watermark 19999 closes [0,19999) first (end-1 = 19998 ≤ 19999)
    let out = h.fire();
    assert_eq!(vals(&out), vec![json!(2)]);
    assert_eq!(out[0]["window"], json!({"start": 0, "end": 19_999}));
    h.ev("b", json!({}), Some(40_000));
    assert_eq!(
        vals(&h.fire()),
        vec![json!(1)],
        "the session [19999, 29999) alone"
    );
}

#[test]
fn every_fn_on_a_running_aggregate() {
    let mut h = proc_time();
    for f in ["count", "sum", "min", "max", "avg", "distinct_count"] {
        let mut a = json!({"fn": f, "field": "/x"});
        if f == "count" {
            a = json!({"fn": "count"});
        }
        assert_eq!(h.rule(agg(f, 1, a)), None);
    }
    let mut last = Vec::new();
    for x in [4.0, -1.0, 7.5, 4.0] {
        last = h.ev("a", json!({"x": x}), None);
    }
    let got: BTreeMap<String, Value> = last
        .iter()
        .map(|o| {
            (
                o["rule_id"].as_str().expect("id").to_string(),
                o["value"].clone(),
            )
        })
        .collect();
    // 4 + -1 + 7.5 + 4 = 14.5; avg 14.5 / 4 = 3.625; distinct 4, -1, 7.5 = 3.
    assert_eq!(got["count"], json!(4));
    assert_eq!(got["sum"], json!(14.5));
    assert_eq!(got["min"], json!(-1.0));
    assert_eq!(got["max"], json!(7.5));
    assert_eq!(got["avg"], json!(3.625));
    assert_eq!(got["distinct_count"], json!(3));
    // A non-number is skipped and counted, not fatal.
    let out = h.ev("a", json!({"x": "seven"}), None);
    assert_eq!(
        out.len(),
        2,
        "count and distinct_count still see it: {out:?}"
    );
    assert_eq!(h.metric("streamstate_rule_evaluation_errors_total"), 4.0);
}

#[test]
fn having_with_each_op_on_every_event() {
    let mut h = proc_time();
    let cases = [
        ("gt", json!({"gt": 2}), vec![3]),
        ("gte", json!({"gte": 2}), vec![2, 3]),
        ("lt", json!({"lt": 2}), vec![1]),
        ("lte", json!({"lte": 2}), vec![1, 2]),
        ("eq", json!({"eq": 2}), vec![2]),
        ("ne", json!({"ne": 2}), vec![1, 3]),
        ("in", json!({"in": [1, 3]}), vec![1, 3]),
        ("not", json!({"not": {"eq": 1}}), vec![2, 3]),
        ("and", json!({"and": [{"gt": 1}, {"lt": 3}]}), vec![2]),
        ("or", json!({"or": [{"eq": 1}, {"eq": 3}]}), vec![1, 3]),
        ("exists", json!({"exists": true}), vec![1, 2, 3]),
    ];
    for (id, having, _) in &cases {
        assert_eq!(
            h.rule(agg(
                id,
                1,
                json!({"fn": "count", "having": having, "emit": "every_event"})
            )),
            None,
            "{id}"
        );
    }
    let mut got: BTreeMap<String, Vec<u64>> = BTreeMap::new();
    for _ in 0..3 {
        for o in h.ev("a", json!({}), None) {
            got.entry(o["rule_id"].as_str().expect("id").into())
                .or_default()
                .push(o["value"].as_u64().expect("n"));
        }
    }
    for (id, _, want) in cases {
        assert_eq!(got.get(id).cloned().unwrap_or_default(), want, "{id}");
    }
}

#[test]
fn on_match_running_is_edge_triggered() {
    let mut h = proc_time();
    h.rule(agg(
        "m",
        1,
        json!({"fn": "sum", "field": "/x", "having": {"gt": 10}, "emit": "on_match"}),
    ));
    let mut out = Vec::new();
    // sums: 5, 11 (emit), 12, 7 (re-arms), 11 (emit)
    for x in [5, 6, 1, -5, 4] {
        out.extend(h.ev("a", json!({"x": x}), None));
    }
    assert_eq!(vals(&out), vec![json!(11.0), json!(11.0)]);
}

#[test]
fn on_match_windowed_emits_once_per_window() {
    let mut h = event_time();
    h.rule(agg("m", 1, json!({"fn": "count", "window": {"type": "tumbling", "size": "1m"}, "having": {"gte": 2}, "emit": "on_match"})));
    let mut out = Vec::new();
    for ts in [0, 1, 2, 60_000, 60_001] {
        out.extend(h.ev("a", json!({}), Some(ts)));
        out.extend(h.fire());
    }
    assert_eq!(vals(&out), vec![json!(2), json!(2)]);
    assert_eq!(out[1]["window"], json!({"start": 60_000, "end": 120_000}));
}

#[test]
fn filter_selects_events() {
    let mut h = proc_time();
    h.rule(json!({"id": "f", "version": 1, "kind": "aggregate",
        "filter": {"and": [{"field": "/type", "eq": "payment"}, {"or": [{"field": "/amount", "gt": 100}, {"field": "/vip", "exists": true}]},
                           {"not": {"field": "/country", "in": ["XX", "YY"]}}]},
        "aggregate": {"fn": "count"}}));
    assert_eq!(
        h.ev("a", json!({"type": "payment", "amount": 150}), None)
            .len(),
        1
    );
    assert!(
        h.ev("a", json!({"type": "payment", "amount": 50}), None)
            .is_empty()
    );
    assert_eq!(
        h.ev(
            "a",
            json!({"type": "payment", "amount": 50, "vip": 1}),
            None
        )
        .len(),
        1
    );
    assert!(
        h.ev(
            "a",
            json!({"type": "payment", "amount": 150, "country": "XX"}),
            None
        )
        .is_empty()
    );
    assert!(
        h.ev("a", json!({"type": "refund", "amount": 150}), None)
            .is_empty()
    );
}

#[test]
fn compare_with_an_earlier_window() {
    let mut h = event_time();
    h.rule(agg(
        "cmp",
        1,
        json!({"fn": "sum", "field": "/x", "window": {"type": "tumbling", "size": "1m"},
        "compare": {"windows_back": 1, "ratio_gt": 2.0}}),
    ));
    let mut out = Vec::new();
    for (x, ts) in [(10, 1_000), (25, 61_000), (30, 121_000), (1, 250_000)] {
        out.extend(h.ev("a", json!({"x": x}), Some(ts)));
        out.extend(h.fire());
    }
    // window 0: 10 (nothing before); window 1: 25 / 10 = 2.5 > 2 → emit; window 2: 30 / 25 = 1.2.
    assert_eq!(out.len(), 1, "{out:?}");
    assert_eq!(out[0]["value"], json!(25.0));
    assert_eq!(out[0]["window"], json!({"start": 60_000, "end": 120_000}));
    assert_eq!(out[0]["compare"]["previous"], json!(10.0));
    assert_eq!(out[0]["compare"]["ratio"], json!(2.5));
    // Window 4 [240000,300000) has 1; window 3 had nothing: no comparison, no output.
    h.ev("b", json!({"x": 0}), Some(400_000));
    assert!(h.fire().iter().all(|o| o["key"] != "a"));
}

#[test]
fn compare_windows_back_two_with_having() {
    let mut h = event_time();
    h.rule(agg(
        "cmp",
        1,
        json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}, "having": {"gte": 3},
        "emit": "on_window_close", "compare": {"windows_back": 2, "ratio_gt": 1.0}}),
    ));
    let mut out = Vec::new();
    // counts per window: w0 = 1, w1 = 5, w2 = 3 (vs w0: 3/1 = 3 > 1, count 3 ≥ 3 → emit),
    // w3 = 4 (vs w1: 4/5 = 0.8 → no).
    let ts: Vec<u64> = [
        vec![0],
        vec![10_000; 5],
        vec![20_000; 3],
        vec![30_000; 4],
        vec![45_000],
    ]
    .concat();
    for t in ts {
        out.extend(h.ev("a", json!({}), Some(t)));
        out.extend(h.fire());
    }
    assert_eq!(vals(&out), vec![json!(3)]);
    assert_eq!(out[0]["compare"]["previous_start"], json!(0));
}

#[test]
fn dedup_drops_repeats_until_the_ttl_expires() {
    let mut h = proc_time();
    h.rule(json!({"id": "d", "version": 1, "kind": "dedup", "dedup": {"field": "/event_id", "ttl": "10s"}}));
    let first = h.ev("a", json!({"event_id": "x", "n": 1}), None);
    assert_eq!(
        first[0]["value"],
        json!({"event_id": "x", "n": 1}),
        "the event itself"
    );
    assert!(h.ev("a", json!({"event_id": "x", "n": 2}), None).is_empty());
    assert_eq!(h.ev("a", json!({"event_id": "y"}), None).len(), 1);
    h.clock.advance(9_999);
    assert!(
        h.ev("a", json!({"event_id": "x", "n": 3}), None).is_empty(),
        "1ms before the TTL"
    );
    h.clock.advance(1);
    assert_eq!(
        h.ev("a", json!({"event_id": "x", "n": 4}), None).len(),
        1,
        "TTL expired: first again"
    );
    assert!(h.ev("a", json!({"event_id": "x", "n": 5}), None).is_empty());
    assert_eq!(
        h.ev("b", json!({"event_id": "x"}), None).len(),
        1,
        "per key"
    );
    assert!(
        h.ev("a", json!({"no_id": 1}), None).is_empty(),
        "missing field: skipped"
    );
    assert_eq!(h.metric("streamstate_rule_dedup_dropped_total"), 3.0);
}

#[test]
fn dedup_in_event_time_uses_event_timestamps() {
    let mut h = event_time();
    h.rule(
        json!({"id": "d", "version": 1, "kind": "dedup", "dedup": {"field": "/id", "ttl": "1m"}}),
    );
    assert_eq!(h.ev("a", json!({"id": 1}), Some(0)).len(), 1);
    assert!(h.ev("a", json!({"id": 1}), Some(59_999)).is_empty());
    assert_eq!(h.ev("a", json!({"id": 1}), Some(60_000)).len(), 1);
}

fn login_then_pay() -> Value {
    json!({"id": "lp", "version": 1, "kind": "sequence",
           "sequence": {"steps": [{"field": "/type", "eq": "login"}, {"field": "/type", "eq": "pay"}], "within": "5m"}})
}

#[test]
fn sequence_matches_in_order_within_the_bound() {
    let mut h = proc_time();
    h.rule(login_then_pay());
    assert!(
        h.ev("u", json!({"type": "pay", "n": 0}), None).is_empty(),
        "pay before login"
    );
    assert!(h.ev("u", json!({"type": "login"}), None).is_empty());
    h.clock.advance(60_000);
    assert!(
        h.ev("u", json!({"type": "browse"}), None).is_empty(),
        "other events are skipped"
    );
    h.clock.advance(240_000); // exactly 5m after the login: inclusive
    let out = h.ev("u", json!({"type": "pay", "n": 1}), None);
    assert_eq!(out.len(), 1);
    assert_eq!(
        out[0]["value"],
        json!([{"type": "login"}, {"type": "pay", "n": 1}])
    );
    assert_eq!(out[0]["sequence"]["started"], json!(1_000_000));
    assert_eq!(out[0]["sequence"]["ended"], json!(1_300_000));
    assert_eq!(out[0]["source"]["offset"], json!(3));
    assert!(
        h.ev("u", json!({"type": "pay"}), None).is_empty(),
        "a match consumes its partial"
    );
}

#[test]
fn sequence_times_out() {
    let mut h = proc_time();
    h.rule(login_then_pay());
    h.ev("u", json!({"type": "login"}), None);
    h.clock.advance(300_001);
    assert!(h.fire().is_empty());
    assert!(
        h.ev("u", json!({"type": "pay"}), None).is_empty(),
        "5m + 1ms after the login"
    );
    // A later login restarts the clock.
    h.ev("u", json!({"type": "login"}), None);
    h.clock.advance(299_000);
    h.fire();
    assert_eq!(h.ev("u", json!({"type": "pay"}), None).len(), 1);
}

#[test]
fn sequence_keeps_the_latest_start_per_step() {
    let mut h = proc_time();
    h.rule(json!({"id": "abc", "version": 1, "kind": "sequence", "sequence": {"within": "10s", "steps": [
        {"field": "/t", "eq": "a"}, {"field": "/t", "eq": "b"}, {"field": "/t", "eq": "c"}]}}));
    h.ev("k", json!({"t": "a", "i": 1}), None); // t = 0
    h.clock.advance(4_000);
    h.ev("k", json!({"t": "b", "i": 2}), None); // a1 b2 (start 0)
    h.clock.advance(4_000);
    h.ev("k", json!({"t": "a", "i": 3}), None); // a3 (start 8000)
    h.clock.advance(4_000);
    h.ev("k", json!({"t": "b", "i": 4}), None); // t = 12000: a1.. is out of bound; a3 b4
    h.clock.advance(4_000);
    let out = h.ev("k", json!({"t": "c", "i": 5}), None); // t = 16000, 8s after a3
    assert_eq!(
        vals(&out),
        vec![json!([{"t": "a", "i": 3}, {"t": "b", "i": 4}, {"t": "c", "i": 5}])]
    );
}

fn anomaly(model: Value) -> Value {
    json!({"id": "an", "version": 1, "kind": "anomaly", "anomaly": model})
}

#[test]
fn anomaly_welford_warm_up_and_z_score() {
    let mut h = proc_time();
    h.rule(anomaly(
        json!({"field": "/x", "model": "welford", "z_gt": 2.0, "min_samples": 3}),
    ));
    for x in [10, 12, 14] {
        assert!(h.ev("a", json!({"x": x}), None).is_empty(), "warm-up");
    }
    // Before 20: n = 3, mean 12, sample variance (4 + 0 + 4) / 2 = 4, sd 2 → z = (20 - 12) / 2 = 4.
    let out = h.ev("a", json!({"x": 20}), None);
    assert_eq!(out.len(), 1);
    assert_eq!(out[0]["value"], json!(20));
    assert_eq!(
        out[0]["anomaly"],
        json!({"model": "welford", "z_gt": 2.0, "min_samples": 3, "z": 4.0, "mean": 12.0, "stddev": 2.0, "samples": 3})
    );
    let mut w = proc_time();
    w.rule(anomaly(
        json!({"field": "/x", "model": "welford", "z_gt": 2.0, "min_samples": 3}),
    ));
    w.ev("a", json!({"x": 10}), None);
    w.ev("a", json!({"x": 12}), None);
    assert!(
        w.ev("a", json!({"x": 1000}), None).is_empty(),
        "no output before min_samples"
    );
}

#[test]
fn anomaly_ewma_by_hand() {
    let mut h = proc_time();
    h.rule(anomaly(
        json!({"field": "/x", "model": "ewma", "alpha": 0.5, "z_gt": 1.5, "min_samples": 2}),
    ));
    // 10: mean 10, var 0. 12 (n = 1 < 2, not scored): d = 2, mean 11, var 0.5 * (0 + 0.5 * 4) = 1.
    assert!(h.ev("a", json!({"x": 10}), None).is_empty());
    assert!(h.ev("a", json!({"x": 12}), None).is_empty());
    // 14: z = (14 - 11) / 1 = 3 > 1.5.
    let out = h.ev("a", json!({"x": 14}), None);
    assert_eq!(
        out[0]["anomaly"],
        json!({"model": "ewma", "alpha": 0.5, "z_gt": 1.5, "min_samples": 2, "z": 3.0, "mean": 11.0, "stddev": 1.0, "samples": 2})
    );
    // After 14: d = 3, mean 12.5, var 0.5 * (1 + 0.5 * 9) = 2.75; 13 → z = 0.5 / 1.658 < 1.5.
    assert!(h.ev("a", json!({"x": 13}), None).is_empty());
}

#[test]
fn update_resets_state_and_outputs_carry_the_version() {
    let mut h = proc_time();
    h.rule(agg("c", 1, json!({"fn": "count"})));
    h.rule(agg(
        "w",
        1,
        json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}}),
    ));
    h.ev("a", json!({}), None);
    let out = h.ev("a", json!({}), None);
    assert_eq!(out[0]["value"], json!(2));
    assert_eq!(out[0]["rule_version"], json!(1));
    assert_eq!(h.rule(agg("c", 2, json!({"fn": "count"}))), None);
    assert_eq!(
        h.rule(agg(
            "w",
            2,
            json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}})
        )),
        None
    );
    let out = h.ev("a", json!({}), None);
    assert_eq!(
        (out[0]["value"].clone(), out[0]["rule_version"].clone()),
        (json!(1), json!(2)),
        "fresh state"
    );
    h.clock.advance(10_000);
    let out = h.fire();
    // v1's window (2 events) must not emit; v2's window has the one event.
    assert_eq!(vals(&out), vec![json!(1)]);
    assert_eq!(out[0]["rule_version"], json!(2));
}

#[test]
fn deletion_stops_emitting_including_pending_timers() {
    let mut h = event_time();
    h.rule(agg(
        "w",
        1,
        json!({"fn": "count", "window": {"type": "tumbling", "size": "10s"}}),
    ));
    h.rule(agg(
        "s",
        1,
        json!({"fn": "count", "window": {"type": "session", "gap": "10s"}}),
    ));
    h.rule(login_then_pay());
    h.ev("a", json!({"type": "login"}), Some(1_000));
    h.delete("w", 2);
    h.delete("s", 2);
    h.delete("lp", 2);
    assert!(h.ev("a", json!({"type": "pay"}), Some(5_000)).is_empty());
    h.ev("b", json!({}), Some(1_000_000));
    assert!(h.fire().is_empty());
    assert_eq!(h.d.store().timer_count(TimeDomain::EventTime), 0);
}

#[test]
fn malformed_rules_are_refused_and_the_previous_version_stays() {
    let mut h = proc_time();
    assert_eq!(h.rule(agg("c", 1, json!({"fn": "count"}))), None);
    let mut deep = json!({"gt": 1});
    for _ in 0..20 {
        deep = json!({"not": deep});
    }
    let bad = [
        (
            json!({"id": "c", "version": 2, "kind": "aggregate", "aggregate": {"fn": "count"}, "colour": "red"}),
            "rule_unknown_field",
        ),
        (
            agg("c", 3, json!({"fn": "median", "field": "/x"})),
            "rule_unknown_fn",
        ),
        (
            agg(
                "c",
                4,
                json!({"fn": "count", "window": {"type": "tumbling", "size": "ten minutes"}}),
            ),
            "rule_bad_duration",
        ),
        (
            agg(
                "c",
                5,
                json!({"fn": "count", "window": {"type": "tumbling", "size": "0ms"}}),
            ),
            "rule_bad_duration",
        ),
        (
            agg("c", 6, json!({"fn": "count", "having": deep})),
            "rule_too_complex",
        ),
        (
            agg(
                "c",
                7,
                json!({"fn": "count", "window": {"type": "sliding", "size": "1m", "slide": "7s"}}),
            ),
            "rule_bad_window",
        ),
        (
            json!({"id": "c", "version": 8, "kind": "aggregate", "status": "paused", "aggregate": {"fn": "count"}}),
            "rule_bad_status",
        ),
        (
            json!({"id": "c", "version": 9, "kind": "magic"}),
            "rule_unknown_kind",
        ),
        (
            json!({"id": "other", "version": 10, "kind": "aggregate", "aggregate": {"fn": "count"}}),
            "rule_invalid",
        ),
    ];
    for (body, reason) in bad {
        let v = body["version"].as_u64().unwrap_or(0);
        if body["id"] == "other" {
            // Body id differs from the record key.
            let src = SourceRef {
                topic: "control".into(),
                partition: 0,
                offset: 0,
            };
            let (_, r) =
                h.d.broadcast(&BroadcastUpdate {
                    id: "c",
                    version: v,
                    body: Some(&body),
                    source: &src,
                })
                .expect("b");
            assert_eq!(r.map(|r| r.reason), Some(reason));
            continue;
        }
        assert_eq!(h.rule(body), Some(reason), "version {v}");
    }
    let out = h.ev("a", json!({}), None);
    assert_eq!(out[0]["rule_version"], json!(1), "v1 still in force");
    assert_eq!(out[0]["value"], json!(1));
}

/// Snapshot, go on, restore, replay: the outputs after the restore equal the first run's.
fn restore_gives_identical_outputs(backend: BackendKind) {
    let mut h = harness(backend, true, 0, Some(Duration::from_secs(3600)));
    h.rule(agg("run", 1, json!({"fn": "sum", "field": "/x"})));
    h.rule(agg("win", 1, json!({"fn": "distinct_count", "field": "/x", "window": {"type": "tumbling", "size": "10s"}})));
    h.rule(agg(
        "ses",
        1,
        json!({"fn": "max", "field": "/x", "window": {"type": "session", "gap": "5s"}}),
    ));
    h.rule(
        json!({"id": "dd", "version": 1, "kind": "dedup", "dedup": {"field": "/x", "ttl": "1h"}}),
    );
    h.rule(json!({"id": "seq", "version": 1, "kind": "sequence", "sequence": {"within": "1m", "steps": [
        {"field": "/x", "eq": 1}, {"field": "/x", "eq": 3}]}}));
    h.rule(anomaly(
        json!({"field": "/x", "model": "welford", "z_gt": 1.0, "min_samples": 2}),
    ));
    for (x, ts) in [(1, 1_000), (2, 2_000), (2, 3_000)] {
        h.ev("k", json!({"x": x}), Some(ts));
    }
    let dir: PathBuf = h.dir.path().join("chk-1");
    let snap = h.d.snapshot(1, &dir).expect("snapshot");
    let script = |h: &mut H| {
        let mut out = Vec::new();
        for (x, ts) in [(3, 4_000), (1, 8_000), (9, 12_000), (3, 30_000)] {
            out.extend(h.ev("k", json!({"x": x}), Some(ts)));
            out.extend(h.fire());
        }
        out
    };
    let first = script(&mut h);
    assert!(first.len() >= 8, "{first:#?}");
    // Mutate rules too: a rule added after the checkpoint is gone after the restore.
    h.rule(agg("late", 1, json!({"fn": "count"})));
    h.d.reset(Some((dir, snap))).expect("reset");
    let offset = h.offset;
    h.offset = 3;
    let second = script(&mut h);
    h.offset = offset;
    assert_eq!(first, second);
}

#[test]
fn restore_replays_identically_on_hashmap() {
    restore_gives_identical_outputs(BackendKind::Hashmap);
}

#[test]
fn restore_replays_identically_on_rocksdb() {
    restore_gives_identical_outputs(BackendKind::Rocksdb);
}

#[test]
fn running_state_expires_with_state_ttl() {
    let mut h = harness(
        BackendKind::Hashmap,
        false,
        0,
        Some(Duration::from_secs(60)),
    );
    h.rule(agg("c", 1, json!({"fn": "count"})));
    h.ev("a", json!({}), None);
    h.clock.advance(59_999);
    assert_eq!(h.ev("a", json!({}), None)[0]["value"], json!(2));
    h.clock.advance(60_000);
    assert_eq!(
        h.ev("a", json!({}), None)[0]["value"],
        json!(1),
        "idle for state_ttl: starts again"
    );
}

/// Every ```json block of docs/rules.md that is a rule (has "kind") compiles.
fn doc_rules() -> Vec<Value> {
    let doc = include_str!("../../docs/rules.md");
    let mut rules = Vec::new();
    let mut rest = doc;
    while let Some(i) = rest.find("```json\n") {
        let body = &rest[i + 8..];
        let end = body.find("```").expect("closed block");
        let v: Value = serde_json::from_str(&body[..end])
            .unwrap_or_else(|e| panic!("json block: {e}\n{}", &body[..end]));
        if v.get("kind").is_some() {
            rules.push(v);
        }
        rest = &body[end + 3..];
    }
    rules
}

#[test]
fn every_example_in_the_docs_is_accepted() {
    let rules = doc_rules();
    assert!(
        rules.len() >= 8,
        "docs/rules.md has {} examples",
        rules.len()
    );
    for r in rules {
        if let Err(e) = spec::compile(&r) {
            panic!("{}: {} ({})", r["id"], e, e.reason);
        }
    }
}

/// The JSON Schema accepts every doc example and refuses malformed rules. No Rust JSON
/// Schema crate is in the build; Python's `jsonschema` checks it (`run.sh` installs it and
/// sets `STREAMSTATE_TEST_PYTHON`; without it this test fails, it never skips).
#[test]
fn schema_accepts_the_examples_and_refuses_malformed_rules() {
    let schema = include_str!("../../schemas/rule-v1.schema.json");
    let schema_v: Value = serde_json::from_str(schema).expect("schema is JSON");
    assert_eq!(
        schema_v["$schema"],
        json!("https://json-schema.org/draft/2020-12/schema")
    );
    let good = doc_rules();
    let bad = vec![
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "median", "field": "/a"}}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}, "extra": 1}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count", "window": {"type": "tumbling"}}}),
        json!({"id": "x", "version": 1, "kind": "dedup", "dedup": {"field": "/a"}}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}, "filter": {"field": "/a", "like": 1}}),
        json!({"id": "x", "version": 1, "kind": "aggregate"}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count", "group_by": "/t", "window": {"type": "session", "gap": "1m"}}}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count", "max_groups": 3}}),
        json!({"id": "x", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count", "group_by": "/t", "max_groups": 0}}),
    ];
    for b in &bad {
        assert!(spec::compile(b).is_err(), "the engine refuses {b}");
    }
    let script = r#"
import json, sys
import jsonschema
d = json.load(sys.stdin)
v = jsonschema.Draft202012Validator(d["schema"])
jsonschema.Draft202012Validator.check_schema(d["schema"])
bad = [i for i, r in enumerate(d["good"]) if not v.is_valid(r)]
ok = [i for i, r in enumerate(d["bad"]) if v.is_valid(r)]
print(json.dumps({"good_refused": bad, "bad_accepted": ok}))
"#;
    let input = json!({"schema": schema_v, "good": good, "bad": bad}).to_string();
    let python = std::env::var("STREAMSTATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let child = std::process::Command::new(&python)
        .args(["-c", script])
        .stdin(std::process::Stdio::piped())
        .stdout(std::process::Stdio::piped())
        .spawn();
    let mut child = child.unwrap_or_else(|e| {
        panic!("{python}: {e} (set STREAMSTATE_TEST_PYTHON to a Python with jsonschema)")
    });
    use std::io::Write as _;
    child
        .stdin
        .take()
        .expect("stdin")
        .write_all(input.as_bytes())
        .expect("write");
    let out = child.wait_with_output().expect("python");
    let text = String::from_utf8_lossy(&out.stdout).trim().to_string();
    assert!(
        out.status.success(),
        "{python} could not check the schema (needs `jsonschema`; run.sh sets STREAMSTATE_TEST_PYTHON): {}",
        String::from_utf8_lossy(&out.stderr)
    );
    assert_eq!(text, r#"{"good_refused": [], "bad_accepted": []}"#);
}

mod event_time;
mod running;
mod windowed;

/// The benchmark's rules (bench/rules.json) over events with repeated keys and event ids,
/// on RocksDB: once an event at a time, once in batches with read-ahead as the job loop
/// runs them. Returns the outputs and the events' keyed-state reads answered from memory.
fn bench_rules_outputs(batch: Option<usize>) -> (Vec<Value>, u64) {
    let mut h = harness(BackendKind::Rocksdb, false, 0, None);
    let rules: Value =
        serde_json::from_str(include_str!("../../bench/rules.json")).expect("bench rules");
    for rule in rules.as_array().expect("a list") {
        assert_eq!(h.rule(rule.clone()), None);
    }
    let types = ["view", "click", "cart", "purchase"];
    let events: Vec<(String, Value)> = (0..300u64)
        .map(|i| {
            // Every tenth event repeats one three back: same key, same event id.
            let j = if i % 10 == 3 { i - 3 } else { i };
            let key = format!("user-{}", (j * 7919) % 120);
            let id = format!("e-{j}");
            let value = json!({"event_id": id, "type": types[(i % 4) as usize], "amount": i % 17});
            (key, value)
        })
        .collect();
    let mut out = Vec::new();
    for chunk in events.chunks(batch.unwrap_or(1)) {
        if batch.is_some() {
            let upcoming: Vec<Upcoming<'_>> = chunk
                .iter()
                .map(|(key, value)| Upcoming { key, value })
                .collect();
            h.d.begin_batch(&upcoming).expect("begin batch");
        }
        for (key, value) in chunk {
            out.extend(h.ev(key, value.clone(), None));
            out.extend(h.fire());
        }
        h.d.end_batch().expect("end batch");
    }
    (out, h.d.store().cache_stats().hits)
}

#[test]
fn read_ahead_in_batches_gives_the_same_outputs_and_serves_every_read() {
    let (one_by_one, hits) = bench_rules_outputs(None);
    assert_eq!(hits, 0, "no batch, no cache: every read goes to RocksDB");
    // count and one sum per event, dedup for the 270 first sightings.
    assert_eq!(one_by_one.len(), 300 + 300 + 270);
    let (batched, hits) = bench_rules_outputs(Some(37));
    assert_eq!(batched, one_by_one);
    // Each event reads its key's running value and its dedup entry: all read ahead.
    assert!(hits >= 2 * 300, "{hits} reads answered from the read-ahead");
}
