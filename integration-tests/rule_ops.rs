//! Operating rules safely on the real broker: a shadow rule is evaluated and counted but
//! emits nothing until a new version promotes it; `POST /rules/{id}/rollback` republishes
//! the previous version through the control topic and every instance applies it.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::Duration;

use common::*;
use rdkafka::consumer::Consumer;
use serde_json::{Value, json};

const TOKEN: &str = "t0ken-for-rule-ops";

fn rules_job(name: &str, partitions: i32) -> Job {
    let mut job = Job::new(name, partitions);
    job.function = "rules";
    job.write_config("300ms", &format!("token = \"{TOKEN}\"\n"));
    job
}

fn count_rule(version: u64, status: &str) -> Value {
    json!({"id": "cnt", "version": version, "status": status, "kind": "aggregate",
           "aggregate": {"fn": "count", "emit": "every_event"}})
}

fn sum_rule(version: u64) -> Value {
    json!({"id": "cnt", "version": version, "kind": "aggregate",
           "aggregate": {"fn": "sum", "field": "/amount", "emit": "every_event"}})
}

fn publish(job: &Job, rule: &Value) {
    let id = rule["id"].as_str().expect("id").to_string();
    produce_rules(&job.control, &[(id, Some(rule.to_string()))]);
}

fn get_json(admin: SocketAddr, path: &str) -> Option<Value> {
    let a = http_with("GET", admin, path, &[], b"").ok()?;
    (a.status == 200).then(|| a.json())
}

fn rollback(admin: SocketAddr, id: &str, token: bool) -> Answer {
    let auth = format!("Bearer {TOKEN}");
    let headers: Vec<(&str, &str)> = if token {
        vec![("Authorization", auth.as_str())]
    } else {
        vec![]
    };
    http_with(
        "POST",
        admin,
        &format!("/rules/{id}/rollback"),
        &headers,
        b"",
    )
    .unwrap_or_else(|e| panic!("POST rollback: {e}"))
}

/// Next offset per input partition: everything produced from now on is at or above it.
fn input_ends(job: &Job) -> BTreeMap<i32, i64> {
    let c = consumer(None, false);
    (0..job.partitions)
        .map(|p| {
            let (_, high) = c
                .fetch_watermarks(&job.input, p, Duration::from_secs(10))
                .expect("watermarks");
            (p, high)
        })
        .collect()
}

