//! Pipelined epochs on the real broker: uploads and commits run behind the job thread,
//! a checkpoint storage outage is rewound in process, a fenced zombie's late offsets
//! never count, and idle checkpoints are skipped — each ending with the read_committed
//! checker finding every input's effect exactly once.

mod common;

use std::net::SocketAddr;
use std::os::unix::process::ExitStatusExt;
use std::time::Duration;

use common::proxy::Proxy;
use common::*;

fn metrics(admin: SocketAddr) -> Option<String> {
    match http("GET", admin, "/metrics") {
        Ok((200, text)) => Some(text),
        _ => None,
    }
}

fn metric(admin: SocketAddr, name: &str) -> f64 {
    metrics(admin).map_or(0.0, |t| metric_sum(&t, name))
}

fn ready(admin: SocketAddr) -> bool {
    matches!(http("GET", admin, "/readyz"), Ok((200, _)))
}

/// Sets `[checkpoint] timeout` (the bound of one checkpoint's Kafka and storage calls).
fn set_checkpoint_timeout(job: &Job, timeout: &str) {
    let config = std::fs::read_to_string(job.config_path()).expect("config");
    let config = config.replace("timeout = \"15s\"", &format!("timeout = \"{timeout}\""));
    std::fs::write(job.config_path(), config).expect("write config");
}

