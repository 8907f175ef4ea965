//! Avro and Protobuf input and Avro output on the real broker and a real Schema Registry
//! (Apicurio, started by `integration-tests/registry/apicurio.sh`). The tests write the
//! wire format with their own small encoders and check with their own decoders, so
//! neither side shares code with the service's `apache-avro`/`prost-reflect` path; the
//! Avro output is read back by Python's `fastavro` (`registry/read_avro.py`).

mod common;

use std::collections::{BTreeMap, HashMap};
use std::net::SocketAddr;
use std::path::PathBuf;
use std::process::Command;
use std::time::Duration;

use common::*;
use rand::{Rng, SeedableRng};

// ---------------------------------------------------------------- the registry

/// The Confluent-compatible base URL, e.g. `http://127.0.0.1:19081/apis/ccompat/v7`.
fn registry_url() -> String {
    std::env::var("STREAMSTATE_TEST_REGISTRY_URL").expect(
        "STREAMSTATE_TEST_REGISTRY_URL: start integration-tests/registry/apicurio.sh (integration-tests/run.sh does)",
    )
}

/// The registry's address and base path.
fn registry_addr() -> (SocketAddr, String) {
    let url = url::Url::parse(&registry_url()).expect("registry URL");
    let addr = SocketAddr::from((
        [127, 0, 0, 1],
        url.port_or_known_default().expect("registry port"),
    ));
    (addr, url.path().trim_end_matches('/').to_string())
}

fn registry_call(method: &str, path: &str, body: &serde_json::Value) -> Answer {
    let (addr, base) = registry_addr();
    http_with(
        method,
        addr,
        &format!("{base}{path}"),
        &[("Content-Type", "application/vnd.schemaregistry.v1+json")],
        body.to_string().as_bytes(),
    )
    .expect("registry request")
}

/// Registers `schema` under `subject`; its id.
fn register(subject: &str, schema: &str, schema_type: &str) -> u32 {
    let a = registry_call(
        "POST",
        &format!("/subjects/{subject}/versions"),
        &serde_json::json!({"schema": schema, "schemaType": schema_type}),
    );
    assert_eq!(a.status, 200, "register {subject}: {}", a.body);
    a.json()["id"].as_u64().expect("id") as u32
}

// ---------------------------------------------------------------- Avro, by hand

const EVENT_V1: &str = r#"{"type":"record","name":"Event","namespace":"test","fields":[{"name":"user_id","type":"string"},{"name":"seq","type":"long"},{"name":"amount","type":"long"}]}"#;
/// v1 plus a field with a default: a new writer schema a v1 reader can read.
const EVENT_V2: &str = r#"{"type":"record","name":"Event","namespace":"test","fields":[{"name":"user_id","type":"string"},{"name":"seq","type":"long"},{"name":"amount","type":"long"},{"name":"note","type":"string","default":""}]}"#;

