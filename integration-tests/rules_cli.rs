//! `streamstate rules validate|publish|delete|list|diff` on the real broker. What reached
//! the control topic is always read back with the test's own consumer, never taken from
//! the tool's word: bad files publish nothing, a version not above the one in force
//! publishes nothing, republishing the same files publishes nothing, a delete is one
//! versioned `"status": "deleted"` record.

mod common;

use std::path::Path;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use serde_json::{Value, json};

/// (exit code, stdout, stderr)
fn streamstate(args: &[&str]) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run streamstate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

struct Setup {
    dir: tempfile::TempDir,
    config: String,
    control: String,
}

impl Setup {
    /// A config whose control topic exists (1 partition); input and output are never read.
    fn new(name: &str, bootstrap: &str, create: bool) -> Self {
        let app = unique(name);
        let control = format!("{app}-rules");
        if create {
            create_topics(&[(&control, 1)]);
        }
        let dir = tempfile::tempdir().expect("tempdir");
        let config = dir.path().join("c.toml");
        std::fs::write(
            &config,
            format!(
                r#"
[kafka]
bootstrap_servers = "{bootstrap}"
app_id = "{app}"
input_topics = ["{app}-in"]
output_topic = "{app}-out"
dead_letter_topic = "{app}-dlq"
control_topic = "{control}"
connect_timeout = "3s"
[job]
key = "/user_id"
"#
            ),
        )
        .expect("write config");
        Self {
            config: config.display().to_string(),
            dir,
            control,
        }
    }

    fn file(&self, name: &str, body: &Value) -> String {
        self.raw(name, &body.to_string())
    }

    fn raw(&self, name: &str, text: &str) -> String {
        let p = self.dir.path().join(name);
        std::fs::write(&p, text).expect("write rule file");
        p.display().to_string()
    }

    fn rules(&self, verb: &str, rest: &[&str]) -> (i32, String, String) {
        let mut args = vec!["rules", verb, "--config", &self.config];
        args.extend_from_slice(rest);
        streamstate(&args)
    }

    /// Every record on the control topic: (key, value as JSON or null).
    fn topic(&self) -> Vec<(String, Value)> {
        read_all(&self.control, false)
            .into_iter()
            .map(|r| {
                (
                    String::from_utf8(r.key.expect("keyed")).expect("utf-8 key"),
                    r.value.map_or(Value::Null, |v| {
                        serde_json::from_slice(&v).expect("JSON value")
                    }),
                )
            })
            .collect()
    }
}

fn count_rule(id: &str, version: u64) -> Value {
    json!({"id": id, "version": version, "kind": "aggregate", "aggregate": {"fn": "count"}})
}

#[test]
fn validate_accepts_good_files_and_names_file_rule_and_pointer_of_each_bad_one() {
    let s = Setup::new("rules-validate", "127.0.0.1:1", false);
    let good = s.file(
        "good.json",
        &json!([count_rule("a", 1), count_rule("b", 2)]),
    );
    let shipped = Path::new(env!("CARGO_MANIFEST_DIR")).join("config/rules");
    let mut shipped_files: Vec<String> = std::fs::read_dir(&shipped)
        .expect("config/rules")
        .map(|e| e.expect("entry").path().display().to_string())
        .collect();
    shipped_files.sort();
    let mut args = vec!["rules", "validate", good.as_str()];
    args.extend(shipped_files.iter().map(String::as_str));
    let (code, stdout, stderr) = streamstate(&args);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("ok a version 1") && stdout.contains("ok b version 2"),
        "{stdout}"
    );
    assert!(stdout.contains("ok count-per-user version 1"), "{stdout}");

    // (file, body, the rule id, the pointer the refusal must name)
    let bad: Vec<(String, &str, &str)> = vec![
        (
            s.file(
                "unknown-fn.json",
                &json!({"id": "u", "version": 1, "kind": "aggregate", "aggregate": {"fn": "median", "field": "/x"}}),
            ),
            "\"u\"",
            "/aggregate/fn",
        ),
        (
            s.file(
                "bad-duration.json",
                &json!({"id": "d", "version": 1, "kind": "dedup", "dedup": {"field": "/x", "ttl": "soon"}}),
            ),
            "\"d\"",
            "/dedup/ttl",
        ),
        (
            s.file(
                "second-of-two.json",
                &json!([count_rule("fine", 1), {"id": "w", "version": 1, "kind": "aggregate",
                    "aggregate": {"fn": "count", "window": {"type": "tumbling"}}}]),
            ),
            "\"w\"",
            "/1/aggregate/window",
        ),
        (
            s.file("no-version.json", &json!({"id": "nv", "kind": "aggregate", "aggregate": {"fn": "count"}})),
            "\"nv\"",
            "(document)",
        ),
        (s.raw("not-json.json", "{\"id\": \"x\", "), "?", "(document)"),
    ];
    for (file, id, pointer) in &bad {
        let (code, stdout, stderr) = streamstate(&["rules", "validate", file]);
        assert_eq!(code, 3, "{file} must be refused:\n{stdout}\n{stderr}");
        let expected = format!("refused: {file}: rule {id}: {pointer}");
        assert!(
            stderr.lines().any(|l| l.starts_with(&expected)),
            "expected a line starting {expected:?}:\n{stderr}"
        );
        assert_eq!(
            stderr.lines().filter(|l| l.starts_with("error:")).count(),
            1,
            "{stderr}"
        );
    }
}

