//! `bench-generator`: fills the benchmark's input topic once (or, with `--rate`, produces
//! open loop at a fixed rate for latency runs) and publishes the rules file. With
//! `--avro-topic`, every event also goes to that topic in Avro (Confluent wire format),
//! right after its JSON record, with the same key: both topics have the same partitions,
//! so each Avro record sits at its JSON twin's partition and offset.
//!
//! Prints one JSON summary line on stdout: records, duplicates, bytes, seconds.

use std::io::{Read, Write};
use std::net::TcpStream;
use std::path::PathBuf;
use std::time::{Duration, Instant, SystemTime, UNIX_EPOCH};

use anyhow::{Context, bail};
use clap::Parser;
use rdkafka::ClientConfig;
use rdkafka::admin::{AdminClient, AdminOptions, NewTopic, TopicReplication};
use rdkafka::client::DefaultClientContext;
use rdkafka::error::{KafkaError, RDKafkaErrorCode};
use rdkafka::producer::{BaseProducer, BaseRecord, Producer};
use streamstate_bench_generator::{Dist, Generator, Spec, avro};

/// How late an open-loop record may leave (see its loop).
const SEND_QUANTUM: Duration = Duration::from_millis(1);

#[derive(Parser, Debug)]
#[command(about = "Seeded benchmark input for streamstate")]
struct Args {
    #[arg(long, default_value = "127.0.0.1:19092")]
    bootstrap: String,
    #[arg(long, default_value = "bench-input")]
    topic: String,
    /// Partitions of the input topic when this creates it (an existing topic must match).
    #[arg(long, default_value_t = 4)]
    partitions: i32,
    #[arg(long, default_value_t = 1_000_000)]
    events: u64,
    /// Key cardinality (`user_id` values).
    #[arg(long, default_value_t = 100_000)]
    keys: u64,
    #[arg(long, default_value = "uniform")]
    dist: Dist,
    #[arg(long, default_value_t = 42)]
    seed: u64,
    #[arg(long, default_value_t = 0.01)]
    duplicate_rate: f64,
    #[arg(long, default_value_t = 250)]
    event_bytes: usize,
    /// Open loop: this many records per second, each stamped (field `ts` and the Kafka
    /// timestamp) with its intended send time, so latency includes any backlog. 0: as
    /// fast as the broker takes them, `ts` from a fixed start.
    #[arg(long, default_value_t = 0)]
    rate: u64,
    /// Rules to publish before the input: a JSON array of rules, each keyed by its `id`.
    #[arg(long)]
    rules: Option<PathBuf>,
    #[arg(long, default_value = "bench-rules")]
    control_topic: String,
    /// Also write each event, after its JSON record, to this topic in Avro (Confluent
    /// wire format: 0, the schema id, the datum), same key, so same partition and offset.
    #[arg(long)]
    avro_topic: Option<String>,
    /// The schema id to stamp on the Avro records (the generator's schema, registered by
    /// someone else). Without it, `--schema-registry` registers the schema.
    #[arg(long)]
    avro_schema_id: Option<u32>,
    /// A Confluent-compatible Schema Registry (`http://` only): the event schema is
    /// registered under `<avro-topic>-value` and the id it gets is stamped.
    #[arg(long)]
    schema_registry: Option<String>,
    /// Print the Avro schema of the events and exit.
    #[arg(long)]
    print_avro_schema: bool,
}

