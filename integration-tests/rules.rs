//! The built-in rule engine on the real broker: rule updates while events flow, exactly
//! once under crashes with several rule kinds active, and malformed rules refused.

mod common;

use std::collections::{BTreeMap, BTreeSet, HashMap};
use std::os::unix::process::ExitStatusExt;
use std::time::{Duration, Instant};

use common::*;
use rand::{Rng, SeedableRng};
use rdkafka::consumer::Consumer;

const SIGABRT: i32 = 6;

fn count_rule(version: u64) -> String {
    format!(
        r#"{{"id":"cnt","version":{version},"status":"active","kind":"aggregate",
            "aggregate":{{"fn":"count","emit":"every_event"}}}}"#
    )
}

/// Next offset per input partition: everything produced from now on is at or above it.
fn input_ends(job: &Job) -> BTreeMap<i32, i64> {
    let c = consumer(None, false);
    (0..job.partitions)
        .map(|p| {
            (
                p,
                c.fetch_watermarks(&job.input, p, Duration::from_secs(10))
                    .expect("watermarks")
                    .1,
            )
        })
        .collect()
}

fn wait_rule(job: &Job, service: &mut Service, id: &str, want: (u64, bool)) {
    wait_until(
        &format!("rule {id} at {want:?}"),
        Duration::from_secs(60),
        || {
            service.assert_running();
            rules_served(job.admin).and_then(|r| r.get(id).copied()) == Some(want)
        },
    );
}

