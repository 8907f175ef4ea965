//! Reliability and security battery (issue 9) on the real broker: bad input, control-topic
//! garbage, corrupted checkpoints, a restart storm, a full disk, and secrets kept out of
//! logs and metrics. Every fault test ends with the independent checker
//! (`integration-tests/checker/check.py`). Doses: CI runs the short form; `battery.sh
//! --long` sets `STREAMSTATE_TEST_STORM_SECS`, `STREAMSTATE_TEST_CORRUPTION=all`.
//! Results: docs/reliability.md.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use rand::Rng;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, AlterConfig, ResourceSpecifier};
use rdkafka::client::DefaultClientContext;
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};

fn set_topic_config(topic: &str, key: &str, value: &str) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let change = AlterConfig::new(ResourceSpecifier::Topic(topic)).set(key, value);
    let r = futures::executor::block_on(admin.alter_configs(&[change], &AdminOptions::new()))
        .expect("alter configs");
    for x in r {
        x.unwrap_or_else(|(t, e)| panic!("alter {t:?}: {e}"));
    }
}

/// Adds lines to the `[job]` section of the job's config.
fn add_job_keys(job: &Job, lines: &str) {
    let text = std::fs::read_to_string(job.config_path()).expect("config");
    let text = text.replacen("[job]\n", &format!("[job]\n{lines}\n"), 1);
    std::fs::write(job.config_path(), text).expect("write config");
}

fn ready(job: &Job) -> bool {
    matches!(http("GET", job.admin, "/readyz"), Ok((200, _)))
}

fn now_ms() -> u64 {
    std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}

// ---------------------------------------------------------------- bad input

