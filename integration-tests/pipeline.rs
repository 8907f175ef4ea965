//! The walking skeleton on a real broker: every input's effect is visible exactly once to
//! a read_committed reader, across SIGKILL, with bad records in the dead-letter topic.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

const KEYS: usize = 1_000;

/// What the test puts in: roughly `garbage_per_mille`/1000 of records are unusable.
fn events(n: usize, garbage_per_mille: u32, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let user = format!("user-{}", rng.random_range(0..KEYS));
            if rng.random_ratio(garbage_per_mille, 1000) {
                let bad: Vec<u8> = match i % 3 {
                    0 => b"{\"user_id\": \"oops".to_vec(),
                    1 => vec![0xff, 0xfe, b'{', b'}'],
                    _ => format!(r#"{{"no_user":"{user}","seq":{i}}}"#).into_bytes(),
                };
                (Some(user), bad)
            } else {
                (Some(user.clone()), format!(r#"{{"user_id":"{user}","seq":{i},"amount":{}}}"#, i % 97).into_bytes())
            }
        })
        .collect()
}

fn produce_all(topic: &str, evs: &[(Option<String>, Vec<u8>)], per_second: Option<u64>) {
    let p = producer();
    let started = std::time::Instant::now();
    for (i, (k, v)) in evs.iter().enumerate() {
        if let Some(rate) = per_second {
            // Spread input over time so kills land while records are flowing.
            while (started.elapsed().as_millis() as u64) * rate / 1000 < i as u64 {
                p.poll(Duration::from_millis(1));
            }
        }
        produce(&p, topic, k.as_deref(), v);
    }
    flush(&p);
}

/// The checker's own notion of a good record, independent of the service's decoder.
fn user_of(payload: Option<&[u8]>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload?).ok()?;
    v.get("user_id")?.as_str().map(str::to_string)
}

/// Compares output and dead-letter topics against a model computed from the input topic.
fn check_exactly_once(job: &Job) -> (usize, usize) {
    let input = read_all(&job.input, true);
    let output = read_all(&job.output, true);
    let dlq = read_all(&job.dlq, true);

    // Reference model: per key, its events in (partition, offset) order get counts 1..n.
    let mut expected: BTreeMap<(i32, i64), (String, u64)> = BTreeMap::new();
    let mut bad: BTreeMap<(i32, i64), ()> = BTreeMap::new();
    let mut running: HashMap<String, u64> = HashMap::new();
    let mut sorted = input.clone();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    for r in &sorted {
        match user_of(r.value.as_deref()) {
            Some(user) => {
                let n = running.entry(user.clone()).or_default();
                *n += 1;
                expected.insert((r.partition, r.offset), (user, *n));
            }
            None => {
                bad.insert((r.partition, r.offset), ());
            }
        }
    }

    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in &output {
        let v = r.json();
        let src = &v["source"];
        assert_eq!(src["topic"], job.input.as_str(), "output names the wrong source topic: {v}");
        let at = (
            src["partition"].as_i64().expect("source.partition") as i32,
            src["offset"].as_i64().expect("source.offset"),
        );
        *seen.entry(at).or_default() += 1;
        let (user, count) = expected.get(&at).unwrap_or_else(|| panic!("output for a non-event input {at:?}: {v}"));
        assert_eq!(v["key"], user.as_str(), "wrong key at {at:?}");
        assert_eq!(v["count"].as_u64(), Some(*count), "wrong running count at {at:?}: {v}");
        assert_eq!(r.key.as_deref(), Some(user.as_bytes()), "output record key must be the state key");
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(dups.is_empty(), "duplicated outputs for inputs {:?}", &dups[..dups.len().min(10)]);
    let missing: Vec<_> = expected.keys().filter(|k| !seen.contains_key(*k)).collect();
    assert!(missing.is_empty(), "{} inputs have no output, e.g. {:?}", missing.len(), &missing[..missing.len().min(10)]);

    let mut dead: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in &dlq {
        let p: i32 = r.headers["streamstate.source.partition"].parse().expect("partition header");
        let o: i64 = r.headers["streamstate.source.offset"].parse().expect("offset header");
        assert!(!r.headers["streamstate.error.reason"].is_empty(), "dead letter without a reason");
        assert!(bad.contains_key(&(p, o)), "a good record went to the dead-letter topic: {p}:{o}");
        let original = sorted.iter().find(|i| (i.partition, i.offset) == (p, o)).expect("source record");
        assert_eq!(r.value, original.value, "dead letter must carry the original bytes");
        *dead.entry((p, o)).or_default() += 1;
    }
    assert_eq!(dead.len(), bad.len(), "every bad record must reach the dead-letter topic");
    assert!(dead.values().all(|n| *n == 1), "a bad record was dead-lettered twice");
    (output.len(), dlq.len())
}

fn wait_all_committed(job: &Job, service: &mut Service) {
    let end = job.input_end();
    wait_until("all input offsets committed", Duration::from_secs(180), || {
        service.assert_running();
        job.committed() >= end
    });
}

#[test]
fn one_output_per_input_with_counts_in_offset_order() {
    let job = Job::new("pipeline", 4);
    job.write_config("500ms", "");
    let evs = events(10_000, 0, 1);
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "SIGTERM must exit 0, got {status}; log:\n{}", service.log());
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!((outputs, dead), (10_000, 0));
}

#[test]
fn sigkill_mid_run_then_restart_keeps_exactly_once() {
    let job = Job::new("sigkill", 4);
    job.write_config("200ms", "");
    let evs = events(10_000, 0, 2);
    let mut service = job.spawn();
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(2_500)));
    wait_until("a third of the input committed", Duration::from_secs(120), || {
        service.assert_running();
        job.committed() >= 3_000
    });
    service.sigkill();
    let killed_at = job.committed();
    assert!(killed_at < 10_000, "the kill must land mid-run (committed {killed_at})");
    let mut service = job.spawn();
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    assert!(service.log().contains("restored state from checkpoint"), "restart must restore; log:\n{}", service.log());
    service.sigkill();
    let (outputs, _) = check_exactly_once(&job);
    assert_eq!(outputs, 10_000);
}

#[test]
fn garbage_records_land_once_in_dead_letter_topic_and_service_keeps_running() {
    let job = Job::new("garbage", 4);
    job.write_config("300ms", "");
    let evs = events(10_000, 10, 3);
    let bad = evs.iter().filter(|(_, v)| user_of(Some(v)).is_none()).count();
    assert!((50..=200).contains(&bad), "about 1% garbage expected, got {bad}");
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    let (status, body) = http("GET", job.admin, "/readyz").expect("readyz");
    assert_eq!((status, body.as_str()), (200, "ready"), "service must stay ready after garbage");
    let (_, metrics) = http("GET", job.admin, "/metrics").expect("metrics");
    assert_eq!(metric_sum(&metrics, "streamstate_records_dead_lettered_total") as usize, bad);
    service.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!((outputs, dead), (10_000 - bad, bad));
}