fn zigzag(n: i64, out: &mut Vec<u8>) {
    let mut v = ((n << 1) ^ (n >> 63)) as u64;
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

fn read_zigzag(b: &mut &[u8]) -> Option<i64> {
    let mut v = 0u64;
    for shift in (0..64).step_by(7) {
        let (&x, rest) = b.split_first()?;
        *b = rest;
        v |= u64::from(x & 0x7f) << shift;
        if x & 0x80 == 0 {
            return Some(((v >> 1) as i64) ^ -((v & 1) as i64));
        }
    }
    None
}

fn header(id: u32) -> Vec<u8> {
    let mut v = vec![0u8];
    v.extend_from_slice(&id.to_be_bytes());
    v
}

/// An Event in the wire format of schema `id` (v2 when `note` is given).
fn avro_event(id: u32, user: &str, seq: i64, amount: i64, note: Option<&str>) -> Vec<u8> {
    let mut v = header(id);
    zigzag(user.len() as i64, &mut v);
    v.extend_from_slice(user.as_bytes());
    zigzag(seq, &mut v);
    zigzag(amount, &mut v);
    if let Some(n) = note {
        zigzag(n.len() as i64, &mut v);
        v.extend_from_slice(n.as_bytes());
    }
    v
}

/// The checker's reader: the user of a well-formed Event of schema `v1` or `v2`.
fn avro_user(v1: u32, v2: Option<u32>) -> impl Fn(Option<&[u8]>) -> Option<String> {
    move |payload| {
        let p = payload?;
        if p.len() < 5 || p[0] != 0 {
            return None;
        }
        let id = u32::from_be_bytes([p[1], p[2], p[3], p[4]]);
        let mut b = &p[5..];
        let read_str = |b: &mut &[u8]| -> Option<String> {
            let n = usize::try_from(read_zigzag(b)?).ok()?;
            let s = std::str::from_utf8(b.get(..n)?).ok()?.to_string();
            *b = &b[n..];
            Some(s)
        };
        let user = read_str(&mut b)?;
        read_zigzag(&mut b)?;
        read_zigzag(&mut b)?;
        if Some(id) == v2 {
            read_str(&mut b)?;
        } else if id != v1 {
            return None;
        }
        b.is_empty().then_some(user)
    }
}

/// Like `common::events`, in Avro: about `bad_per_mille`/1000 are unusable in one of the
/// wire format's ways (JSON bytes, a cut header, an unknown schema id, a cut datum).
fn avro_events(n: usize, bad_per_mille: u32, seed: u64, id: u32) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let user = format!("user-{}", rng.random_range(0..KEYS));
            let good = avro_event(id, &user, i as i64, (i % 97) as i64, None);
            let value = if rng.random_ratio(bad_per_mille, 1000) {
                match i % 4 {
                    0 => format!(r#"{{"user_id":"{user}"}}"#).into_bytes(),
                    1 => good[..3].to_vec(),
                    2 => avro_event(999_999, &user, i as i64, 0, None),
                    _ => good[..7].to_vec(),
                }
            } else {
                good
            };
            (Some(user), value)
        })
        .collect()
}

fn schema_file(job: &Job, name: &str, text: &str) -> PathBuf {
    let p = job.dir.path().join(name);
    std::fs::write(&p, text).expect("schema file");
    p
}

fn registry_section(url: &str, extra: &str) -> String {
    format!(
        "\n[schema_registry]\nurls = [\"{url}\"]\nrequest_timeout = \"1s\"\nretry_for = \"2s\"\n{extra}\n"
    )
}

/// The dead-letter topic's reasons by input offset (partition 0), with how often each.
fn dead_letters(job: &Job) -> BTreeMap<i64, Vec<String>> {
    let mut out: BTreeMap<i64, Vec<String>> = BTreeMap::new();
    for r in read_all(&job.dlq, true) {
        let o: i64 = r.headers["streamstate.source.offset"]
            .parse()
            .expect("offset");
        out.entry(o)
            .or_default()
            .push(r.headers["streamstate.error.reason"].clone());
    }
    out
}

/// What [`dead_letters`] must find for records produced in order to partition 0: each
/// bad one's reason, once, at its offset.
fn expected_dead_letters(inputs: &[(Vec<u8>, Option<&str>)]) -> BTreeMap<i64, Vec<String>> {
    inputs
        .iter()
        .enumerate()
        .filter_map(|(i, (_, r))| r.map(|r| (i as i64, vec![r.to_string()])))
        .collect()
}

// ---------------------------------------------------------------- exactly once on Avro

#[test]
fn avro_input_counts_exactly_once_under_random_sigkills() {
    let mut job = Job::new("avro-kill", 4);
    job.job_extra = "format = \"avro\"".into();
    let id = register(&format!("{}-value", job.input), EVENT_V1, "AVRO");
    job.write_config("250ms", &registry_section(&registry_url(), ""));
    let kills = kills_from_env(20);
    let evs = avro_events(800 * kills.max(5), 5, 11, id);
    feed_under_sigkills(&job, evs, 1_500, kills);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let (outputs, dead) = check_exactly_once_reading(&job, b"", avro_user(id, None));
    assert!(
        outputs > 3_000 && dead > 0,
        "outputs {outputs}, dead letters {dead}"
    );
}

