//! README's "Running against your own Kafka" walk-through, run as the README prints it.
//!
//! The commands are not copied here: they are read from README.md, from the code blocks
//! marked with an HTML comment on the line before them:
//!
//! - `<!-- walkthrough: run -->`: a shell block, run with `bash -euo pipefail` from the
//!   repository root; it must exit 0.
//! - `<!-- walkthrough: background -->`: a shell block started and left running (the
//!   job); it gets SIGTERM at the end and must then exit 0.
//! - `<!-- walkthrough: output -->` / `<!-- walkthrough: output unordered -->`: a text
//!   block, the stdout the previous `run` block must print, line for line (unordered: the
//!   same lines in any order). `<...>` in a line stands for one value that differs per run.
//!
//! Substituted, and nothing else: `127.0.0.1:19092` (the rig broker's default address)
//! by `STREAMSTATE_TEST_BOOTSTRAP`, `$CARGO_TARGET_DIR/release/streamstate` by the binary
//! cargo built for this test, and `config/local.toml`'s `bootstrap_servers` through the
//! documented override `STREAMSTATE__KAFKA__BOOTSTRAP_SERVERS`. Before it starts, the test
//! removes what an earlier walk-through left: the topics `events`, `results`,
//! `events-dlq`, `rules`, the group `local` and `/tmp/streamstate` (the config's state
//! and checkpoint directories).

mod common;

use std::path::Path;
use std::process::{Child, Command, Stdio};
use std::time::{Duration, Instant};

use common::*;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::Consumer;

const README_ADDRESS: &str = "127.0.0.1:19092";
const README_BINARY: &str = "$CARGO_TARGET_DIR/release/streamstate";
const TOPICS: [&str; 4] = ["events", "results", "events-dlq", "rules"];
/// How long one `run` block may take (JVM start-ups on a loaded 2-core machine included).
const BLOCK_TIMEOUT: Duration = Duration::from_secs(240);

#[derive(Debug, Clone, PartialEq, Eq)]
enum Block {
    Run(String),
    Background(String),
    Output { text: String, unordered: bool },
}

/// The marked blocks of `markdown`, in order.
fn marked_blocks(markdown: &str) -> Vec<Block> {
    let mut out = Vec::new();
    let mut lines = markdown.lines();
    while let Some(line) = lines.next() {
        let Some(kind) = line
            .trim()
            .strip_prefix("<!-- walkthrough:")
            .and_then(|r| r.strip_suffix("-->"))
            .map(str::trim)
        else {
            continue;
        };
        let fence = lines.next().unwrap_or_default();
        assert!(
            fence.starts_with("```"),
            "README: `<!-- walkthrough: {kind} -->` must be followed by a code block, got {fence:?}"
        );
        let body: Vec<&str> = lines
            .by_ref()
            .take_while(|l| !l.starts_with("```"))
            .collect();
        let text = body.join("\n") + "\n";
        out.push(match kind {
            "run" => Block::Run(text),
            "background" => Block::Background(text),
            "output" => Block::Output {
                text,
                unordered: false,
            },
            "output unordered" => Block::Output {
                text,
                unordered: true,
            },
            other => panic!("README: unknown walkthrough block kind {other:?}"),
        });
    }
    out
}

/// `line` matches `pattern` where each `<...>` in the pattern stands for a non-empty value
/// without `"`, `,` or braces.
fn line_matches(pattern: &str, line: &str) -> bool {
    let mut literals = Vec::new();
    let mut rest = pattern;
    while let Some(open) = rest.find('<') {
        match rest[open..].find('>') {
            Some(close) => {
                literals.push(&rest[..open]);
                rest = &rest[open + close + 1..];
            }
            None => break,
        }
    }
    literals.push(rest);
    let Some(mut tail) = line.strip_prefix(literals[0]) else {
        return false;
    };
    for (i, lit) in literals.iter().enumerate().skip(1) {
        let last = i == literals.len() - 1;
        let at = if last {
            tail.ends_with(lit).then(|| tail.len() - lit.len())
        } else if lit.is_empty() {
            return false;
        } else {
            tail.find(lit)
        };
        let Some(at) = at else {
            return false;
        };
        let value = &tail[..at];
        if value.is_empty() || value.contains(['"', ',', '{', '}']) {
            return false;
        }
        tail = &tail[at + lit.len()..];
    }
    tail.is_empty()
}

