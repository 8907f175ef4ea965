//! Shared rig for integration tests on the real broker started by `kafka/kafka.sh`.
//!
//! The checking side here reads with its own consumers and recomputes expectations from
//! the input it produced; it shares no processing code with the service.

#![allow(dead_code)]

use std::collections::{BTreeMap, HashMap};
use std::io::{Read, Write};
use std::net::{SocketAddr, TcpListener, TcpStream};
use std::path::{Path, PathBuf};
use std::process::{Child, Command, ExitStatus, Stdio};
use std::sync::atomic::{AtomicU32, Ordering};
use std::time::{Duration, Instant};

use rand::{Rng, SeedableRng};
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::consumer::{BaseConsumer, Consumer};
use rdkafka::message::{Headers, Message};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use rdkafka::{ClientConfig, Offset, TopicPartitionList};

pub mod proxy;

pub const BIN: &str = env!("CARGO_BIN_EXE_streamstate");

pub fn bootstrap() -> String {
    std::env::var("STREAMSTATE_TEST_BOOTSTRAP").unwrap_or_else(|_| "127.0.0.1:19092".to_string())
}

/// The S3-compatible test server started by `integration-tests/s3/moto.sh start`.
pub fn s3_endpoint() -> String {
    std::env::var("STREAMSTATE_TEST_S3_ENDPOINT")
        .unwrap_or_else(|_| "http://127.0.0.1:19000".to_string())
}

/// Creates `bucket` on the test S3 server with an unsigned `PUT /<bucket>`, which moto
/// accepts (the service's client has no bucket API).
pub fn create_s3_bucket(bucket: &str) {
    let endpoint = s3_endpoint();
    let hint = "is the test S3 server up? run `integration-tests/s3/moto.sh start`";
    let addr = url::Url::parse(&endpoint)
        .ok()
        .and_then(|u| u.socket_addrs(|| None).ok())
        .and_then(|a| a.into_iter().next())
        .unwrap_or_else(|| {
            panic!("STREAMSTATE_TEST_S3_ENDPOINT={endpoint} is not an http://host:port URL")
        });
    let (status, body) = http("PUT", addr, &format!("/{bucket}"))
        .unwrap_or_else(|e| panic!("create bucket {bucket} at {endpoint}: {e}; {hint}"));
    assert_eq!(status, 200, "create bucket {bucket} at {endpoint}: {body}");
}

/// Environment for a service that keeps checkpoints on the test S3 server: its endpoint,
/// plus test credentials and region unless this process's environment sets them.
pub fn s3_env() -> Vec<(String, String)> {
    let or = |k: &str, default: &str| {
        (
            k.to_string(),
            std::env::var(k).unwrap_or_else(|_| default.to_string()),
        )
    };
    vec![
        ("AWS_ENDPOINT_URL".to_string(), s3_endpoint()),
        or("AWS_ACCESS_KEY_ID", "test"),
        or("AWS_SECRET_ACCESS_KEY", "test"),
        or("AWS_REGION", "us-east-1"),
    ]
}

/// Polls `cond` until it holds or the deadline passes; panics with `what` on timeout.
pub fn wait_until(what: &str, timeout: Duration, mut cond: impl FnMut() -> bool) {
    let deadline = Instant::now() + timeout;
    while !cond() {
        assert!(
            Instant::now() < deadline,
            "timed out after {timeout:?} waiting for: {what}"
        );
        std::thread::sleep(Duration::from_millis(100));
    }
}

/// The state backend of every service a test configures through [`Job`]:
/// `STREAMSTATE_TEST_BACKEND` (`rocksdb` when unset, or `hashmap`). `run.sh` runs the
/// exactly-once, rules and savepoint tests a second time with `hashmap`.
pub fn test_backend() -> &'static str {
    match std::env::var("STREAMSTATE_TEST_BACKEND").as_deref() {
        Err(_) | Ok("") | Ok("rocksdb") => "rocksdb",
        Ok("hashmap") => "hashmap",
        Ok(other) => panic!("STREAMSTATE_TEST_BACKEND={other}: expected rocksdb or hashmap"),
    }
}

/// Panics unless the service's log says it opened its state on `backend` (the start-up
/// line `assigned partitions ... state_backend=<backend>`), so a run meant for one
/// backend cannot pass on the other unnoticed.
pub fn assert_backend(service: &Service, backend: &str) {
    let log = service.log();
    assert!(
        log.contains(&format!("state_backend={backend}")),
        "the service did not run on the {backend} backend; log:\n{log}"
    );
}

/// A name no other test (or earlier run) uses, so tests share one broker safely.
pub fn unique(prefix: &str) -> String {
    static N: AtomicU32 = AtomicU32::new(0);
    let now = std::time::SystemTime::now()
        .duration_since(std::time::UNIX_EPOCH)
        .map_or(0, |d| d.as_millis());
    format!(
        "{prefix}-{}-{}-{}",
        std::process::id(),
        now,
        N.fetch_add(1, Ordering::SeqCst)
    )
}

pub fn create_topics(topics: &[(&str, i32)]) {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .create()
        .expect("admin client");
    let new: Vec<NewTopic> = topics
        .iter()
        .map(|(n, p)| NewTopic::new(n, *p, TopicReplication::Fixed(1)))
        .collect();
    let results = futures::executor::block_on(admin.create_topics(&new, &AdminOptions::new()))
        .unwrap_or_else(|e| panic!("create topics on {} (is the broker up? integration-tests/kafka/kafka.sh start): {e}", bootstrap()));
    for r in results {
        r.unwrap_or_else(|(t, e)| panic!("create topic {t}: {e}"));
    }
    // Metadata propagates asynchronously even on one broker: wait until every partition has a leader.
    let probe = consumer(None, false);
    for (name, partitions) in topics {
        wait_until(
            &format!("topic {name} to have leaders"),
            Duration::from_secs(30),
            || {
                probe
                    .fetch_metadata(Some(name), Duration::from_secs(5))
                    .is_ok_and(|md| {
                        md.topics().iter().any(|t| {
                            t.name() == *name
                                && t.partitions().len() == *partitions as usize
                                && t.partitions().iter().all(|p| p.leader() >= 0)
                        })
                    })
            },
        );
    }
}

