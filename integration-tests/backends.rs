//! Both state backends end to end, on the real broker: a savepoint taken on one backend
//! restores on the other while input keeps arriving, the checkpoints after the switch are
//! the new backend's, a SIGKILL after the switch recovers from them, and the output is
//! exactly once. (The exactly-once, rules and savepoint suites themselves run once per
//! backend: `run.sh` repeats them with `STREAMSTATE_TEST_BACKEND=hashmap`.)

mod common;

use std::path::Path;
use std::time::Duration;

use common::*;

#[test]
fn savepoint_taken_on_rocksdb_restores_on_hashmap_under_load() {
    switch_backend_under_load("rocksdb", "hashmap");
}

#[test]
fn savepoint_taken_on_hashmap_restores_on_rocksdb_under_load() {
    switch_backend_under_load("hashmap", "rocksdb");
}

/// The backend each run uses comes from `STREAMSTATE__STATE__BACKEND`, which overrides
/// the config file's `[state] backend`.
fn switch_backend_under_load(from: &str, to: &str) {
    let job = Job::new(&format!("switch-{from}"), 4);
    job.write_config("300ms", "");
    let evs = events(24_000, 5, 41);
    let input = job.input.clone();
    // About 16 s of input: the stop, the restart and the kill all happen while it flows.
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(1_500)));

    let mut first = job.spawn_with(&[], &[("STREAMSTATE__STATE__BACKEND", from)]);
    wait_until(
        "the first run to commit input",
        Duration::from_secs(120),
        || {
            first.assert_running();
            job.committed() >= 3_000
        },
    );
    assert_backend(&first, from);
    let stop =
        http_with("POST", job.admin, "/stop", &[], br#"{"savepoint": true}"#).expect("POST /stop");
    assert_eq!(stop.status, 200, "{}", stop.body);
    let savepoint = stop.json()["savepoint"]["id"]
        .as_str()
        .expect("savepoint id")
        .to_string();
    let status = first.wait_exit(Duration::from_secs(60));
    assert!(status.success(), "stop: {status}; log:\n{}", first.log());
    let at_stop = job.committed();
    assert!(
        at_stop < 24_000,
        "the input must still be arriving at the switch (committed {at_stop})"
    );

    let env = [("STREAMSTATE__STATE__BACKEND", to)];
    let mut second = job.spawn_with(&["--from-savepoint", &savepoint], &env);
    wait_until(
        "the restored run to commit more input",
        Duration::from_secs(120),
        || {
            second.assert_running();
            job.committed() >= at_stop + 2_000
        },
    );
    let log = second.log();
    assert!(
        log.contains("restored state from savepoint") && log.contains(&savepoint),
        "log:\n{log}"
    );
    assert_backend(&second, to);
    // A crash after the switch recovers from the new backend's own checkpoint.
    second.sigkill();
    let mut third = job.spawn_with(&[], &env);
    feeder.join().expect("feeder");
    wait_all_committed(&job, &mut third);
    assert_backend(&third, to);
    third.sigkill();

    // A savepoint `sp-<n>-<run>` is stored as `chk-<n>-<run>`, in file storage of its own
    // below `savepoints/`.
    let stored = savepoint.replacen("sp-", "chk-", 1);
    let savepoints = job
        .checkpoint_dir()
        .join("savepoints")
        .join(&job.app_id)
        .join("instance-0");
    assert_eq!(
        manifest_backend(&savepoints.join(stored).join("manifest.json")),
        from,
        "the savepoint is {from}'s"
    );
    let newest = newest_checkpoint(&job.checkpoint_dir().join(&job.app_id).join("instance-0"));
    assert_eq!(manifest_backend(&newest), to, "{}", newest.display());
    let (outputs, dead) = check_exactly_once(&job);
    assert_eq!(
        outputs + dead,
        24_000,
        "every input is an output or a dead letter"
    );
    independent_check(&job, &CheckerOptions::all());
}

/// The `state.backend` a manifest records: the backend that wrote the snapshot.
fn manifest_backend(manifest: &Path) -> String {
    let bytes = std::fs::read(manifest).unwrap_or_else(|e| panic!("{}: {e}", manifest.display()));
    let v: serde_json::Value = serde_json::from_slice(&bytes).expect("manifest JSON");
    v["state"]["backend"]
        .as_str()
        .unwrap_or_else(|| panic!("no state.backend in {v}"))
        .to_string()
}