#[test]
fn every_kind_of_bad_input_is_dead_lettered_exactly_once_without_a_crash() {
    let job = Job::new("bad-input", 2);
    // A 10 MiB record must reach the input topic; its 1 MiB cut must reach the dead-letter topic.
    set_topic_config(&job.input, "max.message.bytes", &(12 << 20).to_string());
    set_topic_config(&job.dlq, "max.message.bytes", &(2 << 20).to_string());
    job.write_config(
        "300ms",
        "[kafka.consumer_properties]\n\"fetch.max.bytes\" = \"33554432\"\n\"max.partition.fetch.bytes\" = \"16777216\"\n",
    );
    add_job_keys(&job, "timestamp = \"/ts\"\nmax_event_time_skew = \"1d\"");
    let p: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("enable.idempotence", "true")
        .set("message.max.bytes", (12 << 20).to_string())
        .create()
        .expect("producer");
    let day = 86_400_000u64;
    let bad: Vec<(&str, Vec<u8>)> = vec![
        ("invalid_json", b"{\"user_id\": \"oops".to_vec()),
        ("invalid_json", b"{\"user_id\":\"u\",\"ts\":1}}}".to_vec()),
        ("not_utf8", vec![0xff, 0xfe, b'{', b'}']),
        ("not_utf8", b"{\"user_id\":\"\xc3\x28\"}".to_vec()),
        (
            "too_deep",
            format!(
                "{{\"user_id\":\"u\",\"x\":{}{}}}",
                "[".repeat(10_000),
                "]".repeat(10_000)
            )
            .into_bytes(),
        ),
        (
            "too_large",
            format!(
                "{{\"user_id\":\"big\",\"ts\":{},\"pad\":\"{}\"}}",
                now_ms(),
                "a".repeat(10 << 20)
            )
            .into_bytes(),
        ),
        (
            "key_too_large",
            format!(
                "{{\"user_id\":\"{}\",\"ts\":{}}}",
                "k".repeat(100 << 10),
                now_ms()
            )
            .into_bytes(),
        ),
        (
            "key_not_scalar",
            format!("{{\"user_id\":{{\"a\":1}},\"ts\":{}}}", now_ms()).into_bytes(),
        ),
        (
            "key_not_scalar",
            format!("{{\"user_id\":[1],\"ts\":{}}}", now_ms()).into_bytes(),
        ),
        (
            "key_not_scalar",
            format!("{{\"user_id\":true,\"ts\":{}}}", now_ms()).into_bytes(),
        ),
        (
            "missing_key",
            format!("{{\"other\":1,\"ts\":{}}}", now_ms()).into_bytes(),
        ),
        ("missing_key", b"{\"user_id\":null}".to_vec()),
        ("missing_key", b"[1,2,3]".to_vec()),
        ("missing_key", b"\"just a string\"".to_vec()),
        ("missing_timestamp", b"{\"user_id\":\"u\"}".to_vec()),
        (
            "bad_timestamp",
            b"{\"user_id\":\"u\",\"ts\":\"yesterday\"}".to_vec(),
        ),
        ("bad_timestamp", b"{\"user_id\":\"u\",\"ts\":-1}".to_vec()),
        (
            "event_time_out_of_range",
            format!("{{\"user_id\":\"u\",\"ts\":{}}}", now_ms() + 365 * day).into_bytes(),
        ),
        (
            "event_time_out_of_range",
            b"{\"user_id\":\"u\",\"ts\":\"2200-01-01T00:00:00Z\"}".to_vec(),
        ),
        (
            "event_time_out_of_range",
            b"{\"user_id\":\"u\",\"ts\":0}".to_vec(),
        ),
        ("empty", Vec::new()),
    ];
    let mut rng = rand::rng();
    let mut produced = 0;
    let mut send = |key: &str, value: &[u8], partition: i32| {
        let mut r = BaseRecord::<str, [u8]>::to(&job.input)
            .key(key)
            .partition(partition);
        if !value.is_empty() {
            r = r.payload(value);
        }
        p.send(r).map_err(|(e, _)| e).expect("produce");
        p.poll(Duration::ZERO);
        produced += 1;
    };
    let mut service = job.spawn();
    for round in 0..2 {
        for i in 0..1_000i32 {
            // One partition per user: a running count per key is only defined in the
            // order of the partition that holds the key.
            let u = rng.random_range(0..50);
            let user = format!("user-{u}");
            let good = format!("{{\"user_id\":\"{user}\",\"ts\":{},\"seq\":{i}}}", now_ms());
            send(&user, good.as_bytes(), u % 2);
            if i % 40 == 0 {
                let (_, b) = &bad[(i as usize / 40 + round * 25) % bad.len()];
                send("bad", b, i % 2);
            }
        }
        // Every bad kind at least once per round.
        for (n, (_, b)) in bad.iter().enumerate() {
            send("bad", b, n as i32 % 2);
        }
        p.flush(Duration::from_secs(60)).expect("flush");
        if round == 0 {
            // A crash mid-run: bad records stay exactly once across a restart too.
            wait_until("some input committed", Duration::from_secs(120), || {
                service.assert_running();
                job.committed() > 500
            });
            service.sigkill();
            service = job.spawn();
        }
    }
    wait_all_committed(&job, &mut service);
    service.assert_running();
    let metrics = http("GET", job.admin, "/metrics").expect("metrics").1;
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "clean exit after bad input: {status}");
    assert!(
        !service.log().contains("panicked"),
        "no panic:\n{}",
        service.log()
    );
    let report = independent_check(
        &job,
        &CheckerOptions {
            timestamp_field: Some("ts".into()),
            max_skew_ms: Some(day),
            max_record_bytes: Some(1 << 20),
            max_key_bytes: Some(4096),
            ..CheckerOptions::all()
        },
    );
    let reasons = &report["dead_letter_reasons"];
    for (reason, _) in &bad {
        assert!(
            reasons[*reason].as_u64().unwrap_or(0) >= 2,
            "reason {reason} in {reasons}"
        );
        assert!(
            metrics.contains(&format!("reason=\"{reason}\"")),
            "metric label {reason}"
        );
    }
    assert_eq!(report["input_records"].as_u64(), Some(produced as u64));
}

// ---------------------------------------------------------------- control-topic garbage

