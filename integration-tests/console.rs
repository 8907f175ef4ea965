//! The web console in a real browser against a running instance on the real broker:
//! `integration-tests/console/console.spec.mjs` drives Debian's Chromium with
//! playwright-core (from `web/node_modules`, `npm ci` in `web/`), sees throughput rising,
//! is refused a checkpoint without the token, takes one with it and finds it in the
//! history, publishes a rule through the editor and sees it active, looks up a key and
//! finds the count the reference model expects, measures what `GET /` loads against the
//! 200 KB budget, and writes the screenshots in `docs/console-*.png`. This side then
//! checks the same facts through the API and the control topic, independently of the page.

mod common;

use std::path::{Path, PathBuf};
use std::process::Command;
use std::sync::atomic::{AtomicBool, Ordering};
use std::time::Duration;

use common::*;

const TOKEN: &str = "console-t0ken";

fn chromium() -> PathBuf {
    let path = PathBuf::from(
        std::env::var("STREAMSTATE_TEST_CHROMIUM").unwrap_or_else(|_| "/usr/bin/chromium".into()),
    );
    assert!(
        path.is_file(),
        "{} not found: integration-tests/install-deps.sh installs Debian's chromium",
        path.display()
    );
    path
}

fn repo() -> &'static Path {
    Path::new(env!("CARGO_MANIFEST_DIR"))
}

fn playwright_installed() {
    let module = repo().join("web/node_modules/playwright-core/package.json");
    assert!(
        module.is_file(),
        "{} not found: run `npm ci` in web/ (integration-tests/run.sh does)",
        module.display()
    );
}

/// Good events per user, from what the test produced (the checker's own decoding).
fn model_count(evs: &[(Option<String>, Vec<u8>)], user: &str) -> u64 {
    evs.iter()
        .filter(|(_, v)| user_of(Some(v)).as_deref() == Some(user))
        .count() as u64
}