#[test]
fn rule_updated_while_events_flow_names_its_version_and_stops_when_deleted() {
    let job = rules_job("rule-update", 2, "");
    produce_rules(&job.control, &[("cnt".into(), Some(count_rule(1)))]);
    let mut service = job.spawn();
    let evs = events(1_500, 0, 11);
    produce_all(&job.input, &evs[..500], Some(2_000));
    wait_rule(&job, &mut service, "cnt", (1, false));
    // v1 must have processed these before v2 is published: control and input are read
    // side by side, so a v2 published now could otherwise overtake them (seen in CI).
    wait_until(
        "the first 500 inputs committed under v1",
        Duration::from_secs(60),
        || {
            service.assert_running();
            job.committed() >= 500
        },
    );

    produce_rules(&job.control, &[("cnt".into(), Some(count_rule(2)))]);
    wait_rule(&job, &mut service, "cnt", (2, false));
    let v2_from = input_ends(&job);
    produce_all(&job.input, &evs[500..1_000], Some(2_000));

    produce_rules(
        &job.control,
        &[(
            "cnt".into(),
            Some(r#"{"id":"cnt","version":3,"status":"deleted"}"#.into()),
        )],
    );
    wait_rule(&job, &mut service, "cnt", (3, true));
    let deleted_from = input_ends(&job);
    produce_all(&job.input, &evs[1_000..], Some(2_000));
    wait_all_committed(&job, &mut service);

    let before = rules_served(job.admin).expect("rules before the kill");
    service.sigkill();
    let mut service = job.spawn();
    wait_until(
        "the restarted instance to serve rules",
        Duration::from_secs(60),
        || {
            service.assert_running();
            rules_served(job.admin).is_some_and(|r| !r.is_empty())
        },
    );
    assert_eq!(
        rules_served(job.admin).expect("rules after restart"),
        before,
        "the applied rule set survives SIGKILL"
    );

    let mut per_partition: BTreeMap<i32, Vec<(i64, u64)>> = BTreeMap::new();
    let mut seen = BTreeSet::new();
    let mut versions = BTreeSet::new();
    for r in read_all(&job.output, true) {
        let v = r.json();
        assert_eq!(v["rule_id"], "cnt", "{v}");
        assert_eq!(v["kind"], "aggregate", "{v}");
        let version = v["rule_version"].as_u64().expect("rule_version");
        let (p, o) = (
            v["source"]["partition"].as_i64().expect("partition") as i32,
            v["source"]["offset"].as_i64().expect("offset"),
        );
        assert!(seen.insert((p, o)), "two outputs for input {p}:{o}");
        assert!(
            o < deleted_from[&p],
            "input {p}:{o} arrived after the deletion yet has output {v}"
        );
        if o >= v2_from[&p] {
            assert_eq!(
                version, 2,
                "input {p}:{o} arrived after v2 was in force: {v}"
            );
        }
        versions.insert(version);
        per_partition
            .entry(r.partition)
            .or_default()
            .push((r.offset, version));
    }
    assert_eq!(
        versions,
        BTreeSet::from([1, 2]),
        "both versions produced output"
    );
    for (p, mut outs) in per_partition {
        outs.sort_unstable();
        assert!(
            outs.windows(2).all(|w| w[0].1 <= w[1].1),
            "rule versions went backwards in output partition {p}"
        );
    }
    assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
}

/// The event time (`ts`) of a [`timed_events`] event.
fn event_time_ms(event: &(Option<String>, Vec<u8>)) -> u64 {
    let v: serde_json::Value = serde_json::from_slice(&event.1).expect("event json");
    v["ts"].as_u64().expect("ts")
}

/// `event` with its event time (`ts`) set to `ts_ms`.
fn with_event_time(event: (Option<String>, Vec<u8>), ts_ms: u64) -> (Option<String>, Vec<u8>) {
    let mut v: serde_json::Value = serde_json::from_slice(&event.1).expect("event json");
    v["ts"] = ts_ms.into();
    (event.0, serde_json::to_vec(&v).expect("event json"))
}

/// Events with a global, increasing event time (so no partition is ever behind its own
/// watermark), ~1% re-sent duplicates of an earlier event of the same user.
fn timed_events(n: usize, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let mut sent: Vec<(String, String, u64)> = Vec::new();
    (0..n)
        .map(|i| {
            let ts = 1_700_000_000_000u64 + i as u64 * 5;
            let (user, event_id, amount) = if !sent.is_empty() && rng.random_ratio(1, 100) {
                sent[rng.random_range(0..sent.len())].clone()
            } else {
                let e = (
                    format!("user-{}", rng.random_range(0..300)),
                    format!("e{i}"),
                    rng.random_range(1..100u64),
                );
                sent.push(e.clone());
                e
            };
            let body = format!(
                r#"{{"user_id":"{user}","event_id":"{event_id}","amount":{amount},"ts":{ts}}}"#
            );
            (Some(user), body.into_bytes())
        })
        .collect()
}

#[test]
fn count_dedup_and_window_rules_keep_exactly_once_under_sigkills_and_failpoint_crashes() {
    let kills = kills_from_env(8);
    let job = rules_job("rule-eo", 4, "");
    // Event time, so the reference model can say which window every event is in.
    use_event_time(&job, "200ms");
    produce_rules(
        &job.control,
        &[
            ("cnt".into(), Some(count_rule(1))),
            (
                "dd".into(),
                Some(r#"{"id":"dd","version":1,"kind":"dedup","dedup":{"field":"/event_id","ttl":"10m"}}"#.into()),
            ),
            (
                "win".into(),
                Some(
                    r#"{"id":"win","version":1,"kind":"aggregate","aggregate":{"fn":"sum","field":"/amount",
                        "window":{"type":"tumbling","size":"1s"},"emit":"on_window_close"}}"#
                        .into(),
                ),
            ),
        ],
    );
    let planned = 600 * kills.max(5);
    let mut evs = timed_events(planned + 300, 3);
    // Later events, for a failpoint run whose chunk did not reach its checkpoint.
    let mut more = evs.split_off(planned).into_iter();
    // The last 30% go in one chunk per failpoint crash below.
    let tail = evs.split_off(evs.len() * 7 / 10);
    let started = Instant::now();
    feed_under_sigkills(&job, evs, 1_500, kills);
    let mut rng = rand::rng();
    // Then a crash at each step of the commit protocol, with the rules' state in flight.
    let failpoints = [
        "mid-batch",
        "before-snapshot",
        "after-snapshot",
        "before-commit",
        "after-commit",
    ];
    for (failpoint, chunk) in failpoints
        .iter()
        .zip(tail.chunks(tail.len().div_ceil(failpoints.len())))
    {
        let skip = if *failpoint == "mid-batch" {
            rng.random_range(10..chunk.len().max(11) as u32)
        } else {
            rng.random_range(0..3)
        };
        let spec = format!("{failpoint}={skip}*off->return");
        // A top-up carries the event time of the chunk's last event: with its own (later)
        // time, top-ups on every partition moved the watermark past the next chunk, whose
        // events were then dead-lettered as late and missing from the counts.
        let chunk_end_ms = event_time_ms(chunk.last().expect("non-empty chunk"));
        let (service, status) = run_until_crash(
            &job,
            &[("FAILPOINTS", spec.as_str())],
            chunk.to_vec(),
            300,
            &mut more.by_ref().map(|e| with_event_time(e, chunk_end_ms)),
        );
        assert_eq!(
            status.signal(),
            Some(SIGABRT),
            "expected a crash at {spec}, got {status}; log:\n{}",
            service.log()
        );
    }
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    // Every event is well-formed and on time, so the model below counts all of them: a
    // dead letter (a late event, say) would show up as a wrong count far from its cause.
    let dead: Vec<String> = read_all(&job.dlq, true)
        .iter()
        .map(|r| format!("{:?}", r.headers))
        .collect();
    assert!(
        dead.is_empty(),
        "{} dead letters, the first: {:?}",
        dead.len(),
        dead.first()
    );

    // Reference model over the input as the broker stored it.
    let mut input = read_all(&job.input, true);
    input.sort_by_key(|r| (r.partition, r.offset));
    let mut counts: HashMap<String, u64> = HashMap::new();
    let mut expected_count: BTreeMap<(i32, i64), (String, u64)> = BTreeMap::new();
    let mut first_ids: HashMap<String, BTreeSet<String>> = HashMap::new();
    let mut expected_dedup: BTreeSet<(i32, i64)> = BTreeSet::new();
    let mut window_sums: BTreeMap<(String, u64), f64> = BTreeMap::new();
    let mut max_ts: BTreeMap<i32, u64> = BTreeMap::new();
    for r in &input {
        let v = r.json();
        let user = v["user_id"].as_str().expect("user").to_string();
        let ts = v["ts"].as_u64().expect("ts");
        let n = counts.entry(user.clone()).or_default();
        *n += 1;
        expected_count.insert((r.partition, r.offset), (user.clone(), *n));
        if first_ids
            .entry(user.clone())
            .or_default()
            .insert(v["event_id"].as_str().expect("id").to_string())
        {
            expected_dedup.insert((r.partition, r.offset));
        }
        *window_sums.entry((user, ts / 1000 * 1000)).or_default() +=
            v["amount"].as_f64().expect("amount");
        let m = max_ts.entry(r.partition).or_default();
        *m = (*m).max(ts);
    }
    let watermark = max_ts.values().min().expect("input") - 200;
    let expected_windows: BTreeMap<(String, u64), f64> = window_sums
        .into_iter()
        .filter(|((_, start), _)| start + 1000 - 1 <= watermark)
        .collect();

    let (mut got_count, mut got_dedup, mut got_windows) =
        (BTreeMap::new(), BTreeMap::new(), BTreeMap::new());
    for r in read_all(&job.output, true) {
        let v = r.json();
        let source = || {
            (
                v["source"]["partition"].as_i64().expect("partition") as i32,
                v["source"]["offset"].as_i64().expect("offset"),
            )
        };
        match v["rule_id"].as_str().expect("rule_id") {
            "cnt" => {
                let at = source();
                let (user, n) = expected_count
                    .get(&at)
                    .unwrap_or_else(|| panic!("count output for no input: {v}"));
                assert_eq!(
                    (v["key"].as_str(), v["value"].as_u64()),
                    (Some(user.as_str()), Some(*n)),
                    "wrong count at {at:?}"
                );
                *got_count.entry(at).or_insert(0) += 1;
            }
            "dd" => *got_dedup.entry(source()).or_insert(0) += 1,
            "win" => {
                let key = (
                    v["key"].as_str().expect("key").to_string(),
                    v["window"]["start"].as_u64().expect("window.start"),
                );
                assert_eq!(v["window"]["end"].as_u64(), Some(key.1 + 1000), "{v}");
                assert!(
                    got_windows
                        .insert(key.clone(), v["value"].as_f64().expect("value"))
                        .is_none(),
                    "window {key:?} emitted twice"
                );
            }
            other => panic!("output of unknown rule {other}: {v}"),
        }
    }
    assert!(
        got_count.values().all(|n| *n == 1),
        "duplicated count outputs"
    );
    assert_eq!(
        got_count.len(),
        expected_count.len(),
        "every event counted exactly once"
    );
    assert!(
        got_dedup.values().all(|n| *n == 1),
        "duplicated dedup outputs"
    );
    assert_eq!(
        got_dedup.keys().copied().collect::<BTreeSet<_>>(),
        expected_dedup,
        "first occurrences only, once each"
    );
    assert_eq!(
        got_windows, expected_windows,
        "closed windows, each once, with the model's sums"
    );
    assert!(
        expected_windows.len() > 100,
        "the run must close many windows ({})",
        expected_windows.len()
    );
    eprintln!(
        "rule engine under {kills} SIGKILLs and 5 failpoint crashes in {:?}: {} counts, {} dedup, {} windows checked",
        started.elapsed(),
        got_count.len(),
        got_dedup.len(),
        got_windows.len()
    );
}