#[test]
fn control_topic_garbage_is_never_applied_and_the_last_good_rule_stays() {
    let mut job = Job::new("rules-garbage", 2);
    job.function = "rules";
    job.write_config("300ms", "");
    let rule = |id: &str, version: u64, threshold: u64| {
        format!(
            r#"{{"id":"{id}","version":{version},"status":"active","kind":"aggregate","aggregate":{{"fn":"count","having":{{"gt":{threshold}}},"emit":"on_match"}}}}"#
        )
    };
    let mut rng = rand::rng();
    let mut records: Vec<(String, Option<String>)> = Vec::new();
    let mut garbage_offsets = Vec::new();
    let mut last_good: std::collections::BTreeMap<String, u64> = Default::default();
    let mut version = 0;
    for i in 0..300 {
        let id = format!("r-{}", i % 5);
        if rng.random_ratio(1, 10) {
            let junk = match rng.random_range(0..6) {
                0 => "{not json".to_string(),
                1 => format!(
                    r#"{{"id":"{id}","version":{},"kind":"aggregate","aggregate":{{"fn":"count"}},"pad":"{}"}}"#,
                    version + 1000,
                    "x".repeat(70 << 10)
                ),
                2 => format!("{}{}", "[".repeat(10_000), "]".repeat(10_000)),
                3 => format!(
                    r#"{{"id":"{id}","version":{},"kind":"aggregate","aggregate":{{"fn":"median"}}}}"#,
                    version + 1000
                ),
                4 => format!(r#"{{"id":"{id}","version":"high","kind":"aggregate"}}"#),
                _ => format!(
                    r#"{{"id":"{id}","version":{},"kind":"aggregate","aggregate":{{"fn":"count"}},"surprise":1}}"#,
                    version + 1000
                ),
            };
            garbage_offsets.push(records.len() as i64);
            records.push((id, Some(junk)));
        } else if rng.random_ratio(1, 10) && last_good.contains_key(&id) {
            // Out of order: an older version replayed, ignored (not dead-lettered).
            let old = last_good[&id].saturating_sub(1).max(1);
            records.push((id.clone(), Some(rule(&id, old, 1))));
        } else {
            version += 1;
            records.push((id.clone(), Some(rule(&id, version, version))));
            last_good.insert(id, version);
        }
    }
    let mut service = job.spawn();
    wait_until("service ready", Duration::from_secs(120), || {
        service.assert_running();
        ready(&job)
    });
    produce_rules(&job.control, &records);
    produce_all(&job.input, &events(500, 0, 5), None);
    let expected: std::collections::BTreeMap<String, (u64, bool)> = last_good
        .iter()
        .map(|(k, v)| (k.clone(), (*v, false)))
        .collect();
    let mut served = None;
    wait_until(
        "served rules to be the last good versions",
        Duration::from_secs(120),
        || {
            service.assert_running();
            served = rules_served(job.admin);
            served.as_ref() == Some(&expected)
        },
    );
    wait_all_committed(&job, &mut service);
    // Restarted, the rules in force come back from the checkpoint unchanged.
    service.sigkill();
    let mut service = job.spawn();
    wait_until(
        "same rules after a restart",
        Duration::from_secs(120),
        || {
            service.assert_running();
            rules_served(job.admin).as_ref() == Some(&expected)
        },
    );
    service.terminate(Duration::from_secs(60));
    let mut dead: Vec<i64> = read_all(&job.dlq, true)
        .iter()
        .filter(|r| r.headers.get("streamstate.source.topic") == Some(&job.control))
        .inspect(|r| assert!(!r.headers["streamstate.error.reason"].is_empty()))
        .map(|r| {
            r.headers["streamstate.source.offset"]
                .parse()
                .expect("offset")
        })
        .collect();
    dead.sort_unstable();
    assert_eq!(
        dead, garbage_offsets,
        "each malformed rule exactly once in the dead-letter topic"
    );
    eprintln!(
        "rules garbage: {} control records, {} malformed, all refused",
        records.len(),
        garbage_offsets.len()
    );
}

// ---------------------------------------------------------------- corrupted checkpoints

/// The newest checkpoint directory (the committed one after a clean stop) and its files,
/// private ones and the shared ones its manifest references.
fn committed_checkpoint(job: &Job) -> (String, Vec<PathBuf>) {
    let root = job.checkpoint_dir().join(&job.app_id).join("instance-0");
    let mut names: Vec<String> = std::fs::read_dir(&root)
        .expect("checkpoints")
        .filter_map(|e| e.ok()?.file_name().into_string().ok())
        .filter(|n| n.starts_with("chk-") && !n.ends_with(".tmp"))
        .collect();
    names.sort_by_key(|n| {
        n.trim_start_matches("chk-")
            .split('-')
            .next()
            .and_then(|id| id.parse::<u64>().ok())
    });
    let newest = names.last().expect("a checkpoint").clone();
    let mut files = Vec::new();
    for e in std::fs::read_dir(root.join(&newest))
        .expect("chk dir")
        .flatten()
    {
        if e.path().is_file() && e.file_name() != "COMPLETED" {
            files.push(e.path());
        }
    }
    let manifest: serde_json::Value = serde_json::from_slice(
        &std::fs::read(root.join(&newest).join("manifest.json")).expect("manifest"),
    )
    .expect("json");
    for f in manifest["state"]["files"].as_array().expect("files") {
        if let Some(sha) = f["sha256"].as_str() {
            let shared = root.join("shared").join(sha);
            if shared.is_file() {
                files.push(shared);
            }
        }
    }
    files.sort();
    (newest, files)
}

#[derive(Debug, Clone, Copy)]
enum Damage {
    Flip,
    Truncate,
    Delete,
    ManifestGarbage,
    ManifestVersion,
}

fn damage(file: &Path, how: Damage, rng: &mut impl Rng) {
    let mut bytes = std::fs::read(file).expect("read");
    match how {
        Damage::Flip => {
            let at = rng.random_range(0..bytes.len());
            bytes[at] ^= 0xff;
            std::fs::write(file, bytes).expect("write");
        }
        Damage::Truncate => {
            bytes.truncate(bytes.len() / 2);
            std::fs::write(file, bytes).expect("write");
        }
        Damage::Delete => std::fs::remove_file(file).expect("delete"),
        Damage::ManifestGarbage => {
            std::fs::write(file, b"{\"format_version\": 1, \"checkpoint\": ").expect("write")
        }
        Damage::ManifestVersion => {
            let mut manifest: serde_json::Value =
                serde_json::from_slice(&bytes).expect("manifest JSON");
            assert!(
                manifest["format_version"].is_u64(),
                "the manifest must name its format_version for this damage to apply"
            );
            manifest["format_version"] = 99.into();
            std::fs::write(file, serde_json::to_vec_pretty(&manifest).expect("JSON"))
                .expect("write");
        }
    }
}

#[test]
fn corrupted_checkpoints_are_always_detected_named_and_the_fallback_is_opt_in() {
    let all = std::env::var("STREAMSTATE_TEST_CORRUPTION").is_ok_and(|v| v == "all");
    let job = Job::new("corrupt-chk", 2);
    job.write_config("200ms", "");
    produce_all(&job.input, &events(3_000, 5, 41), None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    assert!(service.terminate(Duration::from_secs(60)).success());
    let (newest, files) = committed_checkpoint(&job);
    let manifest = files
        .iter()
        .find(|f| f.ends_with("manifest.json"))
        .expect("manifest")
        .clone();
    let data: Vec<&PathBuf> = files.iter().filter(|f| **f != manifest).collect();
    let mut rng = rand::rng();
    let mut plan: Vec<(PathBuf, Damage)> = Vec::new();
    if all {
        for f in &data {
            for d in [Damage::Flip, Damage::Truncate, Damage::Delete] {
                plan.push(((*f).clone(), d));
            }
        }
        for _ in 0..5 {
            plan.push((manifest.clone(), Damage::Flip));
        }
    } else {
        let pick = |rng: &mut rand::rngs::ThreadRng| data[rng.random_range(0..data.len())].clone();
        plan.push((pick(&mut rng), Damage::Flip));
        plan.push((pick(&mut rng), Damage::Truncate));
        plan.push((pick(&mut rng), Damage::Delete));
        plan.push((manifest.clone(), Damage::Flip));
    }
    plan.push((manifest.clone(), Damage::ManifestGarbage));
    plan.push((manifest.clone(), Damage::ManifestVersion));
    plan.push((manifest.clone(), Damage::Delete));
    let mut detected = 0;
    for (file, how) in &plan {
        let original = std::fs::read(file).expect("backup");
        damage(file, *how, &mut rng);
        eprintln!("damage: {how:?} of {}", file.display());
        let mut refused = job.spawn();
        let status = refused.wait_exit(Duration::from_secs(120));
        let log = refused.log();
        std::fs::write(file, &original).expect("restore the file");
        // The log file is shared by every start: keep only this attempt's part.
        std::fs::write(job.dir.path().join("service.log"), b"").expect("truncate log");
        assert!(
            !status.success(),
            "{how:?} of {} was not detected: the service started",
            file.display()
        );
        let name = file.file_name().and_then(|n| n.to_str()).expect("name");
        let named_file = log.contains(name)
            || (matches!(how, Damage::Delete) && *file == manifest && log.contains("missing"));
        assert!(
            log.contains(&newest) && named_file,
            "{how:?} of {name}: the error must name checkpoint {newest} and the file:\n{log}"
        );
        detected += 1;
    }
    eprintln!(
        "corrupted checkpoints: {detected}/{} damages detected and named",
        plan.len()
    );

    // Intact again: a normal start restores it, more input, exactly once.
    produce_all(&job.input, &events(1_000, 5, 42), None);
    let mut service = job.spawn();
    wait_all_committed(&job, &mut service);
    assert!(service.terminate(Duration::from_secs(60)).success());
    independent_check(&job, &CheckerOptions::all());

    // Opt-in fallback: damage the committed checkpoint, restore an older one.
    let (newest, files) = committed_checkpoint(&job);
    let victim = files
        .iter()
        .find(|f| !f.ends_with("manifest.json"))
        .expect("a data file");
    damage(victim, Damage::Flip, &mut rng);
    let mut refused = job.spawn();
    assert!(
        !refused.wait_exit(Duration::from_secs(120)).success(),
        "damaged {newest} must stop the start"
    );
    let mut fallback = job.spawn_with(&["--allow-older-checkpoint"], &[]);
    wait_until(
        "the fallback to restore and run",
        Duration::from_secs(120),
        || {
            fallback.assert_running();
            fallback.log().contains("AT-LEAST-ONCE")
        },
    );
    wait_all_committed(&job, &mut fallback);
    fallback.sigkill();
    // At-least-once: records after the older checkpoint appear twice, never wrong or missing.
    let (_, report) = independent_report(&job, &CheckerOptions::all());
    let v = &report["violations"];
    let only_dups = v.as_object().is_some_and(|m| {
        m.keys()
            .all(|k| k == "duplicated" || k == "dead_letter_duplicated")
    });
    assert!(
        only_dups && report["missing"] == 0 && report["wrong"] == 0,
        "fallback must only duplicate: {report}"
    );
    eprintln!(
        "fallback: {} duplicated outputs (at-least-once), 0 missing, 0 wrong",
        report["duplicated"]
    );
}

// ---------------------------------------------------------------- restart storm

#[test]
fn restart_storm_causes_no_crash_loop_and_keeps_exactly_once() {
    let secs: u64 = std::env::var("STREAMSTATE_TEST_STORM_SECS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(60);
    let job = Job::new("storm", 4);
    job.write_config("300ms", "");
    let rate = 800u64;
    let total = (rate * (secs + 10)) as usize;
    let evs = events(total, 5, 51);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(rate)));
    let mut rng = rand::rng();
    let started = Instant::now();
    let (mut restarts, mut kills, mut terms) = (0, 0, 0);
    let mut slowest_ready = Duration::ZERO;
    while started.elapsed() < Duration::from_secs(secs) {
        let mut service = job.spawn();
        let t0 = Instant::now();
        wait_until(
            "ready after a restart (no crash loop)",
            Duration::from_secs(120),
            || {
                service.assert_running();
                ready(&job)
            },
        );
        slowest_ready = slowest_ready.max(t0.elapsed());
        let up = Instant::now() + Duration::from_millis(rng.random_range(1_000..4_000));
        // The restart moment is this test's schedule, not a wait for a condition.
        while Instant::now() < up {
            service.assert_running();
            std::thread::sleep(Duration::from_millis(50));
        }
        if rng.random_bool(0.5) {
            let status = service.terminate(Duration::from_secs(60));
            assert!(
                status.success(),
                "SIGTERM must exit 0: {status}\n{}",
                service.log()
            );
            terms += 1;
        } else {
            service.sigkill();
            kills += 1;
        }
        restarts += 1;
    }
    feeder.join().expect("feeder");
    let mut service = job.spawn();
    let t0 = Instant::now();
    wait_all_committed(&job, &mut service);
    let catch_up = t0.elapsed();
    service.sigkill();
    check_exactly_once(&job);
    independent_check(&job, &CheckerOptions::all());
    eprintln!(
        "restart storm: {restarts} restarts ({terms} SIGTERM, {kills} SIGKILL) in {:?}; slowest start to ready {slowest_ready:?}; lag caught up in {catch_up:?}",
        started.elapsed()
    );
}

// ---------------------------------------------------------------- disk full

/// A small tmpfs under the job's directory, unmounted on drop.
struct Volume(PathBuf);

impl Volume {
    fn mount(at: PathBuf, size: &str) -> Self {
        std::fs::create_dir_all(&at).expect("mount point");
        let out = Command::new("mount")
            .args(["-t", "tmpfs", "-o", &format!("size={size}"), "tmpfs"])
            .arg(&at)
            .output()
            .expect("mount");
        assert!(
            out.status.success(),
            "mount -t tmpfs (needs root / CAP_SYS_ADMIN): {}",
            String::from_utf8_lossy(&out.stderr)
        );
        Self(at)
    }

    /// Fills the volume until fewer than `leave` bytes are free.
    fn fill(&self, leave: u64) -> PathBuf {
        use std::io::Write;
        let path = self.0.join("ballast");
        let mut f = std::fs::File::create(&path).expect("ballast");
        let mut chunk = 1usize << 20;
        while chunk >= 4096 {
            let free = free_bytes(&self.0);
            if free <= leave {
                break;
            }
            let n = chunk.min((free - leave) as usize).max(4096);
            // A refused write (the volume is full at this size) or a short last piece:
            // go on in smaller pieces until 4 KiB.
            let written = f.write_all(&vec![0u8; n]).and_then(|()| f.flush()).is_ok();
            if !written || n < chunk {
                chunk /= 2;
            }
        }
        path
    }
}

impl Drop for Volume {
    fn drop(&mut self) {
        let _ = Command::new("umount").arg("-l").arg(&self.0).status();
    }
}

fn free_bytes(path: &Path) -> u64 {
    let out = Command::new("df")
        .args(["--output=avail", "-B1"])
        .arg(path)
        .output()
        .expect("df");
    String::from_utf8_lossy(&out.stdout)
        .lines()
        .nth(1)
        .and_then(|l| l.trim().parse().ok())
        .unwrap_or(0)
}

fn disk_full(leave: u64) {
    let job = Job::new(
        if leave == 0 {
            "disk-full-proc"
        } else {
            "disk-full-chk"
        },
        2,
    );
    let vol = Volume::mount(job.dir.path().join("vol"), "48m");
    let chk = format!("file://{}", vol.0.join("checkpoints").display());
    job.write_config_with_storage("500ms", &chk, "");
    let text = std::fs::read_to_string(job.config_path()).expect("config");
    let state = job.dir.path().join("state").display().to_string();
    std::fs::write(
        job.config_path(),
        text.replace(&state, &vol.0.join("state").display().to_string()),
    )
    .expect("config");
    let evs = events(30_000, 5, 61);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_000)));
    let mut service = job.spawn();
    wait_until("some input committed", Duration::from_secs(120), || {
        service.assert_running();
        job.committed() >= 2_000
    });
    let ballast = vol.fill(leave);
    let full_at = Instant::now();
    wait_until(
        "not ready while the disk is full",
        Duration::from_secs(120),
        || {
            service.assert_running();
            !ready(&job)
        },
    );
    let not_ready_after = full_at.elapsed();
    let frozen = job.committed();
    let attempts = |log: &str| {
        log.matches("disk full: aborting").count() + log.matches("disk still full").count()
    };
    wait_until(
        "several failed attempts while full",
        Duration::from_secs(120),
        || {
            service.assert_running();
            attempts(&service.log()) >= 4
        },
    );
    assert!(!ready(&job), "still not ready while full");
    assert_eq!(
        job.committed(),
        frozen,
        "nothing committed while the disk is full"
    );
    std::fs::remove_file(&ballast).expect("free space");
    let freed = Instant::now();
    wait_until(
        "ready again once space returns",
        Duration::from_secs(120),
        || {
            service.assert_running();
            ready(&job)
        },
    );
    let ready_after = freed.elapsed();
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    assert!(service.terminate(Duration::from_secs(60)).success());
    check_exactly_once(&job);
    let report = independent_check(&job, &CheckerOptions::all());
    eprintln!(
        "disk full (leave {leave} B): not ready after {not_ready_after:?}; committed frozen at {frozen} over {} attempts; ready {ready_after:?} after space returned; aborted attempts {}",
        attempts(&service.log()),
        report["aborted_attempts"]
    );
}

