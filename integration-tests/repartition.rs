//! Repartition mode (`job.repartition`): input keyed by a session id, state keyed by
//! `/user_id`, two instances as processes, one SIGKILLed mid-run; and the refusals around
//! it (a foreign key without repartition mode, an internal topic with other partitions).

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};
use rdkafka::Offset;
use rdkafka::TopicPartitionList;
use rdkafka::consumer::Consumer;

/// Key groups, and partitions of the internal topic.
const MAX_PARALLELISM: i32 = 8;

/// Instance `i` of `n` with this file's key-group count, in repartition mode or not.
fn spawn_instance(
    job: &Job,
    i: u32,
    n: u32,
    generation: u32,
    repartition: bool,
    args: &[&str],
) -> Instance {
    let mp = MAX_PARALLELISM.to_string();
    let env = [
        (
            "STREAMSTATE__JOB__REPARTITION",
            if repartition { "true" } else { "false" },
        ),
        ("STREAMSTATE__STATE__MAX_PARALLELISM", mp.as_str()),
    ];
    common::spawn_instance(job, i, n, generation, &env, args)
}

/// Events keyed by a session id (the producer partitions by it), so one user's events
/// land on every input partition; about 1 in 200 is undecodable.
fn session_events(n: usize, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let user = format!("user-{}", rng.random_range(0..200));
            let session = format!("session-{}", rng.random_range(0..5_000));
            let payload = if rng.random_ratio(5, 1000) {
                format!(r#"{{"session":"{session}","seq":{i}}}"#)
            } else {
                format!(r#"{{"user_id":"{user}","session":"{session}","seq":{i}}}"#)
            };
            (Some(session), payload.into_bytes())
        })
        .collect()
}

/// Committed offset per partition of `topic` in the job's group (0 while none).
fn committed(job: &Job, topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = consumer(Some(&job.app_id), false);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| match e.offset() {
            Offset::Offset(o) => (e.partition(), o),
            _ => (e.partition(), 0),
        })
        .collect()
}

fn end_offsets(topic: &str, partitions: i32) -> BTreeMap<i32, i64> {
    let c = consumer(None, false);
    (0..partitions)
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks");
            (p, high)
        })
        .collect()
}

/// Hop 1 committed every input record, and hop 2 committed past the last record of every
/// internal partition: a read_committed reader starting at the committed offsets finds no
/// record before the end (only transaction markers, which both instances' forwarding
/// transactions leave after the last record).
fn both_hops_done(job: &Job, internal: &str) -> bool {
    if job.committed() < job.input_end() {
        return false;
    }
    let done = committed(job, internal, MAX_PARALLELISM);
    let ends = end_offsets(internal, MAX_PARALLELISM);
    let reader = consumer(None, true);
    let mut tpl = TopicPartitionList::new();
    for p in 0..MAX_PARALLELISM {
        tpl.add_partition_offset(internal, p, Offset::Offset(done[&p]))
            .expect("tpl");
    }
    reader.assign(&tpl).expect("assign");
    let deadline = std::time::Instant::now() + Duration::from_secs(10);
    while std::time::Instant::now() < deadline {
        if let Some(m) = reader.poll(Duration::from_millis(200)) {
            m.expect("consume");
            return false;
        }
        let positions = reader.position().expect("position");
        let at_end = ends.iter().all(|(p, end)| {
            matches!(
                positions.find_partition(internal, *p).map(|e| e.offset()),
                Some(Offset::Offset(o)) if o >= *end
            )
        });
        if at_end {
            return true;
        }
    }
    false
}