#[test]
fn each_bad_avro_record_is_dead_lettered_once_with_its_reason() {
    let mut job = Job::new("avro-bad", 1);
    job.job_extra = "format = \"avro\"".into();
    let id = register(&format!("{}-value", job.input), EVENT_V1, "AVRO");
    // A writer schema the reader schema cannot read (seq is a string), and a schema
    // that is not Avro at all.
    let other = register(
        &format!("{}-other-value", job.input),
        r#"{"type":"record","name":"Event","namespace":"test","fields":[{"name":"user_id","type":"string"},{"name":"seq","type":"string"}]}"#,
        "AVRO",
    );
    let proto = register(
        &format!("{}-proto-value", job.input),
        "syntax = \"proto3\";\npackage t;\nmessage M { string user_id = 1; }\n",
        "PROTOBUF",
    );
    let reader = schema_file(&job, "reader.avsc", EVENT_V1);
    job.write_config(
        "300ms",
        &format!(
            "{}\n[avro]\nreader_schema_file = \"{}\"\n",
            registry_section(&registry_url(), ""),
            reader.display()
        ),
    );
    let good = |seq: i64| avro_event(id, "u1", seq, 5, None);
    let mut mismatch = header(other);
    mismatch.extend_from_slice(&[4, b'u', b'1', 2, b'x']);
    let mut trailing = good(9);
    trailing.push(0);
    let inputs: Vec<(Vec<u8>, Option<&str>)> = vec![
        (good(0), None),
        (br#"{"user_id":"u1"}"#.to_vec(), Some("bad_magic_byte")),
        (vec![0, 0, 1], Some("truncated")),
        (
            avro_event(999_999, "u1", 1, 1, None),
            Some("unknown_schema_id"),
        ),
        (good(2)[..8].to_vec(), Some("truncated")),
        (mismatch, Some("schema_mismatch")),
        (avro_event(proto, "u1", 1, 1, None), Some("schema_mismatch")),
        (trailing, Some("invalid_avro")),
        (good(3), None),
    ];
    for (v, _) in &inputs {
        produce_to_partition(&job.input, 0, "u1", v);
    }
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let expected = expected_dead_letters(&inputs);
    assert_eq!(
        dead_letters(&job),
        expected,
        "one dead letter per bad record, with its reason"
    );
    let (outputs, _) = check_exactly_once_reading(&job, b"", avro_user(id, None));
    assert_eq!(outputs, 2);
}

// ---------------------------------------------------------------- a registry outage

#[test]
fn a_registry_outage_mid_run_loses_and_duplicates_nothing() {
    let (addr, base) = registry_addr();
    let proxy = proxy::Proxy::start(addr);
    let mut job = Job::new("avro-outage", 2);
    job.job_extra = "format = \"avro\"".into();
    let subject = format!("{}-value", job.input);
    let v1 = register(&subject, EVENT_V1, "AVRO");
    job.write_config(
        "300ms",
        &registry_section(&format!("{}{base}", proxy.url()), ""),
    );
    let mut service = job.spawn();
    let first: Vec<_> = (0..600)
        .map(|i| {
            let u = format!("user-{}", i % 50);
            (Some(u.clone()), avro_event(v1, &u, i, i % 7, None))
        })
        .collect();
    produce_all(&job.input, &first, Some(1_000));
    wait_all_committed(&job, &mut service);

    // The registry goes away; records of a schema id the job has not seen arrive.
    proxy.cut();
    let v2 = register(&subject, EVENT_V2, "AVRO");
    assert_ne!(v1, v2, "a second schema version must get its own id");
    let second: Vec<_> = (600..1_200)
        .map(|i| {
            let u = format!("user-{}", i % 50);
            (Some(u.clone()), avro_event(v2, &u, i, i % 7, Some("n")))
        })
        .collect();
    produce_all(&job.input, &second, None);
    wait_until(
        "the job to find the registry unavailable",
        Duration::from_secs(60),
        || {
            service.assert_running();
            http("GET", job.admin, "/metrics").is_ok_and(|(_, m)| {
                metric_sum(
                    &m,
                    "streamstate_schema_registry_requests_total{outcome=\"unavailable\"}",
                ) > 0.0
            })
        },
    );
    // Past `retry_for` (2 s) the open epochs are aborted and the job rewinds; keep the
    // registry away until it has, more than once.
    wait_until(
        "the job to rewind for the outage, twice",
        Duration::from_secs(60),
        || {
            service.assert_running();
            service
                .log()
                .matches("schema registry unavailable for")
                .count()
                >= 2
        },
    );
    let stuck = job.committed();
    assert!(
        stuck < job.input_end(),
        "nothing of the new schema can commit while the registry is away"
    );
    proxy.restore();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let (outputs, dead) = check_exactly_once_reading(&job, b"", avro_user(v1, Some(v2)));
    assert_eq!(
        (outputs, dead),
        (1_200, 0),
        "every event counted once, none dead-lettered"
    );
}

// ---------------------------------------------------------------- Avro output

const COUNT_OUTPUT: &str = r#"{"type":"record","name":"CountOutput","namespace":"test","fields":[{"name":"key","type":"string"},{"name":"count","type":"long"},{"name":"source","type":{"type":"record","name":"Source","fields":[{"name":"topic","type":"string"},{"name":"partition","type":"int"},{"name":"offset","type":"long"}]}}]}"#;

/// Reads `topic` with `read_avro.py` (confluent-kafka + fastavro): one JSON per record.
fn read_avro(topic: &str, expect: usize) -> Vec<serde_json::Value> {
    let python =
        std::env::var("STREAMSTATE_TEST_PYTHON").expect("STREAMSTATE_TEST_PYTHON (moto.sh python)");
    let script = std::env::var("STREAMSTATE_TEST_READ_AVRO")
        .map(PathBuf::from)
        .unwrap_or_else(|_| {
            PathBuf::from(env!("CARGO_MANIFEST_DIR"))
                .join("integration-tests/registry/read_avro.py")
        });
    let out = Command::new(python)
        .arg(script)
        .args([
            "--bootstrap",
            &bootstrap(),
            "--topic",
            topic,
            "--registry",
            &registry_url(),
        ])
        .args(["--expect", &expect.to_string(), "--timeout-s", "90"])
        .output()
        .expect("run read_avro.py");
    assert!(
        out.status.success(),
        "read_avro.py failed: {}",
        String::from_utf8_lossy(&out.stderr)
    );
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .map(|l| serde_json::from_str(l).expect("read_avro.py line"))
        .collect()
}

#[test]
fn avro_output_is_read_back_by_an_independent_reader_and_matches_the_model() {
    let mut job = Job::new("avro-out", 2);
    job.job_extra = "output_format = \"avro\"".into();
    let schema = schema_file(&job, "out.avsc", COUNT_OUTPUT);
    job.write_config(
        "300ms",
        &format!(
            "{}\n[avro]\noutput_schema_file = \"{}\"\n",
            registry_section(&registry_url(), ""),
            schema.display()
        ),
    );
    let evs = events(1_500, 10, 5);
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();

    // The model: per key, its good events in (partition, offset) order count 1..n.
    let mut input = read_all(&job.input, true);
    input.sort_by_key(|r| (r.partition, r.offset));
    let mut running: HashMap<String, u64> = HashMap::new();
    let mut expected = BTreeMap::new();
    for r in &input {
        if let Some(user) = user_of(r.value.as_deref()) {
            let n = running.entry(user.clone()).or_default();
            *n += 1;
            expected.insert((r.partition as i64, r.offset), (user, *n));
        }
    }
    let records = read_avro(&job.output, expected.len());
    let registered = registry_call(
        "GET",
        &format!("/subjects/{}-value/versions/latest", job.output),
        &serde_json::json!({}),
    );
    assert_eq!(registered.status, 200, "{}", registered.body);
    let id = registered.json()["id"].as_u64().expect("id");
    let mut seen = BTreeMap::new();
    for r in &records {
        assert_eq!(
            r["schema_id"].as_u64(),
            Some(id),
            "every output names the registered schema: {r}"
        );
        let v = &r["value"];
        let at = (
            v["source"]["partition"].as_i64().expect("partition"),
            v["source"]["offset"].as_i64().expect("offset"),
        );
        assert_eq!(v["source"]["topic"], job.input.as_str());
        let (user, n) = expected
            .get(&at)
            .unwrap_or_else(|| panic!("output for no good input: {r}"));
        assert_eq!(
            (v["key"].as_str(), v["count"].as_u64()),
            (Some(user.as_str()), Some(*n)),
            "{r}"
        );
        assert_eq!(
            r["key"].as_str(),
            Some(user.as_str()),
            "the record key is the state key"
        );
        assert!(seen.insert(at, ()).is_none(), "duplicate output for {at:?}");
    }
    assert_eq!(
        seen.len(),
        expected.len(),
        "every good input has its output"
    );
}

// ---------------------------------------------------------------- rules on Avro

fn rules_run(name: &str, avro: bool, evs: &[(String, i64, i64)]) -> Vec<serde_json::Value> {
    let mut job = Job::new(name, 2);
    job.function = "rules";
    let id = if avro {
        job.job_extra = "format = \"avro\"".into();
        let id = register(&format!("{}-value", job.input), EVENT_V1, "AVRO");
        job.write_config("300ms", &registry_section(&registry_url(), ""));
        Some(id)
    } else {
        job.write_config("300ms", "");
        None
    };
    let rules = [
        r#"{"id":"sum","version":1,"kind":"aggregate","aggregate":{"fn":"sum","field":"/amount","emit":"every_event"}}"#,
        r#"{"id":"big","version":1,"kind":"aggregate","filter":{"field":"/amount","gt":50},"aggregate":{"fn":"count","emit":"every_event"}}"#,
        r#"{"id":"first-amount","version":1,"kind":"dedup","dedup":{"field":"/amount","ttl":"10m"}}"#,
    ];
    let records: Vec<(String, Option<String>)> = rules
        .iter()
        .map(|r| {
            let v: serde_json::Value = serde_json::from_str(r).expect("rule");
            (
                v["id"].as_str().expect("id").to_string(),
                Some(r.to_string()),
            )
        })
        .collect();
    produce_rules(&job.control, &records);
    let mut service = job.spawn();
    wait_until("the three rules in force", Duration::from_secs(60), || {
        service.assert_running();
        rules_served(job.admin).is_some_and(|r| r.len() == 3)
    });
    let payloads: Vec<(Option<String>, Vec<u8>)> = evs
        .iter()
        .map(|(u, seq, amount)| {
            let v = match id {
                Some(id) => avro_event(id, u, *seq, *amount, None),
                None => {
                    format!(r#"{{"user_id":"{u}","seq":{seq},"amount":{amount}}}"#).into_bytes()
                }
            };
            (Some(u.clone()), v)
        })
        .collect();
    produce_all(&job.input, &payloads, None);
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let mut out: Vec<serde_json::Value> = read_all(&job.output, true)
        .iter()
        .map(|r| {
            let mut v = r.json();
            // What differs between two runs by design: the input topic's name and
            // processing time.
            v["source"]["topic"] = serde_json::Value::Null;
            v["timestamp"] = serde_json::Value::Null;
            v
        })
        .collect();
    out.sort_by_key(|v| v.to_string());
    out
}

#[test]
fn the_rule_engine_on_avro_input_equals_its_json_run_on_the_same_events() {
    let mut rng = rand::rngs::StdRng::seed_from_u64(3);
    let evs: Vec<(String, i64, i64)> = (0..800)
        .map(|i| {
            (
                format!("user-{}", rng.random_range(0..40)),
                i,
                rng.random_range(0..100),
            )
        })
        .collect();
    let json = rules_run("rules-json", false, &evs);
    let avro = rules_run("rules-avro", true, &evs);
    assert!(
        json.len() > 1_600,
        "three rules emit on most events: {}",
        json.len()
    );
    assert_eq!(avro.len(), json.len());
    for (a, j) in avro.iter().zip(&json) {
        assert_eq!(a, j);
    }
}

// ---------------------------------------------------------------- Protobuf

const PROTO: &str = "syntax = \"proto3\";\npackage test.v1;\nmessage Other { string x = 1; }\nmessage Event { string user_id = 1; int64 seq = 2; int64 amount = 3; }\n";

fn varint(mut v: u64, out: &mut Vec<u8>) {
    loop {
        let b = (v & 0x7f) as u8;
        v >>= 7;
        if v == 0 {
            out.push(b);
            return;
        }
        out.push(b | 0x80);
    }
}

/// `test.v1.Event` (message index 1) in the wire format of schema `id`.
fn proto_event(id: u32, user: &str, seq: u64, amount: u64) -> Vec<u8> {
    let mut v = header(id);
    v.extend_from_slice(&[2, 2]); // one index, 1 (zig-zag)
    v.push(0x0a);
    varint(user.len() as u64, &mut v);
    v.extend_from_slice(user.as_bytes());
    v.push(0x10);
    varint(seq, &mut v);
    v.push(0x18);
    varint(amount, &mut v);
    v
}

#[test]
fn protobuf_input_counts_every_event_once_and_dead_letters_what_it_cannot_read() {
    let mut job = Job::new("proto", 1);
    job.job_extra = "format = \"protobuf\"".into();
    let id = register(&format!("{}-value", job.input), PROTO, "PROTOBUF");
    job.write_config(
        "300ms",
        &format!(
            "{}\n[protobuf]\nmessage = \"test.v1.Event\"\n",
            registry_section(&registry_url(), "")
        ),
    );
    let mut other = header(id);
    other.extend_from_slice(&[0, 0x0a, 1, b'x']); // index [0]: test.v1.Other
    let mut cut = proto_event(id, "u1", 1, 1);
    cut.truncate(9);
    let mut bad_wire = header(id);
    bad_wire.extend_from_slice(&[2, 2, 0x0f, 1]); // wire type 7 does not exist
    let inputs: Vec<(Vec<u8>, Option<&str>)> = vec![
        (proto_event(id, "u1", 0, 3), None),
        (other, Some("schema_mismatch")),
        (cut, Some("truncated")),
        (bad_wire, Some("invalid_protobuf")),
        (proto_event(id, "u2", 1, 4), None),
        (proto_event(id, "u1", 2, 5), None),
    ];
    for (v, _) in &inputs {
        produce_to_partition(&job.input, 0, "k", v);
    }
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let expected = expected_dead_letters(&inputs);
    assert_eq!(dead_letters(&job), expected);
    let good: Vec<i64> = inputs
        .iter()
        .enumerate()
        .filter(|(_, (_, r))| r.is_none())
        .map(|(i, _)| i as i64)
        .collect();
    let counts: Vec<(String, u64, i64)> = read_all(&job.output, true)
        .iter()
        .map(|r| {
            let v = r.json();
            (
                v["key"].as_str().expect("key").to_string(),
                v["count"].as_u64().expect("count"),
                v["source"]["offset"].as_i64().expect("offset"),
            )
        })
        .collect();
    assert_eq!(
        counts,
        vec![
            ("u1".into(), 1, good[0]),
            ("u2".into(), 1, good[1]),
            ("u1".into(), 2, good[2])
        ],
        "the key field of a Protobuf message is the state key"
    );
}