/// A producer that partitions keys like the Java client (murmur2), as upstream apps would;
/// idempotent, so a broker restart does not duplicate the test's input.
pub fn producer() -> BaseProducer {
    ClientConfig::new()
        .set("bootstrap.servers", bootstrap())
        .set("partitioner", "murmur2_random")
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .create()
        .expect("producer")
}

pub fn produce(producer: &BaseProducer, topic: &str, key: Option<&str>, payload: &[u8]) {
    let mut record = BaseRecord::<str, [u8]>::to(topic).payload(payload);
    if let Some(k) = key {
        record = record.key(k);
    }
    let mut record = Some(record);
    while let Some(r) = record.take() {
        if let Err((e, r)) = producer.send(r) {
            assert!(
                matches!(
                    e,
                    rdkafka::error::KafkaError::MessageProduction(
                        rdkafka::types::RDKafkaErrorCode::QueueFull
                    )
                ),
                "produce: {e}"
            );
            producer.poll(Duration::from_millis(50));
            record = Some(r);
        }
    }
}

/// Waits for every queued record's delivery; long enough to ride out a broker restart
/// on a loaded machine (the broker tests stop it while feeders are producing).
pub fn flush(producer: &BaseProducer) {
    if let Err(e) = try_flush(producer, Duration::from_secs(180)) {
        panic!("{e}");
    }
}

/// [`flush`] that says what state the client was left in instead of panicking.
fn try_flush(producer: &BaseProducer, timeout: Duration) -> Result<(), String> {
    producer.flush(timeout).map_err(|e| {
        format!(
            "flush: {e}; {} records still queued or in flight; fatal error: {:?}",
            producer.in_flight_count(),
            producer.client().fatal_error()
        )
    })
}

pub fn consumer(group: Option<&str>, read_committed: bool) -> BaseConsumer {
    let mut cc = ClientConfig::new();
    cc.set("bootstrap.servers", bootstrap())
        .set(
            "group.id",
            group.map_or_else(|| unique("checker"), str::to_string),
        )
        .set("enable.auto.commit", "false")
        .set(
            "isolation.level",
            if read_committed {
                "read_committed"
            } else {
                "read_uncommitted"
            },
        );
    cc.create().expect("consumer")
}

/// One record as the checker sees it.
#[derive(Debug, Clone)]
pub struct Record {
    pub partition: i32,
    pub offset: i64,
    pub key: Option<Vec<u8>>,
    pub value: Option<Vec<u8>>,
    pub headers: BTreeMap<String, String>,
}

impl Record {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_slice(self.value.as_deref().unwrap_or_default()).unwrap_or_else(|e| {
            panic!(
                "output at {}:{} is not JSON: {e}",
                self.partition, self.offset
            )
        })
    }
}

/// Reads every committed record of `topic`, up to the end offsets seen when called.
/// Fails if an open transaction keeps the read_committed reader from reaching the end.
pub fn read_all(topic: &str, read_committed: bool) -> Vec<Record> {
    let c = consumer(None, read_committed);
    let md = c
        .fetch_metadata(Some(topic), Duration::from_secs(10))
        .expect("metadata");
    let parts: Vec<i32> = md.topics()[0].partitions().iter().map(|p| p.id()).collect();
    let mut tpl = TopicPartitionList::new();
    let mut ends = BTreeMap::new();
    for p in &parts {
        tpl.add_partition_offset(topic, *p, Offset::Beginning)
            .expect("tpl");
        ends.insert(
            *p,
            c.fetch_watermarks(topic, *p, Duration::from_secs(10))
                .expect("watermarks")
                .1,
        );
    }
    c.assign(&tpl).expect("assign");
    let mut out = Vec::new();
    let deadline = Instant::now() + Duration::from_secs(60);
    loop {
        let done = parts.iter().all(|p| {
            let pos = c
                .position()
                .ok()
                .and_then(|tpl| tpl.find_partition(topic, *p).map(|e| e.offset()));
            ends[p] == 0 || matches!(pos, Some(Offset::Offset(o)) if o >= ends[p])
        });
        if done {
            break;
        }
        assert!(
            Instant::now() < deadline,
            "reading {topic}: end offsets {ends:?} not reached (open transaction?)"
        );
        if let Some(m) = c.poll(Duration::from_millis(200)) {
            let m = m.expect("consume");
            let headers = m
                .headers()
                .map(|h| {
                    h.iter()
                        .map(|h| {
                            (
                                h.key.to_string(),
                                String::from_utf8_lossy(h.value.unwrap_or_default()).into_owned(),
                            )
                        })
                        .collect()
                })
                .unwrap_or_default();
            out.push(Record {
                partition: m.partition(),
                offset: m.offset(),
                key: m.key().map(<[u8]>::to_vec),
                value: m.payload().map(<[u8]>::to_vec),
                headers,
            });
        }
    }
    out
}

/// Sum of the group's committed offsets over the topic's partitions; 0 while the broker
/// does not answer. Read without `require_stable` (read_uncommitted), so an open
/// transaction's pending offsets neither count nor make the call wait.
pub fn committed_total(group: &str, topic: &str, partitions: i32) -> i64 {
    let c = consumer(Some(group), false);
    let mut tpl = TopicPartitionList::new();
    for p in 0..partitions {
        tpl.add_partition(topic, p);
    }
    match c.committed_offsets(tpl, Duration::from_secs(10)) {
        Ok(got) => got
            .elements()
            .iter()
            .map(|e| {
                if let Offset::Offset(o) = e.offset() {
                    o
                } else {
                    0
                }
            })
            .sum(),
        Err(_) => 0,
    }
}

pub fn end_offsets_total(topic: &str, partitions: i32) -> i64 {
    let c = consumer(None, false);
    (0..partitions)
        .map(|p| {
            c.fetch_watermarks(topic, p, Duration::from_secs(10))
                .expect("watermarks")
                .1
        })
        .sum()
}

pub fn free_port() -> u16 {
    TcpListener::bind("127.0.0.1:0")
        .and_then(|l| l.local_addr())
        .map(|a| a.port())
        .expect("free port")
}