/// Exactly-once in repartition mode, against a model of the input: every good input has
/// exactly one output naming it, with the right key; per user the running counts are
/// exactly 1..n (the order between input partitions is the hops' interleaving, so the
/// model fixes the set of counts, and their order within each input partition); every bad
/// input is dead-lettered once with its original bytes; the internal topic holds every
/// good input exactly once (no copy of an aborted epoch is visible).
fn check_repartitioned(job: &Job, internal: &str) -> (usize, usize) {
    let input = read_all(&job.input, true);
    let output = read_all(&job.output, true);
    let dlq = read_all(&job.dlq, true);
    let forwarded = read_all(internal, true);

    let mut good: BTreeMap<(i32, i64), String> = BTreeMap::new();
    let mut bad: BTreeMap<(i32, i64), Option<Vec<u8>>> = BTreeMap::new();
    for r in &input {
        let at = (r.partition, r.offset);
        if let Some(user) = user_of(r.value.as_deref()) {
            good.insert(at, user);
        } else {
            bad.insert(at, r.value.clone());
        }
    }

    let mut seen: BTreeMap<(i32, i64), u64> = BTreeMap::new();
    for r in &output {
        let v = r.json();
        let src = &v["source"];
        assert_eq!(
            src["topic"],
            job.input.as_str(),
            "output names its input: {v}"
        );
        let at = (
            src["partition"].as_i64().expect("source.partition") as i32,
            src["offset"].as_i64().expect("source.offset"),
        );
        let user = good
            .get(&at)
            .unwrap_or_else(|| panic!("output for a non-event input {at:?}: {v}"));
        assert_eq!(v["key"], user.as_str(), "wrong key at {at:?}");
        assert_eq!(
            r.key.as_deref(),
            Some(user.as_bytes()),
            "output key = state key"
        );
        let count = v["count"].as_u64().expect("count");
        assert!(
            seen.insert(at, count).is_none(),
            "duplicated output for input {at:?}"
        );
    }
    let missing: Vec<_> = good.keys().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "{} inputs have no output, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );
    let mut per_user: BTreeMap<&str, Vec<u64>> = BTreeMap::new();
    let mut per_user_partition: BTreeMap<(&str, i32), Vec<u64>> = BTreeMap::new();
    for (at, count) in &seen {
        let user = good[at].as_str();
        per_user.entry(user).or_default().push(*count);
        per_user_partition
            .entry((user, at.0))
            .or_default()
            .push(*count);
    }
    let spread = per_user_partition.len() as f64 / per_user.len() as f64;
    assert!(
        spread > 2.0,
        "the input must not be keyed by the state key: a user's events on {spread:.1} partitions on average"
    );
    for (user, counts) in &mut per_user {
        counts.sort_unstable();
        let expected: Vec<u64> = (1..=counts.len() as u64).collect();
        assert_eq!(*counts, expected, "running counts of {user}");
    }
    for ((user, p), counts) in &per_user_partition {
        assert!(
            counts.windows(2).all(|w| w[0] < w[1]),
            "counts of {user} from input partition {p} out of input order: {counts:?}"
        );
    }

    let mut dead = BTreeSet::new();
    for r in &dlq {
        assert_eq!(
            r.headers.get("streamstate.source.topic"),
            Some(&job.input),
            "dead letters name the input"
        );
        let at = (
            r.headers["streamstate.source.partition"]
                .parse()
                .expect("partition"),
            r.headers["streamstate.source.offset"]
                .parse()
                .expect("offset"),
        );
        let original = bad
            .get(&at)
            .unwrap_or_else(|| panic!("a good record went to the dead-letter topic: {at:?}"));
        assert_eq!(&r.value, original, "dead letter carries the original bytes");
        assert!(dead.insert(at), "{at:?} dead-lettered twice");
    }
    assert_eq!(dead.len(), bad.len(), "every bad record is dead-lettered");

    let mut copies = BTreeSet::new();
    for r in &forwarded {
        let at = (
            r.headers["streamstate.repartition.partition"]
                .parse::<i32>()
                .expect("partition"),
            r.headers["streamstate.repartition.offset"]
                .parse::<i64>()
                .expect("offset"),
        );
        let user = good
            .get(&at)
            .unwrap_or_else(|| panic!("forwarded a non-event {at:?}"));
        assert_eq!(
            r.key.as_deref(),
            Some(user.as_bytes()),
            "internal key = state key"
        );
        assert!(
            copies.insert(at),
            "input {at:?} forwarded twice (committed)"
        );
    }
    assert_eq!(copies.len(), good.len(), "every good input forwarded once");
    (output.len(), dead.len())
}

#[test]
fn repartitions_input_keyed_by_another_field_exactly_once_across_a_sigkill() {
    let job = Job::new("repartition", 3);
    job.write_config("300ms", "");
    let internal = format!("{}-repartition", job.app_id);
    let total = 8_000;
    let input = job.input.clone();
    let evs = session_events(total, 81);
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(500)));
    let mut running: Vec<Instance> = (0..2)
        .map(|i| spawn_instance(&job, i, 2, 0, true, &[]))
        .collect();
    wait_ready(&mut running);
    wait_until("outputs from both hops", Duration::from_secs(90), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        committed(&job, &internal, MAX_PARALLELISM)
            .values()
            .any(|o| *o > 0)
    });
    // Mid-run: both hops of instance 1 have open work in its epoch transaction.
    running[1].service.sigkill();
    let at_kill = job.committed();
    wait_until(
        "instance 0 goes on while instance 1 is down",
        Duration::from_secs(60),
        || {
            running[0].service.assert_running();
            job.committed() > at_kill + 100
        },
    );
    running[1] = spawn_instance(&job, 1, 2, 1, true, &[]);
    feeder.join().expect("feeder");
    wait_until("both hops caught up", Duration::from_secs(180), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        both_hops_done(&job, &internal)
    });
    for mut inst in running {
        assert_eq!(
            inst.service.terminate(Duration::from_secs(60)).code(),
            Some(0),
            "{}",
            inst.service.log()
        );
    }
    let (outputs, dead) = check_repartitioned(&job, &internal);
    assert_eq!(
        outputs + dead,
        total,
        "every input is an output or a dead letter, once"
    );
}

