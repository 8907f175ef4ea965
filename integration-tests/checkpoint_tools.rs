//! The offline checkpoint tools and `check-restore` on REAL checkpoints: the `count` job
//! runs on the real broker with 128 key groups, is stopped, and the tests work on the
//! checkpoints it left in storage (file://, and s3:// on the test S3 server).

mod common;

use std::collections::BTreeMap;
use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::OnceLock;
use std::time::Duration;

use common::*;
use serde_json::Value;
use streamstate::checkpoint::{CheckpointRef, CheckpointStorage, FsStorage};
use streamstate::tools::check_restore::{Verdict, check};
use streamstate::tools::{EXIT_REFUSED, fetch};
use streamstate_state::offline::RawSnapshot;
use streamstate_state::{BackendKind, KeyGroups, StateStore, StoreConfig, ValueStateDescriptor};

struct Fixture {
    job: Job,
    /// Events per user, from the input the test produced.
    expected: BTreeMap<String, u64>,
    /// The newest completed checkpoint.
    checkpoint: String,
}

fn expected_counts(evs: &[(Option<String>, Vec<u8>)]) -> BTreeMap<String, u64> {
    let mut m = BTreeMap::new();
    for (_, v) in evs {
        if let Some(u) = user_of(Some(v)) {
            *m.entry(u).or_default() += 1;
        }
    }
    m
}

fn run_count_job(
    job: &Job,
    env: &[(String, String)],
    n: usize,
    seed: u64,
) -> BTreeMap<String, u64> {
    let evs = events(n, 0, seed);
    produce_all(&job.input, &evs, None);
    let mut s = spawn(job, env, &[("STREAMSTATE__STATE__MAX_PARALLELISM", "128")]);
    wait_all_committed(job, &mut s);
    let status = s.terminate(Duration::from_secs(60));
    assert!(status.success(), "service exit {status}; log:\n{}", s.log());
    expected_counts(&evs)
}

fn fixture() -> &'static Fixture {
    static F: OnceLock<Fixture> = OnceLock::new();
    F.get_or_init(|| {
        let job = Job::new("tools", 4);
        job.write_config("500ms", "");
        let expected = run_count_job(&job, &[], 3000, 11);
        let (code, out, err) = tool(&job.config_path(), &["list", "--json"], &[]);
        assert_eq!(code, 0, "{err}");
        let rows: Vec<Value> = serde_json::from_str(&out).expect("list json");
        let checkpoint = rows
            .iter()
            .rev()
            .find(|r| r["completed"] == true)
            .expect("a completed checkpoint")["name"]
            .as_str()
            .unwrap()
            .to_string();
        Fixture {
            job,
            expected,
            checkpoint,
        }
    })
}