/// Minimal HTTP/1.1 client for the admin endpoints: (status, body).
pub fn http(method: &str, addr: SocketAddr, path: &str) -> std::io::Result<(u16, String)> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(10)))?;
    write!(
        s,
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: 0\r\nConnection: close\r\n\r\n"
    )?;
    let mut buf = String::new();
    s.read_to_string(&mut buf)?;
    let status = buf
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let body = buf
        .split_once("\r\n\r\n")
        .map(|(_, b)| b.to_string())
        .unwrap_or_default();
    Ok((status, body))
}

/// Reads a counter's value (summed over labels) from a Prometheus text page.
pub fn metric_sum(text: &str, name: &str) -> f64 {
    text.lines()
        .filter(|l| l.starts_with(name) && l[name.len()..].starts_with(['{', ' ']))
        .filter_map(|l| l.rsplit(' ').next()?.parse::<f64>().ok())
        .sum()
}

/// Topics and a config for one service under test.
pub struct Job {
    pub dir: tempfile::TempDir,
    pub app_id: String,
    pub input: String,
    pub output: String,
    pub dlq: String,
    /// Rules topic (1 partition); every job reads it, most tests leave it empty.
    pub control: String,
    pub partitions: i32,
    pub admin: SocketAddr,
    /// `[job] function`: `count` unless a test sets another.
    pub function: &'static str,
    /// More `[job]` keys, verbatim TOML lines (e.g. `format = "avro"`).
    pub job_extra: String,
}

/// A job's directory (config, service log, local state, file checkpoints). With
/// `STREAMSTATE_TEST_KEEP` set it outlives the test and its path is printed: the
/// post-mortem of a failed run needs the log of every incarnation and the checkpoints.
fn job_dir(app_id: &str) -> tempfile::TempDir {
    let keep = std::env::var_os("STREAMSTATE_TEST_KEEP").is_some();
    let dir = tempfile::Builder::new()
        .disable_cleanup(keep)
        .tempdir()
        .expect("tempdir");
    if keep {
        eprintln!("{app_id}: kept in {}", dir.path().display());
    }
    dir
}

impl Job {
    pub fn new(name: &str, partitions: i32) -> Self {
        let app_id = unique(name);
        let job = Self {
            dir: job_dir(&app_id),
            input: format!("{app_id}-in"),
            output: format!("{app_id}-out"),
            dlq: format!("{app_id}-dlq"),
            control: format!("{app_id}-rules"),
            app_id,
            partitions,
            admin: SocketAddr::from(([127, 0, 0, 1], free_port())),
            function: "count",
            job_extra: String::new(),
        };
        create_topics(&[
            (&job.input, partitions),
            (&job.output, partitions),
            (&job.dlq, 1),
            (&job.control, 1),
        ]);
        job
    }

    pub fn config_path(&self) -> PathBuf {
        self.dir.path().join("streamstate.toml")
    }

    /// Writes the config; `extra` is appended verbatim (more TOML sections).
    pub fn write_config(&self, checkpoint_interval: &str, extra: &str) -> PathBuf {
        let chk = format!("file://{}", self.checkpoint_dir().display());
        self.write_config_with_storage(checkpoint_interval, &chk, extra)
    }

    /// Like [`Job::write_config`] with `checkpoint.storage` set to `storage` (a URL).
    pub fn write_config_with_storage(
        &self,
        checkpoint_interval: &str,
        storage: &str,
        extra: &str,
    ) -> PathBuf {
        let d = self.dir.path();
        let body = format!(
            r#"[kafka]
bootstrap_servers = "{bootstrap}"
app_id = "{app}"
input_topics = ["{input}"]
output_topic = "{output}"
dead_letter_topic = "{dlq}"
control_topic = "{control}"
transaction_timeout = "30s"

[job]
key = "/user_id"
function = "{function}"
{job_extra}

[state]
dir = "{state}"
backend = "{backend}"

[checkpoint]
interval = "{checkpoint_interval}"
timeout = "15s"
storage = "{storage}"

[admin]
listen = "{admin}"
{extra}"#,
            bootstrap = bootstrap(),
            app = self.app_id,
            input = self.input,
            output = self.output,
            dlq = self.dlq,
            control = self.control,
            state = d.join("state").display(),
            backend = test_backend(),
            admin = self.admin,
            function = self.function,
            job_extra = self.job_extra,
        );
        let path = self.config_path();
        std::fs::write(&path, body).expect("write config");
        path
    }

    pub fn spawn(&self) -> Service {
        self.spawn_with(&[], &[])
    }

    /// Spawns with extra `run` arguments and environment (e.g. `FAILPOINTS`).
    pub fn spawn_with(&self, args: &[&str], env: &[(&str, &str)]) -> Service {
        Service::spawn(
            &self.config_path(),
            &self.dir.path().join("service.log"),
            args,
            env,
        )
    }

    pub fn spawn_example(&self, name: &str, env: &[(&str, &str)]) -> Service {
        Service::spawn_example(
            name,
            &self.config_path(),
            &self.dir.path().join("service.log"),
            env,
        )
    }

    /// A second config for the same instance id with its own local state directory and
    /// admin port: a replacement instance on another machine.
    pub fn write_replacement_config(&self) -> PathBuf {
        let text = std::fs::read_to_string(self.config_path()).expect("config");
        let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
        let state = self.dir.path().join("state");
        let text = text
            .replace(
                &state.display().to_string(),
                &self
                    .dir
                    .path()
                    .join("state-replacement")
                    .display()
                    .to_string(),
            )
            .replace(&self.admin.to_string(), &admin.to_string());
        let path = self.dir.path().join("replacement.toml");
        std::fs::write(&path, text).expect("write");
        path
    }

    pub fn committed(&self) -> i64 {
        committed_total(&self.app_id, &self.input, self.partitions)
    }

    pub fn input_end(&self) -> i64 {
        end_offsets_total(&self.input, self.partitions)
    }

    pub fn checkpoint_dir(&self) -> PathBuf {
        self.dir.path().join("checkpoints")
    }
}

/// Instance `i` of `n` of one job, as its own process: its own admin port, state
/// directory (`state-{i}-gen{generation}`) and log. `generation` tells apart an
/// instance's restarts, so a restart never reuses the state directory of the one before.
pub struct Instance {
    pub service: Service,
    pub admin: SocketAddr,
}