fn main() -> anyhow::Result<()> {
    let args = Args::parse();
    if args.print_avro_schema {
        println!("{}", avro::SCHEMA);
        return Ok(());
    }
    let avro_out = match (&args.avro_topic, args.avro_schema_id, &args.schema_registry) {
        (None, None, None) => None,
        (None, _, _) => bail!("--avro-schema-id and --schema-registry need --avro-topic"),
        (Some(t), Some(id), _) => Some((t.clone(), id)),
        (Some(t), None, Some(url)) => Some((
            t.clone(),
            register(url, &format!("{t}-value"), avro::SCHEMA)?,
        )),
        (Some(_), None, None) => bail!("--avro-topic needs --avro-schema-id or --schema-registry"),
    };
    let producer: BaseProducer = ClientConfig::new()
        .set("bootstrap.servers", &args.bootstrap)
        .set("enable.idempotence", "true")
        .set("linger.ms", "5")
        .set("batch.size", "1000000")
        .set("queue.buffering.max.messages", "1000000")
        // Java's partitioner, so input partitions match streamstate's key groups.
        .set("partitioner", "murmur2_random")
        .create()
        .context("creating the producer")?;
    ensure_topic(&args.bootstrap, &args.topic, args.partitions)?;
    if let Some((topic, _)) = &avro_out {
        ensure_topic(&args.bootstrap, topic, args.partitions)?;
    }
    if let Some(path) = &args.rules {
        ensure_topic(&args.bootstrap, &args.control_topic, 1)?;
        publish_rules(&producer, path, &args.control_topic)?;
    }
    let start_ms = if args.rate > 0 {
        now_ms()
    } else {
        1_700_000_000_000
    };
    let spec = Spec {
        events: args.events,
        keys: args.keys,
        dist: args.dist,
        seed: args.seed,
        duplicate_rate: args.duplicate_rate,
        event_bytes: args.event_bytes,
        start_ms,
    };
    let (mut duplicates, mut bytes, mut avro_bytes) = (0u64, 0u64, 0u64);
    let started = Instant::now();
    for (i, mut record) in Generator::new(spec).enumerate() {
        let mut timestamp = None;
        if args.rate > 0 {
            // Intended send time of record i; the ts field is rewritten to it (same width
            // is not needed: consumers parse JSON).
            let due = Duration::from_secs_f64(i as f64 / args.rate as f64);
            let intended = start_ms + due.as_millis() as u64;
            // When a record is early, sleep until a quantum after it is due; the records
            // that fall due meanwhile go out on waking, without a sleep each. One wake-up
            // per quantum, not per record (at 30k records/s one every 33 µs, on the
            // broker's CPU). A record leaves at most a quantum late, never early, so its
            // latency is overstated by at most that.
            if let Some(wait) = due.checked_sub(started.elapsed()) {
                std::thread::sleep(wait + SEND_QUANTUM);
            }
            anyhow::ensure!(
                record.restamp(intended),
                "record {i} has no \"ts\" field to restamp"
            );
            timestamp = Some(intended as i64);
        }
        duplicates += u64::from(record.duplicate);
        bytes += record.value.len() as u64;
        let mut r = BaseRecord::to(&args.topic)
            .key(&record.key)
            .payload(&record.value);
        if let Some(ts) = timestamp {
            r = r.timestamp(ts);
        }
        send(&producer, r)?;
        if let Some((topic, id)) = &avro_out {
            // The same key, so the same partition; sent right after the JSON record, so
            // the same position in it (the idempotent producer keeps each partition's order).
            let value = avro::encode(&record.event, *id);
            avro_bytes += value.len() as u64;
            let mut r = BaseRecord::to(topic).key(&record.key).payload(&value);
            if let Some(ts) = timestamp {
                r = r.timestamp(ts);
            }
            send(&producer, r)?;
        }
    }
    producer
        .flush(Duration::from_secs(120))
        .context("flushing the input")?;
    let secs = started.elapsed().as_secs_f64();
    let mut summary = serde_json::json!({"topic": args.topic, "records": args.events, "duplicates": duplicates,
                                         "bytes": bytes, "seconds": secs, "keys": args.keys,
                                         "dist": format!("{:?}", args.dist).to_lowercase(), "seed": args.seed});
    if let Some((topic, id)) = &avro_out {
        summary["avro_topic"] = topic.as_str().into();
        summary["avro_schema_id"] = (*id).into();
        summary["avro_bytes"] = avro_bytes.into();
    }
    println!("{summary}");
    Ok(())
}

fn send(
    producer: &BaseProducer,
    mut record: BaseRecord<'_, String, Vec<u8>>,
) -> anyhow::Result<()> {
    loop {
        match producer.send(record) {
            Ok(()) => {
                producer.poll(Duration::ZERO);
                return Ok(());
            }
            Err((KafkaError::MessageProduction(RDKafkaErrorCode::QueueFull), r)) => {
                record = r;
                producer.poll(Duration::from_millis(10));
            }
            Err((e, _)) => bail!("producing: {e}"),
        }
    }
}