fn outputs_match(expected: &str, actual: &str, unordered: bool) -> bool {
    let want: Vec<&str> = expected.lines().collect();
    let mut got: Vec<&str> = actual.lines().collect();
    if want.len() != got.len() {
        return false;
    }
    if !unordered {
        return want.iter().zip(&got).all(|(w, g)| line_matches(w, g));
    }
    // Each expected line takes one actual line it matches (placeholders make sorting
    // unreliable, so match greedily; the sample lines differ in their fixed parts).
    for w in want {
        match got.iter().position(|g| line_matches(w, g)) {
            Some(i) => {
                got.remove(i);
            }
            None => return false,
        }
    }
    true
}

fn substitute(block: &str) -> String {
    block
        .replace(README_ADDRESS, &bootstrap())
        .replace(README_BINARY, BIN)
}

fn shell(block: &str) -> Command {
    let mut cmd = Command::new("bash");
    cmd.args(["-euo", "pipefail", "-c", &substitute(block)])
        .current_dir(env!("CARGO_MANIFEST_DIR"))
        .env("STREAMSTATE__KAFKA__BOOTSTRAP_SERVERS", bootstrap())
        .env("RUST_LOG", "warn");
    cmd
}

/// Runs a block to its end; returns stdout, panicking with stderr when it fails.
fn run_block(block: &str) -> String {
    let dir = tempfile::tempdir().expect("tempdir");
    let (out_path, err_path) = (dir.path().join("stdout"), dir.path().join("stderr"));
    let mut child = shell(block)
        .stdin(Stdio::null())
        .stdout(std::fs::File::create(&out_path).expect("stdout file"))
        .stderr(std::fs::File::create(&err_path).expect("stderr file"))
        .spawn()
        .expect("spawn bash");
    let deadline = Instant::now() + BLOCK_TIMEOUT;
    let status = loop {
        if let Some(s) = child.try_wait().expect("try_wait") {
            break s;
        }
        if Instant::now() > deadline {
            let _ = child.kill();
            let _ = child.wait();
            panic!(
                "README block did not finish within {BLOCK_TIMEOUT:?}:\n{block}\nstderr:\n{}",
                std::fs::read_to_string(&err_path).unwrap_or_default()
            );
        }
        std::thread::sleep(Duration::from_millis(100));
    };
    let stdout = std::fs::read_to_string(&out_path).expect("stdout");
    let stderr = std::fs::read_to_string(&err_path).expect("stderr");
    assert!(
        status.success(),
        "README block failed ({status}):\n{block}\nstdout:\n{stdout}\nstderr:\n{stderr}"
    );
    stdout
}

/// Removes what an earlier walk-through left on the broker and on disk.
fn clean_slate() {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let probe = consumer(None, false);
    let present = |name: &str| {
        probe
            .fetch_metadata(Some(name), Duration::from_secs(5))
            .is_ok_and(|md| {
                md.topics()
                    .iter()
                    .any(|t| t.name() == name && t.error().is_none())
            })
    };
    let existing: Vec<&str> = TOPICS.iter().copied().filter(|t| present(t)).collect();
    if !existing.is_empty() {
        let results =
            futures::executor::block_on(admin.delete_topics(&existing, &AdminOptions::new()))
                .expect("delete topics");
        for r in results {
            if let Err((t, e)) = r {
                panic!("delete topic {t}: {e}");
            }
        }
        wait_until(
            "the old walk-through topics to be gone",
            Duration::from_secs(60),
            || existing.iter().all(|t| !present(t)),
        );
    }
    // The group's offsets went with its topics; an empty group left behind is harmless,
    // but delete it so the start is truly the first. "Not found" is fine.
    let _ = futures::executor::block_on(admin.delete_groups(&["local"], &AdminOptions::new()));
    let _ = std::fs::remove_dir_all("/tmp/streamstate");
}

