//! The admin API against a running instance on the real broker: checkpoints (trigger,
//! list, inspect, restore), savepoints and stop-with-savepoint with an exactly-once
//! restart from the savepoint, state lookup against the reference model, rules, the
//! token, bad ids and bodies, `/metrics` names, types and counts, SIGTERM under load,
//! and the Grafana dashboard and alert rules against the metrics the service exposes.

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

const TOKEN: &str = "t0ken-for-tests";

fn bearer() -> (&'static str, String) {
    ("Authorization", format!("Bearer {TOKEN}"))
}

fn call(admin: SocketAddr, method: &str, path: &str, token: bool, body: &[u8]) -> Answer {
    let auth = bearer();
    let headers: Vec<(&str, &str)> = if token {
        vec![(auth.0, auth.1.as_str())]
    } else {
        vec![]
    };
    http_with(method, admin, path, &headers, body)
        .unwrap_or_else(|e| panic!("{method} {path}: {e}"))
}

fn wait_ready(job: &Job, service: &mut Service) {
    wait_until("/readyz to answer 200", Duration::from_secs(60), || {
        service.assert_running();
        http("GET", job.admin, "/readyz").is_ok_and(|(s, _)| s == 200)
    });
}

fn scrape(admin: SocketAddr) -> String {
    let (status, text) = http("GET", admin, "/metrics").expect("metrics");
    assert_eq!(status, 200);
    text
}

/// The reference model's state: good events per user.
fn model_counts(evs: &[(Option<String>, Vec<u8>)]) -> HashMap<String, u64> {
    let mut counts = HashMap::new();
    for (_, v) in evs {
        if let Some(user) = user_of(Some(v)) {
            *counts.entry(user).or_default() += 1;
        }
    }
    counts
}

fn offsets_sum(v: &Value) -> i64 {
    v.as_array()
        .expect("offsets")
        .iter()
        .map(|o| o["offset"].as_i64().expect("offset"))
        .sum()
}

