//! The rule engine in event time on the real broker: a seeded generator of events that
//! arrive out of order (each within `max_out_of_orderness` of its partition's newest),
//! run across SIGKILLs, checked against a reference model written here from the input
//! as the broker stored it — for an event-time sequence, a windowed sum, a grouped
//! windowed aggregate, a grouped running sum and dedup.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};

use common::*;
use rand::{Rng, SeedableRng};
use serde_json::Value;

const T0: u64 = 1_700_000_000_000;
/// `[job] max_out_of_orderness`; arrival delays stay below it.
const OOO_MS: u64 = 2_000;
const MAX_DELAY_MS: u64 = 1_500;
const WITHIN_MS: u64 = 4_000;
const WINDOW_MS: u64 = 1_000;
const DEDUP_TTL_MS: u64 = 600_000;
const TYPES: [&str; 4] = ["login", "withdraw", "deposit", "view"];

/// Every rule skips the end-of-input markers.
fn rules() -> Vec<(String, Option<String>)> {
    let f = r#""filter":{"field":"/type","ne":"end"}"#;
    [
        ("seq", format!(r#"{{"id":"seq","version":1,{f},"kind":"sequence","sequence":{{"steps":[{{"field":"/type","eq":"login"}},{{"field":"/type","eq":"withdraw"}}],"within":"4s"}}}}"#)),
        ("win", format!(r#"{{"id":"win","version":1,{f},"kind":"aggregate","aggregate":{{"fn":"sum","field":"/amount","window":{{"type":"tumbling","size":"1s"}},"emit":"on_window_close"}}}}"#)),
        ("grp", format!(r#"{{"id":"grp","version":1,{f},"kind":"aggregate","aggregate":{{"fn":"sum","field":"/amount","group_by":"/type","window":{{"type":"tumbling","size":"1s"}},"emit":"on_window_close"}}}}"#)),
        ("run", format!(r#"{{"id":"run","version":1,{f},"kind":"aggregate","aggregate":{{"fn":"sum","field":"/amount","group_by":"/type","emit":"every_event"}}}}"#)),
        ("dd", format!(r#"{{"id":"dd","version":1,{f},"kind":"dedup","dedup":{{"field":"/event_id","ttl":"10m"}}}}"#)),
    ]
    .into_iter()
    .map(|(id, body)| (id.to_string(), Some(body)))
    .collect()
}

fn body(user: &str, event_id: &str, kind: &str, amount: u64, ts: u64) -> Vec<u8> {
    format!(
        r#"{{"user_id":"{user}","event_id":"{event_id}","type":"{kind}","amount":{amount},"ts":{ts}}}"#
    )
    .into_bytes()
}

/// Seeded input: distinct, increasing event times (10 ms apart), 40 users, ~1% resent
/// duplicates; sent in the order of `ts + delay` with a delay below the allowed
/// out-of-orderness, so nothing is late and a key often sees its events out of order.
/// It starts with the issue's two shapes, on users of their own.
fn out_of_order_events(n: usize, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut timed: Vec<(u64, String, Vec<u8>)> = vec![
        // Shape 1: login at t, a deposit stamped before t, a withdraw at t + 0.9 s.
        (
            T0 + 1_000,
            "shape-1".into(),
            body("shape-1", "s1a", "login", 1, T0 + 1_000),
        ),
        (
            T0 + 1_001,
            "shape-1".into(),
            body("shape-1", "s1b", "deposit", 1, T0 + 500),
        ),
        (
            T0 + 1_002,
            "shape-1".into(),
            body("shape-1", "s1c", "withdraw", 1, T0 + 1_900),
        ),
        // Shape 2: login at t, a withdraw stamped before t, a withdraw at t + 0.2 s.
        (
            T0 + 1_000,
            "shape-2".into(),
            body("shape-2", "s2a", "login", 1, T0 + 1_000),
        ),
        (
            T0 + 1_001,
            "shape-2".into(),
            body("shape-2", "s2b", "withdraw", 1, T0 + 900),
        ),
        (
            T0 + 1_002,
            "shape-2".into(),
            body("shape-2", "s2c", "withdraw", 1, T0 + 1_200),
        ),
    ];
    let mut sent: Vec<(u64, String, Vec<u8>)> = Vec::new();
    for i in 0..n {
        let ts = T0 + 2_000 + i as u64 * 10;
        let user = format!("user-{}", rng.random_range(0..40));
        let kind = TYPES[rng.random_range(0..TYPES.len())];
        let b = body(&user, &format!("e{i}"), kind, rng.random_range(1..100), ts);
        timed.push((
            ts + rng.random_range(0..=MAX_DELAY_MS),
            user.clone(),
            b.clone(),
        ));
        sent.push((ts, user, b));
        if rng.random_ratio(1, 100) {
            let (ts, user, b) =
                sent[rng.random_range(sent.len().saturating_sub(20)..sent.len())].clone();
            timed.push((ts + rng.random_range(0..=MAX_DELAY_MS), user, b));
        }
    }
    timed.sort_by_key(|(at, _, _)| *at);
    timed.into_iter().map(|(_, u, b)| (Some(u), b)).collect()
}

/// One input as the model reads it.
struct In {
    at: (i32, i64),
    user: String,
    event_id: String,
    kind: String,
    amount: f64,
    ts: u64,
}

/// The model's sequence matches for one key: events in (timestamp, arrival) order; a
/// match is the earliest withdraw that has a login before it (after the previous match)
/// at most `within` earlier; of those logins the latest, ties the first. Matching
/// resumes after the withdraw.
fn model_sequences(mut evs: Vec<&In>) -> Vec<((i32, i64), (i32, i64))> {
    evs.sort_by_key(|e| (e.ts, e.at.1));
    let mut out = Vec::new();
    let mut login: Option<&In> = None;
    for e in evs {
        match e.kind.as_str() {
            "withdraw" => {
                if let Some(l) = login.filter(|l| e.ts - l.ts <= WITHIN_MS) {
                    out.push((l.at, e.at));
                    login = None;
                }
            }
            "login" if login.is_none_or(|l| l.ts < e.ts) => login = Some(e),
            _ => {}
        }
    }
    out
}

fn at(v: &Value) -> (i32, i64) {
    (
        v["partition"].as_i64().expect("partition") as i32,
        v["offset"].as_i64().expect("offset"),
    )
}

#[test]
fn event_time_rules_match_the_model_on_out_of_order_input_under_sigkills() {
    let kills = kills_from_env(6);
    let job = rules_job("rule-et", 4, "");
    use_event_time(&job, &format!("{OOO_MS}ms"));
    produce_rules(&job.control, &rules());
    let evs = out_of_order_events(4_000, 20);
    feed_under_sigkills(&job, evs, 800, kills);
    // End of input: one marker per partition far ahead moves the watermark past
    // every event, so every window closes and every buffered event is evaluated.
    let end = T0 + 2_000 + 4_000 * 10 + 60_000;
    for p in 0..job.partitions {
        produce_to_partition(
            &job.input,
            p,
            &format!("end-{p}"),
            &body(&format!("end-{p}"), "end", "end", 0, end),
        );
    }
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    let metrics = http("GET", job.admin, "/metrics").expect("metrics").1;
    service.sigkill();

    let dead: Vec<String> = read_all(&job.dlq, true)
        .iter()
        .map(|r| {
            format!(
                "{:?} {}",
                r.headers,
                String::from_utf8_lossy(r.value.as_deref().unwrap_or_default())
            )
        })
        .collect();
    assert!(
        dead.is_empty(),
        "the generator stays within max_out_of_orderness: nothing is late or refused: {dead:#?}"
    );
    assert_eq!(
        metric_sum(
            &metrics,
            "streamstate_rule_sequence_early_evaluations_total"
        ),
        0.0
    );

    // ---- the model, from the input as stored
    let mut input: Vec<In> = read_all(&job.input, true)
        .iter()
        .map(|r| {
            let v = r.json();
            In {
                at: (r.partition, r.offset),
                user: v["user_id"].as_str().expect("user").into(),
                event_id: v["event_id"].as_str().expect("id").into(),
                kind: v["type"].as_str().expect("type").into(),
                amount: v["amount"].as_f64().expect("amount"),
                ts: v["ts"].as_u64().expect("ts"),
            }
        })
        .filter(|e| e.kind != "end")
        .collect();
    input.sort_by_key(|e| e.at);
    let mut per_user: BTreeMap<&str, Vec<&In>> = BTreeMap::new();
    let mut win: BTreeMap<(String, u64), f64> = BTreeMap::new();
    let mut grp: BTreeMap<(String, u64, String), (f64, u64)> = BTreeMap::new();
    let mut run_acc: HashMap<(String, String), (f64, u64)> = HashMap::new();
    let mut run: BTreeMap<(i32, i64), (f64, u64)> = BTreeMap::new();
    let mut first_seen: HashMap<(String, String), u64> = HashMap::new();
    let mut dd: BTreeSet<(i32, i64)> = BTreeSet::new();
    // Arrival order per key is the partition's order, which (partition, offset) keeps.
    for e in &input {
        per_user.entry(&e.user).or_default().push(e);
        let start = e.ts / WINDOW_MS * WINDOW_MS;
        *win.entry((e.user.clone(), start)).or_default() += e.amount;
        let g = grp
            .entry((e.user.clone(), start, e.kind.clone()))
            .or_default();
        g.0 += e.amount;
        g.1 += 1;
        let r = run_acc.entry((e.user.clone(), e.kind.clone())).or_default();
        r.0 += e.amount;
        r.1 += 1;
        run.insert(e.at, *r);
        let first = first_seen.get(&(e.user.clone(), e.event_id.clone()));
        if first.is_none_or(|f| e.ts >= f + DEDUP_TTL_MS) {
            first_seen.insert((e.user.clone(), e.event_id.clone()), e.ts);
            dd.insert(e.at);
        }
    }
    let seq: BTreeMap<String, Vec<((i32, i64), (i32, i64))>> = per_user
        .into_iter()
        .map(|(u, evs)| (u.to_string(), model_sequences(evs)))
        .filter(|(_, m)| !m.is_empty())
        .collect();

    // ---- what the engine committed
    let mut got_seq: BTreeMap<String, Vec<((i32, i64), (i32, i64))>> = BTreeMap::new();
    let mut got_win = BTreeMap::new();
    let mut got_grp = BTreeMap::new();
    let mut got_run = BTreeMap::new();
    let mut got_dd = BTreeMap::new();
    let mut seq_outputs = BTreeSet::new();
    for r in read_all(&job.output, true) {
        let v = r.json();
        let key = v["key"].as_str().expect("key").to_string();
        match v["rule_id"].as_str().expect("rule_id") {
            "seq" => {
                let sources = v["sequence"]["sources"].as_array().expect("sources");
                assert_eq!(sources.len(), 2, "{v}");
                let m = (at(&sources[0]), at(&sources[1]));
                assert!(seq_outputs.insert(m), "sequence {m:?} emitted twice");
                assert_eq!(at(&v["source"]), m.1, "source = the last matched event");
                got_seq.entry(key).or_default().push(m);
            }
            "win" => {
                let w = (key, v["window"]["start"].as_u64().expect("start"));
                assert!(
                    got_win
                        .insert(w.clone(), v["value"].as_f64().expect("value"))
                        .is_none(),
                    "window {w:?} twice"
                );
            }
            "grp" => {
                let g = (
                    key,
                    v["window"]["start"].as_u64().expect("start"),
                    v["group"]["value"].as_str().expect("group").to_string(),
                );
                assert_eq!(v["group"]["field"], "/type", "{v}");
                let value = (
                    v["value"].as_f64().expect("value"),
                    v["count"].as_u64().expect("count"),
                );
                assert!(
                    got_grp.insert(g.clone(), value).is_none(),
                    "group {g:?} twice"
                );
            }
            "run" => {
                let src = at(&v["source"]);
                let value = (
                    v["value"].as_f64().expect("value"),
                    v["count"].as_u64().expect("count"),
                );
                assert!(
                    got_run.insert(src, value).is_none(),
                    "run output for {src:?} twice"
                );
            }
            "dd" => *got_dd.entry(at(&v["source"])).or_insert(0) += 1,
            other => panic!("output of unknown rule {other}: {v}"),
        }
    }
    // Within one key, outputs come in the order the engine evaluated them.
    for m in got_seq.values_mut() {
        m.sort_by_key(|(_, w)| *w);
    }
    let mut want_seq = seq.clone();
    for m in want_seq.values_mut() {
        m.sort_by_key(|(_, w)| *w);
    }
    for shape in ["shape-1", "shape-2"] {
        assert_eq!(
            got_seq.get(shape).map(Vec::len),
            Some(1),
            "the issue's {shape} matches once"
        );
    }
    assert_eq!(
        got_seq, want_seq,
        "event-time sequences equal the sorted-input model"
    );
    assert_eq!(got_win, win, "window sums, each window once");
    assert_eq!(
        got_grp, grp,
        "grouped window sums and counts, each group once"
    );
    assert_eq!(got_run, run, "grouped running sums, one output per event");
    assert!(got_dd.values().all(|n| *n == 1), "duplicated dedup outputs");
    assert_eq!(
        got_dd.keys().copied().collect::<BTreeSet<_>>(),
        dd,
        "dedup: first arrivals only"
    );
    let matches: usize = want_seq.values().map(Vec::len).sum();
    assert!(
        matches > 300,
        "the run must match many sequences ({matches})"
    );
    eprintln!(
        "event-time rules under {kills} SIGKILLs: {matches} sequences, {} windows, {} groups, {} running, {} dedup checked",
        win.len(),
        grp.len(),
        run.len(),
        dd.len()
    );
}
