//! `streamstate topics check|create` on the real broker: every topic a config needs is
//! listed, missing and wrongly configured ones fail the check (exit 3) with a reason,
//! `create` makes the missing ones with the settings the check asks for and never touches
//! an existing topic, and an unreachable broker is one `error:` line and exit 1.

mod common;

use std::collections::BTreeMap;
use std::path::PathBuf;
use std::process::Command;
use std::time::{Duration, Instant};

use common::*;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, ResourceSpecifier, TopicReplication};
use rdkafka::client::DefaultClientContext;

struct Names {
    app: String,
    input: String,
    output: String,
    dlq: String,
    control: String,
}

fn names(prefix: &str) -> Names {
    let app = unique(prefix);
    Names {
        input: format!("{app}-in"),
        output: format!("{app}-out"),
        dlq: format!("{app}-dlq"),
        control: format!("{app}-rules"),
        app,
    }
}

fn write_config(dir: &tempfile::TempDir, n: &Names, bootstrap: &str, extra_job: &str) -> PathBuf {
    let path = dir.path().join("c.toml");
    std::fs::write(
        &path,
        format!(
            r#"
[kafka]
bootstrap_servers = "{bootstrap}"
app_id = "{app}"
input_topics = ["{input}"]
output_topic = "{output}"
dead_letter_topic = "{dlq}"
control_topic = "{control}"
connect_timeout = "3s"
[job]
key = "/user_id"
{extra_job}
"#,
            app = n.app,
            input = n.input,
            output = n.output,
            dlq = n.dlq,
            control = n.control,
        ),
    )
    .expect("write config");
    path
}

/// (exit code, stdout, stderr)
fn streamstate(args: &[&str], config: &PathBuf) -> (i32, String, String) {
    let out = Command::new(BIN)
        .args(args)
        .arg("--config")
        .arg(config)
        .env("RUST_LOG", "warn")
        .output()
        .expect("run streamstate");
    (
        out.status.code().unwrap_or(-1),
        String::from_utf8_lossy(&out.stdout).into_owned(),
        String::from_utf8_lossy(&out.stderr).into_owned(),
    )
}

/// The table row of `topic`, split on runs of two or more spaces.
fn row(stdout: &str, topic: &str) -> Vec<String> {
    let line = stdout
        .lines()
        .filter(|l| !l.starts_with("created "))
        .find(|l| l.split_whitespace().nth(1) == Some(topic))
        .unwrap_or_else(|| panic!("no row for {topic} in:\n{stdout}"));
    line.split("  ")
        .map(str::trim)
        .filter(|c| !c.is_empty())
        .map(str::to_string)
        .collect()
}

fn topic_config(topic: &str) -> BTreeMap<String, String> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin");
    let spec = ResourceSpecifier::Topic(topic);
    let res = futures::executor::block_on(admin.describe_configs([&spec], &AdminOptions::new()))
        .expect("describe");
    res.into_iter()
        .next()
        .expect("one result")
        .expect("described")
        .entries
        .into_iter()
        .filter_map(|e| Some((e.name, e.value?)))
        .collect()
}