#[test]
fn processing_goes_on_while_a_checkpoint_uploads_and_a_full_pool_holds_the_loop() {
    let job = Job::new("upload-behind", 4);
    let env = configure(&job, Storage::File, "200ms");
    let evs = events(6_000, 5, 21);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_500)));
    // Every upload takes 1.5 s: far longer than the interval, so epochs pile up behind it.
    let mut service = spawn(&job, &env, &[("FAILPOINTS", "during-upload=sleep(1500)")]);
    let mut consumed_during_upload = false;
    wait_until(
        "records consumed while an earlier epoch uploads",
        Duration::from_secs(120),
        || {
            service.assert_running();
            let Some(before) = metrics(job.admin) else {
                return false;
            };
            if metric_sum(&before, "streamstate_epochs_in_flight") < 2.0 {
                return false;
            }
            let consumed = metric_sum(&before, "streamstate_records_consumed_total");
            std::thread::sleep(Duration::from_millis(300));
            let Some(after) = metrics(job.admin) else {
                return false;
            };
            consumed_during_upload = metric_sum(&after, "streamstate_records_consumed_total")
                > consumed
                && metric_sum(&after, "streamstate_checkpoints_completed_total")
                    == metric_sum(&before, "streamstate_checkpoints_completed_total");
            consumed_during_upload
        },
    );
    wait_until(
        "the loop to wait for a free producer",
        Duration::from_secs(60),
        || {
            service.assert_running();
            metric(job.admin, "streamstate_producer_pool_waits_total") >= 1.0
        },
    );
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    let text = metrics(job.admin).expect("metrics");
    assert!(
        metric_sum(&text, "streamstate_checkpoint_pause_seconds_count") >= 1.0,
        "the barrier pause is measured"
    );
    service.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(outputs + dead, 6_000);
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn a_checkpoint_storage_outage_is_rewound_in_process_and_loses_nothing() {
    let target: SocketAddr = s3_endpoint()
        .trim_start_matches("http://")
        .parse()
        .expect("S3 endpoint host:port");
    let proxy = Proxy::start(target);
    let job = Job::new("s3-outage", 4);
    let bucket = unique("outage");
    create_s3_bucket(&bucket);
    job.write_config_with_storage("300ms", &format!("s3://{bucket}/ckpt"), "");
    set_checkpoint_timeout(&job, "4s");
    let mut env = s3_env();
    for (k, v) in &mut env {
        if k == "AWS_ENDPOINT_URL" {
            *v = proxy.url();
        }
    }
    let evs = events(12_000, 5, 22);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_000)));
    let mut service = spawn(&job, &env, &[]);
    wait_until("a first commit", Duration::from_secs(120), || {
        service.assert_running();
        job.committed() >= 1_000
    });
    proxy.cut();
    wait_until(
        "a checkpoint to fail and the instance to turn not ready",
        Duration::from_secs(90),
        || {
            service.assert_running();
            metric(job.admin, "streamstate_checkpoints_failed_total") >= 1.0 && !ready(job.admin)
        },
    );
    let frozen = job.committed();
    proxy.restore();
    wait_until("ready again", Duration::from_secs(90), || {
        service.assert_running();
        ready(job.admin)
    });
    assert!(
        job.committed() >= frozen,
        "committed offsets never move back"
    );
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    assert!(
        service
            .log()
            .contains("rewound to the last committed checkpoint"),
        "the failed epochs were rewound in process; log:\n{}",
        service.log()
    );
    service.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(outputs + dead, 12_000);
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn offsets_a_fenced_zombie_sends_after_its_successor_committed_never_count() {
    let job = Job::new("stale-offsets", 4);
    let env = configure(&job, Storage::File, "300ms");
    produce_all(&job.input, &events(3_000, 5, 23), None);
    // The zombie's committer stops between the upload of its first epoch and sending
    // that epoch's offsets, long enough for a successor to fence it and commit.
    let mut zombie = spawn(&job, &env, &[("FAILPOINTS", "after-snapshot=sleep(40000)")]);
    wait_until(
        "the zombie to seal an epoch",
        Duration::from_secs(90),
        || {
            zombie.assert_running();
            metric(job.admin, "streamstate_checkpoint_pause_seconds_count") >= 1.0
        },
    );
    assert_eq!(
        metric(job.admin, "streamstate_checkpoints_completed_total"),
        0.0,
        "the zombie committed nothing"
    );
    let replacement_config = job.write_replacement_config();
    let env_refs: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    let mut successor = Service::spawn(
        &replacement_config,
        &job.dir.path().join("successor.log"),
        &[],
        &env_refs,
    );
    wait_until("the successor to commit", Duration::from_secs(90), || {
        successor.assert_running();
        job.committed() > 0
    });
    zombie.assert_running();
    let status = zombie.wait_exit(Duration::from_secs(90));
    assert!(
        !status.success() && status.signal().is_none(),
        "the zombie ends with an error once its late offsets are refused: {status}"
    );
    assert!(
        zombie.log().contains("fenced"),
        "the zombie says it was fenced; log:\n{}",
        zombie.log()
    );
    wait_all_committed(&job, &mut successor);
    successor.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(outputs + dead, 3_000);
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn idle_gaps_skip_checkpoints_and_bursts_after_them_survive_a_sigkill() {
    let job = Job::new("idle", 4);
    let env = configure(&job, Storage::File, "200ms");
    let mut service = spawn(&job, &env, &[]);
    let mut produced = 0;
    for burst in 0..3u64 {
        produce_all(&job.input, &events(500, 5, 30 + burst), None);
        produced += 500;
        wait_all_committed(&job, &mut service);
        let idle = |admin| {
            (
                metric(admin, "streamstate_checkpoints_completed_total"),
                metric(admin, "streamstate_checkpoints_skipped_total"),
            )
        };
        let (completed, skipped) = idle(job.admin);
        // Nothing arrives now: later barriers find nothing changed.
        wait_until(
            "idle barriers to be skipped",
            Duration::from_secs(60),
            || {
                service.assert_running();
                idle(job.admin).1 >= skipped + 10.0
            },
        );
        let (completed_after, _) = idle(job.admin);
        assert!(
            completed_after <= completed + 1.0,
            "an idle job uploads and commits nothing ({completed} -> {completed_after})"
        );
        let since = metric(job.admin, "streamstate_time_since_last_checkpoint_seconds");
        assert!(
            since < 5.0,
            "a skipped checkpoint with everything committed counts as recent: {since} s"
        );
        assert!(ready(job.admin), "an idle job stays ready");
        if burst == 1 {
            service.sigkill();
            service = spawn(&job, &env, &[]);
        }
    }
    produce_all(&job.input, &events(500, 5, 40), None);
    produced += 500;
    wait_all_committed(&job, &mut service);
    service.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(outputs + dead, produced);
    independent_check(&job, &CheckerOptions::all());
}

#[test]
fn a_smaller_pool_after_a_restart_fences_the_producers_it_no_longer_uses() {
    let job = Job::new("pool-shrink", 4);
    let env = configure(&job, Storage::File, "200ms");
    // A transaction left open would hold read_committed readers back far longer than the
    // checker waits (60 s) before the broker timed it out.
    let config = std::fs::read_to_string(job.config_path()).expect("config");
    let config = config.replace(
        "transaction_timeout = \"30s\"",
        "transaction_timeout = \"300s\"",
    );
    std::fs::write(job.config_path(), config).expect("write config");
    // Input keeps arriving, so every epoch has records (an idle one is skipped): 8 s of
    // it, as a start on busy CI cores (fencing 16 ids) took long enough for 4 s of input
    // to be read as one backlog, leaving too few epochs to fill the pool.
    let evs = events(8_000, 5, 24);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_000)));
    let mut wide = spawn(
        &job,
        &env,
        &[
            ("STREAMSTATE__CHECKPOINT__PRODUCER_POOL_SIZE", "5"),
            ("FAILPOINTS", "during-upload=sleep(1000)"),
        ],
    );
    wait_until(
        "every producer of the pool to hold a transaction",
        Duration::from_secs(90),
        || {
            wide.assert_running();
            metric(job.admin, "streamstate_epochs_in_flight") >= 5.0
        },
    );
    wide.sigkill();
    feeder.join().expect("feeder");
    let mut narrow = spawn(
        &job,
        &env,
        &[("STREAMSTATE__CHECKPOINT__PRODUCER_POOL_SIZE", "2")],
    );
    wait_all_committed(&job, &mut narrow);
    for slot in [2, 3, 4] {
        let id = format!("{}-0-{slot}", job.app_id);
        assert!(
            narrow.log().contains(&id),
            "the narrower pool fences {id}; log:\n{}",
            narrow.log()
        );
    }
    narrow.sigkill();
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(outputs + dead, 8_000);
}