/// Spawns instance `i` of `n` with `env` on top of the instance settings.
pub fn spawn_instance(
    job: &Job,
    i: u32,
    n: u32,
    generation: u32,
    env: &[(&str, &str)],
    args: &[&str],
) -> Instance {
    let admin = SocketAddr::from(([127, 0, 0, 1], free_port()));
    let state = job.dir.path().join(format!("state-{i}-gen{generation}"));
    let log = job
        .dir
        .path()
        .join(format!("instance-{i}-gen{generation}.log"));
    let (i, n, listen, state) = (
        i.to_string(),
        n.to_string(),
        admin.to_string(),
        state.display().to_string(),
    );
    let mut all = vec![
        ("STREAMSTATE__JOB__INSTANCE", i.as_str()),
        ("STREAMSTATE__JOB__INSTANCES", n.as_str()),
        ("STREAMSTATE__ADMIN__LISTEN", listen.as_str()),
        ("STREAMSTATE__STATE__DIR", state.as_str()),
    ];
    all.extend_from_slice(env);
    Instance {
        service: Service::spawn(&job.config_path(), &log, args, &all),
        admin,
    }
}

/// Waits until every instance answers `/readyz` with 200; fails if one exits.
pub fn wait_ready(instances: &mut [Instance]) {
    for inst in instances.iter_mut() {
        wait_until("instance ready", Duration::from_secs(90), || {
            inst.service.assert_running();
            http("GET", inst.admin, "/readyz").is_ok_and(|(status, _)| status == 200)
        });
    }
}

/// The service as a child process, so tests can SIGKILL it like a node failure would.
pub struct Service {
    pub child: Child,
    log: PathBuf,
}

impl Service {
    pub fn spawn(config: &Path, log: &Path, args: &[&str], env: &[(&str, &str)]) -> Self {
        let mut cmd = Command::new(BIN);
        cmd.args(["run", "--config"]).arg(config).args(args);
        Self::spawn_command(cmd, log, env)
    }

    /// One of the `examples/` binaries (built by `cargo build --examples`), which take
    /// the config path as their only argument.
    pub fn spawn_example(name: &str, config: &Path, log: &Path, env: &[(&str, &str)]) -> Self {
        let bin = Path::new(BIN)
            .parent()
            .expect("target dir")
            .join("examples")
            .join(name);
        assert!(
            bin.is_file(),
            "{} is not built: run `cargo build --release --examples`",
            bin.display()
        );
        let mut cmd = Command::new(bin);
        cmd.arg(config);
        Self::spawn_command(cmd, log, env)
    }

    fn spawn_command(mut cmd: Command, log: &Path, env: &[(&str, &str)]) -> Self {
        let file = std::fs::OpenOptions::new()
            .create(true)
            .append(true)
            .open(log)
            .expect("log file");
        cmd.env("RUST_LOG", "info,librdkafka=warn");
        for (k, v) in env {
            cmd.env(k, v);
        }
        let child = cmd
            .stdout(Stdio::null())
            .stderr(file)
            .spawn()
            .expect("spawn");
        Self {
            child,
            log: log.to_path_buf(),
        }
    }

    /// Waits for the process to end by itself.
    pub fn wait_exit(&mut self, timeout: Duration) -> ExitStatus {
        self.exited_within(timeout).unwrap_or_else(|| {
            panic!(
                "service did not exit within {timeout:?}; log:\n{}",
                self.log()
            )
        })
    }

    /// The exit status if the process ends within `timeout`, else `None`.
    pub fn exited_within(&mut self, timeout: Duration) -> Option<ExitStatus> {
        let deadline = Instant::now() + timeout;
        loop {
            if let Some(status) = self.child.try_wait().expect("try_wait") {
                return Some(status);
            }
            if Instant::now() >= deadline {
                return None;
            }
            std::thread::sleep(Duration::from_millis(50));
        }
    }

    /// Sends a signal by name (`STOP`, `CONT`, `TERM`).
    pub fn signal(&self, name: &str) {
        let ok = Command::new("kill")
            .args([&format!("-{name}"), &self.child.id().to_string()])
            .status()
            .expect("kill");
        assert!(ok.success(), "kill -{name} failed");
    }

    pub fn log(&self) -> String {
        std::fs::read_to_string(&self.log).unwrap_or_default()
    }

    /// The process has ended (by itself or killed); never blocks.
    pub fn has_exited(&mut self) -> bool {
        matches!(self.child.try_wait(), Ok(Some(_)))
    }

    /// Fails the test (with the service log) if the process has exited.
    pub fn assert_running(&mut self) {
        if let Ok(Some(status)) = self.child.try_wait() {
            panic!("service exited early with {status}; log:\n{}", self.log());
        }
    }

    pub fn sigkill(&mut self) {
        self.child.kill().expect("SIGKILL");
        self.child.wait().expect("reap");
    }

    /// SIGTERM and wait for the exit status (the service drains and checkpoints first).
    pub fn terminate(&mut self, timeout: Duration) -> ExitStatus {
        self.signal("TERM");
        self.wait_exit(timeout)
    }
}

impl Drop for Service {
    fn drop(&mut self) {
        // A stopped process ignores SIGKILL until continued on some kernels' accounting of
        // waits; continue it first so the reap below cannot hang.
        let _ = Command::new("kill")
            .args(["-CONT", &self.child.id().to_string()])
            .status();
        let _ = self.child.kill();
        let _ = self.child.wait();
    }
}

// ---------------------------------------------------------------- input and checker

pub const KEYS: usize = 1_000;