#[test]
fn checkpoints_state_rules_tokens_and_bad_requests() {
    let job = Job::new("admin", 4);
    job.write_config("60s", &format!("token = \"{TOKEN}\"\n"));
    let evs = events(3_000, 0, 11);
    produce_all(&job.input, &evs, None);
    produce_rules(&job.control, &rule_records(0));
    // Every API-triggered checkpoint holds the loop for 1.5 s, so a second trigger
    // surely meets the first one in flight.
    // A 60 s interval (so the only checkpoint is the one the test triggers) needs a longer
    // transaction timeout than the test config's.
    let long = ("STREAMSTATE__KAFKA__TRANSACTION_TIMEOUT", "120s");
    let mut service = job.spawn_with(&[], &[("FAILPOINTS", "admin-checkpoint=sleep(1500)"), long]);
    wait_ready(&job, &mut service);
    let a = call(job.admin, "GET", "/livez", false, b"");
    assert_eq!(
        (a.status, a.json()["status"].as_str()),
        (200, Some("alive")),
        "{}",
        a.body
    );
    wait_until(
        "every input record consumed",
        Duration::from_secs(120),
        || {
            service.assert_running();
            metric_sum(&scrape(job.admin), "streamstate_records_consumed_total") as usize
                == evs.len()
        },
    );

    // The token guards mutating endpoints and state lookups.
    let a = call(job.admin, "POST", "/checkpoints", false, b"");
    assert_eq!(a.status, 401, "{}", a.body);
    assert!(a.head.contains("www-authenticate: bearer"), "{}", a.head);
    let wrong = http_with(
        "POST",
        job.admin,
        "/checkpoints",
        &[("Authorization", "Bearer nope")],
        b"",
    )
    .expect("post");
    assert_eq!(wrong.status, 401);
    assert_eq!(
        call(job.admin, "GET", "/state/user-1", false, b"").status,
        401
    );
    assert_eq!(call(job.admin, "POST", "/stop", false, b"").status, 401);

    // Two triggers at once: one checkpoint, one 409.
    let (first, second) = std::thread::scope(|s| {
        let one = s.spawn(|| call(job.admin, "POST", "/checkpoints", true, b""));
        std::thread::sleep(Duration::from_millis(300));
        let two = s.spawn(|| call(job.admin, "POST", "/checkpoints", true, b""));
        (one.join().expect("first"), two.join().expect("second"))
    });
    assert_eq!(
        (first.status, second.status),
        (200, 409),
        "{} / {}",
        first.body,
        second.body
    );
    let record = first.json();
    let (id, name) = (
        record["id"].as_u64().expect("id"),
        record["name"].as_str().expect("name").to_string(),
    );
    assert_eq!(record["status"], "completed");
    assert_eq!(record["trigger"], "manual");
    assert_eq!(
        offsets_sum(&record["offsets"]),
        evs.len() as i64,
        "{record}"
    );
    assert!(
        record["size_bytes"].as_u64() > Some(0)
            && record["end_time_ms"].as_u64() >= record["start_time_ms"].as_u64()
    );
    // The group's read can fail for a moment (and then sums to 0): ask until it answers.
    wait_until(
        "the triggered checkpoint's offsets read back as the group's committed offsets",
        Duration::from_secs(30),
        || job.committed() == evs.len() as i64,
    );

    // Listed and inspectable; bad ids are 400, unknown ones 404.
    let list = call(job.admin, "GET", "/checkpoints", false, b"").json();
    assert!(
        list.as_array()
            .expect("list")
            .iter()
            .any(|c| c["name"] == name.as_str() && c["status"] == "completed"),
        "{list}"
    );
    for path in [format!("/checkpoints/{id}"), format!("/checkpoints/{name}")] {
        let a = call(job.admin, "GET", &path, false, b"");
        assert_eq!(
            (a.status, a.json()["name"].as_str()),
            (200, Some(name.as_str())),
            "{path}"
        );
    }
    for (path, status) in [
        ("/checkpoints/abc", 400),
        ("/checkpoints/..%2F..%2Fetc%2Fpasswd", 400),
        ("/checkpoints/chk-1-..", 400),
        ("/checkpoints/987654", 404),
        ("/checkpoints/chk-987654-0badcafe", 404),
        ("/no/such/endpoint", 404),
    ] {
        let a = call(job.admin, "GET", path, false, b"");
        assert_eq!(a.status, status, "{path}: {}", a.body);
        assert!(a.json()["error"].is_string(), "{path}: errors are JSON");
    }

    // State lookup equals the reference model for sampled keys.
    let counts = model_counts(&evs);
    let mut users: Vec<&String> = counts.keys().collect();
    users.sort();
    for user in users.iter().step_by(users.len() / 20) {
        let a = call(job.admin, "GET", &format!("/state/{user}"), true, b"");
        assert_eq!(a.status, 200, "{user}: {}", a.body);
        let v = a.json();
        assert_eq!(v["key"], user.as_str());
        assert_eq!(v["states"]["count"]["kind"], "value");
        assert_eq!(
            v["states"]["count"]["entries"],
            json!([{"namespace": "", "value": counts[*user], "expires_at_ms": null}]),
            "{user}"
        );
    }
    assert_eq!(
        call(job.admin, "GET", "/state/nobody-has-this-key", true, b"").status,
        404
    );
    assert_eq!(
        call(
            job.admin,
            "GET",
            &format!("/state/{}", "k".repeat(5000)),
            true,
            b""
        )
        .status,
        400
    );

    // Rules: list (checked against the rules model) and one by id.
    check_rules(&job, &mut service);
    let a = call(job.admin, "GET", "/rules/r-a", false, b"");
    assert_eq!(
        (a.status, a.json()["version"].as_u64()),
        (200, Some(2)),
        "{}",
        a.body
    );
    assert_eq!(a.json()["status"], "active");
    assert!(
        a.json()["control_offset"].is_i64() && a.json()["applied_at_ms"].is_u64(),
        "{}",
        a.body
    );
    assert_eq!(
        call(job.admin, "GET", "/rules/nope", false, b"").status,
        404
    );

    // Bodies: capped, parsed strictly; targets never escape the allowed roots.
    let big = format!(r#"{{"target":"{}"}}"#, "x".repeat(70 * 1024));
    assert_eq!(
        call(job.admin, "POST", "/savepoints", true, big.as_bytes()).status,
        413
    );
    let chk = job.checkpoint_dir().display().to_string();
    for body in [
        "{nope".to_string(),
        r#"{"bogus": 1}"#.to_string(),
        r#"{"target": "file:///etc/streamstate"}"#.to_string(),
        format!(r#"{{"target": "file://{chk}/../../x"}}"#),
        r#"{"target": "s3://some-bucket/x"}"#.to_string(),
        r#"{"target": "ftp://x/y"}"#.to_string(),
    ] {
        let a = call(job.admin, "POST", "/savepoints", true, body.as_bytes());
        assert_eq!(a.status, 400, "{body}: {}", a.body);
    }
    assert_eq!(
        call(job.admin, "POST", "/stop", true, br#"{"savepoint": "yes"}"#).status,
        400
    );
    service.assert_running();

    // Restorable: after a crash the restart restores exactly the triggered checkpoint
    // (the 60 s interval took no other).
    service.sigkill();
    let mut service = job.spawn_with(&[], &[long]);
    wait_ready(&job, &mut service);
    let log = service.log();
    assert!(
        log.contains("restored state from checkpoint") && log.contains(&name),
        "must restore {name}; log:\n{log}"
    );
    let list = call(job.admin, "GET", "/checkpoints", false, b"").json();
    assert!(
        list.as_array()
            .expect("list")
            .iter()
            .any(|c| c["name"] == name.as_str() && c["trigger"] == "restored"),
        "{list}"
    );
    let a = call(job.admin, "GET", &format!("/state/{}", users[0]), true, b"");
    assert_eq!(
        a.json()["states"]["count"]["entries"][0]["value"].as_u64(),
        Some(counts[users[0]]),
        "state after restore"
    );
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let (outputs, _) = check_exactly_once(&job);
    assert_eq!(outputs, evs.len());
}

#[test]
fn stop_with_savepoint_then_restart_from_it_is_exactly_once() {
    stop_with_savepoint(Storage::File);
}

#[test]
fn stop_with_savepoint_then_restart_from_it_is_exactly_once_on_s3_storage() {
    stop_with_savepoint(Storage::S3);
}

fn stop_with_savepoint(storage: Storage) {
    let job = Job::new("savepoint", 4);
    let env = configure(&job, storage, "300ms");
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let first = events(4_000, 5, 21);
    produce_all(&job.input, &first, None);
    let mut service = job.spawn_with(&[], &env);
    wait_all_committed(&job, &mut service);

    // A savepoint while running: listed, and the job keeps going.
    let a = call(job.admin, "POST", "/savepoints", false, b"");
    assert_eq!(a.status, 200, "{}", a.body);
    let early = a.json();
    let early_id = early["id"].as_str().expect("id").to_string();
    assert!(early_id.starts_with("sp-"), "{early}");
    assert_eq!(offsets_sum(&early["offsets"]), first.len() as i64);
    let listed = call(job.admin, "GET", "/savepoints", false, b"").json();
    assert!(
        listed
            .as_array()
            .expect("list")
            .iter()
            .any(|s| s["id"] == early_id.as_str()),
        "{listed}"
    );
    let trig = call(job.admin, "GET", "/checkpoints", false, b"").json();
    assert!(
        trig.as_array()
            .expect("list")
            .iter()
            .any(|c| c["trigger"] == "savepoint"),
        "{trig}"
    );

    // Stop with a savepoint: answers with it, then exits 0.
    let a = call(job.admin, "POST", "/stop", false, br#"{"savepoint": true}"#);
    assert_eq!(a.status, 200, "{}", a.body);
    let stopped = a.json();
    assert_eq!(stopped["stopped"], true);
    let sp = stopped["savepoint"]["id"]
        .as_str()
        .expect("savepoint id")
        .to_string();
    let status = service.wait_exit(Duration::from_secs(60));
    assert!(
        status.success(),
        "stop must exit 0, got {status}; log:\n{}",
        service.log()
    );
    assert_eq!(job.committed(), first.len() as i64);

    // More input while stopped; the restart from the savepoint continues every count.
    let second = events(4_000, 5, 22);
    produce_all(&job.input, &second, None);
    let mut service = job.spawn_with(&["--from-savepoint", &sp], &env);
    wait_all_committed(&job, &mut service);
    let log = service.log();
    assert!(
        log.contains("restored state from savepoint") && log.contains(&sp),
        "log:\n{log}"
    );
    let listed = call(job.admin, "GET", "/savepoints", false, b"").json();
    for id in [&early_id, &sp] {
        assert!(
            listed
                .as_array()
                .expect("list")
                .iter()
                .any(|s| s["id"] == id.as_str()),
            "{id} not in {listed}"
        );
    }
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let (outputs, _) = check_exactly_once(&job);
    let good = [&first, &second]
        .iter()
        .flat_map(|e| e.iter())
        .filter(|(_, v)| user_of(Some(v)).is_some())
        .count();
    assert_eq!(outputs, good);

    // The same savepoint again would repeat everything after it: refused, clearly.
    let mut again = job.spawn_with(&["--from-savepoint", &sp], &env);
    let status = again.wait_exit(Duration::from_secs(60));
    assert!(
        !status.success(),
        "restoring a stale savepoint must be refused"
    );
    let log = again.log();
    assert!(
        log.contains("differ from the savepoint's") && log.contains("--ignore-committed-offsets"),
        "log:\n{log}"
    );
    // Ids are checked before anything is read.
    let mut bad = job.spawn_with(&["--from-savepoint", "../../etc"], &env);
    assert!(!bad.wait_exit(Duration::from_secs(60)).success());
    assert!(
        bad.log().contains("not a savepoint id"),
        "log:\n{}",
        bad.log()
    );
}

/// `# TYPE` lines of a Prometheus text page: name → type.
fn metric_types(text: &str) -> BTreeMap<String, String> {
    text.lines()
        .filter_map(|l| l.strip_prefix("# TYPE "))
        .filter_map(|l| l.split_once(' '))
        .map(|(n, t)| (n.to_string(), t.to_string()))
        .collect()
}

#[test]
fn metrics_have_names_types_and_counts_that_match_the_input() {
    let job = Job::new("metrics", 2);
    job.write_config("300ms", "");
    let evs = events(3_000, 10, 31);
    let bad = evs
        .iter()
        .filter(|(_, v)| user_of(Some(v)).is_none())
        .count();
    produce_all(&job.input, &evs, None);
    produce_rules(&job.control, &rule_records(0));
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    check_rules(&job, &mut service);
    wait_until("consumer lag to reach 0", Duration::from_secs(30), || {
        let text = scrape(job.admin);
        text.contains("streamstate_consumer_lag_records{")
            && metric_sum(&text, "streamstate_consumer_lag_records") == 0.0
    });
    let text = scrape(job.admin);
    let types = metric_types(&text);
    for (name, kind) in [
        ("streamstate_records_consumed_total", "counter"),
        ("streamstate_records_produced_total", "counter"),
        ("streamstate_records_dead_lettered_total", "counter"),
        ("streamstate_processing_duration_seconds", "histogram"),
        ("streamstate_consumer_lag_records", "gauge"),
        ("streamstate_watermark_lag_seconds", "gauge"),
        ("streamstate_checkpoint_duration_seconds", "histogram"),
        ("streamstate_checkpoint_phase_duration_seconds", "histogram"),
        ("streamstate_last_checkpoint_size_bytes", "gauge"),
        (
            "streamstate_last_checkpoint_incremental_size_bytes",
            "gauge",
        ),
        (
            "streamstate_last_checkpoint_completed_timestamp_seconds",
            "gauge",
        ),
        ("streamstate_checkpoints_completed_total", "counter"),
        ("streamstate_checkpoints_failed_total", "counter"),
        ("streamstate_time_since_last_checkpoint_seconds", "gauge"),
        ("streamstate_restore_duration_seconds", "histogram"),
        ("streamstate_restore_size_bytes", "gauge"),
        ("streamstate_checkpoint_interval_seconds", "gauge"),
        ("streamstate_state_size_bytes", "gauge"),
        ("streamstate_state_keys", "gauge"),
        ("streamstate_state_ttl_expired_total", "counter"),
        ("streamstate_rules_active", "gauge"),
        ("streamstate_rule_updates_total", "counter"),
        ("streamstate_transactions_total", "counter"),
        ("streamstate_transaction_open_age_seconds", "gauge"),
        ("streamstate_transaction_timeout_seconds", "gauge"),
        ("streamstate_transaction_near_timeout_total", "counter"),
        ("streamstate_http_requests_total", "counter"),
        ("streamstate_http_request_duration_seconds", "histogram"),
        ("streamstate_build_info", "gauge"),
    ] {
        assert_eq!(
            types.get(name).map(String::as_str),
            Some(kind),
            "{name} must be a {kind}; page:\n{text}"
        );
    }
    for (name, kind) in &types {
        assert!(name.starts_with("streamstate_"), "{name}");
        if kind == "counter" {
            assert!(
                name.ends_with("_total"),
                "counter {name} must end in _total"
            );
        }
    }
    // Counters equal what the test produced.
    assert_eq!(
        metric_sum(&text, "streamstate_records_consumed_total") as usize,
        evs.len()
    );
    assert_eq!(
        metric_sum(&text, "streamstate_records_produced_total") as usize,
        evs.len() - bad
    );
    assert_eq!(
        metric_sum(&text, "streamstate_records_dead_lettered_total") as usize,
        bad
    );
    assert!(
        text.contains("streamstate_records_dead_lettered_total{partition="),
        "dead letters by topic, partition, reason"
    );
    assert_eq!(
        metric_sum(&text, "streamstate_processing_duration_seconds_count") as usize,
        evs.len() + rule_records(0).len()
    );
    let (rules, rejected) = rules_model(&job);
    assert_eq!(
        metric_sum(&text, "streamstate_rules_active") as usize,
        rules.values().filter(|(_, deleted)| !deleted).count()
    );
    let rejected_line = format!(
        "streamstate_rule_updates_total{{outcome=\"rejected\"}} {}",
        rejected.len()
    );
    assert!(text.contains(&rejected_line), "{rejected_line} in:\n{text}");
    let completed = metric_sum(&text, "streamstate_checkpoints_completed_total");
    assert!(completed >= 1.0);
    // Every committed checkpoint times its three phases (a scrape may fall between the
    // phases' observation and the completed counter).
    for phase in ["snapshot", "upload", "commit"] {
        let count = metric_sum(
            &text,
            &format!("streamstate_checkpoint_phase_duration_seconds_count{{phase=\"{phase}\"}}"),
        );
        assert!(
            count == completed || count == completed + 1.0,
            "phase {phase}: {count} observations, {completed} checkpoints"
        );
    }
    assert!(text.contains("streamstate_transactions_total{outcome=\"committed\"}"));
    assert!(metric_sum(&text, "streamstate_last_checkpoint_size_bytes") > 0.0);
    assert!(metric_sum(&text, "streamstate_state_keys") > 0.0);
    assert!(metric_sum(&text, "streamstate_time_since_last_checkpoint_seconds") < 30.0);
    assert_eq!(metric_sum(&text, "streamstate_build_info"), 1.0);
    assert!(
        text.contains("streamstate_http_requests_total{route=\"/metrics\",status=\"200\"}"),
        "{text}"
    );
    // Another 3 records move the counters by 3.
    let more = events(3, 0, 32);
    produce_all(&job.input, &more, None);
    wait_until("3 more records consumed", Duration::from_secs(30), || {
        metric_sum(&scrape(job.admin), "streamstate_records_consumed_total") as usize
            == evs.len() + 3
    });
    wait_until("3 more records produced", Duration::from_secs(30), || {
        metric_sum(&scrape(job.admin), "streamstate_records_produced_total") as usize
            == evs.len() - bad + 3
    });

    // Every metric the dashboard and the alert rules query exists on this page.
    let root = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards");
    for file in ["streamstate.json", "alerts.yaml"] {
        let body = std::fs::read_to_string(root.join(file)).expect("read");
        let names = queried_metrics(&body);
        assert!(
            names.len() >= 5,
            "{file} queries too few metrics: {names:?}"
        );
        for name in names {
            let base = ["_bucket", "_count", "_sum"]
                .iter()
                .find_map(|s| name.strip_suffix(s))
                .filter(|b| types.get(*b).is_some_and(|t| t == "histogram"));
            let base = base.unwrap_or(&name);
            assert!(
                types.contains_key(base),
                "{file} queries {name}, which /metrics does not have"
            );
        }
    }
    service.sigkill();
}

/// Metric names a PromQL-bearing file mentions.
fn queried_metrics(body: &str) -> Vec<String> {
    let mut out: Vec<String> = Vec::new();
    let bytes = body.as_bytes();
    let mut i = 0;
    while let Some(at) = body[i..].find("streamstate_") {
        let start = i + at;
        let mut end = start;
        while end < bytes.len() && (bytes[end].is_ascii_alphanumeric() || bytes[end] == b'_') {
            end += 1;
        }
        let preceded =
            start > 0 && (bytes[start - 1].is_ascii_alphanumeric() || bytes[start - 1] == b'_');
        if !preceded {
            out.push(body[start..end].to_string());
        }
        i = end;
    }
    out.sort();
    out.dedup();
    // Not metric names: the dashboard's own identifiers.
    out.retain(|n| n != "streamstate_" && !n.ends_with('_'));
    out
}

#[test]
fn dashboard_is_valid_grafana_json() {
    let path = std::path::Path::new(env!("CARGO_MANIFEST_DIR")).join("dashboards/streamstate.json");
    let d: Value = serde_json::from_str(&std::fs::read_to_string(&path).expect("read"))
        .expect("dashboard is JSON");
    // The fields Grafana's dashboard model (schemaVersion 39) requires to import a file.
    assert!(d["title"].as_str().is_some_and(|t| !t.is_empty()), "title");
    assert!(
        d["uid"]
            .as_str()
            .is_some_and(|u| !u.is_empty() && u.len() <= 40),
        "uid (≤ 40 chars)"
    );
    assert!(
        d["schemaVersion"].as_u64().is_some_and(|v| v >= 30),
        "schemaVersion"
    );
    assert!(
        d.get("id").is_none_or(Value::is_null),
        "id must be null for a provisioned dashboard"
    );
    assert!(
        d["time"]["from"].is_string() && d["time"]["to"].is_string(),
        "time range"
    );
    let vars = d["templating"]["list"].as_array().expect("templating.list");
    assert!(
        vars.iter()
            .any(|v| v["type"] == "datasource" && v["query"] == "prometheus"),
        "a Prometheus datasource variable"
    );
    let panels = d["panels"].as_array().expect("panels");
    let mut ids = std::collections::HashSet::new();
    let mut titles = Vec::new();
    let mut queries = 0;
    for p in panels {
        let id = p["id"].as_u64().expect("panel id");
        assert!(ids.insert(id), "panel id {id} repeats");
        let kind = p["type"].as_str().expect("panel type");
        assert!(
            ["timeseries", "stat", "gauge", "row", "table", "bargauge"].contains(&kind),
            "panel type {kind}"
        );
        let g = &p["gridPos"];
        for k in ["h", "w", "x", "y"] {
            assert!(g[k].is_u64(), "panel {id} gridPos.{k}");
        }
        assert!(
            g["x"].as_u64().unwrap_or(0) + g["w"].as_u64().unwrap_or(0) <= 24,
            "panel {id} exceeds the 24-column grid"
        );
        titles.push(p["title"].as_str().expect("panel title").to_lowercase());
        if kind == "row" {
            continue;
        }
        assert_eq!(
            p["datasource"]["uid"], "${datasource}",
            "panel {id} uses the datasource variable"
        );
        let targets = p["targets"].as_array().expect("targets");
        assert!(!targets.is_empty(), "panel {id} has no query");
        for t in targets {
            let expr = t["expr"].as_str().expect("expr");
            assert!(expr.contains("streamstate_"), "panel {id}: {expr}");
            assert!(t["refId"].is_string(), "panel {id} refId");
            assert_eq!(
                expr.matches('(').count(),
                expr.matches(')').count(),
                "panel {id}: unbalanced {expr}"
            );
            queries += 1;
        }
    }
    assert!(queries >= 12, "{queries} queries");
    for topic in [
        "throughput",
        "lag",
        "latency",
        "checkpoint",
        "state",
        "rule",
        "error",
    ] {
        assert!(
            titles.iter().any(|t| t.contains(topic)),
            "no panel about {topic}: {titles:?}"
        );
    }
    let alerts = std::fs::read_to_string(path.with_file_name("alerts.yaml")).expect("alerts");
    for alert in [
        "StreamstateNoCheckpoint",
        "StreamstateConsumerLagGrowing",
        "StreamstateDeadLetterRate",
    ] {
        assert!(
            alerts.contains(&format!("alert: {alert}")),
            "{alert} missing"
        );
    }
}

#[test]
fn sigterm_during_load_exits_zero_in_time_and_the_restart_has_no_gap_or_duplicate() {
    let job = Job::new("sigterm", 4);
    job.write_config("200ms", "");
    let evs = events(10_000, 5, 41);
    let good = evs
        .iter()
        .filter(|(_, v)| user_of(Some(v)).is_some())
        .count();
    let mut service = job.spawn();
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
    let started = Instant::now();
    // checkpoint.timeout is 15 s in the test config: the final checkpoint is bounded by it.
    let status = service.terminate(Duration::from_secs(20));
    let took = started.elapsed();
    assert!(
        status.success(),
        "SIGTERM must exit 0, got {status}; log:\n{}",
        service.log()
    );
    let log = service.log();
    assert!(
        log.contains("SIGTERM") && log.contains("final checkpoint committed"),
        "log:\n{log}"
    );
    let stopped_at = job.committed();
    assert!(
        stopped_at < 10_000,
        "the stop must land mid-load (committed {stopped_at}, took {took:?})"
    );
    let mut service = job.spawn();
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    let status = service.terminate(Duration::from_secs(20));
    assert!(status.success(), "{status}");
    let (outputs, _) = check_exactly_once(&job);
    assert_eq!(outputs, good);
}

#[test]
fn transactions_show_the_open_transaction_aging_warn_near_the_timeout_and_advance_with_checkpoints()
{
    let job = Job::new("transactions", 2);
    job.write_config("3s", "");
    produce_all(&job.input, &events(200, 0, 3), None);
    // Every commit waits 15 s, so each transaction lives ~18 s of its 20 s timeout: past
    // the 80 % warning (16 s), short of the broker's abort.
    let mut service = job.spawn_with(
        &[],
        &[
            ("FAILPOINTS", "before-commit=sleep(15000)"),
            // One producer: epochs queued behind a 15 s commit would outlive the timeout.
            ("STREAMSTATE__CHECKPOINT__PRODUCER_POOL_SIZE", "1"),
            ("STREAMSTATE__KAFKA__TRANSACTION_TIMEOUT", "20s"),
            ("STREAMSTATE__CHECKPOINT__TIMEOUT", "5s"),
        ],
    );
    wait_ready(&job, &mut service);
    let view = |service: &mut Service| {
        service.assert_running();
        let a = call(job.admin, "GET", "/transactions", false, b"");
        assert_eq!(a.status, 200, "{}", a.body);
        a.json()
    };
    let first = view(&mut service);
    assert_eq!(first["transactional_id"], format!("{}-0-0", job.app_id));
    assert_eq!(first["producer_inits"], 1);
    assert_eq!(first["transaction_timeout_ms"], 20_000);
    assert_eq!(first["warn_after_ms"], 16_000);
    assert_eq!(first["open"], true, "{first}");
    let checkpoint = first["checkpoint_id"].as_u64().expect("checkpoint id");
    let begun = first["transactions_begun"].as_u64().expect("begun");
    let age = first["age_ms"].as_u64().expect("age");
    assert!(
        first["checkpoint"]
            .as_str()
            .is_some_and(|c| c.starts_with(&format!("chk-{checkpoint}-")))
    );
    wait_until(
        "the open transaction to age",
        Duration::from_secs(10),
        || {
            let v = view(&mut service);
            v["checkpoint_id"] == checkpoint && v["age_ms"].as_u64().is_some_and(|a| a > age)
        },
    );

    wait_until("the near-timeout warning", Duration::from_secs(60), || {
        service.assert_running();
        service.log().contains("transaction_near_timeout")
    });
    let text = scrape(job.admin);
    assert!(metric_sum(&text, "streamstate_transaction_near_timeout_total") >= 1.0);
    assert_eq!(
        metric_sum(&text, "streamstate_transaction_timeout_seconds"),
        20.0
    );
    assert!(text.contains("# TYPE streamstate_transaction_open_age_seconds gauge"));

    wait_until(
        "a checkpoint to commit and a new transaction to open",
        Duration::from_secs(60),
        || {
            let v = view(&mut service);
            v["committed"].as_u64().is_some_and(|c| c >= 1) && v["open"] == true
        },
    );
    let next = view(&mut service);
    assert!(
        next["checkpoint_id"].as_u64().expect("id") > checkpoint,
        "{next}"
    );
    assert!(next["transactions_begun"].as_u64().expect("begun") > begun);
    assert_eq!(
        next["aborted"], 0,
        "the warned transaction still committed: {next}"
    );
    assert_eq!(
        next["last_committed_checkpoint"], first["checkpoint"],
        "the committed transaction was the one named at its start"
    );
    assert_eq!(service.terminate(Duration::from_secs(60)).code(), Some(0));
}

// ------------------------------------------------------------------ abuse

/// Writes raw bytes to the admin port and returns the answer's status (0 if none).
fn raw_status(admin: SocketAddr, request: &[u8]) -> u16 {
    let mut s =
        std::net::TcpStream::connect_timeout(&admin, Duration::from_secs(5)).expect("connect");
    s.set_read_timeout(Some(Duration::from_secs(30)))
        .expect("timeout");
    let _ = std::io::Write::write_all(&mut s, request);
    let mut buf = Vec::new();
    let _ = std::io::Read::read_to_end(&mut s, &mut buf);
    String::from_utf8_lossy(&buf)
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0)
}

/// Has the server closed this connection (EOF or reset), as seen without blocking?
fn closed_by_server(s: &mut std::net::TcpStream) -> bool {
    s.set_nonblocking(true).expect("nonblocking");
    let mut b = [0u8; 512];
    let closed = loop {
        match std::io::Read::read(s, &mut b) {
            Ok(0) => break true,
            Ok(_) => continue, // an answer (408) before the close: keep reading
            Err(e) if e.kind() == std::io::ErrorKind::WouldBlock => break false,
            Err(_) => break true,
        }
    };
    s.set_nonblocking(false).expect("blocking");
    closed
}

/// Admin abuse while input flows: 10,000 bad tokens, 100 concurrent checkpoint triggers,
/// `../` ids (plain and encoded) on every id-taking route, 1 MiB bodies (announced and
/// chunked), and 200 slow clients holding connections. Every answer has the right status,
/// `/livez` keeps answering, half-open connections are closed after the header timeout,
/// nothing outside storage is read, checkpoints keep completing, the process never dies
/// and the independent checker finds the output exactly once.
#[test]
fn admin_abuse_gets_the_right_answers_and_leaves_processing_exactly_once() {
    let job = Job::new("abuse", 2);
    job.write_config("1s", &format!("token = \"{TOKEN}\"\n"));
    let mut service = job.spawn();
    wait_ready(&job, &mut service);

    // Continuous input for the whole test (stopped at the end).
    let stop = std::sync::Arc::new(std::sync::atomic::AtomicBool::new(false));
    let input = {
        let (topic, stop) = (job.input.clone(), stop.clone());
        std::thread::spawn(move || {
            let p = producer();
            let mut n = 0usize;
            let mut rng = rand::rng();
            while !stop.load(std::sync::atomic::Ordering::SeqCst) {
                for _ in 0..20 {
                    let user = format!("user-{}", rand::Rng::random_range(&mut rng, 0..KEYS));
                    let v = format!(r#"{{"user_id":"{user}","seq":{n}}}"#);
                    produce(&p, &topic, Some(&user), v.as_bytes());
                    n += 1;
                }
                p.poll(Duration::from_millis(100));
            }
            flush(&p);
            n
        })
    };
    let completed = |admin| metric_sum(&scrape(admin), "streamstate_checkpoints_completed_total");

    // 1. 10,000 requests with bad tokens on the guarded routes: 401 every time.
    let bad_tokens = std::sync::atomic::AtomicUsize::new(0);
    std::thread::scope(|s| {
        for t in 0..8 {
            let bad_tokens = &bad_tokens;
            let admin = job.admin;
            s.spawn(move || {
                for i in 0..1250 {
                    let token = match i % 6 {
                        0 => format!("Bearer {TOKEN}x"),
                        1 => format!("Bearer {}", &TOKEN[..TOKEN.len() - 1]),
                        2 => format!("Bearer wrong-{t}-{i}"),
                        3 => format!("Basic {TOKEN}"),
                        4 => format!("Bearer {}", "a".repeat(4096)),
                        _ => "Bearer".to_string(),
                    };
                    let (method, path) = match i % 3 {
                        0 => ("POST", "/checkpoints"),
                        1 => ("POST", "/savepoints"),
                        _ => ("GET", "/state/user-1"),
                    };
                    let a = http_with(method, admin, path, &[("Authorization", &token)], b"")
                        .unwrap_or_else(|e| panic!("{method} {path}: {e}"));
                    assert_eq!(
                        a.status, 401,
                        "{method} {path} with {token:.40}: {}",
                        a.body
                    );
                    bad_tokens.fetch_add(1, std::sync::atomic::Ordering::Relaxed);
                }
            });
        }
    });
    assert_eq!(bad_tokens.into_inner(), 10_000);
    service.assert_running();
    let a = call(job.admin, "GET", "/state/user-1", true, b"");
    assert!(
        matches!(a.status, 200 | 404),
        "right token after the flood: {} {}",
        a.status,
        a.body
    );
    let a = call(job.admin, "POST", "/checkpoints", true, b"");
    assert!(
        matches!(a.status, 200 | 202 | 409),
        "right token after the flood: {} {}",
        a.status,
        a.body
    );

    // 2. 100 concurrent checkpoint triggers: each 200/202 or 409, at least one accepted,
    // and checkpoints keep completing afterwards.
    let before = completed(job.admin);
    let barrier = std::sync::Barrier::new(100);
    let statuses: Vec<u16> = std::thread::scope(|s| {
        let handles: Vec<_> = (0..100)
            .map(|_| {
                let barrier = &barrier;
                let admin = job.admin;
                s.spawn(move || {
                    barrier.wait();
                    call(admin, "POST", "/checkpoints", true, b"").status
                })
            })
            .collect();
        handles
            .into_iter()
            .map(|h| h.join().expect("trigger"))
            .collect()
    });
    assert!(
        statuses.iter().all(|s| matches!(s, 200 | 202 | 409)),
        "statuses: {statuses:?}"
    );
    assert!(
        statuses.iter().any(|s| matches!(s, 200 | 202)),
        "none accepted: {statuses:?}"
    );
    wait_until(
        "checkpoints to keep completing",
        Duration::from_secs(60),
        || {
            service.assert_running();
            completed(job.admin) >= before + 3.0
        },
    );

    // 3. Path traversal on every id-taking route: 400 or 404, and a sentinel file outside
    // checkpoint storage never shows up in an answer.
    let outside = tempfile::tempdir().expect("tempdir");
    let sentinel = format!("SENTINEL-{}", unique("content"));
    std::fs::write(outside.path().join("sentinel"), &sentinel).expect("sentinel");
    let depth = "../".repeat(12);
    let target = format!("{depth}{}", outside.path().join("sentinel").display()).replace("//", "/");
    let encoded = target.replace('/', "%2F");
    let dots = target.replace("../", "%2e%2e%2f");
    let double = target.replace("../", "..%252f");
    let backslash = target.replace("../", "..%5c");
    let overlong = target.replace("../", "%c0%ae%c0%ae/");
    let variants = [
        target.clone(),
        encoded,
        dots,
        double,
        backslash,
        overlong,
        "..".to_string(),
        "%2e%2e".to_string(),
        "....//....//etc/passwd".to_string(),
    ];
    let mut tried = 0;
    for v in &variants {
        for route in ["/checkpoints/", "/savepoints/", "/rules/", "/state/"] {
            let path = format!("{route}{v}");
            let a = call(job.admin, "GET", &path, true, b"");
            assert!(
                matches!(a.status, 400 | 404),
                "GET {path}: {} {}",
                a.status,
                a.body
            );
            assert!(
                !a.body.contains(&sentinel),
                "GET {path} read the sentinel: {}",
                a.body
            );
            tried += 1;
        }
        // Savepoint targets name a directory to write to: refused when `..` (in any
        // spelling the URL parser decodes) would leave storage; a name that only looks
        // like it is a directory inside storage.
        let chk = job.checkpoint_dir().display().to_string();
        let body = format!(r#"{{"target": "file://{chk}/{v}"}}"#);
        let a = call(job.admin, "POST", "/savepoints", true, body.as_bytes());
        assert!(
            matches!(a.status, 200 | 400 | 409),
            "POST /savepoints {body}: {} {}",
            a.status,
            a.body
        );
        if a.status == 200 {
            let location = a.json()["location"]
                .as_str()
                .unwrap_or_default()
                .to_string();
            assert!(
                location.starts_with(&format!("file://{chk}/")),
                "{body} wrote to {location}"
            );
        }
        assert!(!a.body.contains(&sentinel));
    }
    assert_eq!(tried, variants.len() * 4);
    assert_eq!(
        std::fs::read_to_string(outside.path().join("sentinel")).expect("sentinel"),
        sentinel,
        "the sentinel was changed"
    );
    assert_eq!(
        std::fs::read_dir(outside.path()).expect("dir").count(),
        1,
        "something was written outside storage"
    );

    // 4. 1 MiB bodies: 413, announced by Content-Length or not (chunked).
    let mib = vec![b'x'; 1 << 20];
    for path in ["/savepoints", "/stop", "/checkpoints"] {
        let a = call(job.admin, "POST", path, true, &mib);
        assert_eq!(a.status, 413, "POST {path} with 1 MiB: {}", a.body);
        let mut chunked = format!(
            "POST {path} HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nTransfer-Encoding: chunked\r\nConnection: close\r\n\r\n{:x}\r\n",
            mib.len()
        )
        .into_bytes();
        chunked.extend_from_slice(&mib);
        chunked.extend_from_slice(b"\r\n0\r\n\r\n");
        assert_eq!(
            raw_status(job.admin, &chunked),
            413,
            "POST {path} with 1 MiB chunked"
        );
    }
    service.assert_running();

    // 5. 200 slow clients: half a request line, then headers byte by byte, never done;
    // plus a few that send a complete head and trickle the body.
    let started = Instant::now();
    let mut slow: Vec<std::net::TcpStream> = (0..200)
        .map(|_| {
            let mut s = std::net::TcpStream::connect_timeout(&job.admin, Duration::from_secs(5))
                .expect("connect");
            std::io::Write::write_all(&mut s, b"GET /liv").expect("half a request line");
            s
        })
        .collect();
    let mut trickle: Vec<std::net::TcpStream> = (0..5)
        .map(|_| {
            let mut s = std::net::TcpStream::connect_timeout(&job.admin, Duration::from_secs(5)).expect("connect");
            let head = format!("POST /savepoints HTTP/1.1\r\nHost: x\r\nAuthorization: Bearer {TOKEN}\r\nContent-Length: 1000\r\n\r\n{{");
            std::io::Write::write_all(&mut s, head.as_bytes()).expect("head");
            s
        })
        .collect();
    // While they dribble, other clients are answered promptly (each /livez within 5 s).
    let mut livez = 0;
    let mut header = b"ez HTTP/1.1\r\nX-Slow: "
        .iter()
        .chain(std::iter::repeat(&b'a'));
    while started.elapsed() < Duration::from_secs(6) {
        let byte = [*header.next().expect("endless")];
        for s in slow.iter_mut().chain(trickle.iter_mut()) {
            let _ = std::io::Write::write_all(s, &byte);
        }
        let t = Instant::now();
        let a = http_with("GET", job.admin, "/livez", &[], b"").expect("livez under slow clients");
        assert_eq!(a.status, 200, "/livez under slow clients: {}", a.body);
        assert!(
            t.elapsed() < Duration::from_secs(5),
            "/livez took {:?}",
            t.elapsed()
        );
        livez += 1;
        std::thread::sleep(Duration::from_millis(300));
    }
    assert!(livez >= 5, "only {livez} /livez answers");
    // The server closes them (header/body timeout, 10 s) although they keep sending.
    wait_until(
        "the server to close the slow connections",
        Duration::from_secs(45),
        || {
            let byte = [*header.next().expect("endless")];
            for s in slow.iter_mut().chain(trickle.iter_mut()) {
                let _ = std::io::Write::write_all(s, &byte);
            }
            slow.iter_mut()
                .chain(trickle.iter_mut())
                .all(closed_by_server)
        },
    );
    eprintln!(
        "slow clients closed {:?} after they connected",
        started.elapsed()
    );
    let a = http_with("GET", job.admin, "/livez", &[], b"").expect("livez");
    assert_eq!(a.status, 200);

    // After the abuse: still the same process, checkpoints still completing, and the
    // output exactly once by the independent checker.
    let after = completed(job.admin);
    wait_until(
        "a checkpoint after the abuse",
        Duration::from_secs(60),
        || {
            service.assert_running();
            completed(job.admin) > after
        },
    );
    stop.store(true, std::sync::atomic::Ordering::SeqCst);
    let produced = input.join().expect("input thread");
    assert!(produced > 0);
    wait_all_committed(&job, &mut service);
    service.assert_running();
    let text = scrape(job.admin);
    assert_eq!(
        metric_sum(&text, "streamstate_records_consumed_total") as i64,
        job.input_end()
    );
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "{status}");
    let report = independent_check(&job, &CheckerOptions::all());
    assert_eq!(
        report["expected_outputs"].as_u64(),
        Some(produced as u64),
        "{report}"
    );
}
