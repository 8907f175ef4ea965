//! Several instances on one machine (processes), shared checkpoint storage (a directory):
//! rescaling 1 → 3 → 2 → 1 from savepoint sets under continuous input, 12 partitions
//! and 120 key groups rescaled 1 → 4 → 12 → 3, a SIGKILL of one of three instances, and
//! the starts that must be refused.

mod common;

use std::collections::BTreeMap;
use std::net::SocketAddr;
use std::process::Command;
use std::time::Duration;

use common::*;
use rdkafka::consumer::Consumer;
use rdkafka::{Offset, TopicPartitionList};

fn spawn_instance(job: &Job, i: u32, n: u32, generation: u32, args: &[&str]) -> Instance {
    common::spawn_instance(job, i, n, generation, &[], args)
}

/// `POST /stop {"savepoint": true}` on every instance, each exits 0. With `hold` (what a
/// StatefulSet needs, or it restarts the pod into processing) each stays up, live and not
/// ready, until SIGTERM.
fn stop_with_savepoints(instances: Vec<Instance>, hold: bool) {
    let body = if hold {
        &br#"{"savepoint":true,"hold":true}"#[..]
    } else {
        &br#"{"savepoint":true}"#[..]
    };
    for mut inst in instances {
        let answer = http_with(
            "POST",
            inst.admin,
            "/stop",
            &[("Content-Type", "application/json")],
            body,
        )
        .expect("POST /stop");
        assert_eq!(
            answer.status, 200,
            "stop with savepoint: {} {}",
            answer.status, answer.body
        );
        if hold {
            inst.service.assert_running();
            assert_eq!(
                http("GET", inst.admin, "/readyz").expect("readyz").0,
                503,
                "a held instance is not ready"
            );
            assert_eq!(
                http("GET", inst.admin, "/livez").expect("livez").0,
                200,
                "a held instance is alive"
            );
            assert_eq!(
                inst.service.terminate(Duration::from_secs(30)).code(),
                Some(0),
                "{}",
                inst.service.log()
            );
        } else {
            assert_eq!(
                inst.service.wait_exit(Duration::from_secs(90)).code(),
                Some(0),
                "{}",
                inst.service.log()
            );
        }
    }
}

fn cli(job: &Job, args: &[&str]) -> (bool, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(job.config_path())
        .output()
        .expect("run streamstate");
    (
        out.status.success(),
        format!(
            "{}{}",
            String::from_utf8_lossy(&out.stdout),
            String::from_utf8_lossy(&out.stderr)
        ),
    )
}

fn make_set(job: &Job, name: &str, instances: u32) {
    let (ok, text) = cli(
        job,
        &[
            "savepoint-set",
            "--name",
            name,
            "--instances",
            &instances.to_string(),
        ],
    );
    assert!(ok, "savepoint-set {name}: {text}");
}

/// Committed offset per partition of the input (0 while none).
fn committed_per_partition(job: &Job) -> BTreeMap<i32, i64> {
    let c = consumer(Some(&job.app_id), false);
    let mut tpl = TopicPartitionList::new();
    for p in 0..job.partitions {
        tpl.add_partition(&job.input, p);
    }
    let got = c
        .committed_offsets(tpl, Duration::from_secs(10))
        .expect("committed offsets");
    got.elements()
        .iter()
        .map(|e| {
            (
                e.partition(),
                if let Offset::Offset(o) = e.offset() {
                    o
                } else {
                    0
                },
            )
        })
        .collect()
}

fn scale_job(name: &str) -> Job {
    let job = Job::new(name, 4);
    job.write_config("300ms", "");
    job
}

#[test]
fn rescales_1_to_3_to_2_to_1_under_continuous_input_exactly_once() {
    let job = scale_job("rescale");
    let input = job.input.clone();
    let evs = events(12_000, 5, 77);
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(500)));
    let mut running = vec![spawn_instance(&job, 0, 1, 0, &[])];
    wait_ready(&mut running);
    wait_until("a first commit", Duration::from_secs(60), || {
        job.committed() > 0
    });
    for (generation, (from, to)) in [(1, 3), (3, 2), (2, 1)].into_iter().enumerate() {
        let generation = generation as u32 + 1;
        let before = job.committed();
        stop_with_savepoints(std::mem::take(&mut running), generation == 1);
        let set = format!("gen-{generation}");
        make_set(&job, &set, from);
        let (ok, plan) = cli(&job, &["rescale-plan", "--set", &set]);
        assert!(ok, "rescale-plan: {plan}");
        running = (0..to)
            .map(|i| spawn_instance(&job, i, to, generation, &["--from-savepoint-set", &set]))
            .collect();
        wait_ready(&mut running);
        wait_until(
            &format!("{to} instances committing past {before}"),
            Duration::from_secs(90),
            || {
                running.iter_mut().for_each(|i| i.service.assert_running());
                job.committed() > before
            },
        );
    }
    feeder.join().expect("feeder");
    let end = job.input_end();
    wait_until(
        "all input committed by the last instance",
        Duration::from_secs(180),
        || {
            running[0].service.assert_running();
            job.committed() >= end
        },
    );
    assert_eq!(
        running[0].service.terminate(Duration::from_secs(60)).code(),
        Some(0)
    );
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(
        outputs + dead,
        12_000,
        "every input is an output or a dead letter, once"
    );
    independent_check(&job, &CheckerOptions::all());
}