#[test]
fn the_console_shows_live_throughput_takes_a_checkpoint_publishes_a_rule_and_shows_state() {
    let browser = chromium();
    playwright_installed();
    let job = Job::new("console", 4);
    job.write_config("2s", &format!("token = \"{TOKEN}\"\n"));
    // Keys the lookup reads are produced once, before the start; the live feed below
    // uses other keys, so their counts stay what the model says while input flows.
    let evs = events(2_000, 10, 22);
    produce_all(&job.input, &evs, None);
    let mut service = job.spawn();
    wait_until("/readyz to answer 200", Duration::from_secs(90), || {
        service.assert_running();
        http("GET", job.admin, "/readyz").is_ok_and(|(s, _)| s == 200)
    });
    let consumed = || {
        http("GET", job.admin, "/metrics")
            .map(|(_, t)| metric_sum(&t, "streamstate_records_consumed_total") as usize)
            .unwrap_or(0)
    };
    wait_until("the first batch consumed", Duration::from_secs(120), || {
        service.assert_running();
        consumed() >= evs.len()
    });

    let stop = AtomicBool::new(false);
    let rule_id = unique("console-rule");
    let user = "user-7";
    let expected = model_count(&evs, user);
    assert!(expected > 0, "the seed gives {user} some events");
    let output = std::thread::scope(|s| {
        // A steady live feed (about 200 records/s) for the throughput charts.
        s.spawn(|| {
            let p = producer();
            let mut i = 0u64;
            while !stop.load(Ordering::SeqCst) {
                for _ in 0..20 {
                    let key = format!("live-{}", i % 50);
                    let v = format!(r#"{{"user_id":"{key}","seq":{i},"amount":{}}}"#, i % 97);
                    produce(&p, &job.input, Some(&key), v.as_bytes());
                    i += 1;
                }
                p.poll(Duration::from_millis(100));
            }
            flush(&p);
        });
        let out = Command::new("node")
            .arg(repo().join("integration-tests/console/console.spec.mjs"))
            .env("CONSOLE_URL", format!("http://{}", job.admin))
            .env("CONSOLE_TOKEN", TOKEN)
            .env("CONSOLE_KEY", user)
            .env("CONSOLE_EXPECTED", expected.to_string())
            .env("CONSOLE_RULE_ID", &rule_id)
            .env("CONSOLE_SHOTS", repo().join("docs"))
            .env("CHROMIUM", &browser)
            .output()
            .expect("node (Node.js 18 or newer) runs the browser test");
        stop.store(true, Ordering::SeqCst);
        out
    });
    let stdout = String::from_utf8_lossy(&output.stdout);
    let stderr = String::from_utf8_lossy(&output.stderr);
    println!("{stdout}");
    eprintln!("{stderr}");
    assert!(
        output.status.success(),
        "the browser test failed ({}):\n{stdout}\n{stderr}\n--- service log ---\n{}",
        output.status,
        service.log()
    );
    let load: u64 = stdout
        .lines()
        .find_map(|l| l.strip_prefix("CONSOLE_LOAD_BYTES=")?.parse().ok())
        .expect("the browser test reports the console's load size");
    assert!(load > 1_000 && load < 200 * 1024, "console load {load} B");

    // The same facts through the API, without the page.
    let a = http_with("GET", job.admin, "/checkpoints", &[], b"").expect("checkpoints");
    let all = a.json();
    let manual: Vec<_> = all
        .as_array()
        .expect("list")
        .iter()
        .filter(|c| c["trigger"] == "manual")
        .collect();
    assert_eq!(
        manual.len(),
        1,
        "one manual checkpoint, the page's: {}",
        a.body
    );
    let phases = &manual[0]["phases"];
    for phase in [
        "snapshot_ms",
        "flush_ms",
        "upload_ms",
        "materialize_ms",
        "commit_ms",
    ] {
        assert!(
            phases[phase].is_u64(),
            "the manual checkpoint's {phase}: {}",
            a.body
        );
    }
    assert!(
        phases["materialize_ms"].as_u64() <= phases["upload_ms"].as_u64(),
        "materialize is a part of the upload: {}",
        a.body
    );
    let a = http_with("GET", job.admin, &format!("/rules/{rule_id}"), &[], b"").expect("rule");
    assert_eq!(a.status, 200, "{}", a.body);
    let v = a.json();
    assert_eq!(
        (v["version"].as_u64(), v["status"].as_str()),
        (Some(1), Some("active")),
        "{}",
        a.body
    );
    assert_eq!(v["rule"]["filter"]["gt"], 50, "{}", a.body);
    assert!(
        v["matches"].is_u64() && v["outputs"].is_u64(),
        "a rule's counts: {}",
        a.body
    );
    // Published to the control topic, keyed by its id, once.
    let records: Vec<_> = read_all(&job.control, false)
        .into_iter()
        .filter(|r| r.key.as_deref() == Some(rule_id.as_bytes()))
        .collect();
    assert_eq!(records.len(), 1, "one control-topic record for {rule_id}");
    for shot in ["overview", "checkpoints", "rules", "state", "transactions"] {
        let png = repo().join(format!("docs/console-{shot}.png"));
        let bytes = std::fs::read(&png).unwrap_or_else(|e| panic!("{}: {e}", png.display()));
        assert!(
            bytes.starts_with(b"\x89PNG") && bytes.len() > 10_000,
            "{}",
            png.display()
        );
    }
    service.terminate(Duration::from_secs(60));
}

#[test]
fn the_console_is_served_gzipped_with_cache_headers_and_a_strict_policy() {
    let job = Job::new("console-assets", 1);
    job.write_config("2s", &format!("token = \"{TOKEN}\"\n"));
    let mut service = job.spawn();
    wait_until("the admin server", Duration::from_secs(90), || {
        service.assert_running();
        http("GET", job.admin, "/livez").is_ok_and(|(s, _)| s == 200)
    });
    let page = http_with("GET", job.admin, "/", &[], b"").expect("GET /");
    assert_eq!(page.status, 200);
    assert!(
        page.head.contains("content-type: text/html"),
        "{}",
        page.head
    );
    assert!(
        page.head.contains("cache-control: no-cache"),
        "{}",
        page.head
    );
    assert!(
        page.head
            .contains("content-security-policy: default-src 'none'; script-src 'self'"),
        "{}",
        page.head
    );
    assert!(
        page.head.contains("x-content-type-options: nosniff"),
        "{}",
        page.head
    );
    let etag = page
        .head
        .lines()
        .find_map(|l| l.strip_prefix("etag: "))
        .expect("etag")
        .to_string();
    let again = http_with("GET", job.admin, "/", &[("If-None-Match", &etag)], b"").expect("GET /");
    assert_eq!(again.status, 304, "{}", again.head);
    let script = page
        .body
        .split('"')
        .find(|s| s.starts_with("/assets/") && s.ends_with(".js"))
        .expect("index.html loads a script")
        .to_string();
    assert!(
        !page.body.contains("<script>"),
        "no inline script: {}",
        page.body
    );
    let js = http_with(
        "GET",
        job.admin,
        &script,
        &[("Accept-Encoding", "gzip")],
        b"",
    )
    .expect("js");
    assert_eq!(js.status, 200);
    assert!(js.head.contains("content-encoding: gzip"), "{}", js.head);
    assert!(
        js.head
            .contains("cache-control: public, max-age=31536000, immutable"),
        "{}",
        js.head
    );
    let missing = http_with("GET", job.admin, "/assets/console-nope.js", &[], b"").expect("404");
    assert_eq!(missing.status, 404);
    // The page adds no unauthenticated mutation: publishing a rule needs the token.
    let rule = br#"{"id":"x","version":1,"kind":"aggregate","aggregate":{"fn":"count","emit":"every_event"}}"#;
    let refused = http_with("POST", job.admin, "/rules", &[], rule).expect("post");
    assert_eq!(refused.status, 401, "{}", refused.body);
    let auth = format!("Bearer {TOKEN}");
    let bad = http_with(
        "POST",
        job.admin,
        "/rules",
        &[("Authorization", &auth)],
        br#"{"id":"x","version":1,"kind":"aggregate"}"#,
    )
    .expect("post");
    assert_eq!(bad.status, 400, "the engine's reason: {}", bad.body);
    assert!(bad.json()["error"].as_str().is_some_and(|e| !e.is_empty()));
    service.terminate(Duration::from_secs(60));
}