/// What the test puts in: roughly `garbage_per_mille`/1000 of records are unusable.
pub fn events(n: usize, garbage_per_mille: u32, seed: u64) -> Vec<(Option<String>, Vec<u8>)> {
    let mut rng = rand::rngs::StdRng::seed_from_u64(seed);
    (0..n)
        .map(|i| {
            let user = format!("user-{}", rng.random_range(0..KEYS));
            if rng.random_ratio(garbage_per_mille, 1000) {
                let bad: Vec<u8> = match i % 3 {
                    0 => b"{\"user_id\": \"oops".to_vec(),
                    1 => vec![0xff, 0xfe, b'{', b'}'],
                    _ => format!(r#"{{"no_user":"{user}","seq":{i}}}"#).into_bytes(),
                };
                (Some(user), bad)
            } else {
                (
                    Some(user.clone()),
                    format!(r#"{{"user_id":"{user}","seq":{i},"amount":{}}}"#, i % 97).into_bytes(),
                )
            }
        })
        .collect()
}

pub fn produce_all(topic: &str, evs: &[(Option<String>, Vec<u8>)], per_second: Option<u64>) {
    let p = producer();
    let started = std::time::Instant::now();
    for (i, (k, v)) in evs.iter().enumerate() {
        if let Some(rate) = per_second {
            // Spread input over time so kills land while records are flowing.
            while (started.elapsed().as_millis() as u64) * rate / 1000 < i as u64 {
                p.poll(Duration::from_millis(1));
            }
        }
        produce(&p, topic, k.as_deref(), v);
    }
    // The feeder is not under test. Twice in CI (a Term bounce on S3 storage) librdkafka's
    // idempotent producer held every record queued after the broker came back, for minutes,
    // while the service's own clients recovered in seconds. Then this producer is dropped
    // and a fresh one writes exactly what the topic misses, read back from it.
    if let Err(stuck) = try_flush(&p, Duration::from_secs(90)) {
        eprintln!("feeder: {stuck}; writing what {topic} misses with a new producer");
        p.purge(rdkafka::producer::PurgeConfig::default().queue().inflight());
        drop(p);
        let p = producer();
        let missing = missing_from(topic, evs);
        eprintln!("feeder: {} of {} records missing", missing.len(), evs.len());
        for (k, v) in missing {
            produce(&p, topic, k.as_deref(), v);
        }
        flush(&p);
    }
}

/// The records of `evs` that `topic` does not hold, in their order: each distinct (key,
/// value) is wanted as many times as `evs` has it. A partition's records arrive in order,
/// so what is missing is each partition's tail and writing it again keeps every key's order.
fn missing_from<'a>(
    topic: &str,
    evs: &'a [(Option<String>, Vec<u8>)],
) -> Vec<&'a (Option<String>, Vec<u8>)> {
    let mut present: HashMap<(Option<Vec<u8>>, Option<Vec<u8>>), usize> = HashMap::new();
    for r in read_all(topic, false) {
        *present.entry((r.key, r.value)).or_default() += 1;
    }
    evs.iter()
        .filter(|(k, v)| {
            let id = (k.as_ref().map(|k| k.as_bytes().to_vec()), Some(v.clone()));
            match present.get_mut(&id) {
                Some(n) if *n > 0 => {
                    *n -= 1;
                    false
                }
                _ => true,
            }
        })
        .collect()
}

/// The checker's own notion of a good record, independent of the service's decoder.
pub fn user_of(payload: Option<&[u8]>) -> Option<String> {
    let v: serde_json::Value = serde_json::from_slice(payload?).ok()?;
    v.get("user_id")?.as_str().map(str::to_string)
}

/// Compares output and dead-letter topics against a model computed from the input topic.
pub fn check_exactly_once(job: &Job) -> (usize, usize) {
    check_exactly_once_ignoring(job, b"")
}

/// [`check_exactly_once`], leaving out output records whose value is `ignored` (markers a
/// test wrote itself).
pub fn check_exactly_once_ignoring(job: &Job, ignored: &[u8]) -> (usize, usize) {
    check_exactly_once_reading(job, ignored, user_of)
}

/// [`check_exactly_once_ignoring`] with the checker's own reader of input records
/// (`user_of` for JSON; a format test passes its own): `None` marks a bad record.
pub fn check_exactly_once_reading(
    job: &Job,
    ignored: &[u8],
    user_of: impl Fn(Option<&[u8]>) -> Option<String>,
) -> (usize, usize) {
    let input = read_all(&job.input, true);
    let mut output = read_all(&job.output, true);
    output.retain(|r| ignored.is_empty() || r.value.as_deref() != Some(ignored));
    let dlq = read_all(&job.dlq, true);

    // Reference model: per key, its events in (partition, offset) order get counts 1..n.
    let mut expected: BTreeMap<(i32, i64), (String, u64)> = BTreeMap::new();
    let mut bad: BTreeMap<(i32, i64), ()> = BTreeMap::new();
    let mut running: HashMap<String, u64> = HashMap::new();
    let mut sorted = input.clone();
    sorted.sort_by_key(|r| (r.partition, r.offset));
    for r in &sorted {
        match user_of(r.value.as_deref()) {
            Some(user) => {
                let n = running.entry(user.clone()).or_default();
                *n += 1;
                expected.insert((r.partition, r.offset), (user, *n));
            }
            None => {
                bad.insert((r.partition, r.offset), ());
            }
        }
    }

    let mut seen: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in &output {
        let v = r.json();
        let src = &v["source"];
        assert_eq!(
            src["topic"],
            job.input.as_str(),
            "output names the wrong source topic: {v}"
        );
        let at = (
            src["partition"].as_i64().expect("source.partition") as i32,
            src["offset"].as_i64().expect("source.offset"),
        );
        *seen.entry(at).or_default() += 1;
        let (user, count) = expected
            .get(&at)
            .unwrap_or_else(|| panic!("output for a non-event input {at:?}: {v}"));
        assert_eq!(v["key"], user.as_str(), "wrong key at {at:?}");
        assert_eq!(
            v["count"].as_u64(),
            Some(*count),
            "wrong running count at {at:?}: {v}"
        );
        assert_eq!(
            r.key.as_deref(),
            Some(user.as_bytes()),
            "output record key must be the state key"
        );
    }
    let dups: Vec<_> = seen.iter().filter(|(_, n)| **n > 1).collect();
    assert!(
        dups.is_empty(),
        "duplicated outputs for inputs {:?}",
        &dups[..dups.len().min(10)]
    );
    let missing: Vec<_> = expected.keys().filter(|k| !seen.contains_key(*k)).collect();
    assert!(
        missing.is_empty(),
        "{} inputs have no output, e.g. {:?}",
        missing.len(),
        &missing[..missing.len().min(10)]
    );

    let mut dead: BTreeMap<(i32, i64), usize> = BTreeMap::new();
    for r in dlq
        .iter()
        .filter(|r| r.headers.get("streamstate.source.topic") == Some(&job.input))
    {
        let p: i32 = r.headers["streamstate.source.partition"]
            .parse()
            .expect("partition header");
        let o: i64 = r.headers["streamstate.source.offset"]
            .parse()
            .expect("offset header");
        assert!(
            !r.headers["streamstate.error.reason"].is_empty(),
            "dead letter without a reason"
        );
        assert!(
            bad.contains_key(&(p, o)),
            "a good record went to the dead-letter topic: {p}:{o}"
        );
        let original = sorted
            .iter()
            .find(|i| (i.partition, i.offset) == (p, o))
            .expect("source record");
        assert_eq!(
            r.value, original.value,
            "dead letter must carry the original bytes"
        );
        *dead.entry((p, o)).or_default() += 1;
    }
    assert_eq!(
        dead.len(),
        bad.len(),
        "every bad record must reach the dead-letter topic"
    );
    assert!(
        dead.values().all(|n| *n == 1),
        "a bad record was dead-lettered twice"
    );
    (output.len(), dead.len())
}