/// Twelve partitions, 120 key groups: each partition holds a block of ten.
const ALIGNED: &[(&str, &str)] = &[("STREAMSTATE__STATE__MAX_PARALLELISM", "120")];

/// `GET /instance`'s key groups: (first, last, aligned partitions).
fn owned_key_groups(inst: &Instance) -> (u64, u64, serde_json::Value) {
    let (status, body) = http("GET", inst.admin, "/instance").expect("GET /instance");
    assert_eq!(status, 200, "{body}");
    let v: serde_json::Value = serde_json::from_str(&body).expect("instance JSON");
    let kg = &v["key_groups"];
    (
        kg["first"]
            .as_u64()
            .unwrap_or_else(|| panic!("key_groups: {v}")),
        kg["last"]
            .as_u64()
            .unwrap_or_else(|| panic!("key_groups: {v}")),
        kg["aligned_partitions"].clone(),
    )
}

#[test]
fn twelve_partitions_of_120_key_groups_rescale_1_to_4_to_12_to_3_checked_after_every_step() {
    let job = Job::new("aligned", 12);
    job.write_config("300ms", "");
    let input = job.input.clone();
    let evs = events(16_000, 5, 91);
    let keys: Vec<String> = evs
        .iter()
        .filter_map(|(k, _)| k.clone())
        .take(400)
        .collect();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(400)));
    let spawn = |i, n, generation, args: &[&str]| {
        common::spawn_instance(&job, i, n, generation, ALIGNED, args)
    };
    let mut running = vec![spawn(0, 1, 0, &[])];
    wait_ready(&mut running);
    assert_eq!(
        owned_key_groups(&running[0]),
        (0, 119, serde_json::json!(12)),
        "one instance owns all 120 groups, aligned to the 12 partitions"
    );
    wait_until("a first commit", Duration::from_secs(60), || {
        job.committed() > 0
    });
    for (generation, (from, to)) in [(1, 4), (4, 12), (12, 3)].into_iter().enumerate() {
        let generation = generation as u32 + 1;
        let before = job.committed();
        stop_with_savepoints(std::mem::take(&mut running), false);
        // Everything committed so far is exactly once (input beyond is not yet read).
        independent_check(&job, &CheckerOptions::default());
        let set = format!("gen-{generation}");
        make_set(&job, &set, from);
        if to == 3 {
            // More instances than partitions cannot own a partition each.
            let mut refused = spawn(0, 13, generation, &["--from-savepoint-set", &set]);
            let status = refused.service.wait_exit(Duration::from_secs(60));
            let log = refused.service.log();
            assert!(
                !status.success() && log.contains("job.instances (13) exceeds the 12 partitions"),
                "{log}"
            );
        }
        running = (0..to)
            .map(|i| spawn(i, to, generation, &["--from-savepoint-set", &set]))
            .collect();
        wait_ready(&mut running);
        let per_instance = 120 / u64::from(to);
        for (i, inst) in running.iter().enumerate() {
            let first = i as u64 * per_instance;
            assert_eq!(
                owned_key_groups(inst),
                (first, first + per_instance - 1, serde_json::json!(12)),
                "instance {i} of {to} owns whole partitions' blocks"
            );
        }
        if to == 4 {
            // Each key is owned by the instance of its Kafka partition (three each).
            for key in &keys {
                let partition = streamstate::state::key_group_for(key.as_bytes(), 12);
                let owner = partition / 3;
                let (status, body) =
                    http("GET", running[0].admin, &format!("/state/{key}")).expect("GET /state");
                match owner {
                    0 => assert!(status == 200 || status == 404, "{key}: {status} {body}"),
                    _ => {
                        assert_eq!(status, 421, "{key} (partition {partition}): {body}");
                        let v: serde_json::Value = serde_json::from_str(&body).expect("JSON");
                        assert_eq!(v["owner_instance"], owner, "{key}: {body}");
                    }
                }
            }
        }
        wait_until(
            &format!("{to} instances committing past {before}"),
            Duration::from_secs(120),
            || {
                running.iter_mut().for_each(|i| i.service.assert_running());
                job.committed() > before
            },
        );
    }
    feeder.join().expect("feeder");
    let end = job.input_end();
    wait_until(
        "all input committed by the last instances",
        Duration::from_secs(180),
        || {
            running.iter_mut().for_each(|i| i.service.assert_running());
            job.committed() >= end
        },
    );
    for mut inst in running {
        assert_eq!(
            inst.service.terminate(Duration::from_secs(60)).code(),
            Some(0)
        );
    }
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(
        outputs + dead,
        16_000,
        "every input is an output or a dead letter, once"
    );
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn a_sigkilled_instance_of_three_pauses_only_its_own_partitions() {
    let job = scale_job("kill-one");
    let input = job.input.clone();
    let evs = events(9_000, 5, 78);
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(600)));
    let mut running: Vec<Instance> = (0..3).map(|i| spawn_instance(&job, i, 3, 0, &[])).collect();
    wait_ready(&mut running);
    // Instance 1 of 3 over 4 key groups owns key group (= partition) 2 only.
    wait_until("every partition committed", Duration::from_secs(90), || {
        committed_per_partition(&job).values().all(|o| *o > 0)
    });
    running[1].service.sigkill();
    let at_kill = committed_per_partition(&job);
    wait_until(
        "the other instances' partitions move on",
        Duration::from_secs(90),
        || {
            running[0].service.assert_running();
            running[2].service.assert_running();
            let now = committed_per_partition(&job);
            [0, 1, 3].iter().all(|p| now[p] > at_kill[p] + 50)
        },
    );
    assert_eq!(
        committed_per_partition(&job)[&2],
        at_kill[&2],
        "the dead instance's partition must not move"
    );
    running[1] = spawn_instance(&job, 1, 3, 1, &[]);
    feeder.join().expect("feeder");
    let end = job.input_end();
    wait_until("all input committed", Duration::from_secs(180), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        job.committed() >= end
    });
    for mut inst in running {
        assert_eq!(
            inst.service.terminate(Duration::from_secs(60)).code(),
            Some(0)
        );
    }
    check_exactly_once(&job);
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn wrong_max_parallelism_incomplete_sets_and_duplicate_instances_are_refused() {
    let job = scale_job("refusals");
    produce_all(&job.input, &events(2_000, 0, 79), None);
    let mut first = vec![spawn_instance(&job, 0, 1, 0, &[])];
    wait_ready(&mut first);
    wait_until("input committed", Duration::from_secs(90), || {
        job.committed() >= 2_000
    });
    stop_with_savepoints(first, false);
    let outputs = end_offsets_total(&job.output, job.partitions);

    // A set needs every part: only instance 0 of "2" has a savepoint.
    let (ok, text) = cli(
        &job,
        &["savepoint-set", "--name", "half", "--instances", "2"],
    );
    assert!(!ok, "an incomplete set must be refused: {text}");
    assert!(
        text.contains("savepoint set half:")
            && (text.contains("has no completed savepoint")
                || text.contains("not instance 0 of 2")),
        "{text}"
    );
    let mut refused = spawn_instance(&job, 0, 1, 1, &["--from-savepoint-set", "half"]);
    let status = refused.service.wait_exit(Duration::from_secs(60));
    assert!(
        !status.success()
            && refused
                .service
                .log()
                .contains("savepoint set half does not exist"),
        "{}",
        refused.service.log()
    );

    // Key groups are fixed at the first start.
    produce_all(&job.input, &events(500, 0, 80), None);
    let log = job.dir.path().join("wrong-mp.log");
    let mut wrong = Service::spawn(
        &job.config_path(),
        &log,
        &[],
        &[
            ("STREAMSTATE__STATE__MAX_PARALLELISM", "8"),
            ("STREAMSTATE__ADMIN__LISTEN", "127.0.0.1:0"),
        ],
    );
    let status = wrong.wait_exit(Duration::from_secs(60));
    let text = wrong.log();
    assert!(
        !status.success()
            && text.contains("max_parallelism = 4")
            && text.contains("fixed at the first start"),
        "{text}"
    );
    assert_eq!(
        end_offsets_total(&job.output, job.partitions),
        outputs,
        "a refused start writes nothing"
    );

    // The same instance id twice: the newer one fences the older, which exits at its
    // next transactional write. Both are idle until new input arrives (an idle epoch
    // commits nothing, so it does not meet the fence before that).
    let mut a = spawn_instance(&job, 0, 1, 2, &[]);
    wait_ready(std::slice::from_mut(&mut a));
    let mut b = spawn_instance(&job, 0, 1, 3, &[]);
    wait_ready(std::slice::from_mut(&mut b));
    produce_all(&job.input, &events(300, 0, 81), None);
    let status = a.service.wait_exit(Duration::from_secs(120));
    assert!(
        !status.success(),
        "the older instance 0 must stop when a second instance 0 starts"
    );
    assert!(a.service.log().contains("fenced"), "{}", a.service.log());
    let end = job.input_end();
    wait_until(
        "the newer instance 0 commits everything",
        Duration::from_secs(120),
        || {
            b.service.assert_running();
            job.committed() >= end
        },
    );
    assert_eq!(b.service.terminate(Duration::from_secs(60)).code(), Some(0));
    check_exactly_once(&job);
}

