//! `bench/machine.py` decides whether a benchmark run's machine matches the reference run's,
//! which is what says whether its figures may replace BENCHMARKS.md. Its unit tests are
//! Python (`bench/test_machine.py`, the standard library only); this runs them in CI.

use std::path::Path;
use std::process::Command;

#[test]
fn machine_check_flags_a_degraded_machine_and_passes_a_healthy_one() {
    let python = std::env::var("STREAMSTATE_TEST_PYTHON").unwrap_or_else(|_| "python3".into());
    let bench = Path::new(env!("CARGO_MANIFEST_DIR"))
        .parent()
        .expect("bench/generator has a parent");
    let out = Command::new(&python)
        .args(["-m", "unittest", "-v", "test_machine"])
        .current_dir(bench)
        .env("PYTHONDONTWRITEBYTECODE", "1")
        .output()
        .unwrap_or_else(|e| panic!("{python}: {e}"));
    // unittest reports on stderr.
    let report = String::from_utf8_lossy(&out.stderr);
    assert!(
        out.status.success(),
        "bench/test_machine.py failed:\n{report}"
    );
    assert!(
        report.trim_end().ends_with("OK") && !report.contains("Ran 0 tests"),
        "bench/test_machine.py ran no test:\n{report}"
    );
}
