//! The soak's short form: `integration-tests/soak.sh --minutes 2` on the real broker (the
//! long form, 60 minutes, runs from `battery.sh --long`; docs/reliability.md). It asserts
//! what the soak must never get wrong — the independent checker finds every input's
//! output exactly once, the service survives and stops cleanly — and that the summary
//! was written with its figures. Speed figures are reported, never asserted.

mod common;

use std::path::Path;
use std::process::Command;

use common::*;

#[test]
fn soak_short_form_is_exactly_once_and_writes_its_summary() {
    let out = tempfile::tempdir().expect("tempdir");
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration-tests/soak.sh");
    let status = Command::new(&script)
        // A fixed, modest rate keeps CI's data small enough for check.py as well; the
        // maximum is still measured (and reported), so that part runs too.
        .args([
            "--minutes",
            "2",
            "--prefill",
            "50000",
            "--rate",
            "2000",
            "--out",
        ])
        .arg(out.path())
        .env("STREAMSTATE_BIN", BIN)
        .env("STREAMSTATE_TEST_BOOTSTRAP", bootstrap())
        .status()
        .expect("run soak.sh");
    let text = std::fs::read_to_string(out.path().join("summary.json"))
        .unwrap_or_else(|e| panic!("soak.sh ({status}) wrote no summary.json: {e}"));
    let s: serde_json::Value = serde_json::from_str(&text).expect("summary.json is JSON");
    let checker = &s["checker"];
    assert_eq!(checker["ok"], true, "follow checker: {text}");
    assert_eq!(
        (
            &checker["missing"],
            &checker["duplicated"],
            &checker["wrong"]
        ),
        (&0.into(), &0.into(), &0.into()),
        "{text}"
    );
    // Every record the producer sent was processed and checked, not just some.
    assert!(s["produced"].as_u64().is_some_and(|n| n > 0), "{text}");
    assert_eq!(checker["expected_outputs"], s["produced"], "{text}");
    // The short form is small enough for the whole-history checker too; both must agree.
    assert_eq!(s["checker_whole_history"]["ok"], true, "check.py: {text}");
    assert_eq!(
        s["checker_whole_history"]["outputs"], s["produced"],
        "{text}"
    );
    assert_eq!(s["service_exit_code"], 0, "{text}");
    for figure in [
        "max_throughput_events_per_s",
        "max_throughput_prefilled_events_per_s",
        "max_throughput_while_producing_events_per_s",
        "rss_kib_start",
        "rss_kib_end",
        "rss_growth_kib_per_hour",
        "latency_ms_p99",
        "checkpoint_seconds_p99_le",
    ] {
        assert!(
            s[figure].is_number(),
            "{figure} missing from the summary: {text}"
        );
    }
    assert!(s["samples"].as_u64().is_some_and(|n| n >= 2), "{text}");
    let txt = std::fs::read_to_string(out.path().join("summary.txt")).expect("summary.txt");
    assert!(txt.contains("checker: ok=True"), "{txt}");
    assert!(status.success(), "soak.sh exited {status}; summary: {text}");
}