#[test]
fn state_lookup_on_any_instance_reaches_the_owner() {
    let job = scale_job("lookup");
    let evs = events(2_000, 0, 79);
    produce_all(&job.input, &evs, None);
    let mut keys: Vec<String> = evs.iter().filter_map(|(k, _)| k.clone()).collect();
    keys.sort();
    keys.dedup();
    keys.truncate(40);
    // Instance i listens on 127.0.1.i, all on one port, so one `admin.peer_url` template
    // names every instance the way the chart's pod DNS names do. Instance 1 has no
    // template and must answer 421 naming the owner instead.
    let port = free_port();
    let addr = |i: u32| SocketAddr::from(([127, 0, 1, i as u8], port));
    let template = format!("http://127.0.1.{{instance}}:{port}");
    let spawn = |i: u32, peer_url: Option<&str>| {
        let (id, listen) = (i.to_string(), addr(i).to_string());
        let state = job
            .dir
            .path()
            .join(format!("state-{i}"))
            .display()
            .to_string();
        let mut env = vec![
            ("STREAMSTATE__JOB__INSTANCE", id.as_str()),
            ("STREAMSTATE__JOB__INSTANCES", "2"),
            ("STREAMSTATE__ADMIN__LISTEN", listen.as_str()),
            ("STREAMSTATE__STATE__DIR", state.as_str()),
        ];
        if let Some(url) = peer_url {
            env.push(("STREAMSTATE__ADMIN__PEER_URL", url));
        }
        let log = job.dir.path().join(format!("instance-{i}.log"));
        Instance {
            service: Service::spawn(&job.config_path(), &log, &[], &env),
            admin: addr(i),
        }
    };
    let mut running = vec![spawn(0, Some(&template)), spawn(1, None)];
    wait_ready(&mut running);
    let end = job.input_end();
    wait_until("all input committed", Duration::from_secs(90), || {
        running.iter_mut().for_each(|i| i.service.assert_running());
        job.committed() >= end
    });
    let (mut redirected, mut misdirected) = (0, 0);
    for key in keys {
        let path = format!("/state/{key}");
        let here = http_with("GET", addr(0), &path, &[], b"").expect("GET on instance 0");
        let owner = match here.status {
            200 => 0,
            307 => {
                let location = format!("http://{}{path}", addr(1));
                assert!(
                    here.head.contains(&format!("location: {location}\r\n"))
                        || here.head.ends_with(&format!("location: {location}")),
                    "redirect to instance 1: {}",
                    here.head
                );
                assert_eq!(here.json()["owner_instance"], 1, "{}", here.body);
                redirected += 1;
                1
            }
            other => panic!("{key} on instance 0: {other} {}", here.body),
        };
        let at_owner = http_with("GET", addr(owner), &path, &[], b"").expect("GET at the owner");
        assert_eq!(
            at_owner.status, 200,
            "{key} at its owner {owner}: {}",
            at_owner.body
        );
        assert_eq!(at_owner.json()["key"], key.as_str());
        assert_eq!(at_owner.json()["instance"], owner);
        if owner == 0 {
            let there = http_with("GET", addr(1), &path, &[], b"").expect("GET on instance 1");
            assert_eq!(
                there.status, 421,
                "{key} on instance 1 without peer_url: {}",
                there.body
            );
            assert_eq!(there.json()["owner_instance"], 0, "{}", there.body);
            misdirected += 1;
        }
    }
    assert!(
        redirected > 0 && misdirected > 0,
        "keys on both instances: {redirected} redirected, {misdirected} refused"
    );
    for mut inst in running {
        assert_eq!(
            inst.service.terminate(Duration::from_secs(60)).code(),
            Some(0)
        );
    }
}
