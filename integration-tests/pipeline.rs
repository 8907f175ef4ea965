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