fn scrape(admin: SocketAddr) -> String {
    let (status, text) = http("GET", admin, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    text
}

#[test]
fn shadow_rule_emits_nothing_while_its_match_count_rises_and_promotion_starts_emitting() {
    let job = rules_job("rule-shadow", 2);
    publish(&job, &count_rule(1, "shadow"));
    let mut service = job.spawn();
    wait_until("the shadow rule in force", Duration::from_secs(60), || {
        service.assert_running();
        get_json(job.admin, "/rules/cnt").is_some_and(|r| r["status"] == "shadow")
    });
    let evs = events(400, 0, 5);
    produce_all(&job.input, &evs[..200], None);
    wait_all_committed(&job, &mut service);
    wait_until(
        "/rules to count 200 matches",
        Duration::from_secs(30),
        || get_json(job.admin, "/rules").is_some_and(|l| l[0]["matches"] == 200),
    );
    let text = scrape(job.admin);
    assert_eq!(
        metric_sum(
            &text,
            "streamstate_rule_matches_by_rule_total{rule=\"cnt\"}"
        ),
        200.0,
        "{text}"
    );
    assert_eq!(
        metric_sum(
            &text,
            "streamstate_rule_shadow_suppressed_outputs_total{rule=\"cnt\"}"
        ),
        200.0
    );
    assert_eq!(
        metric_sum(
            &text,
            "streamstate_rule_outputs_by_rule_total{rule=\"cnt\"}"
        ),
        0.0,
        "a shadow rule's suppressed outputs are not outputs"
    );
    assert_eq!(
        get_json(job.admin, "/rules/cnt").expect("rule")["outputs"],
        0
    );
    // Every input offset is committed, and outputs commit in the same transactions: a
    // shadow rule's output would be visible by now.
    let out = read_all(&job.output, true);
    assert!(
        out.is_empty(),
        "a shadow rule emitted {} records",
        out.len()
    );
    assert!(
        read_all(&job.dlq, true).is_empty(),
        "nothing was dead-lettered"
    );

    publish(&job, &count_rule(2, "active"));
    wait_until("v2 (active) in force", Duration::from_secs(60), || {
        service.assert_running();
        get_json(job.admin, "/rules/cnt")
            .is_some_and(|r| r["version"] == 2 && r["status"] == "active")
    });
    let from = input_ends(&job);
    produce_all(&job.input, &evs[200..], None);
    wait_all_committed(&job, &mut service);
    let out: Vec<Value> = read_all(&job.output, true)
        .iter()
        .map(Record::json)
        .collect();
    assert_eq!(out.len(), 200, "one output per event after the promotion");
    let mut counts: HashMap<String, u64> = HashMap::new();
    for v in &out {
        assert_eq!(v["rule_version"], 2, "{v}");
        let (p, o) = (
            v["source"]["partition"].as_i64().expect("partition") as i32,
            v["source"]["offset"].as_i64().expect("offset"),
        );
        assert!(
            o >= from[&p],
            "output for input {p}:{o}, before the promotion"
        );
        let key = v["key"].as_str().expect("key").to_string();
        let n = counts.entry(key).or_default();
        *n = (*n).max(v["value"].as_u64().expect("count"));
    }
    // The new version starts its state afresh: the counts are those of the second half.
    let mut expected: HashMap<String, u64> = HashMap::new();
    for (_, e) in &evs[200..] {
        *expected.entry(user_of(Some(e)).expect("user")).or_default() += 1;
    }
    assert_eq!(counts, expected);
    assert_eq!(
        get_json(job.admin, "/rules/cnt").expect("rule")["matches"],
        400,
        "matches count every version of the rule"
    );
    assert_eq!(
        get_json(job.admin, "/rules/cnt").expect("rule")["outputs"],
        200,
        "outputs count what the active version emitted"
    );
    assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
}

/// Instance `i` of 2: its own admin port, state directory and log.
fn spawn_instance(job: &Job, i: u32) -> (Service, SocketAddr) {
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let state = job.dir.path().join(format!("state-{i}"));
    let (n, listen, state) = (
        i.to_string(),
        admin.to_string(),
        state.display().to_string(),
    );
    let env = [
        ("STREAMSTATE__JOB__INSTANCE", n.as_str()),
        ("STREAMSTATE__JOB__INSTANCES", "2"),
        ("STREAMSTATE__ADMIN__LISTEN", listen.as_str()),
        ("STREAMSTATE__STATE__DIR", state.as_str()),
    ];
    let log = job.dir.path().join(format!("instance-{i}.log"));
    (Service::spawn(&job.config_path(), &log, &[], &env), admin)
}

fn versions(rule: &Value) -> Vec<u64> {
    rule["history"]
        .as_array()
        .map(|h| h.iter().filter_map(|v| v["version"].as_u64()).collect())
        .unwrap_or_default()
}

#[test]
fn rollback_republishes_the_previous_version_and_every_instance_applies_it() {
    let job = rules_job("rule-rollback", 2);
    publish(&job, &count_rule(1, "active"));
    publish(&job, &sum_rule(2));
    publish(
        &job,
        &json!({"id": "solo", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}}),
    );
    let mut instances: Vec<(Service, SocketAddr)> =
        (0..2).map(|i| spawn_instance(&job, i)).collect();
    for (service, admin) in instances.iter_mut() {
        wait_until("v2 in force and ready", Duration::from_secs(90), || {
            service.assert_running();
            http("GET", *admin, "/readyz").is_ok_and(|(s, _)| s == 200)
                && get_json(*admin, "/rules/cnt").is_some_and(|r| r["version"] == 2)
                && get_json(*admin, "/rules/solo").is_some()
        });
        let rule = get_json(*admin, "/rules/cnt").expect("rule");
        assert_eq!(versions(&rule), vec![1, 2], "{rule}");
        assert_eq!(rule["history"][0]["rule"], count_rule(1, "active"));
    }
    let admin0 = instances[0].1;

    let denied = rollback(admin0, "cnt", false);
    assert_eq!(denied.status, 401, "{}", denied.body);
    let unknown = rollback(admin0, "nope", true);
    assert_eq!(unknown.status, 404, "{}", unknown.body);
    let single = rollback(admin0, "solo", true);
    assert_eq!(single.status, 409, "{}", single.body);
    assert!(
        single.json()["error"]
            .as_str()
            .is_some_and(|e| e.contains("no earlier version"))
    );

    let done = rollback(admin0, "cnt", true);
    assert_eq!(done.status, 202, "{}", done.body);
    let answer = done.json();
    assert_eq!(answer["version"], 3, "{answer}");
    assert_eq!(answer["rolled_back_from"], 2);
    let mut v1_as_v3 = count_rule(1, "active");
    v1_as_v3["version"] = json!(3);
    assert_eq!(answer["rule"], v1_as_v3);
    // The publish is an ordinary control record, keyed by the rule id.
    let control = read_all(&job.control, true);
    let last = control.last().expect("control records");
    assert_eq!(last.key.as_deref(), Some(b"cnt".as_slice()));
    assert_eq!(last.json(), v1_as_v3);

    for (service, admin) in instances.iter_mut() {
        wait_until("the rollback applied", Duration::from_secs(60), || {
            service.assert_running();
            get_json(*admin, "/rules/cnt").is_some_and(|r| r["version"] == 3)
        });
        let rule = get_json(*admin, "/rules/cnt").expect("rule");
        assert_eq!(rule["rule"], v1_as_v3, "instance at {admin}");
        assert_eq!(versions(&rule), vec![1, 2, 3]);
    }

    let from = input_ends(&job);
    let evs = events(300, 0, 9);
    produce_all(&job.input, &evs, None);
    let end = job.input_end();
    wait_until("all input committed", Duration::from_secs(120), || {
        for (service, _) in instances.iter_mut() {
            service.assert_running();
        }
        job.committed() >= end
    });
    let outs: Vec<Value> = read_all(&job.output, true)
        .iter()
        .map(Record::json)
        .filter(|v| v["rule_id"] == "cnt")
        .collect();
    assert_eq!(outs.len(), 300, "one output per event from v3");
    for v in &outs {
        assert_eq!(v["rule_version"], 3, "{v}");
        assert_eq!(v["fn"], "count", "v1 semantics (count), not v2's sum: {v}");
        let (p, o) = (
            v["source"]["partition"].as_i64().expect("partition") as i32,
            v["source"]["offset"].as_i64().expect("offset"),
        );
        assert!(o >= from[&p]);
    }
    for (mut service, _) in instances {
        assert_eq!(service.terminate(Duration::from_secs(30)).code(), Some(0));
    }
}