#[test]
fn malformed_rules_are_refused_with_a_reason_and_processing_continues() {
    let job = rules_job("rule-bad", 2, "");
    let deep = format!(
        r#"{{"id":"cnt","version":9,"kind":"aggregate","filter":{}{}}}"#,
        "{\"not\":".repeat(40),
        "{\"field\":\"/a\",\"exists\":true}".to_string() + &"}".repeat(40)
    );
    let huge = format!(
        r#"{{"id":"cnt","version":9,"kind":"aggregate","pad":"{}"}}"#,
        "x".repeat(70_000)
    );
    let bad: Vec<(&str, String, &str)> = vec![
        ("json", "{not json".into(), "invalid_json"),
        ("unknown-field", r#"{"id":"cnt","version":5,"kind":"aggregate","aggregate":{"fn":"count","emit":"every_event"},"colour":"red"}"#.into(), ""),
        ("unknown-fn", r#"{"id":"cnt","version":6,"kind":"aggregate","aggregate":{"fn":"median","field":"/amount","emit":"every_event"}}"#.into(), ""),
        ("deep", deep, ""),
        ("huge", huge, "too_large"),
    ];
    let mut records = vec![("cnt".to_string(), Some(count_rule(1)))];
    records.extend(
        bad.iter()
            .map(|(_, body, _)| ("cnt".to_string(), Some(body.clone()))),
    );
    produce_rules(&job.control, &records);
    let mut service = job.spawn();
    produce_all(&job.input, &events(400, 0, 5), None);
    wait_all_committed(&job, &mut service);
    assert_eq!(
        rules_served(job.admin).and_then(|r| r.get("cnt").copied()),
        Some((1, false)),
        "the last good version stays"
    );

    let outputs = read_all(&job.output, true);
    assert_eq!(outputs.len(), 400, "every event still counted by version 1");
    assert!(outputs.iter().all(|r| r.json()["rule_version"] == 1));
    let dead: Vec<Record> = read_all(&job.dlq, true)
        .into_iter()
        .filter(|r| r.headers.get("streamstate.source.topic") == Some(&job.control))
        .collect();
    assert_eq!(
        dead.len(),
        bad.len(),
        "each malformed rule exactly once in the dead-letter topic"
    );
    for ((name, _, reason), r) in bad.iter().zip(&dead) {
        let got = &r.headers["streamstate.error.reason"];
        assert!(!got.is_empty(), "{name}: no reason");
        if !reason.is_empty() {
            assert_eq!(got, reason, "{name}");
        }
    }
    assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
}
