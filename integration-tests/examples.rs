//! The two `examples/` process functions, run as their own binaries on the real broker.

mod common;

use std::collections::{BTreeMap, BTreeSet};
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

/// Per user, actions in order; `pay` right after `login` is the pattern.
fn actions(n: usize, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    let kinds = ["login", "pay", "browse", "logout"];
    (0..n)
        .map(|i| {
            let user = format!("user-{}", rng.random_range(0..50));
            let action = kinds[rng.random_range(0..kinds.len())];
            (
                Some(user.clone()),
                format!(r#"{{"user_id":"{user}","action":"{action}","seq":{i}}}"#).into_bytes(),
            )
        })
        .collect()
}

#[test]
fn pattern_detector_emits_each_login_then_pay_once_across_a_crash() {
    let job = Job::new("pattern", 2);
    job.write_config("300ms", "");
    produce_rules(
        &job.control,
        &[
            (
                "login-pay".into(),
                Some(r#"{"id":"login-pay","version":1,"first":"login","second":"pay"}"#.into()),
            ),
            (
                "broken".into(),
                Some(r#"{"id":"broken","version":1,"first":"login"}"#.into()),
            ),
        ],
    );
    let input = actions(3_000, 7);
    let (first, second) = input.split_at(1_500);
    produce_all(&job.input, first, None);
    let mut service = job.spawn_example("pattern_detector", &[]);
    wait_until("some input committed", Duration::from_secs(60), || {
        service.assert_running();
        job.committed() > 0
    });
    service.sigkill();
    produce_all(&job.input, second, Some(3_000));
    let mut service = job.spawn_example("pattern_detector", &[]);
    wait_all_committed(&job, &mut service);

    // Model: per partition in offset order, per user the previous action.
    let mut records = read_all(&job.input, true);
    records.sort_by_key(|r| (r.partition, r.offset));
    let mut previous: BTreeMap<String, String> = BTreeMap::new();
    let mut expected = BTreeSet::new();
    for r in &records {
        let v = r.json();
        let (user, action) = (
            v["user_id"].as_str().expect("user").to_string(),
            v["action"].as_str().expect("action"),
        );
        if previous.get(&user).map(String::as_str) == Some("login") && action == "pay" {
            expected.insert((r.partition, r.offset, user.clone()));
        }
        previous.insert(user, action.to_string());
    }
    assert!(
        expected.len() > 50,
        "the input must contain the pattern often ({})",
        expected.len()
    );
    let mut seen = BTreeSet::new();
    for r in read_all(&job.output, true) {
        let v = r.json();
        assert_eq!(v["pattern"], "login-pay", "{v}");
        let at = (
            v["source"]["partition"].as_i64().expect("partition") as i32,
            v["source"]["offset"].as_i64().expect("offset"),
            v["user_id"].as_str().expect("user").to_string(),
        );
        assert!(seen.insert(at.clone()), "duplicate match {at:?}");
    }
    assert_eq!(
        seen, expected,
        "matches must equal the model's, exactly once"
    );
    let refused: Vec<_> = read_all(&job.dlq, true)
        .into_iter()
        .filter(|r| {
            r.headers
                .get("streamstate.error.reason")
                .map(String::as_str)
                == Some("pattern_invalid")
        })
        .collect();
    assert_eq!(
        refused.len(),
        1,
        "the broken pattern is refused once, with its reason"
    );
    assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
}

#[test]
fn buffering_sink_restores_its_buffer_from_operator_state_after_a_crash() {
    const BATCH: usize = 7;
    let job = Job::new("buffering", 1);
    job.write_config("200ms", "");
    let input: Vec<(Option<String>, Vec<u8>)> = (0..BATCH * 100)
        .map(|i| {
            (
                Some(format!("k{}", i % 13)),
                format!(r#"{{"user_id":"k{}","seq":{i}}}"#, i % 13).into_bytes(),
            )
        })
        .collect();
    let env = [("BUFFERING_SINK_BATCH", "7")];
    produce_all(&job.input, &input[..350], None);
    let mut service = job.spawn_example("buffering_sink", &env);
    wait_until(
        "a checkpoint with input committed",
        Duration::from_secs(60),
        || {
            service.assert_running();
            job.committed() > 0
        },
    );
    service.sigkill();
    let log_before = service.log().len();
    produce_all(&job.input, &input[350..], Some(2_000));
    let mut service = job.spawn_example("buffering_sink", &env);
    wait_all_committed(&job, &mut service);
    assert!(
        service.log()[log_before..].contains("buffer restored from operator state"),
        "the restarted sink must take the is_restored path"
    );
    // Every batch is full, and the batches concatenated are the input, in order, once.
    let mut elements = Vec::new();
    for r in read_all(&job.output, true) {
        let batch = r.json()["batch"].as_array().expect("batch").clone();
        assert_eq!(batch.len(), BATCH, "every emitted batch is full");
        elements.extend(batch.into_iter().map(|e| e["seq"].as_u64().expect("seq")));
    }
    let expected: Vec<u64> = (0..(BATCH * 100) as u64).collect();
    assert_eq!(elements, expected, "each input exactly once, in order");
    assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
}
