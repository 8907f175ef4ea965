//! The broker goes away and comes back (the rig's own stop/start) while records flow:
//! the service rides it out by itself, output stays exactly-once, and no transaction is
//! left hanging. Its own test binary, because it bounces the broker every test shares.

mod common;

use std::time::Duration;

use common::*;

#[test]
fn broker_restart_mid_run_is_survived_without_duplicates_or_hanging_transactions() {
    let job = Job::new("broker-restart", 4);
    job.write_config("300ms", "");
    let evs = events(12_000, 5, 31);
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_500)));
    let mut service = job.spawn();
    wait_until("some input committed", Duration::from_secs(60), || {
        service.assert_running();
        job.committed() >= 2_000
    });
    kafka_rig("stop");
    service.assert_running();
    kafka_rig("start");
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut service);
    service.assert_running();
    let status = service.terminate(Duration::from_secs(60));
    assert!(status.success(), "SIGTERM after the bounce must exit 0: {status}; log:\n{}", service.log());

    // A marker written after the run must be readable by a read_committed reader on every
    // output partition: an open (hanging) transaction would hold the LSO back.
    let p = producer();
    for partition in 0..job.partitions {
        let record = rdkafka::producer::BaseRecord::<str, str>::to(&job.output).partition(partition).payload("marker");
        p.send(record).map_err(|(e, _)| e).expect("queue marker");
    }
    flush(&p);
    let output = read_all(&job.output, true);
    let markers = output.iter().filter(|r| r.value.as_deref() == Some(b"marker".as_slice())).count();
    assert_eq!(markers, job.partitions as usize, "every partition's marker must be readable");
    // The checker parses outputs as JSON: leave the markers out by checking before them.
    let (outputs, dead) = check_exactly_once_ignoring(&job, b"marker");
    assert_eq!(outputs + dead, 12_000);
}