/// Runs a service that is expected to crash at a failpoint: `evs` are produced once it is
/// ready (or gone), at `per_second`, so every epoch while it runs has records — a
/// checkpoint barrier with nothing new is skipped and would not reach the checkpoint's
/// failpoints. Returns how the process ended (within 90 s).
/// Runs the service with a failpoint armed while `evs` are fed at `per_second`, and
/// returns once it has crashed. A failpoint set to fire at the n-th checkpoint fires
/// only if n checkpoints find new input; a slow machine can take the whole feed in
/// fewer, so after the feed one record of `more` goes in per checkpoint interval
/// (300 ms) until the crash. `more` may be empty when the feed always suffices.
pub fn run_until_crash(
    job: &Job,
    env: &[(&str, &str)],
    evs: Vec<(Option<String>, Vec<u8>)>,
    per_second: u64,
    more: &mut dyn Iterator<Item = (Option<String>, Vec<u8>)>,
) -> (Service, ExitStatus) {
    let mut service = job.spawn_with(&[], env);
    wait_until(
        "the service to be ready (or to crash)",
        Duration::from_secs(90),
        || service.has_exited() || matches!(http("GET", job.admin, "/readyz"), Ok((200, _))),
    );
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(per_second)));
    let deadline = Instant::now() + Duration::from_secs(90);
    let top_up = producer();
    let status = loop {
        if let Some(status) = service.exited_within(Duration::from_millis(300)) {
            break status;
        }
        assert!(
            Instant::now() < deadline,
            "service did not crash within 90s; log:\n{}",
            service.log()
        );
        if feeder.is_finished()
            && let Some((key, value)) = more.next()
        {
            produce(&top_up, &job.input, key.as_deref(), &value);
            flush(&top_up);
        }
    };
    feeder.join().expect("feeder");
    (service, status)
}

pub fn wait_all_committed(job: &Job, service: &mut Service) {
    let end = job.input_end();
    wait_until(
        "all input offsets committed",
        Duration::from_secs(180),
        || {
            service.assert_running();
            job.committed() >= end
        },
    );
    // Only where the backend was chosen for the run: services that write their own
    // config (or examples with their own logging) are not asked.
    if std::env::var_os("STREAMSTATE_TEST_BACKEND").is_some() {
        assert_backend(service, test_backend());
    }
}

/// The broker rig's script (`integration-tests/kafka/kafka.sh`).
pub fn kafka_script() -> PathBuf {
    Path::new(env!("CARGO_MANIFEST_DIR")).join("integration-tests/kafka/kafka.sh")
}

/// The broker rig's script, for tests that bounce the broker.
pub fn kafka_rig(command: &str) {
    let status = Command::new(kafka_script())
        .arg(command)
        .status()
        .expect("run kafka.sh");
    assert!(status.success(), "kafka.sh {command} failed");
}

// ---------------------------------------------------------------- rules and their checker

