//! Start-up behaviour a user meets first: bad config stops with one line naming the key,
//! and `demo` runs with no broker installed while its metrics rise.

mod common;

use std::net::SocketAddr;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;

const MINIMAL: &str = r#"
[kafka]
bootstrap_servers = "127.0.0.1:1"
app_id = "cli-test"
input_topics = ["in"]
output_topic = "out"
dead_letter_topic = "dlq"
connect_timeout = "2s"
[job]
key = "/user_id"
"#;

/// Runs the binary; returns (exit success, stderr).
fn run(args: &[&str], body: &str, env: &[(&str, &str)]) -> (bool, String) {
    let dir = tempfile::tempdir().expect("tempdir");
    let path = dir.path().join("c.toml");
    std::fs::write(&path, body).expect("write");
    let mut cmd = Command::new(BIN);
    cmd.args(args)
        .arg("--config")
        .arg(&path)
        .env("RUST_LOG", "off");
    cmd.env("STREAMSTATE__STATE__DIR", dir.path().join("state"));
    cmd.env(
        "STREAMSTATE__CHECKPOINT__STORAGE",
        format!("file://{}", dir.path().join("chk").display()),
    );
    for (k, v) in env {
        cmd.env(k, v);
    }
    let out = cmd.output().expect("run streamstate");
    (
        out.status.success(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

fn error_line(stderr: &str) -> String {
    let lines: Vec<&str> = stderr
        .lines()
        .filter(|l| l.starts_with("error: "))
        .collect();
    assert_eq!(
        lines.len(),
        1,
        "exactly one error line expected, got:\n{stderr}"
    );
    lines[0].to_string()
}

#[test]
fn valid_config_passes_check_config() {
    let (ok, stderr) = run(&["check-config"], MINIMAL, &[]);
    assert!(ok, "{stderr}");
}

#[test]
fn unknown_key_is_refused_naming_it() {
    let (ok, stderr) = run(
        &["run"],
        &format!("{MINIMAL}\n[state]\nbakend = \"rocksdb\"\n"),
        &[],
    );
    assert!(!ok);
    assert!(error_line(&stderr).contains("bakend"), "{stderr}");
}

#[test]
fn bad_duration_is_refused_naming_the_key() {
    let (ok, stderr) = run(
        &["run"],
        &format!("{MINIMAL}\n[checkpoint]\ninterval = \"often\"\n"),
        &[],
    );
    assert!(!ok);
    let line = error_line(&stderr);
    assert!(
        line.contains("interval") && line.contains("often"),
        "{line}"
    );
}

#[test]
fn environment_overrides_file_and_is_validated_too() {
    let (ok, stderr) = run(
        &["check-config"],
        MINIMAL,
        &[("STREAMSTATE__CHECKPOINT__INTERVAL", "whenever")],
    );
    assert!(!ok);
    let line = error_line(&stderr).to_lowercase();
    assert!(
        line.contains("checkpoint.interval") && line.contains("environment"),
        "{stderr}"
    );
    let (ok, stderr) = run(
        &["check-config"],
        MINIMAL,
        &[("STREAMSTATE__STATE__BACKEND", "hashmap")],
    );
    assert!(ok, "{stderr}");
    let (ok, stderr) = run(
        &["check-config"],
        MINIMAL,
        &[("STREAMSTATE__STATE__BACKEND", "leveldb")],
    );
    assert!(!ok);
    assert!(
        error_line(&stderr).to_lowercase().contains("backend"),
        "{stderr}"
    );
}

#[test]
fn unreachable_broker_stops_start_naming_bootstrap_servers() {
    let started = Instant::now();
    let (ok, stderr) = run(&["run"], MINIMAL, &[]);
    assert!(!ok);
    let line = error_line(&stderr);
    assert!(
        line.contains("kafka.bootstrap_servers") && line.contains("127.0.0.1:1"),
        "{line}"
    );
    assert!(
        started.elapsed() < Duration::from_secs(60),
        "must give up after connect_timeout"
    );
}

#[test]
fn demo_runs_without_a_broker_and_metrics_rise() {
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let log_dir = tempfile::tempdir().expect("tempdir");
    let log_path = log_dir.path().join("demo.log");
    let log = std::fs::File::create(&log_path).expect("log file");
    let mut child = Command::new(BIN)
        .args([
            "demo",
            "--duration",
            "60s",
            "--admin-listen",
            &admin.to_string(),
        ])
        .env("RUST_LOG", "info,librdkafka=warn")
        .stdout(std::process::Stdio::null())
        .stderr(log)
        .spawn()
        .expect("spawn demo");
    let scrape = || -> Option<(f64, f64)> {
        let (status, body) = http("GET", admin, "/metrics").ok()?;
        (status == 200).then(|| {
            (
                metric_sum(&body, "streamstate_records_consumed_total"),
                metric_sum(&body, "streamstate_records_produced_total"),
            )
        })
    };
    let mut samples = Vec::new();
    let started = Instant::now();
    for at in [15, 35, 55] {
        wait_until("demo sample time", Duration::from_secs(120), || {
            started.elapsed() >= Duration::from_secs(at)
        });
        assert!(
            child.try_wait().expect("try_wait").is_none(),
            "demo exited early"
        );
        samples.push(scrape().expect("scrape /metrics from the demo"));
    }
    for w in samples.windows(2) {
        assert!(
            w[1].0 > w[0].0 && w[1].1 > w[0].1,
            "consumed and produced must rise: {samples:?}"
        );
    }
    let (_, body) = http("GET", admin, "/metrics").expect("scrape");
    assert_eq!(
        metric_sum(&body, "streamstate_rules_active"),
        5.0,
        "the demo's five rules are in force"
    );
    let status = child.wait().expect("demo exit");
    let stderr = std::fs::read_to_string(&log_path).expect("demo log");
    assert!(
        status.success(),
        "demo must exit 0 after --duration; stderr:\n{stderr}"
    );
    assert!(
        stderr.contains("demo progress"),
        "demo prints what it is doing:\n{stderr}"
    );
}

#[test]
fn non_loopback_admin_listener_without_a_token_is_refused() {
    let body = format!("{MINIMAL}\n[admin]\nlisten = \"0.0.0.0:9464\"\n");
    for cmd in ["check-config", "run"] {
        let (ok, stderr) = run(&[cmd], &body, &[]);
        assert!(
            !ok,
            "{cmd}: a non-loopback listener without a token must be refused"
        );
        let line = error_line(&stderr);
        assert!(
            line.contains("admin.listen") || line.contains("admin.token"),
            "{cmd}: names the key: {line}"
        );
    }
    let (ok, stderr) = run(
        &["check-config"],
        &body,
        &[("STREAMSTATE__ADMIN__TOKEN", "t0ken-xyz")],
    );
    assert!(ok, "with a token it is accepted: {stderr}");
    assert!(!stderr.contains("t0ken-xyz"));
}
