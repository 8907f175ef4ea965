//! The walking skeleton on a real broker: every input's effect is visible exactly once to
//! a read_committed reader, across SIGKILL, with bad records in the dead-letter topic.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn one_output_per_input_with_counts_in_offset_order() {
    let job = Job::new("pipeline", 4);
    job.write_config("500ms", "");
    let evs = events(10_000, 0, 1);
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    let status = service.terminate(Duration::from_secs(60));
    assert!(
        status.success(),
        "SIGTERM must exit 0, got {status}; log:\n{}",
        service.log()
    );
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!((outputs, dead), (10_000, 0));
}

#[test]
fn sigkill_mid_run_then_restart_keeps_exactly_once() {
    sigkill_mid_run(Storage::File);
}

/// Recovery reads the committed checkpoint back from S3-compatible storage (moto).
#[test]
fn sigkill_mid_run_then_restart_keeps_exactly_once_on_s3_storage() {
    sigkill_mid_run(Storage::S3);
}

fn sigkill_mid_run(storage: Storage) {
    let job = Job::new("sigkill", 4);
    let env = configure(&job, storage, "200ms");
    let evs = events(10_000, 0, 2);
    let mut service = spawn(&job, &env, &[]);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(2_000)));
    wait_until(
        "a third of the input committed",
        Duration::from_secs(120),
        || {
            service.assert_running();
            job.committed() >= 3_000
        },
    );
    service.sigkill();
    // 0 means the broker did not answer this time; what was committed cannot shrink.
    let mut killed_at = 0;
    wait_until(
        "committed offsets to be readable",
        Duration::from_secs(30),
        || {
            killed_at = job.committed();
            killed_at > 0
        },
    );
    assert!(
        (3_000..10_000).contains(&killed_at),
        "the kill must land mid-run (committed {killed_at})"
    );
    let mut service = spawn(&job, &env, &[]);
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    wait_until(
        "the restart to log its restore",
        Duration::from_secs(30),
        || service.log().contains("restored state from checkpoint"),
    );
    let log = service.log();
    if let Storage::S3 = storage {
        assert!(
            log.contains("storage=s3://"),
            "must restore from S3; log:\n{log}"
        );
        assert!(
            !job.checkpoint_dir().exists(),
            "no checkpoint may land on the local file system"
        );
    }
    service.sigkill();
    let (outputs, _) = check_exactly_once(&job);
    assert_eq!(outputs, 10_000);
}

#[test]
fn garbage_records_land_once_in_dead_letter_topic_and_service_keeps_running() {
    let job = Job::new("garbage", 4);
    job.write_config("300ms", "");
    let evs = events(10_000, 10, 3);
    let bad = evs
        .iter()
        .filter(|(_, v)| user_of(Some(v)).is_none())
        .count();
    assert!(
        (50..=200).contains(&bad),
        "about 1% garbage expected, got {bad}"
    );
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    let (status, body) = http("GET", job.admin, "/readyz").expect("readyz");
    let ready: serde_json::Value = serde_json::from_str(&body).expect("readyz answers JSON");
    assert_eq!(
        (status, ready["status"].as_str()),
        (200, Some("ready")),
        "service must stay ready after garbage"
    );
    let (_, metrics) = http("GET", job.admin, "/metrics").expect("metrics");
    assert_eq!(
        metric_sum(&metrics, "streamstate_records_dead_lettered_total") as usize,
        bad
    );
    service.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!((outputs, dead), (10_000 - bad, bad));
}