#[test]
fn rescales_2_to_1_in_repartition_mode_from_a_savepoint_set_exactly_once() {
    let job = Job::new("repartition-rescale", 3);
    job.write_config("300ms", "");
    let internal = format!("{}-repartition", job.app_id);
    let total = 6_000;
    let input = job.input.clone();
    let evs = session_events(total, 83);
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(500)));
    let mut running: Vec<Instance> = (0..2)
        .map(|i| spawn_instance(&job, i, 2, 0, true, &[]))
        .collect();
    wait_ready(&mut running);
    wait_until("outputs from both hops", Duration::from_secs(90), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        committed(&job, &internal, MAX_PARALLELISM)
            .values()
            .any(|o| *o > 0)
    });
    // Stopped one after the other while input flows: the second keeps forwarding to the
    // first one's internal partitions, which the new instance must read.
    for mut inst in running {
        let answer = http_with(
            "POST",
            inst.admin,
            "/stop",
            &[("Content-Type", "application/json")],
            br#"{"savepoint":true}"#,
        )
        .expect("POST /stop");
        assert_eq!(answer.status, 200, "{}", answer.body);
        assert_eq!(
            inst.service.wait_exit(Duration::from_secs(90)).code(),
            Some(0),
            "{}",
            inst.service.log()
        );
    }
    let out = std::process::Command::new(BIN)
        .args([
            "savepoint-set",
            "--name",
            "two",
            "--instances",
            "2",
            "--config",
        ])
        .arg(job.config_path())
        .output()
        .expect("savepoint-set");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let out = std::process::Command::new(BIN)
        .args(["rescale-plan", "--set", "two", "--config"])
        .arg(job.config_path())
        .env("STREAMSTATE__JOB__REPARTITION", "true")
        .env("STREAMSTATE__JOB__INSTANCES", "1")
        .output()
        .expect("rescale-plan");
    assert!(
        out.status.success(),
        "{}",
        String::from_utf8_lossy(&out.stderr)
    );
    let plan: serde_json::Value = serde_json::from_slice(&out.stdout).expect("plan JSON");
    let planned = plan[0]["offsets"].as_array().expect("offsets").len();
    assert_eq!(
        planned,
        3 + MAX_PARALLELISM as usize,
        "one instance resumes every input and internal partition: {plan}"
    );
    let mut one = spawn_instance(&job, 0, 1, 1, true, &["--from-savepoint-set", "two"]);
    feeder.join().expect("feeder");
    wait_until("both hops caught up", Duration::from_secs(180), || {
        one.service.assert_running();
        both_hops_done(&job, &internal)
    });
    assert_eq!(
        one.service.terminate(Duration::from_secs(60)).code(),
        Some(0),
        "{}",
        one.service.log()
    );
    let (outputs, dead) = check_repartitioned(&job, &internal);
    assert_eq!(
        outputs + dead,
        total,
        "every input is an output or a dead letter, once"
    );
}

#[test]
fn without_repartition_a_foreign_key_is_dead_lettered_not_processed() {
    let job = Job::new("no-repartition", MAX_PARALLELISM);
    job.write_config("300ms", "");
    let total = 2_000;
    produce_all(&job.input, &session_events(total, 82), None);
    let mut running: Vec<Instance> = (0..2)
        .map(|i| spawn_instance(&job, i, 2, 0, false, &[]))
        .collect();
    wait_ready(&mut running);
    let end = job.input_end();
    wait_until("all input committed", Duration::from_secs(120), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        job.committed() >= end
    });
    for mut inst in running {
        assert_eq!(
            inst.service.terminate(Duration::from_secs(60)).code(),
            Some(0)
        );
    }
    let output = read_all(&job.output, true);
    let dlq = read_all(&job.dlq, true);
    let not_owned = dlq
        .iter()
        .filter(|r| r.headers["streamstate.error.reason"] == "key_not_owned")
        .count();
    assert!(
        not_owned > 0,
        "some users' key groups belong to the other instance"
    );
    assert_eq!(
        output.len() + dlq.len(),
        total,
        "each input once, as output or dead letter"
    );
    for r in &output {
        let v = r.json();
        let kg = key_group(v["key"].as_str().expect("key"));
        let p = v["source"]["partition"].as_i64().expect("partition") as i32;
        let owner = |x: i32| x * 2 / MAX_PARALLELISM;
        assert_eq!(
            owner(kg),
            owner(p),
            "processed by the instance owning its key: {v}"
        );
    }
}

#[test]
fn an_internal_topic_with_other_partitions_refuses_the_start() {
    let job = Job::new("repartition-mismatch", 2);
    job.write_config("300ms", "");
    let internal = format!("{}-repartition", job.app_id);
    create_topics(&[(&internal, 3)]);
    let mut inst = spawn_instance(&job, 0, 1, 0, true, &[]);
    let status = inst.service.wait_exit(Duration::from_secs(60));
    let log = inst.service.log();
    assert!(!status.success(), "{log}");
    assert!(
        log.contains(&format!(
            "`{internal}` has 3 partitions but state.max_parallelism is 8"
        )),
        "{log}"
    );
}

/// The state layer's key group (Kafka's murmur2 partitioner).
fn key_group(key: &str) -> i32 {
    streamstate::state::key_group_for(key.as_bytes(), MAX_PARALLELISM as u32) as i32
}
