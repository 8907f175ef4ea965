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

/// The same kill and restore with checkpoints in S3-compatible storage (moto): recovery
/// reads the committed checkpoint back from the object store.
#[test]
fn sigkill_mid_run_then_restart_keeps_exactly_once_on_s3_storage() {
    let job = Job::new("sigkill-s3", 4);
    let bucket = unique("s3");
    create_s3_bucket(&bucket);
    job.write_config_with_storage("200ms", &format!("s3://{bucket}/ckpt"), "");
    let env = s3_env();
    let env: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let evs = events(10_000, 0, 4);
    let mut service = job.spawn_with(&[], &env);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(2_500)));
    wait_until("a third of the input committed", Duration::from_secs(120), || {
        service.assert_running();
        job.committed() >= 3_000
    });
    service.sigkill();
    let killed_at = job.committed();
    assert!(killed_at < 10_000, "the kill must land mid-run (committed {killed_at})");
    let mut service = job.spawn_with(&[], &env);
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    let log = service.log();
    assert!(log.contains("restored state from checkpoint"), "restart must restore; log:\n{log}");
    assert!(log.contains(&format!("s3://{bucket}/ckpt/{}/instance-0", job.app_id)), "must restore from S3; log:\n{log}");
    assert!(!job.checkpoint_dir().exists(), "no checkpoint may land on the local file system");
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