/// `function = "passthrough"` (the benchmarks' physical limit) keeps the commit protocol:
/// across a SIGKILL every input record's key and bytes appear exactly once in the output,
/// garbage included (nothing is decoded, so nothing is dead-lettered).
#[test]
fn passthrough_copies_every_record_once_unchanged_across_sigkill() {
    let mut job = Job::new("passthrough", 4);
    job.function = "passthrough";
    job.write_config("200ms", "");
    let evs = events(6_000, 10, 3);
    let mut service = job.spawn();
    let input = job.input.clone();
    let feeder = {
        let evs = evs.clone();
        std::thread::spawn(move || produce_all(&input, &evs, Some(2_000)))
    };
    wait_until(
        "a third of the input committed",
        Duration::from_secs(120),
        || {
            service.assert_running();
            job.committed() >= 2_000
        },
    );
    service.sigkill();
    let mut service = job.spawn();
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let mut expected: Vec<(Option<Vec<u8>>, Vec<u8>)> = evs
        .into_iter()
        .map(|(k, v)| (k.map(String::into_bytes), v))
        .collect();
    let mut got: Vec<(Option<Vec<u8>>, Vec<u8>)> = read_all(&job.output, true)
        .into_iter()
        .map(|r| (r.key, r.value.unwrap_or_default()))
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got.len(), expected.len(), "one output per input");
    assert!(
        got == expected,
        "outputs must be the input records, unchanged"
    );
    assert!(
        read_all(&job.dlq, true).is_empty(),
        "passthrough dead-letters nothing"
    );
}

/// `function = "json"`: each good event once, re-encoded to the same JSON, keyed by its
/// state key; bad records still go to the dead-letter topic.
#[test]
fn json_function_emits_each_decoded_event_once() {
    let mut job = Job::new("json-fn", 4);
    job.function = "json";
    job.write_config("200ms", "");
    let evs = events(3_000, 10, 4);
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let good: Vec<&(Option<String>, Vec<u8>)> = evs
        .iter()
        .filter(|(_, v)| user_of(Some(v)).is_some())
        .collect();
    let mut expected: Vec<(String, String)> = good
        .iter()
        .map(|(_, v)| {
            let value: serde_json::Value = serde_json::from_slice(v).expect("good record is JSON");
            (user_of(Some(v)).unwrap_or_default(), value.to_string())
        })
        .collect();
    let mut got: Vec<(String, String)> = read_all(&job.output, true)
        .iter()
        .map(|r| {
            let key = String::from_utf8(r.key.clone().unwrap_or_default()).expect("utf-8 key");
            (key, r.json().to_string())
        })
        .collect();
    expected.sort();
    got.sort();
    assert_eq!(got, expected);
    assert_eq!(read_all(&job.dlq, true).len(), evs.len() - good.len());
}

/// `guarantee = "at_least_once"`: across a SIGKILL no input is lost (each has at least one
/// output naming it) and state stays exactly once (each key's last count is its number of
/// inputs), though outputs of the replayed epoch may repeat.
#[test]
fn at_least_once_loses_no_input_across_sigkill_and_keeps_state_exact() {
    let job = Job::new("alo", 4);
    job.write_config("200ms", "");
    let env = [("STREAMSTATE__JOB__GUARANTEE", "at_least_once")];
    let evs = events(6_000, 0, 5);
    let mut service = job.spawn_with(&[], &env);
    let input = job.input.clone();
    let feeder = {
        let evs = evs.clone();
        std::thread::spawn(move || produce_all(&input, &evs, Some(2_000)))
    };
    wait_until(
        "a third of the input committed",
        Duration::from_secs(120),
        || {
            service.assert_running();
            job.committed() >= 2_000
        },
    );
    service.sigkill();
    let mut service = job.spawn_with(&[], &env);
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let inputs = read_all(&job.input, false);
    let mut per_key = std::collections::HashMap::<String, u64>::new();
    for r in &inputs {
        *per_key
            .entry(user_of(r.value.as_deref()).expect("good input"))
            .or_default() += 1;
    }
    let mut seen = std::collections::HashSet::new();
    let mut last = std::collections::HashMap::<String, u64>::new();
    for r in read_all(&job.output, true) {
        let v = r.json();
        seen.insert((
            v["source"]["partition"].as_i64(),
            v["source"]["offset"].as_i64(),
        ));
        let key = v["key"].as_str().expect("key").to_string();
        let count = v["count"].as_u64().expect("count");
        let top = last.entry(key).or_default();
        *top = (*top).max(count);
    }
    let missing: Vec<(i32, i64)> = inputs
        .iter()
        .filter(|r| !seen.contains(&(Some(i64::from(r.partition)), Some(r.offset))))
        .map(|r| (r.partition, r.offset))
        .take(5)
        .collect();
    assert!(missing.is_empty(), "inputs without output: {missing:?}");
    assert_eq!(last, per_key, "each key's last count must equal its inputs");
}