/// Control records for run `run`: new versions, a replayed older version, a malformed
/// rule, a deletion by status and (every other run) a tombstone.
pub fn rule_records(run: u64) -> Vec<(String, Option<String>)> {
    let v = |id: &str, version: u64| {
        Some(format!(
            r#"{{"id":"{id}","version":{version},"status":"active","kind":"count"}}"#
        ))
    };
    let base = run * 10;
    let mut out = vec![
        ("r-a".to_string(), v("r-a", base + 2)),
        ("r-b".to_string(), v("r-b", base + 1)),
        ("r-a".to_string(), v("r-a", base + 1)),
        ("r-c".to_string(), Some("{not json".to_string())),
        ("r-c".to_string(), v("r-c", base + 3)),
        (
            "r-d".to_string(),
            Some(format!(r#"{{"id":"r-d","version":{}}}"#, base + 1)),
        ),
        (
            "r-d".to_string(),
            Some(format!(
                r#"{{"id":"r-d","version":{},"status":"deleted"}}"#,
                base + 2
            )),
        ),
        (
            "r-e".to_string(),
            Some(format!(r#"{{"id":"other","version":{}}}"#, base + 5)),
        ),
    ];
    if run % 2 == 1 {
        out.push(("r-b".to_string(), None));
    }
    out
}

pub fn produce_rules(topic: &str, records: &[(String, Option<String>)]) {
    let p = producer();
    for (k, v) in records {
        let mut record = BaseRecord::<str, str>::to(topic).key(k.as_str());
        if let Some(v) = v {
            record = record.payload(v.as_str());
        }
        p.send(record).map_err(|(e, _)| e).expect("queue rule");
    }
    flush(&p);
}

/// The checker's own reading of the rule spec: id → (version, deleted), plus the
/// offsets of records that must be rejected.
pub fn rules_model(job: &Job) -> (BTreeMap<String, (u64, bool)>, Vec<i64>) {
    let mut rules: BTreeMap<String, (u64, bool)> = BTreeMap::new();
    let mut rejected = Vec::new();
    let mut records = read_all(&job.control, true);
    records.sort_by_key(|r| r.offset);
    for r in records {
        let id = String::from_utf8(r.key.clone().unwrap_or_default()).expect("utf-8 id");
        let Some(value) = r.value.as_deref().filter(|v| !v.is_empty()) else {
            if let Some(rule) = rules.get_mut(&id) {
                rule.1 = true;
            }
            continue;
        };
        let parsed: Option<serde_json::Value> = serde_json::from_slice(value).ok();
        let valid = parsed.as_ref().and_then(|v| {
            let same_id = v.get("id")?.as_str()? == id;
            let version = v.get("version")?.as_u64()?;
            let deleted = match v.get("status").map(|s| s.as_str()) {
                None | Some(Some("active")) => false,
                Some(Some("deleted")) => true,
                _ => return None,
            };
            same_id.then_some((version, deleted))
        });
        match valid {
            None => rejected.push(r.offset),
            Some((version, deleted)) => {
                if rules.get(&id).is_none_or(|(applied, _)| version > *applied) {
                    rules.insert(id, (version, deleted));
                }
            }
        }
    }
    (rules, rejected)
}

/// `GET /rules` as id → (version, deleted).
pub fn rules_served(admin: SocketAddr) -> Option<BTreeMap<String, (u64, bool)>> {
    let (status, body) = http("GET", admin, "/rules").ok()?;
    if status != 200 {
        return None;
    }
    let list: Vec<serde_json::Value> = serde_json::from_str(&body).ok()?;
    list.iter()
        .map(|r| {
            Some((
                r["id"].as_str()?.to_string(),
                (r["version"].as_u64()?, r["status"].as_str()? == "deleted"),
            ))
        })
        .collect()
}

/// Waits until the running service serves exactly the model's rules, then checks that
/// every rejected rule reached the dead-letter topic exactly once.
pub fn check_rules(job: &Job, service: &mut Service) {
    let (model, rejected) = rules_model(job);
    let mut last = None;
    wait_until(
        "the served rules to equal the model",
        Duration::from_secs(60),
        || {
            service.assert_running();
            last = rules_served(job.admin);
            last.as_ref() == Some(&model)
        },
    );
    let mut dead: Vec<i64> = read_all(&job.dlq, true)
        .iter()
        .filter(|r| r.headers.get("streamstate.source.topic") == Some(&job.control))
        .map(|r| {
            r.headers["streamstate.source.offset"]
                .parse()
                .expect("offset header")
        })
        .collect();
    dead.sort_unstable();
    assert_eq!(
        dead, rejected,
        "each rejected rule exactly once in the dead-letter topic"
    );
}

// ---------------------------------------------------------------- storage choice

/// Every recovery test runs on both kinds of checkpoint storage.
#[derive(Clone, Copy, Debug)]
pub enum Storage {
    File,
    S3,
}

/// Writes the job's config for `storage`; returns the environment the service needs.
pub fn configure(job: &Job, storage: Storage, interval: &str) -> Vec<(String, String)> {
    match storage {
        Storage::File => {
            job.write_config(interval, "");
            Vec::new()
        }
        Storage::S3 => {
            let bucket = unique("eo");
            create_s3_bucket(&bucket);
            job.write_config_with_storage(interval, &format!("s3://{bucket}/ckpt"), "");
            s3_env()
        }
    }
}

pub fn spawn(job: &Job, env: &[(String, String)], extra: &[(&str, &str)]) -> Service {
    let mut all: Vec<(&str, &str)> = env.iter().map(|(k, v)| (k.as_str(), v.as_str())).collect();
    all.extend_from_slice(extra);
    job.spawn_with(&[], &all)
}

// ---------------------------------------------------------------- admin API

/// An admin API answer: status, response head (lower-cased), body.
pub struct Answer {
    pub status: u16,
    pub head: String,
    pub body: String,
}

impl Answer {
    pub fn json(&self) -> serde_json::Value {
        serde_json::from_str(&self.body)
            .unwrap_or_else(|e| panic!("not JSON ({e}): {} {}", self.status, self.body))
    }
}

/// Like [`http`] with request headers and a body.
pub fn http_with(
    method: &str,
    addr: SocketAddr,
    path: &str,
    headers: &[(&str, &str)],
    body: &[u8],
) -> std::io::Result<Answer> {
    let mut s = TcpStream::connect_timeout(&addr, Duration::from_secs(5))?;
    s.set_read_timeout(Some(Duration::from_secs(120)))?;
    let mut head = format!(
        "{method} {path} HTTP/1.1\r\nHost: {addr}\r\nContent-Length: {}\r\nConnection: close\r\n",
        body.len()
    );
    for (k, v) in headers {
        head.push_str(&format!("{k}: {v}\r\n"));
    }
    head.push_str("\r\n");
    s.write_all(head.as_bytes())?;
    // A server may answer (413) before reading a large body and close: ignore that.
    let _ = s.write_all(body);
    let mut buf = Vec::new();
    let _ = s.read_to_end(&mut buf);
    let text = String::from_utf8_lossy(&buf).into_owned();
    let status = text
        .split_whitespace()
        .nth(1)
        .and_then(|c| c.parse().ok())
        .unwrap_or(0);
    let (head, body) = text
        .split_once("\r\n\r\n")
        .map(|(h, b)| (h.to_lowercase(), b.to_string()))
        .unwrap_or_default();
    Ok(Answer { status, head, body })
}

// ---------------------------------------------------------------- the independent checker

/// What the independent checker (`integration-tests/checker/check.py`) is told about a run.
#[derive(Debug, Clone, Default)]
pub struct CheckerOptions {
    /// Output values a test wrote itself (markers), left out.
    pub ignore_value: Option<String>,
    /// Every input record must be below the committed offsets.
    pub expect_all: bool,
    pub max_record_bytes: Option<usize>,
    pub max_key_bytes: Option<usize>,
    pub timestamp_field: Option<String>,
    pub max_skew_ms: Option<u64>,
}

impl CheckerOptions {
    pub fn all() -> Self {
        Self {
            expect_all: true,
            ..Self::default()
        }
    }
}

/// The checker's Python (a venv with confluent-kafka, installed once by `checker/setup.sh`).
pub fn checker_python() -> PathBuf {
    static PYTHON: std::sync::OnceLock<PathBuf> = std::sync::OnceLock::new();
    PYTHON
        .get_or_init(|| {
            if let Ok(p) = std::env::var("STREAMSTATE_TEST_CHECKER_PYTHON") {
                return PathBuf::from(p);
            }
            let script =
                Path::new(env!("CARGO_MANIFEST_DIR")).join("integration-tests/checker/setup.sh");
            let out = Command::new(&script)
                .stderr(Stdio::inherit())
                .output()
                .expect("run checker/setup.sh");
            assert!(out.status.success(), "checker/setup.sh failed");
            let text = String::from_utf8_lossy(&out.stdout);
            PathBuf::from(
                text.lines()
                    .last()
                    .expect("setup.sh prints the python path")
                    .trim(),
            )
        })
        .clone()
}

/// Runs the independent checker on `job`; returns its JSON report. The caller decides
/// whether violations fail (see [`independent_check`]).
pub fn independent_report(job: &Job, opts: &CheckerOptions) -> (bool, serde_json::Value) {
    let script = Path::new(env!("CARGO_MANIFEST_DIR")).join("integration-tests/checker/check.py");
    let mut cmd = Command::new(checker_python());
    cmd.arg(script)
        .args(["--bootstrap", &bootstrap(), "--group", &job.app_id])
        .args([
            "--input",
            &job.input,
            "--output",
            &job.output,
            "--dlq",
            &job.dlq,
        ]);
    if let Some(v) = &opts.ignore_value {
        cmd.args(["--ignore-value", v]);
    }
    if opts.expect_all {
        cmd.arg("--expect-all");
    }
    if let Some(n) = opts.max_record_bytes {
        cmd.args(["--max-record-bytes", &n.to_string()]);
    }
    if let Some(n) = opts.max_key_bytes {
        cmd.args(["--max-key-bytes", &n.to_string()]);
    }
    if let Some(f) = &opts.timestamp_field {
        cmd.args(["--timestamp-field", f]);
    }
    if let Some(n) = opts.max_skew_ms {
        cmd.args(["--max-skew-ms", &n.to_string()]);
    }
    let out = cmd.stderr(Stdio::inherit()).output().expect("run checker");
    let text = String::from_utf8_lossy(&out.stdout);
    let report: serde_json::Value = serde_json::from_str(text.lines().last().unwrap_or_default())
        .unwrap_or_else(|e| panic!("checker printed no JSON report ({e}): {text}"));
    (out.status.success(), report)
}

/// Runs the independent checker and fails the test on any violation; returns the report.
pub fn independent_check(job: &Job, opts: &CheckerOptions) -> serde_json::Value {
    let (ok, report) = independent_report(job, opts);
    assert!(
        ok,
        "independent checker found violations:\n{}",
        serde_json::to_string_pretty(&report).unwrap_or_default()
    );
    eprintln!(
        "independent checker: ok; {} outputs, {} dead letters, aborted attempts {}",
        report["outputs"], report["dead_letters"], report["aborted_attempts"]
    );
    report
}

// ---------------------------------------------------------------- rule-engine jobs

/// A job running the built-in rule engine, checkpointing every 300 ms.
pub fn rules_job(name: &str, partitions: i32, extra: &str) -> Job {
    let mut job = Job::new(name, partitions);
    job.function = "rules";
    job.write_config("300ms", extra);
    job
}

/// Switches a written config to event time: `[job] timestamp = "/ts"` with the given
/// `max_out_of_orderness` (a humantime value).
pub fn use_event_time(job: &Job, max_out_of_orderness: &str) {
    let config = std::fs::read_to_string(job.config_path()).expect("config");
    let config = config.replacen(
        &format!("function = \"{}\"", job.function),
        &format!(
            "function = \"{}\"\ntimestamp = \"/ts\"\nmax_out_of_orderness = \"{max_out_of_orderness}\"",
            job.function
        ),
        1,
    );
    std::fs::write(job.config_path(), config).expect("config");
}

/// `STREAMSTATE_TEST_KILLS` (default 20), at most `max`.
pub fn kills_from_env(max: usize) -> usize {
    std::env::var("STREAMSTATE_TEST_KILLS")
        .ok()
        .and_then(|v| v.parse().ok())
        .unwrap_or(20)
        .min(max)
}

/// Feeds `evs` to the input at `per_second` from a thread while the service is started
/// and SIGKILLed `kills` times, each after a random 0.3–2.5 s; returns when the feeder
/// is done (the service is then not running).
pub fn feed_under_sigkills(
    job: &Job,
    evs: Vec<(Option<String>, Vec<u8>)>,
    per_second: u64,
    kills: usize,
) {
    let input = job.input.clone();
    let feeder = std::thread::spawn(move || produce_all(&input, &evs, Some(per_second)));
    let mut rng = rand::rng();
    for _ in 0..kills {
        let mut service = job.spawn();
        let until = Instant::now() + Duration::from_millis(rng.random_range(300..2_500));
        // The kill moment is the schedule of the test, not a wait for a condition.
        while Instant::now() < until {
            service.assert_running();
            std::thread::sleep(Duration::from_millis(20));
        }
        service.sigkill();
    }
    feeder.join().expect("feeder");
}

/// Produces one record to an explicit partition (e.g. one end-of-input marker each).
pub fn produce_to_partition(topic: &str, partition: i32, key: &str, payload: &[u8]) {
    let p = producer();
    p.send(
        BaseRecord::<str, [u8]>::to(topic)
            .partition(partition)
            .key(key)
            .payload(payload),
    )
    .map_err(|(e, _)| e)
    .expect("queue record");
    flush(&p);
}

/// The manifest of the highest-numbered checkpoint in `root` (file storage).
pub fn newest_checkpoint(root: &Path) -> PathBuf {
    std::fs::read_dir(root)
        .unwrap_or_else(|e| panic!("{}: {e}", root.display()))
        .filter_map(|e| {
            let name = e.ok()?.file_name().into_string().ok()?;
            let id: u64 = name.strip_prefix("chk-")?.split('-').next()?.parse().ok()?;
            let manifest = root.join(&name).join("manifest.json");
            manifest.is_file().then_some((id, manifest))
        })
        .max()
        .map(|(_, m)| m)
        .unwrap_or_else(|| panic!("no checkpoint in {}", root.display()))
}