fn create_with(topic: &str, partitions: i32, settings: &[(&str, &str)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin");
    let new = settings.iter().fold(
        NewTopic::new(topic, partitions, TopicReplication::Fixed(1)),
        |t, (k, v)| t.set(k, v),
    );
    for r in futures::executor::block_on(admin.create_topics([&new], &AdminOptions::new()))
        .expect("create")
    {
        r.unwrap_or_else(|(t, e)| panic!("create {t}: {e}"));
    }
}

fn wait_visible(topics: &[&str]) {
    use rdkafka::consumer::Consumer;
    let probe = consumer(None, false);
    wait_until(
        "the new topics to have leaders",
        Duration::from_secs(30),
        || {
            topics.iter().all(|t| {
                probe
                    .fetch_metadata(Some(t), Duration::from_secs(5))
                    .is_ok_and(|md| {
                        md.topics().iter().any(|m| {
                            m.name() == *t
                                && m.error().is_none()
                                && m.partitions().iter().all(|p| p.leader() >= 0)
                        })
                    })
            })
        },
    );
}

#[test]
fn check_lists_every_needed_topic_and_create_makes_the_missing_ones_usable() {
    let n = names("topics-create");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(&dir, &n, &bootstrap(), "repartition = true");
    let repartition = format!("{}-repartition", n.app);

    let (code, stdout, stderr) = streamstate(&["topics", "check"], &config);
    assert_eq!(
        code, 3,
        "missing topics fail the check:\n{stdout}\n{stderr}"
    );
    for (topic, role) in [
        (&n.input, "input"),
        (&n.output, "output"),
        (&n.dlq, "dead-letter"),
        (&n.control, "control"),
    ] {
        let r = row(&stdout, topic);
        assert_eq!(
            (r[0].as_str(), r[3].as_str()),
            (role, "MISSING"),
            "{stdout}"
        );
    }
    assert_eq!(row(&stdout, &repartition)[3], "absent", "{stdout}");
    assert!(
        stderr.contains("error: 4 of 5 topics missing or wrong")
            && stderr.contains("topics create"),
        "{stderr}"
    );

    let (code, stdout, stderr) = streamstate(&["topics", "create", "--partitions", "3"], &config);
    assert_eq!(code, 0, "create then check passes:\n{stdout}\n{stderr}");
    for t in [&n.input, &n.output, &n.dlq, &n.control, &repartition] {
        assert!(stdout.contains(&format!("created {t} (")), "{stdout}");
        assert_eq!(row(&stdout, t)[3], "ok", "{stdout}");
    }
    // What the broker has, read independently of the tool.
    assert_eq!(row(&stdout, &n.input)[2], "3");
    assert_eq!(
        row(&stdout, &repartition)[2],
        "3",
        "one partition per key group"
    );
    assert_eq!(topic_config(&n.control)["cleanup.policy"], "compact");
    let dlq_max: usize = topic_config(&n.dlq)["max.message.bytes"]
        .parse()
        .expect("number");
    assert!(
        dlq_max >= 1_000_000,
        "the largest dead letter fits: {dlq_max}"
    );

    let (code, stdout, _) = streamstate(&["topics", "create"], &config);
    assert_eq!(code, 0);
    assert!(stdout.contains("nothing to create"), "{stdout}");
}

#[test]
fn check_names_wrong_settings_and_create_leaves_existing_topics_alone() {
    let n = names("topics-wrong");
    let dir = tempfile::tempdir().expect("tempdir");
    // Two keyed instances with 4 key groups need 2 or 4 input partitions, not 3.
    let config = write_config(
        &dir,
        &n,
        &bootstrap(),
        "instances = 2\nmax_record_bytes = 500000\n[state]\nmax_parallelism = 4",
    );
    create_with(&n.input, 3, &[]);
    create_with(&n.output, 2, &[]);
    create_with(&n.dlq, 1, &[("max.message.bytes", "100000")]);
    create_with(&n.control, 1, &[("cleanup.policy", "delete")]);
    wait_visible(&[&n.input, &n.output, &n.dlq, &n.control]);
    for verb in ["check", "create"] {
        let (code, stdout, stderr) = streamstate(&["topics", verb], &config);
        assert_eq!(code, 3, "{verb}:\n{stdout}\n{stderr}");
        let input = row(&stdout, &n.input);
        assert_eq!(input[3], "WRONG", "{stdout}");
        assert!(
            input[4].contains("divides state.max_parallelism (4)")
                && input[4].contains("at least job.instances (2)"),
            "{stdout}"
        );
        let dlq = row(&stdout, &n.dlq);
        assert_eq!(dlq[3], "WRONG", "{stdout}");
        assert!(
            dlq[4].contains("max.message.bytes 100000 <"),
            "names the setting and its value: {stdout}"
        );
        let control = row(&stdout, &n.control);
        assert_eq!(control[3], "WRONG", "{stdout}");
        assert!(
            control[4].contains("cleanup.policy delete must be compact"),
            "{stdout}"
        );
        assert_eq!(row(&stdout, &n.output)[3], "ok", "{stdout}");
    }
    assert_eq!(
        topic_config(&n.control)["cleanup.policy"],
        "delete",
        "create never changes an existing topic"
    );
}

#[test]
fn unreachable_broker_is_one_error_line_and_exit_1_within_the_connect_timeout() {
    let n = names("topics-unreachable");
    let dir = tempfile::tempdir().expect("tempdir");
    let config = write_config(&dir, &n, "127.0.0.1:1", "");
    for verb in ["check", "create"] {
        let started = Instant::now();
        let (code, stdout, stderr) = streamstate(&["topics", verb], &config);
        let took = started.elapsed();
        assert_eq!(code, 1, "{verb}: {stderr}");
        let errors: Vec<&str> = stderr.lines().filter(|l| l.starts_with("error:")).collect();
        assert_eq!(errors.len(), 1, "{verb}: one error line:\n{stderr}");
        assert!(
            errors[0].contains("kafka.bootstrap_servers") && errors[0].contains("127.0.0.1:1"),
            "{}",
            errors[0]
        );
        assert!(stdout.is_empty(), "no table without a cluster: {stdout}");
        assert!(
            took < Duration::from_secs(30),
            "{verb} gives up after connect_timeout (3s), took {took:?}"
        );
    }
}