struct Background(Child);

impl Drop for Background {
    fn drop(&mut self) {
        let _ = self.0.kill();
        let _ = self.0.wait();
    }
}

#[test]
fn readme_walkthrough_runs_as_printed_and_prints_what_it_promises() {
    let readme = std::fs::read_to_string(Path::new(env!("CARGO_MANIFEST_DIR")).join("README.md"))
        .expect("README.md");
    let blocks = marked_blocks(&readme);
    let runs = blocks.iter().filter(|b| matches!(b, Block::Run(_))).count();
    let checked = blocks
        .iter()
        .filter(|b| matches!(b, Block::Output { .. }))
        .count();
    assert!(
        runs >= 5 && checked >= 4,
        "README's walk-through lost its marked blocks ({runs} run, {checked} output)"
    );
    let all: String = blocks
        .iter()
        .filter_map(|b| match b {
            Block::Run(t) | Block::Background(t) => Some(t.as_str()),
            Block::Output { .. } => None,
        })
        .collect();
    assert!(
        all.contains(README_ADDRESS) && all.contains(README_BINARY),
        "the substitutions must apply: the blocks name {README_ADDRESS} and {README_BINARY}"
    );
    clean_slate();
    let mut background: Vec<(String, Background)> = Vec::new();
    let mut last_stdout: Option<(String, String)> = None;
    let log_dir = tempfile::tempdir().expect("tempdir");
    for block in &blocks {
        match block {
            Block::Run(text) => {
                for (_, Background(child)) in &mut background {
                    assert!(
                        child.try_wait().expect("try_wait").is_none(),
                        "a background block exited before: {text}"
                    );
                }
                last_stdout = Some((text.clone(), run_block(text)));
            }
            Block::Background(text) => {
                let log = log_dir
                    .path()
                    .join(format!("background-{}.log", background.len()));
                let child = shell(text)
                    .stdin(Stdio::null())
                    .stdout(Stdio::null())
                    .stderr(std::fs::File::create(&log).expect("log"))
                    .spawn()
                    .expect("spawn background block");
                background.push((log.display().to_string(), Background(child)));
            }
            Block::Output { text, unordered } => {
                let (command, stdout) = last_stdout
                    .take()
                    .expect("an output block follows a run block");
                assert!(
                    outputs_match(text, &stdout, *unordered),
                    "README promises{}:\n{text}\nbut\n{command}\nprinted:\n{stdout}",
                    if *unordered { " (in any order)" } else { "" }
                );
            }
        }
    }
    for (log, Background(child)) in &mut background {
        let pid = child.id().to_string();
        // bash -c with one command execs it, so the pid is the job's own.
        let _ = Command::new("kill").args(["-TERM", &pid]).status();
        let deadline = Instant::now() + Duration::from_secs(90);
        let status = loop {
            if let Some(s) = child.try_wait().expect("try_wait") {
                break s;
            }
            assert!(Instant::now() < deadline, "the job did not stop on SIGTERM");
            std::thread::sleep(Duration::from_millis(100));
        };
        assert!(
            status.success(),
            "the job must stop cleanly on SIGTERM ({status}):\n{}",
            std::fs::read_to_string(log.as_str()).unwrap_or_default()
        );
    }
}

#[test]
fn placeholders_match_one_value_and_nothing_else() {
    assert!(line_matches(r#"{"a":<ms>,"b":1}"#, r#"{"a":1733,"b":1}"#));
    assert!(!line_matches(r#"{"a":<ms>,"b":1}"#, r#"{"a":1733,"b":2}"#));
    assert!(!line_matches(r#"{"a":<ms>,"b":1}"#, r#"{"a":,"b":1}"#));
    assert!(!line_matches(r#"{"a":<ms>}"#, r#"{"a":1,"c":2}"#));
    assert!(line_matches("no placeholder", "no placeholder"));
    assert!(!line_matches("no placeholder", "no placeholder, more"));
    assert!(outputs_match("x 1\ny <n>\n", "y 7\nx 1\n", true));
    assert!(!outputs_match("x 1\ny <n>\n", "y 7\nx 1\n", false));
}