/// `streamstate checkpoints --config <config> <args…>`: (exit code, stdout, stderr).
fn tool(config: &Path, args: &[&str], env: &[(String, String)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("checkpoints")
        .arg("--config")
        .arg(config)
        .args(args);
    run(cmd, env)
}

fn check_restore(config: &Path, args: &[&str], env: &[(&str, &str)]) -> (i32, String, String) {
    let mut cmd = Command::new(BIN);
    cmd.arg("check-restore")
        .arg("--config")
        .arg(config)
        .args(args);
    run(
        cmd,
        &env.iter()
            .map(|(k, v)| (k.to_string(), v.to_string()))
            .collect::<Vec<_>>(),
    )
}

fn run(mut cmd: Command, env: &[(String, String)]) -> (i32, String, String) {
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run streamstate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn lines(path: &Path) -> Vec<Value> {
    std::fs::read_to_string(path)
        .expect("export")
        .lines()
        .map(|l| serde_json::from_str(l).expect("json line"))
        .collect()
}

/// Per-key counts of a restored store.
fn counts(store: &StateStore, keys: impl Iterator<Item = String>) -> BTreeMap<String, u64> {
    let count = store
        .value_state(&ValueStateDescriptor::<u64>::new("count"))
        .expect("count state");
    let range = store.key_group_range();
    let mut out = BTreeMap::new();
    for k in keys {
        if !range.contains(store.key_group_of(k.as_bytes())) {
            continue;
        }
        store.set_current_key(k.as_bytes()).expect("key");
        if let Some(n) = count.value().expect("value") {
            out.insert(k, n);
        }
    }
    out
}

fn user_keys() -> impl Iterator<Item = String> {
    (0..KEYS).map(|i| format!("user-{i}"))
}

/// Restores the checkpoint through the library, as the runtime does.
fn restore_checkpoint(f: &Fixture, work: &Path) -> StateStore {
    let storage = FsStorage::open(&f.job.checkpoint_dir(), &f.job.app_id, 0).expect("storage");
    let m = storage
        .read_manifest(&CheckpointRef::parse(&f.checkpoint).expect("name"))
        .expect("manifest");
    let files = work.join("files");
    storage.fetch(&m, &files).expect("fetch");
    let store = StateStore::open(
        StoreConfig::new(
            BackendKind::Rocksdb,
            work.join("state"),
            m.state.identity.max_parallelism,
        )
        .with_key_groups(m.state.identity.key_groups().expect("key groups")),
    )
    .expect("open");
    store.restore(&[(files, m.state)]).expect("restore");
    store
}

/// A store numbered like the fixture job's state: its 4 input partitions divide the
/// 128 key groups, so the job started with them aligned to the partitions.
fn fixture_config(backend: BackendKind, dir: PathBuf) -> StoreConfig {
    StoreConfig::new(backend, dir, 128)
        .with_key_groups(KeyGroups::aligned(128, 4).expect("4 divides 128"))
}

fn restore_savepoint(dir: &Path, config: StoreConfig) -> StateStore {
    let store = StateStore::open(config).expect("open");
    store
        .restore_savepoint(&[dir.to_path_buf()])
        .expect("restore savepoint");
    store
}

#[test]
fn list_inspect_and_verify_real_checkpoints() {
    let f = fixture();
    let config = f.job.config_path();
    let (code, out, _) = tool(&config, &["list"], &[]);
    assert_eq!(code, 0);
    assert!(
        out.contains("COMPLETED")
            && out.contains(&f.checkpoint.split('-').nth(2).unwrap().to_string()),
        "{out}"
    );
    let (code, out, err) = tool(&config, &["inspect", &f.checkpoint], &[]);
    assert_eq!(code, 0, "{err}");
    let r: Value = serde_json::from_str(&out).expect("inspect json");
    assert_eq!(r["snapshot"]["max_parallelism"], 128);
    assert_eq!(
        r["snapshot"]["key_group_range"],
        serde_json::json!({"start": 0, "end": 127})
    );
    assert_eq!(r["states"]["count"]["entries"], f.expected.len() as u64);
    assert_eq!(r["states"]["count"]["schema"]["value_type"], "u64");
    let next: i64 = r["offsets"]
        .as_array()
        .unwrap()
        .iter()
        .map(|o| o["offset"].as_i64().unwrap())
        .sum();
    assert_eq!(
        next,
        f.job.input_end(),
        "the final checkpoint's offsets are the end of the input"
    );
    // The offsets are the source's operator state (union list), decoded by inspect.
    let source = &r["operator_lists"]["streamstate.source_offsets"];
    assert_eq!(source["mode"], "union", "{r}");
    assert_eq!(source["offsets"], r["offsets"], "{r}");
    assert_eq!(source["entries"], 4, "one entry per input partition: {r}");
    let control = &r["operator_lists"]["streamstate.control_offsets"];
    assert_eq!(control["offsets"], r["control_offsets"], "{r}");
    // A bare id resolves too.
    let id = f.checkpoint.split('-').nth(1).unwrap();
    let (code, out, err) = tool(&config, &["verify", id], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("ok"), "{out}");
}

fn copy_dir(from: &Path, to: &Path) {
    std::fs::create_dir_all(to).unwrap();
    for e in std::fs::read_dir(from).unwrap() {
        let e = e.unwrap();
        let target = to.join(e.file_name());
        if e.file_type().unwrap().is_dir() {
            copy_dir(&e.path(), &target);
        } else {
            std::fs::copy(e.path(), &target).unwrap();
        }
    }
}

/// A copy of the job's checkpoint storage and a config pointing at it.
fn storage_copy(f: &Fixture, name: &str) -> (tempfile::TempDir, PathBuf, PathBuf) {
    let dir = tempfile::tempdir().unwrap();
    let copy = dir.path().join(name);
    copy_dir(&f.job.checkpoint_dir(), &copy);
    let text = std::fs::read_to_string(f.job.config_path()).unwrap();
    let text = text.replace(
        &f.job.checkpoint_dir().display().to_string(),
        &copy.display().to_string(),
    );
    let config = dir.path().join("copy.toml");
    std::fs::write(&config, text).unwrap();
    let chk_dir = copy.join(&f.job.app_id).join("instance-0");
    (dir, config, chk_dir)
}

#[test]
fn verify_names_a_flipped_byte_and_a_missing_file() {
    let f = fixture();
    let storage = FsStorage::open(&f.job.checkpoint_dir(), &f.job.app_id, 0).unwrap();
    let m = storage
        .read_manifest(&CheckpointRef::parse(&f.checkpoint).unwrap())
        .unwrap();

    // A flipped byte in a shared (SST) file, stored under its SHA-256.
    let sst = m
        .state
        .files
        .iter()
        .find(|x| x.path.ends_with(".sst"))
        .expect("an SST in a rocksdb checkpoint");
    let (_keep, config, root) = storage_copy(f, "flipped");
    let stored = root.join("shared").join(&sst.sha256);
    let mut bytes = std::fs::read(&stored).unwrap();
    let mid = bytes.len() / 2;
    bytes[mid] ^= 0x01;
    std::fs::write(&stored, bytes).unwrap();
    let (code, out, err) = tool(&config, &["verify", &f.checkpoint], &[]);
    assert_eq!(code, EXIT_REFUSED as i32, "{out}{err}");
    assert!(
        out.contains(&sst.path) && out.contains("SHA-256"),
        "names the file: {out}"
    );
    assert!(err.contains(&sst.path), "{err}");
    // The tools refuse to read it too, naming it.
    let (code, _, err) = tool(&config, &["export", &f.checkpoint], &[]);
    assert_ne!(code, 0);
    assert!(err.contains(&sst.path), "{err}");

    // A missing file of the checkpoint's own directory.
    let (_keep2, config, root) = storage_copy(f, "missing");
    let gone = root.join(&f.checkpoint).join("state-meta.json");
    std::fs::remove_file(&gone).unwrap();
    let (code, out, err) = tool(&config, &["verify", &f.checkpoint], &[]);
    assert_eq!(code, EXIT_REFUSED as i32, "{out}{err}");
    assert!(
        out.contains("state-meta.json") && out.contains("missing"),
        "{out}"
    );
}

#[test]
fn export_import_round_trip_equals_the_source() {
    let f = fixture();
    let config = f.job.config_path();
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    let (code, _, err) = tool(
        &config,
        &[
            "export",
            &f.checkpoint,
            "--format",
            "jsonl",
            "--out",
            a.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let sp = dir.path().join("savepoint");
    let (code, out, err) = tool(
        &config,
        &[
            "import",
            a.to_str().unwrap(),
            "--savepoint-dir",
            sp.to_str().unwrap(),
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let b = dir.path().join("b.jsonl");
    let (code, _, err) = tool(
        &config,
        &["export", sp.to_str().unwrap(), "--out", b.to_str().unwrap()],
        &[],
    );
    assert_eq!(code, 0, "{err}");
    let (la, lb) = (lines(&a), lines(&b));
    assert_eq!(la.len(), f.expected.len() + 1, "header + one line per key");
    assert_eq!(la[1..], lb[1..], "every entry identical");
    for field in [
        "states",
        "max_parallelism",
        "key_group_range",
        "operator_lists",
        "broadcast",
    ] {
        assert_eq!(la[0][field], lb[0][field], "{field}");
    }
    assert_eq!(
        la[0]["origin"]["offsets"], lb[0]["origin"]["offsets"],
        "the savepoint carries the checkpoint's offsets"
    );
    // Typed values from the count job's codec.
    let user = f.expected.keys().next().unwrap();
    let line = la.iter().find(|l| l["key"] == user.as_str()).unwrap();
    assert_eq!(line["value"], f.expected[user]);
    assert_eq!(line["state"], "count");
    // Restored, both hold exactly the model's per-key state.
    let from_checkpoint = counts(&restore_checkpoint(f, &dir.path().join("c")), user_keys());
    let from_savepoint = counts(
        &restore_savepoint(
            &sp,
            fixture_config(BackendKind::Rocksdb, dir.path().join("s")),
        ),
        user_keys(),
    );
    assert_eq!(from_checkpoint, f.expected);
    assert_eq!(from_savepoint, f.expected);
}

#[test]
fn rekey_128_to_256_then_two_instances_hold_exactly_the_same_state() {
    let f = fixture();
    let dir = tempfile::tempdir().unwrap();
    let sp = dir.path().join("rekeyed");
    let (code, out, err) = tool(
        &f.job.config_path(),
        &[
            "surgery",
            &f.checkpoint,
            "--savepoint-dir",
            sp.to_str().unwrap(),
            "rekey",
            "--max-parallelism",
            "256",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(
        report["max_parallelism"],
        serde_json::json!({"from": 128, "to": 256})
    );
    let mut union = BTreeMap::new();
    for i in 0..2 {
        let config = StoreConfig::new(BackendKind::Rocksdb, dir.path().join(format!("i{i}")), 256)
            .for_instance(i, 2);
        let store = restore_savepoint(&sp, config);
        let part = counts(&store, user_keys());
        assert!(!part.is_empty(), "instance {i} owns some keys");
        for (k, v) in part {
            assert!(union.insert(k, v).is_none(), "a key on two instances");
        }
    }
    assert_eq!(union, f.expected);
    // The source checkpoint is untouched.
    let (code, _, _) = tool(&f.job.config_path(), &["verify", &f.checkpoint], &[]);
    assert_eq!(code, 0);
}

#[test]
fn delete_key_removes_the_key_from_every_state_and_nothing_else() {
    let f = fixture();
    let config = f.job.config_path();
    let dir = tempfile::tempdir().unwrap();
    let victim = f.expected.keys().nth(3).unwrap().clone();
    let sp = dir.path().join("forgotten");
    let (code, out, err) = tool(
        &config,
        &[
            "surgery",
            &f.checkpoint,
            "--savepoint-dir",
            sp.to_str().unwrap(),
            "delete-key",
            &victim,
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["total_removed"], 1, "{report}");
    assert_eq!(report["removed"][0]["state"], "count");
    let (before, after) = (
        dir.path().join("before.jsonl"),
        dir.path().join("after.jsonl"),
    );
    assert_eq!(
        tool(
            &config,
            &["export", &f.checkpoint, "--out", before.to_str().unwrap()],
            &[]
        )
        .0,
        0
    );
    assert_eq!(
        tool(
            &config,
            &[
                "export",
                sp.to_str().unwrap(),
                "--out",
                after.to_str().unwrap()
            ],
            &[]
        )
        .0,
        0
    );
    let kept: Vec<Value> = lines(&before)[1..]
        .iter()
        .filter(|l| l["key"] != victim.as_str())
        .cloned()
        .collect();
    assert_eq!(kept.len(), f.expected.len() - 1);
    assert_eq!(lines(&after)[1..], kept[..]);
    let restored = counts(
        &restore_savepoint(
            &sp,
            fixture_config(BackendKind::Hashmap, dir.path().join("s")),
        ),
        user_keys(),
    );
    let mut model = f.expected.clone();
    model.remove(&victim);
    assert_eq!(restored, model);
}

#[test]
fn check_restore_cli_keeps_refuses_drops_and_checks_key_groups() {
    let f = fixture();
    let config = f.job.config_path();
    let (code, out, err) = check_restore(&config, &["--from", &f.checkpoint], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(
        out.contains("keep") && out.contains("count") && out.contains("would succeed"),
        "{out}"
    );
    // The job no longer declares "count" (the rule engine has no keyed state yet).
    let dir = tempfile::tempdir().unwrap();
    let rules = dir.path().join("rules.toml");
    std::fs::write(
        &rules,
        std::fs::read_to_string(&config)
            .unwrap()
            .replace(r#"function = "count""#, r#"function = "rules""#),
    )
    .unwrap();
    let (code, out, err) = check_restore(&rules, &["--from", &f.checkpoint], &[]);
    assert_eq!(code, EXIT_REFUSED as i32, "{out}{err}");
    assert!(
        out.contains("fail") && out.contains("count") && err.contains("count"),
        "{out}{err}"
    );
    let (code, out, _) = check_restore(&rules, &["--from", &f.checkpoint, "--allow-drop"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("drop"), "{out}");
    // A different key-group count than the snapshot's.
    let (code, out, _) = check_restore(
        &config,
        &["--from", &f.checkpoint],
        &[("STREAMSTATE__STATE__MAX_PARALLELISM", "256")],
    );
    assert_eq!(code, EXIT_REFUSED as i32, "{out}");
    assert!(
        out.contains("<key groups>") && out.contains("rekey"),
        "{out}"
    );
    // `latest` (what the Helm hook uses); no checkpoint at all is a first start.
    let (code, out, _) = check_restore(&config, &["--from", "latest"], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains(&f.checkpoint), "{out}");
    let empty = dir.path().join("empty.toml");
    let text = std::fs::read_to_string(&config).unwrap();
    std::fs::write(
        &empty,
        text.replace(
            &f.job.checkpoint_dir().display().to_string(),
            &dir.path().join("none").display().to_string(),
        ),
    )
    .unwrap();
    let (code, out, err) = check_restore(&empty, &["--from", "latest"], &[]);
    assert_eq!(code, 0, "{out}{err}");
    assert!(out.contains("first start"), "{out}");
    // JSON, and savepoint directories work as sources.
    let sp = dir.path().join("sp");
    assert_eq!(
        tool(
            &config,
            &[
                "surgery",
                &f.checkpoint,
                "--savepoint-dir",
                sp.to_str().unwrap(),
                "rename-state",
                "count",
                "n"
            ],
            &[]
        )
        .0,
        0
    );
    let (code, out, _) = check_restore(&config, &["--from", sp.to_str().unwrap(), "--json"], &[]);
    assert_eq!(code, EXIT_REFUSED as i32, "{out}");
    let r: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(r["ok"], false);
}

#[derive(Debug, Clone, PartialEq, serde::Serialize, serde::Deserialize)]
struct CountV2 {
    n: u64,
    first_seen_ms: Option<u64>,
}

#[test]
fn check_restore_schema_changes_then_the_migrated_restore_succeeds() {
    let f = fixture();
    let config = streamstate::config::Config::load(&f.job.config_path()).unwrap();
    let fetched = fetch(&config, &f.checkpoint, true).unwrap();
    let meta = RawSnapshot::read_meta(&fetched.dir).unwrap();
    let verdict = |declared: &[streamstate_state::StateDeclaration]| {
        check(
            &meta.part.states,
            meta.part.identity.max_parallelism,
            declared,
            None,
            false,
        )
        .into_iter()
        .map(|l| (l.name, l.verdict, l.reason))
        .collect::<Vec<_>>()
    };
    // Unchanged, plus a new state: keep + new.
    let v = verdict(&[
        ValueStateDescriptor::<u64>::new("count").declaration(),
        ValueStateDescriptor::<String>::new("last").declaration(),
    ]);
    assert!(
        v.iter().any(|l| l.0 == "count" && l.1 == Verdict::Keep)
            && v.iter().any(|l| l.0 == "last" && l.1 == Verdict::New),
        "{v:?}"
    );
    // Incompatible: refused, naming the state.
    let v = verdict(&[ValueStateDescriptor::<String>::new("count").declaration()]);
    let bad = v.iter().find(|l| l.1 == Verdict::Fail).expect("refused");
    assert_eq!(bad.0, "count");
    // Added field with a default: migrate.
    let v2 = || {
        let mut d = ValueStateDescriptor::<CountV2>::new("count").with_schema_version(2);
        d.schema = d
            .schema
            .with_serde_migration::<u64, CountV2>(1, |n| CountV2 {
                n,
                first_seen_ms: None,
            });
        d
    };
    let v = verdict(&[v2().declaration()]);
    assert!(
        v.iter().any(|l| l.0 == "count" && l.1 == Verdict::Migrate),
        "{v:?}"
    );
    // …and the restore then succeeds with the migrated values.
    let dir = tempfile::tempdir().unwrap();
    let store = restore_checkpoint(f, dir.path());
    let count = store.value_state(&v2()).expect("migrating registration");
    for (k, n) in &f.expected {
        store.set_current_key(k.as_bytes()).unwrap();
        assert_eq!(
            count.value().unwrap(),
            Some(CountV2 {
                n: *n,
                first_seen_ms: None
            })
        );
    }
    // The incompatible one fails at registration too, as check-restore said.
    let store = restore_checkpoint(f, &dir.path().join("again"));
    let err = store
        .value_state(&ValueStateDescriptor::<String>::new("count"))
        .err()
        .expect("refused")
        .to_string();
    assert!(err.contains("'count'"), "{err}");
}

#[test]
fn tools_work_on_s3_storage() {
    let job = Job::new("tools-s3", 2);
    let env = configure(&job, Storage::S3, "500ms");
    let expected = run_count_job(&job, &env, 500, 5);
    let config = job.config_path();
    let (code, out, err) = tool(&config, &["list", "--json"], &env);
    assert_eq!(code, 0, "{err}");
    let rows: Vec<Value> = serde_json::from_str(&out).unwrap();
    let name = rows
        .iter()
        .rev()
        .find(|r| r["completed"] == true)
        .expect("completed")["name"]
        .as_str()
        .unwrap()
        .to_string();
    let (code, out, err) = tool(&config, &["verify", &name], &env);
    assert_eq!(code, 0, "{out}{err}");
    let dir = tempfile::tempdir().unwrap();
    let a = dir.path().join("a.jsonl");
    assert_eq!(
        tool(
            &config,
            &["export", &name, "--out", a.to_str().unwrap()],
            &env
        )
        .0,
        0
    );
    let exported: BTreeMap<String, u64> = lines(&a)[1..]
        .iter()
        .map(|l| {
            (
                l["key"].as_str().unwrap().to_string(),
                l["value"].as_u64().unwrap(),
            )
        })
        .collect();
    assert_eq!(exported, expected);
    let sp = dir.path().join("sp");
    let (code, out, err) = tool(
        &config,
        &[
            "import",
            a.to_str().unwrap(),
            "--savepoint-dir",
            sp.to_str().unwrap(),
        ],
        &env,
    );
    assert_eq!(code, 0, "{out}{err}");
    let (code, out, err) = check_restore(
        &config,
        &["--from", &name],
        &env.iter()
            .map(|(k, v)| (k.as_str(), v.as_str()))
            .collect::<Vec<_>>(),
    );
    assert_eq!(code, 0, "{out}{err}");
}

#[test]
fn add_ttl_and_drop_state_on_a_real_checkpoint_then_check_restore_judges_them() {
    let f = fixture();
    let config = f.job.config_path();
    let dir = tempfile::tempdir().unwrap();
    // add-ttl: entries get a last access of now and expire an hour later.
    let sp = dir.path().join("ttl");
    let (code, out, err) = tool(
        &config,
        &[
            "surgery",
            &f.checkpoint,
            "--savepoint-dir",
            sp.to_str().unwrap(),
            "add-ttl",
            "count",
            "--ttl",
            "1h",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    let report: Value = serde_json::from_str(&out).unwrap();
    assert_eq!(report["entries"], f.expected.len() as u64);
    let exported = dir.path().join("ttl.jsonl");
    assert_eq!(
        tool(
            &config,
            &[
                "export",
                sp.to_str().unwrap(),
                "--out",
                exported.to_str().unwrap()
            ],
            &[]
        )
        .0,
        0
    );
    let l = lines(&exported);
    assert!(l[1..].iter().all(|e| e["ttl_expires_at_ms"].as_u64()
        == Some(e["ttl_last_access_ms"].as_u64().unwrap() + 3_600_000)));
    // The count job declares no TTL: check-restore refuses, naming the state and the reason.
    let (code, out, _) = check_restore(&config, &["--from", sp.to_str().unwrap()], &[]);
    assert_eq!(code, EXIT_REFUSED as i32, "{out}");
    assert!(out.contains("count") && out.contains("TTL"), "{out}");
    // A job that declares the TTL reads every value.
    let store = restore_savepoint(
        &sp,
        fixture_config(BackendKind::Rocksdb, dir.path().join("s")),
    );
    let ttl = streamstate_state::TtlConfig::new(Duration::from_secs(3600));
    let count = store
        .value_state(&ValueStateDescriptor::<u64>::new("count").with_ttl(ttl))
        .expect("count with TTL");
    for (k, n) in &f.expected {
        store.set_current_key(k.as_bytes()).unwrap();
        assert_eq!(count.value().unwrap(), Some(*n));
    }
    // drop-state: the job's state is new (empty) again, which restores fine.
    let sp = dir.path().join("dropped");
    let (code, out, err) = tool(
        &config,
        &[
            "surgery",
            &f.checkpoint,
            "--savepoint-dir",
            sp.to_str().unwrap(),
            "drop-state",
            "count",
        ],
        &[],
    );
    assert_eq!(code, 0, "{out}{err}");
    assert_eq!(
        serde_json::from_str::<Value>(&out).unwrap()["entries_removed"],
        f.expected.len() as u64
    );
    let (code, out, _) = check_restore(&config, &["--from", sp.to_str().unwrap()], &[]);
    assert_eq!(code, 0, "{out}");
    assert!(out.contains("new") && out.contains("starts empty"), "{out}");
}