/// Registers `schema` (Avro) under `subject` with a Confluent-compatible registry at
/// `url` (`http://host:port/base`): `POST <base>/subjects/<subject>/versions`, the id from
/// `{"id": N}`. Plain HTTP/1.1 over a socket, `Connection: close` (a benchmark tool talking
/// to a local registry; no HTTP client dependency for one request).
fn register(url: &str, subject: &str, schema: &str) -> anyhow::Result<u32> {
    let rest = url
        .strip_prefix("http://")
        .with_context(|| format!("--schema-registry {url}: only http:// URLs"))?;
    let (authority, base) = rest.split_once('/').map_or((rest, ""), |(a, b)| (a, b));
    let base = base.trim_end_matches('/');
    let path = if base.is_empty() {
        format!("/subjects/{subject}/versions")
    } else {
        format!("/{base}/subjects/{subject}/versions")
    };
    let body = serde_json::json!({"schema": schema, "schemaType": "AVRO"}).to_string();
    let addr = if authority.contains(':') {
        authority.to_string()
    } else {
        format!("{authority}:80")
    };
    let mut stream = TcpStream::connect(&addr)
        .with_context(|| format!("connecting to the registry at {addr}"))?;
    stream.set_read_timeout(Some(Duration::from_secs(30)))?;
    write!(
        stream,
        "POST {path} HTTP/1.1\r\nHost: {authority}\r\nContent-Type: application/vnd.schemaregistry.v1+json\r\n\
         Accept: application/vnd.schemaregistry.v1+json, application/json\r\nContent-Length: {}\r\n\
         Connection: close\r\n\r\n{body}",
        body.len()
    )?;
    let mut response = Vec::new();
    stream
        .read_to_end(&mut response)
        .context("reading the registry's answer")?;
    let split = response
        .windows(4)
        .position(|w| w == b"\r\n\r\n")
        .context("the registry's answer has no header end")?;
    let head = String::from_utf8_lossy(&response[..split]).to_string();
    let mut payload = response[split + 4..].to_vec();
    if head
        .lines()
        .any(|l| l.to_ascii_lowercase().replace(' ', "") == "transfer-encoding:chunked")
    {
        payload = dechunk(&payload)?;
    }
    let status = head.split_whitespace().nth(1).unwrap_or("");
    let text = String::from_utf8_lossy(&payload);
    if status != "200" {
        bail!("registering {subject} at {url}: HTTP {status}: {text}");
    }
    let answer: serde_json::Value = serde_json::from_str(&text)
        .with_context(|| format!("the registry's answer is not JSON: {text}"))?;
    let id = answer["id"]
        .as_u64()
        .with_context(|| format!("no id in the registry's answer: {text}"))?;
    Ok(u32::try_from(id)?)
}

/// A `Transfer-Encoding: chunked` body, joined.
fn dechunk(mut body: &[u8]) -> anyhow::Result<Vec<u8>> {
    let mut out = Vec::new();
    loop {
        let line_end = body
            .windows(2)
            .position(|w| w == b"\r\n")
            .context("a chunk without its size line")?;
        let size = std::str::from_utf8(&body[..line_end])?;
        let size = usize::from_str_radix(size.split(';').next().unwrap_or("").trim(), 16)
            .with_context(|| format!("chunk size {size:?}"))?;
        body = &body[line_end + 2..];
        if size == 0 {
            return Ok(out);
        }
        if body.len() < size {
            bail!("a chunk cut short");
        }
        out.extend_from_slice(&body[..size]);
        body = body.get(size + 2..).unwrap_or_default();
    }
}

fn publish_rules(producer: &BaseProducer, path: &PathBuf, topic: &str) -> anyhow::Result<()> {
    let text =
        std::fs::read_to_string(path).with_context(|| format!("reading {}", path.display()))?;
    let rules: Vec<serde_json::Value> = serde_json::from_str(&text)
        .with_context(|| format!("{} is not a JSON array", path.display()))?;
    for rule in rules {
        let id = rule["id"]
            .as_str()
            .context("a rule without a string id")?
            .to_string();
        let value = serde_json::to_vec(&rule)?;
        send(producer, BaseRecord::to(topic).key(&id).payload(&value))?;
    }
    producer
        .flush(Duration::from_secs(30))
        .context("flushing the rules")?;
    Ok(())
}

fn ensure_topic(bootstrap: &str, topic: &str, partitions: i32) -> anyhow::Result<()> {
    let admin: AdminClient<DefaultClientContext> = ClientConfig::new()
        .set("bootstrap.servers", bootstrap)
        .create()
        .context("creating the admin client")?;
    let rt = tokio::runtime::Builder::new_current_thread()
        .enable_all()
        .build()?;
    let results = rt.block_on(admin.create_topics(
        &[NewTopic::new(topic, partitions, TopicReplication::Fixed(1))],
        &AdminOptions::new().operation_timeout(Some(Duration::from_secs(30))),
    ))?;
    for r in results {
        match r {
            Ok(_) | Err((_, RDKafkaErrorCode::TopicAlreadyExists)) => {}
            Err((t, e)) => bail!("creating topic {t}: {e}"),
        }
    }
    // A new topic's partitions appear in metadata once their leaders are elected.
    let deadline = Instant::now() + Duration::from_secs(30);
    loop {
        let md = admin
            .inner()
            .fetch_metadata(Some(topic), Duration::from_secs(30))
            .context("reading topic metadata")?;
        let found = md
            .topics()
            .first()
            .map_or(0, |t| t.partitions().len() as i32);
        if found == partitions {
            return Ok(());
        }
        if found > 0 || Instant::now() > deadline {
            bail!(
                "topic {topic} has {found} partitions, not {partitions}: delete it or pass --partitions {found}"
            );
        }
        std::thread::sleep(Duration::from_millis(200));
    }
}

fn now_ms() -> u64 {
    SystemTime::now()
        .duration_since(UNIX_EPOCH)
        .map_or(0, |d| d.as_millis() as u64)
}