#[test]
fn publish_refuses_bad_files_and_stale_versions_and_publishes_nothing() {
    let s = Setup::new("rules-refuse", &bootstrap(), true);
    let good = s.file("good.json", &count_rule("a", 1));
    let bad = s.file(
        "bad.json",
        &json!({"id": "b", "version": 1, "kind": "aggregate", "aggregate": {"fn": "count"}, "extra": 1}),
    );
    let (code, _, stderr) = s.rules("publish", &[&good, &bad]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains(&format!("refused: {bad}: rule \"b\": "))
            && stderr.contains("nothing was published"),
        "{stderr}"
    );
    assert!(
        s.topic().is_empty(),
        "a bad file publishes nothing, not even the good one"
    );

    let (code, stdout, stderr) = s.rules("publish", &[&good]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let mut changed = count_rule("a", 1);
    changed["aggregate"]["fn"] = json!("max");
    changed["aggregate"]["field"] = json!("/x");
    let same_version = s.file("changed.json", &changed);
    let other = s.file("other.json", &count_rule("c", 1));
    let (code, _, stderr) = s.rules("publish", &[&other, &same_version]);
    assert_eq!(code, 3, "{stderr}");
    assert!(
        stderr.contains("version 1 is not above version 1"),
        "names the version in force: {stderr}"
    );
    assert_eq!(
        s.topic().len(),
        1,
        "a stale version publishes nothing, not even the other file's new rule"
    );
}

#[test]
fn publish_list_diff_and_delete_reach_the_control_topic_as_the_job_reads_it() {
    let s = Setup::new("rules-roundtrip", &bootstrap(), true);
    let a1 = s.file("a.json", &count_rule("a", 1));
    let b1 = s.file("b.json", &count_rule("b", 5));
    let (code, stdout, stderr) = s.rules("publish", &[&a1, &b1]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    assert!(
        stdout.contains("published a version 1") && stdout.contains("published b version 5"),
        "{stdout}"
    );
    let records = s.topic();
    assert_eq!(
        records,
        vec![
            ("a".to_string(), count_rule("a", 1)),
            ("b".to_string(), count_rule("b", 5))
        ],
        "record key = rule id, value = the file's rule"
    );

    // Applying the same files again is a no-op (kubectl apply).
    let (code, stdout, _) = s.rules("publish", &[&a1, &b1]);
    assert_eq!(code, 0);
    assert!(stdout.contains("unchanged a version 1"), "{stdout}");
    assert_eq!(s.topic().len(), 2, "nothing republished");

    let (code, stdout, stderr) = s.rules("list", &[]);
    assert_eq!(code, 0, "{stderr}");
    let line = |id: &str| {
        stdout
            .lines()
            .find(|l| l.split_whitespace().next() == Some(id))
            .unwrap_or_else(|| panic!("{id} listed:\n{stdout}"))
            .split_whitespace()
            .map(str::to_string)
            .collect::<Vec<_>>()
    };
    assert_eq!(line("a")[1..4], ["1", "active", "aggregate"]);
    assert_eq!(line("b")[1..3], ["5", "active"]);
    assert!(
        stdout.contains("2 in force, 0 deleted; 2 records read"),
        "{stdout}"
    );

    let mut a2 = count_rule("a", 2);
    a2["aggregate"]["fn"] = json!("sum");
    a2["aggregate"]["field"] = json!("/amount");
    let a2_file = s.file("a2.json", &a2);
    let n = s.file("n.json", &count_rule("n", 1));
    let (code, stdout, stderr) = s.rules("diff", &[&a2_file, &n]);
    assert_eq!(code, 0, "{stderr}");
    assert_eq!(
        stdout,
        "~ a version 1 -> 2\n    /aggregate/field: (none) -> \"/amount\"\n    /aggregate/fn: \"count\" -> \"sum\"\n    /version: 1 -> 2\n\
         + n version 1 (new)\n\
         - b version 5 in force, in none of these files (`rules delete b` removes it)\n"
    );
    assert_eq!(s.topic().len(), 2, "diff publishes nothing");

    let (code, stdout, stderr) = s.rules("publish", &[&a2_file]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let (code, stdout, stderr) = s.rules("delete", &["b"]);
    assert_eq!(code, 0, "{stdout}\n{stderr}");
    let records = s.topic();
    assert_eq!(records.len(), 4, "{records:?}");
    assert_eq!(records[2], ("a".to_string(), a2));
    assert_eq!(
        records[3],
        (
            "b".to_string(),
            json!({"id": "b", "version": 6, "status": "deleted"})
        ),
        "a delete is a newer version with status deleted"
    );

    let (code, _, stderr) = s.rules("delete", &["b"]);
    assert_eq!(code, 3, "deleting twice is refused: {stderr}");
    assert!(stderr.contains("already deleted"), "{stderr}");
    let (code, _, stderr) = s.rules("delete", &["never-published"]);
    assert_eq!(code, 3, "{stderr}");
    let (code, _, stderr) = s.rules("publish", &[&b1]);
    assert_eq!(
        code, 3,
        "an old version cannot bring a deleted rule back: {stderr}"
    );
    assert_eq!(s.topic().len(), 4, "refusals publish nothing");

    let (code, stdout, _) = s.rules("list", &["--json"]);
    assert_eq!(code, 0);
    let listed: Value = serde_json::from_str(&stdout).expect("JSON list");
    let by_id = |id: &str| {
        listed
            .as_array()
            .expect("array")
            .iter()
            .find(|r| r["id"] == id)
            .cloned()
            .unwrap_or_else(|| panic!("{id} in {listed}"))
    };
    assert_eq!(
        (by_id("a")["version"].clone(), by_id("a")["status"].clone()),
        (json!(2), json!("active"))
    );
    assert_eq!(
        (by_id("b")["version"].clone(), by_id("b")["status"].clone()),
        (json!(6), json!("deleted"))
    );
}

#[test]
fn list_reports_records_the_job_would_ignore_or_refuse() {
    let s = Setup::new("rules-skipped", &bootstrap(), true);
    produce_rules(
        &s.control,
        &[
            ("a".into(), Some(count_rule("a", 3).to_string())),
            ("a".into(), Some(count_rule("a", 2).to_string())),
            ("x".into(), Some("{not json".into())),
            (
                "y".into(),
                Some(json!({"id": "y", "version": 1, "kind": "nope"}).to_string()),
            ),
        ],
    );
    let (code, stdout, stderr) = s.rules("list", &[]);
    assert_eq!(code, 0, "{stderr}");
    assert!(
        stdout.contains("1 in force, 0 deleted; 4 records read"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(a): version 2 ignored: not above 3"),
        "{stdout}"
    );
    assert!(
        stdout.contains("(x): ") && stdout.contains("(y): refused by the rule engine"),
        "{stdout}"
    );
}

#[test]
fn unreachable_broker_is_one_error_line_and_exit_1_within_the_connect_timeout() {
    let s = Setup::new("rules-unreachable", "127.0.0.1:1", false);
    let good = s.file("good.json", &count_rule("a", 1));
    for args in [
        vec!["publish", good.as_str()],
        vec!["delete", "a"],
        vec!["list"],
        vec!["diff", good.as_str()],
    ] {
        let started = Instant::now();
        let (code, stdout, stderr) = s.rules(args[0], &args[1..]);
        let took = started.elapsed();
        assert_eq!(code, 1, "{args:?}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{args:?}: one error line:\n{stderr}");
        assert!(
            errors[0].contains("kafka.bootstrap_servers") && errors[0].contains("127.0.0.1:1"),
            "{}",
            errors[0]
        );
        assert!(stdout.is_empty(), "{args:?}: {stdout}");
        assert!(
            took < Duration::from_secs(30),
            "{args:?} gives up after connect_timeout (3s), took {took:?}"
        );
    }
}