#[test]
fn disk_full_during_processing_turns_not_ready_commits_nothing_and_resumes() {
    disk_full(0);
}

#[test]
fn disk_full_during_a_checkpoint_turns_not_ready_commits_nothing_and_resumes() {
    // A little space left: the checkpoint starts writing and runs out part way.
    disk_full(24 << 10);
}

// ---------------------------------------------------------------- secrets

#[test]
fn secrets_never_appear_in_logs_or_metrics() {
    let password = "sAsL-pw-7f3a91c2e5";
    let token = "ADMIN-tok-0d9e8b7a6c";
    for format in ["text", "json"] {
        let job = Job::new(&format!("secrets-{format}"), 2);
        job.write_config(
            "300ms",
            "[kafka.properties]\n\"sasl.username\" = \"battery-user\"\n",
        );
        produce_all(&job.input, &events(500, 10, 71), None);
        let env = [
            ("STREAMSTATE__KAFKA__PROPERTIES__SASL.PASSWORD", password),
            ("STREAMSTATE__ADMIN__TOKEN", token),
            ("RUST_LOG", "debug,librdkafka=debug"),
        ];
        let mut service = job.spawn_with(&["--log-format", format], &env);
        wait_all_committed(&job, &mut service);
        let (_, metrics) = http("GET", job.admin, "/metrics").expect("metrics");
        assert!(metrics.contains("streamstate_"), "metrics served");
        assert!(service.terminate(Duration::from_secs(60)).success());
        // A start that fails on the config also must not echo it.
        let out = Command::new(BIN)
            .args(["--log-format", format, "check-config", "--config"])
            .arg(job.config_path())
            .envs(env)
            .env("STREAMSTATE__CHECKPOINT__INTERVAL", "not-a-duration")
            .output()
            .expect("check-config");
        let refused = String::from_utf8_lossy(&out.stderr).into_owned()
            + &String::from_utf8_lossy(&out.stdout);
        assert!(!out.status.success());
        let log = service.log();
        for secret in [password, token] {
            assert!(!log.contains(secret), "{format} log leaks a secret:\n{log}");
            assert!(!metrics.contains(secret), "/metrics leaks a secret");
            assert!(
                !refused.contains(secret),
                "check-config error leaks a secret: {refused}"
            );
        }
        if format == "json" {
            assert!(
                log.lines().filter(|l| l.starts_with('{')).count() > 3,
                "json log lines"
            );
        }
    }
}
